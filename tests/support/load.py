"""Other jobs' load, for the load guard's tests: processes spinning on a core, which are no
children of the test (the guard leaves a measurement's own tree out)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

BUSY_LOOP = "import time\nwhile True:\n    pass\n"

LAUNCH = """
import os, subprocess, sys
core = int(sys.argv[1])
loop = subprocess.Popen(
    [sys.executable, "-c", sys.argv[2]], start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    preexec_fn=lambda: os.sched_setaffinity(0, {core}),
)
print(loop.pid, flush=True)
"""


def spin(core: int) -> int:
    """A process spinning on `core`, started by a launcher that exits at once, so it is no
    child of this process (whose own tree the guard leaves out, as it leaves out its
    llama-server): another job's load. Returns its pid."""
    out = subprocess.run(
        [sys.executable, "-c", LAUNCH, str(core), BUSY_LOOP],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return int(out.stdout.split()[0])


def stop(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
