"""What a llama.cpp build is on this host, for `specreg doctor`: the CPU features it was
compiled for (libllama's own system info), whether it is native, which extensions specreg
turned off on purpose, and whether it runs at all (the proof model through its binaries)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

from specreg.home import logs_dir
from specreg.host.doctor import BuildFacts
from specreg.host.machine import detect_host
from specreg.llama.install import LlamaInstall, build_of
from specreg.llama.proof import PROOF_BINARIES, prove
from specreg.samples.probe_model import ensure_probe_model

log = logging.getLogger(__name__)

_SYSTEM_INFO_SNIPPET = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "lib.llama_print_system_info.restype = ctypes.c_char_p\n"
    "sys.stdout.write(lib.llama_print_system_info().decode(errors='replace'))\n"
)


def _compiled_for(bin_dir: Path) -> tuple[str | None, bool | None]:
    """The build's system info, read from its own libllama in a child process (a library
    built for another CPU must not take doctor down with it), and whether it is native."""
    info: str | None = None
    for lib in (bin_dir / "libllama.so", bin_dir.parent / "lib" / "libllama.so"):
        if not lib.is_file():
            continue
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _SYSTEM_INFO_SNIPPET, str(lib)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            log.info("cannot read the system info of %s: %s", lib, err)
            continue
        if proc.returncode == 0 and proc.stdout.strip():
            info = proc.stdout.strip()
            break
    native = None
    cache = bin_dir.parent / "CMakeCache.txt"
    if cache.is_file():
        m = re.search(r"^GGML_NATIVE:BOOL=(\w+)", cache.read_text(errors="replace"), re.M)
        if m:
            native = m.group(1).upper() in ("ON", "TRUE", "1", "YES")
    return info, native


def build_facts(install: LlamaInstall, *, try_it: bool = True) -> BuildFacts:
    """The facts of the build specreg would run; with `try_it`, whether it runs here (the
    proof model through the binaries of `PROOF_BINARIES` it has: a second or two)."""
    info, native = _compiled_for(install.bin_dir)
    build = build_of(install)
    turned_off = (
        tuple(f for ext in build.disabled_extensions for f in ext.features) if build else ()
    )
    facts = BuildFacts(install.bin_dir, install.version, info, native, turned_off)
    if not try_it:
        return facts
    binaries = tuple(b for b in PROOF_BINARIES if b in install.binaries)
    host = detect_host()
    proof = prove(
        install.bin_dir,
        ensure_probe_model(),
        binaries=binaries,
        threads=host.threads,
        env=host.env(),
        log_path=logs_dir() / "doctor-proof.log",
    )
    summary = proof.summary
    if not proof.ok:
        summary += f"; log: {logs_dir() / 'doctor-proof.log'}"
    seconds = sum(p.seconds for p in proof.probes)
    return BuildFacts(
        install.bin_dir, install.version, info, native, turned_off,
        runs=proof.ok, died=bool(proof.died), runs_summary=summary, runs_seconds=seconds,
    )  # fmt: skip
