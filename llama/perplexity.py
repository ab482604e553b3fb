"""llama-perplexity as a managed child process: save a model's logits, compare another's.

Two calls of the build's own tool do all the measuring (tools/perplexity/perplexity.cpp):

* `llama-perplexity -m REF -f TEXT -c CTX --kl-divergence-base FILE` saves REF's
  log-probabilities over TEXT (about n_vocab x scored tokens x 2 bytes: stated, and checked
  against a limit, before it is written) and prints REF's perplexity;
* `llama-perplexity -m OTHER -f TEXT --kl-divergence-base FILE --kl-divergence` prints the
  mean KL divergence of OTHER from REF with its uncertainty, its percentiles, "Same top p"
  and both perplexities.

Each call is one process in its own process group (killed as a whole on timeout, Ctrl-C or
any error, and with specreg), stderr logged. The tool exits 0 after most of its own errors
(too short a text, an unreadable base file), so success is judged by its output, and a
failure carries llama.cpp's own line.

Saved logits are cached per model file, text, build, chunk length and configuration
(`LogitsCache`): any change gives a new key, and the stale file for the same model and text
is removed when the new one is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specreg.errors import UsageError, param
from specreg.home import cache_dir, logs_dir
from specreg.host.machine import Host
from specreg.llama.install import LlamaInstall
from specreg.llama.logits import LogitsHeader, logits_file_bytes, read_header, scored_per_chunk
from specreg.llama.process import (
    ServerFailed,
    classify_exit,
    exit_how,
    llama_message,
    run_tool,
)
from specreg.llamacpp import Flag, PerplexityFlag, Tool

log = logging.getLogger(__name__)

PERPLEXITY = Tool.PERPLEXITY
DEFAULT_CTX = 128  # chunk length: scores 63 tokens per chunk, the second half of each
DEFAULT_TIMEOUT_S = 900.0
# A saved-logits file larger than this is refused unless the caller raises the limit.
DEFAULT_MAX_LOGITS_BYTES = 1 << 30
# Tokens per byte of text, for the size stated before the tokenizer has run: dense text
# (code, JSON) tokenizes at about 3 bytes a token, prose at about 4.
BYTES_PER_TOKEN_ESTIMATE = 3.0
# llama-perplexity prints its summary block only from this many scored tokens on.
MIN_TOKENS_FOR_STATISTICS = 100

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|nan|inf)"
_PM = rf"({_NUM})\s*±\s*({_NUM})"
# The summary's figures (each with its uncertainty), by the `KldStats` field they fill; those
# printed in % are kept as shares.
_FINAL = {
    "ppl": re.compile(rf"^Mean PPL\(Q\)\s*:\s*{_PM}", re.M),
    "ppl_base": re.compile(rf"^Mean PPL\(base\)\s*:\s*{_PM}", re.M),
    "ln_ppl_ratio": re.compile(rf"^Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*{_PM}", re.M),
    "mean_kld": re.compile(rf"^Mean\s+KLD:\s*{_PM}", re.M),
    "rms_dp": re.compile(rf"^RMS Δp\s*:\s*{_PM}\s*%", re.M),
    "same_top": re.compile(rf"^Same top p:\s*{_PM}\s*%", re.M),
}
_PERCENT = ("rms_dp", "same_top")
_PERCENTILES = {
    "max": "Maximum",
    "p999": r"99\.9%",
    "p99": r"99\.0%",
    "p95": r"95\.0%",
    "p90": r"90\.0%",
    "median": "Median",
}
# One row per chunk: PPL(Q), ln(PPL(Q)/PPL(base)), KLD, RMS Δp %, same top p %, each ± unc.
_CHUNK_ROW = re.compile(rf"^\s*\d+\s+{_PM}\s+{_PM}\s+{_PM}\s+{_PM}\s*%\s+{_PM}\s*%\s*$", re.M)
_FINAL_PPL = re.compile(rf"Final estimate: PPL = ({_NUM}) \+/- ({_NUM})")
# The tool's own errors after which it still exits 0.
TOO_SHORT = re.compile(r"you need at least (\d+) tokens[^\n]*")
ONLY_TOKENS = re.compile(r"tokenizes to only (\d+) tokens")
INCONSISTENT_VOCAB = re.compile(r"inconsistent vocabulary[^\n]*")
BAD_BASE = re.compile(
    r"does not look like a file containing log-probabilities|failed to open \S+|"
    r"failed reading [^\n]*|has been computed with \d+[^\n]*"
)

HINTS = {
    "text": "use a longer text, or a smaller --ctx",
    "vocab": "compare models with the same vocabulary, or use saved logits over shared ids",
    "base": "delete the cached logits file so it is written again",
}


class PerplexityFailed(ServerFailed):
    """llama-perplexity failed; `kind` says how, `llama_message` is llama.cpp's own line."""

    def __init__(
        self,
        kind: str,
        summary: str,
        message: str,
        log_path: Path | None,
        returncode: int | None = None,
    ):
        super().__init__(kind, summary, message, log_path, returncode)
        if kind in HINTS:
            detail = f": {message}" if message else ""
            # what is wrong is the text or the models, said in full: no log to read
            self.args = (f"{summary}{detail}; {HINTS[kind]}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class KldStats:
    """What `llama-perplexity --kl-divergence` printed. Shares are 0..1.

    `complete` is False when fewer than 100 tokens were scored: the tool then prints only
    its per-chunk rows (no percentiles, no base perplexity).
    """

    mean_kld: float
    mean_kld_unc: float
    same_top: float
    same_top_unc: float
    ppl: float
    ppl_unc: float
    ln_ppl_ratio: float
    ln_ppl_ratio_unc: float
    rms_dp: float
    rms_dp_unc: float
    ppl_base: float | None = None
    ppl_base_unc: float | None = None
    percentiles: dict[str, float] = field(default_factory=dict)
    complete: bool = True

    @property
    def kld_p99(self) -> float | None:
        return self.percentiles.get("p99")


def _float(text: str) -> float:
    return float(text)  # python reads nan, inf, -nan's sign aside


def parse_kld(stdout: str) -> KldStats | None:
    """The statistics from `--kl-divergence` output, or None if it printed none."""
    figures: dict[str, Any] = {}
    for name, rx in _FINAL.items():
        m = rx.search(stdout)
        if m is not None:
            scale = 100 if name in _PERCENT else 1
            figures[name], figures[f"{name}_unc"] = _float(m[1]) / scale, _float(m[2]) / scale
    if len(figures) == 2 * len(_FINAL):
        pct = {}
        for name, label in _PERCENTILES.items():
            m = re.search(rf"^\s*{label}\s+KLD:\s*({_NUM})", stdout, re.M)
            if m:
                pct[name] = _float(m.group(1))
        return KldStats(**figures, percentiles=pct)
    rows = _CHUNK_ROW.findall(stdout)
    if not rows:
        return None
    v = [_float(x) for x in rows[-1]]  # cumulative over every chunk so far
    return KldStats(
        ppl=v[0], ppl_unc=v[1], ln_ppl_ratio=v[2], ln_ppl_ratio_unc=v[3],
        mean_kld=v[4], mean_kld_unc=v[5], rms_dp=v[6] / 100, rms_dp_unc=v[7] / 100,
        same_top=v[8] / 100, same_top_unc=v[9] / 100, complete=False,
    )  # fmt: skip


def parse_saved_ppl(log_text: str) -> tuple[float, float] | None:
    """The reference's perplexity (and its uncertainty) from a `--kl-divergence-base` run."""
    m = _FINAL_PPL.search(log_text)
    return (_float(m.group(1)), _float(m.group(2))) if m else None


def failure_of(
    output_text: str, rc: int, log_path: Path, text_file: Path | None = None
) -> PerplexityFailed:
    """The failure a llama-perplexity run that produced no result stands for."""
    name = PERPLEXITY
    short = TOO_SHORT.search(output_text)
    if short:
        only = ONLY_TOKENS.search(output_text)
        what = text_file.name if text_file else "the text"
        got = f"only {only.group(1)} tokens" if only else "too few tokens"
        return PerplexityFailed(
            "text",
            f"{what} has {got}: {name} needs at least {short.group(1)} (2 x the chunk length)",
            llama_message(output_text, TOO_SHORT),
            log_path,
        )
    vocab = INCONSISTENT_VOCAB.search(output_text)
    if vocab:
        return PerplexityFailed("vocab", f"{name} saw two vocabularies", vocab.group(0), log_path)
    base = BAD_BASE.search(output_text)
    if base:
        return PerplexityFailed(
            "base", f"{name} cannot use the saved logits", llama_message(output_text, BAD_BASE),
            log_path,
        )  # fmt: skip
    if rc == 0:
        return PerplexityFailed(
            "crash", f"{name} printed no result", llama_message(output_text), log_path
        )
    how = exit_how(rc)
    return PerplexityFailed(
        classify_exit(output_text, rc), f"{name} {how}", llama_message(output_text), log_path, rc
    )


_BUILD_IDS: dict[tuple[str, int, int], str] = {}


def build_id(install: LlamaInstall) -> str:
    """What identifies the build's numerics: llama-perplexity and the libraries next to it
    (name, size, modification time). Any rebuild changes it."""
    binary = install.bin_dir / PERPLEXITY
    try:
        st = binary.stat()
    except OSError:
        return f"{install.version}|missing"
    key = (str(binary), st.st_size, st.st_mtime_ns)
    if key not in _BUILD_IDS:
        digest = hashlib.sha256(install.version.encode())
        libs = sorted({p.resolve() for p in install.bin_dir.glob("lib*.so*") if p.is_file()})
        for path in (binary, *libs):
            s = path.stat()
            digest.update(f"{path.name}:{s.st_size}:{s.st_mtime_ns};".encode())
        _BUILD_IDS[key] = digest.hexdigest()[:16]
    return _BUILD_IDS[key]


@dataclass(frozen=True)
class SavedLogits:
    """A model's saved log-probabilities over one text."""

    path: Path
    header: LogitsHeader
    ppl: float | None
    ppl_unc: float | None
    cached: bool  # reused from the cache, nothing ran
    seconds: float
    argv: tuple[str, ...] = ()

    @property
    def n_tokens(self) -> int:
        return self.header.n_scored


@dataclass(frozen=True)
class KldRun:
    stats: KldStats
    n_tokens: int  # scored positions (from the base file)
    n_chunks: int
    ctx: int
    seconds: float
    argv: tuple[str, ...]
    log_path: Path


def override_flags(overrides: Sequence[str]) -> list[str]:
    out: list[str] = []
    for kv in overrides:
        out += [Flag.OVERRIDE_KV, kv]
    return out


class Perplexity:
    """The build's llama-perplexity, set up for one host, thread count and time limit."""

    def __init__(
        self,
        install: LlamaInstall,
        host: Host,
        *,
        threads: int | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        log_path: Path | None = None,
    ):
        self.binary = install.binary(PERPLEXITY)
        self.install = install
        self.host = host
        self.threads = threads or host.threads
        self.timeout = timeout
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        self.log_path = log_path or logs_dir() / f"{PERPLEXITY}-{stamp}.log"

    @property
    def build(self) -> str:
        return build_id(self.install)

    def command(
        self, model: Path, text_file: Path, ctx: int, extra: Sequence[str] = ()
    ) -> list[str]:
        return [
            *self.host.launch_prefix(),
            str(self.binary),
            Flag.MODEL, str(model), Flag.PROMPT_FILE, str(text_file), Flag.CTX, str(ctx),
            Flag.THREADS, str(self.threads), *extra,
        ]  # fmt: skip

    def _run(self, argv: list[str]) -> tuple[int, str, str, float]:
        try:
            out = run_tool(argv, env=self.host.env(), log_path=self.log_path, timeout=self.timeout)
        except PerplexityFailed:
            raise
        except ServerFailed as err:  # it could not start, or outlived the timeout
            raise PerplexityFailed(err.kind, err.summary, err.llama_message, err.log_path) from err
        return out.returncode, out.stdout, out.log_text, out.wall_s

    def save_logits(
        self,
        model: Path,
        text_file: Path,
        out: Path,
        *,
        ctx: int = DEFAULT_CTX,
        chunks: int | None = None,
        overrides: Sequence[str] = (),
    ) -> SavedLogits:
        """Write `model`'s logits over `text_file` to `out` (atomically). Raises
        `PerplexityFailed` with llama.cpp's line."""
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".part")
        extra = [PerplexityFlag.KLD_BASE, str(tmp), *override_flags(overrides)]
        if chunks is not None:
            extra += [PerplexityFlag.CHUNKS, str(chunks)]
        argv = self.command(model, text_file, ctx, extra)
        try:
            rc, stdout, log_text, wall = self._run(argv)
            ppl = parse_saved_ppl(log_text)
            if rc != 0 or not tmp.exists() or ppl is None:
                raise failure_of(stdout + "\n" + log_text, rc, self.log_path, text_file)
            read_header(tmp)  # complete and well-formed before it takes the cached name
            tmp.replace(out)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return SavedLogits(
            path=out,
            header=read_header(out),
            ppl=ppl[0],
            ppl_unc=ppl[1],
            cached=False,
            seconds=wall,
            argv=tuple(argv),
        )

    def kl_divergence(
        self, model: Path, text_file: Path, base: Path, *, overrides: Sequence[str] = ()
    ) -> KldRun:
        """`model` (with `overrides`) against the saved `base` logits. The pair must share
        one vocabulary: a differing one is refused here, before llama-perplexity prints
        numbers that mean nothing."""
        header = read_header(base)
        extra = [PerplexityFlag.KLD_BASE, str(base), PerplexityFlag.KLD, *override_flags(overrides)]
        argv = self.command(model, text_file, header.n_ctx, extra)
        rc, stdout, log_text, wall = self._run(argv)
        text = stdout + "\n" + log_text
        stats = parse_kld(stdout) if rc == 0 else None
        if stats is None or INCONSISTENT_VOCAB.search(log_text):
            raise failure_of(text, rc, self.log_path, text_file)
        return KldRun(
            stats=stats,
            n_tokens=header.n_scored,
            n_chunks=header.n_chunk,
            ctx=header.n_ctx,
            seconds=wall,
            argv=tuple(argv),
            log_path=self.log_path,
        )


