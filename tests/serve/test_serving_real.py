"""`specreg serve` for real: SmolLM2 behind supervised llama-servers, one thread, few tokens.

Clients are the `openai` package and
httpx, as a user's would be.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.llama.install import LlamaInstall
from specreg.llama.process import free_port
from specreg.llama.server import LlamaServer
from specreg.samples.small_models import SmallModels

from support.serve import wait_healthy

pytestmark = pytest.mark.llama

# Code to ngram-mod, every other task to plain decoding: the routes are known whatever the
# recommender predicts on this host.
PINS = ("--pin", "code=ngram-mod:8", "--pin", "default=none")
CODE = "Write a Python function that returns the sum of a list of integers."
PROSE = "Write a short poem about the sea at night."
STARTUP_S = 180.0
# Long enough to be decoding when the backend is killed: greedy and no end-of-generation stop.
LONG = {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def backends(self) -> list[dict]:  # type: ignore[type-arg]
        return list(httpx.get(f"{self.url}/specreg/backends", timeout=10).json()["backends"])

    def pids(self) -> list[int]:
        return [b["pid"] for b in self.backends()]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def start_serve(tmp_path: Path, llama: LlamaInstall, model: Path, *extra: str) -> Served:
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    argv = [
        sys.executable, "-m", "specreg", "serve", str(model), *PINS, "--port", str(port),
        "--threads", "1", "--ctx", "2048", "--llama-bin", str(llama.bin_dir), *extra,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    served = Served(proc, f"http://127.0.0.1:{port}", log)
    wait_healthy(proc, served.url, log)
    return served


def stop_serve(served: Served) -> int:
    if served.proc.poll() is None:
        served.proc.send_signal(signal.SIGTERM)
    try:
        return served.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        raise


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, llama_install: LlamaInstall, small_models: SmallModels
) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("serve-home")
    old = os.environ.get("SPECREG_HOME")
    os.environ["SPECREG_HOME"] = str(home)
    s = start_serve(home, llama_install, small_models.smollm2.path)
    try:
        yield s
    finally:
        stop_serve(s)
        if old is not None:
            os.environ["SPECREG_HOME"] = old


@pytest.fixture
def module_home(served: Served, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The serve process's SPECREG_HOME (the module's, not this test's own)."""
    home = Path(served.log).parent
    monkeypatch.setenv("SPECREG_HOME", str(home))
    return home


def test_routes_show_in_headers_and_in_runs(served: Served, module_home: Path) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1"]
    seen = {}
    for text in (CODE, PROSE):
        raw = client.chat.completions.with_raw_response.create(
            model="SmolLM2-135M-Instruct.Q4_1",
            messages=[{"role": "user", "content": text}],
            max_tokens=8,
            temperature=0,
        )
        completion = raw.parse()
        assert completion.choices[0].message.content
        seen[raw.headers["x-specreg-task"]] = (
            raw.headers["x-specreg-config"],
            raw.headers["x-specreg-backend"],
            raw.headers["x-specreg-route"],
        )
    assert seen["code"][0] == "ngram-mod k=8" and seen["code"][2] == "pinned"
    assert seen["prose"][0] == "plain"
    assert seen["code"][1] != seen["prose"][1]

    # The runs are written while serve runs (the recorder opens the registry only to write).
    deadline = time.monotonic() + 30
    while True:
        result = CliRunner().invoke(cli, ["runs", "--json"])
        runs = json.loads(result.output)["runs"] if result.exit_code == 0 else []
        tasks = {r["task"]: r for r in runs if r["kind"] == "serve"}
        if {"code", "prose"} <= set(tasks) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert tasks["code"]["config_label"] == "ngram-mod k=8"
    assert tasks["code"]["spec_type"] == "ngram-mod"
    assert tasks["prose"]["config_label"] == "plain"
    assert tasks["code"]["regime"] == "warm"
    assert tasks["code"]["protocol"]["keeps_state"] is True  # ngram-mod learns from traffic
    assert tasks["code"]["trusted"] is True
    assert tasks["code"]["tokens_per_s"] > 0
    assert tasks["code"]["prompts"][0]["predicted_n"] == 8
    table = CliRunner().invoke(cli, ["runs"]).output
    assert "serve" in table and "ngram-mod k=8" in table


