"""Registry facts and this host's recorded runs, in the recommender's terms.

`target_fields` / `draft_fields` turn a registry `ModelRecord` into the `ConfigFacts` fields
(the same facts the prior derives from its columns). `local_observations` turns the runner's
recorded runs on this host into `Observation`s that the model is refitted on and that
`recommend` cites as evidence; runs that are no evidence of first use (`first_use_evidence`:
replay-affected, flagged, or a warm server's figure of a stateful method) are left out here.

Runs measured on other hosts (Ray results, `specreg runs import`) keep their host apart:
`other_host_observations` gives them their own host's facts (its bandwidth and cores, its
calibration, its plain baseline) and the source `other-host`, so they enter the fit as a prior
row does (what the model shares across hosts: the effect of bandwidth, cores, sizes, K) and are
never this host's measured evidence (weighted, cited and pulled towards as `local` only).
A run whose host's bandwidth is unknown is left out: this host's would misplace it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from typing import Any

import duckdb

from specreg.host.facts import HostFacts
from specreg.llamacpp import NGRAM_CACHE_DRAFT_MAX
from specreg.recommender.calibrated import Calibration, load_calibration
from specreg.recommender.features import ConfigFacts
from specreg.recommender.prior import Observation
from specreg.registry.queries import ModelRecord, get_model
from specreg.registry.run_store import STATUS_OK, RunRecord, list_runs
from specreg.stacks import NGRAM_CACHE, Stack, StackError, stack_of
from specreg.terms import DEFAULT_TYPE_OF, Method, arch_family

# The n-gram match length the model scores lookup candidates with: the prior's lookup rows
# were measured with n = 3..5 (4 the most common). This is a feature value, not the flag
# specreg passes: the pinned llama-server's ngram-mod matches 24 tokens by default.
NGRAM_MATCH_DEFAULT = 4


def _gb(n: int | None) -> float:
    return (n or 0) / 1e9


def target_fields(t: ModelRecord) -> dict[str, Any]:
    params = _gb(t.n_params) or 1e-3
    active = _gb(t.n_params_active) or params
    size = _gb(t.n_bytes)
    bpw = t.bits_per_weight or (size * 8 / params if params else 0.0)
    return {
        "target_params_b": params,
        "target_active_b": active,
        "target_bpw": float(bpw),
        "target_gb": size,
        "target_arch_family": arch_family(t.architecture),
        "target_is_moe": bool(t.is_moe),
        "target_is_hybrid": bool(t.is_hybrid or t.is_recurrent),
        "default_experts": int(t.expert_used_count or 0) if t.is_moe else 0,
        "output_share": output_share(t),
    }


def output_share(t: ModelRecord) -> float:
    """The output layer (vocabulary x embedding) as a share of the weights a token reads."""
    per_token = t.n_params_active or t.n_params
    if not per_token or not t.n_tokens or not t.embedding_length:
        return 0.0
    return min(1.0, t.n_tokens * t.embedding_length / per_token)


def draft_fields(d: ModelRecord, t: ModelRecord, tok_relation: str | None = None) -> dict[str, Any]:
    params = _gb(d.n_params) or 1e-3
    size = _gb(d.n_bytes)
    if tok_relation is None:
        same = d.tok_fingerprint is not None and d.tok_fingerprint == t.tok_fingerprint
        tok_relation = "identical" if same else "padding-only"
        if d.tok_pre != t.tok_pre:
            tok_relation = "pre-tokenizer-differs"
    return {
        "draft_params_b": params,
        "draft_bpw": float(d.bits_per_weight or size * 8 / params),
        "draft_gb": size,
        "draft_arch_family": arch_family(d.architecture),
        "tok_relation": tok_relation,
    }


def _run_task(run: RunRecord) -> str:
    return run.task or "chat"


SOURCE_LOCAL = "local"
SOURCE_OTHER_HOST = "other-host"


def _evidence_runs(
    con: duckdb.DuckDBPyConnection, without: Collection[str] = ()
) -> list[RunRecord]:
    """Successful runs with a measured speed that are evidence of first use (runs of the kinds
    `without` left out)."""
    try:
        runs = list_runs(con, status=STATUS_OK)
    except duckdb.Error:  # a registry without the runs tables has no local evidence
        return []
    # Runs whose figures are no evidence of first use (replays of a method that keeps state,
    # warm-server figures of such a method) stay in the registry but teach the model nothing.
    return [r for r in runs if r.tokens_per_s and r.first_use_evidence and r.kind not in without]


def local_observations(
    con: duckdb.DuckDBPyConnection, host: HostFacts, without: Collection[str] = ()
) -> list[Observation]:
    """This host's successful runs with a measured speed, as observations."""
    if host.fingerprint is None:
        return []
    mine = [r for r in _evidence_runs(con, without) if r.host_fingerprint == host.fingerprint]
    return _observations(con, mine, host, SOURCE_LOCAL)


def _other_host(con: duckdb.DuckDBPyConnection, fp: str, runs: list[RunRecord]) -> HostFacts | None:
    """Another host's facts from its runs (the bandwidth a Ray host or an export attached),
    else its bandwidth measured by `specreg doctor` in this registry; None when unknown."""
    from specreg.registry.calibration import latest_bandwidth

    facts = [r.host or {} for r in runs]
    cores = next((int(f["physical_cores"]) for f in facts if f.get("physical_cores")), None)
    bandwidth = next((float(f["bandwidth_gbs"]) for f in facts if f.get("bandwidth_gbs")), None)
    if bandwidth is None:
        try:
            measured = latest_bandwidth(con, fp)
        except duckdb.Error:  # a registry without the calibration tables
            measured = None
        bandwidth = measured.read_gbs if measured is not None else None
    if bandwidth is None or cores is None:
        return None
    return HostFacts(bandwidth, cores, "recorded", fp)


