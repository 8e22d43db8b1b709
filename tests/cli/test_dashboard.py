"""`archhpo dashboard` serves optuna-dashboard on 127.0.0.1 and shows architecture attributes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

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
        # Bound to loopback only: no listener on the machine's other addresses.
        listeners = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        lines = [ln for ln in listeners.splitlines() if f":{port} " in ln]
        assert lines and all("127.0.0.1" in ln for ln in lines), listeners
    finally:
        proc.terminate()
        proc.wait(10)
