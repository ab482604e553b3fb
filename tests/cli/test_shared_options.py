"""The measuring options are defined once (specreg/cli/common.py) with the core's defaults
(specreg.terms): a command's --n-predict, --repeat and startup --timeout default to what the
runner does when called without them, so the CLI and the library cannot drift apart."""

from __future__ import annotations

import click
import pytest

from specreg.runner.settings import Settings
from specreg.terms import DEFAULT_N_PREDICT, DEFAULT_REPEATS, STARTUP_TIMEOUT_S

from support.cli import command_options

# Commands that state their own default, and why: agree generates the target's text to score
# (longer than a timed sample), tune spends fewer samples per run to afford more runs.
OWN_DEFAULT = {("agree", "--n-predict"): 160, ("tune", "--repeat"): 2}
# quality and agree's --timeout bounds one llama-perplexity call, not a server's startup.
NOT_STARTUP = {"quality", "agree"}


@pytest.mark.parametrize(
    ("flag", "default"),
    [("--n-predict", DEFAULT_N_PREDICT), ("--repeat", DEFAULT_REPEATS), ("--timeout", None)],
)
def test_measuring_options_default_to_the_core(flag: str, default: int | None) -> None:
    found = [(path, p) for path, p in command_options() if flag in p.opts]
    assert len(found) >= 3, found
    for path, param in found:
        if flag == "--timeout":
            want = None if path in NOT_STARTUP else STARTUP_TIMEOUT_S
            if want is None:
                continue
        else:
            want = OWN_DEFAULT.get((path, flag), default)
        assert param.default == want, path


def test_the_core_uses_the_same_defaults() -> None:
    # every core function measures with a `Settings`, whose defaults are these
    settings = Settings()
    assert settings.n_predict == DEFAULT_N_PREDICT
    assert settings.repeats == DEFAULT_REPEATS
    assert settings.startup_timeout == STARTUP_TIMEOUT_S


def test_threads_is_at_least_one_everywhere() -> None:
    found = [(path, p) for path, p in command_options() if "--threads" in p.opts]
    assert len(found) >= 6, found
    for path, param in found:
        assert param.default is None, path
        with pytest.raises(click.BadParameter):
            param.type.convert("0", param, None)
