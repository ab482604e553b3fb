"""The docs are tested, as sqlite-utils' test_docs.py tests its own.

docs/cli.md, the command reference, is generated from the commands by scripts/cli_docs.py: it
must be what that script renders today, and, read back, name every command and every option,
each of which exists (both directions, so a broken generator cannot hide a command either).
The README shows commands rather than documenting them: every `specreg ...` line in its code
blocks (and in the guide pages', and every `specreg ...` or `--option` span of their prose) must
name a real command with real options, and the demo walk-through (demo, scan, models, drafts) is
run on a fresh home, its shown output checked against what the commands print on a terminal of
the same width. Every relative link of the README and docs/ resolves."""

from __future__ import annotations

import difflib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from specreg.cli.main import cli

from support import REPO
from support.tty import specreg_tty

README = REPO / "README.md"
CLI_MD = REPO / "docs" / "cli.md"
SCRIPT = REPO / "scripts" / "cli_docs.py"
REGENERATE = "python scripts/cli_docs.py"

_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
# An option line of `--help`: two spaces, the option column, then two spaces or the line's end.
_OPTION_LINE = re.compile(r"^ {2}(-\S.*?)(?: {2,}|$)")
_SECTION = re.compile(r"^## (specreg\b[^\n]*)\n\n```text\n(.*?)\n```", re.M | re.S)


# -- the CLI itself, walked independently of the generator -----------------------------------


# Contexts are made as the command line makes them (make_context): click caches a command's help
# option from the first context that asks, and a bare Context would cache `--help` without `-h`.
def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    return command.make_context(name, [], parent=parent, resilient_parsing=True)


def _walk(command: click.Command, ctx: click.Context) -> list[tuple[str, click.Command]]:
    out = [(ctx.command_path, command)]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, f"`{ctx.command_path} {name}` is listed but does not load"
            out += _walk(sub, _context(sub, name, ctx))
    return out


COMMANDS = dict(_walk(cli, _context(cli, "specreg", None)))


def _accepted(command: click.Command) -> set[str]:
    """Every spelling of every option the command takes, its help option included."""
    known = {"--help", "-h"}
    for param in command.params:
        known.update(param.opts)
        known.update(param.secondary_opts)
    return known


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


# -- docs/cli.md -----------------------------------------------------------------------------


def _render() -> str:
    """docs/cli.md as the script renders it now, in a process of its own (what a command's
    `--help` says must not depend on what this process did with the commands before)."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--stdout"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode("utf-8")


def documented() -> dict[str, set[str]]:
    """Command path -> the options its section of docs/cli.md lists."""
    sections = _SECTION.findall(CLI_MD.read_text(encoding="utf-8"))
    out: dict[str, set[str]] = {}
    for path, help_text in sections:
        options = help_text.split("\nOptions:\n", 1)[1] if "\nOptions:\n" in help_text else ""
        lines = [_OPTION_LINE.match(line) for line in options.split("\n\n")[0].splitlines()]
        out[path] = {o for m in lines if m for o in _OPTION.findall(m.group(1))}
    return out


DOCUMENTED = documented()


def test_cli_md_is_current() -> None:
    """docs/cli.md is exactly what the commands say about themselves today."""
    rendered = _render()
    current = CLI_MD.read_text(encoding="utf-8") if CLI_MD.exists() else ""
    if current != rendered:
        diff = difflib.unified_diff(
            current.splitlines(), rendered.splitlines(), "docs/cli.md", "rendered", lineterm="", n=1
        )
        shown = "\n".join(list(diff)[:40])
        pytest.fail(f"docs/cli.md is stale: run `{REGENERATE}`\n{shown}")


def test_cli_md_is_parsed() -> None:
    paths = {"specreg", "specreg scan", "specreg llama info", "specreg runs export"}
    assert paths <= set(DOCUMENTED)
    assert {"--db", "--json", "-v", "--verbose", "--all-files"} <= DOCUMENTED["specreg scan"]
    assert {"--recommend", "--no-recommend", "-o", "--output"} <= DOCUMENTED["specreg report"]


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_and_option_is_documented(path: str) -> None:
    assert path in DOCUMENTED, f"`{path}` is missing from docs/cli.md: run `{REGENERATE}`"
    missing = [
        "/".join(p.opts)
        for p in _options(COMMANDS[path])
        if not DOCUMENTED[path] & {*p.opts, *p.secondary_opts}
    ]
    assert not missing, f"docs/cli.md does not document {missing} of `{path}`: run `{REGENERATE}`"


@pytest.mark.parametrize("path", sorted(DOCUMENTED))
def test_every_documented_command_and_option_exists(path: str) -> None:
    assert path in COMMANDS, f"docs/cli.md documents `{path}`, which does not exist"
    unknown = sorted(DOCUMENTED[path] - _accepted(COMMANDS[path]))
    assert not unknown, f"docs/cli.md documents {unknown} for `{path}`, which it does not accept"


# -- the README ------------------------------------------------------------------------------

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SETUP = (
    "pip install -e '.[serve]'\n"
    "specreg demo ~/specreg-demo && specreg scan ~/specreg-demo && specreg models\n"
)
# The walk-through's commands that need no llama.cpp and take seconds: run on a fresh home.
CHEAP = {"demo", "scan", "models", "drafts"}
COLUMNS = 100  # the terminal width the README's excerpts were taken at


def code_blocks(page: Path = README) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of a page."""
    return _FENCE.findall(page.read_text(encoding="utf-8"))


