"""`specreg plan`: the difference between what specreg.yaml declares, what is on disk and what
was measured. Computing it changes nothing."""

from __future__ import annotations

import fnmatch
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from specreg.declare import deps
from specreg.declare.deps import DiskModel, MeasuredRun
from specreg.declare.spec import PinnedConfig, RoleDecl, Spec, Where
from specreg.declare.stores import scan_roots

# A measured alternative must beat the pinned configuration by this much to count: single runs
# on a busy CPU vary by a few percent.
BEAT_MARGIN = 0.05

KINDS = (
    "model-missing",
    "model-changed",
    "split-incomplete",
    "undeclared-model",
    "draft-incompatible",
    "no-compatible-draft",
    "config-beaten",
)


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str
    message: str
    where: Where | None = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """A configuration seen in measured runs, with the median of its speeds."""

    draft_id: str | None
    spec_types: tuple[str, ...]
    draft_max: int | None
    experts: int | None
    tokens_per_s: float
    acceptance: float | None
    runs: tuple[MeasuredRun, ...]

    @property
    def key(self) -> tuple[object, ...]:
        return (self.draft_id, self.spec_types, self.draft_max, self.experts)


@dataclass(frozen=True)
class Beaten:
    role: RoleDecl
    config: PinnedConfig
    pinned_tokens_per_s: float
    pinned_source: str
    best: Candidate

    @property
    def gain(self) -> float:
        return self.best.tokens_per_s / self.pinned_tokens_per_s - 1.0


@dataclass(frozen=True)
class Plan:
    JSON_KIND = "plan"
    JSON_VERSION = "1"

    spec_path: Path
    findings: tuple[Finding, ...]
    n_declared: int
    n_on_disk: int
    n_roles: int

    @property
    def drift(self) -> bool:
        return bool(self.findings)

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document, plain

        return document(self.JSON_KIND, self.JSON_VERSION, {"drift": self.drift, **plain(self)})


def _under(path: str, roots: Iterable[Path]) -> bool:
    real = os.path.realpath(path)
    return any(real == str(r) or real.startswith(str(r).rstrip("/") + "/") for r in roots)


def _excluded(path: str, patterns: Iterable[str]) -> bool:
    return any(
        fnmatch.fnmatch(path, p) or fnmatch.fnmatch(os.path.basename(path), p) for p in patterns
    )


def make_plan(
    con: duckdb.DuckDBPyConnection, spec: Spec, env: Mapping[str, str] | None = None
) -> Plan:
    """Findings of every kind; `env` locates the declared stores (default: os.environ)."""
    disk = deps.list_models(con)
    by_id = {m.model_id: m for m in disk}
    findings = _declared_findings(con, spec, by_id)
    findings += _undeclared_findings(spec, disk, env)
    for role in spec.roles:
        findings += _role_findings(con, spec, role, by_id, disk)
    for b in beaten_configs(con, spec):
        findings.append(
            Finding(
                "config-beaten",
                f"roles.{b.role.name}.configs.{b.config.task}",
                f"{b.role.name}/{b.config.task}: pinned {b.pinned_tokens_per_s:.2f} tok/s "
                f"({b.pinned_source}) is beaten by {describe(spec, b.best)} at "
                f"{b.best.tokens_per_s:.2f} tok/s (+{b.gain * 100:.1f} %, "
                f"{len(b.best.runs)} run(s)); `specreg propose` writes the change",
                b.config.where,
                tuple(r.run_id for r in b.best.runs),
            )
        )
    return Plan(
        spec.path,
        tuple(findings),
        len(spec.models),
        sum(1 for d in disk if d.status != "gone"),
        len(spec.roles),
    )