# --- the cache of saved logits --------------------------------------------------------------


def estimated_tokens(text_bytes: int, ctx: int, chunks: int | None) -> int:
    """Scored tokens a text will give, before tokenizing it (exact when `chunks` caps it)."""
    n_chunk = int(text_bytes / BYTES_PER_TOKEN_ESTIMATE) // ctx
    if chunks is not None:
        n_chunk = min(n_chunk, chunks)
    return max(1, n_chunk) * scored_per_chunk(ctx)


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


@dataclass(frozen=True)
class LogitsKey:
    """Everything saved logits depend on; any change is another file."""

    model_path: str
    model_size: int
    model_mtime_ns: int
    model_id: str | None
    text_name: str
    text_sha256: str
    build: str
    ctx: int
    chunks: int | None
    overrides: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        raw = json.dumps(self.__dict__, sort_keys=True, default=list)
        return hashlib.sha256(raw.encode()).hexdigest()[:20]

    @property
    def slot(self) -> str:
        """The file-name prefix of this model and text: one live file per slot."""
        where = hashlib.sha256(self.model_path.encode()).hexdigest()[:8]
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.model_path).stem)[:60]
        text = re.sub(r"[^A-Za-z0-9._-]+", "_", self.text_name)[:40]
        return f"{stem}-{where}.{text}.c{self.ctx}"


