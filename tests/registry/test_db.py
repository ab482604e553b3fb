"""Opening the registry: a damaged file, a read-only home, an older schema."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from specreg.errors import RegistryError
from specreg.registry import queries
from specreg.registry.db import opened
from specreg.registry.migrations import MIGRATIONS, applied
from specreg.registry.scan import scan_paths


def _registry(db: Path, models: Path) -> None:
    with opened(db) as con:
        assert scan_paths(con, [models]).ok


def _damaged_variants(good: bytes) -> dict[str, bytes]:
    return {
        "garbage": b"this is not a database\n" * 500,
        "truncated": good[:5000],
        # a block of the catalog overwritten: DuckDB's checksum catches it on open
        "overwritten_block": good[:4096] + b"\x55" * 4096 + good[8192:],
    }


@pytest.mark.parametrize("variant", ["garbage", "truncated", "overwritten_block"])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_damaged_registry_says_what_to_do_and_is_never_written(
    tmp_path: Path, gguf_factory, variant: str, read_only: bool
) -> None:
    good = tmp_path / "good.duckdb"
    _registry(good, gguf_factory("a.gguf").parent)
    db = tmp_path / "registry.duckdb"
    damaged = _damaged_variants(good.read_bytes())[variant]
    db.write_bytes(damaged)
    with pytest.raises(RegistryError) as err, opened(db, read_only=read_only):
        pass
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"the registry {db} is damaged (")
    assert msg.endswith(
        f"move it aside (mv {db} {db}.damaged) and run `specreg scan` on your model folders"
        " to rebuild it; recorded runs are lost unless you exported them (`specreg export`)"
    )
    assert db.read_bytes() == damaged
    assert sorted(p.name for p in tmp_path.glob("registry.duckdb*")) == ["registry.duckdb"]


def test_a_damaged_registry_through_the_cli_is_one_line_and_untouched(
    tmp_path: Path, gguf_factory
) -> None:
    db = tmp_path / "registry.duckdb"
    damaged = b"\x00garbage" * 1000
    db.write_bytes(damaged)
    r = subprocess.run(
        [sys.executable, "-m", "specreg", "scan", str(gguf_factory("a.gguf").parent),
         "--db", str(db)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: the registry {db} is damaged (")
    assert "move it aside" in lines[0] and "runs are lost unless you exported them" in lines[0]
    assert db.read_bytes() == damaged


def test_read_only_open_needs_an_existing_registry(tmp_path: Path) -> None:
    db = tmp_path / "none" / "registry.duckdb"
    with pytest.raises(RegistryError, match=r"no registry at .*: run `specreg scan DIR` first"):
        opened(db, read_only=True).__enter__()
    assert not db.parent.exists()  # nothing created


def test_read_only_open_reads_and_writes_nothing(tmp_path: Path, gguf_factory) -> None:
    db = tmp_path / "registry.duckdb"
    path = gguf_factory("a.gguf")
    _registry(db, path.parent)
    before = db.read_bytes()
    with opened(db, read_only=True) as con:
        assert [m.path for m in queries.list_models(con)] == [str(path)]
        with pytest.raises(duckdb.Error):
            con.execute("DELETE FROM models")
    assert db.read_bytes() == before
    assert not Path(f"{db}.wal").exists()


def _old_registry(db: Path, upto: int) -> None:
    """A registry as a specreg that knew migrations 1..upto left it."""
    con = duckdb.connect(str(db))
    applied(con)
    for number, name, fn in MIGRATIONS:
        if number <= upto:
            fn(con)
            con.execute("INSERT INTO migrations VALUES (?, ?, current_timestamp)", [number, name])
    con.close()


def test_read_only_open_of_an_older_schema_says_how_to_upgrade(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    _old_registry(db, 3)
    before = db.read_bytes()
    with pytest.raises(RegistryError) as err, opened(db, read_only=True):
        pass
    missing = ", ".join(str(n) for n, _, _ in sorted(MIGRATIONS) if n > 3)  # 4 and later
    assert str(err.value) == (
        f"the registry {db} was written by an older specreg (it lacks schema migration "
        f"{missing}), "
        "and a read-only open cannot upgrade it: run `specreg scan` once where the registry "
        "is writable"
    )
    assert db.read_bytes() == before
    with opened(db) as con:  # a writing open upgrades it
        assert applied(con) >= {1, 2, 3, 4}
    with opened(db, read_only=True) as con:
        assert queries.list_models(con) == []


def test_a_registry_from_a_newer_specreg_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    with opened(db) as con:
        con.execute("INSERT INTO migrations VALUES (999, 'future', current_timestamp)")
    for read_only in (False, True):
        with pytest.raises(RegistryError, match="schema migration 999 .*: upgrade specreg"):
            opened(db, read_only=read_only).__enter__()


# --- a read-only SPECREG_HOME -------------------------------------------------------------------

READ_ONLY_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from specreg.cli.main import error_line
    from specreg.errors import RegistryError
    from specreg.registry import queries
    from specreg.registry.db import opened
    db = Path(sys.argv[1])
    try:
        open(db.parent / "probe", "w")
    except OSError as err:
        print("home is read-only:", err.strerror)
    with opened(db, read_only=True) as con:
        models = queries.list_models(con)
        print("models", len(models), queries.resolve_model(con, models[0].model_id).name)
    try:
        opened(db).__enter__()
    except RegistryError as err:
        print("write:", error_line(err))  # as the CLI says it
    """
)


