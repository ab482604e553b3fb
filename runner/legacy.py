"""The legacy llama.cpp example binaries as speculative engines, one process per prompt.

Builds whose llama-server predates n-gram speculation (the `draft-max` dialect) still ship
`llama-lookup`, and `llama-speculative` runs draft-model speculation on every build. Each
prompt is one process: it loads the model(s), echoes the prompt and prints the generation
on stdout, prints its stat block on stderr, and exits. Like llama-server, the process runs
in its own process group that every exit path kills, and dies with specreg.

These tools print text, not token ids: their samples carry the generated text only, and
verification compares text (see `verify`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from specreg.errors import LlamaError, UsageError, param
from specreg.host.machine import Host
from specreg.llama.config import Config, expert_flags
from specreg.llama.install import LlamaInstall, read_help
from specreg.llama.process import (
    ServerFailed,
    ToolOutput,
    classify_exit,
    exit_how,
    llama_message,
    run_tool,
    strip_log_prefix,
)
from specreg.llama.server import Completion
from specreg.llamacpp import SPELLINGS, DraftFlag, Flag, SpecFlag, Tool
from specreg.runner.measurement import Measurement, RunStart, interrupted, prompt_result
from specreg.runner.protocol import Engine, Protocol, Sampler, SamplingInterrupted, collect
from specreg.runner.settings import Settings

# The engine names are specreg.terms' vocabulary, importable from here too.
from specreg.terms import ENGINE_AUTO as ENGINE_AUTO
from specreg.terms import ENGINE_LEGACY as ENGINE_LEGACY
from specreg.terms import ENGINE_SERVER as ENGINE_SERVER
from specreg.terms import ENGINES as ENGINES
from specreg.terms import NGRAM_TYPES, SPEC_DRAFT_SIMPLE

log = logging.getLogger(__name__)

SPECULATIVE = Tool.SPECULATIVE
LOOKUP = Tool.LOOKUP
LEGACY_TOOLS = (SPECULATIVE, LOOKUP)

# Stands for the per-prompt temporary file in the recorded command line.
PROMPT_FILE = "PROMPT.txt"

# llama-speculative's own vocabulary checks end with `return 1` and one of these lines.
VOCAB_MISMATCH = re.compile(r"draft model [^\n]*must (?:closely )?match target model[^\n]*")
# End-of-generation pieces the tools print as text (`common_token_to_piece` with specials);
# the target's own EOS/EOT texts from the registry are tried first.
KNOWN_EOG = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>", "</s>", "<|eot_id|>")

_STAT = {
    "encoded": re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "decoded": re.compile(
        r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s*([\d.]+|inf|nan)"
    ),
    "n_draft": re.compile(r"^n_draft\s*=\s*(\d+)", re.M),
    "n_predict": re.compile(r"^n_predict\s*=\s*(\d+)", re.M),
    "n_drafted": re.compile(r"^n_drafted\s*=\s*(\d+)", re.M),
    "n_accept": re.compile(r"^n_accept\s*=\s*(\d+)", re.M),
    "accept": re.compile(r"^accept\s*=\s*(-?[\d.]+|-?nan|-?inf)%", re.M),
}


@dataclass(frozen=True)
class LegacyStats:
    """The stat block llama-speculative and llama-lookup print when they finish."""

    encoded_n: int
    encoded_s: float
    decoded_n: int
    decoded_s: float
    decoded_tps: float
    n_draft: int
    n_predict: int
    n_drafted: int
    n_accept: int
    accept_pct: float | None  # None when nothing was drafted (the tools print nan)


def parse_stats(log_text: str) -> LegacyStats | None:
    """The stat block from a legacy tool's stderr (log prefixes allowed), or None."""
    text = "\n".join(strip_log_prefix(line) for line in log_text.splitlines())
    found = {name: regex.findall(text) for name, regex in _STAT.items()}
    if not all(found[k] for k in ("encoded", "decoded", "n_drafted", "n_accept")):
        return None
    encoded, decoded = found["encoded"][-1], found["decoded"][-1]
    accept = found["accept"][-1] if found["accept"] else "nan"

    def last_int(name: str, default: int) -> int:
        return int(found[name][-1]) if found[name] else default

    return LegacyStats(
        encoded_n=int(encoded[0]),
        encoded_s=float(encoded[1]),
        decoded_n=int(decoded[0]),
        decoded_s=float(decoded[1]),
        decoded_tps=float(decoded[2]),
        n_draft=last_int("n_draft", 0),
        n_predict=last_int("n_predict", int(decoded[0])),
        n_drafted=last_int("n_drafted", 0),
        n_accept=last_int("n_accept", 0),
        accept_pct=None if "nan" in accept or "inf" in accept else float(accept),
    )


