"""The `specreg` entry point: the command group and the one place errors become exit codes."""

from __future__ import annotations

import importlib
import os
import sys

import click

from specreg import __version__
from specreg.errors import EXIT_USAGE, SpecregError

HELP = """specreg: a registry for speculative decoding with llama.cpp.

\b
Exit codes:
  0  clean
  1  findings: scan errors, incompatible pairs with --fail-on-findings, failed runs, drift
  2  usage error: bad arguments, unknown model, missing file

Set SPECREG_HOME to relocate all state; SPECREG_DEBUG=1 shows tracebacks.
"""


@click.group(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specreg")
def cli() -> None:
    pass


def _register() -> None:
    from specreg.cli import scan_cmds

    for module in (scan_cmds,):
        for command in module.COMMANDS:
            cli.add_command(command)
    for command in importlib.import_module("specreg.cli.run_cmds").COMMANDS:
        cli.add_command(command)
    for command in importlib.import_module("specreg.cli.declare_cmds").COMMANDS:
        cli.add_command(command)
    for command in importlib.import_module("specreg.cli.report_cmds").COMMANDS:
        cli.add_command(command)
    for command in importlib.import_module("specreg.cli.audit_cmds").COMMANDS:
        cli.add_command(command)
    for command in importlib.import_module("specreg.cli.recommend_cmds").COMMANDS:
        cli.add_command(command)


_register()


def main() -> None:
    try:
        # Without standalone mode click returns a command's `Exit(code)` instead of exiting.
        code = cli.main(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except SpecregError as err:
        if os.environ.get("SPECREG_DEBUG"):
            raise
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(EXIT_USAGE if err.exit_code == 2 else err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
