"""Where the model stores a user declares keep their GGUFs, and what specreg.yaml says to scan.

Each store's folder follows the tool's own override variable first, then its default:
LM Studio (`LMSTUDIO_MODELS`; ~/.lmstudio/models, ~/.cache/lm-studio/models), the Hugging Face
cache (`HF_HUB_CACHE`, `HF_HOME`/hub; ~/.cache/huggingface/hub), llama.cpp's download cache
(`LLAMA_CACHE`; ~/.cache/llama.cpp) and Ollama (`OLLAMA_MODELS`; ~/.ollama/models), whose blobs
have no .gguf name and are recognised by magic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb

from specreg.declare import deps
from specreg.declare.spec import Spec


@dataclass(frozen=True)
class ScanRoot:
    path: Path
    origin: str  # "roots[0]", "stores: huggingface", ...
    all_files: bool = False  # Ollama blobs: GGUFs without a .gguf name


def store_dirs(
    store: str, env: Mapping[str, str] | None = None, home: Path | None = None
) -> list[Path]:
    """Candidate folders of one store, the tool's override first."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME", str(Path.home()))) if home is None else home
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    if store == "lmstudio":
        if env.get("LMSTUDIO_MODELS"):
            return [Path(env["LMSTUDIO_MODELS"])]
        return [home / ".lmstudio" / "models", cache / "lm-studio" / "models"]
    if store == "huggingface":
        if env.get("HF_HUB_CACHE"):
            return [Path(env["HF_HUB_CACHE"])]
        if env.get("HF_HOME"):
            return [Path(env["HF_HOME"]) / "hub"]
        return [cache / "huggingface" / "hub"]
    if store == "llama-cpp":
        return [Path(env["LLAMA_CACHE"])] if env.get("LLAMA_CACHE") else [cache / "llama.cpp"]
    if store == "ollama":
        base = (
            Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"
        )
        return [base / "blobs"]
    raise ValueError(f"unknown store {store!r}")


def scan_roots(spec: Spec, env: Mapping[str, str] | None = None) -> list[ScanRoot]:
    """The declared roots and the folders of the declared stores that exist on this machine."""
    out = [ScanRoot(spec.resolve_path(r), f"roots[{i}]") for i, r in enumerate(spec.roots)]
    for store in spec.stores:
        for d in store_dirs(store, env):
            if d.is_dir():
                out.append(ScanRoot(d, f"stores: {store}", all_files=store == "ollama"))
    return out


def rescan_declared(con: duckdb.DuckDBPyConnection, spec: Spec) -> list[ScanRoot]:
    """Scan every declared root and existing store folder (Ollama's by magic)."""
    roots = scan_roots(spec)
    plain = [r.path for r in roots if not r.all_files]
    blobs = [r.path for r in roots if r.all_files]
    if plain:
        deps.scan(con, plain)
    if blobs:
        deps.scan(con, blobs, all_files=True)
    return roots
