"""Config -> llama-server argv for each dialect, host settings, workloads."""

from __future__ import annotations

from pathlib import Path

import pytest

from specreg.cli.main import error_line
from specreg.errors import UsageError
from specreg.host.machine import Host, detect_host
from specreg.llama.config import Config, server_argv, server_command
from specreg.llama.install import DIALECT_DRAFT_MAX, DIALECT_SPEC_TYPE, parse_dialect
from specreg.runner.workload import TASKS, load_workload, task_prompts

T, D = Path("/m/target.gguf"), Path("/m/draft.gguf")


def host(numa: int = 1, numactl: str | None = None, cores: int = 8) -> Host:
    return Host("h", "AMD EPYC 9655", cores, cores * 2, 2**40, numa, numactl, "Linux")


def test_baseline_argv() -> None:
    assert server_argv(Config(), T, None, DIALECT_SPEC_TYPE, host()) == [
        "-m", "/m/target.gguf", "-t", "8", "-c", "4096",
    ]  # fmt: skip


def test_draft_needs_spec_type_in_current_dialect() -> None:
    # -md alone does nothing in 2026 builds; --spec-type draft-simple must come with it.
    cfg = Config(spec_type="draft-simple", k=8, p_min=0.5, draft_threads=2)
    assert server_argv(cfg, T, D, DIALECT_SPEC_TYPE, host())[6:] == [
        "--spec-type", "draft-simple", "--spec-draft-model", "/m/draft.gguf",
        "--spec-draft-n-max", "8", "--spec-draft-p-min", "0.5", "--spec-draft-threads", "2",
    ]  # fmt: skip


def test_draft_in_legacy_dialect() -> None:
    cfg = Config(spec_type="draft-simple", k=16, k_min=2)
    assert server_argv(cfg, T, D, DIALECT_DRAFT_MAX, host())[6:] == [
        "-md", "/m/draft.gguf", "--draft-max", "16", "--draft-min", "2",
    ]  # fmt: skip


def test_ngram_in_legacy_dialect_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="ngram-mod is not available in this llama.cpp's server"):
        server_argv(Config(spec_type="ngram-mod"), T, None, DIALECT_DRAFT_MAX, host())


def test_ngram_mod_k_maps_to_its_own_flags() -> None:
    argv = server_argv(Config(spec_type="ngram-mod", k=16), T, None, DIALECT_SPEC_TYPE, host())
    assert argv[6:] == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-min", "4",
    ]  # fmt: skip


def test_experts_override_uses_the_registry_key() -> None:
    cfg = Config(experts=6, expert_key="qwen3moe.expert_used_count")
    argv = server_argv(cfg, T, None, DIALECT_SPEC_TYPE, host())
    assert argv[-2:] == ["--override-kv", "qwen3moe.expert_used_count=int:6"]
    with pytest.raises(UsageError, match="`experts` needs the target's expert-count key") as err:
        server_argv(Config(experts=6), T, None, DIALECT_SPEC_TYPE, host())
    assert error_line(err.value).startswith("--experts needs the target's expert-count key")


def test_draft_type_without_draft() -> None:
    with pytest.raises(UsageError, match="draft-simple needs a draft model: pass `draft`$") as err:
        server_argv(Config(spec_type="draft-simple"), T, None, DIALECT_SPEC_TYPE, host())
    # the core names the parameter; the CLI says the option that sets it
    assert err.value.parameters == ("draft",)
    assert error_line(err.value) == "draft-simple needs a draft model: pass --draft PATH"


def test_bad_values() -> None:
    with pytest.raises(UsageError, match="unknown speculative type 'draft'"):
        Config(spec_type="draft")
    with pytest.raises(UsageError, match="`k` must be at least 1") as err:
        Config(spec_type="draft-simple", k=0)
    assert error_line(err.value) == "--k must be at least 1, got 0"


def test_numactl_only_with_several_nodes() -> None:
    one = server_command(Config(), T, None, DIALECT_SPEC_TYPE, host(1, "/usr/bin/numactl"))
    assert one[0] == "llama-server"
    two = server_command(Config(), T, None, DIALECT_SPEC_TYPE, host(2, "/usr/bin/numactl"))
    assert two[:2] == ["/usr/bin/numactl", "--interleave=all"]
    assert server_command(Config(), T, None, DIALECT_SPEC_TYPE, host(2, None))[0] == "llama-server"


def test_host_env_and_threads() -> None:
    h = host(cores=96)
    assert h.threads == 96
    assert h.env({"PATH": "/bin"}) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}


