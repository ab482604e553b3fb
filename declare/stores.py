"""What specreg.yaml says to scan: its roots, and the folders of the model stores it names
that exist here (where each store keeps its GGUFs: specreg.registry.stores)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb

from specreg.declare import deps
from specreg.declare.spec import Spec
from specreg.registry.stores import BY_MAGIC, store_dirs


@dataclass(frozen=True)
class ScanRoot:
    path: Path
    origin: str  # "roots[0]", "stores: huggingface", ...
    all_files: bool = False  # Ollama blobs: GGUFs without a .gguf name


def scan_roots(spec: Spec, env: Mapping[str, str] | None = None) -> list[ScanRoot]:
    """The declared roots and the folders of the declared stores that exist on this machine."""
    out = [ScanRoot(spec.resolve_path(r), f"roots[{i}]") for i, r in enumerate(spec.roots)]
    for store in spec.stores:
        for d in store_dirs(store, env):
            if d.is_dir():
                out.append(ScanRoot(d, f"stores: {store}", all_files=store in BY_MAGIC))
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
