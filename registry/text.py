"""Untrusted text as the registry stores it: file names and reasons that came from the disk.

Paths are bytes on Linux. Python hands them to us as `str` with undecodable bytes as lone
surrogates (`os.fsdecode`), which DuckDB's VARCHAR cannot hold. The registry keeps two forms:
the *text* form (valid UTF-8, the path itself whenever its name is valid UTF-8, else the bytes
with each undecodable one written as `\\xNN`) and, only for such odd names, the exact bytes.
"""

from __future__ import annotations

import os
import re

from specreg.text import clip

# C0 and C1 control characters (and DEL): a terminal acts on them, a database row should not
# carry them raw. Escaped as \xNN so a reader sees exactly which byte was there.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
REASON_MAX_CHARS = 300


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


def escape_controls(text: str) -> str:
    """Control characters as visible `\\xNN` escapes; everything else unchanged."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def clean_reason(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """A reason fit to store and print: one line, controls escaped, at most about `limit`
    characters (a corrupt header can embed kilobytes of raw bytes in a key name)."""
    return clip(escape_controls(path_text(text)), limit)
