"""Tiny *real* mixture-of-experts GGUFs, written with gguf.GGUFWriter from seeded numpy.

PyPI carries no small MoE model, so the expert-count override (`--experts`) could only be
exercised on dense models, where llama.cpp ignores it. These files load and generate in the
pinned llama.cpp like any converted model: a real architecture (`qwen3moe`), real
tokenizer (every `tokenizer.*` key copied from SmolLM2, so text goes in and out), weights
that are seeded noise with a structure that makes next-token distributions confident:

* the output head is a token chain: the row of token `next(c)` is the (scaled) embedding of
  `c`, so with the residual stream close to the input embedding the model continues a fixed
  cycle through ordinary word tokens (`Ġword` pieces; every other row is zero, so it never
  emits a special token and never stops early);
* attention and the MoE layers add perturbations of a calibrated size to the residual
  stream, so the context and the experts decide where the chain is left. Routing 1 expert
  instead of 2 changes the perturbation, and the text changes at the first position where
  it matters.

A second model, `glm4moe` with one NextN block (`MTP_SPEC`), runs `--spec-type draft-mtp`:
its MTP block has learnt the chain (it keeps only the embedding of the token it is given),
so the drafts it proposes are the ones the trunk mostly accepts.

The bytes depend only on the spec and the tokenizer source: scales calibrated with float
matmuls are rounded to 3 significant digits before use, so BLAS rounding cannot leak in.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import ExpertGatingFuncType, LlamaFileType, TokenType

from specreg.samples.model_files import SmallModel, install_atomic

log = logging.getLogger(__name__)

# The self-speculative draft made from each synthetic target with llama-quantize
# (specreg.llama.models).
SYNTHETIC_DRAFT_QUANT = "Q8_0"
# Word pieces the chain walks through: a leading-space marker and lowercase letters.
_WORD_PIECE = re.compile(r"^Ġ[a-z]{3,}$")


@dataclass(frozen=True)
class MoeSpec:
    """Shape and weight scales of a synthetic MoE model; `version` names the file."""

    arch: str = "qwen3moe"
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 64
    context_length: int = 4096
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-6
    seed: int = 20261121
    chain_logit: float = 28.0  # logit of the chain's next token when the stream is pure
    moe_ratio: float = 1.0  # |MoE output| / |its input| with all routed experts
    attn_ratio: float = 0.3  # |attention output| / |its input|, roughly
    router_std: float = 2.0  # spread of the router logits
    n_expert_shared: int = 0  # glm4moe: always-on shared expert(s) next to the routed ones
    shared_ratio: float = 0.3  # |shared expert output| / |its input|
    nextn_layers: int = 0  # glm4moe: NextN (MTP) blocks after the trunk, for draft-mtp
    version: int = 2

    @property
    def family(self) -> str:
        mtp = "-mtp" if self.nextn_layers else ""
        return f"synth-{self.arch}{mtp}-v{self.version}"

    @property
    def file_name(self) -> str:
        return (
            f"{self.family}-{self.n_expert}x{self.n_ff_exp}-L{self.n_layer}-d{self.n_embd}.F16.gguf"
        )


# A GLM-4.5-style MoE (sigmoid router, one shared expert) with one NextN block: the
# smallest thing the pinned llama.cpp runs with --spec-type draft-mtp.
MTP_SPEC = MoeSpec(arch="glm4moe", n_expert_shared=1, nextn_layers=1)
# The synthetic MoE target the tests and benchmarks use.
MOE_SPEC = MoeSpec()


@dataclass(frozen=True)
class SyntheticModels:
    """The synthetic MoE target, its requantized self-speculative draft, and the MTP model."""

    moe: SmallModel
    moe_draft: SmallModel
    mtp: SmallModel
    spec: MoeSpec
    mtp_spec: MoeSpec

    @property
    def all(self) -> tuple[SmallModel, ...]:
        return (self.moe, self.moe_draft, self.mtp)


@dataclass(frozen=True)
class _Tokenizer:
    fields: tuple[tuple[str, object, GGUFValueType, GGUFValueType | None], ...]
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]


def read_tokenizer(source: Path) -> _Tokenizer:
    """Every `tokenizer.*` key of a GGUF, in file order, ready for GGUFWriter.add_key_value."""
    reader = GGUFReader(source)
    fields = []
    tokens: tuple[str, ...] = ()
    types: tuple[int, ...] = ()
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        fields.append((name, value, vtype, sub))
        if name == "tokenizer.ggml.tokens":
            tokens = tuple(value)
        elif name == "tokenizer.ggml.token_type":
            types = tuple(int(t) for t in value)
    if not tokens or len(types) != len(tokens):
        raise ValueError(f"{source} has no token list with token types")
    return _Tokenizer(tuple(fields), tokens, types)


def _rms_unit(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


def _round3(x: float) -> float:
    return float(f"{x:.3g}")


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _moe_forward(
    x: np.ndarray,
    router: np.ndarray,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    k: int,
    sigmoid: bool = False,
) -> np.ndarray:
    """The routed expert FFN in numpy: softmax (qwen3moe) or sigmoid (glm4moe) router,
    top-k, selected weights renormalised."""
    logits = x @ router.T
    top = np.argsort(-logits, axis=1)[:, :k]
    sel = np.take_along_axis(logits, top, axis=1)
    w = 1.0 / (1.0 + np.exp(-sel)) if sigmoid else np.exp(sel - sel.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    for slot in range(k):
        e = top[:, slot]
        h = _silu(np.einsum("nd,nfd->nf", x, gate[e])) * np.einsum("nd,nfd->nf", x, up[e])
        out += w[:, slot : slot + 1] * np.einsum("nf,ndf->nd", h, down[e])
    return out


def _dense(rng: np.random.Generator, rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
    """A (rows, cols) projection that keeps unit-RMS inputs at RMS `gain`."""
    return (rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))).astype(np.float32)


def _chain_order(tok: _Tokenizer, rng: np.random.Generator) -> np.ndarray:
    words = [
        i
        for i, (text, kind) in enumerate(zip(tok.tokens, tok.token_types, strict=True))
        if kind == TokenType.NORMAL and _WORD_PIECE.match(text)
    ]
    if len(words) < 100:
        raise ValueError(f"the tokenizer has only {len(words)} word pieces; need at least 100")
    return rng.permutation(np.array(words, dtype=np.int64))


def _rms_gain(out: np.ndarray) -> float:
    return float(np.mean(np.sqrt(np.mean(out * out, axis=1))))


def moe_tensors(spec: MoeSpec, tok: _Tokenizer) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) in file order; numpy shapes are ggml's ne reversed."""
    rng = np.random.default_rng(spec.seed)
    n_vocab, d, hd = len(tok.tokens), spec.n_embd, spec.head_dim
    embd = _rms_unit(rng.standard_normal((n_vocab, d)))
    order = _chain_order(tok, rng)
    # Row next(c) of the head is embd[c]: logit = scale * <embd[c], rmsnorm(h)> = scale * d
    # when h is the embedding of c itself.
    head = np.zeros((n_vocab, d))
    head[np.roll(order, -1)] = embd[order] * (spec.chain_logit / d)
    yield "token_embd.weight", embd.astype(np.float16)
    yield "output_norm.weight", np.ones(d, dtype=np.float32)
    yield "output.weight", head.astype(np.float16)

    probe = _rms_unit(rng.standard_normal((512, d)))
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
        yield p + "attn_norm.weight", np.ones(d, dtype=np.float32)
        for name, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            yield f"{p}{name}.weight", _dense(rng, rows, d)
        yield p + "attn_output.weight", _dense(rng, d, q_dim, spec.attn_ratio)
        yield p + "attn_k_norm.weight", np.ones(hd, dtype=np.float32)
        yield p + "attn_q_norm.weight", np.ones(hd, dtype=np.float32)
        yield p + _FFN_NORM[spec.arch], np.ones(d, dtype=np.float32)
        yield from _moe_ffn(spec, rng, probe, p)

    for il in range(spec.n_layer, spec.n_layer + spec.nextn_layers):
        yield from _nextn_block(spec, f"blk.{il}.")


