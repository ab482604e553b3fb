"""The JSON schemas in tests/schemas pin every `--json` document: its version and kind, every
field by name and its type (tests/schemas/infer_schema.py drafts one from a document)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from support import TESTS

SCHEMAS = TESTS / "schemas"


def validate(doc: dict[str, Any]) -> None:
    """`doc` starts with its envelope and follows the schema of its kind."""
    assert list(doc)[:2] == ["version", "kind"], "the envelope starts with version, then kind"
    jsonschema.validate(doc, json.loads((SCHEMAS / f"{doc['kind']}.json").read_text()))
