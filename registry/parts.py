"""What a scan knows about a file without its header in memory: enough to regroup split sets
and recognise models on a no-change rescan, which never imports the header parser, numpy or
gguf (`facts.py` builds these from parsed headers)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# llama.cpp's split naming: PREFIX-00001-of-00008.gguf
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class PartInfo:
    """What the scanner keeps per file, enough to regroup split sets without re-reading."""

    split_no: int  # 0-based, as in the split.no key
    split_count: int
    header_sha256: str
    n_params: int
    n_tensors: int


@dataclass(frozen=True)
class VocabBlob:
    """A vocabulary as found: the serialized token strings and their types, not yet encoded
    (the registry compresses only the ones it does not hold already)."""

    vocab_sha: str
    n_tokens: int
    tokens_raw: bytes
    token_types: bytes | None


def model_id_for(first_part_sha: str) -> str:
    """Physical identity: the first part's header hash (metadata and tensor table)."""
    return first_part_sha[:16]
