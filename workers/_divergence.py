"""Marking a worker's trial as diverged (models/_diverged.py: what counts and how it is worded)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from optuna.trial import TrialState

from archhpo.errors import NonFiniteLoss
from archhpo.models._diverged import diverged_reason, rising_loss
from archhpo.schema import Attr


def mark_diverged(run: Any, exc: Exception | None = None, history: Sequence[Mapping[str, float]] = ()) -> None:
    """Fail `run` (a workers._claim._TrialRun) as diverged where `exc` is a non-finite loss or a
    full-length `history` rose (`rising_loss`); anything else is left as it is."""
    rate = float(run.claim.params["learning_rate"])
    if isinstance(exc, NonFiniteLoss):
        run.attrs[Attr.FAIL_REASON] = diverged_reason(str(exc), rate)
    elif exc is None and run.state == TrialState.COMPLETE and (rose := rising_loss(history)):
        run.state, run.value = TrialState.FAIL, None
        run.attrs[Attr.FAIL_REASON] = diverged_reason(rose, rate)
