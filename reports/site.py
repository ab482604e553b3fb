"""`build_site`: gather the report's data once, then render every page from templates.

The site is static and self-contained (CSS, scripts, figures and data inline), so it opens
from file://, works offline, and can be copied or published as a folder.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.resources import files
from pathlib import Path
from typing import Any

import duckdb
import networkx as nx
from jinja2 import Environment, FileSystemBytecodeCache, PackageLoader, StrictUndefined
from markupsafe import Markup

from specreg.auditor import not_a_draft
from specreg.llamacpp import Flag, Tool
from specreg.registry.queries import human_bytes, human_count
from specreg.reports import gather, plots
from specreg.reports.data import (
    CHAT_TEMPLATE_MAX_CHARS,
    COMMAND_MAX_CHARS,
    TEXT_MAX_CHARS,
    VERDICT_LABELS,
    Matrix,
    ModelView,
    PairView,
    RunView,
    SiteData,
    SiteResult,
    TargetView,
)
from specreg.reports.frontier import gather_frontier
from specreg.terms import TASKS
from specreg.text import clip

log = logging.getLogger(__name__)

NAV = (
    ("index.html", "Overview"),
    ("matrix.html", "Matrix"),
    ("graph.html", "Graph"),
    ("runs.html", "Runs"),
)


def build_site(
    con: duckdb.DuckDBPyConnection,
    out_dir: Path,
    *,
    cache: Path | None = None,
    db_label: str = "",
    rules: Any = None,
    advise: gather.Advise | None = None,
    tasks: Sequence[str] = TASKS,
    started: float | None = None,
) -> SiteResult:
    """Write the report for the registry behind `con` into `out_dir`.

    `cache` is a folder that keeps drawn figures and compiled templates between reports
    (None: draw and compile everything). `rules`: the auditor's RuleSet for the user's
    llama.cpp build (None: the pinned build). `advise`: the recommender bound to a model and
    this host, asked once per target and task (None: no recommendations, which keeps the report
    fast; the recommender takes about half a second per question). `started`: the
    `time.perf_counter()` the caller began at (fitting the recommender, say), so the time the
    result reports is the whole wait.
    """
    t0 = time.perf_counter() if started is None else started
    figures = plots.PlotCache(cache / "figures" if cache else None)
    site = gather_site(con, figures, db_label=db_label, rules=rules, advise=advise, tasks=tasks)
    t_gather = time.perf_counter() - t0
    pages = render_site(site, Path(out_dir), template_cache=cache)
    return SiteResult(
        out_dir=Path(out_dir),
        pages=tuple(pages),
        n_models=len(site.models),
        n_pairs=sum(site.audit_counts.values()),
        n_runs=len(site.runs),
        n_plots=figures.drawn + figures.hits,
        n_plots_cached=figures.hits,
        seconds=time.perf_counter() - t0,
        seconds_gather=t_gather,
        parts=site.parts,
    )


def gather_site(
    con: duckdb.DuckDBPyConnection,
    cache: plots.PlotCache,
    *,
    db_label: str = "",
    rules: Any = None,
    advise: gather.Advise | None = None,
    tasks: Sequence[str] = TASKS,
) -> SiteData:
    reg = gather.gather_registry(con)
    audit = gather.gather_audit(con, reg.models, rules)
    runs, runs_status = gather.gather_runs(con)
    graph_svg, graph_edges = _graph_figure(audit.graph, reg, cache)
    targets = _target_views(con, reg, audit, runs, cache, advise, tasks)
    parts = (
        gather.PartStatus("registry", True, ""),
        audit.status,
        runs_status,
        gather.PartStatus(
            "recommender",
            advise is not None,
            "" if advise is not None else "left out of this report (--no-recommend)",
        ),
    )
    return SiteData(
        generated_at=datetime.now(timezone.utc),
        db_path=db_label,
        models=reg.models,
        families=reg.families,
        scans=reg.scans,
        problems=reg.problems,
        parts=parts,
        pairs=audit.pairs,
        matrix=audit.matrix,
        audit_counts=audit.counts,
        graph_svg=graph_svg,
        graph_edges=graph_edges,
        targets=tuple(targets),
        runs=runs,
    )


def _graph_figure(
    graph: nx.Graph | None, reg: gather.RegistryPart, cache: plots.PlotCache
) -> tuple[str, int]:
    """The compatibility graph of the registry's models (SVG, "" without one), its edges."""
    if graph is None or not graph.number_of_nodes():
        return "", 0
    models = {m.model_id for m in reg.models}
    shown = nx.Graph(graph.subgraph([n for n in graph.nodes if str(n) in models]))
    svg = plots.graph_svg(
        shown,
        {m.model_id: m.family for m in reg.models},
        {f.index: f.label for f in reg.families},
        {m.model_id: m.name for m in reg.models},
        cache,
    )
    return svg, shown.number_of_edges()


