"""A sample model file in the cache: where they live, how one is written (atomically), its
digest. The lower-bit variants `llama-quantize` makes of one (self-speculative drafts) are
llama/models.py's: this part starts no process."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specreg.home import cache_dir
from specreg.jsonout import FieldsDocument


@dataclass(frozen=True)
class SmallModel:
    family: str  # smollm2 | gemma3
    quant: str
    path: Path
    n_bytes: int


@dataclass(frozen=True)
class ModelFiles(FieldsDocument):
    """`specreg llama models`: the test models in the cache, fetched or made."""

    JSON_KIND = "llama-models"
    JSON_VERSION = "1"

    models: tuple[SmallModel, ...]


def models_dir() -> Path:
    return cache_dir() / "models"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_atomic(out: Path, write: object) -> None:
    tmp = out.with_suffix(out.suffix + ".part")
    write(tmp)  # type: ignore[operator]
    tmp.replace(out)
