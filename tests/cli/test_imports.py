"""A command imports what it uses when it runs: `--help` of the tool and of every command,
`--version`, `models`, `show`, `runs` and `plan` never load scikit-learn, SciPy, matplotlib,
networkx, jinja2 or the runner. Each case runs in a fresh interpreter and reports the modules it
loaded (a behaviour test, not a timing one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from specreg.cli.main import COMMAND_MODULES, cli

HEAVY = ("sklearn", "scipy", "matplotlib", "networkx", "jinja2", "specreg.runner")
# --help reads no registry either: DuckDB alone costs as much again as the floor
HELP_HEAVY = (*HEAVY, "duckdb")

# Runs the CLI in-process (as `specreg` does), then prints which heavy modules it loaded.
PROBE = """
import json, sys
from specreg.cli.main import main
heavy = json.loads(sys.argv[2])
sys.argv = ["specreg", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
finally:
    loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
    sys.__stderr__.write("\\nLOADED " + json.dumps(loaded) + "\\n")
"""


def loaded_by(
    args: list[str], env: dict[str, str] | None = None, heavy: tuple[str, ...] = HEAVY
) -> tuple[list[str], str]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(heavy)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    marker = r.stderr.rsplit("LOADED ", 1)
    assert len(marker) == 2, r.stderr
    return json.loads(marker[1]), r.stdout + r.stderr


def every_command_path() -> list[list[str]]:
    """Every command and subcommand as the user types it (`graph export`, `llama build`)."""
    ctx = click.Context(cli)
    paths: list[list[str]] = []
    for name in sorted(COMMAND_MODULES):
        command = cli.get_command(ctx, name)
        assert command is not None, name
        paths.append([name])
        if isinstance(command, click.Group):
            paths += [[name, sub] for sub in sorted(command.list_commands(ctx))]
    return paths


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-h"]], ids=" ".join)
def test_the_tool_alone_loads_nothing_heavy(args: list[str]) -> None:
    loaded, output = loaded_by(args, heavy=HELP_HEAVY)
    assert loaded == [], output


@pytest.mark.parametrize("path", every_command_path(), ids=" ".join)
def test_every_command_help_loads_nothing_heavy(path: list[str]) -> None:
    loaded, output = loaded_by([*path, "--help"], heavy=HELP_HEAVY)
    assert "Usage: specreg " + " ".join(path) in output
    assert loaded == [], output


@pytest.fixture
def registry(gguf_factory, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths

    db = tmp_path / "registry.duckdb"
    with opened(db) as con:
        assert scan_paths(con, [gguf_factory("a.gguf", general_name="tiny-a").parent]).ok
    return db


@pytest.mark.parametrize(
    "args",
    [["models"], ["models", "--json"], ["show", "tiny-a"], ["show", "tiny-a", "--json"], ["runs"]],
    ids=" ".join,
)
def test_read_commands_load_nothing_heavy(registry: Path, args: list[str]) -> None:
    loaded, output = loaded_by([*args, "--db", str(registry)])
    assert "error:" not in output
    assert loaded == [], output


def test_plan_loads_nothing_heavy(registry: Path, tmp_path: Path) -> None:
    from specreg.registry.db import opened
    from specreg.registry.queries import list_models

    with opened(registry, read_only=True) as con:
        (model,) = list_models(con)
    spec = tmp_path / "specreg.yaml"
    spec.write_text(
        f"version: 1\nmodels:\n  {model.model_id}:\n    aliases: [a]\n"
        "roles:\n  chat:\n    target: a\n"
    )
    loaded, output = loaded_by(["plan", "--spec", str(spec), "--db", str(registry)])
    assert "no-compatible-draft" in output  # the role's draft check ran
    assert loaded == [], output


def test_the_probe_sees_a_heavy_import(registry: Path) -> None:
    """The probe itself works: a command that needs the auditor's graph loads networkx."""
    loaded, output = loaded_by(["graph", "export", "--db", str(registry)])
    assert "networkx" in loaded, output
