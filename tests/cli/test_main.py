"""The entry point: every command is reachable, and the lazy map matches the modules."""

from __future__ import annotations

import importlib
import subprocess
import sys

from specreg.cli.main import COMMAND_MODULES


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
