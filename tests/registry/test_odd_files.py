"""Hostile things on disk: names that are not UTF-8, FIFOs and folders with GGUF names, and
headers whose error reasons would carry kilobytes of raw bytes."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specreg.errors import GGUFError
from specreg.registry import queries
from specreg.registry.db import opened
from specreg.registry.gguf_header import read_header
from specreg.registry.scan import NAME_CLASH, NOT_A_FILE, ScanResult, scan_paths
from specreg.registry.text import REASON_MAX_CHARS, clean_reason, fs_path, path_raw, path_text

ODD = b"caf\xe9-\xff\x80.gguf"  # Latin-1 and stray bytes: not UTF-8


def _scan(db: Path, *paths: Path | str, **kw) -> ScanResult:
    with opened(db) as con:
        return scan_paths(con, list(paths), **kw)


def _odd_copy(src: Path, folder: Path, name: bytes = ODD) -> str:
    """Copy `src` into `folder` under `name` (bytes); returns the OS path as str."""
    dest = os.path.join(os.fsencode(folder), name)
    with open(src, "rb") as f, open(dest, "wb") as g:
        g.write(f.read())
    return os.fsdecode(dest)


def test_text_forms_round_trip_exactly() -> None:
    for raw in (b"/m/plain.gguf", b"/m/caf\xc3\xa9.gguf", b"/m/" + ODD, b"/m/a\\xff.gguf"):
        p = os.fsdecode(raw)
        assert os.fsencode(fs_path(path_text(p), path_raw(p))) == raw
        path_text(p).encode("utf-8")  # always storable as VARCHAR
    assert path_text(os.fsdecode(b"/m/" + ODD)) == "/m/caf\\xe9-\\xff\\x80.gguf"
    assert path_raw("/m/café.gguf") is None


def test_a_non_utf8_name_never_costs_the_other_files(tmp_path: Path, gguf_factory) -> None:
    good = [
        gguf_factory(f"good{i}.gguf", tokens=[f"g{i}-{j}" for j in range(40)]) for i in range(3)
    ]
    folder = good[0].parent
    src = gguf_factory("src.gguf", directory=tmp_path / "src", general_name="Odd")
    odd_ok = _odd_copy(src, folder)
    odd_bad = os.fsdecode(os.fsencode(folder) + b"/bad-\xfe.gguf")
    with open(odd_bad, "wb") as f:
        f.write(b"NOPE" + b"\0" * 60)
    db = tmp_path / "r.duckdb"

    result = _scan(db, folder)
    assert result.n_models == 4 and result.n_files == 5
    assert [(e.kind, e.path) for e in result.errors] == [("format", path_text(odd_bad))]
    assert path_text(odd_ok) in result.new
    json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8")  # printable as is

    with opened(db) as con:
        odd = queries.resolve_model(con, "Odd")
        for g in good:
            assert queries.resolve_model(con, str(g)).path == str(g)
        assert queries.resolve_model(con, odd_ok).model_id == odd.model_id
        (exact,) = queries.model_fs_paths(con, odd.model_id)
    assert odd.path == path_text(odd_ok) and "\\xe9" in odd.path  # escaped for display
    assert os.fsencode(exact) == os.fsencode(odd_ok)  # and exact for the OS
    assert read_header(exact).header_sha256.startswith(odd.model_id)

    again = _scan(db, folder)  # the odd name is recognised as unchanged
    assert (again.new, again.changed, again.removed, again.n_unchanged) == ((), (), (), 5)
    os.unlink(odd_ok)
    third = _scan(db, folder)
    assert third.removed == (path_text(odd_ok),) and third.n_models == 3


def test_an_odd_name_escaping_to_another_files_name_is_reported(
    tmp_path: Path, gguf_factory
) -> None:
    literal = gguf_factory("a\\xff.gguf", general_name="Literal")  # a real backslash
    other = gguf_factory("b.gguf", directory=tmp_path / "src", general_name="Other")
    odd = _odd_copy(other, literal.parent, b"a\xff.gguf")
    result = _scan(tmp_path / "r.duckdb", literal.parent)
    assert path_text(odd) == str(literal)
    assert [(e.kind, e.path) for e in result.errors] == [(NAME_CLASH, str(literal))]
    assert result.n_models == 1 and result.n_files == 1  # the odd one is reported, not lost
    with opened(tmp_path / "r.duckdb") as con:
        assert queries.resolve_model(con, str(literal)).name == "Literal"


@pytest.mark.timeout(60)
def test_a_fifo_and_a_folder_named_gguf_are_reported_and_never_block(
    tmp_path: Path, gguf_factory
) -> None:
    good = gguf_factory("good.gguf")
    fifo = good.parent / "pipe.gguf"
    os.mkfifo(fifo)
    folder = good.parent / "folder.gguf"
    folder.mkdir()
    inner = gguf_factory("inner.gguf", directory=folder, tokens=[f"i{j}" for j in range(30)])
    db = tmp_path / "r.duckdb"
    result = _scan(db, good.parent)
    assert {(e.kind, Path(e.path).name) for e in result.errors} == {
        (NOT_A_FILE, "pipe.gguf"),
        (NOT_A_FILE, "folder.gguf"),
    }
    reasons = {Path(e.path).name: e.reason for e in result.errors}
    assert reasons["pipe.gguf"] == "a FIFO (named pipe), not a file: not opened"
    assert "folder" in reasons["folder.gguf"]
    assert result.n_models == 2 and str(inner) in result.new
    # named on the command line, and with --all-files, a FIFO is not opened either
    assert [e.kind for e in _scan(db, fifo).errors] == [NOT_A_FILE]
    assert _scan(db, good.parent, all_files=True).n_models == 2


@pytest.mark.timeout(30)
def test_reading_a_fifo_fails_at_once_instead_of_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):
        read_header(fifo)
    # the FIFO is still usable by its owner: nothing was left attached to it
    t = threading.Thread(target=lambda: open(fifo, "wb").close())
    t.start()
    with open(fifo, "rb") as f:
        assert f.read() == b""
    t.join()


def _hostile_header(key: bytes) -> bytes:
    """A GGUF header whose only key has an unknown value type: the reason names the key."""
    return (
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", len(key))
        + key
        + (struct.pack("<I", 99))
    )


def test_scan_reasons_are_capped_and_escaped(tmp_path: Path, gguf_factory) -> None:
    folder = gguf_factory("good.gguf").parent
    key = b"\x1b[2J\x1b]0;owned\x07" + b"\x00\x9b" * 10 + b"A" * 5000
    (folder / "hostile.gguf").write_bytes(_hostile_header(key) + b"\0" * 64)
    db = tmp_path / "r.duckdb"
    result = _scan(db, folder)
    (err,) = result.errors
    for reason in (err.reason, _stored_error(db, folder / "hostile.gguf")):
        assert len(reason) <= REASON_MAX_CHARS + 40
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in reason)
        assert reason.startswith("key '\\x1b[2J\\x1b]0;owned\\x07\\x00")
        assert reason.endswith("more characters)")
    assert result.n_models == 1


def _stored_error(db: Path, path: Path) -> str:
    with opened(db, read_only=True) as con:
        (problem,) = [p for p in queries.file_errors(con) if p.path == str(path)]
    return problem.reason


def test_clean_reason_keeps_short_text_and_escapes_surrogates() -> None:
    assert clean_reason("plain reason") == "plain reason"
    assert clean_reason("tab\there") == "tab\\x09here"
    assert clean_reason(os.fsdecode(b"bad \xff byte")) == "bad \\xff byte"
    assert clean_reason("x" * 1000, limit=10) == "xxxxxxxxxx... (990 more characters)"


def test_the_scan_command_prints_and_reports_odd_names(tmp_path: Path, gguf_factory) -> None:
    good = gguf_factory("good.gguf")
    odd = _odd_copy(gguf_factory("src.gguf", directory=tmp_path / "src"), good.parent)
    db = str(tmp_path / "r.duckdb")
    cmd = [sys.executable, "-m", "specreg", "scan", str(good.parent), "--db", db, "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"new: {path_text(odd)}" in r.stdout and f"new: {good}" in r.stdout
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_unchanged"] == 2
