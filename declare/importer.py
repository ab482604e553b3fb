"""`specreg import`: an orchestrator-style model_registry.yaml into specreg.yaml.

The source format keeps a model, its role, its launch settings and its measurements in one
role-keyed record (`roles.<id>.model/acceleration/performance`). The import splits them: models
keyed by fingerprint (the file is scanned), roles binding them, one pinned configuration per role,
K spelled `draft_max` and acceptance a fraction. Everything it cannot map is reported with the
reason; nothing is dropped silently.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from specreg.declare import deps, units
from specreg.declare.deps import DiskModel
from specreg.declare.spec import SPEC_VERSION, key_line, read_yaml, validate, write_yaml
from specreg.errors import UsageError, param
from specreg.stacks import NGRAM_CACHE
from specreg.terms import POLICY_QUALITY, POLICY_SPEED, SPEC_DRAFT_SIMPLE

# acceleration.type -> spec types; None means "no speculation"
ACCEL_TYPES: dict[str, tuple[str, ...] | None] = {
    "speculative_decoding": (SPEC_DRAFT_SIMPLE,),
    "moe_expert_reduction": None,  # experts only; a nested speculative_decoding adds a draft
    "prompt_lookup": (NGRAM_CACHE,),
    "none": None,
    "baseline": None,
}
FORBID_MAP = {
    "speculative_decoding": "draft",
    "prompt_lookup": "ngram",
    "lookup": "ngram",
    "eagle": "eagle3",
    "eagle3": "eagle3",
    "mtp": "mtp",
    "dflash": "dflash",
}
ROLE_REASONS = {
    "tier": "tiers are a routing concern of the orchestrator",
    "candidate_roles": "routing: which roles a model may serve is the orchestrator's business",
    "memory": "residency (hot/warm, mlock) is a serving detail outside specreg.yaml v1",
    "generation_defaults": "sampling defaults are not part of a pinned speculative configuration",
    "temperature_overrides": "per-suite temperatures are benchmark settings, not a launch config",
    "thinking_quirks": "chat-template quirks belong to the runner's quirk table",
    "system_prompt_suffix": "prompting is outside specreg.yaml",
    "paged_attention": "no llama-server flag specreg v1 renders",
    "notes": "free text; kept in the source file",
    "benchmark_date": "used as evidence.date when there is evidence to date",
    "compatible_targets": "compatibility is decided from GGUF metadata by the auditor, not by "
    "name substrings; `specreg plan` checks every pinned draft",
}
SECTION_REASONS = {
    "worker_pool": "worker processes are the orchestrator's layout",
    "process_layout": "residency layout is the orchestrator's business",
    "escalation_chains": "routing policy, not a model/role binding",
    "routing_hints": "routing policy, not a model/role binding",
    "command_templates": "specreg renders argv itself (`specreg export`); templates with "
    "placeholders are how flags got rewritten after the fact",
    "runtime_quirks": "quirks belong to the runner's quirk table",
    "deprecated_models": "history of deleted files; specreg keeps gone models in the registry",
    "observations": "free-form notes",
}
_SLUG = re.compile(r"[^A-Za-z0-9_.+-]+")


@dataclass(frozen=True)
class Entry:
    key: str  # dotted path in the source file
    line: int | None
    note: str  # what it became, or why it could not be mapped


@dataclass(frozen=True)
class ImportResult:
    JSON_KIND = "import"
    JSON_VERSION = "1"

    source: Path
    doc: CommentedMap
    mapped: tuple[Entry, ...]
    unmapped: tuple[Entry, ...]
    n_models: int
    n_roles: int
    spec_path: Path | None = None  # where the declaration was written, once written

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {
            "source": self.source,
            "spec": self.spec_path,
            "models": self.n_models,
            "roles": self.n_roles,
            "mapped": self.mapped,
            "unmapped": self.unmapped,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


def import_to_spec(
    con: duckdb.DuckDBPyConnection,
    source: Path,
    spec_path: Path,
    *,
    base_path: Path | None = None,
    force: bool = False,
) -> ImportResult:
    """`import_registry`, written to `spec_path` (an existing file only with `force`)."""
    if spec_path.exists() and not force:
        raise UsageError(
            f"{spec_path} exists: pass {param('force')} to replace it, or "
            f"{param('spec', 'NEW.yaml')}"
        )
    result = import_registry(con, source, spec_path, base_path=base_path)
    write_yaml(spec_path, result.doc)
    return replace(result, spec_path=spec_path)


class _Ctx:
    def __init__(self, source: Path) -> None:
        self.source = source
        self.mapped: list[Entry] = []
        self.unmapped: list[Entry] = []

    def ok(self, parent: Any, key: Any, dotted: str, note: str) -> None:
        self.mapped.append(Entry(dotted, key_line(parent, key), note))

    def bad(self, parent: Any, key: Any, dotted: str, reason: str) -> None:
        self.unmapped.append(Entry(dotted, key_line(parent, key), reason))


def import_registry(
    con: duckdb.DuckDBPyConnection, source: Path, out_path: Path, *, base_path: Path | None = None
) -> ImportResult:
    src = read_yaml(source)
    cx = _Ctx(source)
    rd = src.get("runtime_defaults") or CommentedMap()
    base = _base_root(cx, rd, base_path)
    llama = _llama_section(cx, rd)
    roles_src = src.get("roles") or CommentedMap()
    # 1. resolve every model path, scan what exists, identify each file by fingerprint
    paths = _model_paths(roles_src, base)
    existing = sorted({os.path.dirname(p) for p in paths.values() if p.exists()})
    if existing:
        deps.scan(con, [Path(d) for d in existing])
    models, role_model = _models(con, cx, roles_src, paths)
    # 2. roles (drafts, tier D, are models only)
    roles = _roles(cx, roles_src, role_model)
    # 3. sections that restate role facts: report agreement and, loudly, disagreement
    _cross_check(cx, src, roles)
    for sec in src:
        if sec in ("runtime_defaults", "roles", "server_mode", "optimized_params"):
            continue
        cx.bad(src, sec, str(sec), SECTION_REASONS.get(str(sec), "not part of specreg.yaml v1"))

    doc = CommentedMap()
    doc["version"] = SPEC_VERSION
    if llama:
        doc["llama"] = llama
    roots = [str(base)] + sorted(
        {str(p.parent) for p in paths.values() if p.exists() and not _is_under(p, base)}
    )
    doc["roots"] = CommentedSeq(roots)
    doc["models"] = models
    doc["roles"] = roles
    when = dt.date.today().isoformat()
    doc.yaml_set_start_comment(
        f"specreg.yaml imported from {source} on {when}.\n"
        f"{len(cx.unmapped)} source entries were not mapped; `specreg import` listed each with "
        "its reason."
    )
    validate(doc, out_path)
    return ImportResult(source, doc, tuple(cx.mapped), tuple(cx.unmapped), len(models), len(roles))


def _base_root(cx: _Ctx, rd: CommentedMap, base_path: Path | None) -> Path:
    """The folder relative model paths start from: `base_path`, else the source's
    model_base_path, else the source's folder."""
    base = base_path
    if base is None and rd.get("model_base_path"):
        base = Path(str(rd["model_base_path"])).expanduser()
        if not base.is_absolute():
            base = cx.source.parent / base
        cx.ok(rd, "model_base_path", "runtime_defaults.model_base_path", "roots[0]")
    return (base or cx.source.parent).resolve()


