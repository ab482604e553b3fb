"""Where other tools keep their GGUFs: the model stores `specreg scan` with no path reads, and
`stores:` in specreg.yaml names.

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

# The stores by the name specreg.yaml gives them, with the name a user knows them by.
STORE_LABELS: Mapping[str, str] = {
    "lmstudio": "LM Studio",
    "huggingface": "Hugging Face cache",
    "llama-cpp": "llama.cpp cache",
    "ollama": "Ollama",
}
STORES: tuple[str, ...] = tuple(STORE_LABELS)
# Stores whose files carry no .gguf name: a file is a model when it starts with GGUF's magic.
BY_MAGIC: tuple[str, ...] = ("ollama",)


@dataclass(frozen=True)
class Store:
    """One store folder that exists on this machine."""

    name: str  # a STORES name
    path: Path

    @property
    def by_magic(self) -> bool:
        return self.name in BY_MAGIC

    @property
    def label(self) -> str:
        return f"{STORE_LABELS[self.name]} ({self.path})"


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


def found_stores(
    stores: tuple[str, ...] = STORES, env: Mapping[str, str] | None = None
) -> list[Store]:
    """The folders of `stores` that exist on this machine, in the order of `stores`."""
    return [Store(s, d) for s in stores for d in store_dirs(s, env) if d.is_dir()]


def where_stores_live(env: Mapping[str, str] | None = None) -> str:
    """Every folder looked in, by store, for a message that none was found."""
    return "; ".join(
        f"{STORE_LABELS[s]}: {', '.join(str(d) for d in store_dirs(s, env))}" for s in STORES
    )
