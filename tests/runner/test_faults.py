# ruff: noqa: E501  (the fake binary template quotes llama.cpp log lines verbatim)
"""Faults at the process boundary: fake llama-server binaries that fail the way llama.cpp does.

Each fault must give a one-line error that says what to do, record the run as failed with
llama.cpp's message, and leave no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli, error_line
from specreg.errors import LlamaError, SpecregError
from specreg.llama.install import DIALECT_DRAFT_MAX, DIALECT_SPEC_TYPE, find_llama
from specreg.registry.db import opened
from specreg.registry.run_store import list_runs
from specreg.runner.measurement import Measurement
from specreg.runner.settings import Settings

from support.fake_server import HELP_DRAFT_MAX, HELP_UNKNOWN, alive, assert_no_strays, make_fake


@pytest.fixture
def target(gguf_factory) -> Path:  # type: ignore[no-untyped-def]
    return gguf_factory("target.gguf", tokens=["<s>", "</s>", "a", "b"], bos=0, eos=1)


def run_cli(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=True)
    exc = result.exception
    if exc is not None and hasattr(exc, "exit_code"):
        code = exc.exit_code
        said = error_line(exc) if isinstance(exc, SpecregError) else str(exc)
        message = f"error: {said}" if not isinstance(exc, SystemExit) else ""
    else:
        code = result.exit_code
        message = ""
    return code, message


def failed_runs(home: Path) -> list:  # type: ignore[type-arg]
    with opened(home / "registry.duckdb") as con:
        return list_runs(con, with_prompts=True)


FAULTS = [
    ("load", "load", "error loading model: tensor 'blk.0.attn_q.weight' data is not within"),
    ("oom", "oom", "failed to allocate buffer of size 68719476736"),
    ("port", "port", "couldn't bind HTTP server socket"),
    ("crash", "crash", "GGML_ASSERT(n_tokens <= n_batch) failed"),
    ("sigill", "cpu", "load_tensors: CPU_REPACK model buffer size = 0.44 MiB"),
]


@pytest.mark.parametrize(("mode", "kind", "llama_line"), FAULTS)
def test_fault_is_recorded_with_llama_message(
    tmp_path: Path, target: Path, specreg_home: Path, mode: str, kind: str, llama_line: str
) -> None:
    bin_dir, pids = make_fake(tmp_path, mode)
    code, message = run_cli(
        ["run", str(target), "--llama-bin", str(bin_dir), "--repeat", "1", "--n-predict", "4"]
    )
    assert code == 1
    assert message.startswith("error: run 1 failed and was recorded: llama-server")
    assert "\n" not in message
    assert llama_line in message
    runs = failed_runs(specreg_home)
    assert len(runs) == 1
    run = runs[0]
    assert (run.status, run.error_kind) == ("failed", kind)
    assert llama_line in (run.llama_message or "")
    assert run.target_model_id is not None  # referenced by registry id, scanned on the way
    assert_no_strays(pids)


def test_oom_message_says_what_to_do(tmp_path: Path, target: Path) -> None:
    bin_dir, pids = make_fake(tmp_path, "oom")
    _, message = run_cli(["run", str(target), "--llama-bin", str(bin_dir), "--repeat", "1"])
    assert message.endswith("; free memory, lower --ctx, or use a smaller quantization")
    assert "was killed by signal 6 (crash) while loading" in message
    assert_no_strays(pids)


def test_sigill_says_so_with_the_remedy(tmp_path: Path, target: Path, specreg_home: Path) -> None:
    from specreg.isa import SIGILL_REMEDY

    bin_dir, pids = make_fake(tmp_path, "sigill")
    _, message = run_cli(["run", str(target), "--llama-bin", str(bin_dir), "--repeat", "1"])
    assert (
        "llama-server was killed by signal 4 (SIGILL: an instruction this CPU cannot run) "
        "while loading" in message
    )
    assert message.endswith(f"; {SIGILL_REMEDY}")
    assert "\n" not in message
    run = failed_runs(specreg_home)[0]
    assert (run.status, run.error_kind) == ("failed", "cpu")
    assert "killed by signal 4 (SIGILL" in (run.error or "")
    assert_no_strays(pids)


def test_port_taken_is_retried_then_fails(tmp_path: Path, target: Path, specreg_home: Path) -> None:
    bin_dir, pids = make_fake(tmp_path, "port")
    _, message = run_cli(["run", str(target), "--llama-bin", str(bin_dir)])
    assert "llama-server could not bind 127.0.0.1 in 3 attempts" in message
    assert len(pids.read_text().splitlines()) == 3
    assert_no_strays(pids)


def test_hang_at_startup_times_out(tmp_path: Path, target: Path, specreg_home: Path) -> None:
    bin_dir, pids = make_fake(tmp_path, "hang")
    start = time.monotonic()
    code, message = run_cli(
        ["run", str(target), "--llama-bin", str(bin_dir), "--timeout", "2", "--repeat", "1"]
    )
    assert time.monotonic() - start < 30
    assert code == 1
    assert "llama-server was not ready within 2 s" in message
    assert message.endswith("raise --timeout or retry when it is idle")
    assert failed_runs(specreg_home)[0].error_kind == "timeout"
    assert_no_strays(pids)


def measure_plain(bin_dir: Path, target: Path, settings: Settings) -> Measurement:
    """Plain decoding of one code prompt, through the fake llama-server in `bin_dir`."""
    from specreg.host.machine import detect_host
    from specreg.llama.config import Config
    from specreg.runner.measure import measure
    from specreg.runner.workload import load_workload

    workload = load_workload(("code",)).head(1)
    return measure(find_llama(bin_dir), detect_host(), Config(), target, None, workload, settings)


def test_hang_during_request_times_out(tmp_path: Path, target: Path, specreg_home: Path) -> None:
    bin_dir, pids = make_fake(tmp_path, "stall")
    m = measure_plain(bin_dir, target, Settings(repeats=1, warmup=False, request_timeout=1.5))
    assert m.failure is not None and m.failure.kind == "timeout"
    assert "did not answer /completion within 2 s" in str(m.failure)
    assert_no_strays(pids)


def test_interrupt_kills_the_server(tmp_path: Path, target: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from specreg.llama import server as server_mod

    bin_dir, pids = make_fake(tmp_path, "ok")

    def interrupted(self, body):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    monkeypatch.setattr(server_mod.LlamaServer, "complete", interrupted)
    with pytest.raises(KeyboardInterrupt):
        measure_plain(bin_dir, target, Settings(repeats=1))
    assert_no_strays(pids)


def test_missing_binary(tmp_path: Path, target: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, message = run_cli(["run", str(target), "--llama-bin", str(empty)])
    assert code == 1
    assert message == (
        f"error: no executable llama-server in {empty} (from --llama-bin); pass --llama-bin "
        "DIR, set SPECREG_LLAMA_BIN, put llama-server on PATH, or run `specreg llama build`"
    )


def test_unknown_dialect(tmp_path: Path, target: Path, specreg_home: Path) -> None:
    bin_dir, _ = make_fake(tmp_path, "ok", HELP_UNKNOWN)
    code, message = run_cli(["llama", "info", "--llama-bin", str(bin_dir)])
    assert code == 1
    assert message.startswith(f"error: {bin_dir}/llama-server speaks an unknown flag dialect")
    assert message.endswith("use llama.cpp from 2024-12 or later")


def test_dialects_are_read_from_help(tmp_path: Path) -> None:
    new, _ = make_fake(tmp_path, "ok")
    old, _ = make_fake(tmp_path, "old", HELP_DRAFT_MAX)
    current = find_llama(new)
    assert current.dialect == DIALECT_SPEC_TYPE
    assert "ngram-mod" in current.spec_types and current.version == "9999 (fake)"
    legacy = find_llama(old)
    assert legacy.dialect == DIALECT_DRAFT_MAX
    assert legacy.supports("draft-simple") and not legacy.supports("ngram-mod")


def test_env_var_is_used_when_no_flag(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    bin_dir, _ = make_fake(tmp_path, "ok")
    monkeypatch.setenv("SPECREG_LLAMA_BIN", str(bin_dir))
    install = find_llama()
    assert (install.bin_dir, install.source) == (bin_dir, "SPECREG_LLAMA_BIN")


def test_missing_everywhere(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SPECREG_LLAMA_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SPECREG_CACHE", str(tmp_path / "cache"))
    with pytest.raises(LlamaError, match=r"^llama.cpp not found; pass --llama-bin DIR"):
        find_llama()


def test_runs_json_lists_failed_run(tmp_path: Path, target: Path, specreg_home: Path) -> None:
    bin_dir, pids = make_fake(tmp_path, "load")
    run_cli(["run", str(target), "--llama-bin", str(bin_dir)])
    result = CliRunner().invoke(cli, ["runs", "--json"])
    doc = json.loads(result.output)
    assert doc["version"] == "1" and doc["kind"] == "runs"
    (run,) = doc["runs"]
    assert run["status"] == "failed" and run["error_kind"] == "load"
    assert run["argv"][run["argv"].index("-m") + 1] == str(target.resolve())
    assert_no_strays(pids)


def test_llama_message_picks_the_cause() -> None:
    from specreg.llama.process import classify_exit, llama_message

    log = (
        "0.00.100.000 W spec common_specu: draft model vocab type must match target model to use "
        "speculation but vocab_type_dft = 2 while vocab_type_tgt = 1\n"
        "0.00.100.100 E spec common_specu: the target and draft vocabs are not compatible\n"
        "0.00.100.200 E srv    load_model: failed to initialize speculative decoding context: "
        "draft model vocab type must match target model to use speculation\n"
    )
    from specreg.llama.process import SPEC_INIT_FAILED

    assert llama_message(log, SPEC_INIT_FAILED) == (
        "srv    load_model: failed to initialize speculative decoding context: draft model "
        "vocab type must match target model to use speculation"
    )
    removed = (
        'error while handling argument "--draft": the argument has been removed. use '
        "--spec-draft-n-max or --spec-ngram-mod-n-max\n"
    )
    assert classify_exit(removed, 1) == "args"
    assert llama_message(removed).startswith('error while handling argument "--draft"')


def test_usage_errors_exit_2(tmp_path: Path, target: Path) -> None:
    bin_dir, _ = make_fake(tmp_path, "ok")
    code, message = run_cli(["run", str(target), "--k", "4", "--llama-bin", str(bin_dir)])
    assert (code, message) == (
        2,
        "error: --k and --p-min need speculation: add --draft or --spec-type",
    )
    code, message = run_cli(
        ["run", str(target), "--spec-type", "draft-simple", "--llama-bin", str(bin_dir)]
    )
    assert (code, message) == (2, "error: draft-simple needs a draft model: pass --draft PATH")
    code, message = run_cli(
        ["run", str(target), "--spec-type", "draft-mtp", "--llama-bin", str(bin_dir)]
    )
    assert (code, message) == (
        2,
        "error: target.gguf has no MTP (NextN) layers, so draft-mtp cannot run on it: use a "
        "draft model or an n-gram method",
    )


def test_sigkill_of_specreg_takes_the_server_with_it(tmp_path: Path, target: Path) -> None:
    """No cleanup code runs when specreg is SIGKILLed; the kernel must end llama-server."""
    bin_dir, pids = make_fake(tmp_path, "hang")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specreg", "run", str(target), "--llama-bin", str(bin_dir),
         "--timeout", "60", "--repeat", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    server, helper_child = (int(p) for p in pids.read_text().split()[:2])
    deadline = time.monotonic() + 5
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(helper_child, signal.SIGKILL)  # the fake's own child; llama-server has none
    assert not alive(server), "llama-server outlived a SIGKILLed specreg"


@pytest.mark.parametrize("mode", ["crash", "load", "oom"])
@pytest.mark.parametrize("command", ["run", "verify"])
def test_the_error_line_names_the_log(
    tmp_path: Path, target: Path, specreg_home: Path, mode: str, command: str
) -> None:
    """Issue 41 point 11: "...; see the server log" named no log; the one line a user sees of a
    crash says which file holds the rest."""
    bin_dir, pids = make_fake(tmp_path, mode)
    draft = ["--draft", str(target)] if command == "verify" else []
    code, message = run_cli(
        [command, str(target), *draft, "--llama-bin", str(bin_dir), "--repeat", "1"]
    )
    assert code == 1 and "\n" not in message
    log = failed_runs(specreg_home)[-1].log_path
    assert log and Path(log).exists()
    assert f"; see the log {log}; " in message, message
    assert "see the server log" not in message
    assert_no_strays(pids)
