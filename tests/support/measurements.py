"""Measurements built by hand, for the rules that judge them: a host, a build and a prompt that
never ran, and completions with the speeds and drafts a test chooses."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from specreg.host.machine import Host
from specreg.llama.config import Config
from specreg.llama.install import DIALECT_SPEC_TYPE, LlamaInstall
from specreg.llama.server import Completion
from specreg.runner.measurement import Measurement
from specreg.runner.workload import Prompt, Workload

HOST = Host("h", "cpu", 2, 2, 2**34, 1, None, "Linux")
INSTALL = LlamaInstall(Path("/b"), "cache", "1 (x)", DIALECT_SPEC_TYPE, ("none",), ())
PROMPT = Prompt("code-1", "code", "def f(")
WL = Workload("tasks:code", (PROMPT,))


def completion(tokens, tps=100.0, draft_n=0, accepted=0, probs=()):  # type: ignore[no-untyped-def]
    n = len(tokens)
    return Completion(
        tokens=tuple(tokens), content="", predicted_n=n, predicted_ms=1000 * n / tps,
        prompt_n=3, prompt_ms=1.0, draft_n=draft_n, draft_n_accepted=accepted,
        stop_type="limit", spec_types="", wall_s=0.1, foreign_cpu_s=0.0, probs=tuple(probs),
    )  # fmt: skip


def measurement(config: Config, results, failure=None) -> Measurement:  # type: ignore[no-untyped-def]
    return Measurement(
        config=config, target=Path("/m/t.gguf"), draft=None, install=INSTALL, host=HOST,
        workload=WL, n_predict=4, repeats=len(results[0].samples) if results else 1, argv=(),
        started_at=datetime.now(timezone.utc), seconds=1.0, log_path=Path("/tmp/x.log"),
        prompts=tuple(results), failure=failure,
    )  # fmt: skip
