"""What the report's one loss number is: its metric name, its unit, and which value a pruned trial has.

The value of a trial is Optuna's objective value, the one the CSV, the dashboard and every figure and
table show: ``val_loss``, the validation cross-entropy in nats, averaged per predicted
token for the ``lm`` family (per byte when it reads a text file, whose tokens are bytes) and per
sample for the classification families: each family's ``Family.loss_per`` says which.  A pruned
trial's value is its score at the rung where it was stopped (under a WSD schedule that is the loss
after the rung's cooldown), or the best validation loss it reached when it was stopped without a
score.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from archhpo.models import family_names, get_family
from archhpo.schema import OBJECTIVE

METRIC = OBJECTIVE  # the objective's name in Optuna (study.set_metric_names), the CSV and the report


def data_kinds(infos: Iterable[Mapping[str, Any]]) -> list[str]:
    """The data kinds ("synthetic", "text", ...) of the studies' data specs, sorted, without repeats."""
    return sorted({str(d.get("kind")) for d in infos if isinstance(d, Mapping) and d.get("kind")})


def study_data(storage: Any, studies: dict[str, str]) -> list[dict[str, Any]]:
    """The data spec (``kind``, ...) of each study, read from its stored settings."""
    from archhpo.search._settings import StudySettings

    out = []
    for name in studies.values():
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
        out.append(dict(StudySettings.from_attrs(attrs, name).data))
    return out


def loss_unit(frame: pd.DataFrame) -> str:
    """'nats per token', 'nats per byte' or 'nats per sample' for the experiment's family and data:
    each family's ``loss_per`` of the studies' one data kind (None when unknown or several); 'nats'
    when the families' units differ or none is known."""
    families = {str(f) for f in frame["family"].dropna()} if "family" in frame else set()
    kinds = set(frame.attrs.get("data_kinds") or [])
    kind = next(iter(kinds)) if len(kinds) == 1 else None
    if frame.attrs.get("truth") and kind != "text":
        kind = "synthetic"  # a known entropy rate is a synthetic language's (report/_truth.py)
    units = {_loss_per(name, kind) for name in families}
    return f"nats per {units.pop()}" if len(units) == 1 else "nats"


def _loss_per(family: str, kind: str | None) -> str:
    """The family's ``loss_per``; a family no longer registered (an old CSV's) is read per sample."""
    return get_family(family).loss_per(kind) if family in family_names() else "sample"


def short_unit(frame: pd.DataFrame) -> str:
    """The unit for an axis label or a table header: 'nats/token', 'nats/byte', 'nats/sample'."""
    unit = loss_unit(frame).split(" (")[0]
    return unit.replace(" per ", "/")


def value_text(frame: pd.DataFrame) -> str:
    """One sentence for the page: what every loss on it is, in which unit, pruned trials included."""
    pruned = int((frame["state"] == "PRUNED").sum()) if "state" in frame else 0
    text = (f"Every loss on this page is {METRIC}, the validation cross-entropy in {loss_unit(frame)}: a trial's "
            "value in the study, the same number as in the CSV, the dashboard and the figures. A complete "
            "trial's value is the best validation loss of its full-length training")
    if pruned:
        text += (f"; a pruned trial's ({pruned} here) is its score at the rung where it was stopped (after the "
                 "rung's cooldown under a WSD schedule), or the best loss it reached when it has no score")
    return text + "."


__all__ = ["METRIC", "data_kinds", "loss_unit", "short_unit", "study_data", "value_text"]
