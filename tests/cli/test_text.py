"""Terminal-safe text and shell quoting (specreg.text), the safe console every command prints
through, and the rule that no command prints any other way."""

from __future__ import annotations

import ast
import io
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.table import Table
from rich.text import Text

from specreg.cli.common import SafeConsole, json_text
from specreg.text import clip, sh_quote, shell_quote, terminal_safe, xml_safe

from support import REPO

CLI = REPO / "specreg" / "cli"
UNSAFE = "\x1b\x07\x9b\x00\x7f\u202e\udcff"
# Any text, including lone surrogates (undecodable bytes of file names).
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["", UNSAFE, "a\nb", "x $(touch pwned)", "it's", "\\x1b", os.fsdecode(b"n\xff\xfeq")]
)


def rendered(*objects: object, width: int = 200) -> str:
    out = io.StringIO()
    SafeConsole(file=out, width=width, force_terminal=False).print(*objects)
    return out.getvalue()


@given(TEXT)
def test_terminal_safe_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    safe = terminal_safe(text)
    assert terminal_safe(safe) == safe  # a second pass changes nothing
    assert not any(c in safe for c in UNSAFE)
    assert all(ord(c) >= 0x20 and not 0x7F <= ord(c) <= 0x9F for c in safe)
    safe.encode("utf-8")  # lone surrogates became escapes


def test_escapes_are_the_bytes_a_reader_expects() -> None:
    assert terminal_safe("a\x1b[2J\x07\x9b\u202eb\\x1b") == r"a\x1b[2J\x07\x9b\u202eb\x1b"
    assert terminal_safe(os.fsdecode(b"n\xffq")) == r"n\xffq"
    assert clip("x" * 10, 4) == "xxxx... (6 more characters)"
    assert clip("x" * 10, None) == "x" * 10


def test_the_console_escapes_strings_tables_titles_and_styled_text() -> None:
    table = Table(title="T\x1b]0;title\x07")
    table.add_column("name", style="bold")
    table.add_row("x\x1b[2J\x9b")
    out = rendered(table, "m\x1b[31m", Text.assemble(("s\x1b", "red"), " [red]x[/] :smile:"))
    assert r"T\x1b]0;title\x07" in out
    assert r"x\x1b[2J\x9b" in out
    assert r"m\x1b[31m" in out
    assert r"s\x1b [red]x[/] :smile:" in out  # markup and emoji codes print as written
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out


def test_the_console_keeps_styles_that_carry_no_data() -> None:
    out = io.StringIO()
    console = SafeConsole(file=out, width=80, force_terminal=True, color_system="standard")
    console.print(Text.assemble(("ok\x1b", "green"), " plain"))
    assert "\x1b[32mok\\x1b\x1b[0m plain" in out.getvalue()


def test_the_console_cuts_one_long_string() -> None:
    out = rendered("n" * 100_000)
    assert len(out) < 3_000 and "(98,000 more characters)" in out
    full = io.StringIO()
    SafeConsole(file=full, width=80, limit=None).print("n" * 100_000)
    assert full.getvalue().count("n") == 100_000


@given(TEXT)
def test_json_text_is_exact_and_terminal_safe(text: str) -> None:
    import json

    doc = {"version": "1", "kind": "t", "name": text}
    out = json_text(doc)
    assert json.loads(out)["name"] == text
    assert not any(c in out for c in "\x1b\x07\x9b\x7f\u202e")
    out.encode("utf-8")


def _name_bytes(text: str) -> bytes | None:
    """The bytes of a file name `text` can stand for; None for lone surrogates os.fsdecode
    never produces (no file on disk has such a name)."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        return None


def _run(shell: str, quoted: str, cwd: Path) -> bytes:
    r = subprocess.run([shell, "-c", "printf '%s|' " + quoted], cwd=cwd, capture_output=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(TEXT)
def test_shell_quote_round_trips_through_bash(tmp_path: Path, text: str) -> None:
    quoted = shell_quote(text)
    assert terminal_safe(quoted) == quoted
    name = _name_bytes(text)
    if name is not None and b"\0" not in name:  # an argument cannot hold NUL
        assert _run("bash", quoted, tmp_path) == name + b"|"
    assert not (tmp_path / "pwned").exists()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(TEXT)
def test_sh_quote_round_trips_through_dash(tmp_path: Path, text: str) -> None:
    quoted = sh_quote(text)
    assert terminal_safe(quoted.replace("\n", "")) == quoted.replace("\n", "")
    name = _name_bytes(text)
    if name is not None and b"\0" not in name:
        assert _run("dash", quoted, tmp_path) == name + b"|"
    assert not (tmp_path / "pwned").exists()


def test_xml_safe_is_valid_xml_that_parses_back_where_xml_can() -> None:
    import xml.etree.ElementTree as ET

    doc = xml_safe('<a n="x\x1b\x9b\u202e"/>')
    assert ET.fromstring(doc).get("n") == "x\\x1b\x9b\u202e"
    assert "\x9b" not in doc and "\x1b" not in doc


def _output_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = ast.unparse(f)
            if name in (
                "print",
                "click.echo",
                "click.secho",
                "sys.stdout.write",
                "sys.stderr.write",
            ):
                found.append(f"{path.name}:{node.lineno} {name}")
            if name.endswith("Console") or name == "dumps" or name.endswith(".dumps"):
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


@pytest.mark.parametrize(
    "path", sorted(p for p in CLI.glob("*.py") if p.name != "common.py"), ids=str
)
def test_commands_print_only_through_the_safe_helpers(path: Path) -> None:
    """A command that wrote with click.echo, print or its own Console could put a model name on
    the terminal raw; console()/err_console()/emit/write_output are the only ways out."""
    assert _output_calls(path) == []
