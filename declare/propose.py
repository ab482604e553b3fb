"""`specreg propose` / `specreg apply`: measured runs become a reviewable patch to specreg.yaml.

A proposal is a YAML file a person reads before anything changes: per change, the key it
touches, the old and new values, and the evidence (runs, protocol, host, date). `apply` checks
that the old values are still what specreg.yaml says (else the proposal is stale), edits the
round-trip document in place so comments and order survive, validates the result and writes it
atomically.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from specreg.declare import deps
from specreg.declare.plan import Beaten, beaten_configs, describe, make_plan
from specreg.declare.spec import (
    SpecFileError,
    dump_yaml,
    load_spec,
    read_yaml,
    validate,
    write_yaml,
)
from specreg.declare.templates import model_alias
from specreg.errors import UsageError
from specreg.terms import SPEC_DRAFT_SIMPLE

PROPOSAL_SCHEMA = "specreg.proposal.v1"
CONFIG_FIELDS = ("spec_type", "draft", "draft_max", "experts", "evidence")


class StaleProposal(UsageError):
    """specreg.yaml changed since the proposal was written; propose again."""


@dataclass(frozen=True)
class Change:
    key: str  # dotted: roles.<role>.configs.<task>
    was: dict[str, Any]
    now: dict[str, Any]
    why: str
    add_model: dict[str, Any] | None = None  # a draft not yet declared: id, path, alias


@dataclass(frozen=True)
class Proposal:
    spec_path: Path
    changes: tuple[Change, ...]
    n_undeclared: int = 0  # models on disk specreg.yaml does not declare (adopted with --adopt)

    def to_yaml(self) -> str:
        doc = CommentedMap()
        doc["proposal"] = PROPOSAL_SCHEMA
        doc["spec"] = str(self.spec_path)
        doc["created"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc["must_not_apply_automatically"] = True
        items = CommentedSeq()
        for c in self.changes:
            m = CommentedMap()
            m["key"] = c.key
            m["why"] = c.why
            m["was"] = c.was
            m["now"] = c.now
            if c.add_model:
                m["add_model"] = c.add_model
            items.append(m)
        doc["changes"] = items
        doc.yaml_set_start_comment(
            "Review, then run `specreg apply THIS_FILE`. Nothing changes until you do."
        )
        return dump_yaml(doc)


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _current(doc: CommentedMap, role: str, task: str) -> dict[str, Any]:
    node = doc["roles"][role]["configs"][task]
    return {k: _plain(node[k]) for k in CONFIG_FIELDS if k in node}


def make_proposal(
    con: duckdb.DuckDBPyConnection, spec_path: Path, *, adopt: bool = False
) -> Proposal:
    """Changes to pinned configurations that measured runs beat; with `adopt`, also a
    declaration for each model on disk that specreg.yaml does not declare (what `plan` calls
    undeclared-model), so a registry scanned before the file was written can be taken in."""
    spec, doc = load_spec(spec_path)
    changes = []
    for b in beaten_configs(con, spec):
        changes.append(_change(spec, doc, b))
    undeclared = [f.subject for f in make_plan(con, spec).of_kind("undeclared-model")]
    if adopt:
        taken = {m.id: a for m in spec.models for a in m.aliases}
        for model_id in undeclared:
            changes.append(_adopt(con, model_id, taken))
    return Proposal(spec_path, tuple(changes), len(undeclared))


def _adopt(con: duckdb.DuckDBPyConnection, model_id: str, taken: dict[str, str]) -> Change:
    """Declare an undeclared model: its id, path and an alias of its name and quant."""
    m = deps.model_by_id(con, model_id)
    assert m is not None  # plan found it in the registry
    taken[model_id] = alias = model_alias(m, taken)
    why = f"{m.name or Path(m.path).name} {m.quant or '?'} at {m.path} is on disk, not declared"
    return Change(f"models.{model_id}", {}, {"path": m.path, "aliases": [alias]}, why)


def _change(spec: Any, doc: CommentedMap, b: Beaten) -> Change:
    best = b.best
    now: dict[str, Any] = {}
    add_model = None
    if best.spec_types != (SPEC_DRAFT_SIMPLE,) or not best.draft_id:
        now["spec_type"] = list(best.spec_types)
    if best.draft_id:
        decl = next((m for m in spec.models if m.id == best.draft_id), None)
        if decl is None:
            alias = f"draft-{best.draft_id[:8]}"
            add_model = {"id": best.draft_id, "aliases": [alias]}
            now["draft"] = alias
        else:
            now["draft"] = decl.label
    if best.draft_max is not None:
        now["draft_max"] = best.draft_max
    if best.experts is not None:
        now["experts"] = best.experts
    runs = best.runs
    ev: dict[str, Any] = {"tokens_per_s": round(best.tokens_per_s, 3)}
    if best.acceptance is not None:
        ev["acceptance"] = round(best.acceptance, 4)
    ev["runs"] = [r.run_id for r in runs]
    protocols = sorted({r.protocol for r in runs if r.protocol})
    hosts = sorted({r.host for r in runs if r.host})
    dates = sorted({r.date for r in runs if r.date})
    if protocols:
        ev["protocol"] = ", ".join(protocols)
    if hosts:
        ev["host"] = ", ".join(hosts)
    if dates:
        ev["date"] = dates[-1]
    ev["source"] = "specreg propose"
    now["evidence"] = ev
    why = (
        f"{describe(spec, best)}: median {best.tokens_per_s:.2f} tok/s over {len(runs)} run(s) "
        f"beats the pinned {b.pinned_tokens_per_s:.2f} tok/s ({b.pinned_source}) by "
        f"{b.gain * 100:.1f} %"
    )
    return Change(
        f"roles.{b.role.name}.configs.{b.config.task}",
        _current(doc, b.role.name, b.config.task),
        now,
        why,
        add_model,
    )


@dataclass(frozen=True)
class Applied:
    spec_path: Path
    keys: tuple[str, ...]
    sha256_before: str
    sha256_after: str


def apply_proposal(proposal_path: Path, spec_path: Path | None = None) -> Applied:
    prop = read_yaml(proposal_path)
    if prop.get("proposal") != PROPOSAL_SCHEMA:
        raise SpecFileError(
            str(proposal_path),
            1,
            "proposal",
            f"expected {PROPOSAL_SCHEMA}, got {prop.get('proposal')!r}",
        )
    target = spec_path or Path(str(prop.get("spec", "")))
    before = target.read_bytes() if target.exists() else b""
    spec, doc = load_spec(target)
    keys = []
    for i, ch in enumerate(prop.get("changes") or []):
        key = str(ch["key"])
        parts = key.split(".")
        if len(parts) == 2 and parts[0] == "models":
            _declare(doc, parts[1], _plain(ch.get("now") or {}), target)
            keys.append(key)
            continue
        if len(parts) != 4 or parts[0] != "roles" or parts[2] != "configs":
            raise SpecFileError(
                str(proposal_path),
                None,
                f"changes[{i}].key",
                f"expected roles.<role>.configs.<task> or models.<id>, got {key!r}",
            )
        _, role, _, task = parts
        try:
            node = doc["roles"][role]["configs"][task]
        except (KeyError, TypeError) as err:
            raise StaleProposal(f"{key} no longer exists in {target}: propose again") from err
        was = _plain(ch.get("was") or {})
        if _current(doc, role, task) != was:
            raise StaleProposal(
                f"{key} changed in {target} since the proposal was written "
                f"(proposal expected {was}, file has {_current(doc, role, task)}): propose again"
            )
        if ch.get("add_model"):
            am = ch["add_model"]
            models = doc.setdefault("models", CommentedMap())
            if am["id"] not in models:
                entry = CommentedMap()
                entry["aliases"] = CommentedSeq(am.get("aliases") or [])
                models[am["id"]] = entry
        now = dict(ch.get("now") or {})
        if "evidence" not in now and "evidence" in node:
            now["evidence"] = _plain(node["evidence"])
        # keys the measured config does not have (e.g. all experts) go; others keep their place
        new_cfg = {k: now[k] for k in CONFIG_FIELDS if k in now}
        new_cfg.update({k: _plain(node[k]) for k in node if k not in CONFIG_FIELDS})  # note
        _update_map(node, new_cfg)
        keys.append(key)
    validate(doc, target)  # never write a file that would not load
    write_yaml(target, doc)
    after = target.read_bytes()
    return Applied(
        target, tuple(keys), hashlib.sha256(before).hexdigest(), hashlib.sha256(after).hexdigest()
    )


def _declare(doc: CommentedMap, model_id: str, now: dict[str, Any], target: Path) -> None:
    """Add the declaration of an adopted model; one declared since is a stale proposal."""
    models = doc.get("models")
    if not isinstance(models, CommentedMap):
        models = doc["models"] = CommentedMap()
    if model_id in models:
        raise StaleProposal(f"models.{model_id} is declared in {target} already: propose again")
    entry = CommentedMap()
    if now.get("path"):
        entry["path"] = str(now["path"])
    entry["aliases"] = CommentedSeq(now.get("aliases") or [])
    models[model_id] = entry


def _update_map(cur: CommentedMap, value: dict[str, Any]) -> None:
    """Make `cur` hold `value` in `value`'s order, editing in place so comments stay.

    ruamel keeps a comment that follows a mapping (e.g. the next section's heading) on the
    mapping's last key; it is moved to whichever key ends up last.
    """
    keys = list(cur)
    trailing = cur.ca.items.pop(keys[-1], None) if keys else None
    for k in keys:
        if k not in value:
            del cur[k]
    prev = -1
    for k, v in value.items():
        if k in cur:
            if isinstance(v, dict) and isinstance(cur[k], CommentedMap):
                _update_map(cur[k], v)
            else:
                cur[k] = v
            prev = list(cur).index(k)
        else:
            prev += 1
            cur.insert(prev, k, v)
    if trailing is not None and len(cur):
        cur.ca.items[list(cur)[-1]] = trailing
