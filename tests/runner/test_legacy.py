# ruff: noqa: E501  (verbatim llama.cpp lines)
"""The legacy engines: llama-speculative and llama-lookup, one process per prompt.

Parsers on verbatim llama.cpp output, engine selection, fake binaries at the process boundary
for faults (hang, crash, old flag spelling), and the real binaries on the small models.
"""

from __future__ import annotations

import json
import stat
import sys
import textwrap
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli, error_line
from specreg.errors import UsageError
from specreg.host.machine import Host, detect_host
from specreg.llama.config import Config
from specreg.llama.install import DIALECT_DRAFT_MAX, DIALECT_SPEC_TYPE, LlamaInstall, find_llama
from specreg.llama.server import Completion, TokenProbs
from specreg.registry.db import opened
from specreg.registry.run_store import get_run, list_runs
from specreg.runner import runs
from specreg.runner.legacy import (
    LOOKUP,
    SPECULATIVE,
    LegacyFlags,
    choose_engine,
    generated_text,
    legacy_argv,
    parse_legacy_flags,
    parse_stats,
)
from specreg.runner.measure import measure
from specreg.runner.measurement import Measurement, PromptResult
from specreg.runner.settings import Settings
from specreg.runner.verify import judge
from specreg.runner.workload import Prompt, Workload, load_workload
from specreg.samples.small_models import SmallModels

from support.fake_server import assert_no_strays

# -- verbatim output (/work/shared/notes/llama-cpp.md 3b, 3c) -------------------------------

