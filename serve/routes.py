"""The route table: for every target and task, the configuration to serve it with, and why.

A task's configuration is the one pinned in specreg.yaml for a role on that target, else the
top of `recommend` for this host (through `open_advisor`, like every other command). Tasks
whose configurations are equal share one backend: a backend is identified by the exact
llama-server flags it runs with, so two routes that would start the same process start it once.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb

from specreg.declare.launch import DEFAULT_DRAFT_MAX, DIALECT_CURRENT
from specreg.declare.spec import PinnedConfig, RoleDecl, Spec
from specreg.errors import UsageError
from specreg.host.machine import Host
from specreg.host.placement import launch_flags, launch_prefix
from specreg.host.topology import Placement
from specreg.jsonout import document
from specreg.llama.config import (
    SPEC_NONE,
    SPEC_TYPES,
    Config,
    ServerArgs,
    model_context,
    server_argv,
)
from specreg.llama.install import LlamaInstall
from specreg.llama.options import option_config
from specreg.llamacpp import Flag, ServerFlag
from specreg.recommender.advisor import Advisor
from specreg.recommender.recommend import Option, Recommendation
from specreg.registry.noise import FALLBACK_NOISE, NoiseFigure, noise_figure
from specreg.registry.queries import ModelRecord, get_model
from specreg.registry.scan import model_record
from specreg.runner.runs import with_expert_key
from specreg.serve.layouts import Replica
from specreg.serve.policy import (
    KIND_CACHE,
    KIND_DRAFT,
    KIND_EXPERTS,
    KIND_NGRAM,
    KIND_PLAIN,
    KIND_STACK,
    ORIGIN_PIN,
    ORIGIN_RECOMMEND,
    ORIGIN_TRAFFIC_CACHE,
    Candidate,
    pick_candidates,
)
from specreg.terms import MODEL_DRAFTER_TYPES, TASKS, Method, canonical_task

SOURCE_PINNED = "pinned"
SOURCE_RECOMMENDED = "recommended"
# --policy: `fixed` serves each task with one configuration (the pin or the recommender's top),
# `adaptive` chooses among a few candidates per request (specreg.serve.policy).
POLICY_FIXED = "fixed"
POLICY_ADAPTIVE = "adaptive"
POLICIES = (POLICY_ADAPTIVE, POLICY_FIXED)
# specreg.yaml's and --pin's name for "every task not pinned on its own".
DEFAULT_TASK = "default"
# llama-server slots per backend: requests it decodes at once, batched into one pass per step
# (on this 2-core host two slots gave 1.47x one slot's aggregate: 123.6 against 84.1 t/s).
# Beyond its slots a backend's requests wait in serve's queue. Eight: with four, eight clients
# of the Qwen2.5-Coder pair waited in turn (p95 end to end 1.15x a llama-server with -np 8,
# benchmarks/serve_load.py at 6e81957); a slot not decoding costs only its KV cache, and one
# stream decodes as fast with eight slots as with one.
DEFAULT_PARALLEL = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """A name fit for an HTTP header and a file name (model names come from GGUF files)."""
    return _UNSAFE.sub("-", text).strip("-")[:80] or "model"


@dataclass(frozen=True)
class Target:
    """A model clients can ask for: `name` is what /v1/models lists."""

    name: str
    model_id: str
    path: str
    aliases: tuple[str, ...] = ()

    def answers_to(self, model: str) -> bool:
        return model in (self.name, self.model_id, *self.aliases) or (
            len(model) >= 8 and self.model_id.startswith(model)
        )


@dataclass(frozen=True)
class BackendSpec:
    """One llama-server process: a target run with one configuration."""

    name: str
    target: Target
    config: Config
    draft_id: str | None
    draft_path: str | None
    prefix: tuple[str, ...]  # e.g. numactl --interleave=all on a multi-node host
    binary: str
    flags: tuple[str, ...]  # llama-server flags after the binary, without --host/--port
    slots: int = DEFAULT_PARALLEL  # requests it decodes at once (llama-server -np)
    # The cores it runs on (threads, CPUs, memory policy); None: every CPU serve may use.
    placement: Placement | None = None
    ctx_why: str = ""  # why each request gets config.ctx tokens of context
    kv_bytes: int = 0  # the KV cache its context takes in all (0: unknown)
    # the user's own llama-server flags in `flags`, each set with where it was given
    server_args: tuple[ServerArgs, ...] = ()

    @property
    def cpus(self) -> tuple[int, ...]:
        """The logical CPUs of its cores, SMT siblings included (what it occupies)."""
        return tuple(sorted(self.placement.all_cpus)) if self.placement is not None else ()

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.prefix, self.binary, *self.flags)

    @property
    def command(self) -> str:
        """The command line as a user would type it (shell-quoted: paths are untrusted)."""
        return shlex.join([*self.argv, "--host", "127.0.0.1", "--port", "PORT"])


@dataclass(frozen=True)
class Route:
    target: str
    task: str
    backend: str
    config_label: str
    source: str  # pinned | recommended
    reason: str


@dataclass(frozen=True)
class CandidateRoute:
    """A configuration the adaptive policy may send a (target, task)'s requests to.

    `reserve`: not offered at first; joins when K moves outward to it (specreg.serve.policy).
    The prior is the recommender's prediction for this host with its band."""

    target: str
    task: str
    backend: str
    label: str
    kind: str
    family: str | None
    k: int | None
    prior_tps: float
    prior_lo: float
    prior_hi: float
    prior_band: float
    origin: str
    reserve: bool = False
    # ngram-mod: target steps a drafting round's verification costs at its K (the
    # recommender's arithmetic), for replaying served requests (serve.policy.Replay)
    lookup_verify: float | None = None

    @property
    def key(self) -> str:
        return self.backend


