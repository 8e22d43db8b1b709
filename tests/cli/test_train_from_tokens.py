"""`archhpo train --from` a best JSON whose data is a token file: the file is read again through
its own spec (path, vocabulary, dtype), and a file that changed since is refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from archhpo.models import get_family
from tests.cli.test_train_from import TINY
from tests.conftest import run_cli


def _token_file(path: Path, seed: int) -> Path:
    np.random.default_rng(seed).integers(0, 256, size=6000, dtype=np.uint16).tofile(path)
    return path


def _best(tmp_path: Path, tokens: Path) -> Path:
    best = copy.deepcopy(TINY)
    options = {**best["options"], "val_fraction": 0.1}
    best["data"] = get_family("lm").parse_data(f"tokens:{tokens},vocab=256", options)
    best["info"] = {"vocab_size": 256, "seq_len": 16}
    best["architecture"] = {"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64,
                            "param_count": get_family("lm").param_count(get_family("lm").config_for(
                                {"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64}, best["info"]))}
    out = tmp_path / "tok_10K_best.json"
    out.write_text(json.dumps(best))
    return out


def test_a_token_file_study_replays_from_its_best_json_and_a_changed_file_is_refused(tmp_path: Path) -> None:
    tokens = _token_file(tmp_path / "train.bin", 0)
    best = _best(tmp_path, tokens)
    res = run_cli("train", "--from", str(best), "--device", "cpu", "--threads", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1])["param_count"] == json.loads(
        best.read_text())["architecture"]["param_count"]
    _token_file(tokens, 1)  # the same size, other ids
    res = run_cli("train", "--from", str(best), "--device", "cpu", "--threads", "1", cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "has changed since the study" in res.stderr
    assert res.stderr.strip().count("\n") == 0
