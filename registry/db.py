"""Opening the DuckDB registry: one place that creates, migrates and locks it.

Two ways in. Writing commands (`scan`, `run`, `audit --save`, ...) open it read-write: it is
created if missing and migrated to this specreg's schema. Read commands (`models`, `show`,
`compat`, `drafts`, `runs`, `plan`) open it read-only: nothing is created, locked for writing
or written, so they work in a read-only SPECREG_HOME and beside a running scan's readers.

A file DuckDB cannot read is never replaced or repaired here: the user's runs live in it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from specreg.errors import RegistryError, param

if TYPE_CHECKING:
    import duckdb


def corrupt_registry(db_path: Path, detail: str) -> RegistryError:
    """The one line for a registry DuckDB cannot read: what happened and what to do."""
    return RegistryError(
        f"the registry {db_path} is damaged ({detail}): move it aside (mv {db_path} "
        f"{db_path}.damaged) and run `specreg scan` on your model folders to rebuild it; "
        "recorded runs are lost unless you exported them (`specreg export`)"
    )


def is_corruption(err: BaseException) -> bool:
    """DuckDB's ways of saying the file's bytes are not a database it can read."""
    text = str(err)
    return any(
        marker in text
        for marker in (
            "not a valid DuckDB database file",
            "Corrupt database file",
            "Could not read enough bytes from file",
            "checksum",
        )
    )


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


# How long an open waits for another process's lock. A measuring process holds the registry
# only for its short writes (runner/runs.py), and a reader only while it reads.
LOCK_WAIT_S = 10.0


def _connect_waiting(db_path: Path, read_only: bool, wait: float) -> duckdb.DuckDBPyConnection:
    """DuckDB's connect, tried again while another process holds a conflicting lock."""
    import duckdb

    deadline = time.monotonic() + wait
    pause = 0.02
    while True:
        try:
            return duckdb.connect(str(db_path), read_only=read_only)
        except duckdb.Error as err:
            if "lock" not in _first_line(err).lower() or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _open(db_path: Path, read_only: bool, wait: float = LOCK_WAIT_S) -> duckdb.DuckDBPyConnection:
    import duckdb

    try:
        if not read_only:
            db_path.parent.mkdir(parents=True, exist_ok=True)
        return _connect_waiting(db_path, read_only, wait)
    except duckdb.Error as err:
        msg = _first_line(err)
        if is_corruption(err):
            raise corrupt_registry(db_path, msg) from err
        if "lock" in msg.lower():
            raise RegistryError(
                f"the registry {db_path} is in use by another specreg process; wait for it "
                "to finish"
            ) from err
        if read_only:
            raise RegistryError(
                f"cannot open the registry {db_path}: {msg} (check that you can read it)"
            ) from err
        if not _writable(db_path):
            raise RegistryError(
                f"cannot write the registry {db_path} ({msg}): this command records what it "
                f"finds, so point SPECREG_HOME or {param('db')} at a writable folder; read "
                "commands "
                "(models, show, compat, drafts, runs, plan) still work here"
            ) from err
        raise RegistryError(f"cannot open the registry {db_path}: {msg}") from err
    except OSError as err:
        raise RegistryError(
            f"cannot create the registry {db_path}: {err.strerror or err}: set SPECREG_HOME "
            f"or {param('db')} to a folder you can write"
        ) from err


def _writable(db_path: Path) -> bool:
    target = db_path if db_path.exists() else db_path.parent
    return os.access(target, os.W_OK) and os.access(db_path.parent, os.W_OK)


def connect(
    db_path: Path, *, read_only: bool = False, wait: float = LOCK_WAIT_S
) -> duckdb.DuckDBPyConnection:
    """Open the registry at `db_path`: read-write (created and migrated if needed), or
    read-only (it must exist and be of this specreg's schema; nothing is written)."""
    from specreg.registry.migrations import check_current, migrate

    if read_only and not db_path.exists():
        raise RegistryError(f"no registry at {db_path}: run `specreg scan DIR` first")
    if read_only and not db_path.is_file():
        raise RegistryError(
            f"the registry {db_path} is not a file: give {param('db')} a .duckdb file"
        )
    con = _open(db_path, read_only, wait)
    try:
        if read_only:
            check_current(con, db_path)
        else:
            migrate(con)
    except RegistryError:
        con.close()
        raise
    except Exception as err:
        con.close()
        if is_corruption(err):
            raise corrupt_registry(db_path, _first_line(err)) from err
        raise
    return con


@contextmanager
def opened(
    db_path: Path, *, read_only: bool = False, wait: float = LOCK_WAIT_S
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection for the block; damage DuckDB finds later (a block read only now, such
    as a stored vocabulary) becomes the same one-line `corrupt_registry` error. `wait`: how
    long to wait for another process's lock."""
    import duckdb

    con = connect(db_path, read_only=read_only, wait=wait)
    try:
        yield con
    except duckdb.Error as err:
        if is_corruption(err):
            raise corrupt_registry(db_path, _first_line(err)) from err
        raise
    finally:
        con.close()
