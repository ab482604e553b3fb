"""Which speculative types keep state across requests is a fact of the build
(`specreg.llamacpp.CROSS_REQUEST_STATE` / `REQUEST_STATE`): checked here against the pinned
source and against real llama-server with SmolLM2 (one thread, short generations)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specreg.host.machine import detect_host
from specreg.llama.config import Config, server_command
from specreg.llama.install import LlamaInstall
from specreg.llama.server import LlamaServer
from specreg.llamacpp import CROSS_REQUEST_STATE, REQUEST_STATE, keeps_state
from specreg.samples.small_models import SmallModels
from specreg.samples.synthetic import SyntheticModels

pytestmark = pytest.mark.llama

N_PREDICT = 80  # ngram-mod drafts at least 48 tokens (its n_min): shorter answers hide it
LINE = "the red fox jumps over the lazy brown dog and runs into the green forest at night"
# A prompt every n-gram method drafts on (the model copies it), and one most draft nothing on.
REPETITIVE = "Copy the following lines exactly:\n" + "\n".join([LINE] * 6) + "\n\nCopy:\n"
CODE = (
    "Write a Python function that performs binary search on a sorted list, with docstring and "
    "error handling:"
)
# Each prompt twice on one server, the other in between: a type without state across
# requests answers a prompt the second time exactly as the first.
SEQUENCE = (CODE, REPETITIVE, CODE, REPETITIVE)


def figures(
    install: LlamaInstall, target: Path, draft: Path | None, spec_type: str, log: Path
) -> list[tuple[int, int]]:
    """(drafted, accepted) of each request of SEQUENCE on one fresh llama-server."""
    host = detect_host()
    config = Config(spec_type=spec_type, threads=1, k=4 if draft else None)
    command = server_command(config, target, draft, install.dialect, host, server=install.server)
    i = command.index("--host")
    with LlamaServer(command[:i] + command[i + 4 :], env=host.env(), log_path=log) as server:
        out = []
        for prompt in SEQUENCE:
            got = server.complete(
                {
                    "prompt": prompt,
                    "n_predict": N_PREDICT,
                    "temperature": 0,
                    "seed": 42,
                    "cache_prompt": False,
                    "return_tokens": True,
                }  # fmt: skip
            )
            out.append((got.draft_n, got.draft_n_accepted))
    return out


@pytest.mark.parametrize(
    "spec_type",
    ["ngram-mod", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "draft-simple"],
)
def test_state_across_requests_is_what_the_build_says(
    llama_install: LlamaInstall, small_models: SmallModels, spec_type: str, tmp_path: Path
) -> None:
    draft = small_models.draft("smollm2", "Q4_0").path if spec_type == "draft-simple" else None
    got = figures(llama_install, small_models.smollm2.path, draft, spec_type, tmp_path / "log")
    code_1, rep_1, code_2, rep_2 = got
    changed = code_1 != code_2 or rep_1 != rep_2
    assert changed == keeps_state(spec_type), (spec_type, got)
    # equal figures mean something only where the method drafted
    assert any(drafted for drafted, _ in got), (spec_type, got)


def test_draft_mtp_keeps_no_state_across_requests(
    llama_install: LlamaInstall, synthetic_models: SyntheticModels, tmp_path: Path
) -> None:
    got = figures(llama_install, synthetic_models.mtp.path, None, "draft-mtp", tmp_path / "log")
    assert not keeps_state("draft-mtp")
    assert got[0] == got[2] and got[1] == got[3] and any(d for d, _ in got), got


def test_each_fact_cites_code_of_the_pinned_source(llama_build_info) -> None:  # type: ignore[no-untyped-def]
    src = (llama_build_info.src_dir / "common" / "speculative.cpp").read_text()
    for spec_type, fact in {**CROSS_REQUEST_STATE, **REQUEST_STATE}.items():
        for name in re.findall(r"common_speculative_impl_\w+", fact):
            assert f"struct {name} " in src, (spec_type, name)
    # the lines the facts quote
    mod = src[src.index("struct common_speculative_impl_ngram_mod ") :]
    assert re.search(r"// shared across all sequences\s+common_ngram_mod mod;", mod)
    begin = mod[mod.index("void begin(") : mod.index("void draft_one(")]
    assert "mod.add(" in begin and "mod.reset()" in begin  # adds; resets only past a threshold
    cache = src[src.index("struct common_speculative_impl_ngram_cache ") :]
    assert "size_t cache_size = 0;" in cache
    assert re.search(r"void begin\([^)]*\) override \{\s*// noop", cache)
    simple = src[src.index("struct common_speculative_impl_draft_simple ") :]
    assert "reset here rather than per round, or two identical requests differ" in simple
