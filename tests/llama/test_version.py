"""The llama.cpp version as the build states it (issue 25): the pinned build prints
`version: 0.6.0-dev (build 11434, commit pypi-sdist)`, whose leading number is the project's
version; read as a build it was build 0, and the auditor applied a guess instead of build
11434's rules."""

from __future__ import annotations

from specreg.auditor import rules_for_build, rules_for_version
from specreg.llama.build import LLAMA_SDIST_VERSION
from specreg.llama.install import LlamaInstall, parse_version


def test_both_ways_a_build_states_its_version() -> None:
    assert parse_version("version: 7371 (abc1234)\nbuilt with cc") == "7371 (abc1234)"
    newer = "version: 0.6.0-dev (build 11434, commit pypi-sdist)\nbuilt with GNU 12.2.0"
    assert parse_version(newer) == "11434 (pypi-sdist)"
    assert parse_version("version: 0.6.0-dev (build 0, commit unknown)") == (
        "0.6.0-dev (no build number)"
    )
    assert parse_version("no version here") == "unknown"


def test_the_pinned_build_is_known_by_its_number(llama_install: LlamaInstall) -> None:
    number = LLAMA_SDIST_VERSION.split(".")[0]
    assert llama_install.version == f"{number} (pypi-sdist)"
    rules = rules_for_version(llama_install.version, llama_install.dialect)
    assert rules == rules_for_build(int(number))
