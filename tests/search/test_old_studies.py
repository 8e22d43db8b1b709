"""Old studies still load: the studies committed to the repository (written by earlier archhpo
versions) read back as typed settings (PlanEntry plan, StoredOptions options), write back byte for
byte what they store, and relaunch as the same study without a change."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from archhpo.config import StoredOptions
from archhpo.schema import DataBudget
from archhpo.search import PlanEntry, StudySettings, launch, open_storage
from archhpo.search._study import read_settings
from tests.conftest import REPO

OLD_STUDIES = [REPO / "docs" / "examples" / "compute_optimal.db", REPO / "bench" / "truths" / "studies" / "t1.db",
               REPO / "bench" / "truths" / "studies" / "t2.db", REPO / "docs" / "encoder_audit_study" / "audit.db"]


def _stored(db: Path) -> dict[str, dict[str, str]]:
    """Every archhpo study's user attributes as the database holds them: study name -> key -> JSON text."""
    out: dict[str, dict[str, str]] = {}
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT s.study_name, a.key, a.value_json FROM study_user_attributes a "
                            "JOIN studies s ON s.study_id = a.study_id")
        for name, key, text in rows:
            out.setdefault(name, {})[key] = text
    return {name: attrs for name, attrs in out.items() if "archhpo_plan" in attrs}


@pytest.mark.parametrize("db", OLD_STUDIES, ids=lambda p: p.name)
def test_an_old_study_reads_typed_and_writes_back_byte_for_byte(db: Path) -> None:
    studies = _stored(db)
    assert studies, f"{db} holds no archhpo study"
    for name, texts in studies.items():
        attrs = {k: json.loads(v) for k, v in texts.items()}
        settings = StudySettings.from_attrs(attrs, name)
        assert isinstance(settings.options, StoredOptions) and settings.plan
        assert all(isinstance(e, PlanEntry) for e in settings.plan)
        written = {k: json.dumps(v) for k, v in settings.to_attrs().items()}
        assert {k: written[k] for k in texts if k in written} == {k: v for k, v in texts.items() if k in written}, name
        assert settings.to_attrs() == {k: v for k, v in attrs.items() if k in written}, name
        # The typed options are what the stored dict says.
        raw = attrs["archhpo_options"]
        assert settings.options.seed == raw["seed"] and settings.options.data_seed == raw.get("data_seed")
        assert settings.options.budget == DataBudget.of(raw) and settings.options.paired_seeds == raw.get("paired_seeds", 0)


@pytest.mark.parametrize("db", OLD_STUDIES, ids=lambda p: p.name)
def test_an_old_study_relaunches_as_itself_and_nothing_is_rewritten(db: Path, tmp_path: Path) -> None:
    copy = tmp_path / db.name
    shutil.copy(db, copy)
    before = _stored(copy)
    url = f"sqlite:///{copy}"
    storage = open_storage(url, create=False)
    for name in before:
        settings = read_settings(storage, name)
        result = launch(url, settings, storage=storage)  # refuses any difference from what is stored
        assert not result.created and result.settings == settings
    assert _stored(copy) == before, "relaunching rewrote a stored attribute"
