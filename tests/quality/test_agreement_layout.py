"""The chunked layout of `agree`'s text: each prompt and its answer alone in one chunk, the
answer where llama-perplexity scores (the chunk's second half), the whole prompt in view."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specreg.llama.logits import scored_per_chunk
from specreg.quality.agreement import CHUNK_MARGIN, FILLER, _Part, chunked_layout

parts_st = st.lists(
    st.tuples(st.integers(1, 600), st.integers(1, 300)), min_size=1, max_size=5
).map(lambda sizes: [_Part(f"p{i}", f"a{i}", lp, la, tuple(range(la))) for i, (lp, la) in
                     enumerate(sizes)])  # fmt: skip


@given(parts_st, st.sampled_from([16, 128, 512]))
def test_every_part_sits_alone_in_its_chunk_with_its_answer_scored(
    parts: list[_Part], min_ctx: int
) -> None:
    text, c, answers, spans = chunked_layout(parts, min_ctx)
    assert c >= min_ctx and c & (c - 1) == 0  # a power of two
    first_scored = c - scored_per_chunk(c)  # rows predict positions c // 2 + 1 .. c - 1
    for i, ((start, end), a, p) in enumerate(zip(spans, answers, parts, strict=True)):
        assert end - start == p.prompt_n + p.answer_n
        # the prompt starts inside chunk i and the part ends before its end, with room to
        # spare for seams that re-tokenize a few tokens apart
        assert i * c < start and end <= (i + 1) * c - CHUNK_MARGIN
        assert a.start == start + p.prompt_n and a.ids == p.answer_ids
        assert a.start - i * c >= first_scored + CHUNK_MARGIN // 2
    # the text: filler, then each part in order; the last chunk is whole
    assert text.count("\n\n") == len(parts)
    assert text.endswith(FILLER * (2 * CHUNK_MARGIN))
    assert spans[-1][1] + 2 * CHUNK_MARGIN >= len(parts) * c


def test_a_summary_gets_the_chunk_that_holds_its_text() -> None:
    # agree's summarize prompts: about 270 prompt tokens and 160 generated
    parts = [_Part("Summarize ...", "The ...", 270, 160, tuple(range(160)))] * 3
    text, c, _, spans = chunked_layout(parts, 128)
    assert c == 512
    assert [s // c for s, _ in spans] == [0, 1, 2]
    assert text.count(FILLER) >= 3 * (512 - 270 - 160 - 2 * CHUNK_MARGIN)
