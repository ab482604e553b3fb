"""`specreg import`: an orchestrator-style model_registry.yaml into specreg.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.declare.importer import ImportResult, import_registry
from specreg.declare.spec import load_spec
from specreg.registry.db import opened

from support.declare import (
    IMPORTED_ROLES,
    LLAMA_1B,
    QWEN3_30B,
    QWEN3_480B,
    QWEN25_05B,
    QWEN25_32B,
    Site,
    run_cli,
)

# fixtures, shared through the module that defines them


@pytest.fixture
def imported(site: Site, tmp_path: Path) -> ImportResult:
    with opened(site.db) as con:
        return import_registry(con, site.registry_yaml, tmp_path / "out.yaml")


def _cfg(site: Site, role: str):  # type: ignore[no-untyped-def]
    spec, _ = load_spec(site.spec)
    r = next(r for r in spec.roles if r.name == role)
    return spec, r, (r.configs[0] if r.configs else None)


def test_models_are_keyed_by_fingerprint_with_names_as_aliases(site: Site) -> None:
    from specreg.declare import deps

    spec, _ = load_spec(site.spec)
    with opened(site.db) as con:
        for path in (QWEN25_05B, LLAMA_1B, QWEN3_480B):
            disk = deps.model_at_path(con, site.models / path)
            assert disk is not None
            decl = spec.model(disk.model_id)
            assert decl is not None and decl.path == str(site.models / path)
    # drafts (tier D) become models, not roles; the deprecated and missing roles are absent
    assert [r.name for r in spec.roles] == IMPORTED_ROLES
    assert spec.model("Qwen3-Coder-Instruct-DRAFT-0.75B-32k-Q4_0") is not None


@pytest.mark.parametrize(
    ("role", "spelled", "draft_max", "acceptance"),
    [
        ("frontdoor", "k: 16", 16, 0.701),  # acceptance "70.1%"
        ("coder_escalation", "draft_k: 16", 16, 0.0852),  # 8.52, a percentage without the sign
        ("architect_coding", "speculative_k: 8", 8, 0.62),  # 0.62, already a fraction
        ("general", "draft_max: 24", 24, 0.55),  # "0.55", a string
    ],
)
def test_k_and_acceptance_in_every_spelling(
    site: Site, role: str, spelled: str, draft_max: int, acceptance: float
) -> None:
    assert spelled in site.registry_yaml.read_text()
    _, _, cfg = _cfg(site, role)
    assert cfg.draft_max == draft_max
    assert cfg.evidence.acceptance == pytest.approx(acceptance)


def test_roles_drafts_and_expert_overrides(site: Site) -> None:
    spec, role, cfg = _cfg(site, "frontdoor")
    assert role.policy == "speed"  # fewer experts than trained
    assert cfg.experts == 6
    assert spec.model(cfg.draft).aliases == ("Qwen3-Coder-Instruct-DRAFT-0.75B-32k-Q4_0",)
    # lookup: true next to the draft becomes an n-gram type in the same comma list
    assert cfg.spec_types == ("ngram-cache", "draft-simple")  # the order llama.cpp tries them
    ev = cfg.evidence
    assert (ev.tokens_per_s, ev.baseline_tokens_per_s, ev.date) == (47.11, 29.28, "2026-02-13")
    assert ev.source == "model_registry.yaml roles.frontdoor.performance (line 44)"

    _, gemma, gcfg = _cfg(site, "worker_gemma")
    assert gemma.forbid == ("draft",) and gcfg.spec_types == ("ngram-cache",)
    _, hybrid, hcfg = _cfg(site, "ingest_long")
    assert hybrid.forbid == ("draft", "ngram", "eagle3") and hcfg is None
    _, q, qcfg = _cfg(site, "coder_escalation")
    assert q.policy == "quality" and qcfg.experts is None


def test_every_unmappable_entry_is_reported_with_its_reason(imported: ImportResult) -> None:
    why = {e.key: e.note for e in imported.unmapped}
    lines = {e.key: e.line for e in imported.unmapped}
    expect = {
        "server_mode.coder_escalation.draft_max": (
            "K=24 disagrees with roles.coder_escalation (draft_max 16); imported the roles "
            "value, which is what the loader applied"
        ),
        "optimized_params.frontdoor.speculative_k": (
            "optimizer output without run records (protocol, host, date): not evidence; "
            "measure it with `specreg run` and let `specreg propose` pin it"
        ),
        "roles.ingest_long.acceleration.type": (
            "self_speculation: no llama-server equivalent specreg v1 renders; role imported "
            "without it"
        ),
        "roles.old_worker": "deprecated role: not imported",
        "roles.draft_qwen25_coder_0_5b.model.quant": (
            "label Q4_K_M disagrees with the GGUF header (Q8_0); specreg uses the header"
        ),
        "roles.draft_qwen3_coder_0_75b.compatible_targets": (
            "compatibility is decided from GGUF metadata by the auditor, not by name substrings; "
            "`specreg plan` checks every pinned draft"
        ),
        "roles.frontdoor.performance.speedup": (
            "a ratio; specreg derives it from tokens_per_s / baseline"
        ),
        "roles.frontdoor.memory": (
            "residency (hot/warm, mlock) is a serving detail outside specreg.yaml v1"
        ),
        "runtime_defaults.quantization": (
            "a default quant is a guess; specreg reads each model's quant from its GGUF header"
        ),
        "routing_hints": "routing policy, not a model/role binding",
    }
    for key, reason in expect.items():
        assert why.get(key) == reason, key
    missing = why["roles.worker_summarize.model.path"]
    assert missing.startswith("no file at ") and missing.endswith(": the model is not on disk")
    assert lines["server_mode.coder_escalation.draft_max"] == 22
    # the same K restated in agreement is mapped, not reported
    assert "server_mode.frontdoor.acceleration.draft_k" in {e.key for e in imported.mapped}


def test_nothing_is_dropped_silently(imported: ImportResult, site: Site) -> None:
    """Every leaf of the source is either mapped, reported, or inside a reported entry."""
    from ruamel.yaml import YAML

    src = YAML(typ="safe").load(site.registry_yaml.read_text())
    seen = [e.key for e in (*imported.mapped, *imported.unmapped)]

    def covered(key: str) -> bool:
        return any(key == s or key.startswith(s + ".") or s.startswith(key + ".") for s in seen)

    def leaves(node: object, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [k for key, v in node.items() for k in leaves(v, f"{prefix}.{key}".lstrip("."))]
        return [prefix]

    uncovered = [k for k in leaves(src, "") if not covered(k)]
    assert uncovered == [], "\n".join(uncovered)


def test_cli_import_writes_and_lists_unmapped(site: Site, tmp_path: Path) -> None:
    out = tmp_path / "new.yaml"
    args = ["import", str(site.registry_yaml), "--spec", str(out), "--db", str(site.db), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["version"] == "1" and doc["kind"] == "import"
    assert (doc["models"], doc["roles"]) == (9, 6)
    assert any(e["key"] == "roles.old_worker" for e in doc["unmapped"])
    load_spec(out)
    code, _, err = run_cli(args[:-1])
    assert (code, err) == (
        2,
        f"error: {out} exists: pass --force to replace it, or --spec NEW.yaml",
    )


EDGE_REGISTRY = """\
runtime_defaults:
  model_base_path: {base}
