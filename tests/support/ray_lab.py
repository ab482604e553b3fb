"""A Ray cluster on loopback standing in for several hosts, for the Ray tests and benchmark.

A head (no CPUs: it runs no job) and one worker node per stand-in host, all on 127.0.0.2 (Ray
turns 127.0.0.1 into the machine's outward address; any 127/8 address stays on loopback). Each
host node runs with its own `SPECREG_HOST_FACTS` (so its own fingerprint), its own
`SPECREG_HOME` (its own registry) and the resources `specreg_host` and `specreg-host:NAME`.
Small object stores, no dashboard, no usage stats, one CPU per host.

Every process is started with `ray start --block` in a session of its own and carries a marker
variable; `stop()` ends those sessions and then any process still carrying the marker (workers,
llama-servers), by pid, and checks that none is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LOOPBACK = "127.0.0.2"
MARKER = "SPECREG_RAY_LAB"
OBJECT_STORE_BYTES = 80_000_000
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
# The stand-in hosts share this machine's cores and each sees the other measure: their load
# guard would refuse (host/load.py). The lab checks where runs go, not how fast they are.
LOAD_ENV = {"SPECREG_MAX_LOAD": "1000", "SPECREG_MAX_SPREAD": "1000"}


def require_ray() -> None:
    """Ray installed, or a skip (a failure under CI=true: scripts/test installs the extra)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("Ray is missing in CI: scripts/test must install specreg[ray]")
        pytest.skip("Ray is not installed (pip install 'specreg[ray]')")


def host_facts(name: str) -> str:
    return json.dumps({"hostname": name, "cpu_model": f"lab host {name}"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _ray(*args: str) -> list[str]:
    return [sys.executable, "-m", "ray.scripts.scripts", *args]


def _marked(token: str) -> list[int]:
    """Pids of live processes whose environment carries the lab's marker."""
    want = f"{MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want in (entry / "environ").read_bytes().split(b"\0"):
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def process_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass
class RayLab:
    root: Path
    hosts: tuple[str, ...] = ("alpha", "beta")
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    port: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def home(self, name: str) -> Path:
        return self.root / name

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, **RAY_ENV, **LOAD_ENV, MARKER: self.token, **extra}

    def _start(self, args: list[str], env: dict[str, str], log: str) -> None:
        out = open(self.root / log, "wb")  # noqa: SIM115 - kept open for the process's life
        self.procs.append(
            subprocess.Popen(
                _ray("start", "--block", *args),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        )

    def start(self, timeout: float = 120.0) -> RayLab:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        temp = Path("/tmp") / f"srl-{self.token[:6]}"  # Ray's socket paths must stay short
        common = [
            f"--node-ip-address={LOOPBACK}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats", f"--temp-dir={temp}",
        ]  # fmt: skip
        self._start(
            ["--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false",
             *common], self.env(), "head.log",
        )  # fmt: skip
        self._wait_started("head.log", timeout)
        for name in self.hosts:
            self.home(name).mkdir(parents=True, exist_ok=True)
            resources = json.dumps({"specreg_host": 1, f"specreg-host:{name}": 1})
            env = self.env(SPECREG_HOST_FACTS=host_facts(name), SPECREG_HOME=str(self.home(name)))
            self._start(
                [f"--address={self.address}", "--num-cpus=1", f"--resources={resources}", *common],
                env, f"{name}.log",
            )  # fmt: skip
            # one node at a time: nodes starting together on one machine time out
            self._wait_started(f"{name}.log", timeout)
        self._wait_hosts(timeout)
        return self

    def _wait_started(self, log: str, timeout: float) -> None:
        """Until `ray start --block` says the node runs (it then blocks)."""
        end = time.monotonic() + timeout
        path = self.root / log
        while time.monotonic() < end:
            if "will now block forever" in path.read_text(errors="replace"):
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.3)
        text = path.read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"a node of the Ray lab did not start ({log}): {text[-2000:]}")

    def _wait_hosts(self, timeout: float) -> None:
        probe = (
            "import ray, sys\n"
            f"ray.init(address={self.address!r}, log_to_driver=False, logging_level='ERROR')\n"
            "n = sum(1 for x in ray.nodes() if x['Alive'] and x['Resources'].get('specreg_host'))\n"
            "print(n)\n"
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = subprocess.run(
                [sys.executable, "-c", probe], env=self.env(), capture_output=True, text=True,
                timeout=60,
            )  # fmt: skip
            if got.returncode == 0 and got.stdout.strip() == str(len(self.hosts)):
                return
            time.sleep(1.0)
        self.stop()
        raise RuntimeError("the lab's Ray hosts did not join the head in time")

    def stop(self) -> None:
        """End every process the lab started: its `ray start` sessions, then anything left
        with its marker (by pid). Raises if a process survives."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        end = time.monotonic() + 5  # Ray drains for 30 s on SIGTERM: no need here
        while time.monotonic() < end and any(p.poll() is None for p in self.procs):
            time.sleep(0.2)
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for _ in range(50):
            left = _marked(self.token)
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        raise RuntimeError(f"processes of the Ray lab survived: {_marked(self.token)}")

    def leftovers(self) -> list[int]:
        return _marked(self.token)
