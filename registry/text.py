"""Untrusted text as the registry stores it: file names and reasons that came from the disk.

Paths are bytes on Linux. Python hands them to us as `str` with undecodable bytes as lone
surrogates (`os.fsdecode`), which DuckDB's VARCHAR cannot hold. The registry keeps two forms:
the *text* form (valid UTF-8, the path itself whenever its name is valid UTF-8, else the bytes
with each undecodable one written as `\\xNN`) and, only for such odd names, the exact bytes.
"""

from __future__ import annotations

import os

from specreg.text import clip, terminal_safe

REASON_MAX_CHARS = 300

# The older name, still imported by specreg/cli/doctor_cmds.py: new code uses terminal_safe.
escape_controls = terminal_safe


def is_odd(path: str) -> bool:
    """True if `path` holds bytes that are not valid UTF-8 (lone surrogates in Python)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def path_text(path: str) -> str:
    """The text form: `path` itself if it is valid UTF-8, else its bytes with `\\xNN` escapes."""
    if not is_odd(path):
        return path
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def path_raw(path: str) -> bytes | None:
    """The exact bytes of an odd path (None when the text form is already exact)."""
    return os.fsencode(path) if is_odd(path) else None


def fs_path(text: str, raw: bytes | None) -> str:
    """The path to hand to the OS, exactly as found: the inverse of (path_text, path_raw)."""
    return os.fsdecode(raw) if raw is not None else text


def clean_reason(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """A reason fit to store and print: one line, control characters (and the undecodable
    bytes of a file name) as visible escapes, at most about `limit`
    characters (a corrupt header can embed kilobytes of raw bytes in a key name). Escaped
    before it is cut, so the stored reason never ends inside an escape."""
    return clip(terminal_safe(text), limit)
