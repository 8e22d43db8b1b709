"""Successive halving's rung arithmetic: pure functions of a study's settings and a rung's scores.

Rungs are fractions of each trial's own planned length: min_fraction, min_fraction*eta, ... and
always the full length.  Every trial of a study has the same number of rungs, so rung k means the
same thing for a 50-epoch and a 100-epoch trial; a short trial whose fractions round to the same
epoch is scored there again without training.  A rung's decision is a deterministic function of
its scores (ties broken by plan slot), so every worker that computes it, before or after a crash,
computes the same one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from archhpo.config import StoredOptions
from archhpo.errors import StudyError
from archhpo.schema import DEFAULT_ETA


def parse_fraction(text: str | float) -> Fraction:
    """'1/9' or '0.111' -> a Fraction in (0, 1]; anything else is refused with one sentence."""
    try:
        value = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        raise StudyError(f"--min-fraction {text!r} is not a number; give a fraction such as 1/9.") from None
    if not 0 < value <= 1:
        raise StudyError(f"--min-fraction {text} must be in (0, 1]; give a fraction such as 1/9.")
    return value


def rung_fractions(eta: int, min_fraction: Fraction) -> list[Fraction]:
    """min_fraction * eta**k below 1, then 1: the same rungs for every trial of a study."""
    if eta < 2:
        raise StudyError(f"--eta {eta} must be at least 2 (the best 1/eta of a rung go on).")
    out: list[Fraction] = []
    fraction = Fraction(min_fraction)
    while fraction < 1:
        out.append(fraction)
        fraction *= eta
    return [*out, Fraction(1)]


def rung_epochs(epochs: int, eta: int, min_fraction: Fraction) -> list[int]:
    """The epochs at which a trial of `epochs` planned epochs is scored: one per rung, never
    falling, at least 1, the last = epochs (a short trial may be scored twice at one epoch)."""
    return [min(epochs, max(1, math.floor(epochs * f))) for f in rung_fractions(eta, min_fraction)]


def promotions(scores: Mapping[int, float], eta: int) -> list[int]:
    """The plan slots promoted from a complete rung: the best len//eta (at least one), by score,
    ties broken by the lower slot. A non-finite score (a failed trial) is never promoted."""
    finite = sorted((score, slot) for slot, score in scores.items() if math.isfinite(score))
    keep = max(1, len(scores) // eta) if finite else 0
    return sorted(slot for _, slot in finite[:keep])


@dataclass(frozen=True)
class Halving:
    """A study's successive-halving settings (stored in its options as {"eta", "min_fraction"}, and
    "trust": "ladder" on a --ladder: rungs judged only where the ladder trusts them, search/_trust.py)."""

    eta: int = DEFAULT_ETA
    min_fraction: Fraction = Fraction(1, 9)
    ladder: bool = False

    @classmethod
    def from_options(cls, options: StoredOptions) -> Halving | None:
        h = options.halving
        return None if not h else cls(int(h["eta"]), parse_fraction(h["min_fraction"]), h.get("trust") == "ladder")

    def as_option(self) -> dict[str, Any]:
        trust = {"trust": "ladder"} if self.ladder else {}  # only then: other studies keep their identity
        return {"eta": self.eta, "min_fraction": str(self.min_fraction), **trust}

    @property
    def n_rungs(self) -> int:
        return len(rung_fractions(self.eta, self.min_fraction))

    def epochs(self, epochs: int) -> list[int]:
        return rung_epochs(epochs, self.eta, self.min_fraction)

    def check_schedule(self, schedule: str, cooldown: float) -> None:
        """Under WSD a rung below full length must fall before the cooldown: its score is a
        cooldown branched from the constant-rate state there."""
        last = rung_fractions(self.eta, self.min_fraction)[-2:-1]
        if schedule == "wsd" and last and last[0] > 1 - Fraction(str(cooldown)):
            raise StudyError(
                f"The rung at {last[0]} of a trial falls inside the WSD cooldown (the last {cooldown} of the "
                "steps); use a smaller --cooldown, --eta or --min-fraction.")
