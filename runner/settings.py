"""What a measurement needs besides the models and the prompts, as one object.

`Settings` is built once (the CLI's `settings_options` decorator gathers the measuring options
into it) and passed whole: `runs.plan`, `measure`, the legacy tools, `tune` and `sweep` (on this
machine or, pickled with each job, on a Ray host) all read it, so no function threads a dozen
keyword arguments through three layers, and every default is stated here once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specreg.llama.server import REQUEST_TIMEOUT_S
from specreg.terms import (
    DEFAULT_N_PREDICT,
    DEFAULT_REPEATS,
    DEFAULT_RETRIES,
    ENGINE_AUTO,
    STARTUP_TIMEOUT_S,
)

if TYPE_CHECKING:
    import duckdb

    from specreg.host.load import LoadPolicy
    from specreg.llama.config import Config


@dataclass(frozen=True)
class Settings:
    """How to measure: tokens and samples per prompt, retries, timeouts, warm-up, engine, the
    warm regime, llama.cpp threads and the load guard's options. Plain values only: it pickles
    (a Ray job carries it to its host) and compares by value."""

    n_predict: int = DEFAULT_N_PREDICT  # tokens generated per prompt in a timed sample
    repeats: int = DEFAULT_REPEATS  # timed samples of each prompt
    retries: int = DEFAULT_RETRIES  # a disturbed sample is taken again up to this often
    startup_timeout: float = STARTUP_TIMEOUT_S  # seconds llama-server may take to start
    request_timeout: float = REQUEST_TIMEOUT_S  # seconds one request may take
    warmup: bool = True  # each engine state answers a text outside the workload first
    # auto | server | legacy, or a legacy binary by name; `runs.plan` resolves it to the
    # engine that runs (server or a binary), and a baseline always runs on llama-server
    engine: str = ENGINE_AUTO
    warm_first: int | None = None  # the warm regime: prompts after the first N reported apart
    threads: int | None = None  # llama.cpp threads (None: one per physical core)
    allow_load: bool = False  # measure on a busy host; such runs are recorded as disturbed
    load_wait: float | None = None  # seconds to wait for a quiet host (None: the default)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @property
    def legacy_timeout(self) -> float:
        """How long one legacy-tool process may take: its model load and its generation."""
        return self.startup_timeout + self.request_timeout

    def configured(self, config: Config) -> Config:
        """`config` with these settings' threads (when they name any)."""
        return config if self.threads is None else config.with_(threads=self.threads)

    def load_policy(
        self, con: duckdb.DuckDBPyConnection | None = None, host_fingerprint: str | None = None
    ) -> LoadPolicy:
        """The load guard's policy: the environment's, with these settings' `allow_load` and
        `load_wait`, and the host's quiet noise floor from the registry `con` when it has one."""
        from specreg.host.load import LoadPolicy

        policy = LoadPolicy.from_env().with_(wait_s=self.load_wait)
        if self.allow_load:
            policy = policy.with_(allow_load=True)
        if con is not None and host_fingerprint:
            from specreg.registry.noise import latest_noise_floor

            floor = latest_noise_floor(con, host_fingerprint)
            if floor is not None:
                policy = policy.with_(noise_floor=floor.spread)
        return policy


DEFAULTS = Settings()  # what a measurement does when nothing is said
