"""The draft's greedy guess at every token of the target's answers, on llama-server.

Greedy draft-simple proposes, at each place of the target's own text, the draft's top token
given everything before it. So the draft reads the prompt and the target's answer up to token
j (teacher forcing), and its top token is its guess at token j. The prompt cache keeps each
guess to one decoded token, and the context is the prompt alone, as in a run: no filler and no
chunk halves (llama-perplexity's layout, whose filler the answers have to follow). The guesses
(and the draft's probability of each, for `p_min`) are the traces that
`recommender.acceptance.replay` drafts on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specreg.drafttrace import DraftTrace
from specreg.llama.config import Config, server_for
from specreg.llama.logits import Answer, confidence_curve
from specreg.llama.server import LlamaServer
from specreg.quality.kld import Measuring

# The draft's context: a task prompt and its answer, with room to spare.
DRAFT_CTX = 4096


def guess(server: LlamaServer, prompt: str, answer: Sequence[int]) -> DraftTrace:
    """The draft's top token and its probability after `prompt` and each prefix of `answer`,
    compared with the answer's next token."""
    same, top_p = [], []
    for j, expected in enumerate(answer):
        got = server.complete({
            "prompt": [prompt, *answer[:j]], "n_predict": 1, "temperature": 0.0,
            "cache_prompt": True, "n_probs": 1, "return_tokens": True,
        })  # fmt: skip
        token = got.tokens[0] if got.tokens else -1
        p = got.probs[0].prob(token) if got.probs else None
        same.append(token == expected)
        top_p.append(1.0 if p is None else p)
    return DraftTrace(tuple(same), tuple(top_p))


def tokens(server: LlamaServer, prompt: str) -> tuple[int, ...]:
    """`prompt` as /completion reads it (special tokens added and parsed)."""
    got = server.request("POST", "/tokenize", {"content": prompt, "add_special": True})
    return tuple(int(t) for t in got["tokens"])


def draft_traces(
    m: Measuring, draft: Path, prompts: Sequence[str], answers: Sequence[Answer], log_path: Path
) -> tuple[tuple[DraftTrace, ...], tuple[tuple[int, ...], ...]]:
    """One trace per answer, and each prompt's token ids (the draft's tokenizer is the
    target's: llama.cpp speculates with no other), from one llama-server of `draft`.
    Raises `ServerFailed`."""
    config = Config(threads=m.threads, ctx=DRAFT_CTX)
    with server_for(config, draft, None, m.install, m.host, log_path=log_path) as server:
        pairs = list(zip(prompts, answers, strict=True))
        traces = tuple(guess(server, prompt, a.ids) for prompt, a in pairs)
        return traces, tuple(tokens(server, prompt) for prompt, _ in pairs)


def summary(
    traces: Sequence[DraftTrace],
) -> tuple[int, float, float, dict[float, tuple[float, float]]]:
    """(guesses, same-top share, its standard error, the confidence curve) over the guesses
    at the tokens the build drafts (an answer's first token is the prompt pass's)."""
    same = np.array([x for t in traces for x in t.same[t.drafted]], dtype=bool)
    conf = np.array([p for t in traces for p in t.top_p[t.drafted]], dtype=float)
    n = len(same)
    if not n:
        return 0, math.nan, math.nan, {}
    share = float(same.mean())
    unc = math.sqrt(share * (1 - share) / (n - 1)) if n > 1 else math.nan
    return n, share, unc, confidence_curve(conf, same)
