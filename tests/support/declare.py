"""Fixtures for the declarative registry: a sparse demo collection, an orchestrator-style
model_registry.yaml written for these tests, and a scanned registry.

The sample registry follows the structure of the master registry in
pestopoppa/epyc-inference-research (`orchestration/model_registry.yaml`, MIT, Copyright (c)
2025-2026 Daniele Pinna), as described in ../shared/notes/user-registry.md: runtime_defaults,
roles with tier/model/acceleration/performance/constraints, drafts with compatible_targets,
server_mode and optimized_params restating K. The values are invented for the tests; the
spellings (k, draft_k, draft_max, speculative_k; "70.1%", 8.52, 0.62) are theirs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from specreg.registry.db import opened

LM = "lmstudio-community"
QWEN3_30B = f"{LM}/Qwen3-Coder-30B-A3B-Instruct-GGUF/Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf"
QWEN3_DRAFT = (
    "jukofyork/Qwen3-Coder-Instruct-DRAFT-0.75B-GGUF/Qwen3-Coder-Instruct-DRAFT-0.75B-32k-Q4_0.gguf"
)
QWEN25_32B = f"{LM}/Qwen2.5-Coder-32B-Instruct-GGUF/Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf"
QWEN25_05B = f"{LM}/Qwen2.5-Coder-0.5B-Instruct-GGUF/Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf"
QWEN3_480B_DIR = f"{LM}/Qwen3-Coder-480B-A35B-Instruct-GGUF"
QWEN3_480B = f"{QWEN3_480B_DIR}/Qwen3-Coder-480B-A35B-Instruct-Q4_K_M-00001-of-00008.gguf"
LLAMA_8B = f"{LM}/Meta-Llama-3.1-8B-Instruct-GGUF/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"
LLAMA_1B = f"{LM}/Llama-3.2-1B-Instruct-GGUF/Llama-3.2-1B-Instruct-Q8_0.gguf"
GEMMA_27B = f"{LM}/gemma-3-27b-it-GGUF/gemma-3-27b-it-Q4_K_M.gguf"
QWEN3_NEXT = f"{LM}/Qwen3-Next-80B-A3B-Instruct-GGUF/Qwen3-Next-80B-A3B-Instruct-Q4_K_M.gguf"

# In the collection the registry points at.
IN_TREE = (
    "Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf",
    "Qwen3-Coder-Instruct-DRAFT-0.75B-32k-Q4_0.gguf",
    "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf",
    "Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf",
    "Qwen3-Coder-480B-A35B-Instruct-Q4_K_M.gguf",
    "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
    "Llama-3.2-1B-Instruct-Q8_0.gguf",
    "gemma-3-27b-it-Q4_K_M.gguf",
    "Qwen3-Next-80B-A3B-Instruct-Q4_K_M.gguf",
)
# specreg.yaml's roles after the import: drafts (tier D) are models, not roles; the deprecated
# role and the one whose model is not on disk are left out (and reported).
IMPORTED_ROLES = [
    "frontdoor",
    "coder_escalation",
    "architect_coding",
    "general",
    "worker_gemma",
    "ingest_long",
]
# Written aside, moved in by tests that need a model nobody declared.
SPARE = ("DeepSeek-R1-Distill-Qwen-1.5B-Q8_0.gguf", "gemma-3-1b-it-Q8_0.gguf")

ORCHESTRATOR_REGISTRY = """\
# Orchestrator-style registry written for specreg's tests (structure after
# pestopoppa/epyc-inference-research orchestration/model_registry.yaml, MIT).
runtime_defaults:
  quantization: Q4_K_M
  draft_quantization: Q8_0
  threads: 96
  numa_policy: interleave=all
  model_base_path: ../models
  binaries:
    base_dir: ../llama.cpp/build/bin
    server: llama-server
    speculative: llama-speculative
  server_defaults:
    port: 8080
    context_length: 65536

server_mode:
  coder_escalation:
    url: http://localhost:8081
    port: 8081
    model_role: coder_escalation
    draft_max: 24
  frontdoor:
    port: 8080
    model_role: frontdoor
    acceleration: {draft_k: 16}

