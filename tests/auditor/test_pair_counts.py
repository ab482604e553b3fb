"""Each pair count says what it counts (issue 25): audit counted 210 pairs, the report 196, the
graph fewer edges still, with no word on why. On the demo collection: 15 models give 210
ordered (target, draft) pairs; the matrix leaves out the EAGLE-3 head as a target (14 x 14 =
196 cells); the graph has one edge per pair of models."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.cli import specreg


def test_every_count_names_its_pairs(sparse_tree: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "registry.duckdb")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    audit = specreg("audit", "--db", db)
    assert audit.returncode == 0, audit.stderr
    assert re.search(r"15 models, 210 ordered pairs in .*; a pair is a \(target, draft\) of two "
                     r"models, every model with every other both ways, draft heads as targets "
                     r"included", audit.stdout), audit.stdout  # fmt: skip
    site = tmp_path / "site"
    assert specreg("report", "--db", db, "-o", str(site), "--no-recommend").returncode == 0
    overview = (site / "index.html").read_text()
    # issue 41 point 16: the report's headline counts what audit counts (it said 196 of the
    # matrix's cells, audit 210), and says what the matrix leaves out
    usable = json.loads(specreg("audit", "--db", db, "--json").stdout)["counts"]
    n_usable = usable["compatible"] + usable["compatible-with-warnings"]
    assert re.search(rf"<b>{n_usable}</b>usable draft pairs of 210 ordered \(target, draft\) "
                     r"pairs, as <code>specreg audit</code> counts them", overview)  # fmt: skip
    assert (
        "the matrix leaves draft heads (EAGLE-3, DFlash) out as targets and shows 196" in overview
    )
    graph = (site / "graph.html").read_text()
    assert "one edge for a pair of models, whichever drafts for the other" in graph
