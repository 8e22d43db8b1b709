"""Budget strings: 2M, 20M, 200M, 2B, 500K, 1.5B or plain integers."""

from __future__ import annotations

import re

from archhpo.errors import BudgetError

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([KMBG]?)\s*$", re.IGNORECASE)



def parse_budget(text: str | int) -> int:
    """Parse '2M' → 2_000_000, '1.5B' → 1_500_000_000, '500K', '123456'."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _PATTERN.match(str(text))
        if not m:
            raise BudgetError(
                f"Cannot read budget {text!r}; write it like 2M, 20M, 1.5B, 500K or a plain integer."
            )
        value = round(float(m.group(1)) * _SUFFIX[m.group(2).upper()])
    if value <= 0:
        raise BudgetError(f"Budget {text!r} must be a positive number of parameters, e.g. 2M.")
    return int(value)


def format_budget(value: int) -> str:
    """Canonical label used in study names and file names: 2000000 → '2M', 1500000000 → '1.5B'."""
    for suffix, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if value >= scale and (value * 1000) % scale == 0:
            text = f"{value / scale:.3f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return str(value)


def budget_label(text: str | int) -> str:
    """Normalise user input to the canonical label ('2m' → '2M', '2000000' → '2M')."""
    return format_budget(parse_budget(text))
