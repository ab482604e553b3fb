"""Bad input to `specreg quality` and `specreg agree` gets one line that says what to do and
exit code 2, before llama.cpp is even looked for."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.cli import specreg_without_llama as specreg
from support.fixtures import MOE_KV


@pytest.fixture
def models(gguf_factory):  # type: ignore[no-untyped-def]
    return {
        "dense": gguf_factory("dense.gguf"),
        "moe": gguf_factory("moe.gguf", arch="qwen3moe", kv=MOE_KV),
        "moe_q8": gguf_factory("moe-q8.gguf", arch="qwen3moe", kv=MOE_KV),
        "other": gguf_factory("other.gguf", tokens=[f"x{i}" for i in range(70)]),
    }


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_quality_bad_input_gets_one_line(models: dict[str, Path]) -> None:
    assert error_line(specreg("quality", str(models["dense"]), "--experts", "2")) == (
        "error: dense.gguf is a dense model (llama): --experts applies to mixture-of-experts "
        "models only"
    )
    assert error_line(specreg("quality", str(models["moe"]), "--experts", "9")) == (
        "error: --experts 9 is more than the 8 experts moe.gguf has: use 1 to 8 (default 2)"
    )
    assert error_line(
        specreg("quality", str(models["moe"]), "--against", str(models["other"]))
    ) == (
        "error: other.gguf has another tokenizer than moe.gguf (70 vs 64 ids): --against "
        "needs the same model at another quantization"
    )
    assert error_line(specreg("quality", str(models["moe"]))).startswith(
        "error: nothing to compare: pass --experts N (fewer MoE experts) or --against"
    )
    # Every task the option offers has a shipped text (issue 25, point 10: `--task summarize`
    # was offered, then refused); a word that is no task is a usage error.
    assert error_line(
        specreg("quality", str(models["moe"]), "--experts", "1", "--task", "nosuch")
    ) == (
        "error: Invalid value for '--task': 'nosuch' is not one of 'code', 'prose', 'summarize', "
        "'json', 'math', 'chat', 'general', 'mixed', 'summary' (see `specreg quality --help`)"
    )
    assert (
        error_line(
            specreg("quality", str(models["moe"]), "--experts", "1", "--text", "/nonexistent.txt")
        )
        == "error: cannot read the text /nonexistent.txt: No such file or directory"
    )


def test_a_good_request_gets_as_far_as_llama_cpp(models: dict[str, Path]) -> None:
    r = specreg("quality", str(models["moe"]), "--against", str(models["moe_q8"]), "--experts", "1")
    assert r.returncode == 1 and r.stderr.startswith("error: no executable llama-server in")


def test_agree_bad_input_gets_one_line(models: dict[str, Path]) -> None:
    line = error_line(specreg("agree", str(models["dense"]), str(models["other"])))
    assert line.startswith("error: other.gguf cannot draft for dense.gguf (")
    assert line.endswith("): `specreg compat TARGET DRAFT` explains")
    assert error_line(specreg("agree", str(models["dense"]), str(models["dense"]))) == (
        "error: dense.gguf is the target itself: give another draft"
    )
    assert error_line(specreg("agree", str(models["other"]))) == (
        "error: no draft to measure: the registry has no compatible draft model for other.gguf "
        "(scan one, or pass DRAFT paths)"
    )
    assert error_line(specreg("agree", str(models["moe"]), "--temp", "-1")) == (
        "error: Invalid value for '--temp': -1 is not a number of at least 0 (see `specreg "
        "agree --help`)"
    )


@pytest.mark.parametrize(
    ("command", "tool"),
    [("quality", "llama-perplexity"), ("agree", "llama-server"), ("calibrate", "llama-bench")],
)
def test_a_crash_names_its_log(
    models: dict[str, Path],
    gguf_factory,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    specreg_home: Path,
    command: str,
    tool: str,
) -> None:
    """Issue 41 point 11: the one-line error of a crashed llama.cpp tool says which log holds
    the rest, in every measuring command."""
    import re

    from support.cli import specreg as specreg_with_llama
    from support.fake_server import add_crashing_tool, make_fake

    bin_dir, _ = make_fake(tmp_path, "crash")
    for name in ("llama-perplexity", "llama-bench"):
        add_crashing_tool(bin_dir, name)
    dense = str(models["dense"])
    other = str(gguf_factory("dense-q8.gguf", general_name="dense at another quant"))
    assert specreg_with_llama("scan", dense, other).returncode == 0
    args = {
        "quality": ["quality", dense, "--against", other, "--task", "code", "--chunks", "1"],
        "agree": ["agree", dense, other, "--task", "code", "--chunks", "1"],
        "calibrate": ["calibrate", dense, "--no-drafts"],
    }[command]
    r = specreg_with_llama(*args, "--llama-bin", str(bin_dir))
    assert r.returncode == 1, (r.stdout, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "killed by signal 11" in last, r.stderr
    logs = specreg_home / "logs"
    found = re.search(rf"; see the log ({re.escape(str(logs))}/{tool}-\S+\.log); ", last)
    assert found and Path(found.group(1)).exists(), last
