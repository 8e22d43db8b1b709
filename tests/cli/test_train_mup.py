"""`archhpo train --from` replays a trial's parametrization and µP base width as stored, a family
without µP refuses it before any data is loaded, and the trials frame reads a trial without them
as the standard parametrization."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from archhpo.cli._main import main as cli_main
from archhpo.errors import ConfigError
from archhpo.report._columns import MUP_COLUMNS, _finish
from archhpo.workers import TrialSpec, build_trial
from tests.cli.test_train_from import TINY


def _train(tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any]) -> dict[str, Any]:
    best = copy.deepcopy(TINY)
    best["options"].update(options)
    path = tmp_path / "tiny_10K_best.json"
    path.write_text(json.dumps(best))
    code = cli_main(["train", "--from", str(path), "--device", "cpu", "--threads", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_train_from_replays_the_stored_parametrization_and_base_width(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mup = _train(tmp_path, capsys, {"parametrization": "mup", "mup_base_width": 16})
    assert (mup["parametrization"], mup["mup_base_width"]) == ("mup", 16)
    again = _train(tmp_path, capsys, {"parametrization": "mup", "mup_base_width": 16})
    assert again["val_loss"] == mup["val_loss"]  # the same trial, exactly
    sp = _train(tmp_path, capsys, {})
    assert (sp["parametrization"], sp["mup_base_width"]) == ("sp", None)
    assert sp["val_loss"] != mup["val_loss"]  # m = 2 trains another model
    at_base = _train(tmp_path, capsys, {"parametrization": "mup", "mup_base_width": 32})
    assert at_base["val_loss"] == sp["val_loss"]  # m = 1 is the standard model


def test_train_from_replays_completeps_base_depth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layers = TINY["architecture"]["n_layers"]
    mup = _train(tmp_path, capsys, {"parametrization": "mup", "mup_base_width": 16})
    other = _train(tmp_path, capsys, {"parametrization": "mup", "mup_base_width": 16, "mup_base_depth": 2 * layers})
    assert other["mup_base_depth"] == 2 * layers and mup["mup_base_depth"] is None
    assert other["val_loss"] != mup["val_loss"]  # branches ×2: another model
    at_base = _train(tmp_path, capsys, {"parametrization": "mup", "mup_base_width": 16, "mup_base_depth": layers})
    assert at_base["val_loss"] == mup["val_loss"]  # at its base depth CompleteP is µP


@pytest.mark.parametrize(("options", "needle"), [
    ({"parametrization": "ntk"}, "parametrization must be one of sp, mup, got 'ntk'"),
    ({"parametrization": "mup", "mup_base_width": 0}, "mup_base_width must be a positive integer d_model"),
    ({"parametrization": "mup", "mup_base_width": 16, "mup_base_depth": 0},
     "mup_base_depth must be a positive integer n_layers"),
    ({"parametrization": "mup"}, "A µP trial needs its base width and this one stores none"),
])
def test_a_bad_parametrization_in_the_file_is_refused_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any], needle: str) -> None:
    best = copy.deepcopy(TINY)
    best["options"].update(options)
    path = tmp_path / "tiny_10K_best.json"
    path.write_text(json.dumps(best))
    code = cli_main(["train", "--from", str(path), "--device", "cpu"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_a_family_without_mup_refuses_it_before_loading_data() -> None:
    spec = TrialSpec(family="char_cls", data={"kind": "synthetic", "n": 10**12}, options={"parametrization": "mup"},
                     info={}, arch={"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64}, params={})
    with pytest.raises(ConfigError, match="The char_cls family has no µP"):
        build_trial(spec, "cpu")  # a trillion rows would hang: the refusal comes first


def test_the_frame_reads_a_trial_without_a_parametrization_as_sp() -> None:
    frame = pd.DataFrame([{"trial": 0, "budget": "10K", "d_model": 32, "n_layers": 1, "param_count": 1},
                          {"trial": 1, "budget": "10K", "d_model": 64, "n_layers": 1, "param_count": 1,
                           "parametrization": "mup", "mup_base_width": "32"}])
    out = _finish(frame, "x", "csv")
    assert list(out["parametrization"]) == ["sp", "mup"]
    assert out["mup_base_width"].iloc[1] == 32.0 and pd.isna(out["mup_base_width"].iloc[0])
    assert set(MUP_COLUMNS) <= set(out.columns)
