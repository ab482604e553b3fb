"""From a role's pinned configuration to the llama-server argv that will run, flag by flag.

Each flag carries its origin: the specreg.yaml key and line it was declared at, the registry fact
it was read from (a path, the `--override-kv` key), or the dialect rule that chose its spelling.
Nothing is patched after rendering: what is shown is what runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from specreg.declare import DIALECT_CURRENT, DIALECT_LEGACY, deps
from specreg.declare.spec import DRAFT_MODEL_TYPES, PinnedConfig, RoleDecl, Spec
from specreg.errors import UsageError
from specreg.llamacpp import (
    DIALECTS,
    LONG_NAMES,
    DraftFlag,
    ServerFlag,
    SpecFlag,
    Tool,
)
from specreg.llamacpp import Flag as CommonFlag
from specreg.registry.queries import get_model, model_fs_paths
from specreg.terms import SPEC_DRAFT_SIMPLE

if TYPE_CHECKING:
    from specreg.host.machine import Host
    from specreg.llama.config import ContextSize

# What a draft config runs with when draft_max is not declared, stated rather than implied
# (`--spec-draft-n-max` defaults to 3 in the pinned build, `--draft-max` to 16 in older ones).
DEFAULT_DRAFT_MAX = {
    name: DIALECTS[deps.DIALECT_NAMES[name]].k_default[SPEC_DRAFT_SIMPLE]
    for name in (DIALECT_CURRENT, DIALECT_LEGACY)
}
# models-preset keys: llama.cpp accepts any spelling without dashes; the long one reads best.
PRESET_KEYS = {short: long.lstrip("-") for short, long in LONG_NAMES.items()}


@dataclass(frozen=True)
class Flag:
    flag: str
    value: str | None
    origin: str
    preset_key: str

    @property
    def args(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


@dataclass(frozen=True)
class Launch:
    role: str
    task: str
    binary: str
    prefix: tuple[Flag, ...]  # e.g. numactl, before the binary
    flags: tuple[Flag, ...]
    dialect: str
    member: int | None = None  # its place in the task's candidate set (`configs.<task>[i]`)

    @property
    def name(self) -> str:
        name = self.role if self.task == "default" else f"{self.role}-{self.task}"
        return name if self.member is None else f"{name}-{self.member}"

    @property
    def argv(self) -> list[str]:
        out = [a for f in self.prefix for a in f.args]
        out.append(self.binary)
        for f in self.flags:
            out += f.args
        return out

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class Skipped:
    role: str
    task: str
    reason: str


@dataclass(frozen=True)
class LaunchPlan:
    JSON_KIND = "export"
    JSON_VERSION = "1"

    dialect: str
    dialect_origin: str
    launches: tuple[Launch, ...]
    skipped: tuple[Skipped, ...]

    def to_json(self, fmt: str | None = None) -> dict[str, Any]:
        """`export --json`: each launch's final argv and every flag with its origin; `fmt`
        names the format the launches were built for (its port)."""
        from specreg.jsonout import document

        launches = [
            {
                "role": x.role,
                "task": x.task,
                "member": x.member,
                "argv": x.argv,
                "flags": (*x.prefix, *x.flags),
            }
            for x in self.launches
        ]
        payload = {
            "format": fmt,
            "dialect": self.dialect,
            "dialect_origin": self.dialect_origin,
            "launches": launches,
            "skipped": self.skipped,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


def choose_dialect(spec: Spec, override: str | None = None) -> tuple[str, str]:
    if override:
        return override, "--dialect on the command line"
    if spec.llama.dialect in (DIALECT_CURRENT, DIALECT_LEGACY):
        return spec.llama.dialect, str(spec.llama.field_where("dialect"))
    bin_dir = spec.resolve_path(spec.llama.bin_dir) if spec.llama.bin_dir else None
    found = deps.detect_dialect(bin_dir)
    if found:
        return found, f"detected from {bin_dir}/llama-server --help"
    return DIALECT_CURRENT, "default: the pinned llama.cpp build (no binary to ask)"


def _model_path(con: duckdb.DuckDBPyConnection, spec: Spec, ref: str) -> tuple[Path | None, str]:
    decl = spec.model(ref)
    if decl is None:
        return None, f"{ref} is not declared"
    disk = deps.model_by_id(con, decl.id)
    if disk is not None and disk.status == "present":
        # the file as the OS names it: `disk.path` writes bytes that are not UTF-8 as \xNN
        exact = model_fs_paths(con, decl.id)
        path = Path(exact[0] if exact else disk.path)
        return path, f"registry path of {decl.label} ({decl.id[:12]})"
    if disk is not None and disk.status == "incomplete":
        return None, f"{decl.label} is missing split parts: {', '.join(disk.parts_missing)}"
    return None, f"{decl.label} ({decl.id[:12]}) is not on disk (run `specreg plan`)"


def build(
    con: duckdb.DuckDBPyConnection,
    spec: Spec,
    *,
    dialect: str | None = None,
    port: str | None = "8080",
    roles: Sequence[str] = (),
) -> LaunchPlan:
    """Launch configurations for every (role, task); ones that cannot run are skipped with why."""
    unknown = [r for r in roles if r not in {x.name for x in spec.roles}]
    if unknown:
        declared = ", ".join(x.name for x in spec.roles) or "none"
        raise UsageError(f"no role {unknown[0]!r} in {spec.path} (declared: {declared})")
    dia, dia_origin = choose_dialect(spec, dialect)
    launches: list[Launch] = []
    skipped: list[Skipped] = []
    for role in spec.roles:
        if roles and role.name not in roles:
            continue
        configs = role.configs or (_baseline(role),)
        for cfg in configs:
            try:
                launches.append(_launch(con, spec, role, cfg, dia, dia_origin, port))
            except _Skip as s:
                skipped.append(Skipped(role.name, cfg.name, str(s)))
    return LaunchPlan(dia, dia_origin, tuple(launches), tuple(skipped))


class _Skip(Exception):
    pass


def _baseline(role: RoleDecl) -> PinnedConfig:
    return PinnedConfig(
        task="default",
        spec_types=("none",),
        draft=None,
        draft_max=None,
        draft_p_min=None,
        experts=None,
        evidence=None,
        where=role.where,
    )


def _lookup_cache(
    con: duckdb.DuckDBPyConnection, spec: Spec, role: RoleDecl, cfg: PinnedConfig
) -> tuple[str, str]:
    """The file of the pinned lookup cache and where it came from; skipped with the reason
    when the target's tokenizer family differs or the file would make llama-server abort."""
    from specreg.runner.lookup_cache import usable_cache

    assert cfg.lookup_cache is not None
    decl = spec.model(role.target)
    target = get_model(con, decl.id) if decl is not None else None
    if target is None:
        raise _Skip(f"lookup_cache: {role.target} is not in the registry (run `specreg plan`)")
    try:
        cache, _ = usable_cache(con, cfg.lookup_cache, target)
    except UsageError as err:
        raise _Skip(f"lookup_cache: {err}") from err
    return cache.path, f"registry lookup cache {cache.name} ({cache.tok_family}, {cache.task})"


