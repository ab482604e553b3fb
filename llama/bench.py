"""llama-bench as a child process: its command line, its JSON rows, and the tests it timed.

Each output line is one finished test; other processes' CPU use is measured between lines, so
each test carries the load it ran under (`BenchTest.contended`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specreg.host.cpu import CpuWatch
from specreg.host.machine import Host
from specreg.llama.install import LlamaInstall
from specreg.llama.process import ServerFailed, classify_exit, exit_how, llama_message, spawn
from specreg.llamacpp import BenchFlag, Flag, Tool
from specreg.registry.calibration import KIND_BATCH, KIND_GEN

log = logging.getLogger(__name__)

BENCH = Tool.BENCH
# A test is disturbed when other processes used more than this share of all CPUs during it
# (and at least MIN_FOREIGN_S: /proc/stat counts in 10 ms ticks).
CONTENDED_SHARE = 0.05
MIN_FOREIGN_S = 0.03


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test as measured: seconds of each repetition, and the load meanwhile."""

    kind: str  # batch | gen
    n_tokens: int
    samples: tuple[float, ...]
    wall_s: float
    foreign_cpu_s: float | None

    def contended(self, logical_cpus: int) -> bool:
        return contended(self.foreign_cpu_s, self.wall_s, logical_cpus)


def contended(foreign_cpu_s: float | None, wall_s: float, logical_cpus: int) -> bool:
    """Whether other processes took more of the CPU during a timed measurement than
    CONTENDED_SHARE of every logical CPU (at least MIN_FOREIGN_S)."""
    if foreign_cpu_s is None:
        return False
    allowed = max(MIN_FOREIGN_S, CONTENDED_SHARE * wall_s * max(1, logical_cpus))
    return foreign_cpu_s > allowed


def bench_argv(
    install: LlamaInstall,
    host: Host,
    model: Path,
    *,
    threads: int,
    batch_sizes: Sequence[int],
    gen_tokens: int,
    repetitions: int,
) -> list[str]:
    """The llama-bench command for these tests (`-p 0` / `-n 0` switch a kind off)."""
    return [
        *host.launch_prefix(),
        str(install.binary(BENCH)),
        Flag.MODEL, str(model), Flag.THREADS, str(threads),
        BenchFlag.REPETITIONS, str(repetitions),
        BenchFlag.N_PROMPT, ",".join(str(n) for n in batch_sizes) or "0",
        BenchFlag.N_GEN, str(gen_tokens),
        BenchFlag.OUTPUT, "jsonl",
    ]  # fmt: skip


def parse_test(row: dict[str, Any]) -> tuple[str, int, tuple[float, ...]]:
    """(kind, tokens, seconds of each repetition) of one llama-bench JSON row."""
    n_prompt, n_gen = int(row.get("n_prompt") or 0), int(row.get("n_gen") or 0)
    samples = tuple(float(ns) / 1e9 for ns in row.get("samples_ns") or ())
    if not samples and row.get("avg_ns"):
        samples = (float(row["avg_ns"]) / 1e9,)
    if n_gen and not n_prompt:
        return KIND_GEN, n_gen, samples
    if n_prompt and not n_gen:
        return KIND_BATCH, n_prompt, samples
    raise ValueError(f"unexpected llama-bench test (n_prompt={n_prompt}, n_gen={n_gen})")


def run_bench(
    argv: list[str], *, env: dict[str, str], log_path: Path, timeout: float
) -> list[BenchTest]:
    """Run llama-bench, timing the other processes' CPU use between its output lines (one line
    per finished test); `ServerFailed` when it fails or outlives `timeout`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tests: list[BenchTest] = []
    timed_out = threading.Event()

    def expire(proc: subprocess.Popen[bytes]) -> None:
        timed_out.set()
        _kill(proc)

    with log_path.open("ab") as err_log:
        err_log.write(f"$ {shlex.join(argv)}\n".encode())
        err_log.flush()
        offset = err_log.tell()
        proc = spawn(argv, env=env, stdout=subprocess.PIPE, stderr=err_log, log_path=log_path)
        timer = threading.Timer(timeout, expire, (proc,))
        timer.start()
        try:
            assert proc.stdout is not None
            while True:
                start = time.monotonic()
                with CpuWatch(proc.pid) as watch:
                    raw = proc.stdout.readline()
                if not raw:
                    break
                wall = time.monotonic() - start
                try:
                    kind, n, samples = parse_test(json.loads(raw))
                except (ValueError, KeyError) as err:
                    log.warning("llama-bench line not understood (%s): %r", err, raw[:200])
                    continue
                tests.append(BenchTest(kind, n, samples, wall, watch.foreign_s))
            rc = proc.wait()
        finally:
            timer.cancel()
            _kill(proc)
    if timed_out.is_set() or rc != 0:
        text = log_path.read_bytes()[offset:].decode(errors="replace")
        if timed_out.is_set():
            raise ServerFailed(
                "timeout", f"{BENCH} did not finish within {timeout:.0f} s", "", log_path
            )
        raise ServerFailed(
            classify_exit(text, rc), f"{BENCH} {exit_how(rc)}", llama_message(text), log_path, rc
        )
    return tests


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