def other_host_observations(
    con: duckdb.DuckDBPyConnection, host: HostFacts, without: Collection[str] = ()
) -> list[Observation]:
    """Other hosts' successful runs, each with its own host's facts, as prior-like rows."""
    by_host: dict[str, list[RunRecord]] = {}
    for r in _evidence_runs(con, without):
        if r.host_fingerprint and r.host_fingerprint != host.fingerprint:
            by_host.setdefault(r.host_fingerprint, []).append(r)
    out: list[Observation] = []
    for fp, runs in sorted(by_host.items()):
        facts = _other_host(con, fp, runs)
        if facts is not None:
            out += _observations(con, runs, facts, SOURCE_OTHER_HOST)
    return out


def _observations(
    con: duckdb.DuckDBPyConnection, mine: list[RunRecord], host: HostFacts, source: str
) -> list[Observation]:
    """`mine` (runs of the one host `host` describes) as observations from `source`."""
    by_id = {r.run_id: r for r in mine}
    # plain runs per target: the baseline of that target on this host
    plain: dict[str, list[float]] = {}
    for r in mine:
        if r.spec_type == "none" and r.experts is None and r.target_model_id:
            plain.setdefault(r.target_model_id, []).append(float(r.tokens_per_s or 0))
    known = _Known(con, host)
    out = []
    for r in mine:
        try:
            stack = stack_of(r.spec_type)
        except StackError:  # a type this specreg does not know
            continue
        t = known.model(r.target_model_id)
        if t is None:
            continue
        base_run = by_id.get(r.baseline_run_id) if r.baseline_run_id else None
        if base_run is not None and base_run.tokens_per_s:
            baseline = float(base_run.tokens_per_s)
        elif r.target_model_id in plain:
            baseline = statistics.median(plain[r.target_model_id])
        else:
            baseline = math.nan
        draft: dict[str, Any] = {}
        if stack.method is Method.DRAFT:
            d = known.model(r.draft_model_id)
            if d is None:
                continue
            draft = draft_fields(d, t)
        out.append(
            Observation(
                config=_run_config(r, stack, t, known, baseline, draft),
                tps=float(r.tokens_per_s or 0),
                source=source,
                row_id=f"run:{r.run_id}",
                group=t.model_id,
                host=host.fingerprint or "",
                acceptance=r.acceptance,
                note=r.config_label,
                target_name=t.display_name,
                draft_name=known.model(r.draft_model_id).display_name  # type: ignore[union-attr]
                if draft
                else "",
                draft_key=r.draft_model_id or "" if draft else "",
                quant=(t.quant or "").upper(),
                draft_quant=(known.model(r.draft_model_id).quant or "").upper()  # type: ignore[union-attr]
                if draft
                else "",
            )
        )
    return out


class _Known:
    """The models runs name and the host's calibrations of them, each read once."""

    def __init__(self, con: duckdb.DuckDBPyConnection, host: HostFacts) -> None:
        self.con = con
        self.host = host
        self._models: dict[str, ModelRecord | None] = {}
        self._calibrations: dict[tuple[str, str | None, int | None], Calibration] = {}

    def model(self, mid: str | None) -> ModelRecord | None:
        if mid is None:
            return None
        if mid not in self._models:
            self._models[mid] = get_model(self.con, mid)
        return self._models[mid]

    def calibration(self, target_id: str, draft_id: str | None, threads: int | None) -> Calibration:
        """This host's llama-bench curves, as recommend sees them for the same configuration."""
        key = (target_id, draft_id, threads)
        if key not in self._calibrations:
            drafts = [draft_id] if draft_id else []
            self._calibrations[key] = load_calibration(
                self.con, self.host.fingerprint, target_id, drafts, threads=threads
            )
        return self._calibrations[key]


def _run_config(
    r: RunRecord,
    stack: Stack,
    t: ModelRecord,
    known: _Known,
    baseline: float,
    draft: dict[str, Any],
) -> ConfigFacts:
    """What run `r` ran (its target `t`, its draft's `draft` fields), as the model's features
    on the host that ran it, with that host's calibration."""
    method, host = stack.method, known.host
    # ngram-cache's K is llama-server's hard-coded draft length
    k = r.k or (NGRAM_CACHE_DRAFT_MAX if stack.primary == NGRAM_CACHE else 0)
    cal = known.calibration(t.model_id, r.draft_model_id, r.threads)
    calibrated = cal.target_fields(k if method is not Method.NONE else None)
    if r.draft_model_id and method is Method.DRAFT:
        calibrated.update(cal.draft_fields(r.draft_model_id, k))
    tf = target_fields(t)
    return ConfigFacts(
        bandwidth_gbs=host.bandwidth_gbs,
        physical_cores=host.physical_cores,
        **tf,
        method=method,
        k=k,
        experts=int(r.experts or tf["default_experts"]),
        temperature=float(r.temperature or 0.0),
        task=_run_task(r),
        ngram_n=NGRAM_MATCH_DEFAULT if method is Method.NGRAM else 0,
        baseline_tps=baseline,
        **draft,
        **calibrated,
        # a stack or another type than the method's default is a K curve of its own
        stack="" if stack.spelled == DEFAULT_TYPE_OF[method] else stack.spelled,
        lookup_cache=r.lookup_cache or "",
    )
