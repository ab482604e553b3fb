"""The core scheduler: overlapping backends never decode at once, slots batch, the queue is
fair and bounded, and a request that goes away frees what it held."""

from __future__ import annotations

import asyncio
import random

import pytest

from specreg.serve.cores import CoreScheduler, Grant, QueueFull


def two_on_the_same_cores(slots: int = 1, max_queue: int = 64) -> CoreScheduler:
    s = CoreScheduler(max_queue=max_queue)
    s.register("plain", {0, 1}, slots)
    s.register("ngram", {0, 1}, slots)
    return s


def test_overlapping_backends_take_turns() -> None:
    async def main() -> list[str]:
        s = two_on_the_same_cores()
        first = await s.acquire(["plain"])
        waiting = asyncio.ensure_future(s.acquire(["ngram"]))
        await asyncio.sleep(0.01)
        order = ["plain started", f"ngram waits: {not waiting.done()}"]
        s.release(first)
        second = await waiting
        order.append(f"ngram started after {second.queued_s > 0}")
        s.release(second)
        assert not s.overlaps_seen()
        return order

    assert asyncio.run(main()) == ["plain started", "ngram waits: True", "ngram started after True"]


def test_slots_batch_on_one_backend_and_the_next_waits() -> None:
    async def main() -> None:
        s = two_on_the_same_cores(slots=2)
        a = await s.acquire(["plain"])
        b = await s.acquire(["plain"])
        assert (a.load, b.load) == (1, 2)
        third = asyncio.ensure_future(s.acquire(["plain"]))
        await asyncio.sleep(0.01)
        assert not third.done() and s.waiting == 1
        s.release(a)
        c = await third
        assert c.backend == "plain" and s.active("plain") == 2
        for g in (b, c):
            s.release(g)

    asyncio.run(main())


def test_disjoint_backends_decode_together() -> None:
    async def main() -> None:
        s = CoreScheduler()
        s.register("half0", {0}, 1)
        s.register("half1", {1}, 1)
        s.register("full", {0, 1}, 1)
        a = await s.acquire(["half0"])
        b = await s.acquire(["half1"])
        assert s.load("full") == 2 and not s.can_start("full")
        for g in (a, b):
            s.release(g)
        assert s.can_start("full")

    asyncio.run(main())


def test_a_waiter_is_not_starved_by_newcomers_joining_the_busy_backend() -> None:
    async def main() -> list[str]:
        s = two_on_the_same_cores(slots=4)
        running = await s.acquire(["plain"])
        ngram = asyncio.ensure_future(s.acquire(["ngram"]))
        await asyncio.sleep(0)
        # plain has free slots, but a request waits for these cores: newcomers queue behind it
        newcomer = asyncio.ensure_future(s.acquire(["plain"]))
        await asyncio.sleep(0.01)
        assert not newcomer.done()
        s.release(running)
        got = await ngram
        await asyncio.sleep(0.01)
        assert not newcomer.done()  # plain and ngram share the cores
        s.release(got)
        later = await newcomer
        s.release(later)
        return [g.backend for g in (got, later)]

    assert asyncio.run(main()) == ["ngram", "plain"]


def test_a_request_that_accepts_an_alternative_joins_it_now() -> None:
    async def main() -> str:
        s = two_on_the_same_cores(slots=2)
        busy = await s.acquire(["plain"])
        # its first choice shares the cores with a busy backend; plain (lossless) has a slot
        got = await s.acquire(["ngram", "plain"])
        for g in (busy, got):
            s.release(g)
        return got.backend

    assert asyncio.run(main()) == "plain"


def test_the_queue_is_bounded_and_says_when_to_retry() -> None:
    async def main() -> None:
        s = two_on_the_same_cores(max_queue=2)
        held = await s.acquire(["plain"])
        waiters = [asyncio.ensure_future(s.acquire(["plain"])) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as err:
            await s.acquire(["plain"])
        assert err.value.retry_after >= 1.0
        assert str(err.value).startswith("the server is at capacity: 2 request(s) wait")
        assert s.rejected == 1
        s.release(held)
        for w in waiters:
            s.release(await w)

    asyncio.run(main())


def test_a_cancelled_wait_leaves_the_queue_and_frees_nothing_twice() -> None:
    async def main() -> None:
        s = two_on_the_same_cores()
        held = await s.acquire(["plain"])
        gone = asyncio.ensure_future(s.acquire(["ngram"]))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert s.waiting == 0
        s.release(held)
        s.release(held)  # twice: the first counted
        assert s.active("plain") == 0 and s.can_start("ngram")

    asyncio.run(main())


def test_random_traffic_never_overlaps_cores() -> None:
    """Many requests of several backends on shared and disjoint cores, random durations: the
    record shows no two overlapping backends decoding at once, and no slot overfilled."""

    async def main() -> CoreScheduler:
        s = CoreScheduler(max_queue=1000)
        s.register("full-plain", {0, 1, 2, 3}, 4)
        s.register("full-draft", {0, 1, 2, 3}, 2)
        s.register("half0", {0, 1}, 2)
        s.register("half1", {2, 3}, 2)
        rng = random.Random(7)
        peak: dict[str, int] = {}

        async def request(i: int) -> None:
            names = rng.choice([["full-plain"], ["full-draft"], ["half0", "half1"],
                                ["full-draft", "full-plain"]])  # fmt: skip
            await asyncio.sleep(rng.random() * 0.02)
            g = await s.acquire(names)
            peak[g.backend] = max(peak.get(g.backend, 0), s.active(g.backend))
            await asyncio.sleep(rng.random() * 0.01)
            s.release(g)

        await asyncio.gather(*(request(i) for i in range(300)))
        assert peak["full-draft"] <= 2 and peak["full-plain"] <= 4
        return s

    s = asyncio.run(main())
    assert len(s.history) == 300
    assert s.overlaps_seen() == []


def test_a_backend_that_gets_the_cores_takes_its_waiters_as_one_batch() -> None:
    """Code and prose arrive interleaved for two backends on the same cores: each turn on
    the cores serves every request that waited for that backend, not one at a time."""

    async def main() -> list[tuple[str, int]]:
        s = two_on_the_same_cores(slots=4)
        order: list[Grant] = []

        async def one(name: str) -> Grant:
            g = await s.acquire([name])
            order.append(g)
            return g

        first = await s.acquire(["plain"])
        waiting = [asyncio.ensure_future(one("plain" if i % 2 else "ngram")) for i in range(6)]
        await asyncio.sleep(0.01)
        assert order == []  # ngram waits for the cores; plain's newcomers queue behind it
        s.release(first)
        await asyncio.sleep(0.01)
        assert len(order) == 3  # ngram's turn: its three together
        for g in list(order):
            s.release(g)
        await asyncio.sleep(0.01)
        for w in waiting:
            s.release(await w)
        return [(g.backend, g.load) for g in order]

    turns = asyncio.run(main())
    assert [b for b, _ in turns] == ["ngram"] * 3 + ["plain"] * 3
    assert [load for _, load in turns] == [1, 2, 3, 1, 2, 3]


def test_overlaps_seen_finds_an_overlap_in_a_record() -> None:
    from specreg.serve.cores import Interval

    s = two_on_the_same_cores()
    s.history.extend([Interval("plain", 0.0, 2.0), Interval("ngram", 1.0, 3.0)])
    assert len(s.overlaps_seen()) == 1