def _declared_findings(
    con: duckdb.DuckDBPyConnection, spec: Spec, by_id: Mapping[str, DiskModel]
) -> list[Finding]:
    """Declared models whose split set is incomplete, whose file is now another model, or
    that are not on disk."""
    findings: list[Finding] = []
    for m in spec.models:
        d = by_id.get(m.id)
        if d is not None and d.status == "incomplete":
            findings.append(
                Finding(
                    "split-incomplete",
                    f"models.{m.id}",
                    f"{m.label}: split set incomplete, missing {', '.join(d.parts_missing)}",
                    m.where,
                    tuple(d.parts_missing),
                )
            )
        elif d is None or d.status == "gone":
            now = deps.model_at_path(con, spec.resolve_path(m.path)) if m.path else None
            if now is not None and now.model_id != m.id and now.status != "gone":
                findings.append(
                    Finding(
                        "model-changed",
                        f"models.{m.id}",
                        f"{m.label}: the file at {m.path} is now a different model "
                        f"(fingerprint {now.model_id[:12]}, declared {m.id[:12]})",
                        m.where,
                        (now.model_id,),
                    )
                )
            else:
                seen = f", last seen at {d.path}" if d is not None else ""
                findings.append(
                    Finding(
                        "model-missing",
                        f"models.{m.id}",
                        f"{m.label}: declared model {m.id[:12]} is not on disk{seen}",
                        m.where,
                    )
                )
    return findings


def _undeclared_findings(
    spec: Spec, disk: Sequence[DiskModel], env: Mapping[str, str] | None
) -> list[Finding]:
    """Models on disk under the declared roots (not excluded) that specreg.yaml lacks."""
    declared = {m.id for m in spec.models}
    roots = [Path(os.path.realpath(r.path)) for r in scan_roots(spec, env)]
    findings: list[Finding] = []
    for d in disk:
        if d.status == "gone" or d.model_id in declared:
            continue
        if roots and not _under(d.path, roots):
            continue
        if _excluded(d.path, spec.exclude):
            continue
        findings.append(
            Finding(
                "undeclared-model",
                d.model_id,
                f"{d.name or Path(d.path).name} ({d.model_id[:12]}) at {d.path} is not declared",
                None,
                (d.path,),
            )
        )
    return findings


def _role_findings(
    con: duckdb.DuckDBPyConnection,
    spec: Spec,
    role: RoleDecl,
    by_id: dict[str, DiskModel],
    disk: list[DiskModel],
) -> list[Finding]:
    out: list[Finding] = []
    target = spec.model(role.target)
    t = by_id.get(target.id) if target else None
    if target is None or t is None or t.status == "gone":
        return out  # the model finding already says so
    incompatible = False
    for cfg in role.configs:
        if cfg.draft is None:
            continue
        draft = spec.model(cfg.draft)
        d = by_id.get(draft.id) if draft else None
        if draft is None or d is None or d.status == "gone":
            continue  # the model finding already says so
        verdict = deps.check_pair(con, target.id, draft.id)
        if not verdict.compatible:
            incompatible = True
            out.append(
                Finding(
                    "draft-incompatible",
                    f"{cfg.where.key}.draft",
                    f"{role.name}/{cfg.name}: pinned draft {draft.label} no longer passes with "
                    f"{target.label}: {verdict.verdict}"
                    + (f" ({'; '.join(verdict.reasons[:3])})" if verdict.reasons else ""),
                    cfg.field_where("draft"),
                    verdict.reasons,
                )
            )
    wants_draft = "draft" not in role.forbid and (
        not role.configs or any(c.draft is not None for c in role.configs)
    )
    if wants_draft and (incompatible or not role.configs) and not compatible_drafts(con, t, disk):
        out.append(
            Finding(
                "no-compatible-draft",
                f"roles.{role.name}",
                f"{role.name}: no model on disk is a compatible draft for {target.label}; "
                "consider an n-gram spec_type or an MTP head",
                role.where,
            )
        )
    return out


def compatible_drafts(
    con: duckdb.DuckDBPyConnection, target: DiskModel, disk: list[DiskModel]
) -> list[DiskModel]:
    out = []
    for d in disk:
        if d.model_id == target.model_id or d.status != "present":
            continue
        if target.n_params and d.n_params and d.n_params >= target.n_params:
            continue  # not smaller: no speedup possible
        if deps.check_pair(con, target.model_id, d.model_id).compatible:
            out.append(d)
    return out


