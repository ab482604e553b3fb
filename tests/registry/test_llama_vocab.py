"""How llama.cpp fills in tokenizer defaults (src/llama-vocab.cpp), as the scanner records them."""

from __future__ import annotations

import pytest

from specreg.registry.gguf_header import read_header
from specreg.registry.llama_vocab import TOKEN_NULL, effective_vocab


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # BPE defaults: BOS/EOS 11, nothing added
        ({"model": "gpt2", "pre": "qwen2"}, ("BPE", 11, 11, False, False)),
        # llama3-family pre-tokenizers add BOS even without the key
        ({"model": "gpt2", "pre": "llama-bpe"}, ("BPE", 11, 11, True, False)),
        # ...but a stored add_bos_token wins
        ({"model": "gpt2", "pre": "llama-bpe", "add_bos": False}, ("BPE", 11, 11, False, False)),
        # GLM pre-tokenizers have no BOS at all
        ({"model": "gpt2", "pre": "glm4"}, ("BPE", TOKEN_NULL, 11, False, False)),
        # SPM adds BOS with ids 1/2 by default
        ({"model": "llama", "pre": None}, ("SPM", 1, 2, True, False)),
        # T5/UGM adds EOS instead
        ({"model": "t5", "pre": None}, ("UGM", TOKEN_NULL, 1, False, True)),
        # a stored id beyond the vocabulary is ignored in favour of the default
        ({"model": "gpt2", "pre": "qwen2", "bos": 9999}, ("BPE", 11, 11, False, False)),
        ({"model": "gpt2", "pre": "qwen2", "bos": 7, "eos": 8}, ("BPE", 7, 8, False, False)),
    ],
)
def test_effective_special_tokens(gguf_factory, kwargs, expected) -> None:
    path = gguf_factory("v.gguf", **kwargs)
    v = effective_vocab(read_header(path).kv)
    assert (v.vocab_type, v.bos_id, v.eos_id, v.add_bos, v.add_eos) == expected


def test_gemma4_always_adds_bos(gguf_factory) -> None:
    path = gguf_factory("g4.gguf", model="gemma4", pre=None, add_bos=False, bos=2)
    v = effective_vocab(read_header(path).kv)
    assert (v.pre, v.add_bos, v.bos_id, v.add_bos_stored) == ("gemma4", True, 2, False)


def test_default_ids_out_of_range_are_disabled(gguf_factory) -> None:
    path = gguf_factory("small.gguf", model="gpt2", pre="qwen2", tokens=["a", "b", "c"])
    v = effective_vocab(read_header(path).kv)
    assert (v.bos_id, v.eos_id) == (TOKEN_NULL, TOKEN_NULL)


def test_refusals_are_explained(gguf_factory) -> None:
    unknown_pre = effective_vocab(read_header(gguf_factory("p.gguf", pre="nonsense")).kv)
    assert unknown_pre.error == "unknown pre-tokenizer type: 'nonsense'"
    unknown_model = effective_vocab(read_header(gguf_factory("m.gguf", model="wordpiece2")).kv)
    assert unknown_model.error == "unknown tokenizer 'wordpiece2'"


def test_eot_is_found_by_text_when_no_key(gguf_factory) -> None:
    tokens = [f"t{i}" for i in range(40)] + ["<|im_end|>", "<|endoftext|>"]
    v = effective_vocab(read_header(gguf_factory("e.gguf", tokens=tokens)).kv)
    assert v.eot_id == 40
