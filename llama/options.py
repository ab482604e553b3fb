"""A recommended option as llama.cpp runs it: its `Config` and its llama-server command line.

The recommender describes options; llama/ does not import it (they are siblings), so what a
run needs of an option is read through `RunnableOption`, which the recommender's `Option`
satisfies. The runner, tune, serve and the commands all turn options into runs here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from specreg.host.machine import Host
from specreg.llama.config import SPEC_NONE, Config, server_command


class RunnableOption(Protocol):
    """What llama-server needs of a recommended option."""

    @property
    def spec_type(self) -> str: ...  # "none" for plain decoding
    @property
    def k(self) -> int | None: ...
    @property
    def experts(self) -> int | None: ...
    @property
    def expert_key(self) -> str | None: ...
    @property
    def temperature(self) -> float: ...
    @property
    def lookup_cache_path(self) -> str | None: ...
    @property
    def draft_path(self) -> str | None: ...


def option_config(option: RunnableOption) -> Config:
    """The runner's configuration for a recommended option."""
    return Config(
        spec_type=option.spec_type if option.spec_type != "none" else SPEC_NONE,
        k=option.k,
        experts=option.experts,
        expert_key=option.expert_key,
        temperature=option.temperature,
        lookup_cache=option.lookup_cache_path,
    )


def option_command(
    option: RunnableOption,
    target_path: str,
    dialect: str,
    host: Host,
    server: Path | str = "llama-server",
) -> list[str]:
    """The exact llama-server command line for `option` with the user's build and host."""
    draft = Path(option.draft_path) if option.draft_path else None
    return server_command(
        option_config(option), Path(target_path), draft, dialect, host, server=server,
        measuring=False,  # shown to users: without the measurement's log verbosity
    )  # fmt: skip
