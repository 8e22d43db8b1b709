"""What the report reads from the database beside `frame_from_storage`'s rows (issue 31).

`use_stored_values` gives each PRUNED trial the value Optuna stores for it (its score at the rung
where it was stopped), the number the CSV (`archhpo export`) and the dashboard show; without one it
keeps the best validation loss it reached.  So every table, figure and file holds one value per
trial.  `study_data` names the data kind of each study (synthetic, text, ...) for the loss's unit.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def use_stored_values(frame: pd.DataFrame, storage: Any) -> int:
    """Replace the ``val_loss`` of PRUNED rows by their stored objective value where they have one;
    returns how many changed.  One query over the pruned trials' ids."""
    import sqlalchemy as sa

    from archhpo.search._optuna_private import models as m

    pruned = frame.index[(frame["state"] == "PRUNED") & frame["trial_id"].notna()]
    if not len(pruned):
        return 0
    ids = {int(frame.at[i, "trial_id"]): i for i in pruned}
    v = m.TrialValueModel.__table__.c
    changed = 0
    with storage.engine.connect() as conn:
        rows = conn.execute(sa.select(v.trial_id, v.value, v.value_type)
                            .where(v.trial_id.in_(list(ids)), v.objective == 0)).all()
    for tid, value, kind in rows:
        stored = m.TrialValueModel.stored_repr_to_value(value, kind)
        if stored is not None and math.isfinite(stored):
            frame.at[ids[tid], "val_loss"] = float(stored)
            changed += 1
    return changed


def study_data(storage: Any, studies: dict[str, str]) -> list[dict[str, Any]]:
    """The data spec (``kind``, ...) of each study, from its user attributes."""
    from archhpo.search._study import StudySettings

    out = []
    for name in studies.values():
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
        out.append(dict(StudySettings.from_attrs(attrs, name).data))
    return out


__all__ = ["study_data", "use_stored_values"]
