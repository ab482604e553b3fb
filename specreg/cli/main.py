"""The `specreg` entry point: the command group and the one place errors become exit codes."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import click

from specreg import __version__
from specreg.errors import EXIT_USAGE, SpecregError

HELP = """specreg: a registry for speculative decoding with llama.cpp.

\b
Exit codes:
  0  clean
  1  findings: scan errors, incompatible pairs with --fail-on-findings, failed runs, drift
  2  usage error: bad arguments, unknown model, missing file
  3  host busy: other processes kept the CPU busy, nothing was measured (--allow-load)

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
    "capacity": "capacity_cmds",
    "doctor": "doctor_cmds",
    "calibrate": "doctor_cmds",
    "lookup-cache": "lookup_cmds",
    "sweep": "sweep_cmds",
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


def _takes_db(command: click.Command) -> bool:
    if isinstance(command, click.Group):
        return any(_takes_db(c) for c in command.commands.values())
    return any(p.name == "db_path" for p in command.params)


@click.group(cls=LazyGroup, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specreg")
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Registry database for the command, as its own --db (default: "
    "$SPECREG_HOME/registry.duckdb).",
)
@click.pass_context
def cli(ctx: click.Context, db_path: Path | None) -> None:
    if db_path is None:
        return
    from specreg.cli.common import DB_META

    name = ctx.invoked_subcommand
    command = cli.get_command(ctx, name) if name else None
    if command is not None and not _takes_db(command):
        raise click.UsageError(f"`specreg {name}` uses no registry: leave out --db", ctx)
    ctx.meta[DB_META] = db_path


# How the CLI spells the core's parameters (specreg.errors.param): a core error names the
# parameter, the CLI says the option that sets it.
FLAGS = {
    "against": "--against",
    "chunks": "--chunks",
    "cores": "--cores",
    "db": "--db",
    "draft": "--draft",
    "dry_run": "--dry-run",
    "engine": "--engine",
    "experts": "--experts",
    "force": "--force",
    "format": "--format",
    "from_runs": "--from-runs",
    "host": "--host",
    "host_facts": "--host-facts",
    "k": "--k",
    "llama_bin": "--llama-bin",
    "lookup_cache": "--lookup-cache",
    "max_logits_gb": "--max-logits-gb",
    "memory": "--memory",
    "p_min": "--p-min",
    "ray": "--ray",
    "repetitions": "--repetitions",
    "retries": "--retries",
    "retry_elsewhere": "--retry-elsewhere",
    "scored": "--scored",
    "server_args": "--server-arg",
    "spec": "--spec",
    "spec_type": "--spec-type",
    "task": "--task",
    "temperature": "--temp",
    "threads": "--threads",
    "type_k": "--type-k",
    "via": "--via",
    "warm_first": "--warm",
}


def error_line(err: SpecregError) -> str:
    """A core error as the CLI says it: its parameters as the options that set them."""
    return err.spelled(FLAGS)


def _usage_line(err: click.ClickException) -> str:
    """A click usage error as one line that says what to do: the problem, then the help to
    read (click's own form is a usage block, a hint and the error over four lines)."""
    message = err.format_message().replace("\n", " ").strip().rstrip(".")
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        where = ctx.command_path
    else:  # an option's parse error carries no context: name the command from argv
        named = next((a for a in sys.argv[1:] if a in COMMAND_MODULES), None)
        where = f"specreg {named}" if named else "specreg"
    if isinstance(err, click.UsageError):
        return f"error: {message} (see `{where} --help`)"
    return f"error: {message}"


def main() -> None:
    # Errors go through the safe console: a message may quote a model name or a path.
    from specreg.cli.common import err_console

    try:
        # Without standalone mode click returns a command's `Exit(code)` instead of exiting.
        code = cli.main(standalone_mode=False, prog_name="specreg")
        if isinstance(code, int) and code:
            sys.exit(code)
    except SpecregError as err:
        if os.environ.get("SPECREG_DEBUG"):
            raise
        err_console().print(f"error: {error_line(err)}")
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        err_console().print("aborted")
        sys.exit(130)
    except click.ClickException as err:
        err_console().print(_usage_line(err))
        sys.exit(EXIT_USAGE if err.exit_code == 2 else err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
