"""The streaming header reader: equal to gguf-py's GGUFReader on real files, strict on bad ones."""

from __future__ import annotations

import contextlib
import struct
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specreg.registry.gguf_header import (
    GGUFFormatError,
    StringArray,
    parse_header_bytes,
    read_header,
)


def _oracle(path: Path) -> dict:
    """Every field and tensor as gguf-py reads it (slow: seconds per vocabulary)."""
    reader = GGUFReader(path)
    fields = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            etype = field.types[-1]
            if etype == GGUFValueType.STRING:
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
        elif vtype == GGUFValueType.STRING:
            value = bytes(field.parts[field.data[0]])
        else:
            value = field.parts[field.data[0]].tolist()[0]
        fields[name] = (int(vtype), value)
    tensors = [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in reader.tensors
    ]
    return {"fields": fields, "tensors": tensors, "data_offset": int(reader.data_offset)}


def _ours(path: Path) -> dict:
    h = read_header(path)
    fields = {}
    for key, value in h.kv.items():
        vtype, etype = h.kv_types[key]
        if isinstance(value, StringArray):
            value = [value.item_bytes(i) for i in range(len(value))]
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, str):
            value = value.encode()
        fields[key] = (int(vtype), value)
    tensors = [(t.name, t.shape, t.ggml_type, h.data_offset + t.offset) for t in h.tensors]
    return {"fields": fields, "tensors": tensors, "data_offset": h.data_offset}


def test_every_field_equals_ggufreader_on_real_vocab_files(vocab_paths: list[Path]) -> None:
    with ProcessPoolExecutor(max_workers=2) as pool:
        oracles = dict(zip(vocab_paths, pool.map(_oracle, vocab_paths), strict=True))
    for path, expected in oracles.items():
        ours = _ours(path)
        assert ours["fields"].keys() == expected["fields"].keys(), path.name
        for key, (vtype, value) in expected["fields"].items():
            got_type, got = ours["fields"][key]
            assert got_type == vtype, (path.name, key)
            if isinstance(value, float):
                assert got == pytest.approx(value), (path.name, key)
            else:
                assert got == value, (path.name, key)
        # GGUFReader reports shapes in ggml order too
        assert ours["tensors"] == expected["tensors"], path.name
        assert ours["data_offset"] == expected["data_offset"], path.name


def test_string_arrays_with_empty_strings_and_nuls_use_the_exact_path(gguf_factory) -> None:
    # Empty strings and NUL runs defeat the vectorised locator; the loop must take over.
    tokens = ["a", "", "b\x00\x00\x00\x00\x00\x00\x00c", ""] + [f"t{i}" for i in range(400)]
    path = gguf_factory("odd.gguf", tokens=tokens)
    arr = read_header(path).kv["tokenizer.ggml.tokens"]
    assert arr.tolist() == tokens


def _valid_header() -> bytes:
    """A small, valid header: magic, v3, one tensor, a few keys including a string array."""

    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = [
        s("general.architecture") + struct.pack("<I", 8) + s("llama"),
        s("llama.block_count") + struct.pack("<II", 4, 2),
        s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + s("a") + s("bb") + s("ccc"),
        s("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, 3) + struct.pack("<3i", 1, 1, 3),
    ]
    tensor = s("token_embd.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 4, 3)
    tensor += struct.pack("<IQ", 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv))
    body = head + b"".join(kv) + tensor
    return body + b"\0" * (-len(body) % 32) + b"\0" * 48


VALID = _valid_header()


def test_the_handmade_header_parses() -> None:
    h = parse_header_bytes(VALID)
    assert h.kv["tokenizer.ggml.tokens"].tolist() == ["a", "bb", "ccc"]
    assert h.tensors[0].shape == (4, 3)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: b"GGUG" + b[4:], "not a GGUF file"),
        (lambda b: b[:4] + struct.pack("<I", 9) + b[8:], "unknown GGUF version 9"),
        (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "version 1 is no longer supported"),
        (lambda b: b[:4] + struct.pack(">I", 3) + b[8:], "big-endian GGUF"),
        (lambda b: b[:40], "truncated"),
        (lambda b: b"", "truncated"),
        (
            lambda b: b[:16] + struct.pack("<Q", 10**12) + b[24:],
            "claims 1000000000000 keys and 1 tensors",
        ),
    ],
)
def test_bad_headers_raise_one_line_reasons(mutate, reason: str) -> None:
    with pytest.raises(GGUFFormatError, match=reason) as err:
        parse_header_bytes(mutate(VALID))
    assert "\n" not in str(err.value)


def test_absurd_array_length_is_refused_without_allocating() -> None:
    at = VALID.index(b"tokenizer.ggml.tokens") + len("tokenizer.ggml.tokens") + 8
    bad = VALID[:at] + struct.pack("<Q", 2**62) + VALID[at + 8 :]
    with pytest.raises(GGUFFormatError, match="claims 4611686018427387904 strings"):
        parse_header_bytes(bad)


def test_absurd_string_length_is_refused() -> None:
    at = VALID.index(b"llama", 40) - 8  # the length of the "llama" value
    bad = VALID[:at] + struct.pack("<Q", 2**40) + VALID[at + 8 :]
    with pytest.raises(GGUFFormatError, match="beyond the file's end"):
        parse_header_bytes(bad)


def test_unknown_value_type_is_named() -> None:
    at = VALID.index(b"llama.block_count") + len("llama.block_count")
    bad = VALID[:at] + struct.pack("<I", 77) + VALID[at + 4 :]
    with pytest.raises(GGUFFormatError, match="unknown value type 77"):
        parse_header_bytes(bad)


def test_duplicate_key_is_named() -> None:
    with pytest.raises(GGUFFormatError, match="duplicate key 'llama.block_count'"):
        parse_header_bytes(_duplicate_key(VALID, b"llama.block_count"))


def _duplicate_key(data: bytes, key: bytes) -> bytes:
    """Insert a second copy of the uint32 key/value `key` and bump the key count."""
    start = data.index(struct.pack("<Q", len(key)) + key)
    end = start + 8 + len(key) + 4 + 4
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    return data[:16] + struct.pack("<Q", n_kv + 1) + data[24:end] + data[start:end] + data[end:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8
    ),
    st.integers(0, len(VALID)),
)
def test_fuzz_mutated_headers_parse_or_fail_cleanly(edits, cut) -> None:
    data = bytearray(VALID)
    for pos, value in edits:
        data[pos] = value
    try:
        parse_header_bytes(bytes(data[: max(cut, 4)]))
    except GGUFFormatError as err:
        assert "\n" not in str(err)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=300))
def test_fuzz_random_bytes_after_magic(tail: bytes) -> None:
    with contextlib.suppress(GGUFFormatError):
        parse_header_bytes(b"GGUF" + tail)