def generated_text(stdout: str, prompt: str, eog_texts: Sequence[str] = ()) -> tuple[str, bool]:
    """(the generation, whether it ended with an end-of-generation piece) from stdout.

    stdout is `\\n\\n`, the prompt's tokens as pieces (for gemma `<bos>` first), the
    generation, then `\\n\\n` twice; -f drops one trailing newline of the prompt file.
    """
    text = stdout.removeprefix("\n\n")
    for _ in range(2):
        text = text.removesuffix("\n\n")
    at = text.find(prompt) if prompt else -1
    if at >= 0:
        text = text[at + len(prompt) :]
    else:
        log.warning("the prompt echo was not found in the output; keeping the whole text")
    for eog in (*eog_texts, *KNOWN_EOG):
        if eog and text.endswith(eog):
            return text[: -len(eog)], True
    return text, False


def legacy_tool(spec_type: str) -> str | None:
    """The legacy binary that implements `spec_type`, if any (none runs a stack)."""
    if spec_type == SPEC_DRAFT_SIMPLE:
        return SPECULATIVE
    if spec_type in NGRAM_TYPES:
        return LOOKUP
    return None


def choose_engine(install: LlamaInstall, config: Config, engine: str = ENGINE_AUTO) -> str:
    """`server`, `llama-speculative` or `llama-lookup` for `config` on this llama.cpp."""
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    where = f"this llama.cpp ({install.version}, {install.dialect} dialect)"
    if not config.speculative:
        if engine == ENGINE_LEGACY:
            raise UsageError(
                f"{param('engine')} legacy needs speculation: plain decoding always runs on "
                "llama-server"
            )
        return ENGINE_SERVER
    tool = legacy_tool(config.spec_type)
    in_server = install.supports(config.spec_type)
    if engine == ENGINE_SERVER or (engine == ENGINE_AUTO and in_server):
        if in_server:
            return ENGINE_SERVER
        hint = f"use {param('engine')} legacy ({tool})" if tool else "use a newer llama.cpp"
        raise UsageError(
            f"{where} has no --spec-type {config.spec_type} in llama-server: {hint}, or choose "
            f"one of {', '.join(install.spec_types) or 'draft-simple'}"
        )
    if tool is None:
        raise UsageError(
            f"{config.spec_type} has no legacy engine (llama-speculative runs draft-simple, "
            f"llama-lookup the n-gram types) and {where} lacks it in llama-server: use a "
            "newer llama.cpp (`specreg llama build`)"
        )
    if tool not in install.binaries:
        raise UsageError(
            f"{where} lacks {config.spec_type} in llama-server and has no {tool} in "
            f"{install.bin_dir}: build {tool} too, or use `specreg llama build`"
        )
    return tool


@dataclass(frozen=True)
class LegacyFlags:
    """How one legacy binary spells the draft-length knobs (from its --help)."""

    n_max: str  # --spec-draft-n-max (2026) | --draft-max (2024-25) | --draft (older lookup)
    n_min: str | None
    p_min: str | None


def parse_legacy_flags(help_text: str) -> LegacyFlags | None:
    """The spelling of the newest dialect whose K flag the help lists (specreg.llamacpp's
    `SPELLINGS`); before --spec-type, the optional knobs only where the help lists them."""

    def has(flag: str | None) -> bool:
        if flag is None:
            return False
        # Removed flags stay in the help text ("the argument has been removed"): ignore them.
        for line in help_text.splitlines():
            if re.search(rf"(^|[\s,]){re.escape(flag)}\b(?!-)", line) and "removed" not in line:
                return True
        return False

    for d in SPELLINGS:
        if not has(d.draft_n_max):
            continue
        if d.spec_type:
            return LegacyFlags(d.draft_n_max, d.draft_n_min, d.draft_p_min)
        n_min = d.draft_n_min if has(d.draft_n_min) else None
        return LegacyFlags(d.draft_n_max, n_min, d.draft_p_min if has(d.draft_p_min) else None)
    return None


