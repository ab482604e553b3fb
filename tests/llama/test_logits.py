# ruff: noqa: E501  (llama-perplexity's output is quoted verbatim)
"""Saved-logits files (constructed byte for byte as llama-perplexity writes them) and their
comparison: exact same-top over shared ids when vocabulary sizes differ, KL divergence,
acceptance at a temperature, draft confidence; and the parsing of llama-perplexity's output."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specreg.drafttrace import DraftTrace
from specreg.errors import UsageError
from specreg.llama.logits import (
    P_MIN_GRID,
    Answer,
    answer_positions,
    compare,
    decode_rows,
    logits_file_bytes,
    read_header,
    scored_per_chunk,
)
from specreg.llama.perplexity import failure_of, parse_kld, parse_saved_ppl

N_CTX = 8  # scores positions 4, 5, 6 of each chunk


def log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max(axis=-1, keepdims=True)
    return logits - (top + np.log(np.exp(logits - top).sum(axis=-1, keepdims=True)))


def quantized_row(logits: np.ndarray) -> np.ndarray:
    """One saved row exactly as llama-perplexity's log_softmax(..., uint16_t*) writes it."""
    n_vocab = len(logits)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    logits = logits.astype(np.float32)
    mx, mn = float(logits.max()), float(logits.min())
    mn = max(mn, mx - 16)
    lse = float(np.log(np.exp((logits - mx).astype(np.float64)).sum()))
    scale = np.float32((mx - mn) / 65535.0)
    out = np.zeros(nv, dtype=np.uint16)
    out[:4] = np.array([scale, np.float32(mn - mx - lse)], dtype=np.float32).view(np.uint16)
    q = np.where(logits > mn, np.rint((logits - mn) / scale), 0)
    out[4 : 4 + n_vocab] = q.astype(np.uint16)
    return out


def write_logits(path: Path, logits: np.ndarray, tokens: np.ndarray, n_ctx: int = N_CTX) -> Path:
    """A file of `logits` (n_chunk * scored rows, n_vocab) over `tokens` (n_chunk * n_ctx)."""
    n_chunk = len(tokens) // n_ctx
    assert logits.shape[0] == n_chunk * scored_per_chunk(n_ctx)
    with path.open("wb") as fh:
        fh.write(b"_logits_")
        fh.write(np.array([n_ctx], dtype="<u4").tobytes())
        fh.write(np.array([logits.shape[1], n_chunk], dtype="<i4").tobytes())
        fh.write(tokens.astype("<i4").tobytes())
        for row in logits:
            fh.write(quantized_row(row).tobytes())
    return path


def random_logits(rng: np.random.Generator, rows: int, n_vocab: int) -> np.ndarray:
    return rng.normal(0, 3, size=(rows, n_vocab))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_file_layout_and_size(tmp_path: Path, rng: np.random.Generator) -> None:
    tokens = np.arange(2 * N_CTX) % 11
    logits = random_logits(rng, 2 * scored_per_chunk(N_CTX), 11)
    path = write_logits(tmp_path / "a.kld", logits, tokens)
    h = read_header(path)
    assert (h.n_ctx, h.n_vocab, h.n_chunk, h.n_scored) == (N_CTX, 11, 2, 6)
    assert path.stat().st_size == logits_file_bytes(11, 2, N_CTX) == h.n_bytes
    # Row r of chunk c predicts the token after position n_ctx // 2 + r.
    assert h.next_tokens().tolist() == [5, 6, 7, 2, 3, 4]
    decoded = decode_rows(np.asarray(h.rows()), 11)
    expected = log_softmax(logits)
    kept = expected > expected.max(axis=1, keepdims=True) - 15.9
    assert np.allclose(decoded[kept], expected[kept], atol=16 / 65535)


def test_the_same_file_agrees_completely(tmp_path: Path, rng: np.random.Generator) -> None:
    tokens = np.arange(4 * N_CTX) % 50
    logits = random_logits(rng, 4 * scored_per_chunk(N_CTX), 50)
    a = write_logits(tmp_path / "a.kld", logits, tokens)
    c = compare(a, a)
    assert c.same_top == 1.0 and c.accept == 1.0
    assert abs(c.mean_kld) < 1e-9
    assert c.n_tokens == 12 and c.n_shared == 50
    assert math.isclose(c.ppl_base, c.ppl_other)


