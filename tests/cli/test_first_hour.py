"""A new user's first hour, scripted (issue 25, must show): the README's set-up line
(`specreg demo DIR && specreg scan DIR && specreg models`), then models, drafts, compat,
recommend and report on the demo collection, each on a pseudo-terminal 80 columns wide as a
user at a small terminal runs them. No id a user has to type is cut, and no model name is
wrapped over several lines: each stands on one line, whole or cut with `…`.

Round two (issue 41, must show): models are named as a user types them (the README's YAML
alias `qwen2.5-coder-32b`, a file stem, case, spaces, hyphens and underscores ignored), the
Hugging Face cached draft by its snapshot name and never its blob hash, `compat` with the
models swapped says "not a draft", and `serve --dry-run` plans with no llama.cpp anywhere."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from support.cli import specreg
from support.tty import name_on_one_line, specreg_tty, too_wide

TARGET = "Qwen2.5 Coder 32B Instruct"
DRAFT = "Qwen2.5 Coder 0.5B Instruct"
COLUMNS = 80
# As a user types them: the alias of the README's YAML example, and the draft's file stem in
# another case with underscores for hyphens.
TARGET_TYPED = "qwen2.5-coder-32b"
DRAFT_TYPED = "QWEN2.5_CODER_0.5B_INSTRUCT_Q8_0"
BLOB = "3f0a5c9e1b7d"  # the demo's Hugging Face cache blob: never a name on screen


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


def test_the_first_hour_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
        assert BLOB not in screen and "qwen2.5-co…-q8_0.gguf" in screen  # its snapshot name

    target = next(m for m in models if m["name"] == TARGET)
    draft = next(m for m in models if m["name"] == DRAFT)
    for typed, model in ((TARGET_TYPED, target), (DRAFT_TYPED, draft)):
        assert _json("show", typed)["model"]["model_id"] == model["model_id"], typed
    both = specreg("show", "qwen 2.5 coder")  # a name two models answer to: both named
    assert both.returncode == 2 and "'qwen 2.5 coder' matches 2 models (" in both.stderr
    assert target["model_id"][:10] in both.stderr and draft["model_id"][:10] in both.stderr
    screen = _screen("show", "qwen 2.5 coder 32", codes=(2,))
    assert "no model matches 'qwen 2.5 coder 32'" in screen and "nearest: " in screen
    assert target["model_id"][:10] in screen

    drafts = _json("drafts", target["model_id"])["drafts"]
    screen = _screen("drafts", TARGET_TYPED)
    assert drafts and drafts[0]["draft"]["name"] == DRAFT
    for d in drafts:
        assert d["draft"]["id"][:10] in screen, (d["draft"], screen)
    _names_whole_or_cut({d["draft"]["name"] for d in drafts}, screen)
    assert BLOB not in screen

    screen = _screen("compat", TARGET_TYPED, DRAFT_TYPED)
    assert screen.startswith(f"compatible: {DRAFT} as draft for {TARGET}")
    assert not too_wide(screen.split("flags:")[0], COLUMNS)  # the flags are one line to paste
    assert BLOB not in screen.split("flags:")[1]
    screen = _screen("compat", DRAFT_TYPED, TARGET_TYPED, codes=(1,))  # the two swapped
    assert screen.startswith(f"not a draft: {TARGET} for {DRAFT}: ") and "flags:" not in screen

    options = _json("recommend", TARGET_TYPED)["options"][:5]
    screen = _screen("recommend", TARGET_TYPED)
    drafted = [o for o in options if o["draft_id"]]
    assert drafted, options
    for o in drafted:
        assert o["draft_id"][:10] in screen, (o["draft_id"], screen)
    _names_whole_or_cut({o["draft_name"] for o in drafted}, screen)
    table = screen[screen.index("#") : screen.index("\nrun: ")]
    assert not too_wide(table, COLUMNS), too_wide(table, COLUMNS)

    assert BLOB not in screen

    site = tmp_path / "report"
    screen = _screen("report", "-o", str(site))
    assert "wrote" in screen and (site / "index.html").exists()
    page = (site / f"target-{target['model_id']}.html").read_text()
    assert page.index("What to run") < page.index("Compatible drafts")

    # serve plans for this target with no llama.cpp anywhere: none on PATH, none built (the
    # host's measured bandwidth is kept, so the plan does not measure it again)
    cache = tmp_path / "cache-without-llama"
    membw = Path(os.environ["SPECREG_CACHE"]) / "membw"
    if membw.is_dir():
        shutil.copytree(membw, cache / "membw")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("SPECREG_LLAMA_BIN", str(tmp_path / "no-llama"))
    monkeypatch.setenv("SPECREG_CACHE", str(cache))
    screen = _screen("serve", TARGET_TYPED, "--dry-run")
    assert "llama-server" in screen and "--spec-draft-model" in screen
    assert "qwen2.5-coder-0.5b-instruct-q8" in screen and BLOB not in screen  # backend names
    assert not (cache / "llama.cpp").exists()  # nothing was built
