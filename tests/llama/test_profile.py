"""llama.cpp is described once (specreg.llamacpp) and started from one part (llama/).

Read from the source, not run: every string literal of the package is compared with the
profile's flag spellings, and every module outside llama/ and host/ is searched for the
standard library's (and click's) ways of starting a process. The profile's facts themselves
are checked against the pinned build in test_stacks.py (K flags, priority) and
test_runner_state.py (state between requests)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import specreg
from specreg import llamacpp
from specreg.host.sources import llama_source_dir
from specreg.llamacpp import (
    DIALECTS,
    K_DEFAULT,
    K_FLAG,
    LONG_NAMES,
    NGRAM_PARAMS,
    SPELLINGS,
    Flag,
    PerplexityFlag,
    ServerFlag,
    SpecFlag,
)
from specreg.terms import DIALECT_DRAFT_MAX, DIALECT_SPEC_TYPE, MODEL_DRAFTER_TYPES, NGRAM_TYPES

ROOT = Path(specreg.__file__).resolve().parent.parent
# The package's folders (specreg/<part> are links to them); tests and benchmarks are not in it.
PARTS = (
    "specreg", "registry", "auditor", "samples", "host", "recommender", "llama", "runner",
    "quality", "tune", "declare", "serve", "reports",
)  # fmt: skip
# Spellings other programs share (python -c/-m, cc -o, click's own options): a literal of these
# is not necessarily llama.cpp's, so only the argv builders' use of them is reviewed by eye.
SHARED = {"-m", "-t", "-c", "-f", "-p", "-n", "-o", "-r", "--help", "--version", "--host", "--port"}
# Literals still spelled outside the profile (none left).
LEFT: dict[str, set[str]] = {}
# Parts allowed to start processes: llama/ (llama.cpp), host/ (this machine's probes, `pip
# download` of the pinned sdist and the sample wheels, the desktop's opener for report --open).
STARTERS = ("llama", "host")
STARTS_LEFT: set[str] = set()  # none left elsewhere


def _files() -> Iterator[tuple[str, ast.Module]]:
    for part in PARTS:
        folder = ROOT / part
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(ROOT)
            if part == "specreg" and (folder / rel.parts[1]).is_symlink():
                continue  # specreg/<part> -> <part>, read once by its real path
            yield rel.as_posix(), ast.parse(path.read_text(), str(rel))


def _profile_flags() -> set[str]:
    flags: set[str] = set()
    for group in (llamacpp.Flag, llamacpp.ServerFlag, llamacpp.BenchFlag, llamacpp.SpecFlag,
                  llamacpp.PerplexityFlag, llamacpp.QuantizeFlag, llamacpp.DraftFlag):  # fmt: skip
        flags |= {v for k, v in vars(group).items() if k.isupper() and isinstance(v, str)}
    for d in SPELLINGS:
        flags |= {f for f in (d.spec_type, d.draft_model, d.draft_n_min, d.draft_p_min) if f}
        flags |= {d.draft_n_max, d.draft_threads, *d.removed}
    flags |= {p.flag for params in NGRAM_PARAMS.values() for p in params.values()}
    return flags | set(llamacpp.LONG_NAMES.values())


def test_no_llama_flag_is_spelled_outside_the_profile() -> None:
    flags = _profile_flags() - SHARED
    assert {"--spec-type", "-md", "--draft-max", "--spec-ngram-simple-size-m"} <= flags
    found: dict[str, set[str]] = {}
    for rel, tree in _files():
        if rel == "specreg/llamacpp.py" or rel.startswith("specreg/cli/"):
            continue  # the profile; the CLI's own options (--spec-type, --temp) are specreg's
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in flags:
                found.setdefault(rel, set()).add(node.value)
    extra = {rel: got - LEFT.get(rel, set()) for rel, got in found.items()}
    assert not {rel: got for rel, got in extra.items() if got}, "use specreg.llamacpp"


def _starts(tree: ast.Module) -> set[str]:
    """What in `tree` starts a process the standard library's (or click's) way."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names = [f"{node.value.id}.{node.attr}"]
        else:
            continue
        for name in names:
            root = name.split(".")[0]
            if root in ("subprocess", "multiprocessing", "pty", "webbrowser"):
                out.add(root)
            elif name.startswith(("os.spawn", "os.exec", "os.posix_spawn")) or name in (
                "os.system", "os.popen", "os.fork", "asyncio.create_subprocess_exec",
                "asyncio.create_subprocess_shell", "concurrent.futures.process", "click.launch",
            ):  # fmt: skip
                out.add(name)
    return out