_FLAGS_CACHE: dict[tuple[str, int], LegacyFlags] = {}


def legacy_flags(binary: Path) -> LegacyFlags:
    """The flag spelling of `binary`, probed once per file version."""
    key = (str(binary), binary.stat().st_mtime_ns if binary.exists() else 0)
    if key not in _FLAGS_CACHE:
        _FLAGS_CACHE[key] = read_help(
            binary,
            parse_legacy_flags,
            lambda said: (
                f"{binary} has no draft-length flag ({SpecFlag.DRAFT_N_MAX}, {DraftFlag.N_MAX} "
                f"or {DraftFlag.N}) in its --help (it said: {said}): use llama.cpp from 2024 or "
                "later"
            ),
        )
    return _FLAGS_CACHE[key]


def legacy_argv(
    tool: str,
    flags: LegacyFlags,
    config: Config,
    target: Path,
    draft: Path | None,
    prompt_file: Path | str,
    n_predict: int,
    host: Host,
) -> list[str]:
    """Flags for `tool` (no binary): one generation of `prompt_file` under `config`."""
    argv = [Flag.MODEL, str(target)]
    if tool == SPECULATIVE:
        if draft is None:
            raise UsageError(
                f"{config.spec_type} needs a draft model: pass {param('draft', 'PATH')}"
            )
        argv += [Flag.DRAFT_MODEL, str(draft)]
    if config.k is not None:
        argv += [flags.n_max, str(config.k)]
    if config.k_min is not None and flags.n_min:
        argv += [flags.n_min, str(config.k_min)]
    if config.p_min is not None and flags.p_min:
        argv += [flags.p_min, f"{config.p_min:g}"]
    if config.draft_threads is not None and tool == SPECULATIVE:
        argv += [Flag.DRAFT_THREADS, str(config.draft_threads)]
    if config.lookup_cache is not None and tool == LOOKUP:
        argv += [Flag.LOOKUP_CACHE_STATIC, config.lookup_cache]
    argv += [Flag.PROMPT_FILE, str(prompt_file), Flag.N_PREDICT, str(n_predict)]
    argv += [Flag.TEMP, f"{config.temperature:g}", Flag.SEED, str(config.seed)]
    argv += [Flag.THREADS, str(config.threads or host.threads), Flag.CTX, str(config.ctx)]
    # The legacy tools apply the override to the draft too.
    return argv + expert_flags(config, " (run `specreg scan`)")


def failure_of(name: str, result: ToolOutput, log_path: Path) -> ServerFailed | None:
    """The failure a finished invocation stands for, with llama.cpp's own line; None if ok."""
    rc, text = result.returncode, result.log_text
    if rc == 0:
        if parse_stats(text) is None:
            return ServerFailed(
                "crash", f"{name} exited without its statistics", llama_message(text), log_path
            )
        return None
    if rc == 1 and VOCAB_MISMATCH.search(text):
        return ServerFailed(
            "spec-init",
            f"{name} refused the draft (exit code 1)",
            llama_message(text, VOCAB_MISMATCH),
            log_path,
        )
    how = exit_how(rc)
    return ServerFailed(classify_exit(text, rc), f"{name} {how}", llama_message(text), log_path, rc)


def to_completion(
    result: ToolOutput, prompt: str, n_predict: int, tool: str, eog: Sequence[str]
) -> Completion:
    stats = parse_stats(result.log_text)
    assert stats is not None  # failure_of() has ruled this out
    content, ended = generated_text(result.stdout, prompt, eog)
    return Completion(
        tokens=(),  # the legacy tools print text, not token ids
        content=content,
        predicted_n=stats.decoded_n,
        predicted_ms=stats.decoded_s * 1000,
        prompt_n=stats.encoded_n,
        prompt_ms=stats.encoded_s * 1000,
        draft_n=stats.n_drafted,
        draft_n_accepted=stats.n_accept,
        stop_type="eos" if ended or stats.decoded_n < n_predict else "limit",
        spec_types=tool,
        wall_s=result.wall_s,
        foreign_cpu_s=result.foreign_cpu_s,
    )


