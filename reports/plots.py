"""Figures for the report: matplotlib (Agg-free: straight to SVG) with networkx layouts.

matplotlib is slow to import and slower to draw, so figures are drawn only for data that
exists, and each SVG is cached on disk under a hash of exactly what it shows: a report of an
unchanged registry draws nothing. No pyplot, so the caller's matplotlib state is untouched.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import networkx as nx

from specreg.text import terminal_safe

# Cached SVGs are keyed by this file's own text too: changing a drawing invalidates them.
_CACHE_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
# Qualitative colours: tokenizer families, sweep series (matplotlib's tab10, then greys).
QUALITATIVE_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f",
)  # fmt: skip
_LABEL_WIDTH = 2.8  # layout units a family label needs at the graph's font size
_XML_DECL = re.compile(r"^<\?xml[^>]*>\s*(<!DOCTYPE[^>]*>\s*)?", re.S)


def tok_family_colour(index: int) -> str:
    return QUALITATIVE_COLOURS[(index - 1) % len(QUALITATIVE_COLOURS)]


def plain(text: str) -> str:
    """Text for matplotlib that it shows as is: `$` would start mathtext (and can raise);
    control characters (which no font has, and which XML forbids) appear as `\\x1b`."""
    return terminal_safe(text).replace("\\", "\\\\").replace("$", r"\$")


@dataclass
class PlotCache:
    """SVG files keyed by a hash of the figure's inputs; `None` disables caching."""

    folder: Path | None
    hits: int = 0
    drawn: int = 0
    _salt: int = field(default=0, repr=False)

    def get_or_draw(self, kind: str, spec: Any, draw: Any) -> str:
        key = hashlib.sha256(
            json.dumps(
                [_CACHE_VERSION, _mpl_version(), kind, spec], sort_keys=True, default=str
            ).encode()
        ).hexdigest()[:32]
        path = self.folder / f"{kind}-{key}.svg" if self.folder else None
        if path is not None and path.exists():
            self.hits += 1
            return path.read_text(encoding="utf-8")
        svg = draw(key)
        self.drawn += 1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(svg, encoding="utf-8")
            tmp.replace(path)
        return svg


@functools.lru_cache(maxsize=1)
def _mpl_version() -> str:
    from importlib.metadata import version

    return version("matplotlib")


def _svg(fig: Any, salt: str) -> str:
    """The figure as an inline <svg> element (no XML declaration), ids unique per figure."""
    import matplotlib

    buf = io.StringIO()
    # fonttype none: text stays <text> (small, selectable, escaped by matplotlib's writer);
    # hashsalt: ids of clip paths differ between figures inlined into the same page.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        # No bbox_inches="tight": it draws the figure twice; layouts set their margins.
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return _XML_DECL.sub("", buf.getvalue()).strip()


def _figure(width: float, height: float, *, layout: Literal["constrained"] | None = None) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=72, layout=layout)
    fig.patch.set_alpha(0)
    return fig


# --- compatibility graph --------------------------------------------------------------------


def cluster_layout(
    nodes: Sequence[str], tok_family_of: Mapping[str, int]
) -> tuple[dict[str, tuple[float, float]], dict[int, tuple[float, float, float]]]:
    """Positions with each tokenizer family on its own circle, families packed in rows.

    Returns node positions and, per family, its centre and radius (for the family label).
    """
    members: dict[int, list[str]] = defaultdict(list)
    for n in sorted(nodes):
        members[tok_family_of.get(n, 0)].append(n)
    order = sorted(members, key=lambda f: (-len(members[f]), f))
    radius = {f: 0.6 + 0.35 * math.sqrt(len(members[f])) for f in order}
    per_row = max(1, math.ceil(math.sqrt(len(order))))
    pos: dict[str, tuple[float, float]] = {}
    centres: dict[int, tuple[float, float, float]] = {}
    y = 0.0
    for row_start in range(0, len(order), per_row):
        row = order[row_start : row_start + per_row]
        row_r = max(radius[f] for f in row)
        x = 0.0
        for f in row:
            r = radius[f]
            slot = max(2 * r, _LABEL_WIDTH)  # room for the family's label above it
            cx, cy = x + slot / 2, y - row_r
            if len(members[f]) == 1:
                pos[members[f][0]] = (cx, cy)
            else:
                sub = nx.circular_layout(members[f], scale=r * 0.8)
                # a quarter turn: two-model families stand upright instead of lining up
                # with their neighbours' nodes and edges
                pos.update({n: (cx - float(p[1]), cy + float(p[0])) for n, p in sub.items()})
            centres[f] = (cx, cy, r)
            x += slot + 0.6
        y -= 2 * row_r + 1.2
    return pos, centres


def _edge_kind(verdict: str) -> str:
    if "risky" in verdict:
        return "risky"
    return "warnings" if "warn" in verdict else "compatible"


