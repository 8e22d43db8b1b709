"""A diverged trial: its loss became non-finite, or its training loss ended more than
DIVERGED_MARGIN above its first epoch's.  That is the learning rate's doing (too high for the
model, as a rate carried up a µP ladder can be: microsoft/mup#22 met NaN at 1.3B with a rate
whose coordinate check had passed), not the architecture's, so the trial fails with a reason that
starts with DIVERGED and names its rate, and the report counts it apart from the failed
architectures (report/_failures.py).  A failure with a reason is final: retrying repeats it.
The words and the rule live here, without torch, so that the report reads them without importing
the trainer; workers/_divergence.py marks the trial.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DIVERGED = "diverged"  # the first word of a diverged trial's fail_reason
DIVERGED_MARGIN = 0.10  # a training loss ending 10% above its first epoch's mean went up, not down


def diverged_reason(what: str, learning_rate: float) -> str:
    """'diverged at learning rate 0.02: <what>'."""
    return f"{DIVERGED} at learning rate {learning_rate:.3g}: {what}"


def is_diverged(reason: object) -> bool:
    """Whether a trial's fail_reason says it diverged."""
    return isinstance(reason, str) and reason.startswith(f"{DIVERGED} ")


def rising_loss(history: Sequence[Mapping[str, float]]) -> str | None:
    """What rose, where the last epoch's training loss ends above the first epoch's by more than
    DIVERGED_MARGIN (the first epoch's mean holds the loss at initialisation); else None."""
    if len(history) < 2:
        return None
    first, last = float(history[0]["train_loss"]), float(history[-1]["train_loss"])
    if last <= first * (1 + DIVERGED_MARGIN):
        return None
    return (f"the training loss rose from {first:.4g} in epoch {int(history[0]['epoch'])} to {last:.4g} "
            f"in epoch {int(history[-1]['epoch'])}")


__all__ = ["DIVERGED", "DIVERGED_MARGIN", "diverged_reason", "is_diverged", "rising_loss"]
