"""The measurement protocol with an engine that remembers what it was asked, as ngram-mod does:
which samples get fresh state, what the warm-up sends, how warm runs are taken, and which
figures are flagged. Real llama.cpp checks the same in llama/test_cross_request_state.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from specreg.errors import UsageError
from specreg.host.machine import Host
from specreg.llama.server import Completion
from specreg.llamacpp import CROSS_REQUEST_STATE, REQUEST_STATE, keeps_state
from specreg.runner.protocol import (
    ISOLATION_FRESH,
    ISOLATION_PROCESS,
    ISOLATION_SEQUENCE,
    ISOLATION_SHARED,
    REGIME_FIRST,
    REGIME_WARM,
    WARMUP_TEXTS,
    WARMUP_TOKENS,
    Engine,
    Sampler,
    collect,
    plan_protocol,
    replay_flags,
    warmup_text,
)
from specreg.runner.settings import Settings
from specreg.runner.workload import Prompt, Workload
from specreg.terms import SPEC_TYPES

HOST = Host("h", "cpu", 2, 2, 2**34, 1, None, "Linux")
N = 16


def completion(accepted: int, *, foreign: float | None = 0.0, tps: float = 100.0) -> Completion:
    return Completion(
        tokens=(1, 2, 3), content="x", predicted_n=N, predicted_ms=N / tps * 1000,
        prompt_n=4, prompt_ms=1.0, draft_n=accepted, draft_n_accepted=accepted,
        stop_type="limit", spec_types="none,ngram-mod", wall_s=0.2, foreign_cpu_s=foreign,
    )  # fmt: skip


@dataclass
class Memory(Sampler):
    """A server whose method drafts a prompt's whole answer once it has seen it."""

    session: int
    log: list[tuple[int, str, int]]
    seen: set[str] = field(default_factory=set)
    foreign: list[float] = field(default_factory=list)

    def generate(self, text: str, n_predict: int) -> Completion:
        self.log.append((self.session, text, n_predict))
        foreign = self.foreign.pop(0) if self.foreign else 0.0
        got = completion(N if text in self.seen else 0, foreign=foreign)
        self.seen.add(text)
        return got


class MemoryEngine(Engine):
    def __init__(self, foreign: list[float] | None = None, process_per_sample: bool = False):
        self.log: list[tuple[int, str, int]] = []
        self.starts = 0
        self.foreign = list(foreign or [])
        self.process_per_sample = process_per_sample

    @contextmanager
    def session(self) -> Iterator[Memory]:
        self.starts += 1
        yield Memory(self.starts, self.log, foreign=self.foreign)


def workload(n: int = 3) -> Workload:
    return Workload("t", tuple(Prompt(f"p{i}", "code", f"prompt {i}") for i in range(n)))


def run(spec_type: str, engine: MemoryEngine, *, repeats: int = 3, retries: int = 0, **kw):  # type: ignore[no-untyped-def]
    wl = kw.pop("wl", None) or workload()
    settings = Settings(repeats=repeats, retries=retries, warm_first=kw.pop("warm_first", None))
    protocol = plan_protocol(
        spec_type, wl, settings, process_per_sample=engine.process_per_sample, **kw
    )
    return protocol, collect(engine, wl, protocol, HOST, n_predict=N)


def test_every_type_of_the_build_is_described_once() -> None:
    assert set(CROSS_REQUEST_STATE) | set(REQUEST_STATE) == set(SPEC_TYPES)
    assert not set(CROSS_REQUEST_STATE) & set(REQUEST_STATE)
    assert {t for t in SPEC_TYPES if keeps_state(t)} == {"ngram-mod", "ngram-cache"}
    # a stack is stateful when one of its types is; a type the build does not describe is too
    assert keeps_state("ngram-simple,ngram-mod") and keeps_state("draft-future")
    assert not keeps_state("none") and not keeps_state("ngram-simple,draft-simple")


def test_stateful_method_gets_a_fresh_server_for_every_sample() -> None:
    engine = MemoryEngine()
    protocol, got = run("ngram-mod", engine)
    assert (protocol.regime, protocol.isolation, protocol.keeps_state) == (
        REGIME_FIRST, ISOLATION_FRESH, True,
    )  # fmt: skip
    assert "shared across all sequences" in protocol.state_source
    assert engine.starts == 9  # 3 prompts x 3 repeats
    for item in got:
        assert [s.completion.draft_n_accepted for s in item.samples] == [0, 0, 0]
        assert [s.position for s in item.samples] == [0, 0, 0]
        assert len({s.session for s in item.samples}) == 3
    # each server answers the warm-up text (outside the workload) before its one sample
    assert engine.log[0] == (1, WARMUP_TEXTS[0], WARMUP_TOKENS)
    assert [t for _, t, _ in engine.log[:2]] == [WARMUP_TEXTS[0], "prompt 0"]


