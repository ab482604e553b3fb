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


def test_the_demo_glm_has_its_own_tokenizer(scanned_db) -> None:  # type: ignore[no-untyped-def]
    """Issue 41, point 6: real GLM-4.5 GGUFs carry GLM's own tokenizer (pre-tokenizer glm4,
    151,552 rows, [gMASK] as BOS, <|user|> as EOT), so no other demo model drafts for GLM 4.5
    Air: only its MTP head, as llama.cpp would have it."""
    from specreg.auditor import compatible_drafts, drafts_for
    from specreg.registry.db import opened
    from specreg.registry.queries import list_models, resolve_model

    with opened(scanned_db, read_only=True) as con:
        glm = resolve_model(con, "GLM 4.5 Air")
        others = [m for m in list_models(con) if m.model_id != glm.model_id]
        drafts = compatible_drafts(con, glm, include_larger=True)
        modes = drafts_for(con, glm).draftless
    assert (glm.tok_model, glm.tok_pre, glm.n_tokens) == ("gpt2", "glm4", 151552)
    assert (glm.bos_text, glm.eos_text, glm.eot_text) == ("[gMASK]", "<|endoftext|>", "<|user|>")
    assert all(m.tok_fingerprint != glm.tok_fingerprint for m in others)
    assert drafts == [] and modes[0] == "draft-mtp"
