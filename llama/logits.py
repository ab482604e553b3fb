"""llama-perplexity's saved-logits files, read and compared in numpy.

`llama-perplexity -m M -f TEXT --kl-divergence-base FILE` writes (tools/perplexity/
perplexity.cpp, `perplexity()` with a logits file, pinned build 11434):

    b"_logits_"                    8 bytes
    n_ctx     uint32               the chunk length (-c)
    n_vocab   int32
    n_chunk   int32
    tokens    int32[n_chunk*n_ctx] the text's tokens, chunk after chunk
    rows      n_chunk * (n_ctx - 1 - n_ctx // 2) rows of nv uint16, nv = 2*((n_vocab+1)//2) + 4

Row r of a chunk holds the log-probabilities at position n_ctx // 2 + r of that chunk, which
predict the token after it. Its first four uint16 are two float32, `scale` and `min_log_prob`;
the value q at id i stands for log p_i = scale * q + min_log_prob, and every id more than 16
below the top logit is stored as q = 0. llama.cpp counts a log-probability of -16 or less as
probability 0, and so does this module.

`compare` is what `llama-perplexity --kl-divergence` computes (same top token, KL divergence
of the second model from the first, perplexity of both), from two saved files, restricted to
the token ids both vocabularies have. llama.cpp speculates with pairs whose vocabulary sizes
differ (Qwen2.5-Coder-32B has 152,064 ids, its 0.5B draft 151,936), but llama-perplexity
only logs "inconsistent vocabulary" for them and prints numbers that mean nothing. It also
gives what the tool cannot: the target's probability of the draft's top token at a
temperature (acceptance of sampled speculation), and how confident the draft is where it
agrees (what a draft `p_min` cuts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from specreg.drafttrace import DraftTrace
from specreg.errors import UsageError

MAGIC = b"_logits_"
HEADER_BYTES = 8 + 4 + 4 + 4
# llama.cpp's cut: log-probabilities at or below this are probability 0 in its KLD.
LOG_P_FLOOR = -16.0
# Draft confidence thresholds the agreement keeps: `--spec-draft-p-min` values worth modelling.
P_MIN_GRID: tuple[float, ...] = (0.0, 0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 0.95)
# Rows decoded at once: bounds memory at ~ROWS_PER_BLOCK * n_vocab * 8 bytes per file.
ROWS_PER_BLOCK = 32
# Locating an answer in a text's tokens: pieces of this many of its token ids are looked for
# within ANSWER_SLACK tokens of where the token counts put them (the joined text re-tokenizes
# a token or two differently at each seam; copies of the answer elsewhere, in the prompt it
# summarises or edits, lie further away).
ANSWER_PIECE = 8
ANSWER_SLACK = 24


def row_width(n_vocab: int) -> int:
    """uint16 values per saved row: two float32 (scale, min_log_prob), then the ids, even."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_per_chunk(n_ctx: int) -> int:
    """Positions llama-perplexity scores in each chunk: the second half, minus the last."""
    return n_ctx - 1 - n_ctx // 2


def logits_file_bytes(n_vocab: int, n_chunk: int, n_ctx: int) -> int:
    """Exact size of a saved-logits file: about n_vocab x scored tokens x 2 bytes."""
    rows = n_chunk * scored_per_chunk(n_ctx)
    return HEADER_BYTES + 4 * n_chunk * n_ctx + 2 * rows * row_width(n_vocab)


@dataclass(frozen=True)
class LogitsHeader:
    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray  # int32[n_chunk * n_ctx]

    @property
    def n_scored(self) -> int:
        return self.n_chunk * scored_per_chunk(self.n_ctx)

    @property
    def n_bytes(self) -> int:
        return logits_file_bytes(self.n_vocab, self.n_chunk, self.n_ctx)

    def rows(self) -> np.ndarray:
        """All saved rows as a read-only (n_scored, nv) uint16 memory map."""
        offset = HEADER_BYTES + 4 * self.n_chunk * self.n_ctx
        return np.memmap(
            self.path,
            dtype=np.uint16,
            mode="r",
            offset=offset,
            shape=(self.n_scored, row_width(self.n_vocab)),
        )

    def next_tokens(self) -> np.ndarray:
        """The token each scored row predicts, in row order."""
        first = self.n_ctx // 2
        chunks = self.tokens.reshape(self.n_chunk, self.n_ctx)
        return chunks[:, first + 1 :].reshape(-1)

    def next_positions(self) -> np.ndarray:
        """Where in `tokens` the token each scored row predicts is, in row order."""
        first = self.n_ctx // 2
        starts = np.arange(self.n_chunk)[:, None] * self.n_ctx
        return (starts + np.arange(first + 1, self.n_ctx)[None, :]).reshape(-1)