def _pairs(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out.append((flag, argv[i + 1]))
            i += 2
        else:
            out.append((flag, None))
            i += 1
    return out


def _launch(
    con: duckdb.DuckDBPyConnection,
    spec: Spec,
    role: RoleDecl,
    cfg: PinnedConfig,
    dialect: str,
    dia_origin: str,
    port: str | None,
) -> Launch:
    from specreg.host.machine import detect_host
    from specreg.llama.config import Config, server_argv

    path, why = _model_path(con, spec, role.target)
    if path is None:
        raise _Skip(f"target: {why}")
    origins: dict[str, str] = {CommonFlag.MODEL: f"{role.target_where} -> {why}"}

    types, draft_path, k = _speculation(con, spec, cfg, dialect, origins)

    expert_key = None
    if cfg.experts is not None:
        expert_key = _expert_key(con, spec, role)
        origins[CommonFlag.OVERRIDE_KV] = (
            f"{cfg.field_where('experts')}; key {expert_key} from the GGUF"
        )

    host = detect_host()
    if spec.llama.threads is not None:
        host = replace(host, physical_cores=spec.llama.threads)
        origins[CommonFlag.THREADS] = str(spec.llama.field_where("threads"))
    else:
        origins[CommonFlag.THREADS] = f"not declared: physical cores of this host ({host.threads})"
    if len(types) > 1 and dialect == DIALECT_LEGACY:
        raise _Skip(
            f"{', '.join(types)}: this llama.cpp's server predates --spec-type and runs only a "
            "draft model; use llama.cpp from 2026 or later, or pin one draft config"
        )
    cache_path = None
    if cfg.lookup_cache is not None:
        cache_path, cache_why = _lookup_cache(con, spec, role, cfg)
        cache_where = f"{cfg.field_where('lookup_cache')} -> {cache_why}"
        origins[CommonFlag.LOOKUP_CACHE_STATIC] = cache_where
    own = _own_args(spec, role, origins)
    ctx = _context(con, spec, role, cfg, host)
    try:
        config = Config(
            spec_type=",".join(types) or "none",  # a stack, in the order llama.cpp tries it
            k=k,
            p_min=cfg.draft_p_min,
            experts=cfg.experts,
            expert_key=expert_key,
            lookup_cache=cache_path,
            ctx=ctx.tokens,
            server_args=own,
        )
        argv = server_argv(config, path, draft_path, deps.DIALECT_NAMES[dialect], host)
    except UsageError as err:
        raise _Skip(str(err)) from err
    origins[CommonFlag.CTX] = f"not declared: {ctx.why}"
    if port is not None:
        argv += [ServerFlag.PORT, port]
        origins[ServerFlag.PORT] = (
            "llama-swap's ${PORT} macro: it assigns the port"
            if port == "${PORT}"
            else "export: llama-server's usual port; arguments after it override it"
        )

    flags = tuple(
        Flag(
            f,
            v,
            origins.get(f, "specreg.llama.config.server_argv"),
            PRESET_KEYS.get(f, f.lstrip("-")),
        )
        for f, v in _pairs(argv)
    )
    binary: str = Tool.SERVER
    if spec.llama.bin_dir:
        binary = str(spec.resolve_path(spec.llama.bin_dir) / Tool.SERVER)
    return Launch(role.name, cfg.task, binary, _prefix(spec, host), flags, dialect, cfg.member)


def _own_args(spec: Spec, role: RoleDecl, origins: dict[str, str]) -> tuple[str, ...]:
    """The user's own llama-server flags for this role (the target model's, then the role's;
    the later of one flag wins in llama.cpp), each flag's origin in `origins`."""
    target = spec.model(role.target)
    args: list[str] = []
    for given in (target.server_args if target else None, role.server_args):
        if given is None:
            continue
        args += given.args
        for flag, _ in _pairs(given.args):
            origins[flag] = str(given.where)
    return tuple(args)


def _context(
    con: duckdb.DuckDBPyConnection, spec: Spec, role: RoleDecl, cfg: PinnedConfig, host: Host
) -> ContextSize:
    """The context the launch gets: the target's trained context, as much of it as this
    host's memory beside the weights holds (llama.cpp's -c, all of its slots together)."""
    from specreg.llama.config import model_context

    target = spec.model(role.target)
    draft = spec.model(cfg.draft) if cfg.draft is not None else None
    if target is None:
        return model_context(con, "", None, 0)
    return model_context(con, target.id, draft.id if draft else None, host.mem_bytes)


def _speculation(
    con: duckdb.DuckDBPyConnection,
    spec: Spec,
    cfg: PinnedConfig,
    dialect: str,
    origins: dict[str, str],
) -> tuple[list[str], Path | None, int | None]:
    """The pinned configuration's speculative types, draft model file and K, with the origin
    of each flag they become (in `origins`)."""
    types = [t for t in cfg.spec_types if t != "none"]
    if "spec_type" in cfg.lines:
        origins[SpecFlag.TYPE] = str(cfg.field_where("spec_type"))
    else:
        origins[SpecFlag.TYPE] = (
            f"implied by {cfg.field_where('draft')}: {SpecFlag.DRAFT_MODEL} needs "
            f"{SpecFlag.TYPE} {SPEC_DRAFT_SIMPLE} in this dialect"
        )
    draft_path = None
    k = cfg.draft_max
    if cfg.draft is not None and any(t in DRAFT_MODEL_TYPES for t in types):
        draft_path, dwhy = _model_path(con, spec, cfg.draft)
        if draft_path is None:
            raise _Skip(f"draft: {dwhy}")
        draft_where = f"{cfg.field_where('draft')} -> {dwhy}"
        origins[SpecFlag.DRAFT_MODEL] = origins[CommonFlag.DRAFT_MODEL] = draft_where
        if k is None:
            k = DEFAULT_DRAFT_MAX[dialect]
            origins["k"] = f"not declared: llama.cpp's {dialect}-dialect default, stated explicitly"
    if "k" not in origins:
        origins["k"] = str(cfg.field_where("draft_max"))
    for f in (SpecFlag.DRAFT_N_MAX, DraftFlag.N_MAX, SpecFlag.NGRAM_MOD_N_MAX):
        origins[f] = origins["k"]
    origins[SpecFlag.NGRAM_MOD_N_MIN] = "specreg.runner: a quarter of draft_max"
    p_min_where = str(cfg.field_where("draft_p_min"))
    origins[SpecFlag.DRAFT_P_MIN] = origins[DraftFlag.P_MIN] = p_min_where
    return types, draft_path, k


def _expert_key(con: duckdb.DuckDBPyConnection, spec: Spec, role: RoleDecl) -> str:
    """The GGUF key that sets the target's experts per token (`--override-kv`)."""
    target = spec.model(role.target)
    disk = deps.model_by_id(con, target.id) if target else None
    expert_key = disk.expert_used_key if disk else None
    if not expert_key:
        raise _Skip(f"experts: {role.target} has no expert_used_count key in its GGUF")
    return expert_key


def _prefix(spec: Spec, host: Host) -> tuple[Flag, ...]:
    """What goes before llama-server: the declared numactl policy, else this host's."""
    if spec.llama.numa:
        where = str(spec.llama.field_where("numa"))
        return (Flag("numactl", None, where, ""), Flag(f"--{spec.llama.numa}", None, where, ""))
    if host.launch_prefix():
        why_numa = f"this host has {host.numa_nodes} NUMA nodes (specreg.runner)"
        return tuple(Flag(a, None, why_numa, "") for a in host.launch_prefix())
    return ()