def _llama_section(cx: _Ctx, rd: CommentedMap) -> CommentedMap:
    """specreg.yaml's `llama` from the source's runtime_defaults; the rest reported unmapped."""
    llama = CommentedMap()
    binaries = rd.get("binaries") or {}
    if binaries.get("base_dir"):
        bdir = Path(str(binaries["base_dir"])).expanduser()
        llama["bin_dir"] = str(bdir if bdir.is_absolute() else (cx.source.parent / bdir).resolve())
        cx.ok(binaries, "base_dir", "runtime_defaults.binaries.base_dir", "llama.bin_dir")
    if isinstance(rd.get("threads"), int):
        llama["threads"] = rd["threads"]
        cx.ok(rd, "threads", "runtime_defaults.threads", "llama.threads")
    if rd.get("numa_policy"):
        llama["numa"] = str(rd["numa_policy"])
        cx.ok(rd, "numa_policy", "runtime_defaults.numa_policy", "llama.numa (numactl prefix)")
    for k in rd:
        if k in ("model_base_path", "threads", "numa_policy"):
            continue
        if k == "binaries":
            for b in binaries:
                if b != "base_dir":
                    cx.bad(
                        binaries,
                        b,
                        f"runtime_defaults.binaries.{b}",
                        "specreg finds each llama.cpp tool in llama.bin_dir by its own name",
                    )
            continue
        reason = {
            "quantization": "a default quant is a guess; specreg reads each model's quant from "
            "its GGUF header",
            "draft_quantization": "a default quant is a guess; read from each GGUF instead",
        }.get(str(k), "server and timeout defaults are not part of specreg.yaml v1")
        cx.bad(rd, k, f"runtime_defaults.{k}", reason)
    return llama


