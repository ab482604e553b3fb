"""The registry's query functions other parts read through: audits, scans, key values,
vocabularies (old zlib rows and new zstd ones)."""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import pytest
from gguf.constants import Keys

from specreg.errors import AmbiguousModel, ModelNotFound
from specreg.registry import audits, queries
from specreg.registry.db import opened
from specreg.registry.gguf_header import read_header
from specreg.registry.scan import scan_paths
from specreg.registry.vocab_store import _decode, load_vocab


def _edge(t: str, d: str, verdict: str = "compatible") -> audits.StoredEdge:
    return audits.StoredEdge(t, d, verdict, True, ("a", "b") if verdict != "compatible" else ())


def _run(n_models: int = 2) -> audits.AuditRun:
    return audits.AuditRun("b1234", 1234, n_models, n_models * (n_models - 1), {"x": 1}, {}, 3, 0.5)


def test_an_audit_round_trips_and_goes_stale_after_a_scan(tmp_path: Path, gguf_factory) -> None:
    db = tmp_path / "r.duckdb"
    with opened(db) as con:
        assert audits.latest_audit_id(con) is None
        first = audits.save_audit(
            con,
            _run(),
            [audits.AuditClass(0, "m1", "gpt2:abc"), audits.AuditClass(1, "m2", None)],
            [audits.AuditClassVerdict(0, 1, False, ("token_text",), 1)],
            [_edge("m1", "m2"), _edge("m2", "m1", "risky")],
        )
        second = audits.save_audit(con, _run(0), [], [], [])
        assert (first, second) == (1, 2)
        assert audits.latest_audit_id(con, current=True) == 2
        assert audits.stored_edges(con, first) == [_edge("m1", "m2"), _edge("m2", "m1", "risky")]
        assert audits.stored_families(con, first) == {"m1": "gpt2:abc", "m2": None}
        row = con.execute(
            "SELECT failed, accepts FROM audit_class_verdicts WHERE audit_id = 1"
        ).fetchone()
        assert row == (["token_text"], False)
        time.sleep(0.01)
        scan_paths(con, [gguf_factory("a.gguf").parent])
        assert audits.latest_audit_id(con, current=True) is None  # a scan came after it
        assert audits.latest_audit_id(con) == 2


def test_scan_history_and_key_values(tmp_path: Path, gguf_factory) -> None:
    folder = gguf_factory("a.gguf", kv={"tokenizer.chat_template": "{{ messages }}"}).parent
    gguf_factory("b.gguf", tokens=[f"u{i}" for i in range(40)])
    db = tmp_path / "r.duckdb"
    with opened(db) as con:
        scan_paths(con, [folder])
        scan_paths(con, [folder])
        history = queries.scan_history(con)
        templates = queries.kv_values(con, Keys.Tokenizer.CHAT_TEMPLATE)
        a = queries.resolve_model(con, str(folder / "a.gguf"))
    assert [s.scan_id for s in history] == [2, 1]
    assert (history[1].n_new, history[0].n_unchanged, history[0].n_new) == (2, 2, 0)
    assert history[0].roots == (str(folder),) and history[0].started_at is not None
    assert templates == {a.model_id: "{{ messages }}"}


def test_model_id_at_path_follows_links_and_can_require_a_readable_file(
    tmp_path: Path, gguf_factory
) -> None:
    real = gguf_factory("real.gguf")
    link = tmp_path / "alias.gguf"
    link.symlink_to(real)
    db = tmp_path / "r.duckdb"
    with opened(db) as con:
        scan_paths(con, [real.parent, link])
        model_id = queries.resolve_model(con, str(real)).model_id
        assert queries.model_id_at_path(con, link) == model_id
        assert queries.model_id_at_path(con, real, ok_only=True) == model_id
        assert queries.model_id_at_path(con, tmp_path / "nothing.gguf") is None