@dataclass(frozen=True)
class RouteTable:
    """Targets, their routes per task and the backends the routes share.

    `routes` are the fixed policy's choice per task (and the adaptive policy's first choice);
    `candidates` what the adaptive policy chooses among (empty under --policy fixed)."""

    JSON_KIND = "serve-routes"
    # 3: slots, placement; 4: host figures and sources; 5: ctx, server_args; 6: replicas (the
    # backends a split layout runs, with the capacity measurement that says why); 7: each
    # candidate's lookup_verify (ngram-mod: a drafting round's verify cost, for replays)
    JSON_VERSION = "7"

    targets: tuple[Target, ...]
    routes: tuple[Route, ...]
    backends: tuple[BackendSpec, ...]
    notes: tuple[str, ...] = ()
    policy: str = POLICY_FIXED
    candidates: tuple[CandidateRoute, ...] = ()
    noise: NoiseFigure = FALLBACK_NOISE  # the host's, as the adaptive policy's prior reads it
    figures: tuple[str, ...] = ()  # per target: the figures its recommendations used
    # backends running another's configuration on a placement of a split (serve.layouts)
    replicas: tuple[Replica, ...] = ()

    def candidates_of(self, target: str, task: str) -> list[CandidateRoute]:
        return [c for c in self.candidates if c.target == target and c.task == task]

    def route(self, target: str, task: str) -> Route:
        for r in self.routes:
            if r.target == target and r.task == task:
                return r
        raise KeyError((target, task))

    def backend(self, name: str) -> BackendSpec:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    def find_target(self, model: str | None) -> Target | None:
        """The target a request's `model` names; without a `model`, the only target when there
        is one. A `model` naming nothing here is None (a 404), even with one target: a client
        that asked for another model must not get this one's answer as if it were that."""
        if model:
            return next((t for t in self.targets if t.answers_to(model)), None)
        return self.targets[0] if len(self.targets) == 1 else None

    def to_json(self) -> dict[str, Any]:
        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {
                "targets": self.targets,
                "routes": self.routes,
                "backends": [
                    {
                        "name": b.name,
                        "target": b.target.name,
                        "config": b.config.to_json(),
                        "config_label": b.config.label,
                        "draft_path": b.draft_path,
                        "argv": list(b.argv),
                        "command": b.command,
                        "slots": b.slots,
                        "ctx": {"tokens": b.config.ctx, "why": b.ctx_why},
                        "server_args": [a.to_json() for a in b.server_args],
                        "placement": b.placement.to_json() if b.placement else None,
                        "tasks": [r.task for r in self.routes if r.backend == b.name],
                    }
                    for b in self.backends
                ],
                "notes": self.notes,
                "policy": self.policy,
                "candidates": self.candidates,
                "noise": self.noise.to_json(),
                "figures": self.figures,
                "replicas": [r.to_json() for r in self.replicas],
            },
        )