def logits_key(
    model: Path,
    model_id: str | None,
    text_name: str,
    text_sha256: str,
    build: str,
    ctx: int,
    chunks: int | None,
    overrides: Sequence[str] = (),
) -> LogitsKey:
    path = Path(model).resolve()
    st = path.stat()
    return LogitsKey(
        str(path), st.st_size, st.st_mtime_ns, model_id, text_name, text_sha256, build, ctx,
        chunks, tuple(overrides),
    )  # fmt: skip


class LogitsCache:
    """Saved logits under `cache_dir()/logits`, one live file per model, text and ctx."""

    def __init__(self, root: Path | None = None):
        self.root = root or cache_dir() / "logits"

    def path(self, key: LogitsKey) -> Path:
        return self.root / f"{key.slot}.{key.digest}.kld"

    def lookup(self, key: LogitsKey) -> SavedLogits | None:
        path = self.path(key)
        if not path.exists():
            return None
        try:
            header = read_header(path)
            meta = json.loads(path.with_suffix(".json").read_text())
        except (UsageError, OSError, ValueError):
            log.warning("ignoring a damaged cached logits file %s", path)
            return None
        return SavedLogits(
            path, header, meta.get("ppl"), meta.get("ppl_unc"), cached=True, seconds=0.0
        )

    def ensure(
        self,
        tool: Perplexity,
        key: LogitsKey,
        text_file: Path,
        n_vocab: int,
        *,
        max_bytes: int = DEFAULT_MAX_LOGITS_BYTES,
        notify: Callable[[str], None] | None = None,
    ) -> SavedLogits:
        """The cached logits for `key`, written first if missing (after stating their size and
        checking it against `max_bytes`)."""
        found = self.lookup(key)
        if found is not None:
            return found
        size = planned_size(n_vocab, text_file, key.ctx, key.chunks)
        what = f"{Path(key.model_path).name} over {key.text_name}"
        if size > max_bytes:
            raise UsageError(
                f"the saved logits of {what} would take about {human_size(size)} (n_vocab "
                f"{n_vocab} x about {size // (2 * n_vocab)} tokens x 2 bytes), over the "
                f"{human_size(max_bytes)} limit: pass {param('chunks', 'N')} (each scores "
                f"{scored_per_chunk(key.ctx)} tokens) or raise {param('max_logits_gb')}"
            )
        if notify:
            notify(f"saving the logits of {what}: about {human_size(size)} in {self.root}")
        path = self.path(key)
        saved = tool.save_logits(
            Path(key.model_path), text_file, path, ctx=key.ctx, chunks=key.chunks,
            overrides=key.overrides,
        )  # fmt: skip
        meta = {**key.__dict__, "ppl": saved.ppl, "ppl_unc": saved.ppl_unc}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=list) + "\n")
        self._drop_stale(key, keep=path)
        return saved

    def _drop_stale(self, key: LogitsKey, keep: Path) -> None:
        """Older files of the same model, text and ctx: written before something changed."""
        for old in self.root.glob(f"{glob_escape(key.slot)}.*.kld"):
            if old != keep:
                for p in (old, old.with_suffix(".json")):
                    with contextlib.suppress(OSError):
                        p.unlink()


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def planned_size(n_vocab: int, text_file: Path, ctx: int, chunks: int | None) -> int:
    n_tokens = estimated_tokens(os.path.getsize(text_file), ctx, chunks)
    n_chunk = max(1, math.ceil(n_tokens / scored_per_chunk(ctx)))
    return logits_file_bytes(n_vocab, n_chunk, ctx)
