"""specreg's vocabulary: every name the parts share, each defined once.

Like gguf's `constants.py` for GGUF keys: tasks, speculative types and the method each belongs
to, policies, engines and the names of llama.cpp's flag dialects. The parts import these names;
nothing else spells them out. What llama.cpp itself takes and does (its flags per dialect, their
defaults, the state a type keeps between requests) is described in specreg.llamacpp.

"Family" has several meanings in this domain, so each has its own name here:

- architecture family (`arch_family`): GGUF `general.architecture` with MoE/VL suffixes folded,
  e.g. qwen3moe -> qwen3. The recommender's acceptance offsets are per architecture family.
- tokenizer family: models whose token texts are identical from id 5 on (the auditor's
  fingerprint); drafts and lookup caches are only ever offered within one.
- method (`Method`): how tokens are proposed: a draft model, n-grams, MTP heads, or none.
  Every llama.cpp speculative type belongs to one method (`METHOD_OF`).
"""

from __future__ import annotations

from enum import Enum

# --- tasks -------------------------------------------------------------------------------

# Prompt sets the runner ships and the recommender predicts for.
TASKS: tuple[str, ...] = ("code", "prose", "summarize", "json", "math", "chat")
# What a run with the user's own prompts, or a prior row without a task, is filed under.
TASK_CUSTOM = "custom"
TASK_UNKNOWN = "unknown"
# The user's own spellings, accepted wherever a task is: `--task general` is chat.
TASK_ALIASES: dict[str, str] = {"general": "chat", "mixed": "chat", "summary": "summarize"}
# What a command line accepts for --task (canonical names first).
TASK_CHOICES: tuple[str, ...] = (*TASKS, *TASK_ALIASES)


def canonical_task(task: str) -> str:
    """The canonical task for a task name or one of its aliases (unknown names unchanged)."""
    return TASK_ALIASES.get(task, task)


# --- speculative types (llama.cpp's own names, common/speculative.cpp) ---------------------

SPEC_NONE = "none"
SPEC_DRAFT_SIMPLE = "draft-simple"  # a draft model, the default with a draft
# Types that need a separate draft GGUF (`-md`).
DRAFT_MODEL_TYPES: tuple[str, ...] = (
    SPEC_DRAFT_SIMPLE,
    "draft-eagle3",
    "draft-dflash",
    "draft-dspark",
)
SPEC_MTP = "draft-mtp"  # the target's own NextN layers: no separate file
NGRAM_TYPES: tuple[str, ...] = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)
SPEC_TYPES: tuple[str, ...] = (SPEC_NONE, *DRAFT_MODEL_TYPES, SPEC_MTP, *NGRAM_TYPES)
# Types that draft with the one draft context llama.cpp loads (-md, or the target's MTP heads).
MODEL_DRAFTER_TYPES: tuple[str, ...] = (*DRAFT_MODEL_TYPES, SPEC_MTP)
# The order `common_speculative_init` (common/speculative.cpp) tries the enabled types in, each
# step, whatever order --spec-type lists them: prompt lookup first, a draft model as fallback.
SPEC_PRIORITY: tuple[str, ...] = (
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
    "draft-simple",
    "draft-eagle3",
    SPEC_MTP,
    "draft-dflash",
    "draft-dspark",
)


class Method(str, Enum):
    """How tokens are proposed. `NONE` is plain decoding (the baseline)."""

    NONE = "none"
    DRAFT = "draft"  # a separate draft model (llama.cpp draft-simple)
    NGRAM = "ngram"  # n-gram / prompt lookup, no draft model
    MTP = "mtp"  # the target's own multi-token-prediction heads (draft-mtp)


# The method every speculative type belongs to. EAGLE-3, DFlash and DSpark heads are draft
# models for this purpose (a separate file that proposes tokens).
METHOD_OF: dict[str, Method] = {
    SPEC_NONE: Method.NONE,
    **{t: Method.DRAFT for t in DRAFT_MODEL_TYPES},
    SPEC_MTP: Method.MTP,
    **{t: Method.NGRAM for t in NGRAM_TYPES},
}