def test_vocabularies_are_zstd_now_and_old_zlib_rows_still_load(
    tmp_path: Path, vocab_dir: Path
) -> None:
    path = vocab_dir / "ggml-vocab-qwen2.gguf"
    tokens = read_header(path).get(Keys.Tokenizer.LIST)
    db = tmp_path / "r.duckdb"
    with opened(db) as con:
        scan_paths(con, [path])
        sha = queries.resolve_model(con, str(path)).vocab_sha
        assert sha is not None
        (codec,) = con.execute("SELECT codec FROM vocabs WHERE vocab_sha = ?", [sha]).fetchone()
        assert codec == "zstd"
        assert load_vocab(con, sha).tokens.raw == tokens.raw
        # a row written before migration 4: zlib, and its codec column defaulted
        con.execute(
            "INSERT INTO vocabs (vocab_sha, n_tokens, tokens_z) VALUES ('old', ?, ?)",
            [len(tokens), zlib.compress(tokens.raw)],
        )
        _decode.cache_clear()
        old = load_vocab(con, "old")
    assert old.tokens.raw == tokens.raw and old.tokens[1000] == tokens[1000]


def _two_coders(gguf_factory) -> Path:  # type: ignore[no-untyped-def]
    for size, quant, ftype in (("32B", "Q4_K_M", 15), ("0.5B", "Q8_0", 7)):
        path = gguf_factory(
            f"Qwen2.5-Coder-{size}-Instruct-{quant}.gguf",
            general_name=f"Qwen2.5 Coder {size} Instruct",
            kv={
                "general.basename": "Qwen2.5-Coder",
                "general.size_label": size,
                "general.file_type": ftype,
            },
        )
    gguf_factory("Model+v2 (final).gguf", general_name="Odd One")
    return path.parent


def test_names_as_a_user_types_them(tmp_path: Path, gguf_factory) -> None:
    """Issue 41, point 1: case, spaces, hyphens and underscores ignored; the name, the basename
    with its size label, the name with its quant (what `specreg init` writes as an alias), the
    file name and its stem, and serve's model id (the stem made safe)."""
    from specreg.serve.routes import safe_name

    folder = _two_coders(gguf_factory)
    with opened(tmp_path / "r.duckdb") as con:
        scan_paths(con, [folder])
        big = queries.resolve_model(con, str(folder / "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf"))
        odd = queries.resolve_model(con, "Odd One")
        for ref in (
            "Qwen2.5-Coder-32B-Instruct",
            "qwen2.5-coder-32b",
            "QWEN2.5 CODER 32B INSTRUCT",
            "Qwen2.5-Coder-32B-Instruct-Q4_K_M",
            "qwen2.5_coder_32b_instruct_q4_k_m.gguf",
            "Qwen2.5 Coder 32B Instruct Q4_K_M",
        ):
            assert queries.resolve_model(con, ref).model_id == big.model_id, ref
        assert queries.resolve_model(con, "qwen2.5-coder-0.5b").model_id != big.model_id
        served = safe_name("Model+v2 (final)")
        assert served == "Model-v2-final"
        assert queries.resolve_model(con, served).model_id == odd.model_id
        # two targets with one stem: serve adds the id's start to the second
        twice = f"Qwen2.5-Coder-32B-Instruct-Q4_K_M-{big.model_id[:8]}"
        assert queries.resolve_model(con, twice).model_id == big.model_id


def test_a_forgiving_name_two_models_answer_to_names_both(tmp_path: Path, gguf_factory) -> None:
    folder = _two_coders(gguf_factory)
    with opened(tmp_path / "r.duckdb") as con:
        scan_paths(con, [folder])
        with pytest.raises(AmbiguousModel) as err:
            queries.resolve_model(con, "qwen2.5 coder")
    assert str(err.value).startswith("'qwen2.5 coder' matches 2 models (")
    assert "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf" in str(err.value)
    assert "Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf" in str(err.value)


def test_no_match_names_the_nearest(tmp_path: Path, gguf_factory) -> None:
    folder = _two_coders(gguf_factory)
    with opened(tmp_path / "r.duckdb") as con:
        scan_paths(con, [folder])
        big = queries.resolve_model(con, "Qwen2.5 Coder 32B Instruct").model_id
        with pytest.raises(ModelNotFound) as near:
            queries.resolve_model(con, "qwen coder 32b")
        with pytest.raises(ModelNotFound) as far:
            queries.resolve_model(con, "no-such-model")
    assert str(near.value).startswith(
        "no model matches 'qwen coder 32b': give a path, an id from `specreg models`, or a name"
        f" (nearest: Qwen2.5-Coder 32B ({big[:10]})"
    )
    assert str(far.value) == (
        "no model matches 'no-such-model': give a path, an id from `specreg models`, or a name"
    )