def _model_paths(roles_src: CommentedMap, base: Path) -> dict[str, Path]:
    """Each role's model file (relative paths under `base`), by role id."""
    paths: dict[str, Path] = {}
    for rid in roles_src:
        role = roles_src[rid]
        model = role.get("model") if isinstance(role, dict) else None
        if not isinstance(model, dict) or not model.get("path"):
            continue
        p = Path(str(model["path"])).expanduser()
        paths[str(rid)] = p if p.is_absolute() else base / p
    return paths


def _models(
    con: duckdb.DuckDBPyConnection, cx: _Ctx, roles_src: CommentedMap, paths: dict[str, Path]
) -> tuple[CommentedMap, dict[str, str]]:
    """specreg.yaml's `models` (keyed by fingerprint, one alias each) and the alias of each
    importable role's model, by role id; roles whose model is not on disk are reported."""
    models = CommentedMap()
    role_model: dict[str, str] = {}  # role id -> alias of its model
    alias_of: dict[str, str] = {}  # model_id -> alias
    for rid in roles_src:
        role = roles_src[rid]
        dotted = f"roles.{rid}"
        disk = _role_model_on_disk(con, cx, roles_src, rid, paths)
        if disk is None:
            continue
        model, p = role["model"], paths[str(rid)]
        _check_facts(cx, model, dotted, disk)
        if disk.model_id not in alias_of:
            alias = _alias(str(model.get("name") or p.stem), disk.model_id, alias_of)
            alias_of[disk.model_id] = alias
            entry = CommentedMap()
            entry["path"] = str(p)
            entry["aliases"] = CommentedSeq([alias])
            models[disk.model_id] = entry
            models.yaml_add_eol_comment(
                f"from {cx.source.name}:{key_line(roles_src, rid)} ({rid})", disk.model_id
            )
        role_model[str(rid)] = alias_of[disk.model_id]
        if "name" in model:
            cx.ok(model, "name", f"{dotted}.model.name", f"alias {alias_of[disk.model_id]}")
        cx.ok(model, "path", f"{dotted}.model.path", f"models.{disk.model_id}")
    return models, role_model


def _role_model_on_disk(
    con: duckdb.DuckDBPyConnection,
    cx: _Ctx,
    roles_src: CommentedMap,
    rid: Any,
    paths: dict[str, Path],
) -> DiskModel | None:
    """The scanned model file of role `rid`; None, reported, when the role has none to import."""
    role = roles_src[rid]
    dotted = f"roles.{rid}"
    if not isinstance(role, dict):
        cx.bad(roles_src, rid, dotted, "expected a mapping")
        return None
    if role.get("deprecated"):
        cx.bad(roles_src, rid, dotted, "deprecated role: not imported")
        return None
    model = role.get("model")
    if not isinstance(model, dict) or not model.get("path"):
        cx.bad(roles_src, rid, f"{dotted}.model", "no model.path: nothing to identify")
        return None
    p = paths[str(rid)]
    if not p.exists():
        cx.bad(model, "path", f"{dotted}.model.path", f"no file at {p}: the model is not on disk")
        cx.bad(roles_src, rid, dotted, "role not imported: its model is not on disk")
        return None
    disk = deps.model_at_path(con, p)
    if disk is None:
        cx.bad(
            model,
            "path",
            f"{dotted}.model.path",
            f"{p} is not a readable GGUF (see `specreg scan {p.parent}`)",
        )
        cx.bad(roles_src, rid, dotted, "role not imported: its model could not be read")
    return disk


def _roles(cx: _Ctx, roles_src: CommentedMap, role_model: dict[str, str]) -> CommentedMap:
    """specreg.yaml's `roles`: a binding and a pinned configuration per imported role."""
    roles = CommentedMap()
    for rid in roles_src:
        rid_s = str(rid)
        role = roles_src[rid]
        if rid_s not in role_model:
            continue
        dotted = f"roles.{rid}"
        is_draft = str(role.get("tier", "")).upper() == "D"
        out = _role(cx, role, dotted, role_model, is_draft)
        if out is not None:
            roles[rid_s] = out
            roles.yaml_set_comment_before_after_key(
                rid_s, before=f"from {cx.source.name}:{key_line(roles_src, rid)}", indent=2
            )
    return roles