def shown_commands(page: Path = README) -> list[tuple[str, list[str]]]:
    """(command line, the output the page shows after it) for every command line in the
    page's shell blocks: every line of an `sh` block, the `$ ` lines of a `console` block
    (a trailing backslash continues a line)."""
    out: list[tuple[str, list[str]]] = []
    for language, body in code_blocks(page):
        if language not in ("sh", "console"):
            continue
        lines = iter(body.replace("\\\n", " ").splitlines())
        for line in lines:
            if language == "sh" and line.strip() and not line.startswith("#"):
                out.append((line, []))
            elif language == "console" and line.startswith("$ "):
                out.append((line[2:], []))
            elif language == "console" and out:
                out[-1][1].append(line)
    return out


def specreg_calls(line: str) -> list[list[str]]:
    """The `specreg` invocations of a shell line, split at `&&`, `||`, `|` and `;`."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    calls: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", "||", "|", ";"):
            calls.append([])
        else:
            calls[-1].append(token)
    return [c for c in calls if c and c[0] == "specreg"]


def _resolve(words: list[str]) -> tuple[str, list[str]]:
    """The command path a `specreg ...` call names, and its option words."""
    ctx = _context(cli, "specreg", None)
    command: click.Command = cli
    rest = words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            if command.invoke_without_command:
                break  # `specreg runs RUN_ID`: an argument of the group itself
            pytest.fail(f"the docs show `{ctx.command_path} {rest[0]}`, which does not exist")
        ctx = _context(sub, rest[0], ctx)
        command, rest = sub, rest[1:]
    options = [w.split("=", 1)[0] for w in rest if w.startswith("-") and w != "-"]
    return ctx.command_path, options


def inline_commands(page: Path) -> list[str]:
    """`specreg ...` code spans in a page's prose, optional parts unbracketed
    (`specreg propose [--adopt]` names --adopt)."""
    prose = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return [re.sub(r"[\[\]]", " ", span) for span in re.findall(r"`(specreg [^`]+)`", prose)]


# The pages written by hand that show or name commands (docs/measurements/ are dated reports).
WRITTEN = [README, *(REPO / "docs" / f"{name}.md" for name in ("guide", "serving", "architecture"))]
README_CALLS = [
    (page.relative_to(REPO), call)
    for page in WRITTEN
    for line in [line for line, _ in shown_commands(page)] + inline_commands(page)
    for call in specreg_calls(line)
]


def test_the_readme_shows_the_set_up_and_the_test_command() -> None:
    """The two set-up lines (tests/cli/test_first_hour.py plays them) and the one test command,
    which .ci/run runs."""
    blocks = [body for language, body in code_blocks() if language == "sh"]
    assert SETUP in blocks, "the README's set-up lines changed"
    assert "scripts/test\n" in blocks
    assert "exec scripts/test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_readme_commands_are_found() -> None:
    paths = {_resolve(call)[0] for page, call in README_CALLS if page == Path("README.md")}
    assert {"specreg demo", "specreg scan", "specreg models"} <= paths


@pytest.mark.parametrize(
    ("page", "call"), README_CALLS, ids=[f"{p}: {' '.join(c)[:50]}" for p, c in README_CALLS]
)
def test_every_shown_command_and_option_exists(page: Path, call: list[str]) -> None:
    """Every `specreg ...` the README and the guide pages show or name: the command exists and
    takes every option given."""
    path, options = _resolve(call)
    unknown = sorted(set(options) - _accepted(COMMANDS[path]))
    assert not unknown, f"{page} gives `{path}` {unknown}, which it does not accept"


ALL_OPTIONS = set().union(*(_accepted(command) for command in COMMANDS.values()))


@pytest.mark.parametrize("page", WRITTEN, ids=[str(p.relative_to(REPO)) for p in WRITTEN])
def test_every_option_named_in_prose_exists(page: Path) -> None:
    """An option the prose names on its own (`--policy speed`) is one some command takes."""
    prose = _FENCE.sub("", page.read_text(encoding="utf-8"))
    unknown = sorted(set(re.findall(r"`(--[A-Za-z][\w-]*)", prose)) - ALL_OPTIONS)
    assert not unknown, f"{page.relative_to(REPO)} names {unknown}, which no command takes"


def _norm(line: str, timings: bool = False) -> str:
    """A line with its runs of spaces as one (tables pad to the terminal); with `timings`, every
    duration in seconds as `# s` (the one figure that differs from run to run)."""
    line = " ".join(line.split())
    return re.sub(r"\b\d+(\.\d+)? s\b", "# s", line) if timings else line


def test_the_readme_walk_through_runs(tmp_path: Path) -> None:
    """The walk-through's demo, scan, models and drafts, on a fresh home with `~` in a temporary
    folder: each exits 0 and prints every line the README shows of it (a timing may differ)."""
    home = tmp_path / "user"

    def here(word: str) -> str:
        return str(home / word[2:]) if word.startswith("~/") else word

    checked = []
    for line, shown in shown_commands():
        calls = specreg_calls(line)
        if not shown or len(calls) != 1 or _resolve(calls[0])[0].split()[-1] not in CHEAP:
            continue
        code, screen = specreg_tty(*map(here, calls[0][1:]), columns=COLUMNS)
        assert code == 0, (line, screen)
        real = screen.replace(str(home), "~").splitlines()
        exact = {_norm(r) for r in real}
        timed = {_norm(r, timings=True) for r in real}
        for want in shown:
            if want.strip() in ("", "..."):
                continue
            assert _norm(want) in exact or _norm(want, timings=True) in timed, (
                f"the README shows `{want}` for `{line}`, which prints:\n{screen}"
            )
        checked.append(_resolve(calls[0])[0])
    assert {"specreg demo", "specreg scan", "specreg models", "specreg drafts"} <= set(checked)


# -- links -----------------------------------------------------------------------------------


def _headings(page: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown page (not those inside code blocks)."""
    prose = _FENCE.sub("", page.read_text(encoding="utf-8"))
    titles = [line.lstrip("#").strip() for line in prose.splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", t.lower()).replace(" ", "-") for t in titles}


PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_link_resolves(page: Path) -> None:
    """A relative link from the README or docs/ names a file that exists and, into a page, one
    of its headings: moving a section or a report cannot leave a link behind."""
    prose = _FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = page.parent / path if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _headings(dest)):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to what is not there: {broken}"
