"""Small column-wise write helpers: DuckDB inserts whole columns far faster than row by row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[dict[str, Any]]) -> None:
    """Insert dict rows (all with the same keys) in one statement, one list parameter a column."""
    if not rows:
        return
    columns = list(rows[0])
    values = [[row[c] for row in rows] for c in columns]
    select = ", ".join(f"unnest(${i + 1}::{_cast(con, table, c)}[])" for i, c in enumerate(columns))
    con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select}", values)


_TYPES: dict[tuple[str, str], str] = {}


def _cast(con: duckdb.DuckDBPyConnection, table: str, column: str) -> str:
    key = (table, column)
    if key not in _TYPES:
        for name, dtype in con.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?",
            [table],
        ).fetchall():
            _TYPES[(table, name)] = dtype
    return _TYPES[key]
