"""The shipped prior: measured runs from the reference host, as `Observation`s.

Two data sets live in `data/` (see data/PROVENANCE.md): the research reports' figures
(seed_runs.csv) and the K sweeps (epyc_sweeps.csv, MIT, see NOTICE-epyc-inference-research). The
rows name models; the recommender must see facts, so this module turns each row into the same
`ConfigFacts` the registry would give: parameter counts from the size label (`30B-A3B`), bytes
per weight from the quant or from file size / parameters, the GGUF architecture family, MoE and
hybrid flags. Name parsing happens here and only here, on this fixed data set.

Messy rows are kept as evidence, not repaired: conflicting figures stay (the fit uses a robust
loss), copied rows (the same figures under several roles) are kept once, failed and
other-hardware rows are left out with a reason.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from specreg.errors import SpecregError
from specreg.recommender.features import REFERENCE_BANDWIDTH_GBS, REFERENCE_CORES, ConfigFacts
from specreg.recommender.quant import bits_per_weight
from specreg.terms import Method, arch_family, canonical_task

DATA_VERSION = "1"
REFERENCE_HOST = "reference:epyc-9655"
DIGESTS = {
    "seed_runs.csv": "7105dfdaeeda91bd3b6317e0cef298523d9ae66205d9b55bdd95384831477510",
    "epyc_sweeps.csv": "3378e59e005a5ab268834a87ed9f10017cb2ad7b71f472674531815d1102971d",
    "epyc_sweeps_bestk.csv": "905420fcfb21dffccb0dbdd2eb7c4ced910caeb9f8c21bf97d7bc8bfb42106f5",
}
# llama.cpp build 7371's default draft length, used for prompt-lookup rows that do not state K.
PRIOR_NGRAM_K = 16
# The reports' targets are Q4_K_M unless a row says otherwise.
ASSUMED_QUANT = "Q4_K_M"
# Default experts per token by architecture, for rows that reduce experts without saying from what
# (GGUF `{arch}.expert_used_count` of the public models).
_DEFAULT_EXPERTS = {"qwen3moe": 8, "qwen3vlmoe": 8, "qwen3next": 10, "glm4moe": 8}


class PriorDataError(SpecregError):
    """A shipped data file is missing or differs from the version this code was written for."""


@dataclass(frozen=True)
class Observation:
    """One measured configuration: what was run, how fast, and where the figure comes from."""

    config: ConfigFacts
    tps: float  # measured decode tokens/s
    source: str  # "seed" | "sweep" | "local"
    row_id: str  # provenance within the source
    group: str  # the target model, for grouped cross-validation
    host: str = REFERENCE_HOST
    series: str | None = None  # K-sweep series (target, draft, experts) for sweep rows
    acceptance: float | None = None  # llama.cpp accepted/drafted, as a fraction
    note: str = ""
    target_name: str = ""  # the target as the source names it
    draft_name: str = ""  # ... and the draft ("" without one)
    draft_key: str = ""  # the draft's identity across sources (`model_key`), or its model id
    quant: str = ""  # the target's quant (Q4_K_M), "" when unknown
    draft_quant: str = ""
    # accepted/drafted as the source reports it for any method (`acceptance` is kept for draft
    # rows only, which the fit reads): what the bound of speculation is checked with
    reported_acceptance: float | None = None

    @property
    def speedup(self) -> float:
        return self.tps / self.config.baseline_tps if self.config.baseline_tps > 0 else math.nan


@dataclass(frozen=True)
class PriorData:
    observations: tuple[Observation, ...]
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (row id, reason)
    version: str = DATA_VERSION


# ---------------------------------------------------------------------------------------------
# facts from names (prior data only)

_TOTAL = re.compile(r"(?i)(?:^|[-_. ])(\d+(?:\.\d+)?)b(?=$|[-_. ])")
_ACTIVE = re.compile(r"(?i)(?:^|[-_. ])a(\d+(?:\.\d+)?)b(?=$|[-_. ])")
_QUANT = re.compile(r"(?i)(?:^|[-_.])(i?q\d(?:_[a-z0-9]+)*|f16|fp16|bf16|f32)(?=$|[-_.])")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}$")
# ordered: the first pattern that matches names the GGUF architecture
_ARCH_RULES: tuple[tuple[str, str], ...] = (
    (r"qwen3-next", "qwen3next"),
    (r"qwen3[-_]?vl.*a\d+b", "qwen3vlmoe"),
    (r"qwen3[-_]?vl", "qwen3vl"),
    (r"qwen3.*a\d+b", "qwen3moe"),
    (r"qwen3", "qwen3"),
    (r"qwen2\.5[-_]?vl", "qwen2vl"),
    (r"qwen2|distill-qwen|xlam-2", "qwen2"),
    (r"gemma-?3", "gemma3"),
    (r"phi-?4", "phi3"),
    (r"glm", "glm4moe"),
    (r"mamba", "mamba"),
    (r"llama|nexusraven|xlam", "llama"),
)
_HYBRID = {"qwen3next", "ssm_moe_hybrid"}


def _arch_of_name(name: str) -> str:
    """The GGUF architecture a model name implies (prior data only)."""
    low = name.lower()
    for pattern, arch in _ARCH_RULES:
        if re.search(pattern, low):
            return arch
    return "unknown"


def _sizes(name: str) -> tuple[float | None, float | None]:
    total = next((float(m) for m in _TOTAL.findall(name)), None)
    active = next((float(m) for m in _ACTIVE.findall(name)), None)
    return total, active


def _quant_of(name: str) -> str | None:
    found = _QUANT.findall(name)
    return found[-1].upper() if found else None


def _stem(file_name: str) -> str:
    stem = file_name.removesuffix(".gguf")
    return _SPLIT.sub("", stem)


def model_key(name: str) -> str:
    """A model's identity across sources, from its file or display name: lower case, words
    joined by "-", without quant, split or chat suffix ("Qwen2.5 Coder 32B Instruct" and
    "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf" are both "qwen2.5-coder-32b")."""
    return _group("-".join(name.split()))


def _group(name: str) -> str:
    """A target's identity across sources: lower-case name without quant, split or chat suffix."""
    stem = _stem(name)
    quant = _quant_of(stem)
    if quant:
        stem = re.sub(rf"(?i)[-_.]{re.escape(quant)}$", "", stem)
    stem = re.sub(r"(?i)[-_.](i1)$", "", stem)
    stem = re.sub(r"(?i)[-_](instruct|it)(?=$|[-_])", "", stem)
    return stem.lower()