def test_only_llama_and_host_start_processes() -> None:
    found = {rel: _starts(tree) for rel, tree in _files() if rel.split("/")[0] not in STARTERS}
    started = {rel for rel, how in found.items() if how}
    assert started == STARTS_LEFT, {rel: found[rel] for rel in started}
    assert _starts(ast.parse("import subprocess\nos.posix_spawnp('x', [], {})")) == {
        "subprocess",
        "os.posix_spawnp",
    }


def test_k_is_defined_once_per_type() -> None:
    """Every type with a draft length has a K default; the flag, where one sets it, is the
    dialect's (ngram-cache's 8 is hard-coded in llama-server)."""
    assert set(K_DEFAULT) == set(K_FLAG) == {*MODEL_DRAFTER_TYPES, *NGRAM_TYPES}
    assert K_FLAG["ngram-cache"] is None and K_DEFAULT["ngram-cache"] == 8
    assert K_DEFAULT["draft-simple"] == 3 and K_DEFAULT["ngram-mod"] == 64
    assert DIALECTS[DIALECT_SPEC_TYPE].k_flag is K_FLAG
    assert DIALECTS[DIALECT_DRAFT_MAX].k_default == {"draft-simple": 16}
    assert NGRAM_PARAMS["ngram-mod"]["n_max"].flag == K_FLAG["ngram-mod"]


def _arg_groups(source: str) -> list[tuple[set[str], str]]:
    """common/arg.cpp's options: each `{"-x", "--long"}` name group and the text after it."""
    found = list(re.finditer(r'\{((?:"-[^"]+"(?:,\s*)?)+)\}', source))
    return [(set(re.findall(r'"(-[^"]+)"', m[1])), source[m.end() : m.end() + 200]) for m in found]


def test_the_spec_type_dialect_is_the_pinned_builds() -> None:
    """Every spelling the profile gives the pinned build is an option of its common/arg.cpp
    (the removed ones refused there), and the defaults are common/common.h's."""
    tree = llama_source_dir()
    groups = _arg_groups((tree / "common/arg.cpp").read_text())
    names = set().union(*(g for g, _ in groups))
    for group in (Flag, ServerFlag, SpecFlag, PerplexityFlag):
        for flag in (v for k, v in vars(group).items() if k.isupper()):
            assert flag in names, flag
    d = DIALECTS[DIALECT_SPEC_TYPE]
    for flag in (d.draft_model, d.draft_threads, d.draft_n_max, d.draft_n_min, d.draft_p_min):
        assert flag in names, flag
    for params in NGRAM_PARAMS.values():
        assert {p.flag for p in params.values()} <= names
    for flag in d.removed:
        assert any(flag in g and "has been removed" in text for g, text in groups), flag
    for short, long in LONG_NAMES.items():
        assert any({short, long} <= g for g, _ in groups), (short, long)
    header = (tree / "common/common.h").read_text()
    for struct, params in (
        ("common_params_speculative_ngram_mod", NGRAM_PARAMS["ngram-mod"]),
        ("common_params_speculative_ngram_map", NGRAM_PARAMS["ngram-simple"]),
    ):
        body = header[header.index(f"struct {struct} {{") :]
        body = body[: body.index("};")]
        for name, p in params.items():
            assert re.search(rf"\b{name}\s*=\s*{p.default};", body), (struct, name)
    draft = header[header.index("struct common_params_speculative_draft {") :]
    assert re.search(rf"\bn_max\s*=\s*{K_DEFAULT['draft-simple']};", draft)
