"""A demo model collection of sparse GGUF files: real headers and tensor tables, no weights.

Each file carries the metadata and the tensor table a real conversion of that model would have
(shapes and quant types per tensor), and is then extended to its full size without writing
data, so a tree that looks like the reference host's 2 TB collection costs almost no disk.
Tokenizers are synthetic but keep each model line's real sizes, special ids and add_bos rules:
Qwen2.5 and Qwen3 share a base vocabulary, the 32B/7B Qwen2.5 pad it to 152,064, the
DeepSeek distills change the special tokens, Llama 3, Gemma 3 and GLM-4.5 are lines of their
own (no demo model drafts for GLM-4.5 Air but its own MTP head, as with the real files).

`specreg demo` writes it (`make_demo_tree`); tests build their own trees from the same pieces
(`Arch`, `Vocab`, `DemoModel`, `write_demo_model`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFEndian,
    GGUFValueType,
    LlamaFileType,
    TokenType,
)

from specreg.errors import FolderNotEmpty, param
from specreg.jsonout import FieldsDocument

Q = GGMLQuantizationType


@dataclass(frozen=True)
class Vocab:
    model: str  # tokenizer.ggml.model
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None = None
    pad_id: int | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    chat_template: str | None = None


@lru_cache(maxsize=8)
def _base_tokens(kind: str, n: int) -> tuple[str, ...]:
    # Distinct, deterministic texts; the byte-level vocabularies get "Ġ"-style pieces.
    prefix = {"qwen": "Ġq", "llama3": "Ġl", "gemma": "▁g", "glm4": "Ġz"}[kind]
    return tuple(f"{prefix}{i:x}" for i in range(n))


def qwen_vocab(line: str, padded_to: int | None = None) -> Vocab:
    """Qwen2.5 / Qwen3 / DeepSeek-R1-Distill-Qwen (`line`): 151,643 shared tokens plus the
    line's own specials."""
    base = list(_base_tokens("qwen", 151643))
    if line == "deepseek-distill":
        specials = [
            "<｜end▁of▁sentence｜>",
            "<｜begin▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
        ]
    else:
        specials = [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<|object_ref_start|>",
            "<|object_ref_end|>",
            "<|box_start|>",
            "<|box_end|>",
            "<|quad_start|>",
            "<|quad_end|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|vision_pad|>",
            "<|image_pad|>",
            "<|video_pad|>",
            "<tool_call>",
            "</tool_call>",
            "<|fim_prefix|>",
            "<|fim_middle|>",
            "<|fim_suffix|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
        ]
        if line == "qwen3":
            specials += ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    tokens = base + specials
    types = [int(TokenType.NORMAL)] * len(base) + [int(TokenType.CONTROL)] * len(specials)
    n_real = len(tokens)
    while len(tokens) < 151936:  # Qwen's embedding rows beyond the tokenizer are padding
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(int(TokenType.UNUSED))
    if padded_to:
        while len(tokens) < padded_to:
            tokens.append(f"[PAD{len(tokens)}]")
            types.append(int(TokenType.UNUSED))
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    if line == "deepseek-distill":
        return Vocab(
            "gpt2",
            "deepseek-r1-qwen",
            tuple(tokens),
            tuple(types),
            bos_id=151646,
            eos_id=151643,
            pad_id=151643,
            add_bos=True,
            add_eos=False,
            chat_template="{{ bos_token }}{% for m in messages %}<｜User｜>{{ m.content }}"
            "{% endfor %}",
        )
    return Vocab(
        "gpt2",
        "qwen2",
        tuple(tokens),
        tuple(types),
        bos_id=151643 if line == "qwen2.5" else None,  # Qwen3 GGUFs omit BOS (11)
        eos_id=151645 if line == "qwen2.5" else 151645,
        pad_id=151643,
        add_bos=False,
        chat_template=template + ("{# qwen3 #}" if n_real > 151665 else ""),
    )