def _is_under(p: Path, base: Path) -> bool:
    try:
        p.resolve().relative_to(base)
        return True
    except ValueError:
        return False


def _alias(name: str, model_id: str, taken: dict[str, str]) -> str:
    slug = _SLUG.sub("-", name).strip("-._+")[:100] or "model"
    if not slug[0].isalnum():
        slug = f"m{slug}"
    if slug in taken.values():
        slug = f"{slug}-{model_id[:6]}"
    return slug


def _check_facts(cx: _Ctx, model: Any, dotted: str, disk: DiskModel) -> None:
    for k in model:
        kd = f"{dotted}.model.{k}"
        if k in ("path", "name"):
            continue
        if k == "quant":
            label = str(model[k])
            if disk.quant and label.upper() != str(disk.quant).upper():
                cx.bad(
                    model,
                    k,
                    kd,
                    f"label {label} disagrees with the GGUF header ({disk.quant}); "
                    "specreg uses the header",
                )
            else:
                cx.ok(model, k, kd, "read from the GGUF header")
        elif k == "split_count":
            n = len(disk.paths) + len(disk.parts_missing)
            if model[k] != n:
                cx.bad(model, k, kd, f"declares {model[k]} parts, the GGUF split.count says {n}")
            elif disk.parts_missing:
                cx.bad(
                    model,
                    k,
                    kd,
                    f"split set incomplete on disk: missing {', '.join(disk.parts_missing)}",
                )
            else:
                cx.ok(model, k, kd, "read from the GGUF header")
        elif k in ("size_gb", "architecture", "max_context", "vocab_size", "baseline_experts"):
            cx.ok(model, k, kd, "read from the GGUF header")
        else:
            cx.bad(model, k, kd, "not a model fact specreg stores")


def _k(cx: _Ctx, node: Any, dotted: str) -> int | None:
    found = {k: node[k] for k in units.K_KEYS if k in node}
    if not found:
        return None
    vals = {}
    for k, v in found.items():
        try:
            vals[k] = units.draft_max(v)
            cx.ok(node, k, f"{dotted}.{k}", "draft_max")
        except units.UnitError as err:
            cx.bad(node, k, f"{dotted}.{k}", str(err))
    if len(set(vals.values())) > 1:
        spelled = ", ".join(f"{k}={v}" for k, v in vals.items())
        cx.bad(
            node,
            next(iter(found)),
            dotted,
            f"K given twice with different values ({spelled}); not imported",
        )
        return None
    return next(iter(vals.values()), None)


def _role(
    cx: _Ctx, role: Any, dotted: str, role_model: dict[str, str], is_draft: bool
) -> CommentedMap | None:
    """One source role as a specreg.yaml role (None for a draft: it is only a model)."""
    _report_role_keys(cx, role, dotted, is_draft)
    if is_draft:
        _draft_role(cx, role, dotted)
        return None
    out = CommentedMap()
    out["target"] = role_model[str(dotted.split(".", 1)[1])]
    forbid = _constraints(cx, role, dotted, out)
    found = _Accel()
    acc = role.get("acceleration")
    if isinstance(acc, dict):
        _acceleration(cx, acc, f"{dotted}.acceleration", role_model, found)
    cfg = _pinned_config(found)
    banned = [t for t in found.spec_types if _family(t) in forbid]
    if banned:
        cx.bad(
            role, "acceleration", f"{dotted}.acceleration",
            f"{banned[0]} conflicts with constraints.forbid ({', '.join(forbid)}): "
            "the two sections disagree; configuration not imported",
        )  # fmt: skip
        cfg = CommentedMap()
    out["policy"] = found.policy
    if forbid:
        out["forbid"] = CommentedSeq(forbid)
    _attach_evidence(cx, role, dotted, cfg)
    if cfg:
        configs = CommentedMap()
        configs["default"] = cfg
        out["configs"] = configs
    return out


@dataclass
class _Accel:
    """What a role's acceleration block pins, gathered step by step."""

    spec_types: list[str] = field(default_factory=list)
    policy: str = POLICY_QUALITY
    cfg: CommentedMap = field(default_factory=CommentedMap)