class LegacyEngine(Sampler):
    """One legacy binary set up for one configuration; `generate` runs one prompt."""

    def __init__(
        self,
        install: LlamaInstall,
        host: Host,
        tool: str,
        config: Config,
        target: Path,
        draft: Path | None,
        *,
        log_path: Path,
        timeout: float,
        eog_texts: Sequence[str] = (),
    ):
        self.binary = install.binary(tool)
        self.tool = tool
        self.host = host
        self.config = config
        self.target = target
        self.draft = draft
        self.log_path = log_path
        self.timeout = timeout
        self.eog_texts = tuple(eog_texts)
        self.flags = legacy_flags(self.binary)

    def command(self, prompt_file: Path | str, n_predict: int) -> list[str]:
        flags = legacy_argv(
            self.tool,
            self.flags,
            self.config,
            self.target,
            self.draft,
            prompt_file,
            n_predict,
            self.host,
        )
        return [*self.host.launch_prefix(), str(self.binary), *flags]

    def generate(self, prompt: str, n_predict: int) -> Completion:
        """One process, one prompt. Raises `ServerFailed` with llama.cpp's message."""
        with tempfile.TemporaryDirectory(prefix="specreg-prompt-") as tmp:
            prompt_file = Path(tmp) / PROMPT_FILE
            # -f drops one trailing newline; add one so the model sees the prompt as given.
            prompt_file.write_text(prompt + "\n" if prompt.endswith("\n") else prompt)
            result = run_tool(
                self.command(prompt_file, n_predict),
                env=self.host.env(),
                log_path=self.log_path,
                timeout=self.timeout,
            )
        failure = failure_of(self.tool, result, self.log_path)
        if failure is not None:
            raise failure
        return to_completion(result, prompt, n_predict, self.tool, self.eog_texts)


class LegacyTool(Engine):
    """A legacy binary as an engine: every generation is its own process, so there is no
    state to share between samples; a session is the binary, checked once."""

    process_per_sample = True

    def __init__(self, engine: LegacyEngine):
        self.engine = engine

    @contextlib.contextmanager
    def session(self) -> Iterator[LegacyEngine]:
        yield self.engine


def measure_legacy(
    start: RunStart, protocol: Protocol, settings: Settings, *, eog_texts: Sequence[str] = ()
) -> Measurement:
    """Like `measure`, with one process of the legacy binary `start.engine` per prompt and
    repeat, under the same protocol; each process may take the settings' startup and request
    timeouts together. Never raises for llama.cpp failures: they are returned."""
    install, host, tool = start.install, start.host, start.engine
    n_predict, timeout = settings.n_predict, settings.legacy_timeout
    log_path = start.log_path
    argv: tuple[str, ...] = (str(install.bin_dir / tool),)
    try:
        try:
            engine = LegacyEngine(
                install, host, tool, start.config, start.target, start.draft,
                log_path=log_path, timeout=timeout, eog_texts=eog_texts,
            )  # fmt: skip
        except ServerFailed:
            raise
        except LlamaError as err:  # the binary is missing or does not answer --help
            raise ServerFailed("crash", f"cannot run {tool}", str(err), None) from err
        argv = tuple(engine.command(PROMPT_FILE, n_predict))
        got = collect(LegacyTool(engine), start.workload, protocol, host, n_predict=n_predict)
    except ServerFailed as err:
        return start.finish(argv, (), None, failure=err, protocol=protocol)
    except SamplingInterrupted as stop:
        raise interrupted(start, argv, stop, True, protocol) from stop
    # The legacy tools have no plain mode: a finished run speculated (draft_n says how much).
    return start.finish(argv, tuple(prompt_result(g) for g in got), True, protocol=protocol)