def llama3_vocab() -> Vocab:
    tokens = list(_base_tokens("llama3", 128000))
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(254)
    ]
    specials[9] = "<|eot_id|>"
    tokens += specials
    types = [int(TokenType.NORMAL)] * 128000 + [int(TokenType.CONTROL)] * 256
    return Vocab(
        "gpt2",
        "llama-bpe",
        tuple(tokens),
        tuple(types),
        bos_id=128000,
        eos_id=128009,
        add_bos=True,
        chat_template="{{ bos_token }}{% for m in messages %}"
        "<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}<|eot_id|>"
        "{% endfor %}",
    )


# GLM-4.5's added tokens from id 151,329 on, as its tokenizer numbers them.
GLM4_SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
)


def glm4_vocab() -> Vocab:
    """GLM-4.5 (Air): a byte-level BPE of its own (pre-tokenizer `glm4`), 151,329 tokens, its
    specials, padding to 151,552 embedding rows. As llama.cpp's converter writes it: BOS
    [gMASK] (the `glm4` pre-tokenizer adds none), EOS and padding <|endoftext|>, EOT <|user|>."""
    n_base = 151329
    tokens = list(_base_tokens("glm4", n_base)) + list(GLM4_SPECIALS)
    types = [int(TokenType.NORMAL)] * n_base + [int(TokenType.CONTROL)] * len(GLM4_SPECIALS)
    while len(tokens) < 151552:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(int(TokenType.UNUSED))
    special = {t: n_base + i for i, t in enumerate(GLM4_SPECIALS)}
    return Vocab(
        "gpt2",
        "glm4",
        tuple(tokens),
        tuple(types),
        bos_id=special["[gMASK]"],
        eos_id=special["<|endoftext|>"],
        eot_id=special["<|user|>"],
        pad_id=special["<|endoftext|>"],
        add_bos=False,
        chat_template="[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}"
        "{% endfor %}",
    )


def gemma3_vocab() -> Vocab:
    n = 262144
    tokens = list(_base_tokens("gemma", n))
    tokens[:4] = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tokens[106:108] = ["<start_of_turn>", "<end_of_turn>"]
    types = [int(TokenType.NORMAL)] * n
    for i in (0, 1, 2, 106, 107):
        types[i] = int(TokenType.CONTROL)
    return Vocab(
        "llama",
        "default",
        tuple(tokens),
        tuple(types),
        bos_id=2,
        eos_id=1,
        eot_id=106,
        pad_id=0,
        add_bos=True,
        add_eos=False,
        chat_template="{{ bos_token }}{% for m in messages %}<start_of_turn>"
        "{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}",
    )


