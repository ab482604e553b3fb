"""The report's data model: plain frozen dataclasses gathered once, then rendered.

Nothing here knows about HTML. Every string that came from a GGUF file (names, paths, token
texts, tokenizer names) stays a plain `str`; escaping is the templates' job (autoescape on).
Such strings are unbounded (a 10 MB `general.name` is a valid GGUF), so what a page shows is
cut to a display length (`TEXT_MAX_CHARS`; names `NAME_MAX_CHARS`); the full values stay in
the registry and in `--json` output.
Numbers stay raw (bytes as int, tokens/s as float); strings for people are properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from specreg.registry.queries import ModelRecord, ScanRecord, human_bytes, human_count
from specreg.registry.run_store import STATUS_OK
from specreg.text import clip

# Display lengths of untrusted text in the report. Any string a page shows is cut to
# TEXT_MAX_CHARS; a model's name (repeated on many pages, in the matrix and the graph) to
# NAME_MAX_CHARS; the few long texts worth reading whole get their own bound.
TEXT_MAX_CHARS = 1_000
NAME_MAX_CHARS = 200
CHAT_TEMPLATE_MAX_CHARS = 64_000  # real templates reach ~20 KB
COMMAND_MAX_CHARS = 16_000  # a command line holds up to three paths of PATH_MAX (4096) each

# Verdict codes used in the matrix and its CSS classes (v0..v4). 0: no verdict for the pair
# (not audited, or a model paired with itself).
VERDICT_CODES: dict[str, int] = {
    "compatible": 1,
    "compatible-with-warnings": 2,
    "passes-llama-check-risky": 3,
    "incompatible": 4,
}
VERDICT_LABELS: dict[int, str] = {
    0: "no verdict (same model)",
    1: "compatible",
    2: "compatible with warnings",
    3: "passes llama.cpp's check, risky at run time",
    4: "incompatible",
}


@dataclass(frozen=True)
class PartStatus:
    """Whether one part of specreg contributed to the report, and if not, why."""

    part: str
    available: bool
    note: str = ""  # what is missing, shown as a note
    detail: str = ""  # what it was made with (e.g. which llama.cpp rules), shown as fine print


@dataclass(frozen=True)
class TokFamily:
    """Models whose token texts are identical from id 5 on (same tokenizer fingerprint)."""

    key: str  # the fingerprint, or "unknown"
    index: int  # stable small number: colour and short label
    tok_model: str | None
    tok_pre: str | None
    n_tokens: int | None
    model_ids: tuple[str, ...]

    @property
    def label(self) -> str:
        kind = "/".join(x for x in (self.tok_model, self.tok_pre) if x) or "no tokenizer"
        size = f"{self.n_tokens:,} tokens" if self.n_tokens else "? tokens"
        return f"{kind} · {size}"


@dataclass(frozen=True)
class ModelView:
    record: ModelRecord
    family: int  # TokFamily.index
    page: str  # file name of the model's target page

    @property
    def model_id(self) -> str:
        return self.record.model_id or ""

    @property
    def name(self) -> str:
        """The name to show (cut to NAME_MAX_CHARS)."""
        return clip(self.record.display_name, NAME_MAX_CHARS)

    @property
    def n_params(self) -> int:
        return self.record.n_params or 0

    @property
    def params_str(self) -> str:
        return human_count(self.record.n_params)

    @property
    def size_str(self) -> str:
        return human_bytes(self.record.n_bytes)


@dataclass(frozen=True)
class ProblemView:
    path: str
    reason: str


@dataclass(frozen=True)
class PairView:
    target_id: str
    draft_id: str
    code: int  # VERDICT_CODES
    reason: str  # the first failing check that decides the verdict, with its numbers
    remedies: tuple[str, ...]
    spec_type: str | None
    flags: tuple[str, ...] = ()  # what llama-server needs for this draft (auditor's rules)

    @property
    def compatible(self) -> bool:
        return self.code in (1, 2)


@dataclass(frozen=True)
class Matrix:
    """Targets by drafts. `codes[i][j]` is the verdict code of targets[i] with drafts[j]."""

    targets: tuple[str, ...]  # model ids, largest first
    drafts: tuple[str, ...]  # model ids, smallest first
    codes: tuple[str, ...]  # one string of digits per target row
    reasons: tuple[str, ...]  # distinct reason texts
    reason_index: tuple[tuple[int, ...], ...]  # per row, per column; -1 when none

    @property
    def n_cells(self) -> int:
        return len(self.targets) * len(self.drafts)


@dataclass(frozen=True)
class RunView:
    run_id: int
    kind: str  # run | baseline | verify
    status: str  # ok | failed
    started_at: datetime | None
    target_id: str | None
    draft_id: str | None
    config: str  # the runner's label: "draft-simple K=16", "baseline", ...
    spec_type: str  # "none" for plain decoding
    k: int | None
    task: str | None
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    speedup: float | None
    acceptance: float | None  # 0..1
    verdict: str | None  # verification verdict: pass | fail
    detail: str  # the verdict's reason, or the failure's message
    host: str | None
    experts: int | None = None  # the MoE expert override; None: the model's default

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def is_baseline(self) -> bool:
        return self.spec_type in ("none", "baseline")

    @property
    def outcome(self) -> str:
        """One word for the runs table: the verification verdict, else ok or failed."""
        return self.verdict or self.status


@dataclass(frozen=True)
class RecView:
    task: str
    label: str
    predicted_tps: float | None
    predicted_low: float | None
    predicted_high: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    command: str
    lossless: bool
    why: tuple[str, ...]
    advice: tuple[str, ...]
    measured_tps: float | None  # this host's runs of exactly this configuration (median)


@dataclass(frozen=True)
class Roofline:
    bound_tps: float | None  # plain decoding bound from memory bandwidth and model bytes
    bandwidth_gbs: float | None
    measured_baseline_tps: float | None
    predicted_baseline_tps: float | None = None  # the recommender's, when none was measured
    bandwidth_source: str = ""  # user | estimate | reference

    @property
    def fraction(self) -> float | None:
        if self.bound_tps and self.measured_baseline_tps:
            return self.measured_baseline_tps / self.bound_tps
        return None


@dataclass(frozen=True)
class FrontierPoint:
    """One configuration on the speed / quality-cost plane of a target.

    Quality cost is the mean KL divergence from the target at its defaults (0 for itself);
    each axis says whether it was measured (`specreg quality`, runs) or predicted.
    """

    label: str
    mean_kld: float
    kld_measured: bool
    tokens_per_s: float | None
    speed_measured: bool
    same_top: float | None = None
    on_frontier: bool = False

    @property
    def measured(self) -> bool:
        return self.kld_measured and self.speed_measured


@dataclass(frozen=True)
class TargetView:
    model: ModelView
    drafts: tuple[PairView, ...]  # compatible (or with warnings) drafts, best first
    rejected: int  # drafts audited and not usable
    recommendations: tuple[RecView, ...]
    rec_note: str  # why there are none, when there are none
    runs: tuple[RunView, ...]
    roofline: Roofline | None
    plot_svg: str  # speed and acceptance against K per task, or "" when nothing was measured
    chat_template: str | None
    frontier: tuple[FrontierPoint, ...] = ()  # lossy options: speed against quality cost
    frontier_svg: str = ""
    # models llama.cpp would take as drafts, as large as the target or larger: no drafts
    not_drafts: tuple[tuple[PairView, str], ...] = ()  # with `auditor.not_a_draft`'s reason


@dataclass(frozen=True)
class SiteData:
    generated_at: datetime
    db_path: str
    models: tuple[ModelView, ...]
    families: tuple[TokFamily, ...]
    scans: tuple[ScanRecord, ...]
    problems: tuple[ProblemView, ...]
    parts: tuple[PartStatus, ...]
    pairs: tuple[PairView, ...]
    matrix: Matrix | None
    graph_svg: str
    graph_edges: int
    targets: tuple[TargetView, ...]
    runs: tuple[RunView, ...]
    # ordered pairs per verdict as `specreg audit` counts them (every model with every other)
    audit_counts: Mapping[str, int] = field(default_factory=dict)

    def part(self, name: str) -> PartStatus:
        for p in self.parts:
            if p.part == name:
                return p
        return PartStatus(name, False, "not gathered")


@dataclass(frozen=True)
class SiteResult:
    JSON_KIND = "report"
    JSON_VERSION = "2"  # 2: n_pairs counts every ordered pair, as `specreg audit` does

    out_dir: Path
    pages: tuple[Path, ...]
    n_models: int
    n_pairs: int  # ordered (target, draft) pairs audited, as `specreg audit` counts them
    n_runs: int
    n_plots: int
    n_plots_cached: int
    seconds: float
    seconds_gather: float
    parts: tuple[PartStatus, ...]

    @property
    def index(self) -> Path:
        return self.out_dir / "index.html"

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        keys = ("out_dir", "pages", "n_models", "n_pairs", "n_runs", "n_plots", "seconds", "parts")
        payload = {"index": self.index, **{k: getattr(self, k) for k in keys}}
        return document(self.JSON_KIND, self.JSON_VERSION, payload)
