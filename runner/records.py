"""Run records: the one factory every caller builds a `RunRecord` with, and the record of a
finished measurement.

`run_record` fills in every field a run's configuration, its models, the llama.cpp build and
the host decide, so a record started before llama.cpp runs (`runs`, a sweep's `Job`), the
record of a finished measurement (`to_record`) and a served request's (serve) say those the
same way. `RunRecord` itself lives in the registry, which stores it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specreg.host.machine import Host
from specreg.llama import spec_stats
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.llama.server import Completion
from specreg.registry.lookup_caches import LookupCache
from specreg.registry.run_store import (
    STATUS_FAILED,
    STATUS_OK,
    STATUS_RUNNING,
    PromptRecord,
    RunRecord,
)
from specreg.runner.measure import load_verdict_of
from specreg.runner.measurement import Measurement
from specreg.runner.protocol import DISTURBED
from specreg.runner.verify import PromptVerdict, Verification
from specreg.terms import REGIME_FIRST


@dataclass(frozen=True)
class Models:
    """A run's target and draft as its record names them: registry ids and files."""

    target_id: str | None
    target_path: Path | str | None
    draft_id: str | None = None
    draft_path: Path | str | None = None

    def fields(self) -> dict[str, Any]:
        return {
            "target_model_id": self.target_id,
            "draft_model_id": self.draft_id,
            "target_path": _path(self.target_path),
            "draft_path": _path(self.draft_path),
        }


def _path(path: Path | str | None) -> str | None:
    return None if path is None else os.fspath(path)


def _config_fields(config: Config, engine: str) -> dict[str, Any]:
    return {
        "config": {**config.to_json(), "engine": engine},
        "config_label": config.label,
        "spec_type": config.spec_type,
        "k": config.k,
        "p_min": config.p_min,
        "draft_threads": config.draft_threads,
        "experts": config.experts,
        "temperature": config.temperature,
        "seed": config.seed,
        "behaviour_changing": config.behaviour_changing,
    }


def _install_fields(install: LlamaInstall | None) -> dict[str, Any]:
    if install is None:
        return {}
    return {
        "llama_version": install.version,
        "llama_dialect": install.dialect,
        "llama_bin_dir": os.fspath(install.bin_dir),
    }


def _host_fields(host: Host | Mapping[str, Any] | None) -> dict[str, Any]:
    if isinstance(host, Host):
        return {
            "host_fingerprint": host.fingerprint,
            "host": host.to_json(),
            "threads": host.threads,
        }
    facts = dict(host or {})
    fingerprint = facts.get("fingerprint")
    return {
        "host_fingerprint": None if fingerprint is None else str(fingerprint),
        "host": facts or None,
    }


def run_record(
    kind: str,
    config: Config,
    models: Models,
    *,
    engine: str,
    install: LlamaInstall | None = None,
    host: Host | Mapping[str, Any] | None = None,
    **fields: Any,
) -> RunRecord:
    """The record of a run of `config` on `models` with `engine`: every field the
    configuration, the models, the llama.cpp build (`install`) and the host (a `Host`, or the
    facts a Ray host reported) decide; `fields` give the rest (task, prompt_set, figures, ...)
    and win over those. A record is `running` and started now unless `fields` say otherwise.
    """
    derived = {
        "kind": kind,
        "status": STATUS_RUNNING,
        "started_at": datetime.now(timezone.utc),
        **_config_fields(config, engine),
        **models.fields(),
        **_install_fields(install),
        **_host_fields(host),
    }
    return RunRecord(**{**derived, **fields})


# -- a finished measurement's record -----------------------------------------------------------