def graph_svg(
    graph: nx.Graph,
    tok_family_of: Mapping[str, int],
    family_labels: Mapping[int, str],
    names: Mapping[str, str],
    cache: PlotCache,
) -> str:
    """Tokenizer families as clusters (one colour each), compatible pairs as edges."""
    nodes = sorted(str(n) for n in graph.nodes)
    if not nodes:
        return ""
    edges = sorted(
        (str(a), str(b), str(d.get("verdict", ""))) for a, b, d in graph.edges(data=True)
    )
    show_names = len(nodes) <= 60
    spec = {
        "nodes": [
            (n, tok_family_of.get(n, 0), names.get(n, n) if show_names else "") for n in nodes
        ],
        "edges": edges,
        "families": sorted((int(k), v) for k, v in family_labels.items()),
    }

    def draw(salt: str) -> str:
        pos, centres = cluster_layout(nodes, tok_family_of)
        xs = [p[0] for p in pos.values()]
        ys = [p[1] for p in pos.values()]
        span_x = max(xs) - min(xs) + _LABEL_WIDTH + 0.8
        span_y = max(ys) - min(ys) + 3
        width = min(16.0, max(6.0, span_x * 1.1))
        fig = _figure(width, min(30.0, max(4.0, width * span_y / span_x)))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        ax.set_aspect("equal")
        _draw_edges(ax, pos, edges)
        for fam, (cx, cy, r) in centres.items():
            ax.text(
                cx,
                cy + r + 0.15,
                plain(f"T{fam} {family_labels.get(fam, '')}"),
                ha="center",
                va="bottom",
                fontsize=8,
                color=tok_family_colour(fam),
                fontweight="bold",
            )
        _draw_nodes(ax, pos, nodes, tok_family_of, names if show_names else None)
        ax.set_xlim(min(xs) - _LABEL_WIDTH / 2 - 0.4, max(xs) + _LABEL_WIDTH / 2 + 0.4)
        ax.set_ylim(min(ys) - 1.0, max(ys) + 1.1)
        return _svg(fig, salt)

    return cache.get_or_draw("graph", spec, draw)


def _draw_edges(
    ax: Any, pos: Mapping[str, tuple[float, float]], edges: Sequence[tuple[str, str, str]]
) -> None:
    """One compound path per verdict, styled like the matrix's colours: thousands of edges
    become a few SVG elements."""
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path as MplPath

    def segments(pairs: list[tuple[str, str]]) -> MplPath:
        verts = [p for a, b in pairs for p in (pos[a], pos[b])]
        codes = [c for _ in pairs for c in (MplPath.MOVETO, MplPath.LINETO)]
        return MplPath(verts or [(0, 0)], codes or [MplPath.MOVETO])

    styles = (
        ("compatible", "#2e7d32", "-", 0.45),
        ("warnings", "#9ccc65", "--", 0.8),
        ("risky", "#fb8c00", ":", 0.9),
    )
    for kind, colour, style, alpha in styles:
        chosen = [(a, b) for a, b, v in edges if _edge_kind(v) == kind]
        if chosen:
            ax.add_patch(PathPatch(segments(chosen), fill=False, edgecolor=colour,
                                   linewidth=0.6, alpha=alpha, linestyle=style))  # fmt: skip


def _draw_nodes(
    ax: Any,
    pos: Mapping[str, tuple[float, float]],
    nodes: Sequence[str],
    tok_family_of: Mapping[str, int],
    names: Mapping[str, str] | None,
) -> None:
    """The models, coloured by tokenizer family, with their names below when `names`."""
    ax.scatter(
        [pos[n][0] for n in nodes],
        [pos[n][1] for n in nodes],
        s=28 if len(nodes) > 60 else 60,
        c=[tok_family_colour(tok_family_of.get(n, 0)) for n in nodes],
        edgecolors="white",
        linewidths=0.6,
        zorder=3,
    )
    if names is None:
        return
    for n in nodes:
        ax.text(
            pos[n][0],
            pos[n][1] - 0.12,
            plain(names.get(n, n))[:28],
            ha="center",
            va="top",
            fontsize=6,
            color="#333333",
            zorder=4,
        )


# --- per-target measurements ----------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    series: str  # "code · draft NAME"
    k: int
    tokens_per_s: float
    acceptance: float | None


