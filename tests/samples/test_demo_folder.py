"""`specreg demo DIR` fills only a new or empty folder, or an earlier demo (issue 25, point 14):
it writes 24 sparse files of about 530 GB apparent, which no one should find among their own."""

from __future__ import annotations

from pathlib import Path

from support.cli import specreg


def test_a_folder_with_other_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    r = specreg("demo", str(folder))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: {folder} is not empty (notes.txt) and holds no demo: the demo writes 24 sparse"
        " files (about 530 GB apparent) there; give a new or empty folder, or --force to write"
        " into this one"
    )
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


def test_new_folder_earlier_demo_and_force(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    first = specreg("demo", str(folder))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("wrote 24 files under")
    again = specreg("demo", str(folder))  # an earlier demo: written again, nothing asked
    assert again.returncode == 0, again.stderr
    (folder / "notes.txt").write_text("mine")
    assert specreg("demo", str(folder)).returncode == 2
    forced = specreg("demo", str(folder), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in folder.iterdir()) == ["huggingface", "lmstudio", "notes.txt"]