@dataclass(frozen=True)
class Arch:
    """Enough of a transformer's shape to lay out a realistic tensor table."""

    name: str  # general.architecture
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    context: int = 32768
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    shared_expert: bool = False
    ssm: bool = False
    nextn_layers: int = 0
    sliding_window: int | None = None
    extra_kv: tuple[tuple[str, Any], ...] = ()

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def tensor_table(
    arch: Arch,
    weight_type: Q,
) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, numpy-order shape, type) for every tensor, in llama.cpp's naming."""
    e, v, hd = arch.n_embd, arch.n_vocab, arch.head_dim
    big = Q.Q6_K if weight_type in (Q.Q4_K, Q.Q5_K) else weight_type
    out: list[tuple[str, tuple[int, ...], Q]] = [("token_embd.weight", (v, e), weight_type)]
    for i in range(arch.n_layer + arch.nextn_layers):
        b = f"blk.{i}"
        out.append((f"{b}.attn_norm.weight", (e,), Q.F32))
        out.append((f"{b}.attn_q.weight", (arch.n_head * hd, e), weight_type))
        out.append((f"{b}.attn_k.weight", (arch.n_head_kv * hd, e), weight_type))
        out.append((f"{b}.attn_v.weight", (arch.n_head_kv * hd, e), big))
        out.append((f"{b}.attn_output.weight", (e, arch.n_head * hd), weight_type))
        out.append((f"{b}.ffn_norm.weight", (e,), Q.F32))
        if arch.ssm and i % 4 != 3:
            out.append((f"{b}.ssm_in.weight", (2 * e, e), weight_type))
            out.append((f"{b}.ssm_out.weight", (e, e), weight_type))
        if arch.n_expert:
            x, f = arch.n_expert, arch.n_ff_exp
            out.append((f"{b}.ffn_gate_inp.weight", (x, e), Q.F32))
            out.append((f"{b}.ffn_gate_exps.weight", (x, f, e), weight_type))
            out.append((f"{b}.ffn_up_exps.weight", (x, f, e), weight_type))
            out.append((f"{b}.ffn_down_exps.weight", (x, e, f), big))
            if arch.shared_expert:
                out.append((f"{b}.ffn_gate_shexp.weight", (f, e), weight_type))
                out.append((f"{b}.ffn_up_shexp.weight", (f, e), weight_type))
                out.append((f"{b}.ffn_down_shexp.weight", (e, f), weight_type))
        else:
            out.append((f"{b}.ffn_gate.weight", (arch.n_ff, e), weight_type))
            out.append((f"{b}.ffn_up.weight", (arch.n_ff, e), weight_type))
            out.append((f"{b}.ffn_down.weight", (e, arch.n_ff), big))
        if i >= arch.n_layer:  # multi-token-prediction head
            out.append((f"{b}.nextn.eh_proj.weight", (e, 2 * e), weight_type))
            out.append((f"{b}.nextn.enorm.weight", (e,), Q.F32))
            out.append((f"{b}.nextn.hnorm.weight", (e,), Q.F32))
    out.append(("output_norm.weight", (e,), Q.F32))
    out.append(("output.weight", (v, e), big))
    return out


def _nbytes(shape: Sequence[int], qtype: Q) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape))
    return n // block * size


_FTYPE = {
    Q.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    Q.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    Q.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    Q.Q6_K: LlamaFileType.MOSTLY_Q6_K,
    Q.F16: LlamaFileType.MOSTLY_F16,
}


@dataclass(frozen=True)
class DemoModel:
    filename: str
    name: str
    arch: Arch
    vocab: Vocab
    weight_type: Q = Q.Q4_K
    n_split: int = 1
    size_label: str | None = None
    basename: str | None = None
    organization: str | None = None
    extra_kv: tuple[tuple[str, Any], ...] = field(default=())


class _Writer(GGUFWriter):
    """GGUFWriter that packs long arrays of strings or ints in bulk, once per array.

    gguf packs an array element by element (three Python calls per token); the demo's 24
    files carry 7 vocabularies of up to 262,144 tokens, so that was 4 of the demo's 5 seconds.
    The bytes are the same (a test compares them with gguf's own writer). Arrays are cached
    by identity: a `Vocab` holds its tokens as tuples, which never change.
    """

    _packed: dict[tuple[int, bool], tuple[Sequence[Any], bytes]] = {}
    _MIN_LEN = 4096
    _MAX_KEPT = 32

    def _pack_val(
        self,
        val: Any,
        vtype: GGUFValueType,
        add_vtype: bool,
        sub_type: GGUFValueType | None = None,
    ) -> bytes:
        bulk = vtype == GGUFValueType.ARRAY and sub_type is None and isinstance(val, tuple)
        if not bulk or len(val) < self._MIN_LEN:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        key = (id(val), add_vtype)
        hit = self._packed.get(key)
        if hit is None or hit[0] is not val:
            if len(self._packed) >= self._MAX_KEPT:
                self._packed.clear()
            packed = self._pack_bulk(val)
            if packed is None:
                return super()._pack_val(val, vtype, add_vtype, sub_type)
            head = self._pack("I", vtype) if add_vtype else b""
            hit = self._packed[key] = (val, head + packed)
        return hit[1]

    def _pack_bulk(self, val: tuple[Any, ...]) -> bytes | None:
        """Element type, count and items of an all-str or all-int array; None otherwise."""
        order = "<" if self.endianess == GGUFEndian.LITTLE else ">"
        if all(type(x) is str for x in val):
            items = [x.encode("utf-8") for x in val]
            lengths = np.array([len(b) for b in items], dtype=f"{order}u8").tobytes()
            body = b"".join(
                part for i, b in enumerate(items) for part in (lengths[8 * i : 8 * i + 8], b)
            )
            ltype = GGUFValueType.STRING
        elif all(type(x) is int for x in val):
            body = np.asarray(val, dtype=f"{order}i4").tobytes()
            ltype = GGUFValueType.INT32
        else:
            return None
        return self._pack("I", ltype) + self._pack("Q", len(val)) + body


