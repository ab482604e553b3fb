"""The commented skeleton `specreg init` writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specreg.declare.deps import DiskModel

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


def init_template(models: Sequence[DiskModel]) -> str:
    """The skeleton with `models:` declaring what the registry holds now, so `specreg plan`
    right after `specreg init` reports drift only when something changes; each model gets an
    alias of its name and quant (two quants of one model share a name). An empty registry
    gives the skeleton as it is."""
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
    return INIT_TEMPLATE.replace("models: {}\n", "\n".join(lines) + "\n", 1)


def model_alias(m: DiskModel, taken: dict[str, str]) -> str:
    """An alias for declaring `m`: its name and quant (two quants of one model share a name),
    made unique against `taken` (model id -> alias) with the id's start."""
    from specreg.declare.importer import _alias

    return _alias(f"{m.name or Path(m.path).stem} {m.quant or ''}", m.model_id, taken)
