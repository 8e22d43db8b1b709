"""`archhpo dashboard` serves optuna-dashboard on 127.0.0.1 and shows architecture attributes, the
objective named val_loss, the architecture keys before arch_idx and a note on the importance plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import optuna
from optuna_dashboard import save_note
from optuna_dashboard._note import get_note_from_system_attrs

from archhpo.cli._dashboard import prepare_studies
from archhpo.report._notes import importance_note
from archhpo.schema import ARCH_KEYS, ARCH_RECORD
from archhpo.search import launch, open_storage, prepare_settings
from archhpo.search._space import PARAM_NAMES
from tests.conftest import TINY_DATA, _free_port, run_cli, wait_for


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_dashboard_lists_study_with_architecture_attrs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    common = ["--experiment", "dash", "--budget", "200K", "--storage", url]
    assert run_cli("launch", *common, "--trials", "4", "--quick", "--data", TINY_DATA).returncode == 0
    assert run_cli("worker", *common).returncode == 0
    port = _free_port()
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "archhpo", "dashboard", "--storage", url, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                _get(f"{base}/api/studies")
                return True
            except OSError:
                return False

        assert wait_for(up, timeout=60), "dashboard answered"
        studies = _get(f"{base}/api/studies")["study_summaries"]
        study = next(s for s in studies if s["study_name"] == "dash_200K")
        detail = _get(f"{base}/api/studies/{study['study_id']}")
        trial = detail["trials"][0]
        keys = {a["key"] for a in trial["user_attrs"]}
        assert {"d_model", "n_layers", "n_heads", "d_ff", "param_count"} <= keys
        assert {p["name"] for p in trial["params"]} >= {"arch_idx", "learning_rate"}
        assert detail["objective_names"] == ["val_loss"]  # not "Objective 0"
        for t in detail["trials"]:
            assert [p["name"] for p in t["params"]] == [*ARCH_KEYS, *PARAM_NAMES]  # the architecture first
            assert [a["key"] for a in t["user_attrs"]][:5] == list(ARCH_RECORD)
        n = sum(t["state"] == "Complete" for t in detail["trials"])
        assert detail["note"]["body"] == importance_note(n)
        assert f"this study's {n} complete trials" in detail["note"]["body"]
        # Bound to loopback only: no listener on the machine's other addresses.
        listeners = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        lines = [ln for ln in listeners.splitlines() if f":{port} " in ln]
        assert lines and all("127.0.0.1" in ln for ln in lines), listeners
    finally:
        proc.terminate()
        proc.wait(10)


def test_prepare_studies_names_the_objective_and_keeps_the_report_note(tmp_path: Path) -> None:
    """Old studies are fixed before serving: the objective is named, the report's answer stays at the
    top of the note and the importance paragraph is replaced by a current one; a study that is not
    archhpo's is left alone."""
    url = f"sqlite:///{tmp_path / 'n.db'}"
    launch(url, prepare_settings("old", "200K", family="patchtst", data=TINY_DATA, quick=True, n_trials=4))
    storage = open_storage(url)
    other = optuna.create_study(study_name="someone_else", storage=storage)
    study = optuna.load_study(study_name="old_200K", storage=storage)
    save_note(study, "## Answer for budget 200K\n\n**Best:** trial 3\n\n" + importance_note(7))
    assert prepare_studies(storage) == 1
    assert study.metric_names == ["val_loss"] and other.metric_names is None
    attrs = storage.get_study_system_attrs(study._study_id)
    body = get_note_from_system_attrs(attrs, None)["body"]
    assert body == "## Answer for budget 200K\n\n**Best:** trial 3\n\n" + importance_note(0)
    assert importance_note(0).startswith("**Importance plot:** the dashboard ranks parameters with Optuna's "
                                         "PED-ANOVA on the best 10% of this study's 0 complete trials. Optuna "
                                         "advises at least 5 trials in that 10%, so 50 complete trials; with 0 "
                                         "the bars are not a measurement. ")
    assert "not a measurement" not in importance_note(50)
    version = attrs["dashboard:note_ver"]
    assert prepare_studies(storage) == 1  # nothing new: the note is not written again
    again = storage.get_study_system_attrs(study._study_id)
    assert again["dashboard:note_ver"] == version
    assert get_note_from_system_attrs(storage.get_study_system_attrs(other._study_id), None)["body"] == ""
