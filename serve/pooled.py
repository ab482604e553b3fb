"""Pooled n-gram state: a backend whose drafts come from everything its server has read reads
all of its target's traffic, not only the requests the policy sent it.

llama.cpp's ngram-mod keeps one n-gram pool per llama-server process and adds every prompt it
processes to it (`common_speculative_begin`; see specreg.llamacpp.CROSS_REQUEST_STATE). A server
that serves a whole stream drafts from earlier prompts and answers; under the adaptive policy
the same configuration serves only the requests routed to it, so its pool, and the evidence the
policy gathers about it, would depend on the routing. A candidate that got few requests would
look worse than it is, and be retired for it.

So before a request goes to such a backend it catches up: the texts (prompt, then answer) of
the target's requests served elsewhere since it last read, newest last, are sent to it as one
or more `/completion` calls that generate a single token. That is prompt processing only; the
request's decode throughput, the policy's reward, is measured after it. The catch-up's seconds
are counted and shown in the status, and the request that waited for them records them. Any
request decoding meanwhile is counted as concurrent, as for any other work on the same cores.

The policy judges such a candidate's drafts (the idle rule) only on requests it served after it
had read WARM_TEXTS of its target's texts: a cold pool drafts nothing on first encounter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specreg.llamacpp import POOLED_STATE_TYPES
from specreg.stacks import parse_stack

log = logging.getLogger(__name__)

# The target's texts kept for catching up (the newest): a backend started late reads these.
BACKLOG_TEXTS = 32
# A backend that has read this many of its target's texts (served or fed) drafts as a
# long-lived server of the stream would; before that its requests are "cold".
WARM_TEXTS = 4
# Characters per catch-up call: well inside a 4096-token context at about 4 characters a token
# (a longer text is cut to its end, where the answer is).
CALL_CHARS = 8 * 1024
SEPARATOR = "\n\n"


def pooled(spec_type: str) -> bool:
    """Whether a configuration's drafts come from a pool of everything the server has read."""
    stack = parse_stack(spec_type)
    return any(stack.has(t) for t in POOLED_STATE_TYPES)


@dataclass
class _Text:
    seq: int
    served_by: str
    text: str


@dataclass
class _Reader:
    """What one backend's current process has read."""

    starts: int  # the process (Backend.starts) the marks below belong to
    seq: int = 0  # the newest text it has read or skipped
    texts: int = 0  # texts of its target it has read (served or fed)


@dataclass
class CatchUp:
    """One catch-up before a request: texts sent, and the seconds they took."""

    texts: int = 0
    seconds: float = 0.0
    failure: str | None = None


@dataclass
class PooledState:
    """The targets' recent texts and what each pooled backend has read of them."""

    backlog: int = BACKLOG_TEXTS
    warm: int = WARM_TEXTS
    texts: dict[str, deque[_Text]] = field(default_factory=dict)
    readers: dict[str, _Reader] = field(default_factory=dict)
    seq: int = 0
    fed_calls: int = 0
    fed_texts: int = 0
    fed_seconds: float = 0.0
    failures: int = 0
    # one catch-up at a time per backend: two requests arriving together read the texts once
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def _reader(self, backend: str, starts: int) -> _Reader:
        reader = self.readers.get(backend)
        if reader is None or reader.starts != starts:  # a new process has read nothing
            reader = self.readers[backend] = _Reader(starts)
        return reader

    def texts_read(self, backend: str, starts: int) -> int:
        return self._reader(backend, starts).texts

    def is_warm(self, backend: str, starts: int) -> bool:
        return self.texts_read(backend, starts) >= self.warm

    def served(self, target: str, backend: str, starts: int, text: str | None) -> None:
        """A request of `target` was served by `backend` (text: its prompt and answer)."""
        if not text:
            return
        self.seq += 1
        queue = self.texts.setdefault(target, deque(maxlen=self.backlog))
        queue.append(_Text(self.seq, backend, text[-CALL_CHARS:]))  # all a call reads of it
        reader = self._reader(backend, starts)
        reader.texts += 1

    def pending(self, target: str, backend: str, starts: int) -> list[_Text]:
        """The target's texts `backend`'s process has not read, oldest first."""
        reader = self._reader(backend, starts)
        return [
            t for t in self.texts.get(target, ()) if t.seq > reader.seq and t.served_by != backend
        ]

    def _read(self, backend: str, starts: int, texts: Iterable[_Text]) -> None:
        reader = self._reader(backend, starts)
        for t in texts:
            reader.seq = max(reader.seq, t.seq)
            reader.texts += 1

    async def catch_up(
        self,
        client: aiohttp.ClientSession,
        url: str,
        target: str,
        backend: str,
        starts: int,
    ) -> CatchUp:
        """Send `backend` the target's texts it has not read. Never raises: a backend that
        cannot read them serves the request anyway (the failure is counted and returned)."""
        async with self.locks.setdefault(backend, asyncio.Lock()):
            return await self._send(
                client, url, backend, starts, self.pending(target, backend, starts)
            )

    async def _send(
        self, client: aiohttp.ClientSession, url: str, backend: str, starts: int, todo: list[_Text]
    ) -> CatchUp:
        done = CatchUp()
        if not todo:
            return done
        t0 = time.perf_counter()
        for chunk in _chunks(todo, CALL_CHARS):
            prompt = SEPARATOR.join(t.text for t in chunk)
            body: dict[str, Any] = {
                "prompt": prompt,
                "n_predict": 1,
                "temperature": 0,
                "cache_prompt": False,
            }
            try:
                async with client.post(f"{url}/completion", json=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise aiohttp.ClientError(f"HTTP {resp.status}")
            except aiohttp.ClientError as err:
                done.failure = f"catch-up on {backend} failed: {type(err).__name__}: {err}"
                self.failures += 1
                log.warning("%s", done.failure)
                break
            self._read(backend, starts, chunk)
            self.fed_calls += 1
            done.texts += len(chunk)
        done.seconds = time.perf_counter() - t0
        self.fed_texts += done.texts
        self.fed_seconds += done.seconds
        # what it could not read is skipped, not retried on every request
        reader = self._reader(backend, starts)
        reader.seq = max(reader.seq, todo[-1].seq)
        return done

    def to_json(self) -> dict[str, Any]:
        return {
            "warm_texts": self.warm,
            "backlog_texts": self.backlog,
            "fed_calls": self.fed_calls,
            "fed_texts": self.fed_texts,
            "fed_seconds": round(self.fed_seconds, 3),
            "failures": self.failures,
            "texts_read": {name: r.texts for name, r in sorted(self.readers.items())},
        }


def _chunks(texts: list[_Text], limit: int) -> Iterable[list[_Text]]:
    """Consecutive texts, grouped so that each group stays within `limit` characters."""
    group: list[_Text] = []
    size = 0
    for t in texts:
        n = min(len(t.text), limit) + len(SEPARATOR)
        if group and size + n > limit:
            yield group
            group, size = [], 0
        group.append(t)
        size += n
    if group:
        yield group
