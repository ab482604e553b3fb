"""Find the user's llama.cpp and learn which flag dialect it speaks.

Order: `--llama-bin DIR`, `$SPECREG_LLAMA_BIN`, `PATH`, then specreg's cached build.
The dialect comes from `llama-server --help`, never from a version number: builds from
source often report `b0-unknown`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from specreg.errors import LlamaError
from specreg.host.machine import Host
from specreg.llama.build import BuildInfo, cached_build
from specreg.llamacpp import DRAFT_MAX, SPEC_TYPE, Flag, Tool

# The dialects are specreg.terms' vocabulary, importable from here too.
from specreg.terms import DIALECT_DRAFT_MAX as DIALECT_DRAFT_MAX
from specreg.terms import DIALECT_SPEC_TYPE as DIALECT_SPEC_TYPE
from specreg.terms import DIALECTS as DIALECTS

ENV_LLAMA_BIN = "SPECREG_LLAMA_BIN"
SERVER = Tool.SERVER
HELP_TIMEOUT_S = 30.0

T = TypeVar("T")

NOT_FOUND_HINT = (
    "pass --llama-bin DIR, set SPECREG_LLAMA_BIN, put llama-server on PATH, or run "
    "`specreg llama build`"
)


@dataclass(frozen=True)
class LlamaInstall:
    """One llama.cpp installation: where its binaries are and what they accept."""

    bin_dir: Path
    source: str  # --llama-bin | SPECREG_LLAMA_BIN | PATH | cache
    version: str  # e.g. "11434 (pypi-sdist)", or "unknown"
    dialect: str
    spec_types: tuple[str, ...]  # accepted --spec-type values; () for draft-max builds
    binaries: tuple[str, ...]  # llama-* executables found next to llama-server

    @property
    def server(self) -> Path:
        return self.bin_dir / SERVER

    def binary(self, name: str) -> Path:
        if name not in self.binaries:
            raise LlamaError(
                f"{name} is not in {self.bin_dir}: use a llama.cpp build that has it "
                "(`specreg llama build` makes one)"
            )
        return self.bin_dir / name

    def supports(self, spec_type: str) -> bool:
        """Whether llama-server takes `spec_type` (one type, or every type of a stack)."""
        types = [t for t in spec_type.split(",") if t] or ["none"]
        if self.dialect == DIALECT_SPEC_TYPE:
            return all(t in self.spec_types for t in types)
        return len(types) == 1 and types[0] in DRAFT_MAX.server_spec_types


@dataclass(frozen=True)
class LlamaInfo:
    """`specreg llama info`: the llama.cpp specreg would use, and the host it runs on."""

    JSON_KIND = "llama-info"
    JSON_VERSION = "2"  # 2: build, specreg's own build when that is the one used (else null)

    install: LlamaInstall
    host: Host
    build: BuildInfo | None = None

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        build = self.build.to_json() if self.build is not None else None
        if build is not None:
            del build["version"], build["kind"]
        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {"llama": self.install, "host": self.host.to_json(), "build": build},
        )


def build_of(install: LlamaInstall) -> BuildInfo | None:
    """specreg's cached build when `install` is it (how it was built, and why)."""
    build = cached_build()
    if build is None or build.bin_dir.resolve() != install.bin_dir.resolve():
        return None
    return build


def _candidates(bin_dir: Path | None) -> list[tuple[str, Path]]:
    if bin_dir is not None:
        return [("--llama-bin", Path(bin_dir))]
    env = os.environ.get(ENV_LLAMA_BIN)
    if env:
        return [(ENV_LLAMA_BIN, Path(env))]
    found: list[tuple[str, Path]] = []
    on_path = shutil.which(SERVER)
    if on_path:
        found.append(("PATH", Path(on_path).resolve().parent))
    build = cached_build()
    if build is not None:
        found.append(("cache", build.bin_dir))
    return found


def run_text(cmd: list[str]) -> tuple[int, str]:
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=HELP_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as err:
        raise LlamaError(
            f"`{' '.join(cmd)}` did not finish within {HELP_TIMEOUT_S:.0f} s: check that it "
            "is a working llama.cpp binary"
        ) from err
    except OSError as err:
        raise LlamaError(f"cannot run {cmd[0]}: {err.strerror}; {NOT_FOUND_HINT}") from err
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def read_help(binary: Path, parse: Callable[[str], T | None], refusal: Callable[[str], str]) -> T:
    """What `parse` reads from `binary --help`; a `LlamaError` with `refusal` of the tool's
    last line when it reads nothing."""
    rc, help_text = run_text([str(binary), Flag.HELP])
    parsed = parse(help_text)
    if parsed is None:
        raise LlamaError(refusal(last_line(help_text, rc)))
    return parsed