def to_record(
    m: Measurement,
    kind: str,
    target_id: str | None,
    draft_id: str | None,
    *,
    task: str | None = None,
    verification: Verification | None = None,
    baseline_run_id: int | None = None,
    lookup_cache: LookupCache | None = None,
    baseline_disturbed: str | None = None,
) -> RunRecord:
    """The record of measurement `m` (failed or not), with its verdict against a baseline run
    when it was verified, and whether its figures can be trusted."""
    failure = m.failure
    rng = m.tokens_per_s_range
    return run_record(
        kind,
        m.config,
        Models(target_id, m.target, draft_id, m.draft),
        engine=m.engine,
        install=m.install,
        host=m.host,
        **_trust_fields(m, baseline_disturbed),
        **_verification_fields(verification),
        status=STATUS_OK if m.ok else STATUS_FAILED,
        started_at=m.started_at,
        seconds=m.seconds,
        error_kind=failure.kind if failure else None,
        error=str(failure) if failure else None,
        llama_message=failure.llama_message if failure else None,
        argv=m.argv,
        task=task,
        prompt_set=m.workload.name,
        n_predict=m.n_predict,
        repeats=m.repeats,
        speculative_active=m.speculative_active,
        tokens_per_s=m.tokens_per_s,
        tokens_per_s_lo=rng[0] if rng else None,
        tokens_per_s_hi=rng[1] if rng else None,
        draft_n=m.draft_n,
        draft_n_accepted=m.draft_n_accepted,
        acceptance=m.acceptance,
        baseline_run_id=baseline_run_id,
        log_path=os.fspath(m.log_path),
        lookup_cache=lookup_cache.name if lookup_cache else None,
        lookup_cache_sha256=lookup_cache.sha256 if lookup_cache else None,
        type_figures=spec_stats.to_json(m.type_figures),
        prompts=_prompt_records(m, verification.prompts if verification else ()),
    )


def _trust_fields(m: Measurement, baseline_disturbed: str | None) -> dict[str, Any]:
    """How `m`'s samples were taken and whether they can be trusted: not when later repeats
    accepted far more than the first (a replay), nor when other processes' load, or repeats
    spread beyond the quiet noise floor, disturbed it or its baseline (issue 28)."""
    flags = m.replay_flags
    phases = m.phase_figures
    load = load_verdict_of(m)
    disturbed = load.reason or (
        f"its baseline run was disturbed ({baseline_disturbed})" if baseline_disturbed else None
    )
    reason = None
    if flags:
        reason = (
            "replay-suspect: later repeats accepted far more than the first for the same "
            f"prompt ({'; '.join(flags)})"
        )
    elif disturbed:
        reason = f"{DISTURBED}: {disturbed}"
    return {
        "regime": m.protocol.regime if m.protocol else REGIME_FIRST,
        "protocol": {**m.protocol.to_json(), "load": load.facts} if m.protocol else None,
        "repeat_figures": tuple(f.to_json() for f in m.repeat_figures),
        "phase_figures": {k: f.to_json() for k, f in phases.items()} if phases else None,
        "trusted": not flags and not disturbed,
        "trust_reason": reason,
    }


def _verification_fields(v: Verification | None) -> dict[str, Any]:
    if v is None:
        return {}
    spread = v.speedup_range
    return {
        "speedup": v.speedup,
        "speedup_lo": spread[0] if spread else None,
        "speedup_hi": spread[1] if spread else None,
        "verdict": v.verdict,
        "verdict_reason": v.reason,
    }


def _prompt_records(
    m: Measurement, verdicts: tuple[PromptVerdict, ...] = ()
) -> tuple[PromptRecord, ...]:
    by_id = {v.prompt_id: v for v in verdicts}
    out = []
    for p in m.prompts:
        tps = p.tps
        v = by_id.get(p.prompt.prompt_id)
        first = p.samples[0] if p.samples else None
        out.append(
            PromptRecord(
                samples_draft_n=tuple(s.draft_n for s in p.samples),
                samples_draft_n_accepted=tuple(s.draft_n_accepted for s in p.samples),
                samples_session=p.sessions,
                samples_position=p.positions,
                prompt_id=p.prompt.prompt_id,
                prompt_sha256=p.prompt.sha256,
                n_samples=len(p.samples),
                prompt_n=first.prompt_n if first else None,
                predicted_n=first.predicted_n if first else None,
                tokens_per_s=p.tps_median if tps else None,
                tokens_per_s_lo=min(tps) if tps else None,
                tokens_per_s_hi=max(tps) if tps else None,
                samples_tps=tps,
                foreign_cpu_s=tuple(s.foreign_cpu_s or 0.0 for s in p.samples),
                draft_n=p.draft_n,
                draft_n_accepted=p.draft_n_accepted,
                output_sha256=_tokens_sha(p.tokens) if p.tokens or not first else _text_sha(first),
                stop_type=first.stop_type if first else None,
                verdict=v.verdict if v else None,
                divergence=v.to_json() if v else None,
                prompt_text=p.prompt.text,
                output_text=first.content if first else None,
                type_figures=spec_stats.to_json(p.type_figures),
            )
        )
    return tuple(out)


def _tokens_sha(tokens: tuple[int, ...]) -> str:
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()


def _text_sha(sample: Completion) -> str:
    """Legacy engines print text, not token ids: their output is identified by its text."""
    return hashlib.sha256(b"text:" + sample.content.encode()).hexdigest()
