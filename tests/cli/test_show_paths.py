"""`specreg show` prints a model's paths whole (issue 25): they were cut at 120 characters
even on a terminal wide enough, and a path is what a user copies."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import specreg
from support.tty import specreg_tty


def test_show_prints_every_part_path_whole(sparse_tree: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "registry.duckdb")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    models = json.loads(specreg("models", "--db", db, "--json").stdout)["models"]
    split = next(m for m in models if len(m["paths"]) == 8)
    width = max(len(p) for p in split["paths"]) + 40
    assert width - 40 > 120  # longer than the cut `show` used to make
    code, screen = specreg_tty("show", split["model_id"], "--db", db, columns=max(width, 170))
    assert code == 0, screen
    for path in split["paths"]:
        assert path in screen, (path, screen)
    assert "more characters" not in screen.split("GGUF key/values")[0]