def sweep_svg(
    points: Sequence[SweepPoint],
    baseline_tps: float | None,
    roofline_tps: float | None,
    cache: PlotCache,
) -> str:
    """Speed and acceptance against K, one line per task and draft, with baseline and roofline."""
    if not points:
        return ""
    spec = {
        "points": sorted((p.series, p.k, p.tokens_per_s, p.acceptance) for p in points),
        "baseline": baseline_tps,
        "roofline": roofline_tps,
    }

    def draw(salt: str) -> str:
        # constrained: the layout makes room for the legend below, however long its labels
        fig = _figure(
            11.5, 3.4 + 0.2 * ((len({p.series for p in points}) + 3) // 2), layout="constrained"
        )
        ax_s, ax_a = fig.subplots(1, 2)
        _plot_series(ax_s, ax_a, points)
        if baseline_tps:
            ax_s.axhline(
                baseline_tps,
                color="#555555",
                linestyle="--",
                linewidth=1,
                label=f"baseline {baseline_tps:.1f} t/s",
            )
        if roofline_tps:
            ax_s.axhline(
                roofline_tps,
                color="#c62828",
                linestyle=":",
                linewidth=1,
                label=f"roofline {roofline_tps:.1f} t/s",
            )
        top = max([p.tokens_per_s for p in points] + [baseline_tps or 0.0, roofline_tps or 0.0])
        _sweep_axes(ax_s, ax_a, [p.k for p in points], top)
        # Below the plots, where it hides no line and has the figure's whole width.
        handles, labels = ax_s.get_legend_handles_labels()
        fig.legend(
            handles,
            labels,
            fontsize=8,
            frameon=False,
            loc="outside lower center",
            ncols=min(2, len(labels)) or 1,
        )
        return _svg(fig, salt)

    return cache.get_or_draw("sweep", spec, draw)


def _plot_series(ax_s: Any, ax_a: Any, points: Sequence[SweepPoint]) -> None:
    """Speed (on `ax_s`) and acceptance (on `ax_a`) against K, one line per series."""
    series: dict[str, list[SweepPoint]] = defaultdict(list)
    for p in points:
        series[p.series].append(p)
    for i, (label, pts) in enumerate(sorted(series.items())):
        pts = sorted(pts, key=lambda p: p.k)
        colour = QUALITATIVE_COLOURS[i % len(QUALITATIVE_COLOURS)]
        ax_s.plot(
            [p.k for p in pts],
            [p.tokens_per_s for p in pts],
            "o-",
            color=colour,
            label=plain(label)[:40],
            markersize=4,
        )
        acc = [p for p in pts if p.acceptance is not None]
        if acc:
            ax_a.plot(
                [p.k for p in acc],
                [100 * (p.acceptance or 0) for p in acc],
                "o-",
                color=colour,
                markersize=4,
            )


def _sweep_axes(ax_s: Any, ax_a: Any, ks: Sequence[int], top: float) -> None:
    """Labels, titles and limits of the speed and acceptance axes (`top`: the fastest)."""
    from matplotlib.ticker import MaxNLocator

    ax_s.set_xlabel("K (draft tokens)")
    ax_s.set_ylabel("tokens/s")
    ax_s.set_title("speed", fontsize=10)
    ax_a.set_xlabel("K (draft tokens)")
    ax_a.set_ylabel("acceptance %")
    ax_a.set_ylim(0, 100)
    ax_a.set_title("acceptance", fontsize=10)
    # One or two K values: a span of K around them, whole numbers only (K is a count),
    # and speeds from 0, so a single point is not the middle of an axis of decimals.
    lo, hi = min(ks), max(ks)
    pad = max(1.0, (4 - (hi - lo)) / 2) if hi - lo < 4 else 0.5
    ax_s.set_ylim(0, top * 1.15 or 1.0)
    for ax in (ax_s, ax_a):
        ax.set_xlim(max(lo - pad, 0), hi + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)


# --- speed against quality cost -------------------------------------------------------------


def frontier_svg(points: Sequence[Any], cache: PlotCache) -> str:
    """Speed against quality cost (mean KLD) of a target's lossy options: measured points
    filled, predicted ones hollow, the frontier joined by a line."""
    shown = [p for p in points if p.tokens_per_s is not None]
    if len(shown) < 2:
        return ""
    spec = {
        "points": sorted(
            (p.label, p.mean_kld, p.tokens_per_s, p.measured, p.on_frontier) for p in shown
        )
    }

    def draw(salt: str) -> str:
        fig = _figure(8.0, 3.6, layout="constrained")
        ax = fig.subplots()
        front = sorted((p for p in shown if p.on_frontier), key=lambda p: p.mean_kld)
        if len(front) > 1:
            ax.plot(
                [p.mean_kld for p in front],
                [p.tokens_per_s for p in front],
                "-",
                color="#7f7f7f",
                linewidth=1,
                label="frontier",
            )
        for measured, style in ((True, "measured"), (False, "predicted (hollow)")):
            group = [p for p in shown if p.measured == measured]
            if not group:
                continue
            ax.scatter(
                [p.mean_kld for p in group],
                [p.tokens_per_s for p in group],
                s=36,
                facecolors=QUALITATIVE_COLOURS[0] if measured else "none",
                edgecolors=QUALITATIVE_COLOURS[0],
                label=style,
                zorder=3,
            )
        for p in shown:
            ax.annotate(
                plain(p.label)[:32],
                (p.mean_kld, p.tokens_per_s),
                textcoords="offset points",
                xytext=(5, 4),
                fontsize=7,
            )
        ax.set_xlabel("quality cost: mean KL divergence from the reference (nats/token)")
        ax.set_ylabel("tokens/s")
        ax.set_title("speed against quality cost", fontsize=10)
        # Both axes from 0 (no cost, no speed), and room on the right for the last point's
        # label, so two points are not the corners of the plot with their labels cut.
        kld_top = max(p.mean_kld for p in shown) or 0.01
        ax.set_xlim(0, kld_top * 1.45)
        ax.set_ylim(0, max(p.tokens_per_s for p in shown) * 1.2 or 1.0)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(fontsize=8, frameon=False, loc="best")
        return _svg(fig, salt)

    return cache.get_or_draw("frontier", spec, draw)
