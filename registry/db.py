"""Opening the DuckDB registry: one place that creates, migrates and locks it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from specreg.errors import RegistryError
from specreg.registry.migrations import migrate


def connect(db_path: Path, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open (creating and migrating if needed) the registry at `db_path`."""
    if read_only and not db_path.exists():
        raise RegistryError(f"no registry at {db_path}: run `specreg scan DIR` first")
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect(str(db_path), read_only=read_only)
    except duckdb.IOException as err:
        msg = str(err).splitlines()[0]
        if "lock" in msg.lower():
            raise RegistryError(
                f"the registry {db_path} is in use by another specreg process; wait for it "
                "to finish"
            ) from err
        raise RegistryError(f"cannot open the registry {db_path}: {msg}") from err
    except (duckdb.Error, OSError) as err:
        raise RegistryError(
            f"cannot open the registry {db_path}: {str(err).splitlines()[0]} "
            "(move it aside to start a new one)"
        ) from err
    if not read_only:
        migrate(con)
    return con


@contextmanager
def opened(db_path: Path, *, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect(db_path, read_only=read_only)
    try:
        yield con
    finally:
        con.close()


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """All or nothing: a killed process leaves the previous state intact."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