def split_model(model: str | None) -> tuple[str | None, str | None]:
    """`target:code` -> (target, "code"); a name without a known task suffix is kept whole."""
    if not model or ":" not in model:
        return model, None
    head, _, tail = model.rpartition(":")
    if canonical_task(tail.lower()) in TASKS:
        return head, tail
    return model, None


# -- planning --------------------------------------------------------------------------------


def _role_for(spec: Spec | None, target: ModelRecord) -> RoleDecl | None:
    if spec is None:
        return None
    for role in spec.roles:
        decl = spec.model(role.target)
        if decl is not None and decl.id == target.model_id:
            return role
    return None


def _server_args(spec: Spec | None, target: ModelRecord, shape: Shape) -> tuple[ServerArgs, ...]:
    """The user's own llama-server flags for `target`'s backends, in the order they are
    added (a later one of a flag wins in llama.cpp): specreg.yaml's for the model, for its
    role, then `serve --server-arg`."""
    found: list[ServerArgs] = []
    decl = spec.model(target.model_id) if spec is not None else None
    role = _role_for(spec, target)
    for given in (decl.server_args if decl else None, role.server_args if role else None):
        if given is not None:
            found.append(ServerArgs(given.args, str(given.where)))
    if shape.server_args is not None and shape.server_args.args:
        found.append(shape.server_args)
    return tuple(found)


def _pinned(role: RoleDecl | None, task: str) -> tuple[PinnedConfig, ...]:
    """The configurations specreg.yaml pins for `task` (its own, else `default`'s): one, a
    candidate set, or none."""
    if role is None:
        return ()
    by_task: dict[str, list[PinnedConfig]] = {}
    for c in role.configs:
        by_task.setdefault(canonical_task(c.task), []).append(c)
    return tuple(by_task.get(task) or by_task.get(DEFAULT_TASK) or ())


def pinned_config(
    con: duckdb.DuckDBPyConnection, spec: Spec, cfg: PinnedConfig, target: ModelRecord
) -> tuple[Config, ModelRecord | None]:
    """The runner's configuration for a configuration pinned in specreg.yaml, and its draft."""
    types = [t for t in cfg.spec_types if t != SPEC_NONE]
    draft: ModelRecord | None = None
    k = cfg.draft_max
    if cfg.draft is not None:
        decl = spec.model(cfg.draft)
        draft = get_model(con, decl.id) if decl is not None else None
        if draft is None:
            raise UsageError(f"{cfg.field_where('draft')}: the draft is not in the registry")
        if k is None:
            k = DEFAULT_DRAFT_MAX[DIALECT_CURRENT]  # stated, not left to the build's default
    cache_path = None
    if cfg.lookup_cache is not None:
        from specreg.runner.lookup_cache import usable_cache

        # the family and the file are checked before any backend starts (llama.cpp would abort)
        cache_path = usable_cache(con, cfg.lookup_cache, target)[0].path
    config = Config(
        spec_type=",".join(types) or SPEC_NONE,  # a stack runs in one backend
        k=k,
        p_min=cfg.draft_p_min,
        experts=cfg.experts,
        lookup_cache=cache_path,
    )
    return with_expert_key(config, target), draft


def _target(rec: ModelRecord, spec: Spec | None, taken: set[str]) -> Target:
    decl = spec.model(rec.model_id) if spec is not None else None
    aliases = decl.aliases if decl is not None else ()
    name = safe_name(aliases[0] if aliases else Path(rec.path).stem)
    if name in taken:
        name = f"{name}-{rec.model_id[:8]}"
    taken.add(name)
    return Target(name=name, model_id=rec.model_id, path=rec.path, aliases=aliases)


@dataclass(frozen=True)
class Pin:
    """A configuration pinned on the command line: `--pin code=ngram-mod:8`."""

    task: str  # a task, or "default" for every task without a pin of its own
    spec_type: str
    k: int | None
    draft: str | None  # a model path, name or id
    text: str


PIN_SYNTAX = re.compile(r"([a-z]+)=([a-z0-9-]+)(?::(\d+))?(?:@(.+))?")


def parse_pin(text: str) -> Pin:
    m = PIN_SYNTAX.fullmatch(text.strip())
    if m is None:
        raise UsageError(f"--pin {text!r}: write TASK=SPEC_TYPE[:K][@DRAFT], e.g. code=ngram-mod:8")
    task = canonical_task(m[1])
    if task not in (*TASKS, DEFAULT_TASK):
        raise UsageError(f"--pin {text!r}: the task is one of {', '.join(TASKS)} or default")
    if m[2] not in SPEC_TYPES:
        raise UsageError(f"--pin {text!r}: the speculative type is one of {', '.join(SPEC_TYPES)}")
    return Pin(task, m[2], int(m[3]) if m[3] else None, m[4], text.strip())