def test_differing_vocab_sizes_compare_over_the_shared_ids(tmp_path: Path) -> None:
    """Target 12 ids, draft 10: a target top token past the draft's vocabulary is never
    agreed with, and KL divergence is taken over ids 0..9, both renormalised there."""
    n_rows = scored_per_chunk(N_CTX)  # one chunk: 3 rows
    base = np.full((n_rows, 12), -4.0)
    other = np.full((n_rows, 10), -4.0)
    base[0, 3], other[0, 3] = 5.0, 4.0  # both pick 3: agree
    base[1, 11], base[1, 2], other[1, 2] = 6.0, 5.0, 6.0  # target's top is id 11: no
    base[2, 7], other[2, 1] = 5.0, 5.0  # different tops: no
    tokens = np.arange(N_CTX)
    a = write_logits(tmp_path / "t.kld", base, tokens)
    b = write_logits(tmp_path / "d.kld", other, tokens)
    c = compare(a, b)
    assert (c.n_vocab_base, c.n_vocab_other, c.n_shared) == (12, 10, 10)
    assert c.same_top == pytest.approx(1 / 3)
    assert c.accept == pytest.approx(1 / 3)  # greedy: acceptance is same-top
    p = np.exp(log_softmax(base[:, :10]))
    q = log_softmax(other)
    expected = float(np.mean((p * (np.log(p) - q)).sum(axis=1)))
    assert c.mean_kld == pytest.approx(expected, rel=2e-3)