def _target_views(
    con: duckdb.DuckDBPyConnection,
    reg: gather.RegistryPart,
    audit: gather.AuditPart,
    runs: Sequence[RunView],
    cache: plots.PlotCache,
    advise: gather.Advise | None,
    tasks: Sequence[str],
) -> list[TargetView]:
    """Each model's page: its drafts, recommendations, runs, roofline, figures, template."""
    models = {m.model_id: m for m in reg.models}
    by_target: dict[str, list[PairView]] = defaultdict(list)
    for p in audit.pairs:
        by_target[p.target_id].append(p)
    runs_by_target: dict[str | None, list[RunView]] = defaultdict(list)
    for r in runs:
        runs_by_target[r.target_id].append(r)
    templates = gather.chat_templates(con)
    targets = []
    for m in reg.models:
        t_runs = tuple(runs_by_target.get(m.model_id, ()))
        recs, roofline, rec_note = gather.gather_recommendations(con, m, t_runs, advise, tasks)
        # the order of `specreg drafts`: verdict, then the smallest draft first; a model as
        # large as the target or larger is listed apart, as `specreg drafts` does
        accepted = sorted(
            (p for p in by_target.get(m.model_id, []) if p.compatible),
            key=lambda p: (p.code, models[p.draft_id].n_params, models[p.draft_id].name),
        )
        larger = [(p, not_a_draft(m.record, models[p.draft_id].record)) for p in accepted]
        usable = [p for p, why in larger if why is None]
        not_drafts = tuple((p, why) for p, why in larger if why is not None)
        frontier = gather_frontier(con, m.record, t_runs, roofline)
        targets.append(
            TargetView(
                model=m,
                drafts=tuple(usable),
                rejected=(len(models) - 1 - len(accepted) if audit.status.available else 0),
                recommendations=recs,
                rec_note=rec_note,
                runs=t_runs,
                roofline=roofline,
                plot_svg=_target_plot(t_runs, models, roofline, cache),
                chat_template=templates.get(m.model_id),
                frontier=frontier,
                frontier_svg=plots.frontier_svg(frontier, cache),
                not_drafts=not_drafts,
            )
        )
    return targets


def _target_plot(
    runs: Sequence[RunView],
    models: dict[str, ModelView],
    roofline: Any,
    cache: plots.PlotCache,
) -> str:
    # Repeated measurements of one configuration become one point: their median.
    measured: dict[tuple[str, int], list[RunView]] = defaultdict(list)
    for r in runs:
        if not r.ok or r.k is None or not r.tokens_per_s:
            continue
        draft = models[r.draft_id].name if r.draft_id in models else r.spec_type
        measured[(f"{r.task or 'any task'} · {draft}", int(r.k))].append(r)
    points = []
    for (series, k), rs in sorted(measured.items()):
        accepted = [r.acceptance for r in rs if r.acceptance is not None]
        points.append(
            plots.SweepPoint(
                series,
                k,
                statistics.median(r.tokens_per_s or 0.0 for r in rs),
                statistics.median(accepted) if accepted else None,
            )
        )
    if not points:
        return ""
    return plots.sweep_svg(
        points,
        roofline.measured_baseline_tps if roofline else None,
        roofline.bound_tps if roofline else None,
        cache,
    )


# --- rendering ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Static:
    css: Markup
    site_js: Markup
    matrix_js: Markup


def _static() -> _Static:
    folder = files("specreg.reports") / "static"
    return _Static(
        Markup((folder / "site.css").read_text(encoding="utf-8")),
        Markup((folder / "site.js").read_text(encoding="utf-8")),
        Markup((folder / "matrix.js").read_text(encoding="utf-8")),
    )


