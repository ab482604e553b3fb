"""Starting `specreg serve` as a process in tests: wait until /health answers, or fail with
its log; read its policy status; stop it. And a front in process whose only backend never
starts, for the answers the front gives on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.llama.process import free_port
from specreg.serve.app import Service
from specreg.serve.backends import BackendPool
from specreg.serve.classify import fitted_classifier
from specreg.serve.routes import BackendSpec, Route, RouteTable, Target
from specreg.serve.serving import run_template
from specreg.terms import TASKS

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


class ServeProcess:
    """A `specreg serve` a test started: its process, URL and log."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def status(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/v1/specreg/status", timeout=10).json())

    def task(self, task: str) -> dict[str, Any]:
        """One task's policy in the status (this server's only target)."""
        (got,) = [t for t in self.status()["tasks"] if t["task"] == task]
        return dict(got)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


S = TypeVar("S", bound=ServeProcess)


def start_serve(cls: type[S], home: Path, llama: LlamaInstall, model: Path, *args: str) -> S:
    """`specreg serve MODEL ARGS...` on a free port with SPECREG_HOME=`home`, healthy."""
    port = free_port()
    log = home / f"serve-{port}.log"
    argv = [sys.executable, "-m", "specreg", "serve", str(model), *args, "--port", str(port),
            "--llama-bin", str(llama.bin_dir)]  # fmt: skip
    env = {**os.environ, "SPECREG_HOME": str(home)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    served = cls(proc, f"http://127.0.0.1:{port}", log)
    wait_healthy(proc, served.url, log)
    return served


def front_without_backend(tmp_path: Path, **options: Any) -> Service:
    """A front that serves one target, `tiny`, on one plain backend whose llama-server does
    not exist, so it never becomes ready: what answers is the front itself. `options` go to
    Service (a recorder, max_body)."""
    target = Target("tiny", "f" * 32, "/models/tiny.gguf")
    spec = BackendSpec(
        name="tiny-plain", target=target, config=Config(), draft_id=None, draft_path=None,
        prefix=(), binary="/nonexistent/llama-server", flags=("-m", target.path),
    )  # fmt: skip
    routes = tuple(Route("tiny", task, spec.name, "plain", "pinned", "test") for task in TASKS)
    table = RouteTable((target,), routes, (spec,))
    install = LlamaInstall(Path("/nonexistent"), "test", "0 (test)", "spec-type", (), ())
    return Service(
        table,
        BackendPool(table, env={}, logs=tmp_path / "logs"),
        fitted_classifier(),
        templates={spec.name: run_template(spec, install, detect_host())},
        ready_timeout=0.1,
        **options,
    )
