"""The entry point: every command is reachable, and the lazy map matches the modules."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from specreg.cli.main import COMMAND_MODULES

from support.cli import specreg


def test_lazy_command_map_matches_the_modules() -> None:
    defined = {}
    for module in set(COMMAND_MODULES.values()):
        for command in importlib.import_module(f"specreg.cli.{module}").COMMANDS:
            defined[command.name] = module
    assert defined == COMMAND_MODULES


def test_help_lists_exit_codes_and_every_command() -> None:
    r = subprocess.run([sys.executable, "-m", "specreg", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert "2  usage error" in r.stdout
    for name in COMMAND_MODULES:
        assert f"  {name} " in r.stdout


def test_unknown_command_is_a_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "specreg", "scna"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "No such command 'scna'" in r.stderr


def test_db_before_the_command_is_the_commands_db(scanned_db: Path, tmp_path: Path) -> None:
    # issue 41: `specreg --db X models` was refused though --db is a shared option
    before = specreg("--db", str(scanned_db), "models", "--json")
    assert before.returncode == 0, before.stderr
    assert before.stdout == specreg("models", "--db", str(scanned_db), "--json").stdout
    # the command's own --db wins over the group's
    other = tmp_path / "none.duckdb"
    r = specreg("--db", str(scanned_db), "models", "--db", str(other))
    assert r.returncode != 0 and f"no registry at {other}" in r.stderr
    # a command that reads no registry says so rather than ignoring it
    r = specreg("--db", str(scanned_db), "demo", str(tmp_path / "demo"))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: `specreg demo` uses no registry: leave out --db (see `specreg --help`)"
    )