def _run_read_only(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run python with `home` on a read-only filesystem (a read-only bind mount when root,
    who can write anything chmod forbids; plain permissions otherwise)."""
    cmd = [sys.executable, "-c", READ_ONLY_SCRIPT, *args]
    if os.geteuid() != 0:
        mode = home.stat().st_mode
        home.chmod(0o555)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        finally:
            home.chmod(mode)
    if shutil.which("unshare") is None:
        pytest.skip("unshare is needed to make a read-only home as root")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, str(home), *cmd],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_read_commands_work_in_a_read_only_home(tmp_path: Path, gguf_factory) -> None:
    home = tmp_path / "home"
    home.mkdir()
    db = home / "registry.duckdb"
    _registry(db, gguf_factory("a.gguf", general_name="Tiny").parent)
    before = db.read_bytes()
    r = _run_read_only(home, str(db))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("home is read-only:")
    assert lines[1] == "models 1 Tiny"
    assert lines[2].startswith(f"write: cannot write the registry {db} (")
    assert lines[2].endswith(
        "this command records what it finds, so point SPECREG_HOME or --db at a writable"
        " folder; read commands (models, show, compat, drafts, runs, plan) still work here"
    )
    assert db.read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["registry.duckdb"]


def test_damage_found_after_opening_is_the_same_one_line(tmp_path: Path, vocab_dir: Path) -> None:
    """A damaged block that only a later read touches (here a stored vocabulary)."""
    from specreg.registry.vocab_store import _decode, load_vocab

    good = tmp_path / "good.duckdb"
    with opened(good) as con:
        scan_paths(con, [vocab_dir / "ggml-vocab-qwen2.gguf"])  # a vocabulary of ~1 MB
        (sha,) = con.execute("SELECT vocab_sha FROM vocabs").fetchone()
    data = good.read_bytes()
    db = tmp_path / "registry.duckdb"
    block = 256 * 1024  # DuckDB's block size: damage one block after another
    for start in range(block, len(data) - 2048, block):
        db.write_bytes(data[: start + 8] + b"\x55" * 1024 + data[start + 8 + 1024 :])
        con = duckdb.connect(str(db), read_only=True)
        try:
            con.execute("SELECT tokens_z FROM vocabs").fetchall()
        except duckdb.Error:
            break
        finally:
            con.close()
    else:
        pytest.fail("no block of the stored vocabulary found to damage")
    damaged = db.read_bytes()
    _decode.cache_clear()
    with pytest.raises(RegistryError) as err, opened(db, read_only=True) as con:
        assert queries.list_models(con)  # the catalog and models are intact
        load_vocab(con, sha)
    assert str(err.value).startswith(f"the registry {db} is damaged (Corrupt database file")
    assert "move it aside" in str(err.value) and "\n" not in str(err.value)
    assert db.read_bytes() == damaged