def _report_role_keys(cx: _Ctx, role: Any, dotted: str, is_draft: bool) -> None:
    """The role's keys specreg.yaml has no place for, each with the reason."""
    for k in role:
        if k in ("model", "acceleration", "performance", "constraints", "deprecated"):
            continue
        if k == "benchmark_date" and isinstance(role.get("performance"), dict):
            continue  # becomes evidence.date (or is reported with the performance block)
        if k == "compatible_targets" and not is_draft:
            cx.bad(role, k, f"{dotted}.{k}", "compatible_targets on a non-draft role")
            continue
        cx.bad(role, k, f"{dotted}.{k}", ROLE_REASONS.get(str(k), "not part of specreg.yaml v1"))


def _draft_role(cx: _Ctx, role: Any, dotted: str) -> None:
    for k in ("acceleration", "performance", "constraints"):
        if k in role:
            cx.bad(
                role, k, f"{dotted}.{k}", "a draft (tier D) role has no configuration of its own"
            )
    cx.ok(role, "model", dotted, "a draft: declared under models, used via draft:")


def _constraints(cx: _Ctx, role: Any, dotted: str, out: CommentedMap) -> list[str]:
    """`constraints:` as forbid: (returned) and its reason as the role's note."""
    forbid: list[str] = []
    cons = role.get("constraints")
    if not isinstance(cons, dict):
        return forbid
    for i, f in enumerate(cons.get("forbid") or []):
        fam = FORBID_MAP.get(str(f))
        if fam is None:
            cx.bad(
                cons["forbid"], i, f"{dotted}.constraints.forbid[{i}]",
                f"{f!r} is not a speculation family specreg knows",
            )  # fmt: skip
        elif fam not in forbid:
            forbid.append(fam)
    if forbid:
        cx.ok(cons, "forbid", f"{dotted}.constraints.forbid", f"forbid: {', '.join(forbid)}")
    for k in cons:
        if k not in ("forbid", "reason"):
            cx.bad(cons, k, f"{dotted}.constraints.{k}", "not part of specreg.yaml v1")
    if cons.get("reason"):
        out["note"] = str(cons["reason"])
        cx.ok(cons, "reason", f"{dotted}.constraints.reason", "note")
    return forbid


def _acceleration(cx: _Ctx, acc: Any, adot: str, role_model: dict[str, str], found: _Accel) -> None:
    """`acceleration:`: its type, a draft (its own block or a nested one), experts, lookup."""
    atype = str(acc.get("type", "none"))
    if atype not in ACCEL_TYPES:
        cx.bad(
            acc, "type", f"{adot}.type",
            f"{atype}: no llama-server equivalent specreg v1 renders; role imported without it",
        )  # fmt: skip
        for k in acc:
            if k != "type":
                cx.bad(acc, k, f"{adot}.{k}", f"part of the {atype} block, not imported")
        return
    found.spec_types += list(ACCEL_TYPES[atype] or ())
    if atype != "prompt_lookup" and "type" in acc:
        cx.ok(acc, "type", f"{adot}.type", f"configs.default ({atype})")
    draft_node: Any = acc if atype == "speculative_decoding" else None
    draft_dot = adot if atype == "speculative_decoding" else ""
    if atype == "prompt_lookup":
        cx.ok(acc, "type", f"{adot}.type", "spec_type ngram-cache (llama-lookup's prompt lookup)")
    nested = acc.get("speculative_decoding")
    if isinstance(nested, dict):
        draft_node, draft_dot = nested, f"{adot}.speculative_decoding"
        found.spec_types.append(SPEC_DRAFT_SIMPLE)
        if "type" in nested:
            cx.ok(nested, "type", f"{draft_dot}.type", "configs.default.spec_type draft-simple")
    if atype == "moe_expert_reduction" or "experts" in acc:
        _experts(cx, acc, adot, found.cfg)
        found.policy = POLICY_SPEED
    for k in acc:
        if k not in ACCEL_KEYS:
            cx.bad(acc, k, f"{adot}.{k}", "not a setting specreg v1 pins")
    if draft_node is not None:
        _draft_settings(cx, draft_node, draft_dot, acc, role_model, found)
    if draft_node is not acc:
        _outside_draft(cx, acc, adot, draft_node, found)


# The keys of an acceleration block that are read (the others are reported).
ACCEL_KEYS = (
    "type", "draft_role", "experts", "override_key", "speculative_decoding", "lookup",
    *units.K_KEYS,
)  # fmt: skip