def _model(con: duckdb.DuckDBPyConnection, ref: str) -> ModelRecord:
    """A model by path (scanned when new), name or id."""
    if Path(ref).is_file():
        return model_record(con, Path(ref))
    from specreg.registry.queries import resolve_model

    return resolve_model(con, ref)


def _records(
    con: duckdb.DuckDBPyConnection, refs: Sequence[str], spec: Spec | None
) -> list[ModelRecord]:
    records: list[ModelRecord] = []
    for ref in refs:
        decl = spec.model(ref) if spec is not None else None
        if decl is not None:
            rec = get_model(con, decl.id)
            if rec is None:
                raise UsageError(f"{ref} is declared in {spec.path if spec else ''} but not in "
                                 "the registry: run `specreg plan` or `specreg scan`")  # fmt: skip
        else:
            rec = _model(con, ref)
        if rec.model_id not in {r.model_id for r in records}:
            records.append(rec)
    return records


@dataclass(frozen=True)
class _Choice:
    config: Config
    draft: ModelRecord | None
    source: str
    reason: str
    recommendation: Recommendation | None = None
    # a pinned candidate set (--pin given several times for the task, or a list under
    # configs.<task> in specreg.yaml): each member's configuration and draft; () for one pin
    members: tuple[tuple[Config, ModelRecord | None], ...] = ()


def _choose(
    con: duckdb.DuckDBPyConnection,
    advisor: Advisor,
    spec: Spec | None,
    pins: Sequence[Pin],
    rec: ModelRecord,
    task: str,
) -> _Choice:
    """--pin, then specreg.yaml, then the recommender."""
    mine = _pins_for(pins, task)
    if mine:
        members = tuple(_pin_config(con, p) for p in mine)
        if len(mine) == 1:
            return _Choice(*members[0], SOURCE_PINNED, f"pinned by --pin {mine[0].text}")
        why = "candidate set pinned by --pin " + ", ".join(p.text for p in mine)
        return _Choice(*members[0], SOURCE_PINNED, why, members=members)
    role = _role_for(spec, rec)
    cfgs = _pinned(role, task)
    if cfgs and role is not None and spec is not None:
        members = tuple(pinned_config(con, spec, c, rec) for c in cfgs)
        if len(cfgs) == 1:
            why = f"pinned in {cfgs[0].where} (role {role.name})"
            return _Choice(*members[0], SOURCE_PINNED, why)
        why = f"candidate set pinned in {_set_where(cfgs)} (role {role.name})"
        return _Choice(*members[0], SOURCE_PINNED, why, members=members)
    recommendation = advisor.recommend(con, rec.model_id, task=task)
    best = recommendation.best
    reason = f"recommend: {best.label} predicted {best.tps:.1f} t/s ({best.speedup_str} vs plain)"
    if best.n_measured:
        reason += f", {best.n_measured} run(s) measured here"
    if best.memory_note:
        reason += f"; {best.memory_note}"
    return _Choice(
        option_config(best).with_(temperature=0.0),
        get_model(con, best.draft_id) if best.draft_id else None,
        SOURCE_RECOMMENDED,
        reason,
        recommendation,
    )


def _set_where(cfgs: Sequence[PinnedConfig]) -> str:
    """Where specreg.yaml pins a candidate set: its list, the place of its first member."""
    first = cfgs[0].where
    return str(replace(first, key=first.key.rsplit("[", 1)[0]))


def _pins_for(pins: Sequence[Pin], task: str) -> list[Pin]:
    """The --pin options for `task`: its own, else the `default` ones."""
    own = [p for p in pins if p.task == task]
    return own or [p for p in pins if p.task == DEFAULT_TASK]


def _pin_config(con: duckdb.DuckDBPyConnection, pin: Pin) -> tuple[Config, ModelRecord | None]:
    draft = _model(con, pin.draft) if pin.draft else None
    config = Config(spec_type=pin.spec_type, k=pin.k)
    if config.needs_draft and draft is None:
        raise UsageError(f"--pin {pin.text!r}: {pin.spec_type} needs @DRAFT (a draft model)")
    return config, draft


