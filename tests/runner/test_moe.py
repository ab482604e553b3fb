"""The MoE expert override and draft-mtp on real MoE models: the synthetic qwen3moe
(8 experts, 2 used) and glm4moe with one NextN block that runner/synthetic.py writes, run by
the pinned llama.cpp."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli, error_line
from specreg.errors import UsageError
from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.registry.db import opened
from specreg.registry.run_store import get_run
from specreg.registry.scan import model_record
from specreg.runner import runs
from specreg.runner.settings import Settings
from specreg.runner.workload import load_workload
from specreg.samples.small_models import SmallModels
from specreg.samples.synthetic import SyntheticModels, write_moe_gguf

pytestmark = pytest.mark.llama

KEY = "qwen3moe.expert_used_count"
N_PREDICT = 32
THREADS = 1  # behaviour, not speed: one thread stays steady on a shared 2-core host


def plan(con, install, target, draft=None, config=None, repeats=2):  # type: ignore[no-untyped-def]
    # prose-1 ends inside a sentence (" and"), so the model's first token is a confident one.
    workload = load_workload(("prose",)).head(1)
    config = (config or Config()).with_(threads=THREADS)
    spec = runs.RunSpec(target, draft, config, workload, task="prose")
    settings = Settings(n_predict=N_PREDICT, repeats=repeats, retries=0)
    return runs.plan(con, install, detect_host(), spec, settings)


def flag_pairs(argv: tuple[str, ...] | list[str]) -> set[tuple[str, str]]:
    return set(zip(argv, argv[1:], strict=False))


@pytest.fixture
def con(specreg_home: Path):  # type: ignore[no-untyped-def]
    with opened(specreg_home / "registry.duckdb") as c:
        yield c


@pytest.mark.parametrize("which", ["moe", "mtp"])
def test_synthetic_models_are_byte_for_byte_reproducible(
    tmp_path: Path, small_models: SmallModels, synthetic_models: SyntheticModels, which: str
) -> None:
    spec = synthetic_models.spec if which == "moe" else synthetic_models.mtp_spec
    cached = getattr(synthetic_models, which)
    again = write_moe_gguf(tmp_path / "again.gguf", small_models.smollm2.path, spec)
    assert again.read_bytes() == cached.path.read_bytes()
    assert not list(tmp_path.glob("*.part"))
    assert cached in small_models.synthetic


def test_scan_marks_it_moe_with_its_expert_key(
    synthetic_models: SyntheticModels, specreg_home: Path
) -> None:
    target = str(synthetic_models.moe.path)
    scanned = CliRunner().invoke(cli, ["scan", target])
    assert scanned.exit_code == 0, scanned.output
    shown = CliRunner().invoke(cli, ["show", target, "--json"])
    assert shown.exit_code == 0, shown.output
    model = json.loads(shown.output)["model"]
    assert (model["architecture"], model["is_moe"]) == ("qwen3moe", True)
    assert (model["expert_count"], model["expert_used_count"]) == (8, 2)
    assert model["expert_used_key"] == KEY
    # Only 2 of the 8 experts' weights are active per token.
    assert model["n_params_active"] < model["n_params"]
    assert (model["tok_model"], model["n_tokens"]) == ("gpt2", 49152)


def test_one_expert_changes_the_output_and_the_divergence_is_measured(
    con, llama_install: LlamaInstall, synthetic_models: SyntheticModels
) -> None:  # type: ignore[no-untyped-def]
    p = plan(con, llama_install, synthetic_models.moe.path, None, Config(experts=1))
    assert p.config.expert_key == KEY and p.notes == ()
    out = runs.verify(con, p)
    v = out.verification
    assert v.baseline.ok and v.config.ok, (v.baseline.failure, v.config.failure)
    assert ("--override-kv", f"{KEY}=int:1") in flag_pairs(v.config.argv)
    # The run's server log shows llama.cpp applying the override and loading 1 expert.
    log = v.config.log_path.read_text()
    assert f"Using metadata override (  int) '{KEY}'" in log
    assert "print_info: n_expert_used         = 1" in log
    assert "Using metadata override" not in v.baseline.log_path.read_text()
    assert v.label == "behaviour-changing"
    assert v.verdict == "pass", v.reason
    (prompt,) = v.prompts
    assert prompt.verdict == "changed" and prompt.position is not None
    assert 0 < prompt.position < N_PREDICT
    assert prompt.baseline_token != prompt.config_token
    assert f"first at token {prompt.position}" in v.reason
    record = get_run(con, out.run_id)
    assert (record.kind, record.status, record.experts) == ("verify", "ok", 1)
    assert record.behaviour_changing is True
    assert record.prompts[0].divergence is not None
    assert record.prompts[0].divergence["position"] == prompt.position
    baseline = get_run(con, out.baseline_run_id)
    assert baseline.experts is None and baseline.behaviour_changing is False
    assert record.prompts[0].output_sha256 != baseline.prompts[0].output_sha256
    assert record.tokens_per_s and baseline.tokens_per_s


def test_all_experts_by_override_equals_the_baseline(
    con, llama_install: LlamaInstall, synthetic_models: SyntheticModels
) -> None:  # type: ignore[no-untyped-def]
    """--experts 2 is the model's own count: the override path must not change a token."""
    out = runs.verify(
        con, plan(con, llama_install, synthetic_models.moe.path, None, Config(experts=2), 1)
    )
    v = out.verification
    assert v.config.ok, v.config.failure
    assert ("--override-kv", f"{KEY}=int:2") in flag_pairs(v.config.argv)
    assert [p.verdict for p in v.prompts] == ["identical"]


