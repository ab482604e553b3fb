"""n-gram lookups judged on the requests other candidates served, at no request's cost.

ngram-mod drafts only where the last 24 tokens occurred before in the context, so what it
drafts on a request follows from the request's text and the answer alone, not from the
configuration that produced the answer (speculation is lossless: every candidate of a target
answers from the target's own distribution). After a request that another candidate served, its
prompt and answer go through the serving backend's tokenizer (llama-server's /tokenize) and
llama.cpp's drafting rules (specreg.recommender.lookup_replay, first encounter: a fresh pool) for
each ngram-mod candidate of the task. The policy takes the sum as the candidate's prior
(serve.policy.TaskPolicy.observe_replay): plain decoding's speed times the speed-up the cost
model gives those drafts.

Why: a task mixes requests whose text repeats and requests whose text does not. On SmolLM2,
`summarize` holds copy-editing requests, on which ngram-mod drafts whole spans, and summaries in
two sentences, on which it drafts nothing; the prediction puts it at 0.4x plain decoding, one
try that lands on a summary confirms that, and the lookup never serves the requests it would
have sped up (docs/measurements/serving-under-load.md). Replaying costs the tokenizer's time
and a loop over the tokens, off the request's path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from specreg.recommender.lookup_replay import LookupSteps, ngram_mod_replay
from specreg.serve.adaptive import Lookups, Router
from specreg.serve.policy import Replay

log = logging.getLogger(__name__)

TOKENIZE_TIMEOUT_S = 5.0  # tokenizing is milliseconds; a stopping server waits for this at most


class LookupReplays:
    """Replays served requests for the router's ngram-mod candidates in the background;
    `replayed` counts the requests replayed, `failures` those that could not be."""

    def __init__(self, router: Router):
        self.router = router
        self.replayed = 0
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def to_json(self) -> dict[str, int]:
        return {"replayed": self.replayed, "failures": self.failures}

    def wanted(self, target: str, task: str, served_by: str) -> Lookups:
        return self.router.lookups_to_replay(target, task, served_by)

    def submit(self, replay: Coroutine[Any, Any, None]) -> None:
        """Run `replay` (one of `self.replay(...)`) in the background, off the request's
        path; `drain` waits for those under way."""
        job = asyncio.create_task(replay)
        self._tasks.add(job)
        job.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the replays under way."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def replay(
        self,
        client: aiohttp.ClientSession,
        url: str,
        target: str,
        task: str,
        texts: tuple[str, str],
        lookups: Lookups,
        done: Callable[[dict[str, Replay]], None],
    ) -> None:
        """Replay one served request (its prompt and answer texts) on the backend at `url`'s
        tokenizer for each of `lookups`; `done` hears what each would have drafted (nothing
        when it failed or was cancelled), always, so that the request's run is recorded."""
        got: dict[str, Replay] = {}
        try:
            prompt, answer = [await _tokenize(client, url, text) for text in texts]
            loop = asyncio.get_running_loop()
            for key, (n_max, n_min) in lookups.items() if answer else ():
                steps = await loop.run_in_executor(None, _steps, prompt, answer, n_max, n_min)
                got[key] = Replay(steps, generated=len(answer), requests=1)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as err:
            self.failures += 1
            log.warning("could not replay a request for ngram-mod: %s", err)
            got = {}
        finally:
            for key, replay in got.items():
                self.router.observe_replay(target, task, key, replay)
            self.replayed += bool(got)
            done(got)


def _steps(prompt: list[int], answer: list[int], n_max: int, n_min: int) -> LookupSteps:
    return ngram_mod_replay(prompt, answer, n_max=n_max, n_min=n_min)


async def _tokenize(client: aiohttp.ClientSession, url: str, text: str) -> list[int]:
    """llama-server's token ids of `text` (no special tokens added)."""
    body = {"content": text, "add_special": False}
    timeout = aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_S)
    async with client.post(url + "/tokenize", json=body, timeout=timeout) as resp:
        resp.raise_for_status()
        doc = await resp.json(content_type=None)
    tokens = doc["tokens"]
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise ValueError("/tokenize answered no token ids")
    return tokens
