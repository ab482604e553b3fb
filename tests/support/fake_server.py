# ruff: noqa: E501  (the fake binary template quotes llama.cpp log lines verbatim)
"""A fake llama-server (a short Python script) that fails the way llama.cpp does, for the tests
at the process boundary; it writes its pid (and a child's) so a test can check that nothing
outlives the run."""

from __future__ import annotations

import os
import signal
import stat
import sys
import textwrap
import time
from pathlib import Path

HELP_SPEC_TYPE = """\
----- speculative params -----
--spec-type [none|draft-simple|draft-eagle3|draft-mtp|ngram-simple|ngram-map-k|ngram-mod|ngram-cache]
                                        comma-separated list of types of speculative decoding
--spec-draft-n-max N                    maximum number of tokens to draft (default: 3)
"""
HELP_DRAFT_MAX = "-md, --model-draft FNAME   draft model\n--draft-max, --draft, --draft-n N\n"
HELP_UNKNOWN = "usage: llama-server [options]\n-m, --model FNAME\n"

# The fake writes its pid (and a child's) so the test can check nothing outlives the run.
FAKE = r"""#!{python}
import http.server, json, os, signal, subprocess, sys, time
HELP = {help!r}
MODE = {mode!r}
PIDS = {pids!r}
args = sys.argv[1:]
if "--help" in args:
    print(HELP); sys.exit(0)
if "--version" in args:
    print("version: 9999 (fake)", file=sys.stderr); sys.exit(0)
child = subprocess.Popen(["sleep", "600"])
with open(PIDS, "a") as fh:
    fh.write(f"{{os.getpid()}} {{child.pid}}\n")
port = int(args[args.index("--port") + 1])
def log(line):
    print(line, file=sys.stderr, flush=True)
log("0.00.010.000 I build: 9999 (fake)")
if MODE == "load":
    log("0.00.020.000 E llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within the file bounds, model is corrupted or incomplete")
    log("0.00.020.100 E srv    load_model: failed to load model, '/models/broken.gguf'")
    sys.exit(1)
if MODE == "oom":
    log("0.00.020.000 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736")
    log("terminate called after throwing an instance of 'std::bad_alloc'")
    log("  what():  std::bad_alloc")
    os.kill(os.getpid(), signal.SIGABRT)
if MODE == "sigill":
    log("0.00.020.000 I load_tensors: CPU_REPACK model buffer size = 0.44 MiB")
    os.kill(os.getpid(), signal.SIGILL)
if MODE == "port":
    log(f"0.00.020.000 E srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {{port}}")
    sys.exit(1)
if MODE == "hang":
    time.sleep(600)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {{"status": "ok"}})
        if self.path == "/slots":
            return self._json(200, [{{"id": 0, "speculative": False}}])
        self._json(404, {{"error": {{"message": "not found"}}}})
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0)); self.rfile.read(n)
        if MODE == "crash":
            log("0.00.500.000 E ggml_abort: GGML_ASSERT(n_tokens <= n_batch) failed")
            os.kill(os.getpid(), signal.SIGSEGV)
        if MODE == "stall":
            open(PIDS + ".stalled", "w").close()  # a request reached it
            time.sleep(600)
        self._json(200, {{"content": "x", "tokens": [1], "stop_type": "limit",
            "timings": {{"predicted_n": 1, "predicted_ms": 10.0, "prompt_n": 3, "prompt_ms": 1.0}}}})
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def make_fake(tmp_path: Path, mode: str, help_text: str = HELP_SPEC_TYPE) -> tuple[Path, Path]:
    bin_dir = tmp_path / f"fake-{mode}"
    bin_dir.mkdir()
    pids = tmp_path / f"pids-{mode}.txt"
    script = bin_dir / "llama-server"
    script.write_text(
        textwrap.dedent(FAKE).format(
            python=sys.executable, help=help_text, mode=mode, pids=str(pids)
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir, pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stalled(pids_file: Path) -> Path:
    """The file a "stall" fake writes when a request reaches it."""
    return Path(f"{pids_file}.stalled")


def kill_fakes(pids_file: Path, wait_s: float = 0.0) -> list[int]:
    """Kill what the fakes of `pids_file` left running (after `wait_s` for them to go on
    their own); the pids that were still alive."""
    if not pids_file.exists():
        return []
    pids = [int(p) for line in pids_file.read_text().splitlines() for p in line.split()]
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def assert_no_strays(pids_file: Path) -> None:
    assert pids_file.exists(), "the fake server never started"
    left = kill_fakes(pids_file, wait_s=5)  # clean up our own fakes before failing
    assert not left, f"stray processes: {left}"


CRASHING_TOOL = """#!/bin/sh
case "$*" in
  *--version*) echo "version: 9999 (fake)" >&2; exit 0;;
  *--help*) echo "usage: {name} [options]"; exit 0;;
esac
echo "0.00.500.000 E ggml_abort: GGML_ASSERT(n_tokens <= n_batch) failed" >&2
kill -SEGV $$
"""


def add_crashing_tool(bin_dir: Path, name: str) -> Path:
    """A llama.cpp tool (llama-perplexity, llama-bench) in `bin_dir` that answers --version
    and --help and crashes on anything else, as llama.cpp does on a failed assertion."""
    script = bin_dir / name
    script.write_text(CRASHING_TOOL.format(name=name))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script
