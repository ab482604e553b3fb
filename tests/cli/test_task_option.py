"""One task option everywhere (issue 25, point 10): every command's --task accepts the same
words, aliases included (`summary` is summarize, `general` is chat), and every task it offers
has a shipped quality text. Before, `agree --task summary` and `quality --task general` were
refused, and `quality --task summarize` was offered, then failed for want of a text."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from specreg.cli.common import TaskChoice
from specreg.quality.kld import quality_texts, shipped_text
from specreg.terms import TASK_ALIASES, TASK_CHOICES, TASKS

from support.cli import command_options
from support.cli import specreg_without_llama as specreg
from support.fixtures import MOE_KV


def task_options() -> list[tuple[str, click.Option]]:
    return [(path, p) for path, p in command_options() if "--task" in p.opts]


def test_every_task_option_takes_the_same_words() -> None:
    found = task_options()
    assert {path for path, _ in found} >= {"quality", "agree", "run", "recommend", "sweep"}
    for path, param in found:
        assert isinstance(param.type, TaskChoice), path
        assert tuple(param.type.choices) == TASK_CHOICES, path


@pytest.mark.parametrize("alias", sorted(TASK_ALIASES))
def test_every_task_option_maps_an_alias_to_its_task(alias: str) -> None:
    for path, param in task_options():
        assert param.type.convert(alias, param, None) == TASK_ALIASES[alias], path


@pytest.mark.parametrize("task", TASK_CHOICES)
def test_every_offered_task_has_a_shipped_text(task: str) -> None:
    text = shipped_text(task)
    assert text.task in TASKS
    assert len(text.path.read_bytes()) > 2000  # a few hundred tokens, as the others


def test_the_default_texts_are_every_task() -> None:
    assert [t.task for t in quality_texts()] == list(TASKS)


@pytest.mark.parametrize(
    ("command", "task", "note"),
    [
        ("quality", "summarize", None),
        ("quality", "general", "note: task general is chat"),
        ("quality", "summary", "note: task summary is summarize"),
        ("agree", "summary", "note: task summary is summarize"),
        ("agree", "general", "note: task general is chat"),
    ],
)
def test_quality_and_agree_take_every_task_word(
    gguf_factory,  # type: ignore[no-untyped-def]
    command: str,
    task: str,
    note: str | None,
) -> None:
    if command == "quality":
        args = [str(gguf_factory("moe.gguf", arch="qwen3moe", kv=MOE_KV)), "--experts", "1"]
    else:
        big = (("token_embd.weight", (8, 4)), ("blk.0.ffn_up.weight", (64, 64)))
        target: Path = gguf_factory("target.gguf", general_name="Target", tensors=big)
        args = [str(target), str(gguf_factory("draft.gguf", general_name="Draft"))]
    r = specreg(command, *args, "--task", task)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1, r.stderr
    assert lines[-1].startswith("error: no executable llama-server in"), r.stderr
    if note is not None:
        assert lines[0].startswith(note)
