"""Untrusted text on a terminal and in the command lines specreg prints.

Every string that comes from a GGUF file or the disk (names, token texts, templates,
architectures, file names, llama.cpp's messages) may hold control characters. On a terminal
`ESC[2J` clears the screen, `ESC]0;...BEL` sets the window title and OSC 52 writes the
clipboard; C1 bytes (U+0080-U+009F, `\\x9b` is a one-byte CSI) do the same on some terminals;
bidi overrides make a name read as something else. `terminal_safe` writes each such character
as a visible escape (`\\x1b`, `\\u202e`) and leaves every other character, backslashes
included, as it is: a second pass changes nothing, so a layer that escapes again is harmless.

A command line is quoted for the shell it is pasted into (`shell_join`): plain arguments as
`shlex.quote` does, an argument holding such characters in bash's `$'...'` form, so the pasted
line names exactly the file on disk (a non-UTF-8 name included) and the terminal never sees a
raw control character.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable

# C0, DEL and C1 controls; Unicode bidi controls (the "Trojan Source" characters); lone
# surrogates, which is how Python spells the undecodable bytes of a file name (os.fsdecode).
C0 = "\x00-\x1f"
BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
ABOVE_C0 = "\x7f-\x9f" + BIDI  # what JSON and YAML leave raw in a string
SURROGATES = "\ud800-\udfff"
_UNSAFE = re.compile(f"[{C0}{ABOVE_C0}{SURROGATES}]")

# How much of one untrusted string a human view shows (`show --full` shows everything).
FIELD_LIMIT = 120
TEXT_LIMIT = 2000


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the undecodable byte code-0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """`text` with every character that can drive a terminal written as a visible escape."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def is_terminal_safe(text: str) -> bool:
    return _UNSAFE.search(text) is None


def clip(text: str, limit: int | None = FIELD_LIMIT) -> str:
    """`text` cut to `limit` characters for display, saying how many were left out.

    Cut before escaping: a 10 MB name costs the first `limit` characters, not 10 MB of work.
    """
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def shown(value: object, limit: int | None = FIELD_LIMIT) -> str:
    """One untrusted value as a human view shows it: cut to `limit`, then made terminal-safe."""
    return terminal_safe(clip(value if isinstance(value, str) else str(value), limit))


# Quoting for the shell ------------------------------------------------------------------

_PRINTABLE_ASCII = frozenset(range(0x20, 0x7F))


def _bytes(text: str) -> bytes:
    """The bytes a file name stands for (lone surrogates that os.fsdecode cannot have made are
    kept as their UTF-8-like code units rather than failing)."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def shell_quote(arg: str | os.PathLike[str]) -> str:
    """One argument quoted for bash: `shlex.quote`, or `$'...'` when it holds a control
    character, a bidi control or an undecodable byte (each written as `\\xNN` of its bytes)."""
    text = os.fspath(arg)
    if is_terminal_safe(text):
        return shlex.quote(text)
    out = []
    for byte in _bytes(text):  # surrogates back to the file name's own bytes
        if byte in (0x27, 0x5C):  # ' and \ need a backslash inside $'...'
            out.append("\\" + chr(byte))
        elif byte in _PRINTABLE_ASCII:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return "$'" + "".join(out) + "'"


def shell_join(argv: Iterable[str | os.PathLike[str]]) -> str:
    """A command line that runs exactly `argv` when pasted into bash, and prints safely."""
    return " ".join(shell_quote(a) for a in argv)


def sh_quote(arg: str | os.PathLike[str]) -> str:
    """One argument quoted for a POSIX sh script (dash has no `$'...'`): `shlex.quote`, or
    single-quoted runs joined with `"$(printf '\\ooo')"` for each control byte. A newline
    stays inside the single quotes (exact, and harmless to a terminal); command substitution
    would drop it."""
    text = os.fspath(arg)
    if is_terminal_safe(text):
        return shlex.quote(text)
    out: list[str] = []
    run: list[str] = []
    for ch in text:
        if ch == "\n" or is_terminal_safe(ch):
            run.append(ch)
            continue
        if run:
            out.append(shlex.quote("".join(run)))
            run.clear()
        octal = "".join(f"\\{b:03o}" for b in _bytes(ch))  # a surrogate is its own byte
        out.append(f"\"$(printf '{octal}')\"")
    if run:
        out.append(shlex.quote("".join(run)))
    return "".join(out)


def sh_join(argv: Iterable[str | os.PathLike[str]]) -> str:
    return " ".join(sh_quote(a) for a in argv)


# XML ------------------------------------------------------------------------------------

# XML 1.0 cannot hold C0 controls other than tab, newline and carriage return, not even as
# character references: they are written as visible escapes. DEL, C1 and bidi controls are
# legal XML but act on a terminal: they become character references, which parse back to them.
_XML_ILLEGAL = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f{SURROGATES}]")
_XML_REF = re.compile(f"[{ABOVE_C0}]")


def xml_safe(text: str) -> str:
    """Serialized XML made valid and terminal-safe (see the rules above)."""
    text = _XML_ILLEGAL.sub(_escape, text)
    return _XML_REF.sub(lambda m: f"&#x{ord(m.group()):x};", text)
