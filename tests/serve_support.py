"""Starting `specreg serve` as a process in tests: wait until /health answers, or fail with
its log."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

STARTUP_S = 180.0


def wait_healthy(
    proc: subprocess.Popen[bytes], url: str, log: Path, startup_s: float = STARTUP_S
) -> None:
    """Return once `url`/health answers 200; fail the test (with the log) if the process
    exits or stays unhealthy for `startup_s` seconds (it is killed then)."""
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve exited with {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"serve was not healthy within {startup_s:.0f} s: {log.read_text()}")