def _kind_of(option: Option) -> tuple[str, str | None] | None:
    """The policy's kind and family of a recommended option (None: not worth serving)."""
    experts = f"|experts={option.experts}" if option.experts is not None else ""
    if option.method is Method.NONE:
        return (KIND_EXPERTS, None) if option.experts is not None else (KIND_PLAIN, None)
    if option.stack is not None and "," in option.stack:
        return KIND_STACK, option.stack + experts
    if option.method in (Method.DRAFT, Method.MTP):
        return KIND_DRAFT, f"{option.spec_type}@{option.draft_id or 'self'}{experts}"
    if option.lookup_cache is not None:
        return KIND_CACHE, f"ngram-cache@{option.lookup_cache}"
    if option.spec_type == "ngram-cache":
        return None  # without a workload cache it stops drafting after a request (notes 7)
    return KIND_NGRAM, option.spec_type + experts


def _pinned_kind(config: Config, draft: ModelRecord | None) -> tuple[str, str | None]:
    """The policy's kind and family of a pinned configuration, as `_kind_of` names an
    option's (a pinned set's K does not move: see `TaskPolicy._move_k`)."""
    spec = config.spec_type
    if spec == SPEC_NONE:
        return KIND_PLAIN, None
    if "," in spec:
        return KIND_STACK, spec
    if spec in MODEL_DRAFTER_TYPES:
        return KIND_DRAFT, f"{spec}@{draft.model_id if draft is not None else 'self'}"
    return KIND_NGRAM, spec


def _prior_of(
    recommendation: Recommendation | None, config: Config, draft: ModelRecord | None
) -> tuple[float, float, float]:
    """The recommender's prediction for a pinned configuration (its closest option)."""
    if recommendation is None:
        return (1.0, 0.0, 0.0)
    o = _closest_option(recommendation, config, draft)
    if o is None:
        return (recommendation.best.tps, 0.0, 0.0)  # no band: the policy's default width
    return (o.tps, o.tps_lo, o.tps_hi)


def _closest_option(
    recommendation: Recommendation, config: Config, draft: ModelRecord | None
) -> Option | None:
    """The recommender's option of a configuration's type and draft nearest its K."""
    draft_id = draft.model_id if draft is not None else None
    same = [o for o in recommendation.options if o.spec_type == config.spec_type
            and o.draft_id == draft_id]  # fmt: skip
    if not same:
        return None
    return min(same, key=lambda o: abs((o.k or 0) - (config.k or o.k or 0)))


def _pinned_lookup_verify(
    recommendation: Recommendation | None, config: Config, draft: ModelRecord | None
) -> float | None:
    """`_lookup_verify` of a pinned configuration's option at exactly its K."""
    o = _closest_option(recommendation, config, draft) if recommendation is not None else None
    return _lookup_verify(o) if o is not None and o.k == config.k else None


def _backend(
    backends: dict[tuple[str, ...], BackendSpec],
    install: LlamaInstall,
    host: Host,
    target: Target,
    config: Config,
    draft: ModelRecord | None,
    shape: Shape,
    ctx_why: str = "",
    server_args: tuple[ServerArgs, ...] = (),
    kv_per_token: int = 0,
) -> BackendSpec:
    """The backend running `config` for `target`: the existing one with the same flags.
    `ctx_why` says why config.ctx; `server_args` are the user's own flags config carries, each
    with its origin."""
    draft_path = Path(draft.path) if draft is not None else None
    place = shape.placement
    if place is not None and config.threads is None:
        config = config.with_(threads=place.threads)  # one thread per core of the placement
    flags = (
        ServerFlag.PARALLEL,
        str(shape.slots),
        ServerFlag.METRICS,
        ServerFlag.ALIAS,
        target.name,
        # llama-server divides its context among the slots: each request gets config.ctx
        *server_argv(
            config.with_(ctx=config.ctx * shape.slots), Path(target.path), draft_path,
            install.dialect, host,
        ),
        *(_pinning(place, config, host) if place is not None else ()),
    )  # fmt: skip
    key = (str(install.server), *flags)
    if key not in backends:
        label = config.label.replace(" ", "-").replace("=", "")
        if draft_path is not None:
            label += f"-{draft_path.stem}"
        name = safe_name(f"{target.name}~{label}")
        if name in {b.name for b in backends.values()}:
            name = f"{name}-{len(backends) + 1}"
        prefix = launch_prefix(place, host.numactl) if place else host.launch_prefix()
        backends[key] = BackendSpec(
            name=name,
            target=target,
            config=config,
            draft_id=draft.model_id if draft is not None else None,
            draft_path=str(draft_path) if draft_path is not None else None,
            prefix=tuple(prefix),
            binary=str(install.server),
            flags=flags,
            slots=shape.slots,
            placement=place,
            ctx_why=ctx_why,
            server_args=server_args,
            kv_bytes=kv_per_token * config.ctx * shape.slots,
        )
    return backends[key]


