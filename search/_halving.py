"""Successive halving's rung arithmetic: pure functions of a study's settings and a rung's scores.

Rungs are fractions of each trial's own planned length: min_fraction, min_fraction*eta, ... and
always the full length. A rung's decision is a deterministic function of its scores (ties broken
by plan slot), so every worker that computes it, before or after a crash, computes the same one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from archhpo.errors import StudyError


def parse_fraction(text: str | float) -> Fraction:
    """'1/9' or '0.111' -> a Fraction in (0, 1]; anything else is refused with one sentence."""
    try:
        value = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        raise StudyError(f"--min-fraction {text!r} is not a number; give a fraction such as 1/9.") from None
    if not 0 < value <= 1:
        raise StudyError(f"--min-fraction {text} must be in (0, 1]; give a fraction such as 1/9.")
    return value


def rung_epochs(epochs: int, eta: int, min_fraction: Fraction) -> list[int]:
    """The epochs at which a trial of `epochs` planned epochs is scored: rising, the last = epochs.

    Fractions that round to the same epoch (a short trial) are one rung, never an empty one."""
    if eta < 2:
        raise StudyError(f"--eta {eta} must be at least 2 (the best 1/eta of a rung go on).")
    rungs: list[int] = []
    fraction = Fraction(min_fraction)
    while fraction < 1:
        e = max(1, math.floor(epochs * fraction))
        if e < epochs and (not rungs or e > rungs[-1]):
            rungs.append(e)
        fraction *= eta
    return [*rungs, epochs]


def promotions(scores: Mapping[int, float], eta: int) -> list[int]:
    """The plan slots promoted from a complete rung: the best len//eta (at least one), by score,
    ties broken by the lower slot. A non-finite score (a failed trial) is never promoted."""
    finite = sorted((score, slot) for slot, score in scores.items() if math.isfinite(score))
    keep = max(1, len(scores) // eta) if finite else 0
    return sorted(slot for _, slot in finite[:keep])
