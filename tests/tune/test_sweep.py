"""The parts of sweeps and Ray dispatch that need neither llama.cpp nor a cluster: the grid
syntax and its points, the hosts a cluster offers, stand-in host facts, and the one line a
user gets without Ray."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from specreg.errors import UsageError
from specreg.host.machine import ENV_HOST_FACTS, detect_host
from specreg.llama.config import Config
from specreg.registry.db import opened
from specreg.registry.queries import resolve_model
from specreg.tune.distributed import INSTALL_HINT, cluster_hosts
from specreg.tune.sweep import Grid, grid_points, parse_grid

from support.cli import specreg

DRAFT = "Qwen2.5 Coder 0.5B Instruct"


def test_grid_syntax() -> None:
    grid = parse_grid(["spec=none,ngram-mod,ngram-mod+draft-simple k=2..6:2;draft=a,b"])
    assert grid == Grid(
        spec_types=("none", "ngram-mod", "ngram-mod,draft-simple"), ks=(2, 4, 6), drafts=("a", "b")
    )
    assert grid.text == "spec=none,ngram-mod,ngram-mod+draft-simple k=2,4,6 draft=a,b"
    assert parse_grid(["spec=draft-simple", "k=4,2,4 experts=1..2"]).ks == (4, 2)
    assert parse_grid(["draft=x"]).spec_types == ("draft-simple",)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("k=2", "the grid names no speculative type: add spec=... (--grid 'spec=none,"),
        ("spec=ngram-mod size=3", "grid term 'size=3': write AXIS=VALUE,VALUE with AXIS one of"),
        ("spec=ngram-mod k=0", "grid k=0: give whole numbers of at least 1, or a range such as"),
        ("spec=ngram-mod k=8..2", "grid k=8..2: a range is LOW..HIGH or LOW..HIGH:STEP"),
        ("spec=ngram-mod spec=none", "grid axis spec is given twice: list all its values once"),
        ("spec=ngram-mod k=", "grid axis k has no values"),
        ("spec=warp-drive", "unknown speculative type"),
    ],
)
def test_a_bad_grid_is_one_usage_line(grid: str, message: str) -> None:
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        parse_grid([grid])


def test_points_leave_out_what_would_repeat_a_measurement(scanned_db: Path) -> None:
    with opened(scanned_db, read_only=True) as con:
        draft = resolve_model(con, DRAFT)
    grid = parse_grid(["spec=none,ngram-cache,ngram-mod,draft-simple k=2,4 draft=d"])
    points = grid_points(grid, [draft], Config(threads=1))
    labels = [p.label for p in points]
    # plain once (first), ngram-cache has no K, ngram-mod one per K, draft-simple per draft x K
    assert labels[0] == "plain" and labels.count("plain") == 1
    assert len(points) == 1 + 1 + 2 + 2
    assert all(p.config.threads == 1 for p in points)
    assert {p.draft for p in points if p.config.spec_type == "draft-simple"} == {draft}
    assert all(p.draft is None for p in points if p.config.spec_type != "draft-simple")
    with pytest.raises(UsageError, match="^spec=draft-simple needs a draft model: add draft="):
        grid_points(parse_grid(["spec=draft-simple"]), [], Config())


def test_hosts_of_a_cluster_are_the_alive_nodes_offering_specreg_host() -> None:
    nodes = [
        {"NodeID": "n1", "Alive": True, "Resources": {"specreg_host": 1.0, "specreg-host:a": 1.0}},
        {"NodeID": "n2", "Alive": False, "Resources": {"specreg_host": 1.0, "specreg-host:b": 1.0}},
        {"NodeID": "n3", "Alive": True, "Resources": {"CPU": 4.0}},  # the head, say
        {"NodeID": "n4", "Alive": True, "Resources": {"specreg_host": 1.0}},  # unnamed
    ]
    assert cluster_hosts(nodes) == {"a": "n1", "n4": "n4"}


def test_stated_host_facts_give_a_host_its_own_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = detect_host()
    monkeypatch.setenv(ENV_HOST_FACTS, '{"hostname": "alpha", "cpu_model": "lab host alpha"}')
    alpha = detect_host()
    assert (alpha.hostname, alpha.cpu_model) == ("alpha", "lab host alpha")
    assert alpha.physical_cores == real.physical_cores and alpha.fingerprint != real.fingerprint
    for bad, message in (
        ("{", "SPECREG_HOST_FACTS is not JSON"),
        ('{"cores": 2}', "SPECREG_HOST_FACTS names 'cores', which is no host fact: use hostname"),
        ('{"physical_cores": "2"}', "SPECREG_HOST_FACTS: physical_cores must be a positive"),
    ):
        monkeypatch.setenv(ENV_HOST_FACTS, bad)
        with pytest.raises(UsageError, match="^" + message):
            detect_host()


def test_without_ray_the_commands_say_how_to_get_it(scanned_db: Path, tmp_path: Path) -> None:
    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no ray here')\n")
    path = os.pathsep.join([str(fake.parent), *sys.path])
    for args in (
        ["sweep", DRAFT, "--grid", "spec=ngram-mod", "--ray", "127.0.0.1:1"],
        ["tune", DRAFT, "--ray", "127.0.0.1:1"],
    ):
        result = specreg(*args, "--db", str(scanned_db), env={"PYTHONPATH": path})
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [f"error: {INSTALL_HINT}"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--host", "alpha"],
            "error: --host is about the hosts of a Ray cluster: add --ray ADDRESS",
        ),
        (
            ["--retry-elsewhere"],
            "error: --retry-elsewhere is about the hosts of a Ray cluster: add",
        ),
    ],
)
def test_ray_options_without_ray_are_one_usage_line(
    scanned_db: Path, args: list[str], line: str
) -> None:
    result = specreg("sweep", DRAFT, "--grid", "spec=ngram-mod", *args, "--db", str(scanned_db))
    assert result.returncode == 2
    (got,) = result.stderr.splitlines()
    assert got.startswith(line)


def test_dry_run_lists_the_points(scanned_db: Path) -> None:
    result = specreg(
        "sweep", DRAFT, "--grid", "spec=ngram-mod,ngram-simple k=2,4", "--dry-run", "--db",
        str(scanned_db),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        "  plain", "  ngram-mod k=2", "  ngram-mod k=4", "  ngram-simple k=2", "  ngram-simple k=4",
    ]  # fmt: skip
