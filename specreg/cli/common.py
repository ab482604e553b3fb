"""Options and output helpers shared by every command."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from specreg.home import default_db_path

# Every --json payload starts with this; renaming or removing a field bumps it.
JSON_SCHEMA_VERSION = "1"

F = TypeVar("F", bound=Callable[..., Any])


def db_option(func: F) -> F:
    return click.option(
        "--db",
        "db_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Registry database (default: $SPECREG_HOME/registry.duckdb).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(func)


def resolve_db(db_path: Path | None) -> Path:
    return db_path if db_path is not None else default_db_path()


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def emit_json(kind: str, payload: dict[str, Any]) -> None:
    """Write one versioned JSON document to stdout."""
    doc = {"version": JSON_SCHEMA_VERSION, "kind": kind, **payload}
    sys.stdout.write(json.dumps(doc, default=_default, indent=2, ensure_ascii=False) + "\n")


def _width() -> int | None:
    # Piped output keeps whole lines (paths, table rows) instead of rich's default 80 columns.
    return None if sys.stdout.isatty() else 200


def console() -> Console:
    # Untrusted strings from GGUF files go through rich; markup is off so `[red]` in a model
    # name prints as text instead of being interpreted.
    return Console(highlight=False, markup=False, width=_width())


def err_console() -> Console:
    return Console(stderr=True, highlight=False, markup=False)
