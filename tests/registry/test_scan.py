"""`scan_paths`: what a scan records, incrementally, and how it survives bad input."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specreg.registry import queries
from specreg.registry.db import opened
from specreg.registry.gguf_header import read_header
from specreg.registry.scan import scan_paths
from specreg.samples.demo import DemoModel, write_demo_model


def _scan(db: Path, *paths: Path, **kw):
    with opened(db) as con:
        return scan_paths(con, list(paths), **kw)


def test_real_vocab_files_record_tokenizer_facts(tmp_path: Path, vocab_dir: Path) -> None:
    db = tmp_path / "r.duckdb"
    result = _scan(db, vocab_dir)
    assert result.ok and len(result.new) == result.n_models >= 15
    with opened(db) as con:
        llama3 = queries.resolve_model(con, str(vocab_dir / "ggml-vocab-llama-bpe.gguf"))
        qwen2 = queries.resolve_model(con, str(vocab_dir / "ggml-vocab-qwen2.gguf"))
        spm = queries.resolve_model(con, str(vocab_dir / "ggml-vocab-llama-spm.gguf"))
    # llama-bpe: no add_bos key stored, but llama.cpp's pre-tokenizer rule turns it on
    assert (llama3.add_bos_stored, llama3.add_bos) == (None, True)
    assert llama3.bos_id == 128000 and llama3.bos_text == "<|begin_of_text|>"
    assert llama3.eot_text == "<|eot_id|>"
    # qwen2: BPE default, BOS not added
    assert (qwen2.add_bos, qwen2.n_tokens, qwen2.vocab_type) == (False, 151936, "BPE")
    assert qwen2.eos_text == "<|endoftext|>"
    # SPM adds BOS by default and has its own defaults
    assert (spm.vocab_type, spm.add_bos, spm.bos_id, spm.bos_text) == ("SPM", True, 1, "<s>")
    assert qwen2.tok_fingerprint != llama3.tok_fingerprint


def test_fingerprint_ignores_ids_below_5_and_vocab_is_stored_once(
    tmp_path: Path, gguf_factory
) -> None:
    base = [f"t{i}" for i in range(300)]
    a = gguf_factory("a.gguf", tokens=base)
    b = gguf_factory("b.gguf", tokens=["X", "Y"] + base[2:])  # differs only at ids 0 and 1
    c = gguf_factory("c.gguf", tokens=base[:5] + ["other"] + base[6:])
    db = tmp_path / "r.duckdb"
    _scan(db, a.parent)
    with opened(db) as con:
        fa, fb, fc = (queries.resolve_model(con, str(p)) for p in (a, b, c))
        n_vocabs = con.execute("SELECT count(*) FROM vocabs").fetchone()[0]
    assert fa.tok_fingerprint == fb.tok_fingerprint != fc.tok_fingerprint
    assert fa.vocab_sha != fb.vocab_sha
    assert n_vocabs == 3


def test_sparse_tree_facts(tmp_path: Path, sparse_tree: Path) -> None:
    db = tmp_path / "r.duckdb"
    result = _scan(db, sparse_tree)
    assert result.ok
    with opened(db) as con:
        big = queries.resolve_model(con, "Qwen3 Coder 480B A35B Instruct")
        nxt = queries.resolve_model(con, "Qwen3 Next 80B A3B Instruct")
        glm = queries.resolve_model(con, "GLM 4.5 Air")
        eagle = queries.resolve_model(con, "EAGLE3 LLaMA3.1 Instruct 8B")
        coder = queries.resolve_model(con, "Qwen2.5 Coder 32B Instruct")
    assert len(big.paths) == 8 and big.status == "present"
    assert big.n_bytes > 250e9 and 400e9 < big.n_params < 500e9
    assert big.is_moe and big.expert_used_key == "qwen3moe.expert_used_count"
    assert big.expert_count == 160 and big.expert_used_count == 8
    assert 25e9 < big.n_params_active < 45e9
    assert big.bos_id == 11 and big.bos_text is not None and not big.add_bos  # the comma BOS
    assert nxt.is_hybrid and not nxt.is_recurrent and nxt.ssm_keys
    assert glm.nextn_predict_layers == 1 and glm.has_mtp_tensors
    assert eagle.draft_kind == "eagle3" and "target_hidden_size" in (eagle.draft_binding or "")
    assert coder.quant == "Q4_K_M" and coder.n_tokens == 152064 and 4 < coder.bits_per_weight < 6
    # sparse: the apparent size is real, the disk use is not
    assert sum(os.path.getsize(p) for p in big.paths) == big.n_bytes


def test_incremental_rescan_reports_new_changed_unchanged_removed(
    tmp_path: Path, gguf_factory
) -> None:
    models = tmp_path / "models"
    a = gguf_factory("a.gguf")
    b = gguf_factory("b.gguf", tokens=[f"u{i}" for i in range(50)])
    db = tmp_path / "r.duckdb"
    first = _scan(db, models)
    assert len(first.new) == 2 and first.n_models == 2

    again = _scan(db, models)
    assert (again.new, again.changed, again.removed, again.n_unchanged) == ((), (), (), 2)

    time.sleep(0.01)
    gguf_factory("a.gguf", general_name="changed")  # rewrite a
    c = gguf_factory("c.gguf", tokens=[f"v{i}" for i in range(50)])
    b.unlink()
    third = _scan(db, models)
    assert third.changed == (str(a),)
    assert third.new == (str(c),)
    assert third.removed == (str(b),)
    # identity is the header: a's old content and b are gone, a's new content and c are new
    assert len(third.models_gone) == 2 and len(third.models_new) == 2
    with opened(db) as con:
        statuses = dict(con.execute("SELECT path, status FROM files").fetchall())
        everything = queries.list_models(con, include_gone=True)
    assert statuses[str(b)] == "gone"  # kept, not deleted
    assert sum(m.status == "gone" for m in everything) == 2


def test_split_set_is_one_model_and_a_missing_part_is_reported(
    tmp_path: Path, tiny_split: DemoModel
) -> None:
    parts = write_demo_model(tmp_path / "m", tiny_split)
    db = tmp_path / "r.duckdb"
    ok = _scan(db, tmp_path / "m")
    assert ok.ok and ok.n_models == 1
    parts[1].unlink()
    broken = _scan(db, tmp_path / "m")
    assert not broken.ok
    missing = [e for e in broken.errors if e.kind == "missing_part"]
    assert [Path(e.path).name for e in missing] == ["Tiny-Split-00002-of-00003.gguf"]
    with opened(db) as con:
        m = queries.resolve_model(con, str(parts[0]))
    assert m.status == "incomplete" and len(m.parts_missing) == 1


def test_symlinks_are_deduplicated_and_broken_links_reported(tmp_path: Path, gguf_factory) -> None:
    real = gguf_factory("real.gguf")
    links = tmp_path / "links"
    links.mkdir()
    (links / "alias.gguf").symlink_to(real)
    (links / "dangling.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (links / "loop").symlink_to(links)  # a folder loop must not hang the walk
    db = tmp_path / "r.duckdb"
    result = _scan(db, real.parent, links)
    assert result.n_files == 1 and result.n_models == 1
    assert [(e.kind, Path(e.path).name) for e in result.errors] == [
        ("broken_link", "dangling.gguf")
    ]
    with opened(db) as con:
        by_link = queries.resolve_model(con, str(links / "alias.gguf"))
        row = con.execute("SELECT links FROM files WHERE path = ?", [str(real)]).fetchone()
    assert by_link.path == str(real)
    assert str(links / "alias.gguf") in row[0]


def test_ollama_style_blobs_need_all_files(tmp_path: Path, gguf_factory) -> None:
    blob_dir = tmp_path / "blobs"
    blob_dir.mkdir()
    src = gguf_factory("x.gguf")
    shutil.copy(src, blob_dir / "sha256-0123abcd")
    (blob_dir / "sha256-notgguf").write_bytes(b"{}")
    db = tmp_path / "r.duckdb"
    assert _scan(db, blob_dir).n_files == 0
    found = _scan(db, blob_dir, all_files=True)
    assert found.n_files == 1 and found.ok


def test_one_corrupt_file_never_stops_a_scan(tmp_path: Path, gguf_factory) -> None:
    good = gguf_factory("good.gguf")
    d = good.parent
    (d / "magic.gguf").write_bytes(b"NOPE" + b"\0" * 64)
    data = good.read_bytes()
    (d / "truncated.gguf").write_bytes(data[:200])
    (d / "empty.gguf").write_bytes(b"")
    unreadable = d / "unreadable.gguf"
    unreadable.write_bytes(data)
    unreadable.chmod(0)
    db = tmp_path / "r.duckdb"
    result = _scan(db, d)
    reasons = {Path(e.path).name: e.reason for e in result.errors}
    assert result.n_models == 1
    assert "not a GGUF file" in reasons["magic.gguf"]
    assert "truncated" in reasons["truncated.gguf"]
    assert "truncated" in reasons["empty.gguf"]
    if os.geteuid() != 0:  # root reads anything
        assert "ermission" in reasons["unreadable.gguf"]
    with opened(db) as con:
        stored = dict(con.execute("SELECT path, error FROM files WHERE status='error'").fetchall())
    assert "not a GGUF file" in stored[str(d / "magic.gguf")]


def test_a_bad_root_is_fatal(tmp_path: Path) -> None:
    from specreg.errors import UsageError

    with pytest.raises(UsageError, match="does not exist"):
        _scan(tmp_path / "r.duckdb", tmp_path / "nope")


def test_a_file_being_written_is_an_error_not_a_crash(
    tmp_path: Path, gguf_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specreg.registry.gguf_header as header_mod

    path = gguf_factory("growing.gguf")

    def read_then_append(p):
        header = read_header(p)
        with open(p, "ab") as f:
            f.write(b"\0" * 64)  # the writer is still going
        return header

    monkeypatch.setattr(header_mod, "read_header", read_then_append)
    result = _scan(tmp_path / "r.duckdb", path.parent)
    assert [e.kind for e in result.errors] == ["changed_during_scan"]


def test_sigkill_mid_scan_leaves_previous_state_and_next_scan_completes(
    tmp_path: Path, gguf_factory
) -> None:
    models = tmp_path / "models"
    gguf_factory("first.gguf")
    db = tmp_path / "r.duckdb"
    _scan(db, models)
    for i in range(400):
        gguf_factory(f"m{i:03d}.gguf", tokens=[f"x{i}-{j}" for j in range(2000)])
    script = (
        "import sys\n"
        "from specreg.registry.db import opened\n"
        "from specreg.registry.scan import scan_paths\n"
        "def p(done, total, path):\n"
        "    if done == 200: print('midway', flush=True)\n"
        "with opened(__import__('pathlib').Path(sys.argv[1])) as con:\n"
        "    scan_paths(con, [sys.argv[2]], progress=p)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(db), str(models)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "midway"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with opened(db) as con:
        assert con.execute("SELECT count(*) FROM models").fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM scans").fetchone()[0] == 1
    result = _scan(db, models)
    assert result.ok and result.n_models == 401


def test_an_interrupted_scan_stops_reading_and_writes_nothing(
    tmp_path: Path, gguf_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specreg.registry.gguf_header as header_mod

    for i in range(40):
        gguf_factory(f"m{i:02d}.gguf", tokens=[f"x{i}-{j}" for j in range(50)])
    reads = []

    def slow_read(p):
        reads.append(p)
        time.sleep(0.02)
        return read_header(p)

    def interrupt(done: int, total: int, path: str) -> None:
        if done == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(header_mod, "read_header", slow_read)
    db = tmp_path / "r.duckdb"
    with pytest.raises(KeyboardInterrupt):
        _scan(db, tmp_path / "models", progress=interrupt)
    assert len(reads) < 10  # the queued files were dropped, not read
    with opened(db) as con:
        assert con.execute("SELECT count(*) FROM files").fetchone()[0] == 0


def test_scan_result_owns_its_versioned_json(tmp_path: Path, gguf_factory) -> None:
    path = gguf_factory("a.gguf")
    (path.parent / "bad.gguf").write_bytes(b"NOPE" + b"\0" * 60)
    doc = _scan(tmp_path / "r.duckdb", path.parent).to_json()
    assert list(doc)[:2] == ["version", "kind"] and (doc["version"], doc["kind"]) == ("1", "scan")
    assert set(doc) == {
        "version", "kind", "scan_id", "roots", "n_files", "new", "changed", "n_unchanged",
        "removed", "errors", "n_models", "models_new", "models_updated", "models_gone",
        "seconds", "duplicates",
    }  # fmt: skip
    assert doc["new"] == [str(path)] and doc["n_models"] == 1
    assert doc["errors"] == [
        {"path": str(path.parent / "bad.gguf"), "kind": "format",
         "reason": "not a GGUF file (magic b'NOPE', expected b'GGUF')"}
    ]  # fmt: skip
