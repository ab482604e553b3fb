"""Where a model is named for choosing, two quants of one model never look alike (issue 25,
point 11): the ambiguity error and the models table show each one's quant and file name, and
the id a user types is never cut (point 15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import specreg
from support.fixtures import GGUFFactory
from support.tty import name_on_one_line, specreg_tty, too_wide

NAME = "Smollm2 135M 8k Lc100K Mix1 Ep2"


def _two_quants(gguf_factory: GGUFFactory) -> Path:
    for file, ftype in (("smollm2-Q8_0.gguf", 7), ("smollm2-Q4_0.gguf", 2)):
        path = gguf_factory(file, general_name=NAME, kv={"general.file_type": ftype})
    assert specreg("scan", str(path.parent)).returncode == 0
    return path.parent


def test_the_ambiguity_error_names_quant_and_file(gguf_factory: GGUFFactory) -> None:
    _two_quants(gguf_factory)
    models = {
        m["quant"]: m["model_id"] for m in json.loads(specreg("models", "--json").stdout)["models"]
    }
    r = specreg("show", NAME)
    assert r.returncode == 2
    first, second = sorted(
        [
            (models["Q8_0"], "Q8_0", "smollm2-Q8_0.gguf"),
            (models["Q4_0"], "Q4_0", "smollm2-Q4_0.gguf"),
        ]
    )
    listed = "; ".join(f"{mid[:10]} {quant} {file}" for mid, quant, file in (first, second))
    assert r.stderr.strip() == f"error: '{NAME}' matches 2 models ({listed}): give an id or path"


def test_models_at_80_columns_shows_whole_ids_and_file_names(gguf_factory: GGUFFactory) -> None:
    _two_quants(gguf_factory)
    found = json.loads(specreg("models", "--json").stdout)["models"]
    code, screen = specreg_tty("models", columns=80)
    assert code == 0, screen
    assert not too_wide(screen), screen
    for m in found:
        assert m["model_id"][:10] in screen
    assert "smollm2-Q8_0.gguf" in screen and "smollm2-Q4_0.gguf" in screen
    assert name_on_one_line(NAME, screen), screen


def test_an_alias_of_specreg_yaml_names_its_model(
    gguf_factory: GGUFFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, point 1: an alias the working folder's specreg.yaml declares names its model
    wherever a model is named, forgivingly (case, spaces, hyphens, underscores ignored)."""
    _two_quants(gguf_factory)
    models = {
        m["quant"]: m["model_id"] for m in json.loads(specreg("models", "--json").stdout)["models"]
    }
    work = tmp_path / "work"
    work.mkdir()
    (work / "specreg.yaml").write_text(
        f'version: 1\nmodels:\n  "{models["Q4_0"]}":\n    aliases: [small_smol]\n',
        encoding="utf-8",
    )
    monkeypatch.chdir(work)
    for ref in ("small_smol", "Small Smol", "SMALL-SMOL"):
        r = specreg("show", ref, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["model"]["model_id"] == models["Q4_0"]
    monkeypatch.chdir(tmp_path)  # another folder: its own declaration, or none
    assert specreg("show", "small_smol").returncode == 2
