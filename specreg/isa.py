"""Instruction-set extensions a native llama.cpp build uses and a host may still not run.

`GGML_NATIVE` (on by default) compiles ggml with `-march=native`: every extension the CPU
lists is used. Some of them kill the pinned build anyway: on Intel Xeons with AMX, ggml's AMX
kernels die with SIGILL at the first batch (upstream llama.cpp PR 26954: the tile permission
and configuration are not set up on every thread), although the hardware runs AMX code fine.
Turning an extension off with the compiler's `-mno-*` flags (in CMAKE_C_FLAGS and
CMAKE_CXX_FLAGS; they win over `-march=native` in either order) gives a build that runs.

`specreg llama build` tries the native build first and, when it dies by a signal, the
fallbacks below in order, each adding to the last, for the extensions this host lists only
(turning off what the CPU does not have changes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Extension:
    """An instruction-set extension: how /proc/cpuinfo lists it and how to compile without it."""

    name: str
    cpu_flags: tuple[str, ...]  # any of these in /proc/cpuinfo: -march=native uses it
    compiler_flags: tuple[str, ...]  # gcc/clang flags that turn it off
    why: str  # why it is a suspect, in a few words
    features: tuple[str, ...]  # how llama_print_system_info names it ("AMX_INT8 = 1")

    @property
    def slug(self) -> str:
        return self.name.lower().replace("-", "")


AMX = Extension(
    "AMX",
    ("amx_tile", "amx_int8", "amx_bf16"),
    ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"),
    "the pinned ggml's AMX kernels die on some Xeons (llama.cpp PR 26954)",
    ("AMX_INT8",),
)
AVX512 = Extension(
    "AVX-512",
    ("avx512f",),
    ("-mno-avx512f",),
    "some virtual machines list AVX-512 and do not save its registers",
    ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
)
# Most likely culprit first.
FALLBACKS: tuple[Extension, ...] = (AMX, AVX512)


def ladder(cpu_flags: Iterable[str]) -> tuple[tuple[Extension, ...], ...]:
    """The builds to try, in order: native (nothing off), then each fallback this host lists,
    turned off on top of the ones before it."""
    flags = set(cpu_flags)
    steps: list[tuple[Extension, ...]] = [()]
    for ext in FALLBACKS:
        if flags.intersection(ext.cpu_flags):
            steps.append((*steps[-1], ext))
    return tuple(steps)


def compiler_flags(off: Iterable[Extension]) -> tuple[str, ...]:
    return tuple(flag for ext in off for flag in ext.compiler_flags)


def cmake_flags(off: Iterable[Extension]) -> tuple[str, ...]:
    """The cmake definitions that compile without `off` (nothing when nothing is off)."""
    flags = " ".join(compiler_flags(off))
    if not flags:
        return ()
    return (f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}")


def names(off: Iterable[Extension]) -> str:
    return " and ".join(ext.name for ext in off) or "nothing"


def by_name(name: str) -> Extension:
    for ext in FALLBACKS:
        if ext.name == name:
            return ext
    raise KeyError(name)


# What to tell a user whose llama.cpp dies with SIGILL: the same line from every command.
SIGILL_REMEDY = (
    "this llama.cpp uses CPU instructions this host cannot run (AMX on some Xeons): run "
    "`specreg llama build` (it proves its build here and turns off what kills it), or rebuild "
    f"yours with cmake {' '.join(repr(f) for f in cmake_flags((AMX,)))}"
)
