"""Every use of a private part of Optuna, in one place.

archhpo writes Optuna's tables in one transaction per claim or finish (search/_tables.py) through
Optuna's ORM models, which are not public API, and reads a few private attributes.  They are all
here, so that a new Optuna release is checked against one short file, and the schema versions
archhpo was tested with are refused otherwise (see check_schema_version in _storage.py).
pyproject.toml bounds optuna below the next minor version for the same reason.
"""

from __future__ import annotations

import optuna
from optuna.storages._rdb import models  # noqa: F401  (re-exported: `from ..._optuna_private import models as m`)

# Optuna's alembic revisions (the `alembic_version` table) of the schemas archhpo has been tested
# with: the queue's SQL is written for exactly these tables and columns.  v3.2.0.a is the head of
# optuna 3.2 .. 5.0.  A database at another revision is refused before anything is written.
TESTED_SCHEMA_VERSIONS: tuple[str, ...] = ("v3.2.0.a",)
ALEMBIC_TABLE = "alembic_version"
# Tables of Optuna's schema that archhpo indexes (names of its ORM's __tablename__).
TRIALS_TABLE = models.TrialModel.__tablename__


def study_id_of(study: optuna.Study) -> int:
    """The database id of a study (Optuna keeps it in a private attribute)."""
    return int(study._study_id)


def rdb_storage_of(study: optuna.Study) -> optuna.storages.RDBStorage | None:
    """The RDBStorage behind a study (Optuna wraps it in a private caching storage), else None."""
    storage = study._storage
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, optuna.storages.RDBStorage) else None


def trial_id_of(trial: optuna.trial.FrozenTrial) -> int:
    """The database id of a trial (FrozenTrial keeps it in a private attribute)."""
    return int(trial._trial_id)


def dashboard_note_body(system_attrs: dict[str, object]) -> str:
    """The body of a study's optuna-dashboard note ('' when none): optuna-dashboard stores notes in
    the study's system attributes in chunks, and only its private `_note` module reads them back."""
    from optuna_dashboard._note import get_note_from_system_attrs

    return str((get_note_from_system_attrs(system_attrs, None) or {}).get("body") or "")

