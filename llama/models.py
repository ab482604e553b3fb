"""The sample models' llama.cpp step: `llama-quantize` makes their lower-bit variants.

samples/ fetches and writes the models (it sits below llama/ and starts no process); this
module runs llama-quantize on them for the self-speculative drafts, and puts the collection
`specreg llama models` shows together.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from specreg.errors import LlamaError
from specreg.llamacpp import QuantizeFlag, Tool
from specreg.samples.model_files import SmallModel, models_dir
from specreg.samples.small_models import DRAFT_QUANTS, SmallModels, fetch_gemma3, fetch_smollm2
from specreg.samples.synthetic import (
    MOE_SPEC,
    MTP_SPEC,
    SYNTHETIC_DRAFT_QUANT,
    SyntheticModels,
    ensure_synthetic_model,
)


def quantize(quantize_bin: Path, src: SmallModel, quant: str, threads: int = 2) -> SmallModel:
    """`src` requantized to `quant` next to it (once; written under a temporary name)."""
    out = src.path.with_name(f"{src.family}-{quant}.gguf")
    if not out.exists():
        tmp = out.with_suffix(".gguf.part")
        cmd = [
            str(quantize_bin),
            QuantizeFlag.ALLOW_REQUANTIZE,
            str(src.path),
            str(tmp),
            quant,
            str(threads),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            lines = (proc.stderr + proc.stdout).strip().splitlines() or ["no output"]
            raise LlamaError(f"{Tool.QUANTIZE} {quant} of {src.path.name} failed: {lines[-1]}")
        tmp.replace(out)
    return SmallModel(src.family, quant, out, out.stat().st_size)


def ensure_synthetic_models(
    dest: Path, tokenizer_source: Path, quantize_bin: Path
) -> SyntheticModels:
    """Write the synthetic MoE and MTP models (`MOE_SPEC`, `MTP_SPEC`; once) next to the other
    small models, and the MoE's Q8_0 self-draft."""
    moe = ensure_synthetic_model(dest, tokenizer_source, MOE_SPEC)
    draft = quantize(quantize_bin, moe, SYNTHETIC_DRAFT_QUANT)
    mtp = ensure_synthetic_model(dest, tokenizer_source, MTP_SPEC)
    return SyntheticModels(moe, draft, mtp, MOE_SPEC, MTP_SPEC)


def ensure_test_models(quantize_bin: Path) -> SmallModels:
    """Fetch both targets (once) and make their Q8_0 and Q4_0 drafts (once); write the
    synthetic MoE model and its Q8_0 draft (once)."""
    dest = models_dir()
    wheels = dest / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    smollm2 = fetch_smollm2(dest, wheels)
    gemma3 = fetch_gemma3(dest, wheels)
    drafts = tuple(quantize(quantize_bin, m, q) for m in (smollm2, gemma3) for q in DRAFT_QUANTS)
    synthetic = ensure_synthetic_models(dest, smollm2.path, quantize_bin)
    return SmallModels(smollm2=smollm2, gemma3=gemma3, drafts=drafts, synthetic=synthetic.all)