def _draft_settings(
    cx: _Ctx, node: Any, ddot: str, acc: Any, role_model: dict[str, str], found: _Accel
) -> None:
    """A speculative_decoding block: its draft role as draft:, its K, a lookup beside it."""
    dr = node.get("draft_role")
    if dr is None and SPEC_DRAFT_SIMPLE in found.spec_types:
        cx.bad(node, "type", ddot, "speculative_decoding without draft_role")
        found.spec_types.remove(SPEC_DRAFT_SIMPLE)
    elif dr is not None:
        if str(dr) in role_model:
            found.cfg["draft"] = role_model[str(dr)]
            cx.ok(node, "draft_role", f"{ddot}.draft_role", f"draft: {found.cfg['draft']}")
        else:
            cx.bad(
                node, "draft_role", f"{ddot}.draft_role",
                f"draft role {dr} has no model on disk; the draft config was not imported",
            )  # fmt: skip
            found.spec_types = [t for t in found.spec_types if t != SPEC_DRAFT_SIMPLE]
    k = _k(cx, node, ddot)
    if k is not None and "draft" in found.cfg:
        found.cfg["draft_max"] = k
    if node.get("lookup"):
        found.spec_types.append(NGRAM_CACHE)
        found.policy = POLICY_SPEED
        cx.ok(node, "lookup", f"{ddot}.lookup", "spec_type ngram-cache next to the draft")
    if node is not acc:
        for k2 in node:
            if k2 not in ("type", "draft_role", "lookup", *units.K_KEYS):
                cx.bad(node, k2, f"{ddot}.{k2}", "not a setting specreg v1 pins")


def _outside_draft(cx: _Ctx, acc: Any, adot: str, draft_node: Any, found: _Accel) -> None:
    """An acceleration block's own K (not imported) and lookup, beside a nested draft or
    without one."""
    for kk in (k for k in units.K_KEYS if k in acc):
        where = "outside its speculative_decoding block" if draft_node else "without a draft"
        cx.bad(acc, kk, f"{adot}.{kk}", f"K {where}: not imported")
    if acc.get("lookup") and draft_node is None:
        found.spec_types.append(NGRAM_CACHE)
        cx.ok(acc, "lookup", f"{adot}.lookup", "spec_type ngram-cache")
    elif "lookup" in acc and not acc.get("lookup"):
        cx.ok(acc, "lookup", f"{adot}.lookup", "no n-gram type")


def _pinned_config(found: _Accel) -> CommentedMap:
    """The pinned configuration in specreg.yaml's key order; a lone draft-simple is implied by
    draft: and not written."""
    cfg = found.cfg
    if found.spec_types and found.spec_types != [SPEC_DRAFT_SIMPLE]:
        cfg["spec_type"] = CommentedSeq(list(dict.fromkeys(found.spec_types)))
    order = ("spec_type", "draft", "draft_max", "experts")
    return CommentedMap(
        (k, cfg[k]) for k in (*order, *(k for k in cfg if k not in order)) if k in cfg
    )


def _attach_evidence(cx: _Ctx, role: Any, dotted: str, cfg: CommentedMap) -> None:
    """`performance:` as the pinned configuration's evidence (reported when there is none)."""
    perf = role.get("performance")
    if not isinstance(perf, dict):
        return
    ev = _evidence(cx, perf, f"{dotted}.performance", role)
    if ev and cfg:
        cfg["evidence"] = ev
    elif ev:
        cx.bad(
            role, "performance", f"{dotted}.performance",
            "measurements without a pinned configuration to attach them to",
        )  # fmt: skip


def _family(t: str) -> str | None:
    from specreg.declare.spec import FORBID_KIND_OF

    return FORBID_KIND_OF.get(t)


def _experts(cx: _Ctx, acc: Any, adot: str, cfg: CommentedMap) -> None:
    n = acc.get("experts")
    if isinstance(n, int) and not isinstance(n, bool) and n > 0:
        cfg["experts"] = n
        cx.ok(acc, "experts", f"{adot}.experts", "experts")
    else:
        cx.bad(acc, "experts", f"{adot}.experts", f"{n!r} is not a number of experts")
    if "override_key" in acc:
        cx.ok(
            acc,
            "override_key",
            f"{adot}.override_key",
            "dropped: `specreg export` reads the key from the GGUF (expert_used_count)",
        )