roles:
  moe_lookup:
    model: {{name: Qwen3-Coder-30B-A3B-Instruct, path: {target}}}
    acceleration: {{type: moe_expert_reduction, experts: 4, k: 12, lookup: true}}
  twice:
    model: {{name: Qwen2.5-Coder-32B-Instruct, path: {target2}}}
    acceleration: {{type: speculative_decoding, draft_role: d, draft_k: 16, k: 24}}
  d:
    tier: D
    model: {{name: Qwen2.5-Coder-0.5B-Instruct, path: {draft}}}
"""


def test_k_in_the_wrong_place_or_twice_is_reported(site: Site, tmp_path: Path) -> None:
    src = tmp_path / "edge.yaml"
    src.write_text(
        EDGE_REGISTRY.format(
            base=site.models, target=QWEN3_30B, target2=QWEN25_32B, draft=QWEN25_05B
        )
    )
    with opened(site.db) as con:
        result = import_registry(con, src, tmp_path / "out.yaml")
    why = {e.key: e.note for e in result.unmapped}
    assert why["roles.moe_lookup.acceleration.k"] == "K without a draft: not imported"
    assert why["roles.twice.acceleration"] == (
        "K given twice with different values (k=24, draft_k=16); not imported"
    )
    cfg = result.doc["roles"]["moe_lookup"]["configs"]["default"]
    assert dict(cfg) == {"spec_type": ["ngram-cache"], "experts": 4}
    assert "draft_max" not in result.doc["roles"]["twice"]["configs"]["default"]