SPECULATIVE_STATS = """\
0.07.083.100 I encoded   20 tokens in    0.101 seconds, speed:  198.602 t/s
0.07.083.101 I decoded  258 tokens in    6.814 seconds, speed:   37.861 t/s
0.07.083.101 I
0.07.083.102 I n_draft   = 8
0.07.083.102 I n_predict = 258
0.07.083.102 I n_drafted = 469
0.07.083.103 I n_accept  = 197
0.07.083.103 I accept    = 42.004%
0.07.083.103 I
0.07.083.104 I draft:

0.07.083.104 I
0.07.083.104 I target:

0.07.083.105 I common_perf_print:    sampling time =      17.15 ms
0.07.083.105 I common_perf_print: prompt eval time =    4026.76 ms /   551 tokens (    7.31 ms per token,   136.83 tokens per second)
0.07.083.106 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""

LOOKUP_STATS = """\
I encoded  345 tokens in    0.479 seconds, speed: 1285.725 t/s
I decoded  271 tokens in    2.253 seconds, speed:  120.267 t/s
I
I n_draft      = 16
I n_predict    = 271
I n_drafted    = 289
I t_draft_flat = 0.18 ms
I t_draft      = 0.93 ms, 3.23 us per token, 309421.84 tokens per second
I n_accept     = 221
I accept       = 76.471%
"""

HOST = Host("h", "cpu", 2, 2, 2**34, 1, None, "Linux")


def test_parse_speculative_stat_block() -> None:
    s = parse_stats(SPECULATIVE_STATS)
    assert s is not None
    assert (s.encoded_n, s.encoded_s) == (20, 0.101)
    assert (s.decoded_n, s.decoded_s, s.decoded_tps) == (258, 6.814, 37.861)
    assert (s.n_draft, s.n_predict, s.n_drafted, s.n_accept) == (8, 258, 469, 197)
    assert s.accept_pct == pytest.approx(42.004)


def test_parse_lookup_stat_block() -> None:
    s = parse_stats(LOOKUP_STATS)
    assert s is not None
    assert (s.decoded_n, s.decoded_s, s.n_draft, s.n_drafted, s.n_accept) == (
        271,
        2.253,
        16,
        289,
        221,
    )
    assert s.accept_pct == pytest.approx(76.471)


def test_parse_stats_nothing_drafted_and_missing_block() -> None:
    text = LOOKUP_STATS.replace("n_drafted    = 289", "n_drafted    = 0").replace(
        "n_accept     = 221", "n_accept     = 0"
    )
    s = parse_stats(text.replace("76.471%", "-nan%"))
    assert s is not None and (s.n_drafted, s.n_accept, s.accept_pct) == (0, 0, None)
    assert parse_stats("I main: loading model\nE failed to load model\n") is None


def test_generated_text_strips_echo_bos_and_end_of_text() -> None:
    prompt = "Write a Python function:"
    out = "\n\n<bos>" + prompt + "\n\ndef f():\n    pass<end_of_turn>" + "\n\n" * 2
    assert generated_text(out, prompt, ("<end_of_turn>",)) == ("\n\ndef f():\n    pass", True)
    # SmolLM2: no BOS piece; `<|im_end|>` is known even without the registry's texts.
    out = "\n\n" + prompt + " points discussed.<|im_end|>" + "\n\n" * 2
    assert generated_text(out, prompt) == (" points discussed.", True)
    # A generation that itself ends in blank lines keeps them; the limit is not an EOS.
    out = "\n\n" + prompt + " a\n\n" + "\n\n" * 2
    assert generated_text(out, prompt) == (" a\n\n", False)


# -- flags and engine selection --------------------------------------------------------------

HELP_2026 = """\
--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
--spec-draft-n-min N                    minimum number of draft tokens to use for speculative decoding
--spec-draft-p-min, --draft-p-min P     minimum speculative decoding probability (greedy) (default: 0.00)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
"""
HELP_2025 = """\
--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding (default: 16)
--draft-min, --draft-n-min N            minimum number of draft tokens to use for speculative decoding
--draft-p-min P                         minimum speculative decoding probability (greedy) (default: 0.8)
"""
HELP_2024_LOOKUP = (
    "--draft N                  number of tokens to draft for speculative decoding (default: 5)\n"
)


def test_flag_spelling_follows_the_binary_help() -> None:
    assert parse_legacy_flags(HELP_2026) == LegacyFlags(
        "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min"
    )
    assert parse_legacy_flags(HELP_2025) == LegacyFlags(
        "--draft-max", "--draft-min", "--draft-p-min"
    )
    assert parse_legacy_flags(HELP_2024_LOOKUP) == LegacyFlags("--draft", None, None)
    assert parse_legacy_flags("-m, --model FNAME\n") is None


def test_legacy_argv_per_tool() -> None:
    cfg = Config(spec_type="draft-simple", k=4, temperature=0.0, seed=7, ctx=2048, threads=2)
    flags = LegacyFlags("--draft-max", "--draft-min", "--draft-p-min")
    argv = legacy_argv(SPECULATIVE, flags, cfg, Path("/t.gguf"), Path("/d.gguf"), "p.txt", 32, HOST)
    assert argv == [
        "-m", "/t.gguf", "-md", "/d.gguf", "--draft-max", "4", "-f", "p.txt", "-n", "32",
        "--temp", "0", "--seed", "7", "-t", "2", "-c", "2048",
    ]  # fmt: skip
    look = legacy_argv(
        LOOKUP, LegacyFlags("--draft", None, None), Config(spec_type="ngram-simple", k=8),
        Path("/t.gguf"), None, "p.txt", 16, HOST,
    )  # fmt: skip
    assert look[:4] == ["-m", "/t.gguf", "--draft", "8"] and "-md" not in look


def install(dialect: str, types: tuple[str, ...], binaries: tuple[str, ...]) -> LlamaInstall:
    return LlamaInstall(
        Path("/b"), "cache", "4000 (old)", dialect, types, ("llama-server", *binaries)
    )


OLD = install(DIALECT_DRAFT_MAX, (), (SPECULATIVE, LOOKUP))
NEW = install(
    DIALECT_SPEC_TYPE, ("none", "draft-simple", "ngram-simple", "ngram-mod"), (SPECULATIVE, LOOKUP)
)


def test_auto_engine_uses_the_server_when_it_can() -> None:
    assert choose_engine(NEW, Config(spec_type="ngram-simple")) == "server"
    assert choose_engine(NEW, Config(spec_type="draft-simple")) == "server"
    assert choose_engine(OLD, Config(spec_type="draft-simple")) == "server"
    assert choose_engine(OLD, Config()) == "server"


def test_auto_engine_falls_back_to_legacy_binaries() -> None:
    assert choose_engine(OLD, Config(spec_type="ngram-simple")) == LOOKUP
    assert choose_engine(OLD, Config(spec_type="ngram-mod")) == LOOKUP
    assert choose_engine(NEW, Config(spec_type="draft-simple"), "legacy") == SPECULATIVE


def test_engine_errors_say_what_to_do() -> None:
    no_lookup = install(DIALECT_DRAFT_MAX, (), (SPECULATIVE,))
    with pytest.raises(UsageError) as err:
        choose_engine(no_lookup, Config(spec_type="ngram-simple"))
    assert str(err.value) == (
        "this llama.cpp (4000 (old), draft-max dialect) lacks ngram-simple in llama-server and "
        "has no llama-lookup in /b: build llama-lookup too, or use `specreg llama build`"
    )
    with pytest.raises(UsageError) as err:
        choose_engine(OLD, Config(spec_type="ngram-simple"), "server")
    assert error_line(err.value) == (  # as the CLI says it; the core says `engine`
        "this llama.cpp (4000 (old), draft-max dialect) has no --spec-type ngram-simple in "
        "llama-server: use --engine legacy (llama-lookup), or choose one of draft-simple"
    )
    with pytest.raises(UsageError, match="draft-mtp has no legacy engine"):
        choose_engine(OLD, Config(spec_type="draft-mtp"))
    with pytest.raises(UsageError, match="plain decoding always runs on llama-server"):
        choose_engine(NEW, Config(), "legacy")


# -- text verification ----------------------------------------------------------------------

PROMPT = Prompt("code-1", "code", "def f(")


def sample(
    text: str, tokens: tuple[int, ...] = (), stop: str = "limit", draft_n: int = 0
) -> Completion:
    return Completion(
        tokens=tokens, content=text, predicted_n=10, predicted_ms=100.0, prompt_n=3,
        prompt_ms=1.0, draft_n=draft_n, draft_n_accepted=draft_n // 2, stop_type=stop,
        spec_types="", wall_s=0.1, foreign_cpu_s=0.0,
    )  # fmt: skip


def measured(config: Config, s: Completion, engine: str = "server") -> Measurement:
    return Measurement(
        config=config, target=Path("/t.gguf"), draft=None, install=NEW, host=HOST,
        workload=Workload("tasks:code", (PROMPT,)), n_predict=10, repeats=1, argv=(),
        started_at=datetime.now(timezone.utc), seconds=1.0, log_path=Path("/tmp/x.log"),
        prompts=(PromptResult(PROMPT, (s,)),), engine=engine,
    )  # fmt: skip


LOOK = Config(spec_type="ngram-simple", k=8)


def test_text_overshoot_is_identical_and_says_no_probe() -> None:
    base = measured(Config(), sample("x):\n    return 1", (1, 2, 3)))
    cfg = measured(LOOK, sample("x):\n    return 1\n\nprint", draft_n=8), LOOKUP)
    v = judge(base, cfg)
    assert v.verdict == "pass"
    assert v.prompts[0].verdict == "text-identical"
    assert v.reason == (
        "identical text on 1/1 prompts over the common length (llama-lookup prints text, not "
        "tokens); faster than baseline: 1.00x"
    )
    assert "numerics" not in v.reason


def test_text_divergence_fails_with_both_continuations() -> None:
    base = measured(Config(), sample("list, key):", (1, 2, 3)))
    cfg = measured(LOOK, sample("list, start, end):", draft_n=8), LOOKUP)
    v = judge(base, cfg)
    assert v.verdict == "fail"
    p = v.prompts[0]
    assert (p.verdict, p.position, p.unit) == ("text-diverged", 6, "char")
    assert (p.baseline_text, p.config_text) == ("key):", "start, end):")
    assert v.reason == (
        "output text differs from the baseline: prompt code-1 char 6 (baseline 'key):', config "
        "'start, end):'); the baseline's top candidates there are unknown, so it is not "
        "explained"
    )
    assert p.to_json()["unit"] == "char"  # type: ignore[index]


def with_reference(m: Measurement, p_key: float, p_start: float) -> Measurement:
    """The baseline's reference run: top candidates at every token of 'list, key):'."""
    probs = (
        TokenProbs(1, ((1, "list", 0.9),)),
        TokenProbs(2, ((2, ",", 0.95),)),
        TokenProbs(3, ((3, " key", p_key), (7, " start", p_start), (8, " s", 0.01))),
        TokenProbs(4, ((4, "):", 0.97),)),
    )
    ref = replace(m.prompts[0].samples[0], tokens=(1, 2, 3, 4), probs=probs)
    return replace(m, prompts=(replace(m.prompts[0], reference=ref),))