def test_temperature_acceptance_is_the_targets_probability_of_the_drafts_top(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    rows = 2 * scored_per_chunk(N_CTX)
    base = random_logits(rng, rows, 30)
    other = base[:, :28] + rng.normal(0, 1.5, size=(rows, 28))  # a draft with 28 ids
    tokens = np.arange(2 * N_CTX)
    a = write_logits(tmp_path / "t.kld", base, tokens)
    b = write_logits(tmp_path / "d.kld", other, tokens)
    for temperature in (0.5, 1.0):
        c = compare(a, b, temperature)
        p_t = np.exp(log_softmax(base / temperature))
        expected = float(np.mean(p_t[np.arange(rows), other.argmax(axis=1)]))
        assert c.accept == pytest.approx(expected, abs=2e-3)
        assert c.temperature == temperature
    greedy = compare(a, b)
    assert greedy.same_top == pytest.approx(np.mean(base.argmax(1) == other.argmax(1)))


def test_confidence_curve_counts_what_p_min_keeps(tmp_path: Path) -> None:
    n_rows = scored_per_chunk(N_CTX)
    base = np.zeros((n_rows, 6))
    other = np.zeros((n_rows, 6))
    base[:, 0] = 10.0
    other[0, 0] = 10.0  # sure and right
    other[1, 1] = 10.0  # sure and wrong
    other[2, 0] = 0.5  # unsure (p ~ 0.25) and right
    tokens = np.arange(N_CTX)
    c = compare(
        write_logits(tmp_path / "t.kld", base, tokens),
        write_logits(tmp_path / "d.kld", other, tokens),
    )
    assert set(c.confidence) == set(P_MIN_GRID)
    assert c.confidence[0.0] == pytest.approx((1.0, 2 / 3))
    assert c.confidence[0.9] == pytest.approx((2 / 3, 0.5))


def test_files_that_cannot_be_compared_say_why(tmp_path: Path, rng: np.random.Generator) -> None:
    logits = random_logits(rng, scored_per_chunk(N_CTX), 9)
    a = write_logits(tmp_path / "a.kld", logits, np.arange(N_CTX))
    b = write_logits(tmp_path / "b.kld", logits, np.arange(N_CTX)[::-1].copy())
    with pytest.raises(UsageError, match=r"tokenize the text differently \(first at token 0\)"):
        compare(a, b)
    c16 = write_logits(
        tmp_path / "c.kld", random_logits(rng, scored_per_chunk(16), 9), np.arange(16), 16
    )
    with pytest.raises(UsageError, match="different chunk lengths"):
        compare(a, c16)
    cut = tmp_path / "cut.kld"
    cut.write_bytes(a.read_bytes()[:-10])
    with pytest.raises(UsageError, match="is truncated"):
        read_header(cut)
    junk = tmp_path / "junk.kld"
    junk.write_bytes(b"GGUF" + bytes(40))
    with pytest.raises(UsageError, match="not a llama-perplexity logits file"):
        read_header(junk)


# --- llama-perplexity's output (pinned build 11434) ----------------------------------------

KLD_OUTPUT = """
chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      29.6719 ±   10.4824       0.25906 ±    0.07774       0.25318 ±    0.01754    10.753 ±  1.513 %    71.429 ±  5.737 %
   2      37.2455 ±    9.9644       0.20355 ±    0.05883       0.24928 ±    0.01282     9.383 ±  0.987 %    69.048 ±  4.135 %

====== Perplexity statistics ======
Mean PPL(Q)                   :  40.258439 ±   7.733070
Mean PPL(base)                :  33.359190 ±   6.505548
Cor(ln(PPL(Q)), ln(PPL(base))):  97.55%
Mean ln(PPL(Q)/PPL(base))     :   0.187986 ±   0.042914
Mean PPL(Q)/PPL(base)         :   1.206817 ±   0.051789
Mean PPL(Q)-PPL(base)         :   6.899249 ±   1.992119

====== KL divergence statistics ======
Mean    KLD:   0.246182 ±   0.009055
Maximum KLD:   0.772884
99.9%   KLD:   0.763820
99.0%   KLD:   0.629628
95.0%   KLD:   0.535778
90.0%   KLD:   0.438980
Median  KLD:   0.228397
10.0%   KLD:   0.085358

====== Token probability statistics ======
Mean    Δp: -3.138 ± 0.552 %
RMS Δp    :  9.297 ± 0.707 %
Same top p: 67.460 ± 2.957 %
"""


def test_parse_kld_reads_the_summary_block() -> None:
    s = parse_kld(KLD_OUTPUT)
    assert s is not None and s.complete
    assert (s.mean_kld, s.mean_kld_unc) == (0.246182, 0.009055)
    assert s.same_top == pytest.approx(0.67460) and s.same_top_unc == pytest.approx(0.02957)
    assert (s.ppl, s.ppl_base) == (40.258439, 33.359190)
    assert s.ln_ppl_ratio == 0.187986 and s.rms_dp == pytest.approx(0.09297)
    assert s.percentiles == {
        "max": 0.772884, "p999": 0.763820, "p99": 0.629628, "p95": 0.535778,
        "p90": 0.438980, "median": 0.228397,
    }  # fmt: skip
    assert s.kld_p99 == 0.629628


def test_parse_kld_falls_back_to_the_last_chunk_row_under_100_tokens() -> None:
    few = KLD_OUTPUT.split("\n\n====== Perplexity")[0]
    s = parse_kld(few)
    assert s is not None and not s.complete
    assert (s.mean_kld, s.same_top, s.ppl) == (0.24928, pytest.approx(0.69048), 37.2455)
    assert s.percentiles == {} and s.ppl_base is None
    assert parse_kld("nothing here") is None


def test_failures_carry_llama_cpps_own_line(tmp_path: Path) -> None:
    log = tmp_path / "ppl.log"
    short = (
        "0.00.233.435 E perplexity: you need at least 256 tokens to evaluate perplexity with a "
        "context of 128\n0.00.233.450 E perplexity: the data file you provided tokenizes to only "
        "87 tokens\n"
    )
    err = failure_of(short, 0, log, Path("mine.txt"))
    assert err.kind == "text"
    assert str(err) == (
        "mine.txt has only 87 tokens: llama-perplexity needs at least 256 (2 x the chunk "
        "length): perplexity: you need at least 256 tokens to evaluate perplexity with a "
        "context of 128; use a longer text, or a smaller --ctx"
    )
    vocab = failure_of("E kl_divergence: inconsistent vocabulary (49152 vs 49216)\n", 0, log)
    assert vocab.kind == "vocab" and "inconsistent vocabulary (49152 vs 49216)" in str(vocab)
    crash = failure_of("llama_model_load: error loading model: bad magic\n", 1, log)
    assert crash.kind == "load" and "exited with code 1" in str(crash)
    assert parse_saved_ppl("I Final estimate: PPL = 33.3589 +/- 6.50549") == (33.3589, 6.50549)


def test_answers_are_found_by_their_ids_not_by_their_copies_in_the_prompt() -> None:
    rng = np.random.default_rng(3)
    answer = rng.integers(100, 200, size=40)
    # a prompt that quotes the answer's middle (a summary copies from its text), then the
    # answer itself, then a second prompt and answer; the counts put each answer 2 tokens off
    prompt = np.concatenate([rng.integers(0, 100, 30), answer[8:32], rng.integers(0, 100, 20)])
    other = rng.integers(200, 300, size=20)
    tokens = np.concatenate([prompt, answer, [7], rng.integers(0, 100, 10), other])
    start_1, start_2 = len(prompt), len(prompt) + 40 + 1 + 10
    mask = answer_positions(
        tokens, [Answer(start_1 + 2, tuple(answer)), Answer(start_2 - 2, tuple(other))]
    )
    assert not mask[: len(prompt)].any()  # the quoted copy is not an answer
    # every answer token but the first (it may merge with the prompt's end) is found
    assert mask[start_1 + 1 : start_1 + 40].all() and not mask[start_1]
    assert mask[start_2 + 1 : start_2 + 20].all()
    assert mask.sum() == 39 + 19


def test_a_seam_that_tokenized_differently_shifts_the_rest_of_the_answer() -> None:
    rng = np.random.default_rng(4)
    answer = rng.integers(100, 200, size=48)
    # in the joined text, two of the answer's tokens came out as three (a different merge)
    joined = np.concatenate([answer[:20], [5, 6, 7], answer[22:]])
    tokens = np.concatenate([rng.integers(0, 100, 16), joined, rng.integers(0, 100, 16)])
    mask = answer_positions(tokens, [Answer(16, tuple(answer))])
    where = np.nonzero(mask)[0]
    assert not mask[:16].any() and not mask[16 + len(joined) :].any()
    assert not mask[16 + 20 : 16 + 23].any()  # the re-tokenized seam is left out
    assert len(where) >= 48 - 2 - 16  # at most the pieces touching the seam are lost
    assert mask[-16 - 8 : -16].all()  # the tail, found past the shift


def test_compare_over_answers_scores_only_their_rows(tmp_path: Path) -> None:
    # 4 chunks of 8: rows predict positions 5, 6, 7 of each chunk. The draft agrees with the
    # target on the rows predicting answer tokens (positions 16..31) and nowhere else.
    n_vocab = 20
    tokens = np.arange(4 * N_CTX) % n_vocab
    header_rows = 4 * scored_per_chunk(N_CTX)
    target = np.zeros((header_rows, n_vocab))
    target[:, 1] = 5.0
    draft = np.zeros((header_rows, n_vocab))
    positions = (np.arange(4)[:, None] * N_CTX + np.arange(5, 8)[None, :]).reshape(-1)
    in_answer = (positions >= 16) & (positions < 32)
    draft[in_answer, 1] = 5.0
    draft[~in_answer, 2] = 5.0
    a = write_logits(tmp_path / "t.kld", target, tokens)
    b = write_logits(tmp_path / "d.kld", draft, tokens)
    assert read_header(a).next_positions().tolist() == positions.tolist()
    whole = compare(a, b)
    answers = [Answer(16, tuple(int(t) for t in tokens[15:32]))]
    only = compare(a, b, answers=answers)
    assert whole.n_tokens == 12 and whole.same_top == 0.5
    assert only.n_tokens == 6 and only.same_top == 1.0
    # spans mark positions directly: [16, 24) holds rows 5, 6, 7 of chunk 2
    spanned = compare(a, b, spans=[(16, 24)])
    assert spanned.n_tokens == 3 and spanned.same_top == 1.0
    both = compare(a, b, answers=answers, spans=[(0, 24)])
    assert both.n_tokens == 3


def test_compare_keeps_the_drafts_guess_at_each_answer_token_in_order(tmp_path: Path) -> None:
    # Two answers, at positions 16..23 and 24..31: their scored rows predict 21, 22, 23 and
    # 29, 30, 31. The draft misses position 22, and is sure of itself only at even positions.
    n_vocab = 20
    tokens = np.arange(4 * N_CTX) % n_vocab
    rows = 4 * scored_per_chunk(N_CTX)
    positions = (np.arange(4)[:, None] * N_CTX + np.arange(5, 8)[None, :]).reshape(-1)
    target = np.zeros((rows, n_vocab))
    target[:, 1] = 5.0
    draft = np.zeros((rows, n_vocab))
    for r, pos in enumerate(positions):
        draft[r, 2 if pos == 22 else 1] = 9.0 if pos % 2 == 0 else 1.0
    a = write_logits(tmp_path / "t.kld", target, tokens)
    b = write_logits(tmp_path / "d.kld", draft, tokens)
    answers = [
        Answer(16, tuple(int(t) for t in tokens[15:24])),
        Answer(24, tuple(int(t) for t in tokens[23:32])),
    ]
    c = compare(a, b, answers=answers)
    assert [t.same for t in c.traces] == [(True, False, True), (True, True, True)]
    sure = [[p > 0.5 for p in t.top_p] for t in c.traces]
    assert sure == [[False, True, False], [False, True, False]]
    assert c.same_top == pytest.approx(5 / 6)
    # the traces survive the registry's JSON
    assert [DraftTrace.from_json(t.to_json()) for t in c.traces] == [
        DraftTrace(t.same, tuple(round(p, 3) for p in t.top_p), start=1) for t in c.traces
    ]
    assert compare(a, b).traces == ()  # no answers, no traces
