"""Draft a schema for tests/schemas from one `--json` document: python infer_schema.py DOC.json

Every field required, no unknown fields, scalar types (null allowed: a value may be unknown),
nested results nullable; maps whose keys are data (counts, check values, GGUF values) stay
open. Review the draft: it pins what one sample showed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# Fields whose keys are data (verdicts, node attributes, GGUF values): typed as objects only.
OPEN = {
    "values",
    "counts",
    "refusals",
    "config",
    "host",
    "divergence",
    "value",
    "graph",
    "data",
    "params",
    "tensor_types",
    "features",
    "fit",
    "extra",
    "evidence_by",
    "calibration",
    "facts",
    "verify_ratio",
}
SCALAR = {str: "string", bool: "boolean", int: "integer", float: "number"}


def infer(samples: Any, depth: int, key: str | None = None) -> dict[str, Any]:
    samples = list(samples)
    if key in ("value", "divergence"):
        return {}  # any JSON value: a GGUF value, a divergence record
    present = [s for s in samples if s is not None]
    if not present:
        return {}  # only nulls seen: any value
    types = set()
    if all(isinstance(s, dict) for s in present):
        if key in OPEN or depth > 4:
            return {"type": ["object", "null"]}
        keys = {}
        for s in present:
            for k in s:
                keys.setdefault(k, [])
        for s in present:
            for k in keys:
                keys[k].append(s.get(k))
        required = [k for k in keys if all(k in s for s in present)]
        out = {
            "type": "object",
            "required": required,
            "additionalProperties": False,
            "properties": {k: infer(v, depth + 1, k) for k, v in keys.items()},
        }
        if depth > 0:  # a nested result may be absent (Where | None, MeasuredAgreement | None)
            out["type"] = ["object", "null"]
        return out
    if all(isinstance(s, list) for s in present):
        items = [x for s in present for x in s]
        out = {"type": "array"}
        if items:
            out["items"] = infer(items, depth + 1, key)
        if len(present) < len(samples):
            out["type"] = ["array", "null"]
        return out
    for s in present:
        t = SCALAR.get(type(s))
        if t is None:
            return {}  # mixed containers and scalars: any value
        types.add(t)
    if "integer" in types and "number" in types:
        types.discard("integer")
    types.add("null")  # a scalar may be unknown
    if types == {"integer", "null"}:
        types = {"number", "null"}  # JSON does not tell 3 from 3.0 reliably across runs
    return {"type": sorted(types)}


def main() -> None:
    with open(sys.argv[1]) as fh:
        doc = json.load(fh)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"specreg {doc['kind']} --json, version {doc['version']}",
    }
    body = infer([doc], 0)
    body["properties"]["version"] = {"const": doc["version"]}
    body["properties"]["kind"] = {"const": doc["kind"]}
    schema.update(body)
    print(json.dumps(schema, indent=2))


if __name__ == "__main__":
    main()
