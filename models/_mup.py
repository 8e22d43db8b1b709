"""Which families may run under µP: those whose coordinate check runs in the test suite and passes.

µP is only as good as its check (docs/mup.md): a port that multiplies twice or misses the tied
head still trains, just without transfer.  tests/models/test_coord_check.py runs the check
(bench/coord_check.py) for every family in COORD_CHECKED and fails when one of its slopes leaves
±0.15, so a family is listed here only with a check that passed; `refuse_unchecked` turns a µP
study of any other family away in one sentence, at launch, before anything is built.  No torch.
"""

from __future__ import annotations

from archhpo.errors import ConfigError

COORD_CHECKED = ("lm",)  # families whose µP coordinate check is in the test suite and passes


def refuse_unchecked(family: str, parametrization: str | None) -> None:
    """Raise ConfigError for a µP (`parametrization` "mup") study of a family not in COORD_CHECKED."""
    if parametrization == "mup" and family not in COORD_CHECKED:
        raise ConfigError(f"--parametrization mup needs a coordinate check that passed for the family, and "
                          f"{family} has none (only {', '.join(COORD_CHECKED)}: docs/mup.md); drop "
                          f"--parametrization mup or study {' or '.join(COORD_CHECKED)}.")


__all__ = ["COORD_CHECKED", "refuse_unchecked"]