# What a recorded figure stands for. First encounter: each timed sample on state that has not
# seen its prompt (what a user gets on first use). Warm: a server that answered other requests
# before (specreg serve, `run --warm`). Replay: a prompt timed again on a server that had
# answered it (recorded before the measurement protocol v2; not trusted for stateful types).
REGIME_FIRST = "first-encounter"
REGIME_WARM = "warm"
REGIME_REPLAY = "replay"
REGIMES: tuple[str, ...] = (REGIME_FIRST, REGIME_WARM, REGIME_REPLAY)


# The llama.cpp type the recommender proposes for each method.
DEFAULT_TYPE_OF: dict[Method, str] = {
    Method.NONE: SPEC_NONE,
    Method.DRAFT: "draft-simple",
    Method.NGRAM: "ngram-mod",
    Method.MTP: SPEC_MTP,
}

# --- policies ----------------------------------------------------------------------------

POLICY_QUALITY = "quality"  # lossless knobs only
POLICY_SPEED = "speed"  # may change outputs (fewer experts)
POLICIES: tuple[str, ...] = (POLICY_QUALITY, POLICY_SPEED)

# --- engines: which llama.cpp program measures a configuration ---------------------------

ENGINE_AUTO = "auto"  # llama-server when it supports the method, else the legacy tool
ENGINE_SERVER = "server"
ENGINE_LEGACY = "legacy"  # llama-speculative / llama-lookup
ENGINES: tuple[str, ...] = (ENGINE_AUTO, ENGINE_SERVER, ENGINE_LEGACY)

# --- measurement defaults: every run, sweep and tune, and their command-line options ------

DEFAULT_N_PREDICT = 64  # tokens generated per prompt in a timed sample
DEFAULT_REPEATS = 3  # timed samples per prompt
STARTUP_TIMEOUT_S = 180.0  # seconds llama-server may take to load and answer /health
DEFAULT_RETRIES = 2  # a sample other processes disturbed is taken again up to this often
# serve --policy adaptive: served requests of a task between two lookup caches grown from them
TRAFFIC_CACHE_EVERY = 24

# --- llama.cpp flag dialects (their flags and defaults: specreg.llamacpp) -----------------

# 2026 builds: `--spec-type T` selects the method, `--spec-draft-n-max K` its draft length;
# `-md` alone does nothing and the old `--draft*` flags are hard errors.
DIALECT_SPEC_TYPE = "spec-type"
# 2024-2025 builds: `-md` enables draft-model speculation, `--draft-max/--draft-min/
# --draft-p-min` tune it; n-gram speculation lives only in `llama-lookup`.
DIALECT_DRAFT_MAX = "draft-max"
DIALECTS: tuple[str, ...] = (DIALECT_SPEC_TYPE, DIALECT_DRAFT_MAX)
# specreg.yaml's names for the two (`llama.dialect: current | legacy`, or auto), kept because
# users' files already say them.
DIALECT_CURRENT = "current"
DIALECT_LEGACY = "legacy"
SPEC_FILE_DIALECTS: dict[str, str] = {
    DIALECT_CURRENT: DIALECT_SPEC_TYPE,
    DIALECT_LEGACY: DIALECT_DRAFT_MAX,
}
# What specreg.yaml and `export --dialect` accept: a dialect, or the one of the found build.
DIALECT_AUTO = "auto"
DIALECT_CHOICES: tuple[str, ...] = (DIALECT_AUTO, *DIALECTS)

# --- architecture families ---------------------------------------------------------------

# Architecture families with their own acceptance offset in the recommender (drafts trained
# alongside their targets, as in the Qwen2.5 line, agree more); every other family is "other".
ARCH_FAMILIES: tuple[str, ...] = ("qwen2", "qwen3", "llama", "gemma3", "other")


def arch_family(architecture: str | None) -> str:
    """Fold a GGUF architecture to its family: qwen3moe/qwen3vl -> qwen3, qwen2vl -> qwen2."""
    arch = (architecture or "").lower()
    for suffix in ("vlmoe", "moe", "vl"):
        if arch.endswith(suffix) and len(arch) > len(suffix):
            return arch[: -len(suffix)]
    return arch