def _num(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def parse_speedup(text: str) -> float | None:
    """The reports' wording: `10.0x`, `+48%`, `3.4x vs Q8_0` (a different baseline: None)."""
    t = (text or "").strip()
    if not t or "vs" in t:
        return None
    m = re.fullmatch(r"([0-9.]+)\s*x", t)
    if m:
        return float(m[1])
    m = re.fullmatch(r"([+-][0-9.]+)\s*%", t)
    if m:
        return 1.0 + float(m[1]) / 100.0
    return None


# ---------------------------------------------------------------------------------------------
# reading


def _rows(name: str) -> list[dict[str, str]]:
    ref = resources.files("specreg.recommender").joinpath("data").joinpath(name)
    try:
        raw = ref.read_bytes()
    except FileNotFoundError as err:
        raise PriorDataError(f"shipped data file {name} is missing: reinstall specreg") from err
    if hashlib.sha256(raw).hexdigest() != DIGESTS[name]:
        raise PriorDataError(
            f"shipped data file {name} differs from data version {DATA_VERSION}: "
            "update DIGESTS and PROVENANCE.md together with the file"
        )
    return list(csv.DictReader(raw.decode("utf-8").splitlines()))


def _target(
    name: str,
    params: float | None,
    active: float | None,
    quant: str | None,
    size_gb: float | None,
    arch: str,
) -> dict[str, object] | None:
    label_total, label_active = _sizes(_stem(name))
    params = params or label_total
    quant = quant or _quant_of(_stem(name)) or ASSUMED_QUANT
    bpw = bits_per_weight(quant)
    if params is None and size_gb and bpw:
        params = size_gb * 8 / bpw
    if params is None:
        return None
    active = active or label_active or params
    if size_gb is None:
        if bpw is None:
            return None
        size_gb = params * bpw / 8
    bpw = size_gb * 8 / params
    is_moe = active < params or "moe" in arch
    return {
        "target_params_b": params,
        "target_active_b": active,
        "target_bpw": bpw,
        "target_gb": size_gb,
        "target_arch_family": arch_family(arch),
        "target_is_moe": is_moe,
        "target_is_hybrid": arch in _HYBRID,
        "default_experts": _DEFAULT_EXPERTS.get(arch, 8) if is_moe else 0,
    }


def _draft(
    name: str, params: float | None, quant: str | None, size_gb: float | None
) -> dict[str, object] | None:
    label_total, _ = _sizes(_stem(name))
    params = params or label_total
    bpw = bits_per_weight(quant or _quant_of(name))
    if params is None:
        return None
    if size_gb is None:
        if bpw is None:
            bpw = 8.5  # the reports' drafts are Q8_0 unless stated
        size_gb = params * bpw / 8
    return {
        "draft_params_b": params,
        "draft_bpw": size_gb * 8 / params,
        "draft_gb": size_gb,
        "draft_arch_family": arch_family(_arch_of_name(name)),
    }


_HOST = {"bandwidth_gbs": REFERENCE_BANDWIDTH_GBS, "physical_cores": REFERENCE_CORES}

_ROLE_TASKS = (
    ("coder", "code"),
    ("architect_coding", "code"),
    ("frontdoor", "code"),
    ("ingest", "summarize"),
    ("summarize", "summarize"),
    ("math", "math"),
    ("formalizer_q4", "math"),
    ("tool_formalizer", "json"),
    ("formalizer", "math"),
    ("toolrunner", "json"),
)


def _role_task(role: str) -> str:
    """The sweep's prompt per role is not recorded; the role's intended workload stands in."""
    for prefix, task in _ROLE_TASKS:
        if prefix in role:
            return task
    return "chat"


def _sweep_observations(skipped: list[tuple[str, str]]) -> Iterator[Observation]:
    seen: set[tuple[str, ...]] = set()
    for i, r in enumerate(_rows("epyc_sweeps.csv"), start=2):
        row_id = f"epyc_sweeps.csv:{i}"
        run_file = r["run_model_file"]
        if not run_file:
            skipped.append((row_id, "no run model file"))
            continue
        key = (
            run_file,
            r["method"],
            r["experts"],
            r["draft_model_name"],
            r["K"],
            r["lookup_n"],
            r["speed_test_tps_mean"],
        )
        if key in seen:
            skipped.append((row_id, "copy of another role's figures"))
            continue
        seen.add(key)
        found = _sweep_observation(row_id, r)
        if isinstance(found, str):
            skipped.append((row_id, found))
            continue
        yield found


def _sweep_observation(row_id: str, r: dict[str, str]) -> Observation | str:
    """One row of the sweeps as an observation, or why it is none."""
    run_file = r["run_model_file"]
    matches = r["run_model_matches_registry"] == "yes"
    arch_col = r["target_architecture"] if matches else ""
    arch = _arch_of_name(run_file)
    if arch_col == "ssm_moe_hybrid":
        arch = "qwen3next"
    target = _target(
        run_file,
        None,
        None,
        (r["target_quant"] or None) if matches else None,
        _num(r["target_size_gb"]) if matches else None,
        arch,
    )
    tps = _num(r["speed_test_tps_mean"]) if r["method"] != "baseline" else None
    if r["method"] in ("baseline", "moe_reduce"):
        tps = _num(r["baseline_tps"]) if r["method"] == "baseline" else _num(r["moe_only_tps"])
    baseline = _num(r["baseline_tps"])
    if target is None or not tps or not baseline:
        return "missing target facts, speed or baseline"
    method = _PRIOR_METHODS[r["method"]]
    default_experts = int(_num(r["target_baseline_experts"]) or _int(target["default_experts"]))
    experts = int(_num(r["experts"]) or default_experts)
    draft: dict[str, object] = {}
    if method is Method.DRAFT:
        d = _draft(r["draft_model_name"], None, r["draft_quant"] or None, _num(r["draft_size_gb"]))
        if d is None:
            return "missing draft facts"
        same = d["draft_arch_family"] == target["target_arch_family"]
        draft = {**d, "tok_relation": "identical" if same else "unknown"}
    k = int(_num(r["K"]) or (PRIOR_NGRAM_K if method is Method.NGRAM else 0))
    config = ConfigFacts(
        **_HOST,  # type: ignore[arg-type]
        **{**target, "default_experts": default_experts},  # type: ignore[arg-type]
        method=method,
        k=k,
        experts=experts,
        temperature=0.0,
        task=_role_task(r["model_role"]),
        ngram_n=int(_num(r["lookup_n"]) or 0),
        baseline_tps=baseline,
        **draft,  # type: ignore[arg-type]
    )
    series = None
    if method is Method.DRAFT:
        series = f"{r['model_role']}|{r['draft_role']}|{r['experts']}"
    return Observation(
        config=config,
        tps=tps,
        source="sweep",
        row_id=row_id,
        group=_group(run_file),
        series=series,
        note=r["config_name"],
        target_name=_stem(run_file),
        draft_name=r["draft_model_name"] if method is Method.DRAFT else "",
        draft_key=_group(r["draft_model_name"]) if method is Method.DRAFT else "",
        quant=((r["target_quant"] if matches else "") or _quant_of(_stem(run_file)) or "").upper(),
        draft_quant=(r["draft_quant"] or "").upper() if method is Method.DRAFT else "",
    )


# The methods of the prior's rows (seeds and sweeps), by the name they are recorded under.
_PRIOR_METHODS = {
    "baseline": Method.NONE,
    "moe_reduce": Method.NONE,
    "draft": Method.DRAFT,
    "self_spec": Method.DRAFT,
    "moe_reduce+draft": Method.DRAFT,
    "lookup": Method.NGRAM,
    "moe_reduce+lookup": Method.NGRAM,
}
# Baselines measured under a non-standard NUMA or thread setting, not the reference setup.
_NONSTANDARD = re.compile(r"membind|-t 48|-t 192")


def _seed_observations(skipped: list[tuple[str, str]]) -> Iterator[Observation]:
    for r in _rows("seed_runs.csv"):
        row_id = f"seed_runs.csv:{r['id']}"
        notes = r["notes"]
        if notes.startswith("FAIL:"):
            skipped.append((row_id, "failed combination (compatibility evidence, not speed)"))
            continue
        if notes.startswith("EXTERNAL:"):
            skipped.append((row_id, "other hardware or literature"))
            continue
        if _NONSTANDARD.search(notes):
            skipped.append((row_id, "non-standard NUMA or thread setting"))
            continue
        method = _PRIOR_METHODS.get(r["method"])
        if method is None or not r["target_model"]:
            skipped.append((row_id, "no target or unknown method"))
            continue
        arch = r["target_arch_family"]
        if arch == "deepseek-distill-qwen":
            arch = "qwen2"
        target = _target(
            r["target_model"],
            _num(r["target_params_b"]),
            _num(r["target_active_params_b"]),
            r["target_quant"] or None,
            _num(r["target_size_gb"]),
            arch,
        )
        tps = _num(r["tokens_per_s"])
        speedup = parse_speedup(r["speedup"])
        baseline = _num(r["baseline_tokens_per_s"])
        if method is Method.NONE and r["method"] == "baseline":
            baseline = baseline or tps
        if baseline is None and tps and speedup:
            baseline = tps / speedup
        if target is None or not tps or not baseline:
            skipped.append((row_id, "missing target facts, speed or baseline"))
            continue
        k = int(_num(r["k"]) or 0)
        draft: dict[str, object] = {}
        if method is Method.DRAFT:
            d = _draft(r["draft_model"], _num(r["draft_params_b"]), r["draft_quant"] or None, None)
            if d is None or not k:
                skipped.append((row_id, "draft or K not stated"))
                continue
            same = d["draft_arch_family"] == target["target_arch_family"]
            draft = {**d, "tok_relation": "identical" if same else "unknown"}
        elif method is Method.NGRAM:
            k = k or PRIOR_NGRAM_K
        default_experts = int(_num(r["default_experts"]) or _int(target["default_experts"]))
        experts = int(_num(r["experts_used"]) or default_experts)
        acc = _num(r["acceptance_pct"])
        config = ConfigFacts(
            **_HOST,  # type: ignore[arg-type]
            **{**target, "default_experts": default_experts},  # type: ignore[arg-type]
            method=method,
            k=k,
            experts=experts,
            temperature=_num(r["temperature"]) or 0.0,
            task=canonical_task(r["task"]),
            baseline_tps=baseline,
            **draft,  # type: ignore[arg-type]
        )
        yield Observation(
            config=config,
            tps=tps,
            source="seed",
            row_id=row_id,
            group=_group(r["target_model"]),
            acceptance=acc / 100.0 if acc is not None and method is Method.DRAFT else None,
            note=notes[:120],
            target_name=" ".join(x for x in (r["target_model"], r["target_quant"]) if x),
            draft_name=(
                " ".join(x for x in (r["draft_model"], r["draft_quant"]) if x)
                if method is Method.DRAFT else ""
            ),
            draft_key=_group(r["draft_model"]) if method is Method.DRAFT else "",
            quant=(r["target_quant"] or _quant_of(r["target_model"]) or "").upper(),
            reported_acceptance=acc / 100.0 if acc is not None else None,
            draft_quant=(r["draft_quant"] or "").upper() if method is Method.DRAFT else "",
        )  # fmt: skip


@lru_cache(maxsize=1)
def load_prior() -> PriorData:
    """All usable prior observations (cached; the files are read-only package data)."""
    skipped: list[tuple[str, str]] = []
    obs = [*_seed_observations(skipped), *_sweep_observations(skipped)]
    return PriorData(observations=tuple(obs), skipped=tuple(skipped))


@dataclass(frozen=True)
class SweepSeries:
    """One measured K sweep (target, draft, experts) from epyc_sweeps_bestk.csv."""

    series: str
    group: str
    k_tps: dict[int, float]
    best_k: int
    baseline_tps: float


def load_sweep_series() -> tuple[SweepSeries, ...]:
    out = []
    for r in _rows("epyc_sweeps_bestk.csv"):
        k_tps = {}
        for part in r["k_tps"].split(";"):
            k, _, v = part.partition("=")
            k_tps[int(k.lstrip("k"))] = float(v)
        out.append(
            SweepSeries(
                series=f"{r['model_role']}|{r['draft_role']}|{r['experts']}",
                group=_group(r["run_model_file"]),
                k_tps=k_tps,
                best_k=int(r["best_k"]),
                baseline_tps=float(r["baseline_tps"]),
            )
        )
    return tuple(out)
