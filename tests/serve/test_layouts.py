"""Split replicas (issue 39): where `specreg capacity` measured the split's aggregate above the
full instance's, `serve` runs the configuration on every placement of the host's first split
too, sends requests at those loads to the replica with the fewest in flight, and the core
scheduler keeps the full instance off the cores while replicas decode. The hosts are fake /sys
trees (support.topology), the measurements recorded curves; nothing starts llama.cpp."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.host.facts import HostFacts, HostQuery, resolve_host
from specreg.host.machine import Host, detect_host
from specreg.host.topology import (
    Placement,
    Topology,
    even_topology,
    layouts,
    read_topology,
    split_layout,
)
from specreg.llama.install import planned_install
from specreg.recommender.advisor import open_advisor
from specreg.recommender.predictor import SpeedPredictor
from specreg.registry.capacity import (
    CONTEXT_LONG,
    CONTEXT_SHORT,
    LAYOUT_FULL,
    CapacityCurve,
    CapacityPoint,
    record_capacity,
)
from specreg.registry.db import opened
from specreg.registry.queries import resolve_model
from specreg.registry.scan import model_record
from specreg.serve.app import Service
from specreg.serve.backends import BackendPool
from specreg.serve.classify import fitted_classifier
from specreg.serve.routes import RouteTable, Shape, parse_pin, plan_routes
from specreg.serve.serving import with_replicas

from support import schemas
from support.topology import EPYC_CPUS

NUMACTL = "/usr/bin/numactl"
DEMO_TARGET = "Qwen2.5 Coder 32B Instruct"  # in scanned_db, the demo tree
CONCURRENCY = (1, 2, 4, 8)
# a configuration as capacity records it: its label, speculative type and K
Measured = tuple[str, str, int | None]
PLAIN: Measured = ("plain", "none", None)
NGRAM: Measured = ("ngram-mod k=16", "ngram-mod", 16)


def host_of(topology: Topology, numactl: str | None) -> Host:
    """This machine's facts with the fake topology's cores, CPUs and nodes."""
    return replace(
        detect_host(), physical_cores=len(topology.cores), logical_cpus=len(topology.cpus),
        numa_nodes=len(topology.nodes), numactl=numactl,
    )  # fmt: skip


def full_tps(concurrency: int) -> float:
    return 20.0 * concurrency**0.5


def split_tps(concurrency: int, wins_from: int | None) -> float:
    """Above the full instance's from `wins_from` requests on (None: never)."""
    wins = wins_from is not None and concurrency >= wins_from
    return full_tps(concurrency) * (1.25 if wins else 0.7)


