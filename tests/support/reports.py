"""A small collection for the report tests, written with the demo generator and really scanned.

Sparse GGUFs (real headers and tensor tables, no weights) in three tokenizer families, one of
them padded by 128 tokens, one model whose BOS differs, a broken file, and one hostile model:
its name, chat template, BOS token text and file name carry markup and quotes that would
execute or break the page if any of them reached the HTML unescaped.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType, TokenType

from specreg.registry.db import opened
from specreg.registry.queries import list_models
from specreg.registry.run_store import RunRecord, record_run
from specreg.registry.scan import ScanResult, scan_paths
from specreg.reports import build_site
from specreg.samples.demo import Arch, DemoModel, Vocab, write_demo_model

Q = GGMLQuantizationType

# Each sets window.__pwned if it ever runs; a quote first, to break out of attributes.
HOSTILE_NAME = 'Evil"\' onmouseover="window.__pwned=1" <script>window.__pwned=1</script> $x$ 7B'
HOSTILE_TEMPLATE = (
    '</pre></details><script>window.__pwned=2</script><img src=x onerror="window.__pwned=3">'
    "{% for m in messages %}'\"{{ m.content }}{% endfor %}"
)
HOSTILE_TOKEN = "<script>window.__pwned=4</script>"
HOSTILE_FILE = "evil'\"><svg onload=window.__pwned=5>.gguf"
HOSTILE_MARKERS = ("window.__pwned=1", "window.__pwned=2", "window.__pwned=3",
                   "window.__pwned=4", "window.__pwned=5")  # fmt: skip


def family_vocab(
    prefix: str, n: int, *, model: str = "gpt2", pre: str | None = "qwen2", bos: int = 1,
    add_bos: bool = False, pad_to: int | None = None, template: str | None = None,
) -> Vocab:  # fmt: skip
    tokens = ["<unk>", HOSTILE_TOKEN, "</s>", "<pad>", "<mask>"]
    tokens += [f"{prefix}{i:x}" for i in range(n - len(tokens))]
    types = [int(TokenType.CONTROL)] * 5 + [int(TokenType.NORMAL)] * (n - 5)
    if pad_to:
        tokens += [f"[PAD{i}]" for i in range(len(tokens), pad_to)]
        types += [int(TokenType.UNUSED)] * (pad_to - len(types))
    template = template or "{% for m in messages %}{{ m.content }}{% endfor %}"
    return Vocab(model, pre, tuple(tokens), tuple(types), bos_id=bos, eos_id=2,
                 add_bos=add_bos, add_eos=False, chat_template=template)  # fmt: skip


def _arch(name: str, layers: int, embd: int, n_vocab: int) -> Arch:
    return Arch(name, layers, embd, embd * 3, max(1, embd // 128), max(1, embd // 512), n_vocab)


def collection() -> list[tuple[str, DemoModel]]:
    alpha = family_vocab("Ġa", 600)
    alpha_padded = family_vocab("Ġa", 600, pad_to=728)
    alpha_bos = replace(family_vocab("Ġa", 600, add_bos=True, bos=3))
    beta = family_vocab("▁b", 500, model="llama", pre="default", add_bos=True)
    gamma = family_vocab("Ġg", 700, pre="llama-bpe")
    evil = replace(alpha, chat_template=HOSTILE_TEMPLATE)
    return [
        ("alpha", DemoModel("Alpha-32B-Q4_K_M.gguf", "Alpha 32B",
                            _arch("qwen2", 64, 5120, 728), alpha_padded)),
        ("alpha", DemoModel("Alpha-7B-Q4_K_M.gguf", "Alpha 7B",
                            _arch("qwen2", 28, 3584, 600), alpha)),
        ("alpha", DemoModel("Alpha-3B-BOS-Q4_K_M.gguf", "Alpha 3B BOS",
                            _arch("qwen2", 36, 2048, 600), alpha_bos)),
        ("alpha", DemoModel("Alpha-0.5B-Q8_0.gguf", "Alpha 0.5B",
                            _arch("qwen2", 24, 896, 600), alpha, Q.Q8_0)),
        ("evil", DemoModel(HOSTILE_FILE, HOSTILE_NAME, _arch("qwen2", 28, 3584, 600), evil)),
        ("beta", DemoModel("Beta-8B-Q4_K_M.gguf", "Beta 8B",
                           _arch("llama", 32, 4096, 500), beta)),
        ("beta", DemoModel("Beta-1B-Q8_0.gguf", "Beta 1B",
                           _arch("llama", 16, 2048, 500), beta, Q.Q8_0)),
        ("gamma", DemoModel("Gamma-0.3B-Q8_0.gguf", "Gamma 0.3B",
                            _arch("llama", 12, 768, 700), gamma, Q.Q8_0)),
    ]  # fmt: skip


def write_collection(root: Path) -> Path:
    for folder, model in collection():
        write_demo_model(root / folder, model)
    (root / "broken").mkdir(parents=True, exist_ok=True)
    (root / "broken" / "not-a-model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    return root


def scanned_registry(root: Path, db: Path) -> ScanResult:
    write_collection(root)
    with opened(db) as con:
        return scan_paths(con, [root])


SWEEP_TARGET = "Alpha 32B"
SWEEP_DRAFT = "Alpha 0.5B"


def record_runs(db: Path) -> int:
    """Runs as the runner records them: a baseline, a K sweep on two tasks, a failed run
    whose llama.cpp message quotes the hostile model's name."""
    now = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    with opened(db) as con:
        ids = {m.name: m.model_id for m in list_models(con)}
        target, draft = ids[SWEEP_TARGET], ids[SWEEP_DRAFT]
        n = 0
        for task, acc in (("code", 0.8), ("prose", 0.5)):
            base = record_run(con, RunRecord(
                "baseline", "ok", now, {}, "baseline", "none", target_model_id=target,
                task=task, tokens_per_s=3.0,
            ))  # fmt: skip
            for k in (4, 8, 16):
                tps = 3.0 * (1 - acc ** (k + 1)) / (1 - acc) / (1 + 0.05 * k)
                record_run(con, RunRecord(
                    "verify", "ok", now, {"k": k}, f"draft-simple K={k}", "draft-simple",
                    target_model_id=target, draft_model_id=draft, k=k, task=task,
                    tokens_per_s=tps, acceptance=acc, baseline_run_id=base, speedup=tps / 3.0,
                    verdict="pass", verdict_reason="identical to the baseline",
                ))  # fmt: skip
                n += 1
            n += 1
        record_run(con, RunRecord(
            "run", "failed", now, {}, "draft-simple K=8", "draft-simple",
            target_model_id=target, draft_model_id=ids[HOSTILE_NAME], k=8, task="code",
            error_kind="spec-init", error=f"failed to load draft '{HOSTILE_NAME}'",
        ))  # fmt: skip
        return n + 1


@pytest.fixture(scope="module", name="report_db")
def report_db_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection scanned, with recorded runs."""
    root = tmp_path_factory.mktemp("report-collection")
    db = root / "registry.duckdb"
    result = scanned_registry(root / "models", db)
    assert result.n_models == 8, result
    assert len(result.errors) == 1  # the broken file, which the overview must list
    record_runs(db)
    return db


@pytest.fixture(scope="module", name="site_dir")
def site_dir_fixture(report_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    with opened(report_db) as con:
        build_site(con, out, cache=None, db_label="registry.duckdb")
    return out
