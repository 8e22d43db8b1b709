"""`archhpo train --from`: the file is checked against its family before anything is built, a
--family that disagrees is refused, and a run says what it does (progress on stderr, the JSON
result last on stdout).  Every refusal: one sentence, exit 2, no traceback, nothing written."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from archhpo.cli._main import main as cli_main
from archhpo.cli._train import _check_memory
from archhpo.cli._train_file import BEST_KEYS, check_best, check_config, check_data, load_best
from archhpo.workers import TrialSpec
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]

# A best JSON as `archhpo export` writes it, for a model and data small enough to train in seconds.
TINY: dict[str, Any] = {
    "experiment": "tiny", "budget": "10K", "best_value": 3.0, "n_trials_completed": 1, "n_trials_pruned": 0,
    "timestamp": "2026-01-01T00:00:00+00:00", "study_name": "tiny_10K", "optuna_version": "4",
    "best_params": {"arch_idx": 0, "learning_rate": 3e-3, "epochs": 2, "batch_size": 16, "weight_decay": 1e-4,
                    "warmup_steps": 5},
    "architecture": {"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 64, "param_count": 10144},
    "family": "lm", "best_trial": 0, "plan_slot": 0, "n_trials_failed": 0, "n_trials_planned": 1,
    "baseline_val_loss": 3.4, "data": {"kind": "synthetic", "language": 0, "tokens": 4000, "vocab": 32, "order": 3},
    "options": {"horizon": 1, "threshold": 0.01, "quick": False, "seed": 7, "seq_len": 16, "schedule": "wsd",
                "cooldown": 0.2},
    "info": {"vocab_size": 32, "seq_len": 16}, "choices": {}, "seed": None,
    "flops_spent": 1, "flops_full_plan": 1,
}


def _write(tmp_path: Path, best: Any, raw: str | None = None) -> Path:
    path = tmp_path / "tiny_10K_best.json"
    path.write_text(raw if raw is not None else json.dumps(best))
    return path


def _changed(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    best = copy.deepcopy(TINY)
    node = best
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return best


def _refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             best: Any, *flags: str, raw: str | None = None) -> str:
    """Run `train --from` in this process; assert exit 2, one error line, nothing written; the line."""
    path = _write(tmp_path, best, raw)
    monkeypatch.chdir(tmp_path)
    code = cli_main(["train", "--from", str(path), "--device", "cpu", "--save", "out/model.pt", *flags])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and err.startswith("archhpo: error: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "a refusal writes nothing"
    return err


# the file's change -> what the one sentence says
REFUSALS: dict[str, tuple[tuple[str, ...], Any, str]] = {
    "unknown top-level key": (("notes",), "hi", "unknown key notes"),
    "unknown architecture key": (("architecture", "width"), 64, "unknown key architecture.width"),
    "unknown best_params key": (("best_params", "momentum"), 0.9, "unknown key best_params.momentum"),
    "unknown data key": (("data", "colour"), 3, "data.colour is not a setting of the lm family's synthetic data"),
    "a string d_model": (("architecture", "d_model"), "64", "architecture.d_model must be a positive integer"),
    "a bool for an integer": (("architecture", "n_layers"), True, "architecture.n_layers must be a positive integer"),
    "a list architecture": (("architecture",), [32, 1, 4, 64], "architecture must be a JSON object, got list"),
    "a float epochs": (("best_params", "epochs"), 2.5, "best_params.epochs must be an integer"),
    "a negative learning rate": (("best_params", "learning_rate"), -1e-3,
                                 "best_params.learning_rate must be a finite number above 0"),
    "a zero learning rate": (("best_params", "learning_rate"), 0.0,
                             "best_params.learning_rate must be a finite number above 0"),
    "a string learning rate": (("best_params", "learning_rate"), "fast", "best_params.learning_rate must be a number"),
    "n_heads not dividing d_model": (("architecture", "n_heads"), 3, "n_heads (3) must divide d_model (32)"),
    "dropout outside [0, 1)": (("info", "dropout"), 1.5, "dropout must be in [0, 1), got 1.5"),
    "data tokens beyond the cap": (("data", "tokens"), 10**12, "data.tokens = 1,000,000,000,000 is beyond 2,000,000,000"),
    "data that is not an object": (("data",), [1, 2], "data must be a JSON object, got list"),
    "a string data setting": (("data", "vocab"), "32", "data.vocab must be an integer"),
    "data its family refuses": (("data", "tokens"), 10, "the lm family refuses its data (tokens=10 is too few"),
    "a negative seed": (("seed",), -1, "seed must be a whole number of at least 0 or null"),
    "an unknown family": (("family",), "gpt", "Unknown family 'gpt'"),
    "a batch past the cap": (("best_params", "batch_size"), 10**9, "best_params.batch_size = 1,000,000,000 is beyond"),
    "epochs past the cap": (("best_params", "epochs"), 10**9, "best_params.epochs = 1,000,000,000 is beyond 100,000"),
    "a string option": (("options", "seed"), "x", "options.seed must be an integer, got 'x'"),
    "a switch that is not a bool": (("options", "quick"), "yes", "options.quick must be true or false"),
    "a negative option": (("options", "paired_seeds"), -2, "options.paired_seeds must be a finite number of at least 0"),
    "a malformed data budget": (("options", "data_budget"), {"unit": "tokens"}, "options.data_budget"),
    "an option the data refuses": (("options", "seq_len"), "long", "the lm family generates no 'synthetic' data"),
    "a choice the family has no flag for": (("choices", "encoder"), "sum", "unknown key choices.encoder"),
    "a d_model of 1e9": (("architecture", "d_model"), 10**9, "needs about"),
    "n_layers of 1e6": (("architecture", "n_layers"), 10**6, "needs about"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_best_json_train_cannot_trust_is_refused_in_one_sentence(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    where, value, sentence = REFUSALS[case]
    err = _refused(tmp_path, monkeypatch, capsys, _changed(where, value))
    assert sentence in err, err


def test_a_too_large_architecture_is_refused_with_the_workers_estimate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, monkeypatch, capsys, _changed(("architecture", "d_model"), 10**9))
    assert err.startswith(f"archhpo: error: The architecture from {tmp_path / 'tiny_10K_best.json'} (")
    assert "parameters) needs about" in err and "GiB to train but cpu has" in err and "lower the batch size" in err


def test_a_too_large_architecture_on_the_command_line_is_refused_alike(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code = cli_main(["train", "--family", "lm", "--d-model", str(10**9), "--n-layers", "2", "--n-heads", "4",
                     "--d-ff", "64", "--device", "cpu", "--save", "m.pt"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and list(tmp_path.iterdir()) == []
    assert err.startswith("archhpo: error: The architecture from the command line (") and "needs about" in err


def test_generated_data_past_its_cap_is_refused_on_the_command_line_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, monkeypatch, capsys, TINY, "--data", f"synthetic:tokens={10**12}")
    assert err == ("archhpo: error: --data: data.tokens = 1,000,000,000,000 is beyond 2,000,000,000, the most "
                   "archhpo generates in host memory before training; lower it or train on a file with --data.\n")


def test_a_nan_learning_rate_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.dumps(_changed(("best_params", "learning_rate"), float("nan")))
    assert "NaN" in raw  # Python's json writes (and reads) NaN: the file is valid to json.loads
    err = _refused(tmp_path, monkeypatch, capsys, None, raw=raw)
    assert "best_params.learning_rate must be a finite number above 0, got nan" in err


@pytest.mark.parametrize(("flag", "sentence"), [
    (("--batch-size", "0"), "--batch-size must be a finite number of at least 1, got 0."),
    (("--learning-rate", "nan"), "--learning-rate must be a finite number above 0, got nan."),
    (("--epochs", str(10**9)), "--epochs = 1,000,000,000 is beyond 100,000"),
])
def test_a_training_flag_over_the_file_is_held_to_the_same_bounds(
        flag: tuple[str, str], sentence: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, monkeypatch, capsys, TINY, *flag)
    assert err.startswith(f"archhpo: error: {sentence}"), err


def test_a_corrupt_file_and_a_json_list_get_the_same_sentence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = _refused(tmp_path, monkeypatch, capsys, None, raw='{"experiment": ')
    listed = _refused(tmp_path, monkeypatch, capsys, None, raw="[1, 2, 3]")
    assert corrupt == listed and "does not hold a best-config JSON object" in corrupt


def _subprocess_refusal(res: subprocess.CompletedProcess[str], tmp_path: Path, names: list[str]) -> str:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("archhpo: error: "), res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == names, "a refusal writes nothing"
    return lines[0]


def test_a_json_list_is_refused_without_a_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, [TINY])
    res = run_cli("train", "--from", str(path), "--device", "cpu", "--save", "m.pt", cwd=tmp_path)
    line = _subprocess_refusal(res, tmp_path, [path.name])
    assert line == (f"archhpo: error: {path} does not hold a best-config JSON object; pass a *_best.json "
                    "written by `archhpo run` or `archhpo export`.")


def test_a_family_flag_that_disagrees_with_the_file_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, TINY)
    res = run_cli("train", "--family", "patchtst", "--from", str(path), "--device", "cpu", cwd=tmp_path)
    line = _subprocess_refusal(res, tmp_path, [path.name])
    assert line == ("archhpo: error: --family patchtst disagrees with the file's family lm; "
                    "drop --family or pass a patchtst best JSON.")


def test_train_from_a_tiny_json_prints_progress_on_stderr_and_its_json_last_on_stdout(tmp_path: Path) -> None:
    path = _write(tmp_path, TINY)
    res = run_cli("train", "--family", "lm", "--from", str(path), "--device", "cpu", "--threads", "1",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert lines[0] == f"archhpo train: lm d32-L1-h4-ff64 (10,144 parameters) from {path}, 2 epochs on cpu"
    progress = [line for line in lines if line.startswith("epoch ")]
    assert [p.split(":")[0] for p in progress] == ["epoch 1/2", "epoch 2/2"], res.stderr
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["epochs_run"] == 2 and result["param_count"] == 10144
    printed = [float(p.split("val_loss ")[1].split()[0]) for p in progress]
    assert f"{result['val_loss']:.4f}" == f"{min(printed):.4f}"


def _repo_best_jsons() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*_best.json"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.mark.parametrize("name", _repo_best_jsons())
def test_every_best_json_in_the_repository_validates(name: str) -> None:
    path = str(REPO / name)
    best = load_best(path)
    assert set(best) <= BEST_KEYS
    fam = check_best(best, path)
    check_data(fam, best["data"], best["options"], path)
    arch = {**best["architecture"], "choices": best["choices"]}
    cfg = check_config(fam, arch, {**best["info"], **best["choices"]}, path)
    assert fam.param_count(cfg) == best["architecture"]["param_count"]
    params = {k: v for k, v in best["best_params"].items() if k != "arch_idx"}
    trial = TrialSpec(family=fam.name, data=best["data"], options=best["options"], info=best["info"],
                      arch=arch, params=params, slot=best["plan_slot"] or 0, seed=best["seed"])
    _check_memory(trial, torch.device("cpu"), name)  # raises MemoryRefused if it would not fit
