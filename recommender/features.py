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

import numpy as np

from specreg.host.facts import REFERENCE_BANDWIDTH_GBS as REFERENCE_BANDWIDTH_GBS
from specreg.host.facts import REFERENCE_CORES as REFERENCE_CORES
from specreg.terms import ARCH_FAMILIES, TASK_UNKNOWN, TASKS, Method

# The task slots of a feature row: every task the runner ships, then one for rows whose task is
# not known (prior rows that do not say, the user's own prompts).
TASK_SLOTS: tuple[str, ...] = (*TASKS, TASK_UNKNOWN)

# Tokenizer relation between draft and target, ordered from safest to loosest.
TOK_RELATIONS: tuple[str, ...] = ("identical", "padding-only", "pre-tokenizer-differs", "unknown")


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
    target_arch_family: str  # `terms.arch_family` of GGUF general.architecture
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
    draft_arch_family: str = ""
    tok_relation: str = "unknown"
    # the target's measured plain-decoding speed on this host, if known (NaN otherwise)
    baseline_tps: float = math.nan
    # this host's calibration (`specreg calibrate`: llama-bench), NaN where not calibrated
    verify_ratio: float = math.nan  # target: a pass over K + 1 tokens / a pass over 1 token
    target_step_s: float = math.nan  # target: seconds per plainly generated token
    draft_step_ratio: float = math.nan  # draft's seconds per generated token / the target's
    draft_pass_ratio: float = math.nan  # draft: its pass over the K + 1 verified tokens / 1
    draft_n_vocab: int = 0  # draft: its vocabulary (llama-server samples every drafted token)
    pass_factor: float = math.nan  # llama-server's step / llama-bench's, measured by calibrate
    # the target's output layer (vocabulary x embedding) as a share of its weights: a verify
    # pass computes a logits row per position, llama-bench's passes only the last one
    output_share: float = 0.0
    # Beyond one type per method (not features: the model scores the method; recommend keeps
    # each as a K curve of its own, moved only by this host's runs of it; recommender/stacks.py)
    stack: str = ""  # llama.cpp's --spec-type when it is not the method's default type
    lookup_cache: str = ""  # the `specreg lookup-cache` ngram-cache reads

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
    def same_arch_family(self) -> bool:
        return bool(self.draft_arch_family) and self.draft_arch_family == self.target_arch_family

    @property
    def behaviour_changing(self) -> tuple[str, ...]:
        """Knobs that change what the model outputs (as opposed to how fast)."""
        out = []
        if self.experts_ratio < 1.0:
            out.append("experts")
        return tuple(out)

    def with_(self, **changes: object) -> ConfigFacts:
        return replace(self, **changes)  # type: ignore[arg-type]


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
    "same_arch_family",
    "tok_same_tokens",
    "tok_pre_differs",
    "log_size_ratio",
    "baseline_tps",
    "verify_ratio",
    "target_step_s",
    "draft_step_ratio",
    "draft_pass_ratio",
    "draft_n_vocab",
    "pass_factor",
    "output_share",
    *(f"task_{t}" for t in TASK_SLOTS),
    *(f"arch_{f}" for f in ARCH_FAMILIES),
)
COL = {name: i for i, name in enumerate(FEATURES)}


def feature_row(c: ConfigFacts) -> list[float]:
    draft = c.method is Method.DRAFT
    ratio = math.log(max(c.draft_params_b, 1e-3) / max(c.target_active_b, 1e-3)) if draft else 0.0
    task = c.task if c.task in TASKS else TASK_UNKNOWN
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
        float(draft and c.same_arch_family),
        # padding-only differences leave every real token equal: same as identical for speed
        float(draft and c.tok_relation in ("identical", "padding-only")),
        float(draft and c.tok_relation == "pre-tokenizer-differs"),
        ratio,
        float(c.baseline_tps),
        float(c.verify_ratio if c.method is not Method.NONE else math.nan),
        float(c.target_step_s),
        float(c.draft_step_ratio if draft else math.nan),
        float(c.draft_pass_ratio if draft else math.nan),
        float(c.draft_n_vocab if draft else 0),
        float(c.pass_factor),
        float(c.output_share),
        *(float(task == t) for t in TASK_SLOTS),
        *(float(arch_slot(c.target_arch_family) == f) for f in ARCH_FAMILIES),
    ]


def arch_slot(family: str) -> str:
    """The architecture family's own acceptance slot, or the shared "other"."""
    return family if family in ARCH_FAMILIES else "other"


def feature_matrix(configs: Iterable[ConfigFacts]) -> np.ndarray:
    rows = [feature_row(c) for c in configs]
    if not rows:
        return np.empty((0, len(FEATURES)))
    return np.asarray(rows, dtype=float)


def column(X: np.ndarray, name: str) -> np.ndarray:
    return X[:, COL[name]]


def task_index(X: np.ndarray) -> np.ndarray:
    """Index into TASK_SLOTS for every row."""
    start = COL[f"task_{TASK_SLOTS[0]}"]
    return np.argmax(X[:, start : start + len(TASK_SLOTS)], axis=1)


def arch_index(X: np.ndarray) -> np.ndarray:
    """Index into terms.ARCH_FAMILIES for every row."""
    start = COL[f"arch_{ARCH_FAMILIES[0]}"]
    return np.argmax(X[:, start : start + len(ARCH_FAMILIES)], axis=1)
