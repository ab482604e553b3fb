"""Versioned machine output: every result type owns its `--json` document.

A result is a frozen dataclass with `JSON_KIND`, `JSON_VERSION` and `to_json()`, which returns
`document(kind, version, ...)`: a dict that starts with `"version"` and `"kind"`. Renaming or
removing a field bumps that result's version; tests pin each document with a JSON schema.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any, ClassVar, Protocol


class JsonResult(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def document(kind: str, version: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The envelope every `--json` output shares: version first, then kind, then the fields."""
    return {"version": version, "kind": kind, **{k: plain(v) for k, v in payload.items()}}


def fields_of(obj: Any, **more: Any) -> dict[str, Any]:
    """A dataclass's fields by name, in their order, then `more` (properties, derived values);
    the values as they are (`document` and `plain` turn them into JSON types)."""
    return {**{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, **more}


class FieldsDocument:
    """A result dataclass whose `--json` document is its fields, in their order."""

    JSON_KIND: ClassVar[str]
    JSON_VERSION: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return document(self.JSON_KIND, self.JSON_VERSION, fields_of(self))


def plain(obj: Any) -> Any:
    """`obj` as JSON types: dataclasses as dicts, enums as values, paths and times as text."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return plain(obj.value)
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN or infinity: an unknown number is null
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "backslashreplace")
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    return obj


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