@dataclass(frozen=True)
class Answer:
    """A generated answer inside a text: its token ids, and where the token counts put its
    first token among the text's tokens (to within a few tokens)."""

    start: int
    ids: tuple[int, ...]


def answer_positions(tokens: np.ndarray, answers: Sequence[Answer], **search: int) -> np.ndarray:
    """True at each of `tokens` that belongs to an answer, found by the answer's own ids
    (`answer_index` says which, and takes the same `piece` and `slack`)."""
    return answer_index(tokens, answers, **search) >= 0


def answer_index(
    tokens: np.ndarray,
    answers: Sequence[Answer],
    *,
    piece: int = ANSWER_PIECE,
    slack: int = ANSWER_SLACK,
) -> np.ndarray:
    """At each of `tokens`, the number of the answer it belongs to, found by the answer's own
    ids; -1 where none.

    Each answer is cut into pieces of `piece` ids (the first id left out: it may merge with
    the prompt's last characters), and each piece is looked for within `slack` tokens of where
    it should be, that place moving with every piece found (a seam that re-tokenized
    differently shifts the rest). A piece not found is left out, so no prompt token is ever
    claimed."""
    index = np.full(len(tokens), -1, dtype=np.int64)
    if len(tokens) < piece:
        return index
    windows = sliding_window_view(tokens, piece)
    for n, a in enumerate(answers):
        ids = np.asarray(a.ids, dtype=tokens.dtype)
        offsets = list(range(1, len(ids) - piece + 1, piece))
        if len(ids) > piece and (not offsets or offsets[-1] + piece < len(ids)):
            offsets.append(len(ids) - piece)  # the tail
        shift = 0
        for off in offsets:
            expect = a.start + off + shift
            lo, hi = max(0, expect - slack), min(len(windows), expect + slack + 1)
            if lo >= hi:
                continue
            hits = lo + np.nonzero((windows[lo:hi] == ids[off : off + piece]).all(axis=1))[0]
            if len(hits):
                at = int(hits[np.argmin(np.abs(hits - expect))])
                index[at : at + piece] = n
                shift = at - a.start - off
    return index


