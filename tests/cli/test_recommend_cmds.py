"""`specreg train` and `specreg recommend` through the CLI: JSON, text, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli

TARGET = "Qwen2.5 Coder 32B Instruct"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _specreg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specreg", *args], capture_output=True, text=True)


def test_train_then_recommend_json_and_text(
    scanned_db: Path, specreg_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reference-like host: 460 GB/s needs the cores to go with it (on this machine's 2 cores
    # a verify pass is compute-bound and the cost model rightly says not to speculate).
    monkeypatch.setenv("SPECREG_HOST_FACTS", '{"physical_cores": 96}')
    code, out = _run("train", "--no-cv", "--bandwidth", "460", "--db", str(scanned_db), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["version"] == "1" and doc["kind"] == "train"
    assert doc["summary"]["n_prior"] > 400 and doc["summary"]["n_local"] == 0
    assert (specreg_home / "recommender" / "trained.json").exists()

    args = ("recommend", TARGET, "--task", "code", "--bandwidth", "460", "--db", str(scanned_db))
    code, out = _run(*args, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["version"] == "2" and doc["kind"] == "recommendation"
    assert doc["policy"] == "quality" and doc["task"] == "code" and doc["speculate"] is True
    assert doc["host"]["source"] == "user" and doc["host"]["bandwidth_gbs"] == 460
    assert 0 < doc["roofline"]["fraction"] < 1
    best = doc["options"][0]
    assert best["method"] == "draft" and best["lossless"] is True
    assert best["speedup_lo"] < best["speedup"] < best["speedup_hi"]
    assert "--spec-type draft-simple --spec-draft-model" in best["command"]
    assert f"--spec-draft-n-max {best['k']}" in best["command"]
    assert best["evidence"] and best["why"]

    code, out = _run(*args)
    assert code == 0
    assert out.splitlines()[0] == f"{TARGET}  task=code  policy=quality"
    assert out.splitlines()[1].startswith("roofline: 460 GB/s (user) / 21.06 GB per token")
    assert "run: draft-simple Qwen2.5 Coder 0.5B Instruct K=" in out


def test_unknown_target_is_a_usage_error(scanned_db: Path) -> None:
    r = _specreg("recommend", "nope", "--bandwidth", "100", "--db", str(scanned_db))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: no model matches 'nope': give a path, an id from `specreg models`, or a name"
    )


def test_unknown_policy_is_a_usage_error(scanned_db: Path) -> None:
    r = _specreg("recommend", TARGET, "--policy", "fast", "--db", str(scanned_db))
    assert r.returncode == 2
    assert r.stderr == (
        "error: Invalid value for '--policy': 'fast' is not one of 'quality', 'speed'"
        " (see `specreg recommend --help`)\n"
    )


def test_recommend_keeps_its_fit_and_refits_when_the_evidence_changes(
    specreg_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specreg.recommender import train as train_mod
    from specreg.recommender.prior import load_prior

    calls: list[int] = []
    real_fit = train_mod.fit

    def counting_fit(local=(), estimator=None):  # type: ignore[no-untyped-def]
        calls.append(len(local))
        est = train_mod.default_estimator().set_params(n_members=0, residual=False)
        return real_fit(local, est)

    monkeypatch.setattr(train_mod, "fit", counting_fit)
    first = train_mod.cached_fit()
    again = train_mod.cached_fit()
    assert calls == [0]  # the second call loaded the kept fit
    assert again.params == first.params
    one_local = [load_prior().observations[0]]
    train_mod.cached_fit(one_local)
    assert calls == [0, 1]  # new evidence, new fit
    assert len(list((specreg_home / "recommender" / "cache").glob("fit-*.json"))) == 1


def test_memory_of_the_host_asked_about_decides_what_fits(
    scanned_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41 point 4: `--cores 96 --bandwidth 460` said the 32B options "do not fit in this
    host's 25.3 GB" (this machine's), with no way to give that host's memory but a file."""
    monkeypatch.delenv("SPECREG_HOST_FACTS", raising=False)
    ask = ("recommend", TARGET, "--cores", "96", "--bandwidth", "460", "--db", str(scanned_db))
    # without --memory the line says whose memory judged what fits
    code, out = _run(*ask)
    assert code == 0
    host = next(line for line in out.splitlines() if line.startswith("host: "))
    assert host.startswith("host: 96 cores (user), 460 GB/s (user), ")
    assert host.endswith(" GB of memory (this machine's; --memory states that host's)")
    # that host's 768 GB hold every option; 22 GB do not hold the target with its 7B draft
    code, out = _run(*ask, "--memory", "768G")
    assert code == 0
    assert "host: 96 cores (user), 460 GB/s (user), 768.0 GB of memory (user)" in out
    assert "do not fit" not in out
    code, out = _run(*ask, "--memory", "22G", "--json")
    doc = json.loads(out)
    assert doc["host"]["mem_bytes"] == 22 * 10**9 and doc["host"]["mem_source"] == "user"
    memory = next(a for a in doc["advice"] if a.startswith("memory: "))
    assert "do not fit in this host's 22.0 GB of memory" in memory
    # GiB is binary, as written
    code, out = _run(*ask, "--memory", "1.5GiB", "--json")
    assert json.loads(out)["host"]["mem_bytes"] == 3 * 2**29


def test_the_first_recommend_shows_that_it_fits(scanned_db: Path, tmp_path: Path) -> None:
    """Issue 41 point 3: the first `recommend` on a registry fits the model for seconds and
    was silent; a user took it for a hang. On a terminal it says what it does while it does it,
    and a later call, which loads the fit, says nothing of it."""
    from support.tty import specreg_tty

    other = tmp_path / "other-home"
    code, first = specreg_tty("recommend", TARGET, "--db", str(scanned_db))
    assert code == 0, first
    assert "fitting the recommender on the prior and 0 runs (once)" in first
    code, again = specreg_tty("recommend", TARGET, "--db", str(scanned_db))
    assert code == 0 and "fitting" not in again
    # piped, stderr stays as it was (no bar to draw)
    from support.cli import specreg

    r = specreg("recommend", TARGET, "--db", str(scanned_db), env={"SPECREG_HOME": str(other)})
    assert r.returncode == 0 and r.stderr == ""
    assert list(other.glob("recommender/cache/fit-*.json"))  # it did fit
