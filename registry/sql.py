"""SQL helpers every store shares, on a connection already open: transactions and filters.

Kept apart from `db` (which opens, creates and migrates the registry) so the stores whose
migrations `db` runs can use them without importing `db`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import duckdb
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


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


class Rows(Generic[R]):
    """A record dataclass stored one row a record in `table`: its fields are the columns, in
    their order, bar `skip` (what another table holds). `instant`, a TIMESTAMPTZ column, is
    read as epoch seconds (DuckDB returns pytz-aware datetimes otherwise, and pytz is not a
    dependency) and comes back as a UTC datetime; `arrays`, tuple fields, are written as lists
    and come back as tuples (NULL as empty). Table and column names are code, never input."""

    def __init__(
        self,
        table: str,
        record: type[R],
        *,
        instant: str | None = None,
        arrays: Iterable[str] = (),
        skip: Iterable[str] = (),
    ) -> None:
        self.table = table
        self.record = record
        self.instant = instant
        self.arrays = tuple(arrays)
        self.columns = [f.name for f in fields(record) if f.name not in skip]
        self.select = ", ".join(f"epoch({c})" if c == instant else c for c in self.columns)

    def values(self, rec: R) -> dict[str, Any]:
        """`rec`'s columns by name, its arrays as lists."""
        return {
            c: list(v) if c in self.arrays else v for c in self.columns for v in [getattr(rec, c)]
        }

    def insert(
        self,
        con: duckdb.DuckDBPyConnection,
        values: dict[str, Any],
        *,
        returning: str | None = None,
    ) -> Any:
        """Insert one row of `values` (column -> value); with `returning`, a column the table
        generates, that column is left to the table and its new value returned."""
        cols = [c for c in values if c != returning]
        sql = (
            f"INSERT INTO {self.table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
        )
        if returning is None:
            con.execute(sql, [values[c] for c in cols])
            return None
        row = con.execute(f"{sql} RETURNING {returning}", [values[c] for c in cols]).fetchone()
        assert row is not None
        return row[0]

    def decode(self, row: Sequence[Any]) -> dict[str, Any]:
        """A row read with `select`, as the record's fields by name."""
        data = dict(zip(self.columns, row, strict=True))
        if self.instant is not None:
            data[self.instant] = datetime.fromtimestamp(data[self.instant], timezone.utc)
        for c in self.arrays:
            data[c] = tuple(data[c] or ())
        return data

    def read(self, row: Sequence[Any]) -> R:
        return self.record(**self.decode(row))