def test_drafted_tokens_are_recorded(served: Served, module_home: Path) -> None:
    # ngram-mod keeps one pool per server: a request seen before drafts its own earlier answer
    # (llama-cpp notes, section 7), so the second of two equal requests drafts and accepts.
    for _ in range(2):
        got = httpx.post(
            f"{served.url}/v1/completions",
            json={"prompt": "def binary_search(items, target):", "max_tokens": 48,
                  "temperature": 0},
            headers={"X-Specreg-Task": "code"},
            timeout=120,
        )  # fmt: skip
        assert got.status_code == 200
    timings = got.json()["timings"]
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] > 0
    deadline = time.monotonic() + 30
    while True:
        runs = json.loads(CliRunner().invoke(cli, ["runs", "--json"]).output or "{}")
        drafted = [r for r in runs.get("runs", []) if r["kind"] == "serve" and r["draft_n"]]
        if drafted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    run = drafted[0]
    assert (run["draft_n"], run["draft_n_accepted"]) == (
        timings["draft_n"], timings["draft_n_accepted"]
    )  # fmt: skip
    assert run["acceptance"] == pytest.approx(timings["draft_n_accepted"] / timings["draft_n"])
    assert run["speculative_active"] is True


def _chat(url: str, text: str, *, stream: bool = False, tokens: int = 24) -> str:
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }
    if not stream:
        got = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        got.raise_for_status()
        return str(got.json()["choices"][0]["message"]["content"])
    parts = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                parts.append(delta.get("content") or "")
    return "".join(parts)


def test_text_through_serve_equals_a_direct_llama_server(
    served: Served, tmp_path: Path, llama_install: LlamaInstall
) -> None:
    routes = httpx.get(f"{served.url}/specreg/routes", timeout=10).json()
    ngram = next(b for b in routes["backends"] if "code" in b["tasks"])
    assert "ngram-mod" in ngram["argv"]
    direct = LlamaServer(ngram["argv"], env=dict(os.environ), log_path=tmp_path / "direct.log")
    with direct:
        url = f"http://127.0.0.1:{direct.port}"
        for text in (CODE, "Write a JavaScript function that reverses a string."):
            want = _chat(url, text)
            assert _chat(served.url, text) == want
            assert _chat(served.url, text, stream=True) == want
        body = {"prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0}
        want_text = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        got = httpx.post(
            f"{served.url}/v1/completions", json=body, headers={"X-Specreg-Task": "code"}
        )
        assert got.headers["x-specreg-task-source"] == "header"
        assert got.json()["choices"][0]["text"] == want_text["choices"][0]["text"]


def test_fifty_concurrent_requests(served: Served) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str]:
        text = CODE if i % 2 else PROSE
        got = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}], "max_tokens": 4},
        )
        return got.status_code, got.headers.get("x-specreg-task", "")

    async def all_of_them() -> list[tuple[int, str]]:
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(50)))

    results = asyncio.run(all_of_them())
    assert [status for status, _ in results] == [200] * 50, results
    assert {task for _, task in results} == {"code", "prose"}
    backends = served.backends()
    assert all(b["ready"] and b["starts"] == 1 for b in backends), backends


def test_streamed_answers_back_to_back_each_arrive_whole(served: Served) -> None:
    """llama-server closes the connection after a streamed answer without saying so; a
    kept-alive connection reused for the next request would fail it (every other one did)."""

    def stream(i: int) -> tuple[int, str]:
        body = {"messages": [{"role": "user", "content": CODE}], "max_tokens": 2, "stream": True}
        with httpx.stream(
            "POST", f"{served.url}/v1/chat/completions", json=body, timeout=60,
            headers={"X-Specreg-Task": "code" if i % 2 else "prose"},
        ) as resp:  # fmt: skip
            return resp.status_code, "".join(resp.iter_lines())

    # more clients than slots: a request waiting for the cores is sent the moment one ends
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(stream, range(72)))
    assert [status for status, _ in answers] == [200] * 72, answers
    assert all(text.endswith("data: [DONE]") for _, text in answers), answers


