"""`launch`/`run --isoflop C`: the IsoFLOP studies' settings, centred on the prior, a stated
--centre, or (--centre-from EXPERIMENT) the law that experiment's report fits from the database."""

from __future__ import annotations

import math
from typing import Any

from archhpo.config import StudyConfig
from archhpo.errors import StudyError


def isoflop_law(experiment: str, storage_url: str) -> dict[str, Any]:
    """N_opt = G·C^a of `experiment` as its report fits it: Approach 2's ``isoflop_fit`` where fitted,
    else Approach 3's compute-optimal allocation of its fitted L(N, D) (report/_answer.py)."""
    from archhpo.report._answer import nd_fit
    from archhpo.report._frame import trials_frame
    from archhpo.report._isoflop import isoflop_fit

    frame = trials_frame(experiment, storage=storage_url, curves=False)
    iso = isoflop_fit(frame)
    if iso.get("status") == "fitted":
        return iso
    nd = nd_fit(frame)
    if nd.get("status") != "fitted":
        raise StudyError(f"--centre-from {experiment}: neither its IsoFLOP law ({iso.get('reason')}) nor its "
                         f"L(N, D) law ({nd.get('reason')}) is fitted; give --centre instead.")
    _, a, b, alpha, beta = (float(nd[name]["estimate"]) for name in ("E", "A", "B", "alpha", "beta"))
    exponent, k = beta / (alpha + beta), float(nd["flops_per_param_token"])
    g = (alpha * a / (beta * b)) ** (1.0 / (alpha + beta)) * k ** -exponent
    if not math.isfinite(g):
        raise StudyError(f"--centre-from {experiment}: its L(N, D) law gives no finite N_opt(C); give --centre.")
    return {"status": "fitted", "G": g, "a": {"estimate": exponent}, "source": "nd_fit"}


def isoflop_all(config: StudyConfig, storage_url: str) -> list[Any]:
    """Each --isoflop C's settings (search/_isoflop_study.py), smallest C first."""
    from archhpo.search._isoflop_study import isoflop_settings

    source = config.isoflop.centre_from
    return isoflop_settings(config, isoflop_law(source, storage_url) if source else None)


__all__ = ["isoflop_all", "isoflop_law"]