def test_detect_host_counts_physical_cores(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    blocks = []
    for cpu in range(4):  # 2 cores x 2 SMT threads
        blocks.append(
            f"processor\t: {cpu}\nmodel name\t: Test CPU\nphysical id\t: 0\ncore id\t: {cpu % 2}\n"
        )
    (proc / "cpuinfo").write_text("\n".join(blocks))
    (proc / "meminfo").write_text("MemTotal:       1048576 kB\n")
    sys_root = tmp_path / "sys"
    for n in range(2):
        (sys_root / f"devices/system/node/node{n}").mkdir(parents=True)
    h = detect_host(proc, sys_root)
    assert (h.cpu_model, h.physical_cores, h.logical_cpus, h.numa_nodes) == ("Test CPU", 2, 4, 2)
    assert h.mem_bytes == 2**30
    assert h.fingerprint == detect_host(proc, sys_root).fingerprint


def test_parse_dialect() -> None:
    assert parse_dialect("--spec-type [none|draft-simple|ngram-mod]  types") == (
        DIALECT_SPEC_TYPE,
        ("none", "draft-simple", "ngram-mod"),
    )
    assert parse_dialect("--draft-max, --draft, --draft-n N") == (DIALECT_DRAFT_MAX, ())
    assert parse_dialect("-m FNAME") is None


def test_prompt_sets_ship_for_every_task() -> None:
    for task in TASKS:
        prompts = task_prompts(task)
        assert len(prompts) >= 2
        assert all(p.task == task and p.prompt_id.startswith(task) for p in prompts)


def test_user_prompts(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text('{"id": "a", "prompt": "Hello"}\n\n"bare string"\n')
    w = load_workload(prompts_file=f)
    assert [(p.prompt_id, p.text) for p in w.prompts] == [("a", "Hello"), ("mine-3", "bare string")]
    f.write_text('{"text": "x"}\n')
    with pytest.raises(UsageError, match=r'mine.jsonl:1 has no "prompt" string'):
        load_workload(prompts_file=f)


def test_threads_override() -> None:
    argv = server_argv(Config(threads=1), T, None, DIALECT_SPEC_TYPE, host(cores=8))
    assert argv[argv.index("-t") + 1] == "1"
    assert Config(threads=1).baseline().threads == 1


# -- the user's own llama-server flags, and the context a server gets (issue 41 point 14) ----


@pytest.mark.parametrize(
    ("given", "flag", "what"),
    [
        (["-c 8192"], "-c", "the context per request (--ctx)"),
        (["--ctx-size=8192"], "--ctx-size", "the context per request (--ctx)"),
        (["--port", "9000"], "--port", "the address"),
        (["-np 8"], "-np", "the slots (serve --parallel)"),
        (["-m /x.gguf"], "-m", "the target model (TARGET)"),
        (["--spec-type ngram-mod"], "--spec-type", "the speculative configuration"),
        (["--draft-max 8"], "--draft-max", "the speculative configuration"),
        (["-md /d.gguf"], "-md", "the draft model (--draft)"),
        (["--api-key k"], "--api-key", "the API key (serve --api-key guards serve"),
        (["--jinja", "-t 4"], "-t", "the threads (--threads)"),
    ],
)
def test_a_flag_specreg_sets_cannot_be_given_again(given: list[str], flag: str, what: str) -> None:
    from specreg.llama.config import user_server_args

    with pytest.raises(UsageError) as err:
        user_server_args(given, "serve --server-arg")
    assert str(err.value).startswith(f"serve --server-arg: specreg sets {flag} itself, {what}")
    assert str(err.value).endswith("; leave it out")


def test_own_flags_come_after_specregs_and_reach_the_baseline() -> None:
    from specreg.llama.config import user_server_args

    own = user_server_args(["--jinja", "--cache-type-k q8_0", "--seed -1"], "x").args
    assert own == ("--jinja", "--cache-type-k", "q8_0", "--seed", "-1")
    cfg = Config(spec_type="ngram-mod", k=8, server_args=own)
    argv = server_argv(cfg, T, None, DIALECT_SPEC_TYPE, host())
    assert argv[:6] == ["-m", "/m/target.gguf", "-t", "8", "-c", "4096"]
    assert argv[-5:] == list(own)
    assert cfg.baseline().server_args == own
    with pytest.raises(UsageError, match="'q8_0' is a value without its flag"):
        user_server_args(["q8_0"], "x")


def test_the_context_follows_the_trained_context_and_the_memory() -> None:
    from specreg.llama.config import DEFAULT_CTX, context_for, kv_bytes_per_token

    # Qwen2.5-32B: 64 layers, 8 KV heads of 128: 256 KiB of f16 KV cache a token
    kv = {"qwen2.block_count": 64, "qwen2.attention.head_count": 40,
          "qwen2.attention.head_count_kv": 8, "qwen2.embedding_length": 5120}  # fmt: skip
    per_token = kv_bytes_per_token("qwen2", kv)
    assert per_token == 64 * 8 * (128 + 128) * 2 == 262144
    assert kv_bytes_per_token("mamba", {"mamba.block_count": 64}) is None
    # room for all of it: the trained context
    assert context_for(32768, per_token, 100 * 10**9, slots=4).tokens == 32768
    # half of 4 GB beside the weights for 4 slots: 1907 tokens a slot, below the floor
    small = context_for(32768, per_token, 4 * 10**9, slots=4)
    assert small.tokens == DEFAULT_CTX and "give --ctx to choose" in small.why
    # 40 GB: 20 GB for one slot holds 76293 tokens, in steps of 1024, up to the trained context
    assert context_for(131072, per_token, 40 * 10**9).tokens == 75776
    # a model trained on less than the floor keeps its own; unknown shapes take the trained
    assert context_for(2048, per_token, 10**6).tokens == 2048
    assert context_for(65536, None, None).tokens == 65536
    assert context_for(None, per_token, 10**12).tokens == DEFAULT_CTX