def test_text_divergence_at_a_near_tie_of_the_baseline_passes() -> None:
    base = with_reference(measured(Config(), sample("list, key):", (1, 2, 3, 4))), 0.46, 0.44)
    cfg = measured(LOOK, sample("list, start, end):", draft_n=8), LOOKUP)
    v = judge(base, cfg)
    p = v.prompts[0]
    assert v.verdict == "pass", v.reason
    assert (p.verdict, p.position, p.baseline_token, p.config_token) == ("near-tie", 6, 3, 7)
    assert p.margin == pytest.approx(0.02)
    assert v.reason == (
        "identical text on 0/1 prompts over the common length (llama-lookup prints text, not "
        "tokens); 1 equivalent up to numerics (the baseline's near-tied candidate spells the "
        "llama-lookup text, margin <= 0.020); faster than baseline: 1.00x"
    )


def test_text_divergence_where_the_baseline_was_sure_fails() -> None:
    base = with_reference(measured(Config(), sample("list, key):", (1, 2, 3, 4))), 0.9, 0.05)
    cfg = measured(LOOK, sample("list, start, end):", draft_n=8), LOOKUP)
    v = judge(base, cfg)
    assert (v.verdict, v.prompts[0].verdict) == ("fail", "text-diverged")
    assert v.reason.endswith(
        "the baseline preferred its token by 0.850 (p=0.900 vs 0.050): not a near-tie"
    )
    other = measured(LOOK, sample("list, other):", draft_n=8), LOOKUP)
    v = judge(base, other)  # no candidate spells " other"
    assert v.reason.endswith(
        "the baseline was sure there (p=0.900) and none of its top candidates spells the "
        "llama-lookup text"
    )


