"""Bits per weight for a quantisation name, from gguf's own block sizes.

The registry reads `bits_per_weight` from the tensors; this table is only for the shipped prior,
whose rows name a quant (`Q4_K_M`) and sometimes omit the file size. llama.cpp's file types mix
tensor types (`Q4_K_M` keeps some tensors at Q6_K), so a mix is a little above its base type;
the mix factors are llama.cpp's published sizes for a 7B model divided by the base type's size.
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

# file type suffix -> extra bits over the base block type (llama.cpp quantize's size table)
_MIX_EXTRA = {"S": 0.1, "M": 0.35, "L": 0.6, "XL": 0.8}
_ALIASES = {"FP16": "F16", "FP32": "F32"}


def bits_per_weight(quant: str | None) -> float | None:
    """`Q4_K_M` -> about 4.85; None when the name is not a llama.cpp type."""
    if not quant:
        return None
    name = _ALIASES.get(quant.upper(), quant.upper())
    extra = 0.0
    head, _, tail = name.rpartition("_")
    if name not in GGMLQuantizationType.__members__ and head and tail in _MIX_EXTRA:
        name, extra = head, _MIX_EXTRA[tail]
    try:
        qtype = GGMLQuantizationType[name]
    except KeyError:
        return None
    block, type_size = GGML_QUANT_SIZES[qtype]
    return type_size * 8 / block + extra
