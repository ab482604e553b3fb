"""A new user's first hour, scripted (issue 25, must show): the README's set-up line
(`specreg demo DIR && specreg scan DIR && specreg models`), then models, drafts, compat,
recommend and report on the demo collection, each on a pseudo-terminal 80 columns wide as a
user at a small terminal runs them. No id a user has to type is cut, and no model name is
wrapped over several lines: each stands on one line, whole or cut with `…`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.cli import specreg
from support.tty import name_on_one_line, specreg_tty, too_wide

TARGET = "Qwen2.5 Coder 32B Instruct"
DRAFT = "Qwen2.5 Coder 0.5B Instruct"
COLUMNS = 80


def _json(*args: str) -> Any:
    r = specreg(*args, "--json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def _screen(*args: str, codes: tuple[int, ...] = (0,)) -> str:
    code, screen = specreg_tty(*args, columns=COLUMNS)
    assert code in codes, screen
    return screen


def _names_whole_or_cut(names: set[str], screen: str) -> None:
    """Each name on one line, and every line naming a model fits the terminal."""
    for name in names:
        assert name_on_one_line(name, screen), (name, screen)
    naming = [line for line in too_wide(screen, COLUMNS) if any(n[:8] in line for n in names)]
    assert not naming, naming


def test_the_first_hour_at_80_columns(tmp_path: Path) -> None:
    demo = tmp_path / "specreg-demo"
    # the README's second set-up line, one command after the other as `&&` runs them
    assert "wrote 24 files" in _screen("demo", str(demo))
    assert "errors" in _screen("scan", str(demo))
    first = _screen("models")

    models = _json("models")["models"]
    assert len(models) == 15
    for screen in (first, _screen("models")):
        for m in models:
            assert m["model_id"][:10] in screen, (m["model_id"], screen)
        _names_whole_or_cut({m["name"] for m in models}, screen)
        assert not too_wide(screen, COLUMNS), too_wide(screen, COLUMNS)

    target = next(m for m in models if m["name"] == TARGET)
    drafts = _json("drafts", target["model_id"])["drafts"]
    screen = _screen("drafts", TARGET)
    assert drafts and drafts[0]["draft"]["name"] == DRAFT
    for d in drafts:
        assert d["draft"]["id"][:10] in screen, (d["draft"], screen)
    _names_whole_or_cut({d["draft"]["name"] for d in drafts}, screen)

    screen = _screen("compat", TARGET, DRAFT)
    assert screen.startswith(f"compatible: {DRAFT} as draft for {TARGET}")
    assert not too_wide(screen.split("flags:")[0], COLUMNS)  # the flags are one line to paste

    options = _json("recommend", TARGET)["options"][:5]
    screen = _screen("recommend", TARGET)
    drafted = [o for o in options if o["draft_id"]]
    assert drafted, options
    for o in drafted:
        assert o["draft_id"][:10] in screen, (o["draft_id"], screen)
    _names_whole_or_cut({o["draft_name"] for o in drafted}, screen)
    table = screen[screen.index("#") : screen.index("\nrun: ")]
    assert not too_wide(table, COLUMNS), too_wide(table, COLUMNS)

    site = tmp_path / "report"
    screen = _screen("report", "-o", str(site))
    assert "wrote" in screen and (site / "index.html").exists()
    page = (site / f"target-{target['model_id']}.html").read_text()
    assert page.index("What to run") < page.index("Compatible drafts")