def test_more_experts_than_the_model_has_is_refused(
    synthetic_models: SyntheticModels, llama_bin: Path
) -> None:
    target = synthetic_models.moe.path
    args = ["run", str(target), "--experts", "99", "--llama-bin", str(llama_bin)]
    result = CliRunner().invoke(cli, args)
    # Refused before any server starts: the registry knows the model has 8 experts.
    assert isinstance(result.exception, UsageError), result.output
    assert result.exception.exit_code == 2
    # the CLI's line names its option (main.error_line); the core names the parameter
    assert error_line(result.exception) == f"--experts 99 exceeds the 8 experts of {target.name}"
    assert str(result.exception) == f"`experts` 99 exceeds the 8 experts of {target.name}"


def test_llama_cpp_rejecting_the_expert_count_is_recorded_with_its_message(
    con, llama_install: LlamaInstall, synthetic_models: SyntheticModels
) -> None:  # type: ignore[no-untyped-def]
    """When the registry's check is not there to stop it (an unscanned or mislabelled model),
    llama.cpp aborts at load; the run is recorded as failed with llama.cpp's own line."""
    p = plan(con, llama_install, synthetic_models.moe.path, None, Config(experts=1), 1)
    p = replace(p, config=p.config.with_(experts=99))
    out = runs.run(con, p)
    assert not out.measurement.ok
    record = get_run(con, out.run_id)
    assert (record.status, record.experts, record.behaviour_changing) == ("failed", 99, True)
    assert record.llama_message is not None
    assert "GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed" in record.llama_message


def test_self_draft_speculates_on_the_moe(
    con, llama_install: LlamaInstall, synthetic_models: SyntheticModels
) -> None:  # type: ignore[no-untyped-def]
    cfg = Config(spec_type="draft-simple", k=4)
    target, draft = synthetic_models.moe.path, synthetic_models.moe_draft.path
    out = runs.verify(con, plan(con, llama_install, target, draft, cfg, 1))
    v = out.verification
    assert v.config.ok, v.config.failure
    assert v.config.speculative_active is True
    assert v.config.draft_n > 0 and v.config.draft_n_accepted > 0
    assert v.label == "lossless" and v.verdict == "pass", v.reason
    assert {p.verdict for p in v.prompts} <= {"identical", "near-tie"}
    assert get_run(con, out.run_id).draft_n == v.config.draft_n


def test_scan_finds_the_mtp_layers(synthetic_models: SyntheticModels, con) -> None:  # type: ignore[no-untyped-def]
    record = model_record(con, synthetic_models.mtp.path)
    assert (record.architecture, record.block_count) == ("glm4moe", 3)
    assert record.nextn_predict_layers == 1 and record.has_mtp_tensors is True
    assert record.is_moe and record.expert_used_key == "glm4moe.expert_used_count"
    assert model_record(con, synthetic_models.moe.path).has_mtp_tensors is False


def test_draft_mtp_speculates_with_the_models_own_nextn_layer(
    con, llama_install: LlamaInstall, synthetic_models: SyntheticModels
) -> None:  # type: ignore[no-untyped-def]
    cfg = Config(spec_type="draft-mtp", k=3)
    out = runs.verify(con, plan(con, llama_install, synthetic_models.mtp.path, None, cfg, 1))
    v = out.verification
    assert v.config.ok, v.config.failure
    assert "--spec-draft-model" not in v.config.argv  # the target drafts for itself
    assert "creating MTP draft context" in v.config.log_path.read_text()
    assert v.config.speculative_active is True
    assert v.config.draft_n > 0 and v.config.draft_n_accepted > 0
    assert v.label == "lossless" and v.verdict == "pass", v.reason
    assert {p.verdict for p in v.prompts} <= {"identical", "near-tie"}


def test_draft_mtp_is_refused_on_a_model_without_nextn_layers(
    con, llama_install: LlamaInstall, synthetic_models: SyntheticModels
) -> None:  # type: ignore[no-untyped-def]
    target = synthetic_models.moe.path
    with pytest.raises(UsageError, match=f"{target.name} has no MTP \\(NextN\\) layers"):
        plan(con, llama_install, target, None, Config(spec_type="draft-mtp", k=3))