roles:
  frontdoor:
    tier: A
    model:
      name: Qwen3-Coder-30B-A3B-Instruct
      path: QWEN3_30B
      quant: Q4_K_M
      size_gb: 17.5
      architecture: moe
    candidate_roles: [frontdoor, coder, general, ingest]
    acceleration:
      type: moe_expert_reduction
      experts: 6
      override_key: qwen3moe.expert_used_count
      speculative_decoding:
        {type: speculative_decoding, draft_role: draft_qwen3_coder_0_75b, k: 16, lookup: true}
    performance:
      baseline_tps: 29.28
      moe6_spec_lookup_tps: 47.11
      spec_acceptance_moe6: 70.1%
      speedup: 1.61x
    memory: {residency: hot, pinned: true}
    generation_defaults: {n_tokens: -1, temperature: 0.3}
    benchmark_date: 2026-02-13

  coder_escalation:
    tier: B
    model:
      name: Qwen2.5-Coder-32B-Instruct
      path: QWEN25_32B
      quant: Q4_K_M
      size_gb: 19.9
      architecture: dense
    acceleration: {type: speculative_decoding, draft_role: draft_qwen25_coder_0_5b, draft_k: 16}
    performance: {spec_tps: 11.01, acceptance_rate: 8.52}

  architect_coding:
    tier: B
    model:
      name: Qwen3-Coder-480B-A35B-Instruct
      path: QWEN3_480B
      quant: Q4_K_M
      size_gb: 271
      architecture: moe
      split_count: 8
    acceleration:
      type: speculative_decoding
      draft_role: draft_qwen3_coder_0_75b
      speculative_k: 8
    performance: {spec_tps: 5.4, spec_acceptance: 0.62}

  general:
    tier: B
    model:
      name: Meta-Llama-3.1-8B-Instruct
      path: LLAMA_8B
      quant: Q4_K_M
      size_gb: 4.9
      architecture: dense
    acceleration: {type: speculative_decoding, draft_role: draft_llama_3_2_1b, draft_max: 24}
    performance: {spec_tps: 30.2, acceptance: "0.55"}

  worker_gemma:
    tier: C
    model:
      name: gemma-3-27b-it
      path: GEMMA_27B
      quant: Q4_K_M
      size_gb: 16.5
      architecture: dense
    acceleration: {type: prompt_lookup}
    constraints: {forbid: [speculative_decoding], reason: no gemma draft on disk}
    notes: SWA target; lookup only

  ingest_long:
    tier: B
    model:
      name: Qwen3-Next-80B-A3B-Instruct
      path: QWEN3_NEXT
      quant: Q4_K_M
      size_gb: 45
      architecture: ssm_moe_hybrid
    acceleration: {type: self_speculation, n_layer_exit_draft: 12}
    constraints: {forbid: [speculative_decoding, prompt_lookup, eagle], reason: SSM hybrid}

  worker_summarize:
    tier: C
    model:
      name: Qwen3-30B-A3B-Thinking
      path: unsloth/Qwen3-30B-A3B-Thinking-2507-GGUF/Qwen3-30B-A3B-Thinking-2507-Q4_K_M.gguf
      quant: Q4_K_M
    acceleration: {type: speculative_decoding, draft_role: draft_qwen3_coder_0_75b, k: 8}

  old_worker:
    tier: C
    deprecated: true
    model: {name: MiniMax-M2, path: MiniMax-M2-GGUF/MiniMax-M2-Q4_K_M.gguf, quant: Q4_K_M}

  draft_qwen3_coder_0_75b:
    tier: D
    model:
      name: Qwen3-Coder-Instruct-DRAFT-0.75B-32k-Q4_0
      path: ABS_QWEN3_DRAFT
      quant: Q4_0
      size_gb: 0.45
    candidate_roles: [draft]
    compatible_targets: [qwen3-coder-30b-a3b, qwen3-coder-480b-a35b]
    notes: VERIFIED (2026-02-13) works with ALL Qwen3-Coder targets.

  draft_qwen25_coder_0_5b:
    tier: D
    model: {name: Qwen2.5-Coder-0.5B-Instruct, path: QWEN25_05B, quant: Q4_K_M, size_gb: 0.5}
    compatible_targets: [Qwen2.5-Coder-32B, qwen2.5]

  draft_llama_3_2_1b:
    tier: D
    model: {name: Llama-3.2-1B-Instruct, path: LLAMA_1B, quant: Q8_0, size_gb: 1.3}
    compatible_targets: [llama-3]

optimized_params:
  _meta: {schema_version: 1}
  frontdoor: {temperature: 0.0736, speculative_k: 31}

routing_hints:
  - {if: "task_type == 'code'", use: [coder_escalation], escalate_to: architect_coding}

deprecated_models:
  - {model: MiniMax-M2, path_was: MiniMax-M2-GGUF/MiniMax-M2-Q4_K_M.gguf, reason: Not in registry}
"""


def smollm2_spec(configs: str, *, llama: str = "") -> str:
    """A specreg.yaml pinning SmolLM2 (alias smollm2) as the target of the role `assistant`,
    with `configs` (YAML, indented as under `configs:`) and an optional `llama:` block; the
    model's `{model_id}` and `{path}` are left to `str.format`."""
    return (
        f"version: 1\n{llama}models:\n  {{model_id}}:\n    path: {{path}}\n    aliases: [smollm2]\n"
        f"roles:\n  assistant:\n    target: smollm2\n    configs:\n{configs}"
    )


