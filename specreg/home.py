"""Where specreg keeps its state. `SPECREG_HOME` relocates all of it."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ENV_HOME = "SPECREG_HOME"
ENV_CACHE = "SPECREG_CACHE"


def specreg_home() -> Path:
    """The state folder: `$SPECREG_HOME`, else the platform's user data dir."""
    env = os.environ.get(ENV_HOME)
    return Path(env).expanduser() if env else Path(platformdirs.user_data_dir("specreg"))


def default_db_path() -> Path:
    return specreg_home() / "registry.duckdb"


def cache_dir() -> Path:
    """Downloaded sources, llama.cpp builds and model assemblies.

    Inside the home by default; `SPECREG_CACHE` moves just the cache, so tests can use a
    throwaway home while reusing one llama.cpp build.
    """
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else specreg_home() / "cache"


def logs_dir() -> Path:
    return specreg_home() / "logs"