def _add_vocab(w: GGUFWriter, vocab: Vocab) -> None:
    w.add_tokenizer_model(vocab.model)
    if vocab.pre is not None:
        w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    if vocab.model == "gpt2":
        w.add_token_merges(["Ġ q", "Ġ l", "q 1", "l 1"])
    if vocab.bos_id is not None:
        w.add_bos_token_id(vocab.bos_id)
    if vocab.eos_id is not None:
        w.add_eos_token_id(vocab.eos_id)
    if vocab.eot_id is not None:
        w.add_eot_token_id(vocab.eot_id)
    if vocab.pad_id is not None:
        w.add_pad_token_id(vocab.pad_id)
    if vocab.add_bos is not None:
        w.add_add_bos_token(vocab.add_bos)
    if vocab.add_eos is not None:
        w.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template is not None:
        w.add_chat_template(vocab.chat_template)


def _add_arch(w: GGUFWriter, a: Arch) -> None:
    w.add_block_count(a.n_layer + a.nextn_layers)
    w.add_context_length(a.context)
    w.add_embedding_length(a.n_embd)
    w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    if a.n_expert:
        w.add_expert_count(a.n_expert)
        w.add_expert_used_count(a.n_expert_used)
        w.add_expert_feed_forward_length(a.n_ff_exp)
    if a.ssm:
        w.add_ssm_conv_kernel(4)
        w.add_ssm_state_size(128)
        w.add_ssm_group_count(16)
        w.add_ssm_inner_size(2 * a.n_embd)
        w.add_ssm_time_step_rank(32)
    if a.nextn_layers:
        w.add_uint32(f"{a.name}.nextn_predict_layers", a.nextn_layers)
    if a.sliding_window:
        w.add_sliding_window(a.sliding_window)
    for key, value in a.extra_kv:
        add_kv(w, key, value)


def add_kv(w: GGUFWriter, key: str, value: Any) -> None:
    """Add one key with the GGUF type its Python value implies (int as uint32)."""
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))


