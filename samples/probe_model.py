"""The proof model: a tiny dense llama in Q4_0 that any llama.cpp build can load in a second.

`specreg llama build` and `specreg doctor` run it through each binary specreg uses to prove a
build runs on this host before anything relies on it. It is shaped to take the CPU paths that
real models take, so a build that dies on them dies here first:

* every matrix is Q4_0 with rows of 256 and 512 values, so ggml's repacking and AMX kernels
  accept them (out features a multiple of 32, in features a multiple of the block size);
* the tokenizer is a SentencePiece one with byte fallback: the 256 byte tokens spell any text,
  so text goes in and tokens come out as with any model, from a vocabulary of 320 (a multiple
  of 32, like the matrices) that keeps the file under a megabyte.

The weights are seeded noise: the text it writes means nothing. The bytes depend only on the
spec, so the file is written once, in a fraction of a second, with nothing downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import LlamaFileType, TokenType
from gguf.quants import quantize

from specreg.samples.model_files import install_atomic, models_dir

# Whole words, after the special and byte tokens, up to the vocabulary's size.
_WORDS = [
    "the",
    "and",
    "of",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "it",
    "by",
    "at",
    "from",
    "his",
    "her",
    "they",
    "were",
    "boat",
    "harbour",
    "town",
    "sea",
    "net",
    "winter",
    "spring",
    "water",
    "bay",
    "sun",
    "grey",
    "long",
    "good",
    "every",
    "before",
    "over",
]


@dataclass(frozen=True)
class ProbeSpec:
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 4
    n_ff: int = 512
    n_vocab: int = 320
    context_length: int = 2048
    seed: int = 20261127
    version: int = 2

    @property
    def file_name(self) -> str:
        return f"specreg-probe-llama-q4_0-v{self.version}.gguf"


def _q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    weights = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
    return quantize(weights, GGMLQuantizationType.Q4_0)


def _tensors(spec: ProbeSpec, n_vocab: int) -> Iterator[tuple[str, np.ndarray]]:
    """(name, data) of each tensor: norms F32, matrices Q4_0 (rows of 18-byte blocks)."""
    rng = np.random.default_rng(spec.seed)
    d, ff = spec.n_embd, spec.n_ff
    ones = np.ones(d, dtype=np.float32)
    yield "token_embd.weight", _q4_0(rng, n_vocab, d)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", ones
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            yield p + name + ".weight", _q4_0(rng, d, d)
        yield p + "ffn_norm.weight", ones
        yield p + "ffn_gate.weight", _q4_0(rng, ff, d)
        yield p + "ffn_up.weight", _q4_0(rng, ff, d)
        yield p + "ffn_down.weight", _q4_0(rng, d, ff)
    yield "output_norm.weight", ones
    yield "output.weight", _q4_0(rng, n_vocab, d)


def vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, types): <unk>, <s>, </s>, the 256 byte tokens, then words."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    types += [TokenType.BYTE] * 256
    words = [f"\u2581{w}" for w in _WORDS]
    words += [f"\u2581w{i}" for i in range(n_vocab)]
    tokens += words[: n_vocab - len(tokens)]
    types += [TokenType.NORMAL] * (n_vocab - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    return tokens, scores, [int(t) for t in types]


def write_probe_model(out: Path, spec: ProbeSpec = ProbeSpec()) -> Path:
    """Write the proof model to `out` (atomically)."""
    tokens, scores, types = vocabulary(spec.n_vocab)

    def write(tmp: Path) -> None:
        w = GGUFWriter(tmp, "llama")
        w.add_name("specreg probe llama Q4_0")
        w.add_file_type(LlamaFileType.MOSTLY_Q4_0)
        w.add_context_length(spec.context_length)
        w.add_embedding_length(spec.n_embd)
        w.add_block_count(spec.n_layer)
        w.add_feed_forward_length(spec.n_ff)
        w.add_head_count(spec.n_head)
        w.add_head_count_kv(spec.n_head)
        w.add_rope_dimension_count(spec.n_embd // spec.n_head)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        for name, data in _tensors(spec, spec.n_vocab):
            if data.dtype == np.float32:
                w.add_tensor(name, data)
            else:
                w.add_tensor(name, data, raw_dtype=GGMLQuantizationType.Q4_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    out.parent.mkdir(parents=True, exist_ok=True)
    install_atomic(out, write)
    return out


def ensure_probe_model(dest: Path | None = None) -> Path:
    """The proof model in the cache (written once)."""
    spec = ProbeSpec()
    out = (dest or models_dir()) / spec.file_name
    if not out.exists():
        write_probe_model(out, spec)
    return out
