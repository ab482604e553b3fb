"""Running specreg on a pseudo-terminal of a given width, as a user at a terminal sees it:
rich measures the real terminal (TIOCSWINSZ) and COLUMNS says the same."""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time

from rich.cells import cell_len

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def specreg_tty(*args: str, columns: int = 80, timeout: float = 300.0) -> tuple[int, str]:
    """Exit code and screen text (colours removed, lines joined by \\n) of `specreg ARGS` on a
    pseudo-terminal `columns` wide."""
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin/stdout/stderr are the terminal
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
            os.execve(sys.executable, [sys.executable, "-m", "specreg", *args], env)
        finally:
            os._exit(127)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError as err:  # EIO: the child closed the terminal
                if err.errno != errno.EIO:
                    raise
                break
            if not data:
                break
            chunks.append(data)
        else:
            os.kill(pid, 9)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return os.waitstatus_to_exitcode(status), text


def too_wide(text: str, columns: int = 80) -> list[str]:
    """The lines of `text` wider than the terminal (which it would wrap)."""
    return [line for line in text.splitlines() if cell_len(line) > columns]


def name_on_one_line(name: str, text: str) -> bool:
    """`name` stands on one line of `text`, whole or cut with `…` after at least 8 characters
    of it: never wrapped over several lines."""
    for line in text.splitlines():
        if name in line:
            return True
        for n in range(len(name) - 1, 7, -1):
            if name[:n].rstrip() + "…" in line:
                return True
    return False