def _evidence(cx: _Ctx, perf: Any, pdot: str, role: Any) -> CommentedMap | None:
    ev = CommentedMap()
    for k in perf:
        kd = f"{pdot}.{k}"
        ks = str(k).lower()
        v = perf[k]
        try:
            if "accept" in ks:
                if "acceptance" in ev:
                    cx.bad(
                        perf,
                        k,
                        kd,
                        "a second acceptance figure (another configuration); kept the first",
                    )
                    continue
                ev["acceptance"] = units.acceptance_fraction(v)
                cx.ok(perf, k, kd, f"evidence.acceptance = {ev['acceptance']} (fraction)")
            elif ks in ("baseline_tps", "baseline_tokens_per_s"):
                ev["baseline_tokens_per_s"] = units.tokens_per_s(v)
                cx.ok(perf, k, kd, "evidence.baseline_tokens_per_s")
            elif ks.endswith("_tps") or ks in ("tps", "tokens_per_s"):
                if "tokens_per_s" in ev:
                    cx.bad(perf, k, kd, "a second speed (another configuration); kept the first")
                    continue
                ev["tokens_per_s"] = units.tokens_per_s(v)
                cx.ok(perf, k, kd, "evidence.tokens_per_s")
            elif ks == "speedup":
                cx.bad(perf, k, kd, "a ratio; specreg derives it from tokens_per_s / baseline")
            else:
                cx.bad(perf, k, kd, "free-form figure with no unit specreg can attribute")
        except units.UnitError as err:
            cx.bad(perf, k, kd, str(err))
    if not ev:
        return None
    if role.get("benchmark_date"):
        ev["date"] = str(role["benchmark_date"])
        cx.ok(role, "benchmark_date", f"{pdot.rsplit('.', 1)[0]}.benchmark_date", "evidence.date")
    ev["source"] = f"{cx.source.name} {pdot} (line {key_line(role, 'performance')})"
    return ev


def _cross_check(cx: _Ctx, src: Any, roles: CommentedMap) -> None:
    sm = src.get("server_mode")
    if isinstance(sm, dict):
        for name in sm:
            entry = sm[name]
            dotted = f"server_mode.{name}"
            if not isinstance(entry, dict):
                cx.bad(sm, name, dotted, "expected a mapping")
                continue
            role_id = str(entry.get("model_role", name))
            cfg = _cfg_of(roles, role_id)
            for holder, hdot in (
                (entry, dotted),
                (entry.get("acceleration"), f"{dotted}.acceleration"),
            ):
                if not isinstance(holder, dict):
                    continue
                for k in units.K_KEYS:
                    if k not in holder:
                        continue
                    mine = cfg.get("draft_max") if cfg is not None else None
                    if mine is None:
                        cx.bad(
                            holder,
                            k,
                            f"{hdot}.{k}",
                            f"K={holder[k]} here, but roles.{role_id} pins no draft: the "
                            "orchestrator's loader reads roles, so this never applied",
                        )
                    elif holder[k] != mine:
                        cx.bad(
                            holder,
                            k,
                            f"{hdot}.{k}",
                            f"K={holder[k]} disagrees with roles.{role_id} (draft_max {mine}); "
                            "imported the roles value, which is what the loader applied",
                        )
                    else:
                        cx.ok(holder, k, f"{hdot}.{k}", f"same as roles.{role_id}")
            for k in entry:
                if k not in ("acceleration", *units.K_KEYS):
                    cx.bad(
                        entry,
                        k,
                        f"{dotted}.{k}",
                        "launch detail restating roles (ports, slots, file names): "
                        "`specreg export` derives it",
                    )
    op = src.get("optimized_params")
    if isinstance(op, dict):
        for name in op:
            if name == "_meta":
                cx.bad(op, name, "optimized_params._meta", "metadata of optimizer output")
                continue
            entry = op[name]
            for k in entry if isinstance(entry, dict) else ():
                cx.bad(
                    entry,
                    k,
                    f"optimized_params.{name}.{k}",
                    "optimizer output without run records (protocol, host, date): not evidence; "
                    "measure it with `specreg run` and let `specreg propose` pin it",
                )


def _cfg_of(roles: CommentedMap, role_id: str) -> Any:
    r = roles.get(role_id)
    if not isinstance(r, dict) or "configs" not in r:
        return None
    return r["configs"].get("default")