def write_sparse_gguf(
    path: Path,
    arch: str,
    kv: Sequence[tuple[str, Any]] | None = None,
    tensors: Sequence[tuple[str, tuple[int, ...], Q]] = (),
    *,
    vocab: Vocab | None = None,
    arch_shape: Arch | None = None,
    split: tuple[int, int, int] | None = None,
    general: dict[str, Any] | None = None,
) -> int:
    """Write a header and tensor table, then extend the file to its full size sparsely.

    `split` = (split_no 0-based, split_count, total tensor count). Returns the file size.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    w = _Writer(path, arch)
    metadata = split is None or split[0] == 0
    if split is not None:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    if metadata:
        for key, value in (general or {}).items():
            if value is not None:
                add_kv(w, f"general.{key}", value)
        if arch_shape is not None:
            _add_arch(w, arch_shape)
        if vocab is not None:
            _add_vocab(w, vocab)
        for key, value in kv or ():
            add_kv(w, key, value)
    else:
        # Later parts carry only the split keys and their tensors, as gguf-split writes them.
        w.kv_data[0].pop("general.architecture", None)
    data = 0
    for name, shape, qtype in tensors:
        nbytes = _nbytes(shape, qtype)
        # numpy-order shape; for quantized types gguf-py wants the byte shape of the rows
        block, size = GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // block * size)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        data += GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    header_end = fout.tell()
    fout.close()
    w.fout = None
    total = GGUFWriter.ggml_pad(header_end, w.data_alignment) + data
    os.truncate(path, total)  # sparse: no data blocks are written
    return total


def write_demo_model(root: Path, m: DemoModel) -> list[Path]:
    table = tensor_table(m.arch, m.weight_type)
    general = {
        "name": m.name,
        "basename": m.basename,
        "size_label": m.size_label,
        "organization": m.organization,
        "file_type": int(_FTYPE.get(m.weight_type, LlamaFileType.MOSTLY_Q4_K_M)),
        "quantization_version": 2,
    }
    if m.n_split == 1:
        path = root / m.filename
        write_sparse_gguf(
            path,
            m.arch.name,
            list(m.extra_kv),
            table,
            vocab=m.vocab,
            arch_shape=m.arch,
            general=general,
        )
        return [path]
    paths = []
    stem = m.filename.removesuffix(".gguf")
    chunks = np.array_split(np.arange(len(table)), m.n_split)
    for no, idx in enumerate(chunks):
        path = root / f"{stem}-{no + 1:05d}-of-{m.n_split:05d}.gguf"
        write_sparse_gguf(
            path,
            m.arch.name,
            list(m.extra_kv),
            [table[i] for i in idx],
            vocab=m.vocab if no == 0 else None,
            arch_shape=m.arch,
            split=(no, m.n_split, len(table)),
            general=general,
        )
        paths.append(path)
    return paths


def demo_models() -> list[tuple[str, DemoModel]]:
    """(subfolder, model): the reference host's kind of collection."""
    q25, q25p = qwen_vocab("qwen2.5"), qwen_vocab("qwen2.5", padded_to=152064)
    q3 = qwen_vocab("qwen3")
    ds_big, ds_small = qwen_vocab("deepseek-distill", 152064), qwen_vocab("deepseek-distill")
    l3, g3 = llama3_vocab(), gemma3_vocab()
    lm = "lmstudio-community"
    return [
        (
            f"{lm}/Qwen2.5-Coder-32B-Instruct-GGUF",
            DemoModel(
                "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf",
                "Qwen2.5 Coder 32B Instruct",
                Arch("qwen2", 64, 5120, 27648, 40, 8, 152064),
                q25p,
                size_label="32B",
                basename="Qwen2.5-Coder",
                organization="Qwen",
            ),
        ),
        (
            f"{lm}/Qwen2.5-7B-Instruct-GGUF",
            DemoModel(
                "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
                "Qwen2.5 7B Instruct",
                Arch("qwen2", 28, 3584, 18944, 28, 4, 152064),
                q25p,
                size_label="7B",
                basename="Qwen2.5",
                organization="Qwen",
            ),
        ),
        (
            f"{lm}/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            DemoModel(
                "Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf",
                "Qwen2.5 Coder 0.5B Instruct",
                Arch("qwen2", 24, 896, 4864, 14, 2, 151936),
                q25,
                Q.Q8_0,
                size_label="0.5B",
                basename="Qwen2.5-Coder",
                organization="Qwen",
            ),
        ),
        (
            f"{lm}/Qwen3-Coder-480B-A35B-Instruct-GGUF",
            DemoModel(
                "Qwen3-Coder-480B-A35B-Instruct-Q4_K_M.gguf",
                "Qwen3 Coder 480B A35B Instruct",
                Arch(
                    "qwen3moe",
                    62,
                    6144,
                    8192,
                    96,
                    8,
                    151936,
                    context=262144,
                    n_expert=160,
                    n_expert_used=8,
                    n_ff_exp=2560,
                ),
                q3,
                n_split=8,
                size_label="480B-A35B",
                basename="Qwen3-Coder",
                organization="Qwen",
            ),
        ),
        (
            f"{lm}/Qwen3-Coder-30B-A3B-Instruct-GGUF",
            DemoModel(
                "Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf",
                "Qwen3 Coder 30B A3B Instruct",
                Arch(
                    "qwen3moe",
                    48,
                    2048,
                    6144,
                    32,
                    4,
                    151936,
                    context=262144,
                    n_expert=128,
                    n_expert_used=8,
                    n_ff_exp=768,
                ),
                q3,
                size_label="30B-A3B",
                basename="Qwen3-Coder",
                organization="Qwen",
            ),
        ),
        (
            f"{lm}/Qwen3-Next-80B-A3B-Instruct-GGUF",
            DemoModel(
                "Qwen3-Next-80B-A3B-Instruct-Q4_K_M.gguf",
                "Qwen3 Next 80B A3B Instruct",
                Arch(
                    "qwen3next",
                    48,
                    2048,
                    5120,
                    16,
                    2,
                    151936,
                    context=262144,
                    n_expert=512,
                    n_expert_used=10,
                    n_ff_exp=512,
                    shared_expert=True,
                    ssm=True,
                ),
                q3,
                size_label="80B-A3B",
                basename="Qwen3-Next",
                organization="Qwen",
            ),
        ),
        (
            "jukofyork/Qwen3-Coder-Instruct-DRAFT-0.75B-GGUF",
            DemoModel(
                "Qwen3-Coder-Instruct-DRAFT-0.75B-32k-Q4_0.gguf",
                "Qwen3 Coder Instruct DRAFT 0.75B",
                Arch("qwen3", 28, 1024, 3072, 16, 8, 151936),
                q3,
                Q.Q4_0,
                size_label="0.75B",
            ),
        ),
        (
            "bartowski/DeepSeek-R1-Distill-Qwen-32B-GGUF",
            DemoModel(
                "DeepSeek-R1-Distill-Qwen-32B-Q4_K_M.gguf",
                "DeepSeek R1 Distill Qwen 32B",
                Arch("qwen2", 64, 5120, 27648, 40, 8, 152064),
                ds_big,
                size_label="32B",
                organization="Deepseek Ai",
            ),
        ),
        (
            "bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF",
            DemoModel(
                "DeepSeek-R1-Distill-Qwen-1.5B-Q8_0.gguf",
                "DeepSeek R1 Distill Qwen 1.5B",
                Arch("qwen2", 28, 1536, 8960, 12, 2, 151936),
                ds_small,
                Q.Q8_0,
                size_label="1.5B",
                organization="Deepseek Ai",
            ),
        ),
        (
            f"{lm}/Meta-Llama-3.1-8B-Instruct-GGUF",
            DemoModel(
                "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
                "Meta Llama 3.1 8B Instruct",
                Arch("llama", 32, 4096, 14336, 32, 8, 128256, context=131072),
                l3,
                size_label="8B",
                organization="Meta Llama",
            ),
        ),
        (
            f"{lm}/Llama-3.2-1B-Instruct-GGUF",
            DemoModel(
                "Llama-3.2-1B-Instruct-Q8_0.gguf",
                "Llama 3.2 1B Instruct",
                Arch("llama", 16, 2048, 8192, 32, 8, 128256, context=131072),
                l3,
                Q.Q8_0,
                size_label="1B",
                organization="Meta Llama",
            ),
        ),
        (
            "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B-GGUF",
            DemoModel(
                "EAGLE3-LLaMA3.1-Instruct-8B-F16.gguf",
                "EAGLE3 LLaMA3.1 Instruct 8B",
                Arch(
                    "eagle3",
                    1,
                    4096,
                    14336,
                    32,
                    8,
                    128256,
                    extra_kv=(
                        ("eagle3.target_hidden_size", 4096),
                        ("eagle3.target_layers", [2, 16, 29]),
                    ),
                ),
                l3,
                Q.F16,
                extra_kv=(("general.base_model.0.name", "Meta Llama 3.1 8B Instruct"),),
            ),
        ),
        (
            f"{lm}/gemma-3-27b-it-GGUF",
            DemoModel(
                "gemma-3-27b-it-Q4_K_M.gguf",
                "Gemma 3 27b It",
                Arch(
                    "gemma3", 62, 5376, 21504, 32, 16, 262144, context=131072, sliding_window=1024
                ),
                g3,
                size_label="27B",
                organization="Google",
            ),
        ),
        (
            f"{lm}/gemma-3-1b-it-GGUF",
            DemoModel(
                "gemma-3-1b-it-Q8_0.gguf",
                "Gemma 3 1b It",
                Arch("gemma3", 26, 1152, 6912, 4, 1, 262144, context=32768, sliding_window=512),
                g3,
                Q.Q8_0,
                size_label="1B",
                organization="Google",
            ),
        ),
        (
            f"{lm}/GLM-4.5-Air-GGUF",
            DemoModel(
                "GLM-4.5-Air-Q4_K_M.gguf",
                "GLM 4.5 Air",
                Arch(
                    "glm4moe",
                    46,
                    4096,
                    10944,
                    96,
                    8,
                    151552,
                    context=131072,
                    n_expert=128,
                    n_expert_used=8,
                    n_ff_exp=1408,
                    shared_expert=True,
                    nextn_layers=1,
                ),
                glm4_vocab(),
                size_label="106B-A12B",
                organization="Zai Org",
            ),
        ),
    ]