def _csp_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def environment(template_cache: Path | None = None) -> Environment:
    bytecode = None
    if template_cache is not None:
        # Compiling the templates costs ~0.4 s; the compiled code is cached by source hash.
        folder = template_cache / "jinja"
        folder.mkdir(parents=True, exist_ok=True)
        bytecode = FileSystemBytecodeCache(str(folder))
    env = Environment(
        loader=PackageLoader("specreg.reports", "templates"),
        bytecode_cache=bytecode,
        autoescape=True,  # every string from a GGUF file is hostile
        finalize=_bounded,  # ... and unbounded
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["clip"] = _clip_filter
    env.filters["basename"] = lambda path: os.path.basename(path or "")  # the quant is in it
    env.globals["limits"] = {
        "chat_template": CHAT_TEMPLATE_MAX_CHARS,
        "command": COMMAND_MAX_CHARS,
    }
    env.globals["colour"] = plots.tok_family_colour
    env.globals["labels"] = VERDICT_LABELS
    env.globals["server_command"] = server_command
    return env


class _Clipped(str):
    """Text already cut to a bound of its own: the page-wide bound leaves it alone."""


def _clip_filter(text: str, limit: int) -> _Clipped:
    return _Clipped(clip(str(text), limit))


def _bounded(value: Any) -> Any:
    """Every value a template prints: plain strings longer than TEXT_MAX_CHARS are cut.

    Markup (the report's own CSS, scripts, SVG and JSON) and text clipped to its own bound
    pass as they are."""
    if type(value) is str:
        return clip(value, TEXT_MAX_CHARS)
    return value


def server_command(target_path: str | None, flags: Sequence[str]) -> str:
    """The llama-server line for a target and a draft's flags, quoted for a POSIX shell."""
    line = shlex.join([Tool.SERVER, Flag.MODEL, target_path or "TARGET.gguf", *flags])
    return _Clipped(clip(line, COMMAND_MAX_CHARS))


def matrix_payload(matrix: Matrix, models: dict[str, ModelView]) -> dict[str, Any]:
    """What the matrix script needs, as JSON: names never go through HTML parsing there."""

    def row(mid: str) -> list[Any]:
        m = models[mid]
        return [mid, m.name, m.n_params, m.page, m.family]

    return {
        "t": [row(t) for t in matrix.targets],
        "d": [row(d) for d in matrix.drafts],
        "c": list(matrix.codes),
        "r": [clip(r, TEXT_MAX_CHARS) for r in matrix.reasons],
        "x": [list(r) for r in matrix.reason_index],
        "labels": {str(k): v for k, v in VERDICT_LABELS.items()},
    }


def _arch_summary(models: Sequence[ModelView]) -> list[dict[str, Any]]:
    groups: dict[str, list[ModelView]] = defaultdict(list)
    for m in models:
        groups[m.record.architecture or "?"].append(m)
    out = []
    for arch, ms in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        sizes = [m.n_params for m in ms]
        out.append(
            {
                "name": arch,
                "count": len(ms),
                "smallest": human_count(min(sizes)),
                "largest": human_count(max(sizes)),
                "bytes": human_bytes(sum(m.record.n_bytes or 0 for m in ms)),
            }
        )
    return out


def render_site(site: SiteData, out_dir: Path, *, template_cache: Path | None = None) -> list[Path]:
    env = environment(template_cache)
    static = _static()
    out_dir.mkdir(parents=True, exist_ok=True)
    models = {m.model_id: m for m in site.models}
    common: dict[str, Any] = {
        "site": site,
        "nav": NAV,
        "css": static.css,
        "site_js": static.site_js,
        "names": {m.model_id: m.name for m in site.models},
        "pages": {m.model_id: m.page for m in site.models},
        "families": {f.index: f for f in site.families},
        "models": models,
        "wide": False,
    }
    csp_site = _csp_hash(static.site_js)
    written: list[Path] = []

    def write(name: str, template: str, scripts: Sequence[str] = (), **extra: Any) -> None:
        csp = " ".join([csp_site, *(_csp_hash(s) for s in scripts)])
        context = {**common, "here": name, "csp_scripts": Markup(csp), **extra}
        html = env.get_template(template).render(context)
        path = out_dir / name
        # Unchanged pages are left alone: rewriting 200 files costs more than comparing them.
        if not (path.exists() and path.read_text(encoding="utf-8") == html):
            path.write_text(html, encoding="utf-8")
        written.append(path)

    # matrix rows are strings of verdict-code digits
    digits = Counter("".join(site.matrix.codes) if site.matrix else "")
    counts = {c: digits[str(c)] for c in VERDICT_LABELS}
    # the headline counts what `specreg audit` counts: every ordered pair
    usable = sum(site.audit_counts.get(v, 0) for v in ("compatible", "compatible-with-warnings"))
    write(
        "index.html",
        "overview.html.j2",
        by_arch=_arch_summary(site.models),
        models_sorted=sorted(
            site.models, key=lambda m: (m.record.architecture or "", -m.n_params, m.name)
        ),
        usable_pairs=usable,
        audited_pairs=sum(site.audit_counts.values()),
        matrix_pairs=sum(counts[c] for c in (1, 2, 3, 4)),
    )
    write(
        "matrix.html",
        "matrix.html.j2",
        scripts=[static.matrix_js] if site.matrix else [],
        matrix=site.matrix,
        matrix_json=matrix_payload(site.matrix, models) if site.matrix else None,
        matrix_js=static.matrix_js,
        counts=counts,
        wide=True,
    )
    write(
        "graph.html",
        "graph.html.j2",
        graph_svg=site.graph_svg,
        n_nodes=len(site.models),
        n_edges=site.graph_edges,
    )
    write("runs.html", "runs.html.j2")
    current = set()
    for tv in site.targets:
        current.add(tv.model.page)
        write(
            tv.model.page,
            "target.html.j2",
            tv=tv,
            active_str=human_count(tv.model.record.n_params_active),
        )
    # Pages of models that left the registry would link to nothing: remove them.
    for stale in out_dir.glob("target-*.html"):
        if stale.name not in current:
            stale.unlink()
    return written
