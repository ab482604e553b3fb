"""Only `llama/` and `host/` start processes: every other part asks them (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ALLOWED = {"llama", "host"}
PARTS = ("registry", "auditor", "recommender", "runner", "reports", "serve", "samples", "quality",
         "tune", "declare", "llama", "host")  # fmt: skip
MODULES = {"subprocess", "multiprocessing", "pty"}
CALLS = {("os", "system"), ("os", "popen"), ("os", "fork"), ("os", "posix_spawn"),
         ("os", "execv"), ("os", "execvp"), ("os", "spawnv"), ("click", "launch"),
         ("asyncio", "create_subprocess_exec"), ("asyncio", "create_subprocess_shell")}  # fmt: skip


def process_starts(path: Path) -> list[str]:
    """What in `path` starts a process: imports of the process modules, calls of the rest."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MODULES:
            found.append(node.module or "")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            found += [f"{node.value.id}.{node.attr}"] if (node.value.id, node.attr) in CALLS else []
    return [f"{path.relative_to(REPO)}: {what}" for what in found]


def test_no_part_but_llama_and_host_starts_a_process() -> None:
    files = [p for part in PARTS if part not in ALLOWED for p in (REPO / part).rglob("*.py")]
    # the core and the commands (specreg/'s other folders link to the parts above)
    files += [*(REPO / "specreg").glob("*.py"), *(REPO / "specreg" / "cli").rglob("*.py")]
    assert len(files) > 100
    assert [s for f in sorted(files) for s in process_starts(f)] == []


def test_the_check_finds_what_it_looks_for() -> None:
    allowed = [s for part in sorted(ALLOWED) for f in sorted((REPO / part).rglob("*.py"))
               for s in process_starts(f)]  # fmt: skip
    assert any("subprocess" in s for s in allowed) and any("click.launch" in s for s in allowed)