def curve(
    fingerprint: str,
    model_id: str,
    wins: dict[Measured, int | None],
    split: tuple[str, int, int],
) -> CapacityCurve:
    """A measurement as `specreg capacity` records it: per configuration (label, type, K) the
    full instance and the split (layout, instances, threads each) at 1, 2, 4 and 8 clients;
    short prompts where the split wins from `wins[config]` clients, long ones where it always
    wins (serve reads the short context only)."""
    layout, instances, threads = split
    points = []
    for (label, spec_type, k), wins_from in wins.items():
        for context in (CONTEXT_SHORT, CONTEXT_LONG):
            for c in CONCURRENCY:
                split_agg = split_tps(c, wins_from if context == CONTEXT_SHORT else 1)
                for where, n, t, agg in ((LAYOUT_FULL, 1, threads * instances, full_tps(c)),
                                         (layout, instances, threads, split_agg)):  # fmt: skip
                    tokens = 64 * 2 * c
                    points.append(CapacityPoint(
                        config_label=label, spec_type=spec_type, k=k, draft_id=None,
                        layout=where, instances=n, threads=t, slots=-(-8 // n),
                        context=context, prompt_tokens=40.0, concurrency=c, requests=2 * c,
                        tokens=tokens, wall_s=tokens / agg, aggregate_tps=agg,
                        per_request_tps=agg / c,
                    ))  # fmt: skip
    return CapacityCurve(fingerprint, model_id, datetime.now(timezone.utc), tuple(points))


def planned(
    db: Path, model: Path, topology: Topology, numactl: str | None, predictor: SpeedPredictor
) -> tuple[RouteTable, Host, str]:
    """The fixed route table serve plans on `topology`'s host for `model`: plain for every
    task, ngram-mod K=16 for code, each backend on the full placement (4 slots). And the
    model's id. `predictor`: the recommender's model (fitted once for the session)."""
    host = host_of(topology, numactl)
    with opened(db) as con:
        rec = model_record(con, model)
        facts = HostFacts(30.0, host.physical_cores, "user")
        advisor = open_advisor(con, facts, model=predictor)
        pins = [parse_pin("default=none"), parse_pin("code=ngram-mod:16")]
        table = plan_routes(con, planned_install(), host, advisor, [str(model)], pins=pins,
                            shape=Shape(4, layouts(topology).full))  # fmt: skip
    return table, host, rec.model_id


def replicated(db: Path, table: RouteTable, host: Host, split: tuple[Placement, ...]) -> RouteTable:
    with opened(db) as con:
        return with_replicas(con, table, planned_install(), host, split)


def halves(db: Path, small: Path, model: Path, predictor: SpeedPredictor) -> RouteTable:
    """The 2-core host's table (`small`) once capacity measured plain decoding faster in all on
    its two halves from 4 clients on: plain replicated on half0 and half1."""
    topology = read_topology(small, allowed=[0, 1])
    table, host, model_id = planned(db, model, topology, None, predictor)
    with opened(db) as con:
        record_capacity(con, curve(host.fingerprint, model_id, {PLAIN: 4}, ("half", 2, 1)))
    return replicated(db, table, host, layouts(topology).splits[0])


def backend_of(table: RouteTable, label: str) -> str:
    (found,) = [b.name for b in table.backends if b.config.label == label and b.placement
                and b.placement.name == "full"]  # fmt: skip
    return found


def plain_backends(table: RouteTable) -> tuple[str, str, str]:
    """The backends of `halves`' table: plain's full instance, its replicas on half0 and half1."""
    half0, half1 = (r.backend for r in table.replicas)
    return backend_of(table, "plain"), half0, half1


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.fixture
def model(gguf_factory: Any) -> Path:
    return Path(gguf_factory("target.gguf"))


# -- (a) the route table ----------------------------------------------------------------------


def test_a_split_that_wins_gets_one_replica_per_node_placed_like_a_full_backend(
    specreg_home: Path, nps4: Path, model: Path, prior_model: SpeedPredictor
) -> None:
    db = specreg_home / "registry.duckdb"
    topology = read_topology(nps4, allowed=EPYC_CPUS)
    split = layouts(topology).splits[0]
    table, host, model_id = planned(db, model, topology, NUMACTL, prior_model)
    assert replicated(db, table, host, split) == table  # nothing measured: nothing changes
    with opened(db) as con:
        record_capacity(con, curve(host.fingerprint, model_id, {PLAIN: 4, NGRAM: 8},
                                   ("node", 4, 24)))  # fmt: skip
    got = replicated(db, table, host, split)
    plain, ngram = backend_of(table, "plain"), backend_of(table, "ngram-mod k=16")
    assert got.backends[: len(table.backends)] == table.backends
    assert sorted((r.of, r.placement.name) for r in got.replicas) == sorted(
        (of, f"node{n}") for of in (plain, ngram) for n in range(4)
    )
    for r in got.replicas:
        n = int(r.placement.name[4:])
        spec = got.backend(r.backend)
        base = got.backend(r.of)
        assert spec.placement == r.placement == split[n]
        cpus = f"{24 * n}-{24 * n + 23}"  # the node's first CPU of each core, no SMT sibling
        assert spec.prefix == (NUMACTL, f"--physcpubind={cpus}", f"--interleave={n}")
        assert (flag(spec.argv, "-t"), flag(spec.argv, "-tb")) == ("24", "24")
        assert spec.cpus == tuple(sorted(split[n].all_cpus))
        assert flag(spec.argv, "-np") == "1" and spec.slots == 1  # 4 slots over 4 nodes
        assert spec.config.label == base.config.label and spec.config.ctx == base.config.ctx
        assert flag(spec.argv, "-c") == str(base.config.ctx)  # one slot's context
        assert (flag(base.argv, "-t"), base.prefix[1]) == ("96", "--physcpubind=0-95")
    by_of = {r.of: r for r in got.replicas}
    assert by_of[plain].levels == (4, 8, 16, 32, 64)
    assert by_of[ngram].levels == (8, 16, 32, 64)
    why = by_of[plain].evidence.why
    assert f"at 4 concurrent requests {split_tps(4, 4):.1f} t/s in all on the node split " in why
    assert f"against {full_tps(4):.1f} on the full instance" in why
    assert "at 2 concurrent" not in why  # the full instance won there


def test_a_one_node_host_without_numactl_splits_into_halves_pinned_by_llama_cpp(
    specreg_home: Path, small: Path, model: Path, prior_model: SpeedPredictor
) -> None:
    db = specreg_home / "registry.duckdb"
    topology = read_topology(small, allowed=[0, 1])
    split = layouts(topology).splits[0]
    table, host, model_id = planned(db, model, topology, None, prior_model)
    with opened(db) as con:
        record_capacity(con, curve(host.fingerprint, model_id, {PLAIN: 2, NGRAM: None},
                                   ("half", 2, 1)))  # fmt: skip
    got = replicated(db, table, host, split)
    assert [(r.placement.name, r.levels) for r in got.replicas] == [
        ("half0", (2, 4, 8, 16, 32, 64)), ("half1", (2, 4, 8, 16, 32, 64)),
    ]  # fmt: skip
    for r, mask in zip(got.replicas, ("1", "2"), strict=True):
        spec = got.backend(r.backend)
        assert spec.prefix == ()  # no numactl: llama.cpp pins its own threads
        assert (flag(spec.argv, "-t"), flag(spec.argv, "-C")) == ("1", mask)
        assert flag(spec.argv, "--cpu-strict") == "1" and spec.slots == 2
        assert "--interleave" not in " ".join(spec.argv)  # one node: no memory policy


def test_a_curve_of_another_split_gives_no_replicas_and_says_why(
    specreg_home: Path, nps4: Path, model: Path, prior_model: SpeedPredictor
) -> None:
    db = specreg_home / "registry.duckdb"
    topology = read_topology(nps4, allowed=EPYC_CPUS)
    table, host, model_id = planned(db, model, topology, NUMACTL, prior_model)
    with opened(db) as con:
        record_capacity(con, curve(host.fingerprint, model_id, {PLAIN: 4}, ("half", 2, 48)))
    got = replicated(db, table, host, layouts(topology).splits[0])
    assert got.replicas == () and got.backends == table.backends
    assert got.notes[-1] == (
        "target: specreg capacity measured a half split into 2 instances, and this host's "
        "cores split into 4 node placements now: no split replicas (run specreg capacity again)"
    )


# -- (b) routing ------------------------------------------------------------------------------


def test_at_load_one_the_full_instance_at_four_the_replicas_by_fewest_in_flight(
    specreg_home: Path, small: Path, model: Path, tmp_path: Path, prior_model: SpeedPredictor
) -> None:
    table = halves(specreg_home / "registry.duckdb", small, model, prior_model)
    full, half0, half1 = plain_backends(table)

    async def main() -> dict[str, Any]:
        pool = BackendPool(table, env={}, logs=tmp_path / "logs")
        service = Service(table, pool, fitted_classifier(), templates={})
        sched = pool.scheduler
        try:
            assert service.choose("target", "chat").backend == full  # a quiet server
            # three requests decoding on the full instance: a fourth meets load 4
            grants = [await sched.acquire([full]) for _ in range(3)]
            assert service.load_of("target") == 4
            order = []
            for _ in range(4):
                pick = service.choose("target", "chat")
                order.append(pick.backend)
                pool[pick.backend].assigned += 1  # in flight, as the front counts it
            assert pick.best == full  # the policy's choice is still the configuration
            for b in pool.backends.values():
                b.ready.set()  # as if every process were up: joining needs a ready backend
            # a request on a replica joins only the other replica, never a full instance
            assert service.alternatives("target", "chat", pool[half0]) == [half1]
            assert set(service.alternatives("target", "chat", pool[full])) == {
                half0, half1, backend_of(table, "ngram-mod k=16"),
            }  # fmt: skip
            for g in grants:
                sched.release(g)
            assert service.choose("target", "prose").backend == full  # quiet again
            pool[half0].failure = "failed to start"  # a replica down: its sibling serves
            grants = [await sched.acquire([full]) for _ in range(3)]
            order += [service.choose("target", "chat").backend for _ in range(2)]
            for g in grants:
                sched.release(g)
            status = service.policy_status().to_json()
        finally:
            await pool.stop()
        assert order == [half0, half1, half0, half1, half1, half1]
        return status

    status = asyncio.run(main())
    chat = next(t for t in status["tasks"] if t["task"] == "chat")
    assert chat["choice"] == full and chat["layout"] == LAYOUT_FULL
    placed = {(p["level"], p["layout"]): p["requests"] for p in status["layouts"]["requests"]}
    assert placed == {(1, "full"): 2, (4, "half"): 6}
    levels = {(x["backend"], x["level"]): x["layout"] for x in status["layouts"]["levels"]}
    assert [levels[(full, level)] for level in (1, 2, 4, 8, 64)] == [
        "full", "full", "half", "half", "half",
    ]  # fmt: skip


def test_a_replica_that_cannot_start_sends_its_request_to_the_full_instance(
    specreg_home: Path, small: Path, model: Path, tmp_path: Path, prior_model: SpeedPredictor
) -> None:
    """Every llama-server here is missing: the replica the load chose fails to start, the
    request is retried on its configuration's full instance (which fails too: 502 naming it),
    and the replica is left out from then on."""
    table = halves(specreg_home / "registry.duckdb", small, model, prior_model)
    missing = tuple(replace(b, binary=str(tmp_path / "no-llama-server")) for b in table.backends)
    table = replace(table, backends=missing)
    full, half0, half1 = plain_backends(table)

    async def main() -> tuple[httpx.Response, str]:
        pool = BackendPool(table, env={}, logs=tmp_path / "logs", lazy=True, startup_timeout=5)
        service = Service(table, pool, fitted_classifier(), templates={}, ready_timeout=5)
        grants = [await pool.scheduler.acquire([full]) for _ in range(3)]  # a fourth meets 4
        await service.open()
        try:
            transport = httpx.ASGITransport(app=service.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
                resp = await client.post(
                    "/v1/chat/completions",
                    json={"model": "target", "messages": [{"role": "user", "content": "hi"}]},
                    headers={"X-Specreg-Task": "chat"},
                )
            assert all(b.assigned == 0 for b in pool.backends.values())  # every claim ended
            after = service.choose("target", "chat").backend
        finally:
            for g in grants:
                pool.scheduler.release(g)
            await service.close()
            await pool.stop()
        return resp, after

    resp, after = asyncio.run(main())
    assert resp.status_code == 502, resp.text
    assert (resp.headers["X-Specreg-Backend"], resp.headers["X-Specreg-Policy"]) == (full, "retry")
    assert resp.json()["error"]["backend"] == full
    assert after == half1  # half0 failed to start: left out


# -- (c) the cores ----------------------------------------------------------------------------


def test_two_replicas_decode_together_and_the_full_instance_waits_for_both(
    specreg_home: Path, small: Path, model: Path, tmp_path: Path, prior_model: SpeedPredictor
) -> None:
    table = halves(specreg_home / "registry.duckdb", small, model, prior_model)
    full, half0, half1 = plain_backends(table)

    async def main() -> None:
        pool = BackendPool(table, env={}, logs=tmp_path / "logs")  # registers each's cores
        sched = pool.scheduler
        try:
            assert sorted(sched.overlapping(half0)) == sorted(
                b.name for b in table.backends if b.name not in (half0, half1)
            )
            a = await sched.acquire([half0])
            b = await sched.acquire([half1])  # disjoint cores: granted at once
            assert (sched.active(half0), sched.active(half1)) == (1, 1)
            waiting = asyncio.ensure_future(sched.acquire([full]))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            sched.release(a)
            await asyncio.sleep(0.01)
            assert not waiting.done()  # half1 still decodes on a core of the full instance
            sched.release(b)
            got = await asyncio.wait_for(waiting, 1)
            assert got.backend == full and got.queued_s > 0
            sched.release(got)
            assert not sched.overlaps_seen()
        finally:
            await pool.stop()

    asyncio.run(main())


# -- (d) the dry run --------------------------------------------------------------------------


def test_the_dry_run_lists_the_replicas_and_validates(scanned_db: Path) -> None:
    """`serve --cores N --bandwidth B --dry-run` plans for another host of N cores on this
    machine's nodes, spread evenly (its first split: two halves on one node, else one
    placement per node)."""
    cores = detect_host().physical_cores + 2  # never this machine
    with opened(scanned_db) as con:
        host = resolve_host(HostQuery(bandwidth_gbs=100.0, cores=cores), con)[0]
        model_id = resolve_model(con, DEMO_TARGET).model_id
        split = layouts(even_topology(host.physical_cores, host.numa_nodes)).splits[0]
        shape = (split_layout(split), len(split), split[0].threads)
        record_capacity(con, curve(host.fingerprint, model_id, {PLAIN: 4}, shape))
    args = ["serve", DEMO_TARGET, "--pin", "default=none", "--cores", str(cores), "--bandwidth",
            "100", "--dry-run", "--db", str(scanned_db)]  # fmt: skip
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    schemas.validate(doc)
    assert doc["version"] == "7"
    assert [r["placement"]["name"] for r in doc["replicas"]] == [p.name for p in split]
    names = {b["name"]: b for b in doc["backends"]}
    for r, place in zip(doc["replicas"], split, strict=True):
        assert names[r["backend"]]["placement"] == r["placement"] == place.to_json()
        assert r["levels"] == [4, 8, 16, 32, 64] and r["loads"] == "3 or more"
        wins = [p["concurrency"] for p in r["capacity"]["points"] if p["split_wins"]]
        assert wins == [4, 8] and r["capacity"]["layout"] == shape[0]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    first = doc["replicas"][0]
    assert (
        f"{first['backend']}: replica of {first['of']} on {split[0].label}, serving its "
        "requests at 3 or more requests in flight; specreg capacity of plain"
    ) in text.stdout