def describe(spec: Spec, c: Candidate) -> str:
    parts = [",".join(c.spec_types)]
    if c.draft_id:
        decl = next((m for m in spec.models if m.id == c.draft_id), None)
        parts.append(f"draft {decl.label if decl else c.draft_id[:12]}")
    if c.draft_max is not None:
        parts.append(f"draft_max {c.draft_max}")
    if c.experts is not None:
        parts.append(f"experts {c.experts}")
    return " ".join(parts)


def _matches(cfg: PinnedConfig, spec: Spec, r: MeasuredRun) -> bool:
    draft = spec.model(cfg.draft) if cfg.draft else None
    return (
        (r.draft_id or None) == (draft.id if draft else None)
        and tuple(r.spec_types) == cfg.spec_types
        and r.draft_max == cfg.draft_max
        and r.experts == cfg.experts
    )


def _task_ok(cfg: PinnedConfig, r: MeasuredRun) -> bool:
    return cfg.task == "default" or r.task in (None, cfg.task)


def _candidates(runs: list[MeasuredRun]) -> list[Candidate]:
    groups: dict[tuple[str | None, tuple[str, ...], int | None, int | None], list[MeasuredRun]]
    groups = {}
    for r in runs:
        groups.setdefault((r.draft_id, tuple(r.spec_types), r.draft_max, r.experts), []).append(r)
    out = []
    for (draft_id, types, k, experts), rs in groups.items():
        speeds = [r.tokens_per_s for r in rs if r.tokens_per_s is not None]
        if not speeds:
            continue
        accs = [r.acceptance for r in rs if r.acceptance is not None]
        out.append(
            Candidate(
                draft_id,
                types,
                k,
                experts,
                statistics.median(speeds),
                statistics.median(accs) if accs else None,
                tuple(rs),
            )
        )
    return out


def beaten_configs(con: duckdb.DuckDBPyConnection, spec: Spec) -> list[Beaten]:
    """Pinned configurations that measured runs on the same host and protocol beat."""
    out = []
    for role in spec.roles:
        target = spec.model(role.target)
        if target is None:
            continue
        runs = [r for r in deps.measured_runs(con, target.id) if r.ok]
        if not runs:
            continue
        for cfg in role.configs:
            if cfg.member is not None:
                continue  # a candidate set: `serve --policy adaptive` chooses among it
            mine = [r for r in runs if _matches(cfg, spec, r) and _task_ok(cfg, r)]
            speeds = [r.tokens_per_s for r in mine if r.tokens_per_s is not None]
            if speeds:
                pinned = statistics.median(speeds)
                source = f"median of {len(speeds)} measured run(s)"
                hosts = {r.host for r in mine}
                protocols = {r.protocol for r in mine}
            elif (
                cfg.evidence
                and cfg.evidence.tokens_per_s
                and cfg.evidence.host
                and cfg.evidence.protocol
            ):
                pinned = cfg.evidence.tokens_per_s
                source = f"evidence at {cfg.field_where('evidence')}"
                hosts, protocols = {cfg.evidence.host}, {cfg.evidence.protocol}
            else:
                # a number without its host and protocol (e.g. imported) compares with nothing
                continue
            pool = [
                r
                for r in runs
                if _task_ok(cfg, r)
                and not _matches(cfg, spec, r)
                and (not hosts or r.host in hosts)
                and (not protocols or r.protocol in protocols)
                and (role.policy == "speed" or r.lossless)
                and not any(f in role.forbid for f in _families(r.spec_types))
            ]
            best = max(_candidates(pool), key=lambda c: c.tokens_per_s, default=None)
            if best is not None and best.tokens_per_s > pinned * (1 + BEAT_MARGIN):
                out.append(Beaten(role, cfg, pinned, source, best))
    return out


def _families(types: Iterable[str]) -> list[str]:
    from specreg.declare.spec import FORBID_KIND_OF

    return [f for t in types if (f := FORBID_KIND_OF.get(t))]
