"""What the recommender knows about one configuration, and its numeric feature vector.

A configuration is a target model, an optional draft, the knobs (method, K, n-gram size,
temperature, experts) and the host. Every field is a fact from the registry (or, for the shipped
prior, the same fact derived from the data set's columns) - never a model name. The column order
of `FEATURES` is the contract between `feature_matrix` and the estimator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np


class Method(str, Enum):
    """How tokens are proposed. `NONE` is plain decoding (the baseline)."""

    NONE = "none"
    DRAFT = "draft"  # a separate draft model (llama.cpp draft-simple)
    NGRAM = "ngram"  # n-gram / prompt lookup (llama.cpp ngram-mod), no draft model
    MTP = "mtp"  # the target's own multi-token-prediction heads (draft-mtp)


TASKS: tuple[str, ...] = ("code", "prose", "summarize", "json", "math", "chat", "unknown")

# Architecture families with their own acceptance offset (drafts trained alongside their
# targets, as in the Qwen2.5 line, agree more); every other family shares "other".
FAMILIES: tuple[str, ...] = ("qwen2", "qwen3", "llama", "gemma3", "other")

# Tokenizer relation between draft and target, ordered from safest to loosest.
TOK_RELATIONS: tuple[str, ...] = ("identical", "padding-only", "pre-tokenizer-differs", "unknown")

# The reference host the shipped prior was measured on (data/PROVENANCE.md).
REFERENCE_BANDWIDTH_GBS = 460.0
REFERENCE_CORES = 96


@dataclass(frozen=True)
class ConfigFacts:
    """One configuration to predict for. Sizes are GB (1e9 bytes), parameters billions."""

    # host
    bandwidth_gbs: float
    physical_cores: int
    # target
    target_params_b: float
    target_active_b: float
    target_bpw: float
    target_gb: float  # whole file
    target_family: str  # GGUF general.architecture, with MoE/VL suffixes folded (`family_of`)
    target_is_moe: bool
    target_is_hybrid: bool
    default_experts: int  # 0 when not MoE
    # knobs
    method: Method
    k: int  # draft length (llama.cpp --spec-draft-n-max / --spec-ngram-mod-n-max); 0 if none
    experts: int  # experts used per token; == default_experts unless reduced
    temperature: float
    task: str
    ngram_n: int = 0  # n-gram match length for NGRAM
    # draft (zeros when method is not DRAFT)
    draft_params_b: float = 0.0
    draft_bpw: float = 0.0
    draft_gb: float = 0.0
    draft_family: str = ""
    tok_relation: str = "unknown"
    # the target's measured plain-decoding speed on this host, if known (NaN otherwise)
    baseline_tps: float = math.nan

    @property
    def target_read_gb(self) -> float:
        """GB read per decoded token at the default expert count (active share of the file)."""
        if self.target_is_moe and self.target_params_b > 0:
            return self.target_gb * min(1.0, self.target_active_b / self.target_params_b)
        return self.target_gb

    @property
    def experts_ratio(self) -> float:
        if not self.target_is_moe or self.default_experts <= 0 or self.experts <= 0:
            return 1.0
        return self.experts / self.default_experts

    @property
    def same_family(self) -> bool:
        return bool(self.draft_family) and self.draft_family == self.target_family

    @property
    def behaviour_changing(self) -> tuple[str, ...]:
        """Knobs that change what the model outputs (as opposed to how fast)."""
        out = []
        if self.experts_ratio < 1.0:
            out.append("experts")
        return tuple(out)

    def with_(self, **changes: object) -> ConfigFacts:
        return replace(self, **changes)  # type: ignore[arg-type]


def family_of(architecture: str | None) -> str:
    """Fold GGUF architecture names to a family: qwen3moe/qwen3vl -> qwen3, qwen2vl -> qwen2."""
    arch = (architecture or "").lower()
    for suffix in ("vlmoe", "moe", "vl"):
        if arch.endswith(suffix) and len(arch) > len(suffix):
            arch = arch[: -len(suffix)]
            break
    return arch


FEATURES: tuple[str, ...] = (
    "bandwidth_gbs",
    "physical_cores",
    "target_params_b",
    "target_active_b",
    "target_bpw",
    "target_read_gb",
    "target_is_moe",
    "target_is_hybrid",
    "experts_ratio",
    "is_draft",
    "is_ngram",
    "is_mtp",
    "k",
    "ngram_n",
    "temperature",
    "draft_params_b",
    "draft_bpw",
    "draft_gb",
    "same_family",
    "tok_same_tokens",
    "tok_pre_differs",
    "log_size_ratio",
    "baseline_tps",
    *(f"task_{t}" for t in TASKS),
    *(f"family_{f}" for f in FAMILIES),
)
COL = {name: i for i, name in enumerate(FEATURES)}


def feature_row(c: ConfigFacts) -> list[float]:
    draft = c.method is Method.DRAFT
    ratio = math.log(max(c.draft_params_b, 1e-3) / max(c.target_active_b, 1e-3)) if draft else 0.0
    task = c.task if c.task in TASKS else "unknown"
    return [
        float(c.bandwidth_gbs),
        float(c.physical_cores),
        float(c.target_params_b),
        float(c.target_active_b),
        float(c.target_bpw),
        float(c.target_read_gb),
        float(c.target_is_moe),
        float(c.target_is_hybrid),
        float(c.experts_ratio),
        float(draft),
        float(c.method is Method.NGRAM),
        float(c.method is Method.MTP),
        float(c.k if c.method is not Method.NONE else 0),
        float(c.ngram_n if c.method is Method.NGRAM else 0),
        float(c.temperature),
        float(c.draft_params_b if draft else 0.0),
        float(c.draft_bpw if draft else 0.0),
        float(c.draft_gb if draft else 0.0),
        float(draft and c.same_family),
        # padding-only differences leave every real token equal: same as identical for speed
        float(draft and c.tok_relation in ("identical", "padding-only")),
        float(draft and c.tok_relation == "pre-tokenizer-differs"),
        ratio,
        float(c.baseline_tps),
        *(float(task == t) for t in TASKS),
        *(float(family_slot(c.target_family) == f) for f in FAMILIES),
    ]


def family_slot(family: str) -> str:
    return family if family in FAMILIES else "other"


def feature_matrix(configs: Iterable[ConfigFacts]) -> np.ndarray:
    rows = [feature_row(c) for c in configs]
    if not rows:
        return np.empty((0, len(FEATURES)))
    return np.asarray(rows, dtype=float)


def column(X: np.ndarray, name: str) -> np.ndarray:
    return X[:, COL[name]]


def task_index(X: np.ndarray) -> np.ndarray:
    """Index into TASKS for every row."""
    start = COL[f"task_{TASKS[0]}"]
    return np.argmax(X[:, start : start + len(TASKS)], axis=1)


def family_index(X: np.ndarray) -> np.ndarray:
    """Index into FAMILIES for every row."""
    start = COL[f"family_{FAMILIES[0]}"]
    return np.argmax(X[:, start : start + len(FAMILIES)], axis=1)
