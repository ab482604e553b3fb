"""Ask llama.cpp itself: compile and run the C++ harness in `compat_harness.cpp`.

The differential test's oracle (only tests use it, so it lives here, not in the package).
The harness links the pinned build's libllama and llama-common and calls
`common_speculative_are_compatible` on models loaded with `vocab_only`. The compiled binary is
cached next to the build, named by a hash of its source and the build it links, so a rebuilt
llama.cpp or an edited harness is recompiled and nothing else is. Callers pass the build's
source and library folders (`specreg.llama.build.ensure_build()` has both).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specreg.errors import LlamaError
from specreg.registry.llama_vocab import VOCAB_TYPE_IDS

HARNESS_SOURCE = Path(__file__).with_name("compat_harness.cpp")
# llama_vocab_type by number, as the harness prints it
VOCAB_TYPES = tuple(sorted(VOCAB_TYPE_IDS, key=VOCAB_TYPE_IDS.__getitem__))


def harness_source() -> str:
    return HARNESS_SOURCE.read_text()


def _libs(lib_dir: Path) -> list[str]:
    names = []
    for stem in ("llama-common", "common", "llama", "ggml", "ggml-base", "ggml-cpu"):
        if any(lib_dir.glob(f"lib{stem}.so*")) or (lib_dir / f"lib{stem}.a").exists():
            names.append(f"-l{stem}")
    if "-lllama" not in names:
        raise LlamaError(f"no libllama in {lib_dir}: is the llama.cpp build complete?")
    return names


def compile_harness(src_dir: Path, lib_dir: Path, out_dir: Path) -> Path:
    """The harness binary for this build, compiled with g++ on first use."""
    source = harness_source()
    stamp = hashlib.sha256(source.encode())
    for lib in sorted(lib_dir.glob("lib*.so*")) + sorted(lib_dir.glob("lib*.a")):
        st = lib.stat()
        stamp.update(f"{lib.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    binary = out_dir / f"compat_harness-{stamp.hexdigest()[:12]}"
    if binary.exists():
        return binary
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise LlamaError("no C++ compiler: install g++ to run llama.cpp's own compatibility check")
    out_dir.mkdir(parents=True, exist_ok=True)
    src_file = out_dir / HARNESS_SOURCE.name
    src_file.write_text(source)
    includes = [f"-I{src_dir / d}" for d in ("include", "common", "ggml/include", "vendor")]
    tmp = binary.with_suffix(f".tmp{os.getpid()}")
    cmd = [
        cxx,
        "-std=c++17",
        "-O1",
        str(src_file),
        "-o",
        str(tmp),
        *includes,
        f"-L{lib_dir}",
        *_libs(lib_dir),
        f"-Wl,-rpath,{lib_dir}",
        "-pthread",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaError(f"compiling the compatibility harness failed: {last}")
    tmp.replace(binary)
    return binary


@dataclass(frozen=True)
class HarnessModel:
    """What llama.cpp's loader made of one file (None fields: it could not load it)."""

    path: str
    loaded: bool
    vocab_type: str | None = None
    add_bos: bool | None = None
    add_eos: bool | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    n_tokens: int | None = None


@dataclass(frozen=True)
class HarnessResult:
    models: tuple[HarnessModel, ...]
    verdicts: dict[tuple[int, int], bool | None]
    """(target index, draft index) -> common_speculative_are_compatible; None: load failed."""


def run_harness(
    binary: Path, paths: Sequence[str | os.PathLike[str]], pairs: Sequence[tuple[int, int]]
) -> HarnessResult:
    lines = [str(len(paths)), *(os.fspath(p) for p in paths), *(f"{t} {d}" for t, d in pairs)]
    proc = subprocess.run(
        [str(binary)], input="\n".join(lines) + "\n", capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaError(f"the compatibility harness failed (rc={proc.returncode}): {tail}")
    models: list[HarnessModel] = [HarnessModel(os.fspath(p), False) for p in paths]
    verdicts: dict[tuple[int, int], bool | None] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if parts[0] == "M" and parts[2] != "ERR":
            i = int(parts[1])
            vt, ab, ae, bos, eos, n = (int(x) for x in parts[2:8])
            models[i] = HarnessModel(
                os.fspath(paths[i]), True, VOCAB_TYPES[vt], bool(ab), bool(ae), bos, eos, n
            )
        elif parts[0] == "P":
            verdicts[(int(parts[1]), int(parts[2]))] = (
                None if parts[3] == "ERR" else parts[3] == "1"
            )
    return HarnessResult(tuple(models), verdicts)
