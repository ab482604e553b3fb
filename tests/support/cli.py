"""Running specreg as a user does, for the CLI tests: a fresh process through the real entry
point, where exit codes and the terminal-safe output are decided."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import click

from specreg.cli.main import COMMAND_MODULES, cli


def specreg(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`specreg ARGS` in a subprocess. Output bytes that are not UTF-8 come back as lone
    surrogates instead of failing the decode, so a test can see that they never appear."""
    return subprocess.run(
        [sys.executable, "-m", "specreg", *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def specreg_json(*args: str, codes: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """The JSON document `specreg ARGS` prints, after checking its exit code."""
    r = specreg(*args)
    assert r.returncode in codes, r.stderr
    assert r.stdout.startswith("{"), r.stderr
    return json.loads(r.stdout)


def specreg_without_llama(*args: str) -> subprocess.CompletedProcess[str]:
    """`specreg ARGS` with no llama.cpp anywhere (none on PATH, SPECREG_LLAMA_BIN pointing
    nowhere, an empty cache): for checks that must come before llama.cpp is needed."""
    env = {"PATH": "/usr/bin:/bin", "SPECREG_LLAMA_BIN": "/nonexistent"}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("SPECREG_HOME", "HOME"))})
    env["SPECREG_CACHE"] = os.environ["SPECREG_HOME"] + "/cache"
    return subprocess.run(
        [sys.executable, "-m", "specreg", *args], capture_output=True, text=True, env=env
    )


def command_options() -> list[tuple[str, click.Option]]:
    """Every option of every command the user runs, with the command's path (`run`, `llama
    build`): a group stands for its subcommands."""
    ctx = click.Context(cli)
    out = []
    for name in sorted(COMMAND_MODULES):
        command = cli.get_command(ctx, name)
        assert command is not None
        commands = [(name, command)]
        if isinstance(command, click.Group):
            commands = [(f"{name} {s}", command.get_command(ctx, s)) for s in command.commands]
        for path, cmd in commands:
            assert cmd is not None
            out += [(path, p) for p in cmd.params if isinstance(p, click.Option)]
    return out
