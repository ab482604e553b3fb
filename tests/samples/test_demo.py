"""The demo collection's writer: bulk-packed arrays give exactly gguf's own bytes."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFWriter

from specreg.registry.gguf_header import read_header
from specreg.samples import demo


def _write(cls: type[GGUFWriter], path: Path) -> bytes:
    n = 6000
    tokens = tuple(f"Ġt{i}" if i % 7 else f"é{i}\u2581" for i in range(n))
    w = cls(path, "llama")
    w.add_token_list(tokens)  # bulk: all str
    w.add_token_types(tuple(i % 6 for i in range(n)))  # bulk: all int
    w.add_token_scores(tuple(float(i) for i in range(n)))  # floats: gguf's own path
    w.add_token_merges(tuple(t.encode() for t in tokens))  # bytes: gguf's own path
    w.add_array("specreg.test.short", tokens[:10])  # short: gguf's own path
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path.read_bytes()


def test_bulk_packed_arrays_equal_ggufs_own(tmp_path: Path) -> None:
    assert _write(demo._Writer, tmp_path / "demo.gguf") == _write(GGUFWriter, tmp_path / "g.gguf")


def test_demo_vocabulary_bytes_equal_ggufs_own(tmp_path: Path) -> None:
    vocab = demo.qwen_vocab("qwen3")
    files = {}
    for name, cls in (("gguf", GGUFWriter), ("demo", demo._Writer)):
        path = tmp_path / f"{name}.gguf"
        w = cls(path, "qwen3")
        demo._add_vocab(w, vocab)
        w.add_array("specreg.test.again", vocab.tokens)  # a second use: served from the cache
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        files[name] = path.read_bytes()
    assert files["demo"] == files["gguf"]
    header = read_header(tmp_path / "demo.gguf")
    assert len(header.kv["tokenizer.ggml.tokens"]) == len(vocab.tokens) == 151936
