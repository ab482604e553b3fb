"""ngram-mod replayed on a text: the build's drafting rules, checked on token sequences whose
drafts can be worked out by hand."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specreg.drafttrace import DraftTrace
from specreg.recommender.lookup_replay import LookupSteps, ngram_mod_replay, stack_replay


def test_an_answer_that_repeats_nothing_never_drafts() -> None:
    got = ngram_mod_replay(list(range(40)), list(range(100, 164)), n_max=8, n_min=2)
    assert got == LookupSteps(steps=63, drafting=0, drafted=0, accepted=0)
    assert got.draft_rate == 0.0 and got.tokens_per_drafting_step == 1.0


def test_an_answer_that_copies_its_prompt_drafts_it_back() -> None:
    # The answer copies 30 tokens of the prompt: once the last 4 tokens match the prompt's,
    # every draft is the prompt's continuation, n_max long, and all of it is accepted.
    prompt = list(range(100, 140))
    answer = prompt[5:35]
    got = ngram_mod_replay(prompt, answer, n_max=8, n_min=2, n_match=4)
    # tokens 1..3 are generated plainly (the match needs 4), then drafts of 8, 8 and 7 (the
    # server drafts no further than the answer's last token but one)
    assert got.accepted == got.drafted
    assert got.steps == 3 + got.drafting
    assert got.accepted + got.steps == len(answer) - 1
    assert got.drafting == 3 and got.drafted == 8 + 8 + 7


def test_a_draft_shorter_than_n_min_is_dropped_and_a_wrong_one_costs_its_step() -> None:
    # "a b c X" in the prompt, then the answer goes "a b c Y": the draft says X, is refused.
    a, b, c, x, y = 1, 2, 3, 4, 5
    prompt = [9, a, b, c, x, 8]
    answer = [7, a, b, c, y, 6, 6]
    one = ngram_mod_replay(prompt, answer, n_max=4, n_min=1, n_match=3)
    assert (one.drafting, one.drafted, one.accepted) == (1, 2, 0)  # "X 8", refused at X
    none = ngram_mod_replay(prompt, answer, n_max=4, n_min=3, n_match=3)
    assert (none.drafting, none.drafted) == (0, 0)  # "X 8" is shorter than n_min


def test_a_stack_drafts_with_the_model_only_where_the_lookup_has_nothing() -> None:
    # The answer copies 20 tokens of its prompt, then goes on with 20 new ones the draft model
    # guesses right except every fifth.
    prompt = list(range(100, 140))
    answer = prompt[5:25] + list(range(500, 520))
    guesses = DraftTrace(tuple(i < 20 or (i - 20) % 5 != 4 for i in range(40)), (1.0,) * 40)
    got = stack_replay(prompt, answer, guesses, n_max=4, n_min=1, k=4, n_match=4)
    alone = stack_replay(prompt, answer, None, n_max=4, n_min=1, k=4, n_match=4)
    assert got.lookup.drafting > 0 and alone.lookup.drafting > 0  # the lookup goes first
    assert got.model.drafting > 0 and alone.model.drafting == 0
    # the copied part: the lookup drafts it all, and the model is asked for none of it
    assert got.lookup.accepted == got.lookup.drafted == 12
    assert got.model.drafted == 4 * got.model.drafting
    assert got.tokens_per_step > alone.tokens_per_step > 1.0
    total = got.lookup.accepted + got.model.accepted + got.lookup.steps
    assert total == len(answer) - 1
    assert got.lookup_share == got.lookup.drafting / got.lookup.steps


tokens = st.lists(st.integers(0, 5), min_size=0, max_size=80)


@settings(max_examples=200, deadline=None)
@given(prompt=tokens, answer=tokens, n_max=st.integers(1, 16), n_match=st.integers(1, 6))
def test_every_answer_token_is_accounted_for(
    prompt: list[int], answer: list[int], n_max: int, n_match: int
) -> None:
    # Each step yields its accepted tokens and the target's own; drafts stay within n_max.
    got = ngram_mod_replay(prompt, answer, n_max=n_max, n_min=1, n_match=n_match)
    assert got.steps + got.accepted == max(len(answer) - 1, 0)
    assert got.accepted <= got.drafted <= n_max * got.drafting
    assert got.drafting <= got.steps
