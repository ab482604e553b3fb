"""Prompt sets by task, shipped with specreg, and the user's own JSONL prompts."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from specreg.errors import UsageError
from specreg.terms import TASKS as TASKS
from specreg.terms import canonical_task


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    task: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Workload:
    name: str  # "task:code", "tasks:code,math" or the user's file path
    prompts: tuple[Prompt, ...]

    def head(self, n: int | None) -> Workload:
        return self if n is None else Workload(self.name, self.prompts[:n])

    def repeated(self) -> tuple[str, ...]:
        """Ids of prompts whose text an earlier prompt already has (a replay, if sent)."""
        seen: set[str] = set()
        out = []
        for p in self.prompts:
            if p.sha256 in seen:
                out.append(p.prompt_id)
            seen.add(p.sha256)
        return tuple(out)

    def held_out(self, n_build: int) -> tuple[Workload, Workload]:
        """The first `n_build` prompts (what state is built from: a warm server's earlier
        requests, a lookup cache's text) and the rest, evaluated on. A held-out prompt whose
        text is among the building ones would be a replay: refused."""
        if not 0 < n_build < len(self.prompts):
            raise UsageError(
                f"cannot hold out prompts after the first {n_build} of {len(self.prompts)}: "
                f"give between 1 and {len(self.prompts) - 1}"
            )
        build, rest = self.prompts[:n_build], self.prompts[n_build:]
        built = {p.sha256 for p in build}
        again = [p.prompt_id for p in rest if p.sha256 in built]
        if again:
            raise UsageError(
                f"{', '.join(again)} repeat(s) a prompt of the first {n_build}: held-out "
                "prompts must be new to what was built"
            )
        return Workload(f"{self.name}[:{n_build}]", build), Workload(
            f"{self.name}[{n_build}:]", rest
        )


def _parse(lines: list[str], source: str, default_task: str) -> tuple[Prompt, ...]:
    prompts = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"{source}:{no} is not JSON ({err.msg}): one object per line") from err
        if isinstance(item, str):
            item = {"prompt": item}
        text = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(text, str) or not text:
            raise UsageError(f'{source}:{no} has no "prompt" string: use {{"prompt": "..."}}')
        prompts.append(
            Prompt(
                prompt_id=str(item.get("id") or f"{Path(source).stem}-{no}"),
                task=str(item.get("task") or default_task),
                text=text,
            )
        )
    if not prompts:
        raise UsageError(f"{source} has no prompts")
    ids = [p.prompt_id for p in prompts]
    if len(set(ids)) != len(ids):
        raise UsageError(f"{source} repeats a prompt id: ids must be unique")
    return tuple(prompts)


def task_prompts(task: str) -> tuple[Prompt, ...]:
    task = canonical_task(task)
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    text = files("specreg.runner").joinpath("prompts").joinpath(f"{task}.jsonl").read_text()
    return _parse(text.splitlines(), f"{task}.jsonl", task)


def load_workload(tasks: tuple[str, ...] = ("code",), prompts_file: Path | None = None) -> Workload:
    """The user's JSONL file when given, else the shipped prompts of `tasks`."""
    if prompts_file is not None:
        try:
            lines = Path(prompts_file).read_text().splitlines()
        except OSError as err:
            raise UsageError(f"cannot read {prompts_file}: {err.strerror}") from err
        return Workload(str(prompts_file), _parse(lines, str(prompts_file), CUSTOM_TASK))
    chosen = tasks or TASKS
    return Workload("tasks:" + ",".join(chosen), tuple(p for t in chosen for p in task_prompts(t)))


DEFAULT_TASK = "code"  # the prompts a run or a sweep measures when no task is named
CUSTOM_TASK = "custom"  # the task recorded with the user's own prompts


@dataclass(frozen=True)
class Prompts:
    """The prompts a run or a sweep measures, as asked: the shipped prompts of `tasks` (code
    when none is named), or the user's own JSONL `file`; the first `max_prompts` of them."""

    tasks: tuple[str, ...] = ()
    file: Path | None = None
    max_prompts: int | None = None

    @property
    def chosen(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.tasks)) or (DEFAULT_TASK,)

    @property
    def task(self) -> str:
        """The task the runs are recorded with: the tasks named, or custom for a file."""
        return CUSTOM_TASK if self.file is not None else ",".join(self.chosen)

    def workload(self) -> Workload:
        return load_workload(self.chosen, self.file).head(self.max_prompts)
