"""The units of the figures specreg takes and prints, and the bounds no real host or model
passes.

Sizes are decimal everywhere: a GB is 10^9 bytes, in memory, model files, budgets and memory
bandwidth (GB/s), the unit `specreg.registry.queries.human_bytes` prints. A size a user writes
may say GiB (2^30 bytes) explicitly; a bare `16G` is 16 GB.

A value past a bound is a usage error before anything starts (`specreg/cli/common.py`): a
typo (`--cores 100000000`, `--ctx 99999999999`) otherwise reaches arithmetic that overflows,
a 47-trillion t/s bound, or llama.cpp, which refuses it after loading.
"""

from __future__ import annotations

import math
import re

GB = 10**9

# Decimal units and their binary spellings, as a size is written (`16G`, `512MB`, `1.5GiB`).
_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]?)(I?)(B?)\s*$", re.I)

# Bounds: generous past the biggest machines and models there are.
MAX_CORES = 4096  # physical cores (specreg.yaml's llama.threads has the same bound)
MAX_THREADS = MAX_CORES
MAX_BANDWIDTH_GBS = 20_000.0  # GB/s: HBM3e accelerators read ~8 TB/s; no CPU host comes near
MAX_MEMORY_BYTES = 64 * 10**12  # the largest single-image servers hold 32-48 TB
MAX_TEMPERATURE = 10.0  # llama.cpp takes any; past ~2 sampling is noise
MAX_CTX = 1 << 24  # tokens per request: past the longest trained contexts (~10M)
MAX_SLOTS = 256  # llama-server slots (-np) per backend; each holds its own context
INT32_MAX = 2**31 - 1  # llama.cpp reads -c, -np and -t as 32-bit ints


def parse_size(text: str) -> int:
    """Bytes of a size as a user writes it: `16G` or `16GB` (decimal), `1.5GiB` (binary),
    `512M`, `123456` (bytes). ValueError for anything else, or a size that is not positive."""
    m = _SIZE.match(str(text))
    if m is None or (m.group(3) and not m.group(2)):
        raise ValueError(text)
    number, unit, binary = float(m.group(1)), m.group(2).upper(), bool(m.group(3))
    scale = _BINARY[unit] if binary else _DECIMAL[unit]
    size = number * scale
    if not math.isfinite(size) or size < 1:
        raise ValueError(text)
    return int(size)
