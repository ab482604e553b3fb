"""llama.cpp binaries as child processes: started in their own process group that dies with
specreg, run to completion under a timeout, and their failures read from their own logs.

`spawn` starts a long-lived process (llama-server); `run_tool` runs a one-shot tool
(llama-perplexity, llama-lookup-create, the legacy engines) to its end. Either way a
failure becomes `ServerFailed` with llama.cpp's own most telling line and a hint.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.errors import LlamaError
from specreg.host.cpu import cpu_ticks_total
from specreg.isa import SIGILL_REMEDY
from specreg.llamacpp import SERVER_HOST_DEFAULT

# Soft failure: the server keeps serving, but without speculation.
SPEC_INIT_FAILED = re.compile(r"failed to initialize speculative decoding[^\n]*")


BIND_FAILED = re.compile(r"couldn't bind|address already in use|failed to bind", re.I)


OOM = re.compile(
    r"bad_alloc|out of memory|cannot allocate memory|failed to allocate|unable to allocate", re.I
)


LOAD_FAILED = re.compile(r"failed to load model|error loading model|unable to load model", re.I)


ARG_ERROR = re.compile(r"error while handling argument|invalid argument|unknown argument", re.I)


# ggml_abort prints `<file>:<line>: GGML_ASSERT(<cond>) failed` (or its own message) and then a
# gdb backtrace whose frames also say "abort": the assertion line is the telling one.
GGML_ABORT = re.compile(r"GGML_ASSERT\(.*\) failed|^\S+\.(?:c|cpp|h):\d+: \S")


# Log lines look like `0.02.882.176 E srv  load_model: ...` (timestamp and level prefix).
LOG_PREFIX = re.compile(r"^\s*(?:\d+\.\d+\.\d+\.\d+\s+)?(?:[DIWE]\s+)?")


HINTS = {
    "load": "check that the file is a complete GGUF this llama.cpp supports (`specreg scan PATH`)",
    "oom": "free memory, lower --ctx, or use a smaller quantization",
    "crash": "see the server log; rerun with SPECREG_DEBUG=1 for details",
    "timeout": "the host may be overloaded; raise --timeout or retry when it is idle",
    "port": "another process holds the ports; stop it or retry",
    "args": "this llama.cpp rejects the flags; check `specreg llama info` for its dialect",
    "request": "the server rejected the request; see the server log",
    "spec-init": "the draft cannot speculate for this target (`specreg audit` explains why)",
    "cpu": SIGILL_REMEDY,
}

# Signals a crash dies of; a shell reports a child killed by signal N as exit code 128 + N.
_CRASH_SIGNALS = (signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGSEGV)


def killed_by(returncode: int | None) -> signal.Signals | None:
    """The signal that ended a process (Popen's negative code, or a shell's 128 + N)."""
    if returncode is None:
        return None
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        sig = signal.Signals(number)
    except ValueError:
        return None
    if returncode > 128 and sig not in _CRASH_SIGNALS:
        return None
    return sig


def exit_how(returncode: int) -> str:
    """How a process ended, for a message: "was killed by signal 4 (SIGILL: ...)"."""
    sig = killed_by(returncode)
    if sig == signal.SIGILL:
        return f"was killed by signal {sig.value} (SIGILL: an instruction this CPU cannot run)"
    if returncode < 0:
        number = -returncode
        crash = " (crash)" if sig in _CRASH_SIGNALS else ""
        return f"was killed by signal {number}{crash}"
    return f"exited with code {returncode}" + (" (crash)" if sig in _CRASH_SIGNALS else "")


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when specreg dies.

    Our own cleanup kills the process group on every exit path we control; this covers the
    ones we do not (specreg itself SIGKILLed, or its test runner timed out), which otherwise
    leave an orphaned llama-server holding cores and memory.
    """
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def spawn(
    argv: list[str],
    *,
    env: dict[str, str],
    stdout: Any,
    stderr: Any,
    log_path: Path | None,
    pin: Callable[[], object] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a llama.cpp process in its own process group (killed as a whole) that dies
    with specreg; `pin` runs in the child before exec (its placement on cores and memory,
    host/placement.py: prepared in the parent, it only makes system calls).
    `ServerFailed` when it cannot start."""

    def before_exec() -> None:
        _die_with_parent()
        if pin is not None:
            pin()

    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
            preexec_fn=before_exec,
        )
    except OSError as err:
        raise ServerFailed(
            "crash", f"cannot start {argv[0]}", err.strerror or str(err), log_path
        ) from err


def with_log(hint: str, log_path: Path | None) -> str:
    """What to do next, led by the log to read when there is one: a one-line error is all a
    user sees of a crash, and "see the server log" alone does not say where it is."""
    if log_path is None:
        return hint
    bare = hint.replace("; see the server log", "").replace("see the server log; ", "")
    return f"see the log {log_path}; {bare}"


class ServerFailed(LlamaError):
    """llama-server failed; `kind` says how, `llama_message` is llama.cpp's own line."""

    def __init__(
        self,
        kind: str,
        summary: str,
        llama_message: str,
        log_path: Path | None,
        returncode: int | None = None,
    ):
        self.kind = kind
        self.summary = summary
        self.llama_message = llama_message
        self.log_path = log_path
        self.returncode = returncode  # the process's exit code when it ended
        detail = f": {llama_message}" if llama_message else ""
        super().__init__(
            f"{summary}{detail}; {with_log(HINTS.get(kind, HINTS['crash']), log_path)}"
        )

    def __reduce__(
        self,
    ) -> tuple[type[ServerFailed], tuple[str, str, str, Path | None, int | None]]:
        # A Ray worker's error crosses to the driver pickled: rebuild it with its arguments.
        return type(self), (
            self.kind, self.summary, self.llama_message, self.log_path, self.returncode
        )  # fmt: skip


def strip_log_prefix(line: str) -> str:
    return LOG_PREFIX.sub("", line).strip()


def llama_message(log_text: str, pattern: re.Pattern[str] | None = None) -> str:
    """The most telling line of a llama.cpp log: a match of `pattern`, else the last error."""
    lines = [strip_log_prefix(raw) for raw in log_text.splitlines()]
    lines = [line for line in lines if line]
    # llama.cpp logs the cause first and a generic summary after it ("error loading model:
    # <cause>" then "failed to load model"), so the first match is the telling one.
    for regex in (pattern, OOM, LOAD_FAILED, ARG_ERROR, GGML_ABORT):
        hits = [line for line in lines if regex is not None and regex.search(line)]
        if hits:
            return hits[0][:400]
    errors = [raw.strip() for raw in log_text.splitlines() if re.match(r"^\s*(\S+\s+)?E\s", raw)]
    if errors:
        return strip_log_prefix(errors[-1])[:400]
    keywords = re.compile(r"error|fail|abort|terminate|what\(\)", re.I)
    hits = [line for line in lines if keywords.search(line)]
    return (hits or lines or [""])[-1][:400]


# What a failed llama.cpp's log says, first match wins, as the kind `classify_exit` names.
_EXIT_KINDS = ((OOM, "oom"), (BIND_FAILED, "port"), (LOAD_FAILED, "load"), (ARG_ERROR, "args"))


def classify_exit(log_text: str, returncode: int | None) -> str:
    if killed_by(returncode) == signal.SIGILL:
        return "cpu"
    return next((kind for regex, kind in _EXIT_KINDS if regex.search(log_text)), "crash")


# The one address specreg's llama-server processes listen on: llama-server's own default.
LOCALHOST = SERVER_HOST_DEFAULT


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class ToolOutput:
    returncode: int
    stdout: str
    log_text: str  # this invocation's stderr
    wall_s: float
    foreign_cpu_s: float | None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(
    argv: list[str], *, env: Mapping[str, str], log_path: Path, timeout: float
) -> ToolOutput:
    """Run one legacy invocation to completion; stderr goes to `log_path`, stdout is returned.

    Raises `ServerFailed` when it cannot start or outlives `timeout` (its group is killed).
    """
    name = Path(argv[0]).name
    log_path.parent.mkdir(parents=True, exist_ok=True)
    hz = os.sysconf("SC_CLK_TCK")
    with log_path.open("ab") as err_log, tempfile.TemporaryFile() as out:
        err_log.write(f"$ {shlex.join(argv)}\n".encode())
        err_log.flush()
        offset = err_log.tell()
        total0, children0, self0 = cpu_ticks_total(), _children_cpu_s(), sum(os.times()[:2])
        start = time.monotonic()
        proc = spawn(argv, env=dict(env), stdout=out, stderr=err_log, log_path=log_path)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise ServerFailed(
                "timeout",
                f"{name} did not finish within {timeout:.0f} s",
                llama_message(_read_from(log_path, offset)),
                log_path,
            ) from None
        finally:
            # Every exit path, Ctrl-C included; also children that outlived the leader.
            _kill_group(proc)
        wall = time.monotonic() - start
        total1, children1 = cpu_ticks_total(), _children_cpu_s()
        foreign = None
        if total0 is not None and total1 is not None:
            own = sum(os.times()[:2]) - self0
            foreign = max(0.0, (total1 - total0) / hz - (children1 - children0) - own)
        out.seek(0)
        stdout = out.read().decode(errors="replace")
        err_log.write(b"--- stdout ---\n" + stdout.encode() + b"\n--- end ---\n")
    return ToolOutput(rc, stdout, _read_from(log_path, offset), wall, foreign)


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace").split("--- stdout ---\n", 1)[0]
    except OSError:
        return ""
