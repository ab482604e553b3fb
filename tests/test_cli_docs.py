"""The README's command table is tested against the CLI (as sqlite-utils' test_docs.py does):
every command, subcommand and option it names exists, and every command is in it."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from specreg.cli.main import COMMAND_MODULES, cli

README = Path(__file__).resolve().parent.parent / "README.md"
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_WORD = re.compile(r"^[a-z][a-z0-9-]*$")


def command_table() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Commands")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def documented() -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(command, subcommand or None, options) for every `specreg ...` span in the table's
    first column."""
    ctx = click.Context(cli)
    out = []
    for line in command_table().splitlines():
        if not line.startswith("| `specreg"):
            continue
        first_cell = _CELL_SPLIT.split(line)[1]
        for span in re.findall(r"`(specreg [^`]*)`", first_cell):
            span = span.replace("\\|", "|")
            words = span.split()
            name = words[1]
            command = cli.get_command(ctx, name)
            subs: list[str | None] = [None]
            if isinstance(command, click.Group):
                subs = [w for w in words[2:] if _WORD.match(w)]
                subs = [s for s in subs if s in command.list_commands(ctx)] or [None]
            options = tuple(_OPTION.findall(span))
            out += [(name, sub, options) for sub in subs]
    return out


DOCUMENTED = documented()


def _command(name: str, sub: str | None) -> click.Command:
    ctx = click.Context(cli)
    command = cli.get_command(ctx, name)
    assert command is not None, f"README names `specreg {name}`, which does not exist"
    if sub is not None:
        assert isinstance(command, click.Group)
        command = command.get_command(ctx, sub)
        assert command is not None, f"README names `specreg {name} {sub}`, which does not exist"
    return command


def test_the_table_is_parsed() -> None:
    names = {name for name, _, _ in DOCUMENTED}
    assert {"scan", "recommend", "export", "llama"} <= names
    assert ("llama", "info", ()) in DOCUMENTED
    assert ("compat", None, ("--json", "--llama-build", "--llama-bin")) in DOCUMENTED


@pytest.mark.parametrize(
    ("name", "sub", "options"),
    DOCUMENTED,
    ids=[f"{n} {s or ''}".strip() for n, s, _ in DOCUMENTED],
)
def test_every_documented_command_and_option_exists(
    name: str, sub: str | None, options: tuple[str, ...]
) -> None:
    command = _command(name, sub)
    known = {"--help", "-h"}
    for param in command.params:
        known.update(param.opts)
        known.update(param.secondary_opts)
    missing = [o for o in options if o not in known]
    where = f"specreg {name}{' ' + sub if sub else ''}"
    assert not missing, f"README documents {missing} for `{where}`, which it does not accept"


def every_command() -> list[tuple[str, str | None]]:
    ctx = click.Context(cli)
    out: list[tuple[str, str | None]] = []
    for name in sorted(COMMAND_MODULES):
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            out += [(name, sub) for sub in sorted(command.list_commands(ctx))]
        else:
            out.append((name, None))
    return out


@pytest.mark.parametrize(
    ("name", "sub"), every_command(), ids=[f"{n} {s or ''}".strip() for n, s in every_command()]
)
def test_every_command_is_documented(name: str, sub: str | None) -> None:
    assert (name, sub) in {(n, s) for n, s, _ in DOCUMENTED}, (
        f"`specreg {name}{' ' + sub if sub else ''}` is missing from the README's command table"
    )
