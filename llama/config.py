"""A speculative-decoding configuration and the llama-server flags that realise it.

`Config` is model-agnostic: the target and draft are passed to `server_argv` as paths, so the
recommender and the declarative registry can render the same configuration for any pair.
Request-time knobs (temperature, seed) live in `Config` too but go into the request body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specreg.errors import UsageError, param
from specreg.host.machine import Host
from specreg.llama.spec_stats import STATS_VERBOSITY
from specreg.llamacpp import (
    DIALECTS,
    K_FLAG,
    SERVER_HOST_DEFAULT,
    SERVER_PORT_DEFAULT,
    Dialect,
    Flag,
    ServerFlag,
    SpecFlag,
    Tool,
    reserved_server_flag,
)
from specreg.stacks import Stack, parse_stack
from specreg.terms import DRAFT_MODEL_TYPES as DRAFT_MODEL_TYPES
from specreg.terms import NGRAM_TYPES as NGRAM_TYPES

# The vocabulary is specreg.terms'; these names are importable from here too.
from specreg.terms import SPEC_MTP
from specreg.terms import SPEC_NONE as SPEC_NONE
from specreg.terms import SPEC_TYPES as SPEC_TYPES

if TYPE_CHECKING:  # a Config is read without a build or a server: keep its import light
    import duckdb

    from specreg.llama.install import LlamaInstall
    from specreg.llama.server import LlamaServer

DEFAULT_CTX = 4096
DEFAULT_SEED = 42


@dataclass(frozen=True)
class Config:
    """What to run: the speculative method and its knobs, the MoE budget, the sampler."""

    # One llama.cpp type or a stack of them (`ngram-mod,draft-simple`), kept in the order the
    # build tries them (specreg.stacks).
    spec_type: str = SPEC_NONE
    k: int | None = None  # max draft length of the stack's primary type (its K flag, K_FLAG)
    k_min: int | None = None
    p_min: float | None = None  # greedy drafting stops below this probability
    draft_threads: int | None = None
    experts: int | None = None  # MoE experts used per token (--override-kv)
    expert_key: str | None = None  # e.g. "qwen3moe.expert_used_count", from the registry
    temperature: float = 0.0
    seed: int = DEFAULT_SEED
    ctx: int = DEFAULT_CTX
    threads: int | None = None  # None: one per physical core of the host
    type_k: tuple[tuple[str, int], ...] = ()  # K of other types of a stack: (type, K)
    lookup_cache: str | None = None  # a static lookup cache file, read by ngram-cache
    # llama-server flags of the user's own (specreg.yaml, --server-arg), after specreg's; none
    # of RESERVED_SERVER_FLAGS (`user_server_args` checks them)
    server_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        stack = parse_stack(self.spec_type)  # a StackError (usage) says the build's rule
        object.__setattr__(self, "spec_type", stack.spelled)
        for spec_type, k in self.type_k:
            if not stack.has(spec_type):
                raise UsageError(
                    f"{param('type_k')} {spec_type}={k}: {spec_type} is not in the stack "
                    f"{stack.spelled}"
                )
            if K_FLAG.get(spec_type) is None:
                raise UsageError(
                    f"{param('type_k')} {spec_type}={k}: {spec_type} has no K in llama-server "
                    "(ngram-cache "
                    "drafts 8 tokens, hard-coded)"
                )
            if k < 1:
                raise UsageError(f"{param('type_k')} {spec_type}={k}: K must be at least 1")
        if self.lookup_cache is not None and not stack.uses_lookup_cache:
            raise UsageError(
                "a lookup cache is read by ngram-cache only: add ngram-cache to "
                f"{param('spec_type')} "
                f"(got {stack.spelled})"
            )
        if self.k is not None and self.k < 1:
            raise UsageError(f"{param('k')} must be at least 1, got {self.k}")
        if self.experts is not None and self.experts < 1:
            raise UsageError(f"{param('experts')} must be at least 1, got {self.experts}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"{param('threads')} must be at least 1, got {self.threads}")
        if self.temperature < 0:
            raise UsageError(f"{param('temperature')} must be >= 0, got {self.temperature}")

    @property
    def stack(self) -> Stack:
        return parse_stack(self.spec_type)

    @property
    def speculative(self) -> bool:
        return self.spec_type != SPEC_NONE

    @property
    def needs_draft(self) -> bool:
        return self.stack.needs_draft_file

    def k_of(self, spec_type: str) -> int | None:
        """The K given for one type of the stack: `type_k`, else `k` for the primary type."""
        given = dict(self.type_k)
        if spec_type in given:
            return given[spec_type]
        return self.k if spec_type == self.stack.primary else None

    def ngram_mod_bounds(self) -> tuple[int, int] | None:
        """(n_max, n_min) of its ngram-mod, as its argv spells them: n_min is its own K
        minimum where ngram-mod leads the stack, else a quarter of n_max. None: it has no
        ngram-mod with a K."""
        k = self.k_of("ngram-mod")
        if k is None:
            return None
        own = self.k_min is not None and self.stack.primary == "ngram-mod"
        return k, self.k_min if own and self.k_min is not None else max(1, k // 4)

    @property
    def behaviour_changing(self) -> bool:
        """Knobs that change the output distribution, unlike speculation itself."""
        return self.experts is not None or self.temperature > 0

    @property
    def lossless(self) -> bool:
        return not self.behaviour_changing

    @property
    def label(self) -> str:
        parts = [self.spec_type if self.speculative else "plain"]
        if self.k is not None:
            parts.append(f"k={self.k}")
        if self.p_min is not None:
            parts.append(f"p_min={self.p_min:g}")
        parts += [f"{t}:k={k}" for t, k in self.type_k]
        if self.lookup_cache is not None:
            parts.append(f"cache={Path(self.lookup_cache).stem}")
        if self.draft_threads is not None:
            parts.append(f"td={self.draft_threads}")
        if self.experts is not None:
            parts.append(f"experts={self.experts}")
        if self.temperature:
            parts.append(f"temp={self.temperature:g}")
        return " ".join(parts)

    def baseline(self) -> Config:
        """The full, plain reference: no speculation, all experts, greedy (on a server started
        with the same flags of the user's own)."""
        return Config(
            seed=self.seed, ctx=self.ctx, threads=self.threads, server_args=self.server_args
        )

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["type_k"] = dict(self.type_k)
        out["server_args"] = list(self.server_args)
        return out

    def request_fields(self) -> dict[str, Any]:
        """The sampler part, sent with every /completion request."""
        return {"temperature": self.temperature, "seed": self.seed}


def _spec_flags(config: Config, draft_path: Path | None, dialect: Dialect) -> list[str]:
    """The speculative part of the argv, spelled in `dialect`."""
    if not config.speculative:
        return []
    stack = config.stack
    if any(t not in dialect.server_spec_types for t in stack.types):
        raise UsageError(
            f"{config.spec_type} is not available in this llama.cpp's server (it predates "
            f"{SpecFlag.TYPE}): use a draft model, or llama.cpp from 2026 or later"
        )
    flags = list(dialect.spec_type_flags(stack.spelled))
    if stack.needs_draft_file or stack.has(SPEC_MTP) and draft_path is not None:
        flags += [dialect.draft_model, str(draft_path)]
    for spec_type in stack.types:
        k, flag = config.k_of(spec_type), dialect.k_flag.get(spec_type)
        bounds = config.ngram_mod_bounds() if spec_type == "ngram-mod" else None
        if bounds is not None:
            n_max, n_min = bounds
            flags += [SpecFlag.NGRAM_MOD_N_MAX, str(n_max), SpecFlag.NGRAM_MOD_N_MIN, str(n_min)]
        elif k is not None and flag is not None:
            flags += [flag, str(k)]
    if config.k_min is not None and stack.model_drafter is not None and dialect.draft_n_min:
        flags += [dialect.draft_n_min, str(config.k_min)]
    if config.p_min is not None and dialect.draft_p_min:
        flags += [dialect.draft_p_min, f"{config.p_min:g}"]
    if config.draft_threads is not None:
        flags += [dialect.draft_threads, str(config.draft_threads)]
    if config.lookup_cache is not None:
        flags += [Flag.LOOKUP_CACHE_STATIC, config.lookup_cache]
    return flags


def expert_flags(config: Config, missing_key: str) -> list[str]:
    """`--override-kv` for `config.experts` (nothing without it); `missing_key`: the usage
    error's tail when the target's expert-count key is unknown."""
    if config.experts is None:
        return []
    if not config.expert_key:
        raise UsageError(f"{param('experts')} needs the target's expert-count key{missing_key}")
    return [Flag.OVERRIDE_KV, f"{config.expert_key}=int:{config.experts}"]


def server_argv(
    config: Config,
    target_path: Path,
    draft_path: Path | None,
    dialect: str,
    host: Host,
) -> list[str]:
    """llama-server flags for `config` (no binary, address or port): reusable in any command."""
    if config.needs_draft and draft_path is None:
        raise UsageError(f"{config.spec_type} needs a draft model: pass {param('draft', 'PATH')}")
    if dialect not in DIALECTS:
        raise UsageError(f"unknown llama.cpp flag dialect {dialect!r}")
    threads = config.threads or host.threads
    argv = [Flag.MODEL, str(target_path), Flag.THREADS, str(threads), Flag.CTX, str(config.ctx)]
    argv += _spec_flags(config, draft_path, DIALECTS[dialect])
    argv += expert_flags(
        config, "; the target is not a MoE model in the registry (run `specreg scan` on it)"
    )
    return argv + list(config.server_args)


def server_command(
    config: Config,
    target_path: Path,
    draft_path: Path | None,
    dialect: str,
    host: Host,
    *,
    server: Path | str = Tool.SERVER,
    port: int | None = SERVER_PORT_DEFAULT,
    measuring: bool = True,
) -> list[str]:
    """The full command line a user would type: NUMA prefix, binary, address, flags.
    `port=None`: without --host/--port, which `LlamaServer` chooses when it starts the
    command. `measuring=False`: the command to show a user, without the log verbosity a
    measurement reads its figures from."""
    address: list[str] = []
    if port is not None:  # llama-server's default address, stated in the command
        address = [ServerFlag.HOST, SERVER_HOST_DEFAULT, ServerFlag.PORT, str(port)]
    return [
        *host.launch_prefix(),
        str(server),
        *address,
        # One slot: the runner sends one request at a time, and every slot costs KV memory.
        ServerFlag.PARALLEL,
        "1",
        ServerFlag.METRICS,
        # llama.cpp logs an applied override ("validate_override: Using metadata override")
        # and the n_expert_used it loaded only from verbosity 4 (~30 more lines a request),
        # so the run's log can show that --experts reached the model.
        # A stack's per-type statistics are logged at the same verbosity (runner/spec_stats.py).
        *(
            [Flag.VERBOSITY, str(STATS_VERBOSITY)]
            if measuring and (config.experts is not None or config.stack.stacked)
            else []
        ),
        *server_argv(config, target_path, draft_path, dialect, host),
    ]


def server_for(
    config: Config,
    target_path: Path,
    draft_path: Path | None,
    install: LlamaInstall,
    host: Host,
    *,
    log_path: Path,
    **options: Any,
) -> LlamaServer:
    """A llama-server of `install` running `config` (not started: enter it, and it picks its
    port and stops with the block). `options` are `LlamaServer`'s (timeouts, append_log)."""
    from specreg.llama.server import LlamaServer

    command = server_command(
        config, target_path, draft_path, install.dialect, host, server=install.server, port=None
    )
    return LlamaServer(command, env=host.env(), log_path=log_path, **options)


# --- the user's own llama-server flags ---------------------------------------------------


@dataclass(frozen=True)
class ServerArgs:
    """llama-server flags a user adds to specreg's, as given, and where they were given
    (`serve --server-arg`, a specreg.yaml key and line): shown beside the command they join."""

    args: tuple[str, ...]
    origin: str

    def to_json(self) -> dict[str, Any]:
        return {"args": list(self.args), "origin": self.origin}


def _is_flag(token: str) -> bool:
    """A flag, not a value: `-1` or `-0.5` are values (`--seed -1`)."""
    return token.startswith("-") and len(token) > 1 and not token[1:2].isdigit() and token[1] != "."


def user_server_args(tokens: Sequence[str], origin: str) -> ServerArgs:
    """`tokens` (each may hold several words: `--cache-type-k q8_0`) as llama-server flags of
    the user's own; a `UsageError` naming `origin` for a flag specreg writes itself
    (`specreg.llamacpp.RESERVED_SERVER_FLAGS`) or a value without its flag."""
    import shlex

    args: list[str] = []
    for token in tokens:
        try:
            args += shlex.split(token)
        except ValueError as err:
            raise UsageError(f"{origin}: {token!r} is not a flag list ({err})") from err
    if args and not _is_flag(args[0]):
        raise UsageError(f"{origin}: {args[0]!r} is a value without its flag (e.g. --mlock)")
    for arg in args:
        what = reserved_server_flag(arg) if _is_flag(arg) else None
        if what is not None:
            raise UsageError(
                f"{origin}: specreg sets {arg.split('=', 1)[0]} itself, {what}; leave it out"
            )
    return ServerArgs(tuple(args), origin)


# --- the context a server gets when none is given ----------------------------------------

# The share of the memory beside the weights a server's context (its KV cache) may take: the
# rest is the OS, the page cache of other models, and llama.cpp's compute buffers.
CTX_MEMORY_SHARE = 0.5
KV_BYTES = 2  # an f16 cache (llama.cpp's default --cache-type-k/-v)


def kv_bytes_per_token(arch: str | None, kv: Mapping[str, Any]) -> int | None:
    """Bytes of KV cache one token takes in every layer (f16), from the GGUF's attention keys;
    None where they do not say (a recurrent model's state does not grow with the context)."""
    if not arch:
        return None

    def key(name: str) -> Any:
        return kv.get(f"{arch}.{name}")

    layers, heads, width = key("block_count"), key("attention.head_count"), key("embedding_length")
    kv_heads = key("attention.head_count_kv")
    if kv_heads is None:
        kv_heads = heads
    if not isinstance(layers, int) or layers < 1 or kv_heads is None:
        return None
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    head = heads[0] if isinstance(heads, list) and heads else heads
    key_len, value_len = key("attention.key_length"), key("attention.value_length")
    if not isinstance(key_len, int) or not isinstance(value_len, int):
        if not isinstance(width, int) or not isinstance(head, int) or head < 1:
            return None
        key_len = value_len = width // head
    total = sum(int(n) * (key_len + value_len) for n in per_layer if isinstance(n, int))
    return total * KV_BYTES or None


@dataclass(frozen=True)
class ContextSize:
    """The context per request a server gets, why that many tokens, and the KV cache a token
    of it takes (f16, every layer; 0: unknown)."""

    tokens: int
    why: str
    kv_per_token: int = 0


def context_for(
    trained: int | None,
    kv_per_token: int | None,
    room_bytes: int | None,
    slots: int = 1,
) -> ContextSize:
    """The context per request when none is given: the model's trained context, as much of it
    as CTX_MEMORY_SHARE of the memory beside the weights (`room_bytes`) holds for `slots`
    requests, in steps of 1024 tokens; never below DEFAULT_CTX (what specreg ran before) unless
    the model was trained on less."""
    if not trained or trained < 1:
        return ContextSize(DEFAULT_CTX, f"the model states no trained context: {DEFAULT_CTX}")
    floor = min(DEFAULT_CTX, trained)
    if not kv_per_token or room_bytes is None:
        return ContextSize(trained, f"the model's trained context ({trained})")
    fits = int(max(room_bytes, 0) * CTX_MEMORY_SHARE) // (kv_per_token * max(slots, 1))
    fits = fits // 1024 * 1024
    if fits >= trained:
        return ContextSize(trained, f"the model's trained context ({trained}), which memory holds")
    if fits >= floor:
        return ContextSize(
            fits,
            f"as much of the trained {trained} as half the memory beside the weights holds "
            f"({kv_per_token} bytes of KV cache a token, {slots} slot(s))",
        )
    return ContextSize(
        floor,
        f"the least specreg gives: half the memory beside the weights holds {fits} tokens at "
        f"{kv_per_token} bytes a token for {slots} slot(s); give --ctx to choose",
    )


def model_context(
    con: duckdb.DuckDBPyConnection,
    target_id: str,
    draft_id: str | None,
    mem_bytes: int,
    slots: int = 1,
) -> ContextSize:
    """`context_for` the registry's target (its trained context and KV cache shape) on a host
    with `mem_bytes` of memory (0: unknown), beside the target's and the draft's weights."""
    from specreg.registry.queries import get_model, model_kv

    target = get_model(con, target_id)
    if target is None:
        return ContextSize(DEFAULT_CTX, f"the target is not in the registry: {DEFAULT_CTX}")
    kv = {key: value for key, _, value in model_kv(con, target_id)}
    draft = get_model(con, draft_id) if draft_id else None
    weights = (target.n_bytes or 0) + (draft.n_bytes or 0 if draft is not None else 0)
    room = mem_bytes - weights if mem_bytes > 0 else None
    per_token = kv_bytes_per_token(target.architecture, kv)
    found = context_for(target.context_length, per_token, room, slots)
    return replace(found, kv_per_token=per_token or 0)
