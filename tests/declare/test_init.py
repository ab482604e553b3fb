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
    roles = r.stdout.split(" to scan and ")[1].split(" ")[0]
    assert int(roles) > 0
    assert " ".join(r.stdout.split()) == (
        f"wrote {spec}, declaring the registry's 15 model(s), 1 folder(s) or store(s) to scan "
        f"and {roles} role(s), each target with its best draft; `specreg plan` shows what "
        "changes from here, `specreg export` how to run them"
    )
    plan = specreg("plan", "--spec", spec, "--db", db)
    assert (plan.returncode, plan.stdout.strip()) == (
        0,
        f"no drift: 15 models and {roles} roles as declared",
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
        "no drift: 15 models and 0 roles as declared",  # init wrote none: the registry was empty
    )
    again = specreg("apply", str(out))
    assert again.returncode == 2 and "is declared in" in again.stderr


def test_init_proposes_roles_and_the_roots_it_scanned(sparse_tree: Path, tmp_path: Path) -> None:
    """Issue 41 point 10: right after a scan `init` declared 15 models with `roles: {}` and
    `roots: []`, and `export` then wrote a script that runs nothing. Now each target gets the
    draft `specreg drafts` ranks first, the roots are the scan's, and export runs them."""
    from specreg.declare.spec import load_spec

    db, spec = str(tmp_path / "registry.duckdb"), tmp_path / "specreg.yaml"
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    assert specreg("init", "--spec", str(spec), "--db", db).returncode == 0
    declared, _ = load_spec(spec)
    assert declared.roots == (str(sparse_tree),)
    alias = {m.id: m.aliases[0] for m in declared.models}
    by_target = {r.target: r for r in declared.roles}
    assert declared.roles and all(r.name == r.target for r in declared.roles)
    for model_id, name in alias.items():
        drafts = specreg_json("drafts", model_id, "--db", db, "--json")["drafts"]
        role = by_target.get(name)
        if not drafts:
            assert role is None, name  # no draft, no role
            continue
        assert role is not None, name
        (config,) = role.configs
        assert (config.task, declared_id(declared, config.draft)) == (
            "default",
            drafts[0]["draft"]["id"],
        )
        assert config.spec_types == (drafts[0]["spec_type"],)
    export = specreg("export", "--format", "llama-server", "--spec", str(spec), "--db", db)
    assert export.returncode == 0, export.stderr
    assert export.stdout.count("\n    --spec-draft-model ") == len(declared.roles)


def declared_id(spec, ref):  # type: ignore[no-untyped-def]
    found = spec.model(ref)
    return found.id if found is not None else None


def test_export_without_roles_says_what_to_do(tmp_path: Path) -> None:
    spec = tmp_path / "specreg.yaml"
    assert specreg("init", "--spec", str(spec)).returncode == 0  # an empty registry: no roles
    r = specreg("export", "--format", "llama-server", "--spec", str(spec))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        f"error: {spec} declares no roles, so there is nothing to export: add one (a target and "
        "its configs), or write a new file with `specreg init --spec NEW.yaml`, which gives "
        "each target its best draft\n"
    )