def write_registry(path: Path, models_dir: Path) -> Path:
    text = ORCHESTRATOR_REGISTRY
    for name, value in (
        ("ABS_QWEN3_DRAFT", str(models_dir / QWEN3_DRAFT)),
        ("QWEN3_30B", QWEN3_30B),
        ("QWEN25_32B", QWEN25_32B),
        ("QWEN25_05B", QWEN25_05B),
        ("QWEN3_480B", QWEN3_480B),
        ("LLAMA_8B", LLAMA_8B),
        ("LLAMA_1B", LLAMA_1B),
        ("GEMMA_27B", GEMMA_27B),
        ("QWEN3_NEXT", QWEN3_NEXT),
        ("QWEN3_DRAFT", QWEN3_DRAFT),
    ):
        text = text.replace(name, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_collection(root: Path, names: tuple[str, ...]) -> None:
    from specreg.samples.demo import demo_models, write_demo_model

    for sub, model in demo_models():
        if model.filename in names:
            write_demo_model(root / sub, model)


@pytest.fixture(scope="session")
def _collection_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("declare-collection")
    write_collection(root / "models", IN_TREE)
    write_collection(root / "spare", SPARE)
    return root


@dataclass
class Site:
    """One user's machine: the collection, the orchestrator registry, specreg's registry."""

    root: Path
    models: Path
    spare: Path
    registry_yaml: Path
    db: Path
    spec: Path

    def rescan(self) -> None:
        from specreg.registry.scan import scan_paths

        with opened(self.db) as con:
            scan_paths(con, [self.models])


def _link_tree(src: Path, dst: Path) -> None:
    # Hard links: instant for sparse 271 GB "files"; tests replace files, never write into them.
    if shutil.which("cp"):
        subprocess.run(["cp", "-al", str(src), str(dst)], check=True)
    else:  # pragma: no cover
        shutil.copytree(src, dst, copy_function=os.link)


def _make_site(template: Path, root: Path, db: Path) -> Site:
    from specreg.declare.importer import import_registry
    from specreg.declare.spec import write_yaml

    _link_tree(template, root)
    s = Site(
        root,
        root / "models",
        root / "spare",
        write_registry(root / "orchestration" / "model_registry.yaml", root / "models"),
        db,
        root / "specreg.yaml",
    )
    with opened(s.db) as con:
        result = import_registry(con, s.registry_yaml, s.spec)
    write_yaml(s.spec, result.doc)
    return s


@pytest.fixture(scope="session")
def _site_template(_collection_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Site:
    base = tmp_path_factory.mktemp("declare-site")
    return _make_site(_collection_template, base / "site", base / "registry.duckdb")


@pytest.fixture
def site(_site_template: Site, tmp_path: Path) -> Iterator[Site]:
    """The imported site with a private registry and specreg.yaml; the collection is shared,
    so tests using it must not touch the model files (use `private_site` for that)."""
    db = tmp_path / "registry.duckdb"
    spec = tmp_path / "specreg.yaml"
    shutil.copy(_site_template.db, db)
    shutil.copy(_site_template.spec, spec)
    t = _site_template
    yield Site(t.root, t.models, t.spare, t.registry_yaml, db, spec)


@pytest.fixture
def private_site(_collection_template: Path, tmp_path: Path) -> Iterator[Site]:
    """A private copy of the collection, the sample registry, scanned and imported."""
    yield _make_site(_collection_template, tmp_path / "site", tmp_path / "registry.duckdb")


def pair_ids(s: Site) -> tuple[str, str]:
    """The model ids of the site's Qwen2.5 Coder 32B target and its 0.5B draft."""
    from specreg.declare import deps

    with opened(s.db) as con:
        t = deps.model_at_path(con, s.models / QWEN25_32B)
        d = deps.model_at_path(con, s.models / QWEN25_05B)
    assert t is not None and d is not None
    return t.model_id, d.model_id


def record_run(
    db: Path,
    *,
    target: str,
    draft: str | None,
    k: int | None,
    tps: float,
    acceptance: float | None = None,
    spec_type: str = "draft-simple",
    experts: int | None = None,
    host: str = "host-a",
    task: str = "code",
) -> int:
    """Record a measured run the way the runner does (specreg.registry.run_store.record_run)."""
    from specreg.registry.run_store import RunRecord
    from specreg.registry.run_store import record_run as _record

    cfg = {"spec_type": spec_type, "k": k, "experts": experts}
    run = RunRecord(
        kind="run",
        status="ok",
        started_at=datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc),
        config=cfg,
        config_label=f"{spec_type} k={k}",
        spec_type=spec_type,
        target_model_id=target,
        draft_model_id=draft,
        k=k,
        experts=experts,
        temperature=0.0,
        seed=42,
        behaviour_changing=experts is not None,
        host_fingerprint=host,
        threads=96,
        task=task,
        prompt_set=task,
        n_predict=256,
        repeats=3,
        speculative_active=spec_type != "none",
        tokens_per_s=tps,
        acceptance=acceptance,
    )
    with opened(db) as con:
        return _record(con, run)


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """Invoke the CLI as `specreg` would: (exit code, stdout, the one-line error or "")."""
    import click
    from click.testing import CliRunner

    from specreg.cli.main import cli, error_line
    from specreg.errors import SpecregError

    result = CliRunner().invoke(cli, args, standalone_mode=False)
    exc = result.exception
    if isinstance(exc, SpecregError):
        return exc.exit_code, result.output, f"error: {error_line(exc)}"
    if isinstance(exc, click.ClickException):
        return 2, result.output, exc.format_message()
    if exc is not None and not isinstance(exc, SystemExit):
        raise exc
    code = result.return_value if isinstance(result.return_value, int) else result.exit_code
    return code, result.output, ""