# What `make_demo_tree` writes at the top of its folder: a folder holding nothing else holds a
# demo already (writing again there only rewrites the demo's own files).
DEMO_TOP_LEVEL = frozenset({"lmstudio", "huggingface"})


def check_demo_folder(root: Path) -> None:
    """Refuse a folder that holds something other than a demo: the demo writes 24 sparse files
    (about 530 GB apparent) into it, which no one should find among their own files."""
    if not root.is_dir():
        return
    others = sorted(p.name for p in root.iterdir() if p.name not in DEMO_TOP_LEVEL)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise FolderNotEmpty(
            f"{root} is not empty ({shown}) and holds no demo: the demo writes 24 sparse files"
            " (about 530 GB apparent) there; give a new or empty folder, or "
            f"{param('force')} to write"
            " into this one"
        )


@dataclass(frozen=True)
class DemoTree(FieldsDocument):
    """`specreg demo DIR`: the folder and every file written under it."""

    JSON_KIND = "demo"
    JSON_VERSION = "1"

    directory: Path
    files: tuple[Path, ...]


def make_demo_tree(root: Path, *, force: bool = False) -> list[Path]:
    """Write the demo collection under `root`, plus the ways real trees hold files:
    an LM Studio folder, a Hugging Face cache (snapshots symlinked to blobs), a stray link.
    A folder holding anything but a demo is refused (`FolderNotEmpty`) unless `force`."""
    root = Path(root)
    if not force:
        check_demo_folder(root)
    made: list[Path] = []
    for sub, model in demo_models():
        made += write_demo_model(root / "lmstudio" / sub, model)
    # Hugging Face cache layout: snapshots/<rev>/file -> ../../blobs/<hash>
    hf = root / "huggingface" / "hub" / "models--Qwen--Qwen2.5-Coder-0.5B-Instruct-GGUF"
    blob = hf / "blobs" / "3f0a5c9e1b7d"
    blob.parent.mkdir(parents=True, exist_ok=True)
    src = next(p for p in made if p.name == "Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf")
    if not blob.exists():
        os.link(src, blob) if hasattr(os, "link") else blob.write_bytes(src.read_bytes())
    snap = hf / "snapshots" / "a1b2c3d" / "qwen2.5-coder-0.5b-instruct-q8_0.gguf"
    snap.parent.mkdir(parents=True, exist_ok=True)
    if not snap.is_symlink():
        snap.symlink_to(os.path.relpath(blob, snap.parent))
    made += [blob, snap]
    return made
