"""The commented skeleton `specreg init` writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specreg.terms import SPEC_DRAFT_SIMPLE

if TYPE_CHECKING:
    from specreg.declare.deps import BestDraft, DiskModel

INIT_TEMPLATE = """\
# specreg.yaml: what this model collection is for. specreg keeps it true (`specreg plan`).
# Units: acceptance is a fraction (0.70), speeds are tokens/s, K is spelled draft_max.
version: 1

llama:
  # bin_dir: /opt/llama.cpp/build/bin   # the llama.cpp binaries to use
  dialect: auto                        # auto | current (--spec-type) | legacy (--draft-max)
  # threads: 96
  # numa: interleave=all               # numactl policy put in front of llama-server

roots: []                              # folders to scan, e.g. [/mnt/models]
stores: []                             # lmstudio | huggingface | llama-cpp | ollama
exclude: []                            # glob patterns, e.g. ["*/scratch/*"]

# Models by fingerprint (`specreg show PATH` prints the id), with names to refer to them by.
models: {}
#  3f9c...e1:
#    path: lmstudio/Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf
#    aliases: [qwen3-coder-30b]

# Roles bind a target model, a policy and pinned configurations per task.
roles: {}
#  coder:
#    target: qwen3-coder-30b
#    policy: quality                   # quality: all experts, lossless | speed: fewer experts ok
#    configs:
#      default:
#        draft: qwen3-coder-draft
#        draft_max: 16
#      code:                           # a list is a candidate set for `serve --policy adaptive`
#        - spec_type: none
#        - spec_type: ngram-mod
"""


_STORES_LINE = (
    "stores: []                             # lmstudio | huggingface | llama-cpp | ollama\n"
)


def init_template(
    models: Sequence[DiskModel],
    roots: Sequence[str] = (),
    best: Sequence[BestDraft] = (),
    env: Mapping[str, str] | None = None,
) -> str:
    """The skeleton with what the registry holds now, so `specreg plan` right after `specreg
    init` reports drift only when something changes: `models:` each with an alias of its name
    and quant (two quants of one model share a name), the `roots:` its scans read (a model
    store's folder as `stores:`), and a role for each target with the draft the auditor ranks
    first (`best`). An empty registry gives the skeleton as it is."""
    present = [m for m in models if m.status != "gone"]
    if not present:
        return INIT_TEMPLATE
    taken: dict[str, str] = {}
    lines = ["models:                                # the registry's models when init wrote this"]
    for m in present:
        taken[m.model_id] = alias = model_alias(m, taken)
        lines += [
            f"  {json.dumps(m.model_id)}:",
            f"    path: {json.dumps(m.path)}",  # JSON's escapes are YAML's double-quoted ones
            f"    aliases: [{alias}]",
        ]
    text = INIT_TEMPLATE.replace("models: {}\n", "\n".join(lines) + "\n", 1)
    text = _roots(text, roots, env)
    return _roles(text, [b for b in best if b.target_id in taken and b.draft_id in taken], taken)


def _roots(text: str, roots: Sequence[str], env: Mapping[str, str] | None) -> str:
    """`roots:` and `stores:` as the registry's scans read them."""
    from specreg.registry.stores import found_stores

    stores = {str(s.path): s.name for s in found_stores(env=env)}
    named = list(dict.fromkeys(stores[r] for r in roots if r in stores))
    folders = [r for r in roots if r not in stores]
    if folders:
        listed = "\n".join(f"  - {json.dumps(r)}" for r in folders)
        text = text.replace(
            "roots: []                              # folders to scan, e.g. [/mnt/models]\n",
            f"roots:                                 # the folders `specreg scan` read\n{listed}\n",
            1,
        )
    if named:
        text = text.replace(
            _STORES_LINE,
            f"stores: [{', '.join(named)}]  # the model stores `specreg scan` read\n",
            1,
        )
    return text


def _roles(text: str, best: Sequence[BestDraft], alias: Mapping[str, str]) -> str:
    """A role for each target, named by its alias, with the draft the auditor ranks first."""
    if not best:
        return text
    lines = ["roles:                                 # each target with its best draft"]
    for b in best:
        lines += [
            f"  {alias[b.target_id]}:",
            f"    target: {alias[b.target_id]}",
            "    configs:",
            f"      default:  # the draft `specreg drafts` ranks first ({b.verdict})",
            f"        draft: {alias[b.draft_id]}",
        ]
        if b.spec_type != SPEC_DRAFT_SIMPLE:
            lines.append(f"        spec_type: {b.spec_type}")
    return text.replace("roles: {}\n", "\n".join(lines) + "\n", 1)


def model_alias(m: DiskModel, taken: dict[str, str]) -> str:
    """An alias for declaring `m`: its name and quant (two quants of one model share a name),
    made unique against `taken` (model id -> alias) with the id's start."""
    from specreg.declare.importer import _alias

    return _alias(f"{m.name or Path(m.path).stem} {m.quant or ''}", m.model_id, taken)
