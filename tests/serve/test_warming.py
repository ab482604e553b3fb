"""serve warms the page cache interleaved over its backends' nodes before any backend maps a
model (issue 39): numactl stands in at the process boundary and records what it was asked."""

from __future__ import annotations

from pathlib import Path

from specreg.host.topology import Core, Placement
from specreg.llama.config import Config
from specreg.serve.routes import BackendSpec, RouteTable, Target
from specreg.serve.serving import warm_models


def fake_numactl(tmp_path: Path) -> str:
    path = tmp_path / "numactl"
    path.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\nshift; exec "$@"\n')
    path.chmod(0o755)
    return str(path)


def placement(nodes: tuple[int, ...], policy: str | None) -> Placement:
    cores = tuple(Core((i,), node, i, 0) for i, node in enumerate(nodes))
    return Placement("full", cores, tuple(sorted(set(nodes))), policy)


def table(tmp_path: Path, place: Placement) -> RouteTable:
    target = Target("big", "a" * 32, str(tmp_path / "big.gguf"))
    draft = tmp_path / "draft.gguf"
    specs = tuple(
        BackendSpec(
            name=name,
            target=target,
            config=Config(),
            draft_id=d and "b" * 32,
            draft_path=d,
            prefix=(),
            binary="llama-server",
            flags=(),
            placement=place,
        )  # fmt: skip
        for name, d in (("big-plain", None), ("big-draft", str(draft)))
    )
    for path in (target.path, draft):
        Path(path).write_bytes(b"x" * 1000)
    return RouteTable((target,), (), specs)


def test_models_are_read_interleaved_over_the_backends_nodes_once(tmp_path: Path) -> None:
    numactl = fake_numactl(tmp_path)
    warming = warm_models(table(tmp_path, placement((0, 0, 1, 1, 2, 3), "interleave")), numactl)
    assert warming is not None and warming.problem == "" and warming.bytes_read == 2000
    argv = (tmp_path / "argv").read_text().split()
    # the target once (two backends load it), then the draft
    assert argv == [
        "--interleave=0-3",
        "cat",
        str(tmp_path / "big.gguf"),
        str(tmp_path / "draft.gguf"),
    ]


def test_a_one_node_host_reads_nothing(tmp_path: Path) -> None:
    numactl = fake_numactl(tmp_path)
    assert warm_models(table(tmp_path, placement((0, 0), None)), numactl) is None
    assert not (tmp_path / "argv").exists()