def test_sigterm_stops_every_backend(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    s = start_serve(tmp_path, llama_install, small_models.smollm2.path)
    pids = s.pids()
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert stop_serve(s) == 0
    assert wait_gone(pids, timeout=5) == []
    assert "stopped (SIGTERM); every backend has exited" in s.log.read_text()


def is_backend(argv: list[bytes]) -> bool:
    return Path(argv[0].decode(errors="replace")).name == "llama-server" and b"--port" in argv


def llama_children(parent: int) -> list[int]:
    """Backends (llama-server with a --port, not the --help probe) whose parent is `parent`.

    The program's own name is checked too: between fork and exec a child's command line is
    still its parent's (`specreg serve ... --port N`), so any probe serve runs would match."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            rest = (proc / "stat").read_text().rsplit(")", 1)[1]
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(rest.split()[1]) == parent and is_backend(argv):
            out.append(int(proc.name))
    return out


def test_sigterm_while_backends_load_stops_them(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    port = free_port()
    argv = [
        sys.executable, "-m", "specreg", "serve", str(small_models.smollm2.path), *PINS,
        "--port", str(port), "--threads", "1", "--llama-bin", str(llama_install.bin_dir),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + STARTUP_S
    while not (pids := llama_children(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, "no backend was started"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert err.decode().strip().endswith("stopped (SIGTERM); every backend has exited")
    assert wait_gone(pids, timeout=5) == []


def test_sigkill_of_specreg_leaves_no_llama_server(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    s = start_serve(tmp_path, llama_install, small_models.smollm2.path)
    pids = s.pids()
    s.proc.kill()
    s.proc.wait()
    assert wait_gone(pids) == []  # Linux's death signal, set by the runner's spawn


def test_a_crashed_backend_is_restarted_and_its_unstreamed_request_retried_elsewhere(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    s = start_serve(tmp_path, llama_install, small_models.smollm2.path, "--policy", "fixed")
    try:
        backend = next(b for b in s.backends() if "plain" in b["name"])

        async def crash() -> httpx.Response:
            async with httpx.AsyncClient(base_url=s.url, timeout=300) as client:
                request = asyncio.ensure_future(
                    client.post(
                        "/v1/completions",
                        json={**LONG, "max_tokens": 400},
                        headers={"X-Specreg-Task": "prose"},
                    )
                )
                await asyncio.sleep(1.0)  # the request is decoding now
                os.kill(backend["pid"], signal.SIGSEGV)
                return await request

        got = asyncio.run(crash())
        # nothing had gone out to the client: the request was sent again, once, to the
        # target's other (lossless) backend
        assert got.status_code == 200, got.text
        assert got.headers["x-specreg-policy"] == "retry"
        assert got.headers["x-specreg-backend"] != backend["name"]
        assert got.json()["choices"][0]["text"]

        deadline = time.monotonic() + 60
        while httpx.get(f"{s.url}/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the backend was not restarted"
            time.sleep(0.2)
        again = next(b for b in s.backends() if b["name"] == backend["name"])
        assert again["starts"] == 2 and again["pid"] != backend["pid"]
        assert "killed by signal 11" in again["last_exit"]
        assert _chat(s.url, PROSE, tokens=4)

        # Streaming: the status line has gone out, so the crash arrives as a last event.
        body = {**LONG, "stream": True}
        events = []
        with httpx.stream(
            "POST", f"{s.url}/v1/completions", json=body, timeout=120,
            headers={"X-Specreg-Task": "prose"},
        ) as resp:  # fmt: skip
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 5:
                        os.kill(again["pid"], signal.SIGSEGV)
        assert events[-1]["error"]["type"] == "backend_error"
        assert events[-1]["error"]["message"].startswith(
            f"backend {backend['name']} crashed during the request: llama-server was killed "
            "by signal 11"
        )
    finally:
        pids = s.pids()
        stop_serve(s)
        assert wait_gone(pids, timeout=5) == []
    # both attempts are in the registry: the crash (how the process died, its log) and the retry
    from specreg.registry.db import opened
    from specreg.registry.run_store import list_runs

    with opened(Path(os.environ["SPECREG_HOME"]) / "registry.duckdb") as con:
        runs = list_runs(con)
    retried = [r for r in runs if (r.config.get("serve") or {}).get("attempt") == 2]
    assert retried and retried[0].status == "ok"
    assert any(
        f"backend {backend['name']} crashed during the request: llama-server was killed by "
        "signal 11"
        in (r.error or "")
        and r.status == "failed"
        for r in runs
    )


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_two_configurations_of_one_target_never_decode_on_the_same_cores_at_once(
    served: Served,
) -> None:
    """Code goes to ngram-mod, prose to plain: two llama-servers on the same cores. Sent at
    once, the requests of the two tasks take turns on the cores (a backend batches its own
    in its slots): the scheduler's record shows no overlapping grants, and /proc shows that
    in no sampling interval did both processes burn CPU on the shared cores."""
    pids = {b["name"]: b["pid"] for b in served.backends()}
    assert len(pids) == 2
    samples: list[dict[str, int]] = []
    done = False

    async def sample() -> None:
        while not done:
            samples.append({name: _ticks(pid) for name, pid in pids.items()})
            await asyncio.sleep(0.25)

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        text = f"{CODE} Call it total_{i}." if i % 2 else f"{PROSE} Verse {i}."
        return await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}], "max_tokens": 48,
                  "temperature": 0},
        )  # fmt: skip

    async def run() -> list[httpx.Response]:
        nonlocal done
        watcher = asyncio.ensure_future(sample())
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as client:
            got = await asyncio.gather(*(one(client, i) for i in range(8)))
        done = True
        await watcher
        return list(got)

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * 8
    assert {r.headers["x-specreg-task"] for r in answers} == {"code", "prose"}
    status = httpx.get(f"{served.url}/v1/specreg/status", timeout=10).json()
    cores = status["cores"]
    assert cores["overlapping_grants"] == 0
    assert sum(b["granted"] for b in cores["backends"]) >= 8
    # /proc: in each interval, the CPU time both burnt together never exceeds the cores'
    # capacity by more than a tick's rounding, and they never both worked a whole interval.
    hz = os.sysconf("SC_CLK_TCK")
    both = 0
    for before, after in zip(samples, samples[1:], strict=False):
        used = [after[n] - before[n] for n in pids]
        if all(u >= 0.1 * hz * 0.25 for u in used):  # each burnt over 10 % of a core
            both += 1
    assert both <= max(2, len(samples) // 10), (both, len(samples))


def test_a_hundred_clients_against_a_bounded_queue_get_an_answer_or_a_503_each(
    tmp_path: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    """Every request is answered or refused with 503 and Retry-After (none lost), and each is
    recorded once: the registry holds exactly one run per request."""
    s = start_serve(tmp_path, llama_install, small_models.smollm2.path, "--queue", "6",
                    "--parallel", "2", "--policy", "fixed")  # fmt: skip

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.post(
            "/v1/completions",
            json={"prompt": f"{PROSE} Number {i}.", "max_tokens": 8, "temperature": 0},
        )

    async def all_of_them() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=s.url, timeout=300, limits=limits) as client:
            return list(await asyncio.gather(*(one(client, i) for i in range(100))))

    try:
        answers = asyncio.run(all_of_them())
        status = httpx.get(f"{s.url}/v1/specreg/status", timeout=10).json()
    finally:
        pids = s.pids()
        assert stop_serve(s) == 0
        assert wait_gone(pids, timeout=5) == []
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 503} and codes.count(200) >= 8 and codes.count(503) >= 1, codes
    for r in answers:
        if r.status_code == 503:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["message"].startswith("the server is at capacity: 6 ")
    assert status["cores"]["rejected"] == codes.count(503)
    assert status["cores"]["overlapping_grants"] == 0
    from specreg.registry.db import opened
    from specreg.registry.run_store import list_runs

    with opened(Path(os.environ["SPECREG_HOME"]) / "registry.duckdb") as con:
        runs = [r for r in list_runs(con) if r.kind == "serve"]
    assert len(runs) == 100
    assert sum(r.status == "ok" for r in runs) == codes.count(200)
    assert sum(r.error_kind == "capacity" for r in runs) == codes.count(503)
