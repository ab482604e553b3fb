# ruff: noqa: E501  (llama.cpp's log lines, verbatim)
"""Per-type statistics of a stack from llama-server's log (lines captured from the pinned build
serving SmolLM2-135M with --spec-type ngram-mod,draft-simple and its Q4_0 draft, -lv 4, two
requests): each request's own figures are the difference of its cumulative lines."""

from __future__ import annotations

from specreg.llama.spec_stats import (
    TypeFigures,
    cumulative,
    finished,
    request_figures,
    to_json,
    total,
)

LOG = "\n".join(
    [
        "0.01.328.713 I slot print_timing: id  0 | task 0 | draft acceptance = 0.61290 (   19 accepted /    31 generated), mean len =  2.73",
        "0.01.328.754 I spec common_specu: statistics        ngram-mod: #calls(b,g,a) =    1     11      0, #gen drafts =      0, #acc drafts =     0, #gen tokens =      0, #acc tokens =     0, dur(b,g,a) = 0.006, 0.032, 0.000 ms",
        "0.01.328.761 I spec common_specu: statistics     draft-simple: #calls(b,g,a) =    1     11     11, #gen drafts =     11, #acc drafts =     8, #gen tokens =     31, #acc tokens =    19, #mean acc len = 2.73, #acc rate/pos = (0.727, 0.636, 0.364), dur(b,g,a) = 0.051, 173.139, 0.017 ms",
        "0.01.942.807 I slot print_timing: id  0 | task 14 | draft acceptance = 0.63333 (   19 accepted /    30 generated), mean len =  2.90",
        "0.01.942.838 I spec common_specu: statistics        ngram-mod: #calls(b,g,a) =    2     21      0, #gen drafts =      0, #acc drafts =     0, #gen tokens =      0, #acc tokens =     0, dur(b,g,a) = 0.008, 0.053, 0.000 ms",
        "0.01.942.843 I spec common_specu: statistics     draft-simple: #calls(b,g,a) =    2     21     21, #gen drafts =     21, #acc drafts =    17, #gen tokens =     61, #acc tokens =    38, #mean acc len = 2.81, #acc rate/pos = (0.810, 0.619, 0.381), dur(b,g,a) = 0.081, 325.857, 0.021 ms",
    ]
)


def test_cumulative_lines_per_type() -> None:
    seen = cumulative(LOG)
    assert list(seen) == ["ngram-mod", "draft-simple"]
    assert seen["draft-simple"][1] == TypeFigures(2, 21, 21, 21, 17, 61, 38)
    assert finished(LOG) == 2
    assert finished("no statistics here") == 0


def test_each_request_is_the_difference_from_the_one_before() -> None:
    first, second = request_figures(LOG, 0), request_figures(LOG, 1)
    assert first["draft-simple"] == TypeFigures(1, 11, 11, 11, 8, 31, 19)
    assert second["draft-simple"] == TypeFigures(1, 10, 10, 10, 9, 30, 19)
    # the stack's totals in the server's timings are the sum over its types
    assert second["draft-simple"].drafted + second["ngram-mod"].drafted == 30
    assert second["ngram-mod"] == TypeFigures(begins=1, draft_calls=10)
    assert request_figures(LOG, 2) == {}


def test_sums_and_json() -> None:
    both = total([request_figures(LOG, 0), request_figures(LOG, 1)])
    assert both["draft-simple"].accepted == 38 and both["draft-simple"].drafted == 61
    doc = to_json(both)
    assert doc is not None
    assert doc["draft-simple"]["acceptance"] == round(38 / 61, 4)
    assert doc["ngram-mod"]["acceptance"] is None
    assert TypeFigures.from_json(doc["draft-simple"]) == both["draft-simple"]
    assert to_json({}) is None