def _pinning(place: Placement, config: Config, host: Host) -> list[str]:
    """The placement's flags beyond the threads server_argv gives: the batch threads (as
    many), and without numactl llama.cpp's own CPU mask."""
    flags = launch_flags(place, host.numactl)
    threads = str(config.threads or place.threads)
    return [Flag.THREADS_BATCH, threads, *flags[4:]]  # flags[:4] is -t N -tb N


@dataclass(frozen=True)
class Shape:
    """How every backend runs: its slots, the cores it is placed on (None: anywhere), its
    threads (None: one per core of the placement), context per request (None: what the
    target's trained context and the host's memory allow: `model_context`) and the user's own
    llama-server flags (`serve --server-arg`, after specreg.yaml's)."""

    slots: int = DEFAULT_PARALLEL
    placement: Placement | None = None
    threads: int | None = None
    ctx: int | None = None
    server_args: ServerArgs | None = None


def plan_routes(
    con: duckdb.DuckDBPyConnection,
    install: LlamaInstall,
    host: Host,
    advisor: Advisor,
    targets: Sequence[str],
    *,
    spec: Spec | None = None,
    pins: Sequence[Pin] = (),
    shape: Shape = Shape(),
    policy: str = POLICY_FIXED,
) -> RouteTable:
    """Choose every (target, task)'s configuration and the backends that serve them; under
    the adaptive policy also each (target, task)'s candidates (pins stay pins: a task pinned
    once has one candidate, a task pinned several times has the pinned set)."""
    if policy not in POLICIES:
        raise UsageError(f"--policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == POLICY_FIXED:
        for task in (*TASKS, DEFAULT_TASK):
            own = [p.text for p in pins if p.task == task]
            if len(own) > 1:
                raise UsageError(
                    f"--pin {own[0]!r} and {own[1]!r} pin one task twice: a candidate set "
                    "needs --policy adaptive"
                )
    refs = list(targets)
    if not refs and spec is not None:
        refs = list(dict.fromkeys(role.target for role in spec.roles))
    if not refs:
        raise UsageError(
            "nothing to serve: give a TARGET (model path, name or id), or a specreg.yaml "
            "with roles (--spec)"
        )
    records = _records(con, refs, spec)
    taken: set[str] = set()
    out_targets: list[Target] = []
    routes: list[Route] = []
    backends: dict[tuple[str, ...], BackendSpec] = {}
    notes: list[str] = []
    if advisor.n_local == 0:
        notes.append(
            "no runs on this host yet: recommendations come from the shipped prior; served "
            "requests are recorded and refine them"
        )
    candidates: list[CandidateRoute] = []
    figures: dict[str, str] = {}
    band = advisor.model.band
    for rec in records:
        target = _target(rec, spec, taken)
        out_targets.append(target)
        extra = _server_args(spec, rec, shape)
        for task in TASKS:
            choice = _choose(con, advisor, spec, pins, rec, task)
            if policy == POLICY_FIXED and choice.members:
                raise UsageError(
                    f"{choice.reason}: serve it with --policy adaptive, or pin one configuration"
                )

            def backend_of(
                config: Config,
                draft: ModelRecord | None,
                target: Target = target,
                extra: tuple[ServerArgs, ...] = extra,
            ) -> BackendSpec:
                draft_id = draft.model_id if draft is not None else None
                found = model_context(con, target.model_id, draft_id, host.mem_bytes,
                                      shape.slots)  # fmt: skip
                ctx, why = (shape.ctx, "serve --ctx") if shape.ctx else (found.tokens, found.why)
                args = tuple(a for e in extra for a in e.args)
                config = config.with_(threads=shape.threads, ctx=ctx, server_args=args)
                return _backend(backends, install, host, target, config, draft, shape, why, extra,
                                found.kv_per_token)  # fmt: skip

            b = backend_of(choice.config, choice.draft)
            routes.append(
                Route(target.name, task, b.name, b.config.label, choice.source, choice.reason)
            )
            if policy == POLICY_ADAPTIVE:
                if choice.source == SOURCE_PINNED and choice.recommendation is None:
                    choice = replace(
                        choice, recommendation=advisor.recommend(con, rec.model_id, task=task)
                    )
                candidates += _task_candidates(con, target, task, choice, b, band, backend_of)
            if choice.recommendation is not None:
                figures.setdefault(target.name, choice.recommendation.figures_line)
    notes += [n for b in backends.values() if (n := ngram_cache_note(b))]
    return RouteTable(
        tuple(out_targets), tuple(routes), tuple(backends.values()), tuple(notes),
        policy=policy, candidates=tuple(candidates),
        noise=noise_figure(con, advisor.host.fingerprint),
        figures=tuple(f"{name}: {line}" for name, line in figures.items()),
    )  # fmt: skip


def _task_candidates(
    con: duckdb.DuckDBPyConnection,
    target: Target,
    task: str,
    choice: _Choice,
    route_backend: BackendSpec,
    band: float,
    backend_of: Callable[[Config, ModelRecord | None], BackendSpec],
) -> list[CandidateRoute]:
    """A (target, task)'s candidates: see `plan_routes`."""
    recommendation = choice.recommendation

    def made(b: BackendSpec, prior: tuple[float, float, float], kind: str, family: str | None,
             origin: str, reserve: bool = False) -> CandidateRoute:  # fmt: skip
        return CandidateRoute(
            target.name, task, b.name, b.config.label + (f" {Path(b.draft_path).stem}"
            if b.draft_path else ""), kind, family, b.config.k, *prior, band, origin, reserve,
        )  # fmt: skip

    if choice.source == SOURCE_PINNED:
        if not choice.members:  # one pin: the pinned configuration only
            prior = _prior_of(recommendation, route_backend.config, choice.draft)
            return [made(route_backend, prior, KIND_PLAIN, None, ORIGIN_PIN)]
        out = []
        for config, draft in choice.members:
            b = backend_of(config, draft)
            kind, family = _pinned_kind(config, draft)
            pin = made(b, _prior_of(recommendation, config, draft), kind, family, ORIGIN_PIN)
            verify = _pinned_lookup_verify(recommendation, config, draft)
            out.append(replace(pin, lookup_verify=verify))
        return _unique(out)
    assert recommendation is not None
    offers: list[Candidate] = []
    for i, option in enumerate(recommendation.options):
        kind_family = _kind_of(option)
        if kind_family is None:
            continue
        offers.append(
            Candidate(
                f"option-{i}",
                option.label,
                option.tps,
                option.tps_lo,
                option.tps_hi,
                band,
                k=option.k,
                family=kind_family[1],
                kind=kind_family[0],
                payload=option,
            )  # fmt: skip
        )
    picked = pick_candidates(offers)
    keys = {c.key for c in picked}
    families = {c.family for c in picked if c.kind == KIND_DRAFT}
    reserve = [o for o in offers if o.kind == KIND_DRAFT and o.family in families
               and o.key not in keys]  # fmt: skip
    out = [made(route_backend, _prior_of(recommendation, route_backend.config, choice.draft),
                *_route_kind(offers, route_backend), ORIGIN_RECOMMEND)]  # fmt: skip
    for c, spare in [*((c, False) for c in picked), *((c, True) for c in reserve)]:
        option = c.payload
        draft = get_model(con, option.draft_id) if option.draft_id else None
        b = backend_of(option_config(option).with_(temperature=0.0), draft)
        prior = (c.prior_tps, c.prior_lo, c.prior_hi)
        made_one = made(b, prior, c.kind, c.family, ORIGIN_RECOMMEND, reserve=spare)
        out.append(replace(made_one, lookup_verify=_lookup_verify(option)))
    return _unique(out)


def _lookup_verify(option: Option) -> float | None:
    """An ngram-mod option's cost of a drafting verification in target steps (None for any
    other option): what a replay of served text needs to become a speed."""
    arithmetic = option.arithmetic
    if option.spec_type != "ngram-mod" or arithmetic is None:
        return None
    verify = arithmetic.drafting_verify
    return verify if math.isfinite(verify) and verify > 0 else None


def _route_kind(offers: Sequence[Candidate], route: BackendSpec) -> tuple[str, str | None]:
    """The kind and family of the route's own configuration (the recommender's top)."""
    for o in offers:
        option = o.payload
        if option_config(option).with_(temperature=0.0).label == route.config.label and (
            option.draft_path == route.draft_path
        ):
            return o.kind, o.family
    return KIND_PLAIN, None


def cache_candidate(
    table: RouteTable,
    install: LlamaInstall,
    host: Host,
    target: str,
    task: str,
    cache_path: str,
    *,
    prior: tuple[float, float, float] = (1.0, 0.0, 0.0),
) -> tuple[BackendSpec, CandidateRoute]:
    """ngram-cache reading `cache_path` (a lookup cache grown from this task's traffic) as a
    new candidate of (target, task): the target's plain backend with the static cache added,
    same threads, context and slots. `prior`: (t/s, low, high), no band by default."""
    base = next(b for b in table.backends if b.target.name == target)
    config = Config(
        spec_type="ngram-cache",
        lookup_cache=cache_path,
        threads=base.config.threads,
        ctx=base.config.ctx,
        temperature=0.0,
        server_args=base.config.server_args,
    )
    existing = {(str(install.server), *b.flags): b for b in table.backends}
    per_token = base.kv_bytes // max(base.config.ctx * base.slots, 1)
    spec = _backend(existing, install, host, base.target, config, None,
                    Shape(base.slots, base.placement), base.ctx_why,
                    base.server_args, per_token)  # fmt: skip
    label = f"ngram-cache {Path(cache_path).stem}"
    candidate = CandidateRoute(
        target, task, spec.name, label, KIND_CACHE, f"ngram-cache@{Path(cache_path).stem}",
        None, *prior, 0.8, ORIGIN_TRAFFIC_CACHE,
    )  # fmt: skip
    return spec, candidate


def replica_backend(
    base: BackendSpec,
    place: Placement,
    slots: int,
    install: LlamaInstall,
    host: Host,
    draft: ModelRecord | None,
) -> BackendSpec:
    """`base`'s configuration on `place` with `slots` slots (`draft` is base's draft model):
    the same target, draft, context per request and user's flags; the placement's threads
    (`--threads` caps every backend's), CPUs and memory policy, launched as every backend is.
    Named after base and the placement (`smollm2-plain-node0`)."""
    threads = min(base.config.threads or place.threads, place.threads)
    per_token = base.kv_bytes // max(base.config.ctx * base.slots, 1)
    # a dictionary of its own: replicas on placements of one size have the same flags (the
    # CPUs are numactl's, before the binary), and each is a process of its own
    spec = _backend({}, install, host, base.target, base.config.with_(threads=threads), draft,
                    Shape(slots, place), base.ctx_why, base.server_args, per_token)  # fmt: skip
    return replace(spec, name=safe_name(f"{base.name}~{place.name}"))


def _unique(cands: Sequence[CandidateRoute]) -> list[CandidateRoute]:
    """One candidate per backend, the first one given, in order."""
    seen: dict[str, CandidateRoute] = {}
    for c in cands:
        seen.setdefault(c.backend, c)
    return list(seen.values())


def ngram_cache_note(backend: BackendSpec) -> str | None:
    """The warning a long-lived ngram-cache backend needs (None for other types).

    llama-server keeps ngram-cache's per-slot context cache and its length across requests and
    adds a request's tokens only past that length (`common_speculative_impl_ngram_cache`:
    `cache_size`), so after its first request it learns almost nothing new; a static cache
    (--lookup-cache-static) is looked up on every step whatever the context cache holds.
    """
    if "ngram-cache" not in backend.config.spec_type.split(","):
        return None
    static = Flag.LOOKUP_CACHE_STATIC in backend.flags
    head = (
        f"{backend.name} runs ngram-cache: llama-server keeps its per-slot context cache across "
        "requests and adds a request's text only once it outgrows the longest earlier one, so "
        "after the first request it drafts "
    )
    if static:
        return head + (
            "from its static lookup cache only (rebuild the cache as the workload changes: "
            "`specreg lookup-cache build`)"
        )
    return head + (
        "almost nothing; give it a workload cache (`specreg lookup-cache build`, then "
        "lookup_cache: NAME in specreg.yaml) or serve ngram-mod"
    )