def last_line(output: str, rc: int) -> str:
    """What a tool said last (for error messages), or its exit code when it said nothing."""
    return (output.strip().splitlines() or [f"exit code {rc}"])[-1][:120]


def parse_dialect(help_text: str) -> tuple[str, tuple[str, ...]] | None:
    """(dialect, spec types) from `llama-server --help`, or None for an unknown dialect: the
    dialect whose marker flag the help lists (specreg.llamacpp), newest first."""
    marker = re.escape(SPEC_TYPE.marker)
    if re.search(rf"(^|[\s,]){marker}\b", help_text, re.M):
        types: tuple[str, ...] = ()
        for line in help_text.splitlines():
            if SPEC_TYPE.marker in line:
                m = re.search(rf"{marker}\s+\[?([a-z0-9,|\-]+)", line)
                if m:
                    types = tuple(t for t in re.split(r"[,|]", m.group(1)) if t)
                break
        return DIALECT_SPEC_TYPE, types or DRAFT_MAX.server_spec_types
    if re.search(rf"(^|[\s,]){re.escape(DRAFT_MAX.marker)}\b", help_text, re.M):
        return DIALECT_DRAFT_MAX, ()
    return None


def parse_version(text: str) -> str:
    """`BUILD (COMMIT)` from `llama-server --version`, whichever way the build says it: older
    builds print `version: 7371 (abc1234)`, newer ones `version: 0.6.0-dev (build 11434, commit
    pypi-sdist)`, where the leading number is the project's version, not the build. A build
    without a number (0) or a commit says so instead of passing for build 0."""
    m = re.search(r"version:\s*(\S+)\s*\(build\s+(\d+),\s*commit\s+([^)\s]*)\)", text)
    if m:
        build, commit = m.group(2), m.group(3)
        if build == "0":
            return f"{m.group(1)} (no build number{'' if commit == 'unknown' else ', ' + commit})"
        return f"{build} ({commit})"
    m = re.search(r"version:\s*(\S+)\s*\(([^)]*)\)", text)
    if m:
        return f"{m.group(1)} ({m.group(2)})"
    return "unknown"


def probe_install(bin_dir: Path, source: str) -> LlamaInstall:
    server = bin_dir / SERVER
    if not server.is_file() or not os.access(server, os.X_OK):
        raise LlamaError(f"no executable {SERVER} in {bin_dir} (from {source}); {NOT_FOUND_HINT}")
    dialect, types = read_help(
        server,
        parse_dialect,
        lambda said: (
            f"{server} speaks an unknown flag dialect (neither {SPEC_TYPE.marker} nor "
            f"{DRAFT_MAX.marker} in its --help; it said: {said}): use llama.cpp from 2024-12 or "
            "later"
        ),
    )
    _, version_text = run_text([str(server), Flag.VERSION])
    binaries = tuple(
        sorted(p.name for p in bin_dir.glob("llama-*") if p.is_file() and os.access(p, os.X_OK))
    )
    return LlamaInstall(
        bin_dir=bin_dir,
        source=source,
        version=parse_version(version_text),
        dialect=dialect,
        spec_types=types,
        binaries=binaries,
    )


def planned_install() -> LlamaInstall:
    """No llama.cpp here, for plans that start nothing (`serve --dry-run` on a laptop, for a
    big host): the pinned build's dialect and spec types, `llama-server` by name."""
    from specreg.llamacpp import SPEC_TYPE

    return LlamaInstall(
        bin_dir=Path(""),
        source="none (planned with the pinned build's flags)",
        version="unknown",
        dialect=DIALECT_SPEC_TYPE,
        spec_types=SPEC_TYPE.server_spec_types,
        binaries=(SERVER,),
    )


def find_llama(bin_dir: Path | None = None) -> LlamaInstall:
    """The llama.cpp to run, by the documented search order."""
    candidates = _candidates(bin_dir)
    if not candidates:
        raise LlamaError(f"llama.cpp not found; {NOT_FOUND_HINT}")
    source, path = candidates[0]
    return probe_install(path, source)