# The norm in front of the FFN: qwen3moe calls it ffn_norm, GLM post_attention_norm.
_FFN_NORM = {"qwen3moe": "ffn_norm.weight", "glm4moe": "post_attention_norm.weight"}


def _moe_ffn(
    spec: MoeSpec, rng: np.random.Generator, probe: np.ndarray, p: str, *, silent: bool = False
) -> Iterator[tuple[str, np.ndarray]]:
    """Router, routed experts (and shared ones) of one block; `silent` zeroes their outputs."""
    d, n_ff, glm = spec.n_embd, spec.n_ff_exp, spec.arch == "glm4moe"
    router = rng.standard_normal((spec.n_expert, d)) * (spec.router_std / np.sqrt(d))
    gate = rng.standard_normal((spec.n_expert, n_ff, d)) / np.sqrt(d)
    up = rng.standard_normal((spec.n_expert, n_ff, d)) / np.sqrt(d)
    down = rng.standard_normal((spec.n_expert, d, n_ff)) / np.sqrt(n_ff)
    out = _moe_forward(probe, router, gate, up, down, spec.n_expert_used, sigmoid=glm)
    down = down * (0.0 if silent else _round3(spec.moe_ratio / _rms_gain(out)))
    yield p + "ffn_gate_inp.weight", router.astype(np.float32)
    if glm:
        yield p + "exp_probs_b.bias", np.zeros(spec.n_expert, dtype=np.float32)
    yield p + "ffn_gate_exps.weight", gate.astype(np.float16)
    yield p + "ffn_down_exps.weight", down.astype(np.float16)
    yield p + "ffn_up_exps.weight", up.astype(np.float16)
    if spec.n_expert_shared:
        n_sh = n_ff * spec.n_expert_shared
        sh_gate, sh_up = _dense(rng, n_sh, d), _dense(rng, n_sh, d)
        sh_down = _dense(rng, d, n_sh)
        sh_out = (_silu(probe @ sh_gate.T) * (probe @ sh_up.T)) @ sh_down.T
        sh_down = sh_down * (0.0 if silent else _round3(spec.shared_ratio / _rms_gain(sh_out)))
        yield p + "ffn_gate_shexp.weight", sh_gate
        yield p + "ffn_down_shexp.weight", sh_down.astype(np.float32)
        yield p + "ffn_up_shexp.weight", sh_up


