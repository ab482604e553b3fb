"""Lookup caches grown from served traffic: drafts from what earlier requests produced.

This is the SuffixDecoding idea on llama.cpp's own machinery. Every `every` successful
requests of a (target, task), the recorder's thread builds a workload lookup cache from the
prompts and outputs of that task's served requests, as `specreg lookup-cache build --run ID`
does (the target's tokenizer, llama-lookup-create), and the task's policy gains a candidate:
ngram-cache reading that cache. A newer cache (built from more requests) supersedes the older
one, whose backend then retires.

A cache is judged only on requests that arrive after the ones that built it, so its evidence
is never a replay of what it was built from. A cache that lost to another candidate on evidence
(retired as dominated, or measured and not the task's best) is not followed by one built from
`every` more requests, which would hold little more and cost
another losing try: the next waits until the task's served texts have doubled (a cache's hits
grow with the text it holds, slowly). Texts are kept in the registry (the runs' prompt
and output) only while traffic caches are on: `serve --traffic-cache 0` keeps none.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from specreg.errors import SpecregError
from specreg.host.machine import Host
from specreg.llama.install import LlamaInstall
from specreg.registry.lookup_caches import LookupCache, list_caches
from specreg.registry.run_store import STATUS_OK

log = logging.getLogger(__name__)

PREFIX = "traffic"
MAX_TEXT_CHARS = 64 * 1024  # of one prompt or one answer: a cache needs text, not whole files
BUILD_THREADS = 1  # llama-lookup-create shares the cores with serving: one of them
_NAME = re.compile(rf"{PREFIX}-([0-9a-f]{{12}})-([a-z]+)-g(\d+)")


def cache_name(model_id: str, task: str, generation: int) -> str:
    """The registry name of a target's traffic cache for a task (a valid cache name)."""
    return f"{PREFIX}-{model_id[:12]}-{task}-g{generation}"


def parse_name(name: str) -> tuple[str, str, int] | None:
    """(model id prefix, task, generation) of a traffic cache's name; None for other caches."""
    m = _NAME.fullmatch(name)
    return (m[1], m[2], int(m[3])) if m else None


# -- the texts of a request and of its answer ------------------------------------------------


def _clip(text: str) -> str:
    return text[:MAX_TEXT_CHARS]


def request_text(body: Mapping[str, Any]) -> str | None:
    """What the model was given: the messages' text in order (chat), or the prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                parts += [p["text"] for p in content
                          if isinstance(p, dict) and isinstance(p.get("text"), str)]  # fmt: skip
        return _clip("\n".join(parts)) if parts else None
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = "\n".join(p for p in prompt if isinstance(p, str))
    return _clip(prompt) if isinstance(prompt, str) and prompt else None


def answer_text(answer: Mapping[str, Any] | None) -> str | None:
    """The first choice's text of a whole answer (chat or completion)."""
    choice = _first_choice(answer)
    if choice is None:
        return None
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return _clip(text) if isinstance(text, str) else None


def delta_text(event: Mapping[str, Any] | None) -> str:
    """The text one streamed event adds (chat `delta.content` or completion `text`)."""
    choice = _first_choice(event)
    if choice is None:
        return ""
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text if isinstance(text, str) else ""


