"""SQL helpers every store shares, on a connection already open: transactions and filters.

Kept apart from `db` (which opens, creates and migrates the registry) so the stores whose
migrations `db` runs can use them without importing `db`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb


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


def where_equal(**columns: Any) -> tuple[str, list[Any]]:
    """` WHERE a = ? AND b = ?` for the columns given a value (None: no filter), and its
    parameters; an empty clause when no column is given one. Column names are the caller's
    code, never user input."""
    given = {c: v for c, v in columns.items() if v is not None}
    clause = " AND ".join(f"{c} = ?" for c in given)
    return (f" WHERE {clause}" if clause else ""), list(given.values())