def _nextn_block(spec: MoeSpec, p: str) -> Iterator[tuple[str, np.ndarray]]:
    """A NextN (MTP) block that has learnt the chain: it predicts the token after x_{t+1}
    from x_{t+1}'s embedding alone (eh_proj keeps the embedding half of [enorm(e); hnorm(h)]),
    its attention and experts add nothing, and the shared head continues the chain."""
    d, hd = spec.n_embd, spec.head_dim
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    rng = np.random.default_rng(spec.seed + 1)
    probe = _rms_unit(rng.standard_normal((64, d)))
    yield p + "attn_norm.weight", np.ones(d, dtype=np.float32)
    for name, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
        yield f"{p}{name}.weight", _dense(rng, rows, d)
    yield p + "attn_output.weight", np.zeros((d, q_dim), dtype=np.float32)
    yield p + _FFN_NORM[spec.arch], np.ones(d, dtype=np.float32)
    yield from _moe_ffn(spec, rng, probe, p, silent=True)
    eh_proj = np.zeros((d, 2 * d), dtype=np.float32)
    eh_proj[:, :d] = np.eye(d)
    yield p + "nextn.eh_proj.weight", eh_proj
    yield p + "nextn.enorm.weight", np.ones(d, dtype=np.float32)
    yield p + "nextn.hnorm.weight", np.ones(d, dtype=np.float32)


def write_moe_gguf(out: Path, tokenizer_source: Path, spec: MoeSpec = MoeSpec()) -> Path:
    """Write the synthetic MoE model to `out` (atomically: a `.part` file renamed)."""
    tok = read_tokenizer(tokenizer_source)

    def write(tmp: Path) -> None:
        w = GGUFWriter(tmp, spec.arch)
        w.add_name(f"specreg synthetic {spec.arch} {spec.n_expert}x{spec.n_ff_exp}")
        w.add_file_type(LlamaFileType.MOSTLY_F16)
        w.add_context_length(spec.context_length)
        w.add_embedding_length(spec.n_embd)
        w.add_block_count(spec.n_layer + spec.nextn_layers)
        w.add_feed_forward_length(spec.n_ff_exp * spec.n_expert_used)
        w.add_head_count(spec.n_head)
        w.add_head_count_kv(spec.n_head_kv)
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        w.add_rope_dimension_count(spec.head_dim)
        w.add_rope_freq_base(spec.rope_freq_base)
        w.add_layer_norm_rms_eps(spec.rms_eps)
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
        if spec.arch == "glm4moe":
            w.add_expert_shared_count(spec.n_expert_shared)
            w.add_expert_weights_norm(True)
            w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        if spec.nextn_layers:
            w.add_nextn_predict_layers(spec.nextn_layers)
        for name, value, vtype, sub in tok.fields:
            w.add_key_value(name, value, vtype, sub_type=sub)
        for name, array in moe_tensors(spec, tok):
            w.add_tensor(name, array)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    install_atomic(out, write)
    return out


def ensure_synthetic_model(dest: Path, tokenizer_source: Path, spec: MoeSpec) -> SmallModel:
    """The synthetic model for `spec` in `dest`, written once."""
    out = dest / spec.file_name
    if not out.exists():
        log.info("writing synthetic %s model %s", spec.arch, out)
        write_moe_gguf(out, tokenizer_source, spec)
    return SmallModel(spec.family, "F16", out, out.stat().st_size)
