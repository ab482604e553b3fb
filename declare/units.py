"""Normalising the spellings hand-written registries use into specreg's units.

Acceptance arrives as "70.1%", 8.52 (a percentage without the sign), "0.62" or 0.62; K arrives
as `k`, `draft_k`, `draft_max` or `speculative_k`. specreg keeps one spelling and one unit.
"""

from __future__ import annotations

import re
from typing import Any

K_KEYS = ("k", "draft_k", "draft_max", "speculative_k")
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(%|x|t/s|tok/s|tps)?\s*$", re.IGNORECASE)


class UnitError(ValueError):
    """A value whose unit cannot be decided; the message says why."""


def acceptance_fraction(value: Any) -> float:
    """Acceptance as a fraction in [0, 1].

    "70.1%" -> 0.701; 8.52 -> 0.0852 (a bare number above 1 is a percentage); 0.62 -> 0.62.
    """
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not an acceptance rate")
    if isinstance(value, (int, float)):
        x, pct = float(value), False
    elif isinstance(value, str):
        m = _NUM.match(value)
        if not m or (m.group(2) or "%") != "%":
            raise UnitError(f"{value!r} is not a number or a percentage")
        x, pct = float(m.group(1)), m.group(2) == "%"
    else:
        raise UnitError(f"{value!r} is not an acceptance rate")
    if pct or x > 1.0:
        x /= 100.0
    if not 0.0 <= x <= 1.0:
        raise UnitError(f"{value!r} is above 100 %")
    return round(x, 6)


def tokens_per_s(value: Any) -> float:
    """A speed in tokens/s; ranges such as "14.4-20.8" and ratios such as "1.61x" are refused."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a speed")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = _NUM.match(value)
        if m and (m.group(2) or "t/s").lower() in ("t/s", "tok/s", "tps"):
            return float(m.group(1))
        if m and m.group(2).lower() == "x":
            raise UnitError(f"{value!r} is a ratio, not a speed")
        raise UnitError(f"{value!r} is not a single speed in tokens/s")
    raise UnitError(f"{value!r} is not a speed")


def draft_max(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
        raise UnitError(f"{value!r} is not a number of draft tokens (1..256)")
    return int(value)