def read_header(path: Path) -> LogitsHeader:
    """The header of a saved-logits file; `UsageError` naming the problem if it is not one."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES or head[:8] != MAGIC:
                raise UsageError(
                    f"{path} is not a llama-perplexity logits file (no _logits_ header): "
                    "write one with `llama-perplexity --kl-divergence-base FILE`"
                )
            n_ctx, n_vocab, n_chunk = np.frombuffer(head[8:], dtype="<i4", count=3).tolist()
            tokens = np.fromfile(fh, dtype="<i4", count=n_chunk * n_ctx)
        size = path.stat().st_size
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror or err}") from err
    if n_ctx < 4 or n_vocab < 1 or n_chunk < 1 or len(tokens) != n_chunk * n_ctx:
        raise UsageError(f"{path} has a damaged header (n_ctx {n_ctx}, n_chunk {n_chunk})")
    header = LogitsHeader(path, n_ctx, n_vocab, n_chunk, tokens)
    if size < header.n_bytes:
        raise UsageError(
            f"{path} is truncated ({size} of {header.n_bytes} bytes): delete it so it is "
            "written again"
        )
    return header


def decode_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """(n, n_vocab) float64 log-probabilities from saved uint16 rows."""
    params = np.ascontiguousarray(rows[:, :4]).view(np.float32).astype(np.float64)
    scale, min_log_prob = params[:, 0:1], params[:, 1:2]
    return rows[:, 4 : 4 + n_vocab].astype(np.float64) * scale + min_log_prob


def _probs(log_p: np.ndarray) -> np.ndarray:
    return np.where(log_p > LOG_P_FLOOR, np.exp(log_p), 0.0)


def _renormalised(log_p: np.ndarray) -> np.ndarray:
    """Log-probabilities renormalised over the columns given (the shared ids)."""
    top = log_p.max(axis=1, keepdims=True)
    return log_p - (top + np.log(np.exp(log_p - top).sum(axis=1, keepdims=True)))


def _temperature_probs(log_p: np.ndarray, temperature: float) -> np.ndarray:
    """The sampling distribution softmax(logits / T) from log-softmax rows (T > 0)."""
    scaled = np.where(log_p > LOG_P_FLOOR, log_p / temperature, -np.inf)
    scaled -= scaled.max(axis=1, keepdims=True)
    p = np.exp(scaled)
    return p / p.sum(axis=1, keepdims=True)


def mean_and_uncertainty(values: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error, as llama-perplexity prints them (0 below 11 values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = float(values.mean())
    var = float((values * values).mean()) - mean * mean
    return mean, math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0


@dataclass(frozen=True)
class Comparison:
    """Two models' saved logits over the same tokens: how far the second is from the first.

    `base` is the reference (the target, or the lossless configuration), `other` the model
    compared with it (a draft, or the lossy configuration). KL divergence is KL(base || other)
    over the shared ids, both renormalised there.
    """

    n_tokens: int  # scored positions
    n_vocab_base: int
    n_vocab_other: int
    same_top: float  # share of positions where both top tokens are the same id
    same_top_unc: float
    mean_kld: float
    mean_kld_unc: float
    kld_percentiles: dict[str, float]  # "median", "p90", "p95", "p99", "p999", "max"
    ppl_base: float
    ppl_other: float
    temperature: float
    accept: float  # mean target probability (at `temperature`) of the draft's top token
    # p_min -> (share of positions where the draft's top probability >= p_min,
    #           same-top share among those positions)
    confidence: dict[float, tuple[float, float]]
    traces: tuple[DraftTrace, ...] = ()  # with answers: one per answer, in order

    @property
    def n_shared(self) -> int:
        return min(self.n_vocab_base, self.n_vocab_other)


def _check_same_tokens(base: LogitsHeader, other: LogitsHeader) -> int:
    if base.n_ctx != other.n_ctx:
        raise UsageError(
            f"{base.path.name} and {other.path.name} were saved with different chunk lengths "
            f"({base.n_ctx} and {other.n_ctx}): save both with the same -c"
        )
    n_chunk = min(base.n_chunk, other.n_chunk)
    n = n_chunk * base.n_ctx
    diff = np.nonzero(base.tokens[:n] != other.tokens[:n])[0]
    if len(diff):
        raise UsageError(
            f"the two models tokenize the text differently (first at token {int(diff[0])}): "
            "their logits cannot be compared position by position"
        )
    return n_chunk


@dataclass(frozen=True)
class _Rows:
    """Per scored row: whether both top tokens agree, KL(base || other), the target's chance
    of accepting the draft's top token, the draft's top probability, and each model's
    negative log-likelihood of the text's next token."""

    same: np.ndarray
    kld: np.ndarray
    accept: np.ndarray
    conf: np.ndarray
    nll_base: np.ndarray
    nll_other: np.ndarray

    def kept(self, keep: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, f.name)[keep] for f in fields(self)))


def _row_figures(base: LogitsHeader, other: LogitsHeader, n_rows: int, temperature: float) -> _Rows:
    """Every scored row's figures, decoded `ROWS_PER_BLOCK` rows at a time."""
    shared = min(base.n_vocab, other.n_vocab)
    rows_b, rows_o = base.rows(), other.rows()
    next_tok = base.next_tokens()[:n_rows]
    out = _Rows(np.zeros(n_rows, dtype=bool), *(np.zeros(n_rows) for _ in range(5)))
    for start in range(0, n_rows, ROWS_PER_BLOCK):
        stop = min(n_rows, start + ROWS_PER_BLOCK)
        lb = decode_rows(rows_b[start:stop], base.n_vocab)
        lo = decode_rows(rows_o[start:stop], other.n_vocab)
        top_b, top_o = lb.argmax(axis=1), lo.argmax(axis=1)
        out.same[start:stop] = top_b == top_o
        out.conf[start:stop] = np.exp(lo.max(axis=1))
        # The target can only accept a draft token it has; a token past its vocabulary is
        # never accepted.
        in_base = top_o < base.n_vocab
        idx = np.minimum(top_o, base.n_vocab - 1)
        if temperature > 0:
            p_t = _temperature_probs(lb, temperature)
            out.accept[start:stop] = np.where(in_base, p_t[np.arange(stop - start), idx], 0.0)
        else:
            out.accept[start:stop] = out.same[start:stop]
        sb, so = _renormalised(lb[:, :shared]), _renormalised(lo[:, :shared])
        pb = _probs(sb)
        out.kld[start:stop] = (pb * np.where(pb > 0, sb - so, 0.0)).sum(axis=1)
        tok = next_tok[start:stop]
        rows = np.arange(stop - start)
        out.nll_base[start:stop] = -lb[rows, np.minimum(tok, base.n_vocab - 1)]
        out.nll_other[start:stop] = -lo[rows, np.minimum(tok, other.n_vocab - 1)]
    return out


