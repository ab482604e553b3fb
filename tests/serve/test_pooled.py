"""What a pooled-state backend has read of its target's traffic (specreg.serve.pooled); the
catch-up calls themselves are checked against a fake llama-server in
serve/test_adaptive_fake.py."""

from __future__ import annotations

from specreg.serve.pooled import CALL_CHARS, PooledState, _chunks, _Text, pooled


def test_which_configurations_pool_their_state() -> None:
    assert pooled("ngram-mod") and pooled("ngram-mod,draft-simple")
    assert not pooled("none") and not pooled("ngram-simple") and not pooled("draft-simple")
    assert not pooled("ngram-cache")  # per-slot state that ignores new requests


def test_pending_texts_are_what_others_served_since() -> None:
    s = PooledState(backlog=3, warm=2)
    s.served("t", "plain", 1, "a")
    s.served("t", "ngram", 1, "b")  # its own: read while serving
    s.served("other", "plain", 1, "x")  # another target's
    s.served("t", "plain", 1, "c")
    assert [t.text for t in s.pending("t", "ngram", 1)] == ["a", "c"]
    assert s.texts_read("ngram", 1) == 1 and not s.is_warm("ngram", 1)
    s._read("ngram", 1, s.pending("t", "ngram", 1))
    assert s.pending("t", "ngram", 1) == [] and s.is_warm("ngram", 1)
    # the backlog keeps the newest texts only
    for text in "defg":
        s.served("t", "plain", 1, text)
    assert [t.text for t in s.pending("t", "ngram", 1)] == ["e", "f", "g"]
    # a restarted process (Backend.starts moved on) has read nothing
    assert s.texts_read("ngram", 2) == 0
    assert [t.text for t in s.pending("t", "ngram", 2)] == ["e", "f", "g"]
    s.served("t", "plain", 1, None)  # no text (texts not kept): nothing to read
    assert len(s.pending("t", "ngram", 2)) == 3


def test_chunks_keep_order_and_stay_within_a_call() -> None:
    texts = [_Text(i, "p", "x" * n) for i, n in enumerate([10, CALL_CHARS, 30, 40, 3 * CALL_CHARS])]
    groups = list(_chunks(texts, CALL_CHARS))
    assert [t for g in groups for t in g] == texts
    for g in groups:
        assert len(g) == 1 or sum(min(len(t.text), CALL_CHARS) + 2 for t in g) <= CALL_CHARS
    assert [len(g) for g in groups] == [1, 1, 2, 1]
