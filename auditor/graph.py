"""The compatibility graph: models as nodes with their facts, edges where speculation works.

Vocabulary compatibility is symmetric, so the graph is undirected; an edge's attributes describe
the direction that makes sense (the smaller model drafting for the larger) and keep the other
direction's verdict too. Tokenizer families (models sharing a token-text fingerprint) are node
attributes, so GraphML viewers and the JSON export can colour or group them as clusters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import networkx as nx

from specreg.auditor.audit import AuditResult
from specreg.auditor.store import StoredEdge
from specreg.auditor.verdict import Verdict
from specreg.registry.queries import ModelRecord

NODE_FACTS = (
    "name",
    "path",
    "architecture",
    "n_params",
    "n_params_active",
    "n_bytes",
    "quant",
    "vocab_type",
    "tok_model",
    "tok_pre",
    "n_tokens",
    "tok_fingerprint",
    "is_moe",
    "is_recurrent",
    "is_hybrid",
    "draft_kind",
    "nextn_predict_layers",
    "is_mmproj",
)


def tokenizer_families(models: Iterable[ModelRecord]) -> dict[str, str]:
    """model id -> family label: models with one token-text fingerprint share a label."""
    by_fp: dict[str, list[ModelRecord]] = {}
    for m in models:
        by_fp.setdefault(m.tok_fingerprint or f"none:{m.model_id}", []).append(m)
    out: dict[str, str] = {}
    for fp, ms in by_fp.items():
        names = sorted({m.tok_pre or m.tok_model or "?" for m in ms})
        label = f"{'/'.join(names)}:{fp[:8]}" if not fp.startswith("none:") else "no-vocab"
        for m in ms:
            out[m.model_id or ""] = label
    return out


def _scalar(value: Any) -> Any:
    """GraphML takes scalars only: None becomes empty, sequences become comma lists."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return value


def graph_from_edges(
    models: Iterable[ModelRecord], edges: Iterable[StoredEdge], families: dict[str, str]
) -> nx.Graph:
    g = nx.Graph()
    size: dict[str, int] = {}
    for m in models:
        mid = m.model_id or ""
        g.add_node(
            mid,
            **{k: _scalar(getattr(m, k)) for k in NODE_FACTS},
            family=families.get(mid, ""),
            label=m.display_name,
        )
        size[mid] = m.n_params or 0
    by_pair = {(e.target_id, e.draft_id): e for e in edges}

    def usable(e: StoredEdge | None) -> bool:
        return e is not None and Verdict(e.verdict) is not Verdict.INCOMPATIBLE

    for (t, d), e in sorted(by_pair.items()):
        if not usable(e) or t not in g or d not in g:
            continue
        reverse = by_pair.get((d, t))
        # One edge per unordered pair, oriented the way speculation makes sense: the smaller
        # model drafts for the larger (ties: the larger id drafts), unless only one way works.
        if usable(reverse) and (size.get(t, 0), d) < (size.get(d, 0), t):
            continue
        g.add_edge(
            t, d, target=t, draft=d, verdict=e.verdict,
            llama_accepts=_scalar(e.llama_accepts), findings=_scalar(e.findings),
            reverse_verdict=reverse.verdict if reverse else Verdict.INCOMPATIBLE.value,
        )  # fmt: skip
    return g


def graph_from_audit(models: list[ModelRecord], result: AuditResult) -> nx.Graph:
    edges = [
        StoredEdge(p.target_id, p.draft_id, p.verdict.value, p.llama_accepts, p.findings)
        for p in result.pairs
    ]
    return graph_from_edges(models, edges, tokenizer_families(models))


def to_json(g: nx.Graph) -> dict[str, Any]:
    families: dict[str, list[str]] = {}
    for node, fam in g.nodes(data="family"):
        families.setdefault(fam or "", []).append(node)
    data = nx.node_link_data(g, edges="edges")
    data["clusters"] = [{"family": f, "models": sorted(ms)} for f, ms in sorted(families.items())]
    return data


def to_graphml(g: nx.Graph) -> str:
    from specreg.text import xml_safe

    return xml_safe("\n".join(nx.generate_graphml(g, prettyprint=True)))


# `graph export --format json`: the node-link document in specreg's versioned envelope.
JSON_KIND = "graph"
JSON_VERSION = "1"


def json_document(g: nx.Graph) -> dict[str, Any]:
    from specreg.jsonout import document

    return document(JSON_KIND, JSON_VERSION, to_json(g))
