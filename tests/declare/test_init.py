"""`specreg init` declares what the registry holds (issue 25, point 13): right after it,
`specreg plan` finds no drift, where every model used to be `undeclared-model` (exit 1) with
nothing to adopt them."""

from __future__ import annotations

from pathlib import Path

from support.cli import specreg, specreg_json
from support.fixtures import GGUFFactory


def test_plan_right_after_init_finds_no_drift(sparse_tree: Path, tmp_path: Path) -> None:
    db, spec = str(tmp_path / "registry.duckdb"), str(tmp_path / "specreg.yaml")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    r = specreg("init", "--spec", spec, "--db", db)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"wrote {spec}, declaring the registry's 15 model(s); `specreg plan` shows what changes "
        "from here"
    )
    plan = specreg("plan", "--spec", spec, "--db", db)
    assert (plan.returncode, plan.stdout.strip()) == (
        0,
        "no drift: 15 models and 0 roles as declared",
    )
    drift = specreg_json("plan", "--spec", spec, "--db", db, "--json")
    assert drift["drift"] is False and drift["n_declared"] == drift["n_on_disk"] == 15


def test_two_quants_of_one_name_and_an_odd_path_are_declared_apart(
    gguf_factory: GGUFFactory, tmp_path: Path
) -> None:
    folder = tmp_path / 'my "models"'
    for file, ftype in (("m-Q8_0.gguf", 7), ("m-Q4_0.gguf", 2)):
        gguf_factory(
            file, general_name="Same Name", kv={"general.file_type": ftype}, directory=folder
        )
    db, spec = str(tmp_path / "registry.duckdb"), tmp_path / "specreg.yaml"
    assert specreg("scan", str(folder), "--db", db).returncode == 0
    assert specreg("init", "--spec", str(spec), "--db", db).returncode == 0
    text = spec.read_text()
    assert "aliases: [Same-Name-Q8_0]" in text and "aliases: [Same-Name-Q4_0]" in text
    plan = specreg("plan", "--spec", str(spec), "--db", db)
    assert plan.returncode == 0, plan.stdout + plan.stderr


def test_propose_adopts_models_scanned_after_the_file_was_written(
    sparse_tree: Path, tmp_path: Path
) -> None:
    db, spec = str(tmp_path / "registry.duckdb"), tmp_path / "specreg.yaml"
    assert specreg("init", "--spec", str(spec), "--db", db).returncode == 0  # empty registry
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    assert specreg("plan", "--spec", str(spec), "--db", db).returncode == 1  # 15 undeclared

    plain = specreg("propose", "--spec", str(spec), "--db", db)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == [
        "nothing to propose: no measured run beats a pinned configuration",
        f"15 model(s) on disk are not declared: `specreg propose --adopt --spec {spec}` writes "
        "their declarations",
    ]
    out = tmp_path / "proposal.yaml"
    adopt = specreg("propose", "--adopt", "--spec", str(spec), "--db", db, "-o", str(out))
    assert adopt.returncode == 0, adopt.stderr
    assert adopt.stdout.count(" is on disk, not declared") == 15
    before = spec.read_text()
    applied = specreg("apply", str(out))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.count("updated models.") == 15
    assert spec.read_text().startswith(before.split("models: {}")[0])  # the comments above stay
    plan = specreg("plan", "--spec", str(spec), "--db", db)
    assert (plan.returncode, plan.stdout.strip()) == (
        0,
        "no drift: 15 models and 0 roles as declared",
    )
    again = specreg("apply", str(out))
    assert again.returncode == 2 and "is declared in" in again.stderr