def test_stopping_early_at_end_of_text_is_a_difference() -> None:
    base = measured(Config(), sample("made in the article. The", (1, 2)))
    cfg = measured(LOOK, sample("made in the", stop="eos", draft_n=4), LOOKUP)
    p = judge(base, cfg).prompts[0]
    assert (p.verdict, p.position, p.baseline_text, p.config_text) == (
        "text-diverged",
        11,
        " article. The",
        "",
    )


# -- fake binaries at the process boundary --------------------------------------------------

FAKE_SERVER = """#!{python}
import sys
if "--help" in sys.argv:
    print("-md, --model-draft FNAME   draft model\\n--draft-max, --draft, --draft-n N\\n"); sys.exit(0)
print("version: 4000 (old)", file=sys.stderr)
"""

# A legacy tool: records its argv and pid (and a child's), then behaves per MODE.
FAKE_TOOL = r"""#!{python}
import json, os, signal, subprocess, sys, time
HELP, MODE, PIDS, ARGV = {help!r}, {mode!r}, {pids!r}, {argv!r}
args = sys.argv[1:]
if "--help" in args:
    print(HELP); sys.exit(0)
child = subprocess.Popen(["sleep", "600"])
with open(PIDS, "a") as fh:
    fh.write(f"{{os.getpid()}} {{child.pid}}\n")
with open(ARGV, "a") as fh:
    fh.write(json.dumps(args) + "\n")
def log(line):
    print(line, file=sys.stderr, flush=True)
prompt = open(args[args.index("-f") + 1]).read()
prompt = prompt[:-1] if prompt.endswith("\n") else prompt
log("0.00.010.000 I main: llama backend init")
if MODE == "hang":
    time.sleep(600)
if MODE == "oom":
    log("0.00.020.000 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736")
    log("terminate called after throwing an instance of 'std::bad_alloc'")
    os.kill(os.getpid(), signal.SIGABRT)
if MODE == "quiet":
    sys.exit(0)
n = int(args[args.index("-n") + 1])
sys.stdout.write("\n\n<s>" + prompt + " a b a b a b</s>" + "\n\n")
log("0.00.500.000 I encoded    4 tokens in    0.010 seconds, speed:  400.000 t/s")
log(f"0.00.500.001 I decoded {{n + 2:4d}} tokens in    0.050 seconds, speed:  {{(n + 2) / 0.05:.3f}} t/s")
log("0.00.500.002 I n_draft      = 8")
log(f"0.00.500.003 I n_predict    = {{n + 2}}")
log("0.00.500.004 I n_drafted    = 6")
log("0.00.500.005 I n_accept     = 4")
log("0.00.500.006 I accept       = 66.667%")
sys.stdout.write("\n\n")
"""


