"""A Hugging Face cache's files are known by their snapshot names, never their blob hashes
(issue 41, point 2): the model's path, the files llama.cpp is given, a split set's parts, the
scan's lists and the names a model answers to."""

from __future__ import annotations

import os
from pathlib import Path

from specreg.registry import queries
from specreg.registry.db import opened
from specreg.registry.hub_cache import repo_id, snapshot_name
from specreg.registry.scan import scan_paths
from specreg.samples.demo import DemoModel, write_demo_model

REPO = "models--Org--Tiny-GGUF"


def _cache(root: Path, files: dict[str, Path], revisions: tuple[str, ...] = ("r1",)) -> Path:
    """A hub cache repository holding `files` (snapshot name -> file, moved to a blob), linked
    from every revision; refs/main names the last."""
    repo = root / "hub" / REPO
    (repo / "blobs").mkdir(parents=True)
    for i, (name, src) in enumerate(sorted(files.items())):
        blob = repo / "blobs" / f"{i:02d}deadbeef{i}"
        src.rename(blob)
        for rev in revisions:
            link = repo / "snapshots" / rev / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revisions[-1])
    return repo


def test_a_cached_model_is_known_by_its_snapshot_name(tmp_path: Path, gguf_factory) -> None:
    src = gguf_factory("x.gguf", general_name="Tiny Thing")
    repo = _cache(tmp_path, {"tiny-q8_0.gguf": src})
    snap = repo / "snapshots" / "r1" / "tiny-q8_0.gguf"
    with opened(tmp_path / "r.duckdb") as con:
        result = scan_paths(con, [tmp_path / "hub"])
        model = queries.resolve_model(con, "tiny-q8_0")
        assert queries.resolve_model(con, "Org/Tiny-GGUF").model_id == model.model_id
        assert queries.model_fs_paths(con, model.model_id) == (str(snap),)
    assert result.new == (str(snap),)
    assert model.path == str(snap) and model.paths == (str(snap),)
    assert os.path.basename(model.path) == "tiny-q8_0.gguf"  # what `models` shows


def test_a_cached_split_set_is_one_model_named_by_its_parts(
    tmp_path: Path, tiny_split: DemoModel
) -> None:
    parts = write_demo_model(tmp_path / "w", tiny_split)
    repo = _cache(tmp_path, {p.name: p for p in parts})
    snaps = tuple(str(repo / "snapshots" / "r1" / p.name) for p in parts)
    with opened(tmp_path / "r.duckdb") as con:
        result = scan_paths(con, [tmp_path / "hub"])
        found = queries.resolve_model(con, "Tiny Split")
        fs_paths = queries.model_fs_paths(con, found.model_id)
    assert result.ok and result.n_models == 1
    assert found.status == "present" and found.paths == snaps
    assert fs_paths == snaps  # llama.cpp finds the other parts by the first one's name


def test_a_scan_of_the_blobs_alone_finds_the_snapshot_name(tmp_path: Path, gguf_factory) -> None:
    repo = _cache(tmp_path, {"tiny.gguf": gguf_factory("x.gguf")}, revisions=("old", "new"))
    with opened(tmp_path / "r.duckdb") as con:
        scan_paths(con, [repo / "blobs"], all_files=True)
        (path,) = con.execute("SELECT path FROM models").fetchone()
    assert path == str(repo / "snapshots" / "new" / "tiny.gguf")  # refs/main's revision


def test_names_of_paths() -> None:
    blob = f"/c/hub/{REPO}/blobs/abc"
    links = [f"/c/hub/{REPO}/snapshots/r2/a.gguf", f"/elsewhere/{REPO}/snapshots/r1/a.gguf"]
    assert snapshot_name(blob, links) == links[0]  # a link into another repository is not its
    assert snapshot_name("/models/a.gguf", links) is None
    assert snapshot_name(blob, []) is None
    assert repo_id(links[0]) == "Org/Tiny-GGUF" and repo_id("/models/a.gguf") is None
