"""The llama-perplexity wrapper against a fake binary (the process boundary): the logits
cache (written once, reused, invalidated when the text or the build changes, its size
checked before writing), timeouts that kill the process group, and the tool's own errors
after which it still exits 0."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from specreg.cli.main import error_line
from specreg.errors import UsageError
from specreg.host.machine import detect_host
from specreg.llama.install import DIALECT_SPEC_TYPE, LlamaInstall
from specreg.llama.perplexity import (
    LogitsCache,
    Perplexity,
    PerplexityFailed,
    build_id,
    logits_key,
)

FAKE = r"""#!{python}
import os, struct, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_PPL_CALLS"], "a") as fh:
    fh.write(" ".join(args) + "\n")
with open(os.environ["FAKE_PPL_CALLS"] + ".pid", "w") as fh:
    fh.write(str(os.getpid()))
mode = os.environ.get("FAKE_PPL_MODE", "ok")
if mode == "hang":
    time.sleep(120)
if mode == "short":
    sys.stderr.write("0.00.233.435 E perplexity: you need at least 256 tokens to evaluate "
                     "perplexity with a context of 128\n"
                     "0.00.233.450 E perplexity: the data file you provided tokenizes to only "
                     "40 tokens\n")
    sys.exit(0)
ctx = int(args[args.index("-c") + 1])
base = args[args.index("--kl-divergence-base") + 1]
if "--kl-divergence" in args:
    if mode == "vocab":
        sys.stderr.write("0.00.500.000 E kl_divergence: inconsistent vocabulary (16 vs 20)\n")
    print("chunk  PPL  ln(PPL(Q)/PPL(base))  KL Divergence  Δp RMS  Same top p")
    print("   1      9.0000 ±    1.0000       0.10000 ±    0.01000       0.20000 ±    0.02000"
          "     5.000 ±  1.000 %    80.000 ±  4.000 %")
    sys.exit(0)
n_vocab, n_chunk = 16, 2
nv = 2 * ((n_vocab + 1) // 2) + 4
with open(base, "wb") as fh:
    fh.write(b"_logits_" + struct.pack("<Iii", ctx, n_vocab, n_chunk))
    fh.write(struct.pack("<%di" % (n_chunk * ctx), *range(n_chunk * ctx)))
    fh.write(bytes(2 * nv * n_chunk * (ctx - 1 - ctx // 2)))
sys.stderr.write("0.00.300.000 I Final estimate: PPL = 12.5000 +/- 0.50000\n")
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LlamaInstall:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "llama-perplexity"
    tool.write_text(FAKE.replace("{python}", sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_PPL_CALLS", str(tmp_path / "calls.txt"))
    return LlamaInstall(
        bin_dir=bin_dir, source="test", version="fake", dialect=DIALECT_SPEC_TYPE,
        spec_types=("none",), binaries=("llama-perplexity",),
    )  # fmt: skip


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_saved_logits_are_cached_and_invalidated(fake: LlamaInstall, tmp_path: Path) -> None:
    tool = Perplexity(fake, detect_host(), threads=1)
    cache = LogitsCache(tmp_path / "cache")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    text = tmp_path / "mine.txt"
    text.write_text("a text " * 200)
    said: list[str] = []

    def key(sha: str) -> object:
        return logits_key(model, "m1", "mine", sha, build_id(fake), 8, None)

    first = cache.ensure(tool, key("aaa"), text, 16, notify=said.append)  # type: ignore[arg-type]
    assert not first.cached and first.ppl == 12.5 and first.n_tokens == 2 * 3
    assert said == [f"saving the logits of model.gguf over mine: about 8.8 KB in {cache.root}"]
    again = cache.ensure(tool, key("aaa"), text, 16)  # type: ignore[arg-type]
    assert again.cached and again.path == first.path and again.ppl == 12.5
    assert len(calls(tmp_path)) == 1
    # Another text (same name, new content): a new file, and the stale one is gone.
    changed = cache.ensure(tool, key("bbb"), text, 16)  # type: ignore[arg-type]
    assert not changed.cached and changed.path != first.path and not first.path.exists()
    # A rebuilt llama.cpp: another build id, so the logits are written again.
    before = build_id(fake)
    binary = fake.bin_dir / "llama-perplexity"
    os.utime(binary, ns=(time.time_ns(), binary.stat().st_mtime_ns + 10**9))
    assert build_id(fake) != before
    cache.ensure(tool, key("bbb"), text, 16)  # type: ignore[arg-type]
    assert len(calls(tmp_path)) == 3
    assert sorted(p.suffix for p in cache.root.iterdir()) == [".json", ".kld"]


def test_a_file_over_the_limit_is_refused_before_writing(
    fake: LlamaInstall, tmp_path: Path
) -> None:
    tool = Perplexity(fake, detect_host(), threads=1)
    text = tmp_path / "big.txt"
    text.write_text("word " * 300_000)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    key = logits_key(model, "m1", "big", "sha", build_id(fake), 512, None)
    with pytest.raises(UsageError) as err:
        LogitsCache(tmp_path / "cache").ensure(tool, key, text, 262144, max_bytes=10**9)
    assert error_line(err.value) == (  # as the CLI says it; the core says `chunks`
        "the saved logits of model.gguf over big would take about 130.5 GB (n_vocab 262144 x "
        "about 248887 tokens x 2 bytes), over the 1.0 GB limit: pass --chunks N (each scores "
        "255 tokens) or raise --max-logits-gb"
    )
    assert calls(tmp_path) == []


def test_a_hanging_tool_is_killed_with_its_group(
    fake: LlamaInstall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PPL_MODE", "hang")
    tool = Perplexity(fake, detect_host(), threads=1, timeout=2)
    t0 = time.monotonic()
    with pytest.raises(PerplexityFailed) as err:
        tool.save_logits(tmp_path / "m.gguf", tmp_path / "t.txt", tmp_path / "out.kld", ctx=8)
    assert err.value.kind == "timeout" and time.monotonic() - t0 < 30
    assert "llama-perplexity did not finish within 2 s" in str(err.value)
    pid = int((tmp_path / "calls.txt.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not list(tmp_path.glob("out.kld*"))


def test_too_short_a_text_is_a_failure_although_the_tool_exits_0(
    fake: LlamaInstall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PPL_MODE", "short")
    tool = Perplexity(fake, detect_host(), threads=1)
    with pytest.raises(PerplexityFailed) as err:
        tool.save_logits(tmp_path / "m.gguf", tmp_path / "t.txt", tmp_path / "out.kld", ctx=128)
    assert err.value.kind == "text"
    assert str(err.value).startswith(
        "t.txt has only 40 tokens: llama-perplexity needs at least 256"
    )


def test_numbers_printed_beside_inconsistent_vocabulary_are_refused(
    fake: LlamaInstall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = Perplexity(fake, detect_host(), threads=1)
    base = tool.save_logits(tmp_path / "m.gguf", tmp_path / "t.txt", tmp_path / "b.kld", ctx=8)
    ok = tool.kl_divergence(tmp_path / "d.gguf", tmp_path / "t.txt", base.path)
    assert ok.stats.same_top == pytest.approx(0.8) and not ok.stats.complete
    assert ok.n_tokens == 6 and "--kl-divergence" in ok.argv
    monkeypatch.setenv("FAKE_PPL_MODE", "vocab")
    with pytest.raises(PerplexityFailed) as err:
        tool.kl_divergence(tmp_path / "d.gguf", tmp_path / "t.txt", base.path)
    assert err.value.kind == "vocab"
    assert "inconsistent vocabulary (16 vs 20)" in str(err.value)
