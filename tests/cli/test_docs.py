"""The README's command table is tested against the CLI (as sqlite-utils' test_docs.py does),
in both directions: every command, subcommand and option it names exists, and every command and
every option of every command is in it (in the table, in "More options" for that command, or in
"Shared options" for an option that means the same wherever it is taken)."""

from __future__ import annotations

import re

import click
import pytest

from specreg.cli.main import COMMAND_MODULES, cli

from support import REPO

README = REPO / "README.md"
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


def _subsection(title: str) -> str:
    table = command_table()
    start = table.index(f"### {title}")
    end = table.find("\n### ", start + 1)
    return table[start : end if end != -1 else len(table)]


def _rows(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [[c.strip() for c in _CELL_SPLIT.split(r)[1:-1]] for r in rows[1:]]  # no header


def more_options() -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(command, subcommand or None, options) for each command a "More options" row names in
    its first cell: every option in the row's second cell is that command's."""
    ctx = click.Context(cli)
    out = []
    for first, rest in _rows(_subsection("More options")):
        options = tuple(_OPTION.findall(rest.replace("\\|", "|")))
        assert options, f"a More options row names no option: {first}"
        for span in re.findall(r"`(specreg [^`]*)`", first):
            words = span.split()
            command = cli.get_command(ctx, words[1])
            sub = words[2] if isinstance(command, click.Group) and len(words) > 2 else None
            out.append((words[1], sub, options))
    return out


def shared_options() -> tuple[str, ...]:
    """The options of the "Shared options" table: the same meaning in every command."""
    return tuple(
        o for first, _ in _rows(_subsection("Shared options")) for o in _OPTION.findall(first)
    )


MORE = more_options()
SHARED = shared_options()


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
    DOCUMENTED + MORE,
    ids=[f"{n} {s or ''}".strip() for n, s, _ in DOCUMENTED + MORE],
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


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and "--help" not in p.opts]


def test_shared_options_are_shared() -> None:
    assert {"--db", "--json", "--llama-bin", "--task", "--threads"} <= set(SHARED)
    for option in SHARED:
        takers = [
            (n, s) for n, s in every_command()
            if any(option in (*p.opts, *p.secondary_opts) for p in _options(_command(n, s)))
        ]  # fmt: skip
        assert len(takers) >= 2, (
            f"README calls {option} shared, but {takers or 'no command'} take it"
        )


@pytest.mark.parametrize(
    ("name", "sub"), every_command(), ids=[f"{n} {s or ''}".strip() for n, s in every_command()]
)
def test_every_option_is_documented(name: str, sub: str | None) -> None:
    named = set(SHARED)
    for n, s, options in DOCUMENTED + MORE:
        if (n, s) == (name, sub):
            named.update(options)
    missing = [
        "/".join(p.opts)
        for p in _options(_command(name, sub))
        if not named & {*p.opts, *p.secondary_opts}
    ]
    where = f"specreg {name}{' ' + sub if sub else ''}"
    assert not missing, f"README does not document {missing} of `{where}`"