def make_old_build(
    tmp_path: Path, mode: str, tool: str = LOOKUP, tool_help: str = HELP_2024_LOOKUP
) -> tuple[Path, Path, Path]:
    bin_dir = tmp_path / f"old-{mode}"
    bin_dir.mkdir()
    pids, argv = tmp_path / f"pids-{mode}.txt", tmp_path / f"argv-{mode}.jsonl"
    files = {
        "llama-server": FAKE_SERVER.format(python=sys.executable),
        tool: textwrap.dedent(FAKE_TOOL).format(
            python=sys.executable, help=tool_help, mode=mode, pids=str(pids), argv=str(argv)
        ),
    }
    for name, text in files.items():
        script = bin_dir / name
        script.write_text(text)
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir, pids, argv


@pytest.fixture
def target(gguf_factory) -> Path:  # type: ignore[no-untyped-def]
    return gguf_factory("target.gguf", tokens=["<s>", "</s>", "a", "b"], bos=0, eos=1)


def test_old_build_runs_ngram_on_llama_lookup_with_its_flag(
    tmp_path: Path, target: Path, specreg_home: Path
) -> None:
    bin_dir, pids, argv_file = make_old_build(tmp_path, "ok")
    args = [
        "run", str(target), "--spec-type", "ngram-simple", "--k", "8", "--llama-bin",
        str(bin_dir), "--repeat", "2", "--n-predict", "6", "--max-prompts", "1", "--json",
        "--retries", "0",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    # stderr's `note:` line (mixed into the output here) comes before the JSON document
    run = json.loads(result.output[result.output.index("{") :])["run"]
    assert run["status"] == "ok" and run["config"]["engine"] == LOOKUP
    assert (run["draft_n"], run["draft_n_accepted"]) == (12, 8)  # 2 repeats x (6, 4)
    assert run["argv"][1:5] == ["-m", str(target.resolve()), "--draft", "8"]
    calls = [json.loads(line) for line in argv_file.read_text().splitlines()]
    assert len(calls) == 3  # warm-up + 2 repeats, one process each
    assert calls[0][calls[0].index("-n") + 1] == "8" and calls[1][calls[1].index("-n") + 1] == "6"
    assert run["prompts"][0]["predicted_n"] == 8  # overshoot is kept as measured
    assert_no_strays(pids)  # the child each fake left behind was killed with its group


def test_old_build_text_is_the_generation_only(tmp_path: Path, target: Path) -> None:
    bin_dir, pids, _ = make_old_build(tmp_path, "ok")
    m = measure(
        find_llama(bin_dir), HOST, Config(spec_type="ngram-simple", k=8), target, None,
        load_workload(("code",)).head(1), Settings(repeats=1, warmup=False, engine=LOOKUP),
        eog_texts=("</s>",),
    )  # fmt: skip
    assert m.ok, m.failure
    s = m.prompts[0].samples[0]
    assert (s.content, s.stop_type, s.tokens) == (" a b a b a b", "eos", ())
    assert (s.predicted_n, s.predicted_ms, s.draft_n, s.draft_n_accepted) == (66, 50.0, 6, 4)
    assert m.engine == LOOKUP and m.speculative_active is True
    assert_no_strays(pids)


def test_hanging_tool_times_out_and_leaves_no_process(tmp_path: Path, target: Path) -> None:
    bin_dir, pids, _ = make_old_build(tmp_path, "hang", SPECULATIVE, HELP_2025)
    draft = target  # any file: the fake never reads it
    start = time.monotonic()
    m = measure(
        find_llama(bin_dir), HOST, Config(spec_type="draft-simple", k=4), target, draft,
        load_workload(("code",)).head(1),
        Settings(repeats=1, warmup=False, engine=SPECULATIVE, startup_timeout=1.0,
                 request_timeout=1.0),
    )  # fmt: skip
    assert time.monotonic() - start < 20
    assert m.failure is not None and m.failure.kind == "timeout"
    assert str(m.failure).startswith("llama-speculative did not finish within 2 s: ")
    assert m.failure.llama_message == "main: llama backend init"
    assert_no_strays(pids)


def test_crashing_tool_is_recorded_with_llama_message(
    tmp_path: Path, target: Path, specreg_home: Path
) -> None:
    bin_dir, pids, _ = make_old_build(tmp_path, "oom", SPECULATIVE, HELP_2025)
    args = [
        "run", str(target), "--draft", str(target), "--engine", "legacy", "--llama-bin",
        str(bin_dir), "--repeat", "1", "--n-predict", "4",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    with opened(specreg_home / "registry.duckdb") as con:
        (run,) = list_runs(con)
    assert (run.status, run.error_kind) == ("failed", "oom")
    assert run.llama_message == (
        "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 68719476736"
    )
    assert run.error is not None and run.error.startswith(
        "llama-speculative was killed by signal 6 (crash): "
    )
    assert_no_strays(pids)


def test_tool_without_statistics_is_a_failure(tmp_path: Path, target: Path) -> None:
    bin_dir, pids, _ = make_old_build(tmp_path, "quiet")
    m = measure(
        find_llama(bin_dir), HOST, Config(spec_type="ngram-simple"), target, None,
        load_workload(("code",)).head(1), Settings(repeats=1, warmup=False, engine=LOOKUP),
    )  # fmt: skip
    assert m.failure is not None and m.failure.kind == "crash"
    assert str(m.failure).startswith("llama-lookup exited without its statistics: ")
    assert_no_strays(pids)


def test_missing_binary_is_a_recorded_failure(tmp_path: Path, target: Path) -> None:
    # The build listed llama-lookup when probed, and it is gone when the run starts.
    bin_dir, _, _ = make_old_build(tmp_path, "ok")
    old = find_llama(bin_dir)
    (bin_dir / LOOKUP).unlink()
    m = measure(
        old, HOST, Config(spec_type="ngram-simple"), target, None,
        load_workload(("code",)).head(1), Settings(repeats=1, engine="auto"),
    )  # fmt: skip
    assert m.engine == LOOKUP and m.failure is not None and m.failure.kind == "crash"
    assert str(m.failure).startswith(
        f"cannot run llama-lookup: cannot run {bin_dir / LOOKUP}: No such file or directory"
    )


def test_old_build_without_lookup_is_a_usage_error(tmp_path: Path, target: Path) -> None:
    bin_dir, _, _ = make_old_build(tmp_path, "ok", SPECULATIVE, HELP_2025)
    result = CliRunner().invoke(
        cli, ["run", str(target), "--spec-type", "ngram-mod", "--llama-bin", str(bin_dir)]
    )
    assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2
    assert str(result.exception) == (
        "this llama.cpp (4000 (old), draft-max dialect) lacks ngram-mod in llama-server and "
        f"has no llama-lookup in {bin_dir}: build llama-lookup too, or use `specreg llama build`"
    )


# -- real binaries ----------------------------------------------------------------------------

N_PREDICT = 32
THREADS = 1  # behaviour, not speed: one thread is steadier on a shared 2-core host


@pytest.fixture
def con(specreg_home: Path):  # type: ignore[no-untyped-def]
    with opened(specreg_home / "registry.duckdb") as c:
        yield c


def plan(con, install, target, draft, config, engine="legacy", task="code", force=False):  # type: ignore[no-untyped-def]
    spec = runs.RunSpec(
        target, draft, config.with_(threads=THREADS), load_workload((task,)).head(1), task=task
    )
    settings = Settings(n_predict=N_PREDICT, repeats=1, retries=0, engine=engine)
    return runs.plan(con, install, detect_host(), spec, settings, force=force)


@pytest.mark.llama
def test_real_speculative_self_draft_verifies_as_text(
    con, llama_install: LlamaInstall, self_draft: tuple[Path, Path]
) -> None:  # type: ignore[no-untyped-def]
    target, draft = self_draft
    p = plan(con, llama_install, target, draft, Config(spec_type="draft-simple", k=4))
    assert p.engine == SPECULATIVE
    out = runs.verify(con, p)
    v = out.verification
    assert v.baseline.engine == "server" and v.config.engine == SPECULATIVE
    assert v.config.ok, v.config.failure
    assert v.config.draft_n > 0 and v.config.draft_n_accepted > 0
    assert v.speedup is not None and v.speedup > 0
    assert v.prompts[0].verdict in ("text-identical", "text-diverged", "near-tie")
    text = v.config.prompts[0].samples[0].content
    assert text and "<bos>" not in text and PROMPT_HEAD not in text
    if v.passed:
        assert "prints text, not tokens" in v.reason
    else:
        assert "output text differs from the baseline" in v.reason
    ties = [p for p in v.prompts if p.verdict == "near-tie"]
    assert all(p.margin is not None and p.margin <= 0.10 for p in ties)
    assert ("equivalent up to numerics" in v.reason) == (bool(ties) and v.passed)
    record = get_run(con, out.run_id)
    assert record.config["engine"] == SPECULATIVE
    assert record.argv[0].endswith("/llama-speculative") and "--spec-draft-n-max" in record.argv


PROMPT_HEAD = "Write a Python function"


@pytest.mark.llama
def test_real_lookup_speculates_on_repetitive_text(
    con, llama_install: LlamaInstall, small_models: SmallModels
) -> None:  # type: ignore[no-untyped-def]
    cfg = Config(spec_type="ngram-simple", k=8)
    p = plan(con, llama_install, small_models.gemma3.path, None, cfg, task="summarize")
    m = runs.run(con, p).measurement
    assert m.ok, m.failure
    assert m.engine == LOOKUP and m.draft_n > 0
    assert m.tokens_per_s and m.tokens_per_s > 1


@pytest.mark.llama
def test_real_cross_family_draft_fails_with_llama_message(
    con, llama_install: LlamaInstall, small_models: SmallModels
) -> None:  # type: ignore[no-untyped-def]
    cfg = Config(spec_type="draft-simple", k=4)
    # force: the auditor refuses this pair before llama.cpp starts; forced, llama.cpp says why.
    gemma3, smollm2 = small_models.gemma3.path, small_models.smollm2.path
    p = plan(con, llama_install, gemma3, smollm2, cfg, force=True)
    record = get_run(con, runs.run(con, p).run_id)
    assert (record.status, record.error_kind) == ("failed", "spec-init")
    assert record.llama_message == (
        "main: draft model bos tokens must match target model to use speculation. "
        "add: 1 - 0, id: 2 - 1)"
    )
    assert record.config["engine"] == SPECULATIVE


@pytest.mark.llama
def test_real_auto_picks_lookup_on_an_old_server(
    con, tmp_path: Path, llama_bin: Path, small_models: SmallModels
) -> None:  # type: ignore[no-untyped-def]
    # An old build: its llama-server knows only --draft-max; the real tools sit next to it.
    bin_dir = tmp_path / "old"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text(FAKE_SERVER.format(python=sys.executable))
    server.chmod(0o755)
    for tool in (LOOKUP, SPECULATIVE):
        (bin_dir / tool).symlink_to(llama_bin / tool)
    old = find_llama(bin_dir)
    assert old.dialect == DIALECT_DRAFT_MAX
    cfg = Config(spec_type="ngram-simple", k=8)
    p = plan(con, old, small_models.gemma3.path, None, cfg, engine="auto", task="summarize")
    assert p.engine == LOOKUP
    assert p.notes[0].startswith("ngram-simple runs on llama-lookup")
    m = runs.run(con, p).measurement
    assert m.ok, m.failure
    assert m.draft_n > 0 and m.install.dialect == DIALECT_DRAFT_MAX
