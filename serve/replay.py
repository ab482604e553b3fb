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
from collections.abc import Callable, Sequence

import aiohttp

from specreg.recommender.lookup_replay import LookupSteps, ngram_mod_replay
from specreg.serve.adaptive import Lookup, Router
from specreg.serve.policy import Replay

log = logging.getLogger(__name__)

TOKENIZE_TIMEOUT_S = 30.0


class LookupReplays:
    """Replays served requests for the router's ngram-mod candidates, one task at a time in
    the background; `replayed` counts the requests replayed."""

    def __init__(self, router: Router):
        self.router = router
        self.replayed = 0
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def to_json(self) -> dict[str, int]:
        return {"replayed": self.replayed, "failures": self.failures}

    def wanted(self, target: str, task: str, served_by: str) -> list[Lookup]:
        return self.router.lookups_to_replay(target, task, served_by)

    def submit(
        self,
        client: aiohttp.ClientSession,
        url: str,
        target: str,
        task: str,
        texts: tuple[str, str],
        lookups: Sequence[Lookup],
        done: Callable[[dict[str, Replay]], None],
    ) -> None:
        """Replay one served request (its prompt and answer texts) in the background, on the
        backend at `url`'s tokenizer; `done` hears what each candidate would have drafted
        (nothing when it failed or was cancelled), always, so that the request's run is
        recorded with it."""
        job = asyncio.create_task(self._replay(client, url, target, task, texts, lookups, done))
        self._tasks.add(job)
        job.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the replays under way."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _replay(
        self,
        client: aiohttp.ClientSession,
        url: str,
        target: str,
        task: str,
        texts: tuple[str, str],
        lookups: Sequence[Lookup],
        done: Callable[[dict[str, Replay]], None],
    ) -> None:
        got: dict[str, Replay] = {}
        try:
            prompt, answer = [await _tokenize(client, url, text) for text in texts]
            loop = asyncio.get_running_loop()
            for lookup in lookups if answer else ():
                steps = await loop.run_in_executor(None, _steps, prompt, answer, lookup)
                got[lookup.key] = Replay(steps, generated=len(answer), requests=1)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as err:
            self.failures += 1
            log.warning("could not replay a request for ngram-mod: %s", err)
            got = {}
        finally:
            for key, replay in got.items():
                self.router.observe_replay(target, task, key, replay)
            self.replayed += bool(got)
            done(got)


def _steps(prompt: list[int], answer: list[int], lookup: Lookup) -> LookupSteps:
    return ngram_mod_replay(prompt, answer, n_max=lookup.n_max, n_min=lookup.n_min)


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