def test_contention_retry_of_a_stateful_method_is_a_fresh_server_too() -> None:
    engine = MemoryEngine(foreign=[0.0, 9.0, 0.0])  # warm-up, contended sample, retry
    _, got = run("ngram-mod", engine, repeats=1, retries=2, wl=workload(1))
    (item,) = got
    assert item.contended == 1 and engine.starts == 2
    assert item.samples[0].completion.draft_n_accepted == 0  # the retry did not replay


def test_stateless_method_shares_one_server() -> None:
    engine = MemoryEngine()
    protocol, got = run("draft-simple", engine)
    assert (protocol.isolation, protocol.keeps_state) == (ISOLATION_SHARED, False)
    assert engine.starts == 1
    assert [s.position for s in got[0].samples] == [0, 3, 6]  # repeat-major order


def test_replaying_figures_are_flagged() -> None:
    # what the old protocol recorded for ngram-mod: nothing on first encounter, all on replay
    old = [("code-1", [completion(0), completion(53), completion(53)])]
    assert replay_flags(old) == ("code-1: repeat 2 accepted 53 tokens, repeat 1 0",)
    same = [("code-1", [completion(44), completion(44), completion(45)])]
    assert replay_flags(same) == ()


def test_warm_regime_sends_each_prompt_once_to_one_server() -> None:
    engine = MemoryEngine(foreign=[0.0, 0.0, 9.0, 0.0])
    protocol, got = run("ngram-mod", engine, repeats=3, retries=2, warm_first=1)
    assert (protocol.regime, protocol.isolation, protocol.repeats) == (
        REGIME_WARM, ISOLATION_SEQUENCE, 1,
    )  # fmt: skip
    assert protocol.contention_retries == 0  # a retry would be a replay
    assert engine.starts == 1
    assert [t for _, t, _ in engine.log] == [WARMUP_TEXTS[0], "prompt 0", "prompt 1", "prompt 2"]
    assert [item.samples[0].position for item in got] == [0, 1, 2]
    assert [item.contended for item in got] == [0, 1, 0]  # kept and counted, not taken again


def test_warm_regime_refuses_a_workload_that_repeats_a_prompt() -> None:
    wl = Workload("t", (Prompt("a", "code", "same"), Prompt("b", "code", "same")))
    with pytest.raises(UsageError, match="b repeat.* never replays"):
        run("ngram-mod", MemoryEngine(), wl=wl, warm_first=1)


def test_legacy_tools_are_a_process_per_sample() -> None:
    engine = MemoryEngine(process_per_sample=True)
    protocol, got = run("ngram-simple", engine, repeats=2)
    assert protocol.isolation == ISOLATION_PROCESS
    sessions = [s.session for item in got for s in item.samples]
    assert len(set(sessions)) == len(sessions) == 6
    with pytest.raises(UsageError, match="needs one long-lived llama-server"):
        run("ngram-simple", engine, warm_first=1)


def test_warmup_text_stays_outside_the_workload() -> None:
    wl = Workload("t", (Prompt("a", "chat", f"Please answer: {WARMUP_TEXTS[0]}"),))
    assert warmup_text(wl) == WARMUP_TEXTS[1]
    wl = Workload("t", tuple(Prompt(str(i), "chat", t + " ok") for i, t in enumerate(WARMUP_TEXTS)))
    with pytest.raises(UsageError, match="warm-up text"):
        warmup_text(wl)


def test_held_out_prompts_are_new_to_what_was_built() -> None:
    wl = workload(4)
    build, rest = wl.held_out(3)
    assert [p.prompt_id for p in build.prompts] == ["p0", "p1", "p2"]
    assert [p.prompt_id for p in rest.prompts] == ["p3"]
    again = Workload("t", (*wl.prompts, Prompt("p4", "code", "prompt 1")))
    with pytest.raises(UsageError, match="p4 repeat.* must be new"):
        again.held_out(4)
    with pytest.raises(UsageError, match="between 1 and 3"):
        wl.held_out(4)


def test_state_built_from_a_prompt_is_never_evaluated_on_it() -> None:
    wl = workload(3)
    built = [wl.prompts[1].sha256]  # e.g. a lookup cache made from prompt 1's output
    with pytest.raises(UsageError, match="p1 built the state .* held out"):
        run("ngram-cache", MemoryEngine(), wl=wl, built_from=built)
    _, rest = wl.held_out(2)
    protocol, got = run("ngram-cache", MemoryEngine(), wl=rest, built_from=built)
    assert [g.prompt.prompt_id for g in got] == ["p2"]
    assert protocol.to_json()["built_from_prompts"] == 1
