"""From parsed GGUF headers to the facts the registry stores about a model.

One model is one file or one split set; its metadata lives in the first part and its tensors
are spread over all parts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import Keys, LlamaFileType

from specreg.registry.gguf_header import GGUFHeader, StringArray, TensorInfo
from specreg.registry.llama_vocab import TOKEN_NULL, EffectiveVocab, effective_vocab
from specreg.registry.parts import SPLIT_NAME, PartInfo, VocabBlob
from specreg.registry.text import path_text

# src/llama-arch.cpp of the pinned build: llm_arch_is_recurrent / llm_arch_is_hybrid.
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
# Architectures of dedicated draft heads (common_speculative_types_from_gguf).
DRAFT_ARCHS = {"eagle3": "eagle3", "dflash": "dflash"}
DSPARK_TENSOR = "markov_w1.weight"

# First token id whose text llama.cpp compares (SPEC_VOCAB_CHECK_START_TOKEN_ID).
FINGERPRINT_START_ID = 5
_EXPERT_TENSOR = re.compile(r"_exps\b|\.ffn_(gate|up|down|gate_up)_exps\.")


def part_info(header: GGUFHeader, path: Path) -> PartInfo:
    split_no = header.get(Keys.Split.LLM_KV_SPLIT_NO)
    split_count = header.get(Keys.Split.LLM_KV_SPLIT_COUNT)
    if not isinstance(split_count, int):
        m = SPLIT_NAME.match(path.name)
        split_no, split_count = (int(m["no"]) - 1, int(m["count"])) if m else (0, 1)
    return PartInfo(
        split_no=int(split_no or 0),
        split_count=int(split_count or 1),
        header_sha256=header.header_sha256,
        n_params=sum(t.n_elements for t in header.tensors),
        n_tensors=len(header.tensors),
    )


def quant_name(file_type: int | None, tensor_types: Counter[str]) -> str | None:
    if isinstance(file_type, int):
        try:
            name = LlamaFileType(file_type).name
            return name.removeprefix("MOSTLY_").replace("GUESSED", "").strip("_") or name
        except ValueError:
            return f"ftype{file_type}"
    return tensor_types.most_common(1)[0][0] if tensor_types else None


def _json_value(value: Any) -> Any:
    if isinstance(value, StringArray):
        return {"array": "string", "length": len(value)}
    if isinstance(value, np.ndarray):
        return {"array": str(value.dtype), "length": int(value.size)}
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def kv_rows(header: GGUFHeader) -> list[tuple[str, str, str]]:
    """(key, type, JSON value) for every key; arrays as their type and length."""
    rows = []
    for key, value in header.kv.items():
        vtype, etype = header.kv_types[key]
        tname = vtype.name if etype is None else f"ARRAY[{etype.name}]"
        rows.append((key, tname, json.dumps(_json_value(value), ensure_ascii=False)))
    return rows


def vocab_blob(header: GGUFHeader) -> VocabBlob | None:
    tokens = header.get(Keys.Tokenizer.LIST)
    if not isinstance(tokens, StringArray):
        return None
    types = header.get(Keys.Tokenizer.TOKEN_TYPE)
    types_bytes = (
        np.asarray(types, dtype="<i4").tobytes()
        if isinstance(types, np.ndarray) and types.dtype.kind == "i"
        else None
    )
    h = hashlib.sha256(tokens.raw)
    if types_bytes:
        h.update(types_bytes)
    return VocabBlob(h.hexdigest()[:32], len(tokens), tokens.raw, types_bytes)


def tokenizer_fingerprint(tokens: StringArray) -> str:
    """Identity of the token texts llama.cpp compares: ids from 5 to the end."""
    start = min(FINGERPRINT_START_ID, len(tokens))
    return hashlib.sha256(tokens.region(start)).hexdigest()[:32]


def _token_text(tokens: Any, token_id: int) -> str | None:
    if isinstance(tokens, StringArray) and 0 <= token_id < len(tokens):
        return tokens[token_id]
    return None


def model_facts(
    parts: list[tuple[Path, GGUFHeader]], *, expected_parts: int, missing: list[str]
) -> dict[str, Any]:
    """Facts of one model as a dict of `models` columns (identity and scan columns excluded).

    `parts` are the present parts sorted by split number; the first carries the metadata.
    """
    first_path, first = parts[0]
    kv = first.kv
    arch = _as_str(kv.get(Keys.General.ARCHITECTURE))
    tensors = [t for _, h in parts for t in h.tensors]
    return {
        "path": path_text(str(first_path)),
        "paths": [path_text(str(p)) for p, _ in parts],
        "parts_missing": [path_text(p) for p in missing],
        "gguf_version": first.version,
        "architecture": arch,
        "name": _as_str(kv.get(Keys.General.NAME)),
        "basename": _as_str(kv.get(Keys.General.BASENAME)),
        "size_label": _as_str(kv.get(Keys.General.SIZE_LABEL)),
        "finetune": _as_str(kv.get(Keys.General.FINETUNE)),
        "organization": _as_str(kv.get(Keys.General.ORGANIZATION)),
        **_weight_facts(kv, arch, tensors),
        **_architecture_facts(kv, arch, {t.name for t in tensors}),
        **_draft_facts(kv, arch, {t.name for t in tensors}),
        **_tokenizer_facts(kv),
    }


def _as_int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def _as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _arch_key(kv: Mapping[str, Any], arch: str | None, template: str) -> Any:
    """The value of an architecture-scoped key (`{arch}.block_count`), None without arch."""
    return kv.get(template.format(arch=arch)) if arch else None


def _weight_facts(
    kv: Mapping[str, Any], arch: str | None, tensors: Sequence[TensorInfo]
) -> dict[str, Any]:
    """The file type and quant, the parameters (all, and active per token for MoE), the bits
    per weight and the tensor types."""
    n_params = sum(t.n_elements for t in tensors)
    known_bytes = sum(t.n_bytes for t in tensors if t.n_bytes is not None)
    type_counts: Counter[str] = Counter(t.type_name for t in tensors)
    type_params: Counter[str] = Counter()
    for t in tensors:
        type_params[t.type_name] += t.n_elements
    expert_count = _as_int(_arch_key(kv, arch, Keys.LLM.EXPERT_COUNT))
    expert_used = _as_int(_arch_key(kv, arch, Keys.LLM.EXPERT_USED_COUNT))
    n_active = n_params
    if expert_count and expert_count > 1 and expert_used:
        expert_params = sum(t.n_elements for t in tensors if _EXPERT_TENSOR.search(t.name))
        n_active = n_params - expert_params + expert_params * expert_used // expert_count
    file_type = _as_int(kv.get(Keys.General.FILE_TYPE))
    return {
        "file_type": file_type,
        "quant": quant_name(file_type, Counter(type_params)),
        "n_params": n_params,
        "n_params_active": n_active,
        "bits_per_weight": (8.0 * known_bytes / n_params) if n_params else None,
        "n_tensors": len(tensors),
        "tensor_types": json.dumps(dict(type_counts.most_common())),
    }


def _architecture_facts(kv: Mapping[str, Any], arch: str | None, names: set[str]) -> dict[str, Any]:
    """Blocks, context, experts, recurrent and hybrid layers, sliding window, MLA, MTP."""

    def arch_int(template: str) -> int | None:
        return _as_int(_arch_key(kv, arch, template))

    block_count = arch_int(Keys.LLM.BLOCK_COUNT)
    expert_count = arch_int(Keys.LLM.EXPERT_COUNT)
    is_moe = bool(expert_count and expert_count > 1)
    return {
        "block_count": block_count,
        "context_length": arch_int(Keys.LLM.CONTEXT_LENGTH),
        "embedding_length": arch_int(Keys.LLM.EMBEDDING_LENGTH),
        "expert_count": expert_count,
        "expert_used_count": arch_int(Keys.LLM.EXPERT_USED_COUNT),
        "expert_used_key": Keys.LLM.EXPERT_USED_COUNT.format(arch=arch) if is_moe else None,
        "is_moe": is_moe,
        "is_recurrent": arch in RECURRENT_ARCHS,
        "is_hybrid": arch in HYBRID_ARCHS,
        "ssm_keys": sorted(k for k in kv if arch and k.startswith(f"{arch}.ssm.")),
        "sliding_window": arch_int(Keys.Attention.SLIDING_WINDOW),
        "uses_mla": _arch_key(kv, arch, Keys.Attention.KV_LORA_RANK) is not None,
        "nextn_predict_layers": arch_int(Keys.LLM.NEXTN_PREDICT_LAYERS),
        "has_mtp_tensors": block_count is not None
        and f"blk.{block_count - 1}.nextn.eh_proj.weight" in names,
    }


def _draft_facts(kv: Mapping[str, Any], arch: str | None, names: set[str]) -> dict[str, Any]:
    """What kind of draft head the file is (EAGLE-3, DFlash, DSpark), what it binds to, and
    whether it is a vision projector."""
    draft_kind = DRAFT_ARCHS.get(arch or "")
    if draft_kind == "dflash" and DSPARK_TENSOR in names:
        draft_kind = "dspark"
    binding = {
        k: _json_value(v) if not isinstance(v, np.ndarray) else v.tolist()
        for k, v in kv.items()
        if arch in ("eagle3", "dflash")
        and k.startswith(f"{arch}.")
        or k.startswith("general.base_model.")
    }
    general_type = _as_str(kv.get(Keys.General.TYPE))
    return {
        "draft_kind": draft_kind,
        "draft_binding": json.dumps(binding, ensure_ascii=False) if binding else None,
        "is_mmproj": general_type == "mmproj" or arch == "clip",
    }


def _tokenizer_facts(kv: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer as llama.cpp loads it: model, pre-tokenizer, fingerprint, special tokens
    (ids and texts), BOS/EOS rules, and the chat template's hash."""
    tokens = kv.get(Keys.Tokenizer.LIST)
    vocab: EffectiveVocab = effective_vocab(kv)
    template = kv.get(Keys.Tokenizer.CHAT_TEMPLATE)

    def tid(i: int) -> int | None:
        return None if i == TOKEN_NULL else i

    return {
        "tok_model": _as_str(kv.get(Keys.Tokenizer.MODEL)),
        "tok_pre": _as_str(kv.get(Keys.Tokenizer.PRE)),
        "vocab_type": vocab.vocab_type,
        "n_tokens": vocab.n_tokens if vocab.vocab_type else None,
        "tok_fingerprint": tokenizer_fingerprint(tokens)
        if isinstance(tokens, StringArray)
        else None,
        "bos_id": tid(vocab.bos_id),
        "eos_id": tid(vocab.eos_id),
        "eot_id": tid(vocab.eot_id),
        "pad_id": tid(vocab.pad_id),
        "bos_text": _token_text(tokens, vocab.bos_id),
        "eos_text": _token_text(tokens, vocab.eos_id),
        "eot_text": _token_text(tokens, vocab.eot_id),
        "pad_text": _token_text(tokens, vocab.pad_id),
        "add_bos_stored": vocab.add_bos_stored,
        "add_eos_stored": vocab.add_eos_stored,
        "add_bos": vocab.add_bos,
        "add_eos": vocab.add_eos,
        "vocab_error": vocab.error,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()
        if isinstance(template, str)
        else None,
    }
