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


# Command -> the module defining it. Modules load only when one of their commands runs, so
# `specreg scan` does not pay for scikit-learn or matplotlib.
COMMAND_MODULES = {
    "scan": "scan_cmds",
    "models": "scan_cmds",
    "show": "scan_cmds",
    "demo": "scan_cmds",
    "compat": "audit_cmds",
    "drafts": "audit_cmds",
    "audit": "audit_cmds",
    "graph": "audit_cmds",
    "recommend": "recommend_cmds",
    "train": "recommend_cmds",
    "tune": "recommend_cmds",
    "run": "run_cmds",
    "verify": "run_cmds",
    "runs": "run_cmds",
    "llama": "run_cmds",
    "report": "report_cmds",
    "plan": "declare_cmds",
    "import": "declare_cmds",
    "propose": "declare_cmds",
    "apply": "declare_cmds",
    "export": "declare_cmds",
    "init": "declare_cmds",
    "quality": "quality_cmds",
    "agree": "quality_cmds",
    "serve": "serve_cmds",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(cmd_name)
        if module is None:
            return None
        commands = importlib.import_module(f"specreg.cli.{module}").COMMANDS
        return next((c for c in commands if c.name == cmd_name), None)


@click.group(cls=LazyGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specreg")
def cli() -> None:
    pass


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
