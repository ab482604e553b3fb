"""Auditor test data: mutated copies of llama.cpp's real vocab GGUFs, written with GGUFWriter.

Each mutation changes exactly one thing llama.cpp's compatibility check reads (or one thing it
must ignore), so a disagreement between specreg and llama.cpp names its cause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter, Keys, TokenType

from specreg.registry.gguf_header import GGUFHeader, StringArray, read_header

Edit = Callable[[dict[str, Any], dict[str, tuple[GGUFValueType, GGUFValueType | None]]], None]

TOKENS = Keys.Tokenizer.LIST
TYPES = Keys.Tokenizer.TOKEN_TYPE
SCORES = Keys.Tokenizer.SCORES
BOS = Keys.Tokenizer.BOS_ID
EOS = Keys.Tokenizer.EOS_ID
ADD_BOS = Keys.Tokenizer.ADD_BOS
ADD_EOS = Keys.Tokenizer.ADD_EOS
MODEL = Keys.Tokenizer.MODEL
PRE = Keys.Tokenizer.PRE


def _tokens(kv: dict[str, Any]) -> list[bytes]:
    arr = kv[TOKENS]
    return [arr.item_bytes(i) for i in range(len(arr))] if isinstance(arr, StringArray) else arr


def _resize(kv: dict[str, Any], new_tokens: list[bytes], fill_type: int) -> None:
    """Set the token list and keep the per-token arrays llama.cpp checks the length of aligned."""
    n = len(new_tokens)
    kv[TOKENS] = new_tokens
    for key, fill in ((TYPES, fill_type), (SCORES, 0)):
        if key in kv:
            old = list(np.asarray(kv[key]).tolist())
            kv[key] = (old + [fill] * n)[:n]


def pad(n: int) -> Edit:
    def edit(kv: dict[str, Any], types: Any) -> None:
        toks = _tokens(kv)
        start = len(toks)
        _resize(kv, toks + [b"[PAD%d]" % (start + i) for i in range(n)], int(TokenType.UNUSED))

    return edit


def real_extra(n: int) -> Edit:
    """Extra ids that are real tokens, not padding: passes the size rule, fails at run time."""

    def edit(kv: dict[str, Any], types: Any) -> None:
        toks = _tokens(kv)
        _resize(kv, toks + [b"<|tool_%d|>" % i for i in range(n)], int(TokenType.CONTROL))

    return edit


def cut(n: int) -> Edit:
    def edit(kv: dict[str, Any], types: Any) -> None:
        toks = _tokens(kv)
        _resize(kv, toks[: len(toks) - n], int(TokenType.NORMAL))

    return edit


def set_key(key: str, value: Any, vtype: GGUFValueType) -> Edit:
    def edit(kv: dict[str, Any], types: dict[str, Any]) -> None:
        kv[key] = value
        types[key] = (vtype, None)

    return edit


def both(*edits: Edit) -> Edit:
    def edit(kv: dict[str, Any], types: dict[str, Any]) -> None:
        for e in edits:
            e(kv, types)

    return edit


def text_at(token_id: int) -> Edit:
    def edit(kv: dict[str, Any], types: Any) -> None:
        toks = _tokens(kv)
        i = token_id if token_id >= 0 else len(toks) + token_id
        toks[i] = b"specreg-mutated-%d" % i
        kv[TOKENS] = toks

    return edit


def drop_key(key: str) -> Edit:
    def edit(kv: dict[str, Any], types: dict[str, Any]) -> None:
        kv.pop(key, None)
        types.pop(key, None)

    return edit


@dataclass(frozen=True)
class Mutation:
    name: str
    edit: Edit


def mutations_for(header: GGUFHeader) -> list[Mutation]:
    """The issue's list of mutations, adapted to one base vocabulary."""
    kv = header.kv
    n = len(kv[TOKENS])
    model = kv.get(MODEL)
    bos = kv.get(BOS)
    other_bos = 10 if bos != 10 else 11
    add_eos = bool(kv.get(ADD_EOS, False))
    u32, b = GGUFValueType.UINT32, GGUFValueType.BOOL
    out = [
        Mutation("pad128", pad(128)),
        Mutation("pad129", pad(129)),
        Mutation("real_extra64", real_extra(64)),
        Mutation("cut100", cut(100)),
        Mutation(
            "bos_changed_add_on", both(set_key(BOS, other_bos, u32), set_key(ADD_BOS, True, b))
        ),
        Mutation(
            "bos_changed_add_off", both(set_key(BOS, other_bos, u32), set_key(ADD_BOS, False, b))
        ),
        Mutation("add_eos_flipped", set_key(ADD_EOS, not add_eos, b)),
        Mutation("text3", text_at(3)),
        Mutation("text4", text_at(4)),
        Mutation("text5", text_at(5)),
        Mutation("text1000", text_at(1000)),
        Mutation("text_last", text_at(n - 1)),
    ]
    if ADD_BOS in kv:  # llama.cpp then falls back to its per-tokenizer default
        out.append(Mutation("add_bos_key_dropped", drop_key(ADD_BOS)))
    if model == "gpt2":
        out.append(Mutation("model_llama", set_key(MODEL, "llama", GGUFValueType.STRING)))
        pre = kv.get(PRE)
        new_pre = "llama-bpe" if pre != "llama-bpe" else "qwen2"
        out.append(Mutation(f"pre_{new_pre}", set_key(PRE, new_pre, GGUFValueType.STRING)))
    elif model == "llama":
        out.append(
            Mutation(
                "model_gpt2",
                both(
                    set_key(MODEL, "gpt2", GGUFValueType.STRING),
                    set_key(Keys.Tokenizer.MERGES, [b"a b"], GGUFValueType.ARRAY),
                    set_key(PRE, "default", GGUFValueType.STRING),
                ),
            )
        )
        out.append(Mutation("pre_changed", set_key(PRE, "llama-bpe", GGUFValueType.STRING)))
    return out


def write_copy(src: Path, dst: Path, edit: Edit | None = None) -> Path:
    """Copy a tensor-less GGUF's key/values through GGUFWriter, applying `edit` first."""
    header = read_header(src)
    kv = dict(header.kv)
    types = dict(header.kv_types)
    if edit:
        edit(kv, types)
    arch = kv.get(Keys.General.ARCHITECTURE, "llama")
    dst.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(dst, arch)
    for key, value in kv.items():
        if key == Keys.General.ARCHITECTURE:
            continue
        vtype, sub = types[key]
        if vtype == GGUFValueType.ARRAY:
            if isinstance(value, StringArray):
                value = [value.item_bytes(i) for i in range(len(value))]
                sub = GGUFValueType.STRING
            elif isinstance(value, np.ndarray):
                value = value.tolist()
            if sub is None:
                sub = GGUFValueType.STRING if value and isinstance(value[0], bytes) else None
            w.add_key_value(key, list(value), GGUFValueType.ARRAY, sub)
        else:
            w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def write_mutations(src: Path, out_dir: Path) -> list[Path]:
    header = read_header(src)
    stem = src.stem.replace("ggml-vocab-", "")
    paths = []
    for m in mutations_for(header):
        paths.append(write_copy(src, out_dir / f"{stem}--{m.name}.gguf", m.edit))
    return paths