def _selection(
    base: LogitsHeader,
    n_rows: int,
    answers: Sequence[Answer] | None,
    spans: Sequence[tuple[int, int]] | None,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(the rows to keep, or None for all; with answers, the answer each row predicts a token
    of, -1 for none)."""
    keep = owner = None
    if answers is not None:
        owner = answer_index(base.tokens, answers)[base.next_positions()[:n_rows]]
        keep = owner >= 0
    if spans is not None:
        inside = np.zeros(len(base.tokens), dtype=bool)
        for start, end in spans:
            inside[max(start, 0) : max(end, 0)] = True
        in_spans = inside[base.next_positions()[:n_rows]]
        keep = in_spans if keep is None else keep & in_spans
    return keep, owner


def compare(
    base_path: Path,
    other_path: Path,
    temperature: float = 0.0,
    answers: Sequence[Answer] | None = None,
    spans: Sequence[tuple[int, int]] | None = None,
) -> Comparison:
    """Compare two saved-logits files of the same text, over the ids both vocabularies have;
    with `answers`, only at the rows that predict an answer's token (what speculation drafts);
    with `spans` (token places, [start, end)), only at the rows that predict a token in one."""
    base, other = read_header(base_path), read_header(other_path)
    n_rows = _check_same_tokens(base, other) * scored_per_chunk(base.n_ctx)
    keep, owner = _selection(base, n_rows, answers, spans)
    rows = _row_figures(base, other, n_rows, temperature)
    traces: tuple[DraftTrace, ...] = ()
    if owner is not None and answers is not None:
        traces = tuple(
            DraftTrace(tuple(map(bool, rows.same[at])), tuple(map(float, rows.conf[at])), start=1)
            for at in (np.nonzero(owner == n)[0] for n in range(len(answers)))
        )
    if keep is not None:
        rows, n_rows = rows.kept(keep), int(keep.sum())
    p_same = float(rows.same.mean()) if n_rows else math.nan
    same_unc = math.sqrt(p_same * (1 - p_same) / (n_rows - 1)) if n_rows > 1 else math.nan
    kld_mean, kld_unc = mean_and_uncertainty(rows.kld)
    return Comparison(
        n_tokens=n_rows,
        n_vocab_base=base.n_vocab,
        n_vocab_other=other.n_vocab,
        same_top=p_same,
        same_top_unc=same_unc,
        mean_kld=kld_mean,
        mean_kld_unc=kld_unc,
        kld_percentiles=percentiles(rows.kld),
        ppl_base=float(np.exp(rows.nll_base.mean())) if n_rows else math.nan,
        ppl_other=float(np.exp(rows.nll_other.mean())) if n_rows else math.nan,
        temperature=temperature,
        accept=float(rows.accept.mean()) if n_rows else math.nan,
        confidence=confidence_curve(rows.conf, rows.same),
        traces=traces,
    )


def percentiles(values: np.ndarray) -> dict[str, float]:
    """The KLD percentiles llama-perplexity prints, by the names the registry stores."""
    if len(values) == 0:
        return {}
    ordered = np.sort(values)
    return {
        "median": float(np.median(ordered)),
        "p90": _percentile(ordered, 0.90),
        "p95": _percentile(ordered, 0.95),
        "p99": _percentile(ordered, 0.99),
        "p999": _percentile(ordered, 0.999),
        "max": float(ordered[-1]),
    }


def _percentile(ordered: np.ndarray, fraction: float) -> float:
    # llama-perplexity's own percentile(): linear between the two nearest ranks.
    x = fraction * (len(ordered) - 1)
    lo = int(x)
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (x - lo) * (ordered[hi] - ordered[lo]))


def confidence_curve(conf: np.ndarray, same: np.ndarray) -> dict[float, tuple[float, float]]:
    out = {}
    for p_min in P_MIN_GRID:
        kept = conf >= p_min
        share = float(kept.mean()) if len(conf) else math.nan
        agree = float(same[kept].mean()) if kept.any() else math.nan
        out[p_min] = (share, agree)
    return out