def _first_choice(doc: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    choices = doc.get("choices") if isinstance(doc, Mapping) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


# -- what the registry holds -----------------------------------------------------------------


def served_text_runs(con: duckdb.DuckDBPyConnection, model_id: str, task: str) -> list[int]:
    """The served requests of `task` on the target `model_id` whose texts were kept, oldest
    first: what a traffic cache is built from."""
    rows = con.execute(
        "SELECT DISTINCT r.run_id FROM runs r JOIN run_prompts p ON p.run_id = r.run_id "
        "WHERE r.kind = 'serve' AND r.status = ? AND r.target_model_id = ? AND r.task = ? "
        "AND p.output_text IS NOT NULL ORDER BY r.run_id",
        [STATUS_OK, model_id, task],
    ).fetchall()
    return [int(r[0]) for r in rows]


def latest_cache(con: duckdb.DuckDBPyConnection, model_id: str, task: str) -> LookupCache | None:
    """The newest traffic cache of a target and task, if one was built."""
    mine = [
        (parsed[2], c)
        for c in list_caches(con)
        if (parsed := parse_name(c.name)) is not None
        and parsed[0] == model_id[:12] and parsed[1] == task
    ]  # fmt: skip
    return max(mine, key=lambda gc: gc[0])[1] if mine else None


@dataclass(frozen=True)
class TrafficState:
    """Where a (target, task)'s traffic caches stand: the newest generation built, the
    requests it was built from, and the served requests with texts not in it yet."""

    generation: int = 0
    built_from: int = 0
    waiting: int = 0


def traffic_state(con: duckdb.DuckDBPyConnection, model_id: str, task: str) -> TrafficState:
    built = latest_cache(con, model_id, task)
    served = len(served_text_runs(con, model_id, task))
    parsed = parse_name(built.name) if built is not None else None
    if built is None or parsed is None:
        return TrafficState(waiting=served)
    return TrafficState(parsed[2], len(built.sources), max(served - len(built.sources), 0))


# -- building while serving ------------------------------------------------------------------

# (target name, task, cache): called on the event loop's thread once a cache is built.
OnBuilt = Callable[[str, str, LookupCache], None]


@dataclass(frozen=True)
class _Job:
    target: str  # the target's name in the route table
    model_id: str
    model_path: str
    task: str
    generation: int


class TrafficCaches:
    """Counts each (target, task)'s served requests and builds a cache every `every` of them.

    `note` runs on the event loop; the build runs on the recorder's thread (after it has
    written the runs it builds from), so the registry has one writer in this process.
    """

    def __init__(
        self,
        db_path: Path,
        install: LlamaInstall,
        host: Host,
        *,
        every: int,
        states: Mapping[tuple[str, str], TrafficState],
        schedule: Callable[[Callable[[], None]], None],
        on_built: OnBuilt,
        on_busy: Callable[[bool], None] = lambda busy: None,
        lost: Callable[[str, str], bool] = lambda target, task: False,
        wanted: Callable[[str, str], bool] = lambda target, task: True,
    ):
        self.db_path = db_path
        self.install = install
        self.host = host
        self.every = every
        self.waiting = {key: s.waiting for key, s in states.items()}
        self.generation = {key: s.generation for key, s in states.items()}
        self.built_from = {key: s.built_from for key, s in states.items()}
        self.schedule = schedule  # runs a job on the recorder's thread
        self.on_built = on_built
        self.on_busy = on_busy  # a build takes the cores (True) and gives them back (False)
        self.lost = lost  # (target, task): its newest cache lost on evidence
        self.wanted = wanted  # (target, task): a cache could join its candidates
        self.building: set[tuple[str, str]] = set()
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def note(self, target: str, model_id: str, model_path: str, task: str) -> None:
        """One more served request of (target, task) with its texts kept."""
        if not self.wanted(target, task):
            return  # a task pinned to one configuration: a cache could never serve it
        key = (target, task)
        due = self.due(target, task)
        with self._lock:
            self.waiting[key] = self.waiting.get(key, 0) + 1
            if self.waiting[key] < due or key in self.building:
                return
            self.building.add(key)
            generation = self.generation.get(key, 0) + 1
        job = _Job(target, model_id, model_path, task, generation)
        self.schedule(lambda: self._build(job))

    def due(self, target: str, task: str) -> int:
        """Requests of (target, task) that make the next cache: `every`, or as many as the
        newest was built from when it lost (see the module docstring)."""
        if self.lost(target, task):
            return max(self.every, self.built_from.get((target, task), 0))
        return self.every

    def _build(self, job: _Job) -> None:
        self.on_busy(True)  # the requests it overlaps ran under load: they count less
        try:
            self._build_one(job)
        finally:
            self.on_busy(False)

    def _build_one(self, job: _Job) -> None:
        from specreg.registry.db import opened
        from specreg.runner.lookup_cache import BuildRequest, build_cache

        key = (job.target, job.task)
        try:
            with opened(self.db_path) as con:
                runs = served_text_runs(con, job.model_id, job.task)
                request = BuildRequest(
                    name=cache_name(job.model_id, job.task, job.generation),
                    task=job.task,
                    model_path=Path(job.model_path),
                    run_ids=tuple(runs),
                    threads=BUILD_THREADS,
                )
                cache = build_cache(con, self.install, self.host, request)
        except (SpecregError, duckdb.Error, OSError) as err:
            why = f"traffic cache for {job.target}/{job.task} not built: {err}"
            log.warning("%s", why)
            with self._lock:
                self.failures.append(why)
                self.building.discard(key)
                self.waiting[key] = 0  # try again after `every` more requests
            return
        with self._lock:
            self.building.discard(key)
            self.generation[key] = job.generation
            fresh = len(runs) - self.built_from.get(key, 0)
            self.built_from[key] = len(runs)
            self.waiting[key] = max(self.waiting.get(key, 0) - fresh, 0)
        log.info("traffic cache %s: %d requests, %d n-grams", cache.name, len(runs),
                 cache.n_ngrams)  # fmt: skip
        self.on_built(job.target, job.task, cache)

    def to_json(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "generation": {f"{t}/{task}": g for (t, task), g in self.generation.items() if g},
            "waiting": {f"{t}/{task}": n for (t, task), n in self.waiting.items() if n},
            "failures": list(self.failures),
        }
