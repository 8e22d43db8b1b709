"""Panel data: synthetic generator, CSV/Parquet loader, windows, chronological split, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from archhpo.errors import DataError
from archhpo.models.data import panel
from archhpo.models.patchtst import base_rate_loss

QUICK = {"quick": True, "seed": 0}


def _load(text: str = "synthetic", **options):
    spec = panel.parse_data(text, options)
    return spec, panel.load_data(spec, options)


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    lines = [",".join(columns)] + [",".join(str(r[c]) for c in columns) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _time_panel(path: Path, symbols: int = 3, steps: int = 60, shuffle: bool = False) -> Path:
    """A CSV whose feature 'clock' is the step itself, so windows reveal which steps they used."""
    rng = np.random.default_rng(0)
    rows = [
        {"symbol": f"S{s}", "sector": f"K{s % 2}", "date": str(np.datetime64("2024-01-01") + t),
         "price": 100.0 + t + s, "clock": float(t), "noise": float(rng.normal())}
        for s in range(symbols) for t in range(steps)
    ]
    if shuffle:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    return _write_csv(path, rows, ["symbol", "sector", "date", "price", "clock", "noise"])


# ----------------------------------------------------------------------------- synthetic


def test_parse_synthetic_defaults_and_options() -> None:
    spec = panel.parse_data("synthetic", {})
    assert spec == {"kind": "synthetic", "symbols": 100, "sectors": 5, "features": 8, "steps": 400, "seed": 0}
    spec = panel.parse_data("synthetic:symbols=30, sectors=3,features=4,steps=150,seed=7", {})
    assert [spec[k] for k in ("symbols", "sectors", "features", "steps", "seed")] == [30, 3, 4, 150, 7]
    assert panel.parse_data("synthetic", {"seed": 5})["seed"] == 5  # the study seed when none is given


@pytest.mark.parametrize(
    ("text", "options", "needle"),
    [
        ("synthetic:colour=3", {}, "Unknown synthetic option"),
        ("synthetic:symbols=lots", {}, "must be an integer"),
        ("synthetic:symbols=3,sectors=5", {}, "sectors must be between 1 and symbols"),
        ("synthetic:steps=30", {}, "too few steps"),
        ("synthetic", {"val_fraction": 1.5}, "val_fraction"),
        ("synthetic", {"horizon": 0}, "horizon must be a positive integer"),
        ("synthetic", {"seq_len": 2.5}, "seq_len must be a positive integer"),
        ("/no/such/file.csv", {}, "does not exist"),
    ],
)
def test_parse_errors_are_one_clear_sentence(text: str, options: dict, needle: str) -> None:
    with pytest.raises(DataError, match=needle) as err:
        panel.parse_data(text, options)
    msg = str(err.value)
    assert msg.endswith(".") and "\n" not in msg


def test_shapes_info_and_positive_rate() -> None:
    spec, data = _load(**QUICK)
    info = panel.data_info(spec, QUICK)
    assert info == {"num_numerical": 8, "cat_cardinalities": [50, 5], "seq_len": 20}
    x, cat = data.train_inputs
    assert x.dtype == torch.float32 and cat.dtype == torch.int64 and data.train_target.dtype == torch.float32
    assert x.shape[1:] == (20, 8) and cat.shape[1] == 2 and data.val_inputs[0].shape[1:] == (20, 8)
    assert int(cat[:, 0].max()) < 50 and int(cat[:, 1].max()) < 5
    assert 0.2 <= data.info["train_positive_rate"] <= 0.45
    # the full panel at the default options
    assert panel.data_info(panel.parse_data("synthetic", {}), {})["cat_cardinalities"] == [100, 5]


def test_synthetic_is_deterministic() -> None:
    _, a = _load(**QUICK)
    _, b = _load(**QUICK)
    _, c = _load(quick=True, seed=1)
    assert torch.equal(a.train_inputs[0], b.train_inputs[0]) and torch.equal(a.val_target, b.val_target)
    assert not torch.equal(a.train_inputs[0], c.train_inputs[0])


def test_split_has_no_overlap_and_a_gap() -> None:
    task = panel._task({**QUICK, "horizon": 2})
    p = panel._synthetic_panel(*panel._synthetic_shape(panel.parse_data("synthetic", QUICK), True), 0)
    train_end, val_end = panel._split(p, task, "test")
    last_train_step = p.time[train_end + task.horizon].max()  # label step of the latest training sample
    first_val_step = p.time[val_end - task.seq_len + 1].min()  # first step any validation window reads
    assert last_train_step < first_val_step
    assert p.time[val_end].min() - p.time[train_end].max() == task.seq_len + task.horizon
    assert p.time[val_end].max() == p.n_times - 1 - task.horizon


def test_standardised_with_training_statistics() -> None:
    _, data = _load(**QUICK)
    last = data.train_inputs[0][:, -1]  # (S, N): nearly every training row once
    assert last.mean(0).abs().max() < 0.15 and (last.std(0) - 1).abs().max() < 0.15


def test_categorical_ids_carry_signal() -> None:
    _, data = _load(**QUICK)
    cat, y = data.train_inputs[1], data.train_target
    sector_rate = torch.bincount(cat[:, 1], weights=y) / torch.bincount(cat[:, 1])
    assert float(sector_rate.max() - sector_rate.min()) > 0.1
    # Predicting each symbol's training label rate beats the global base rate on validation.
    n_sym = data.info["cat_cardinalities"][0]
    pos = torch.bincount(cat[:, 0], weights=y, minlength=n_sym)
    rate = (pos + 1) / (torch.bincount(cat[:, 0], minlength=n_sym) + 2)  # smoothed per-symbol label rate
    p = rate[data.val_inputs[1][:, 0]].float()
    per_symbol = float(torch.nn.functional.binary_cross_entropy(p, data.val_target))
    assert per_symbol < base_rate_loss(data) - 0.03


# ----------------------------------------------------------------------------- files


def test_csv_windows_labels_and_split(tmp_path: Path) -> None:
    path = _time_panel(tmp_path / "panel.csv")
    options = {"seq_len": 5, "horizon": 2, "threshold": 0.015}
    spec, data = _load(str(path), **options)
    assert spec["kind"] == "file" and spec["format"] == "csv"
    assert panel.data_info(spec, options) == {"num_numerical": 2, "cat_cardinalities": [3, 2], "seq_len": 5}
    x, cat = data.train_inputs
    # clock is standardised with the training rows (steps 0..cut-1), so steps are recoverable.
    cut = panel._cut(60, 0.2)
    mean, std = np.arange(cut).mean(), np.arange(cut).std()
    steps = (x[..., 0].double() * std + mean).round()  # (S, T)
    assert torch.all(steps.diff(dim=1) == 1)  # consecutive steps of one symbol
    vsteps = (data.val_inputs[0][..., 0].double() * std + mean).round()
    assert steps[:, -1].max() + 2 < cut <= vsteps[:, 0].min()  # train labels and val windows apart
    assert data.val_inputs[0][..., 0].mean() > 1.0  # validation is not re-standardised on itself
    # labels: price = 100 + t + s, move over 2 steps = 2 / (100 + t + s)
    t_end = steps[:, -1]
    expected = (2.0 / (100.0 + t_end + cat[:, 0].double()) > 0.015).float()
    assert torch.equal(data.train_target, expected)


def test_csv_row_order_follows_dates_and_parquet_matches(tmp_path: Path) -> None:
    ordered = _load(str(_time_panel(tmp_path / "a.csv")), seq_len=5)[1]
    shuffled = _load(str(_time_panel(tmp_path / "b.csv", shuffle=True)), seq_len=5)[1]
    assert torch.equal(ordered.train_inputs[0], shuffled.train_inputs[0])
    assert torch.equal(ordered.val_target, shuffled.val_target)
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    pq.write_table(pacsv.read_csv(tmp_path / "a.csv"), tmp_path / "a.parquet")
    spec, parquet = _load(str(tmp_path / "a.parquet"), seq_len=5)
    assert spec["format"] == "parquet" and torch.equal(parquet.train_inputs[0], ordered.train_inputs[0])


def _small_csv(tmp_path: Path, header: str, row: str, n: int = 60) -> str:
    path = tmp_path / "bad.csv"
    path.write_text(header + "\n" + "\n".join(row.format(i=i, p=100 + i) for i in range(n)) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("header", "row", "n", "needle"),
    [
        ("symbol,sector,f1", "A,X,{i}", 60, "no 'price' column"),
        ("symbol,f1,price", "A,{i},{p}", 60, "no 'sector' column"),
        ("symbol,sector,price", "A,X,{p}", 60, "no feature columns"),
        ("symbol,sector,price,f1", "A,X,{p},abc", 60, "non-numeric value 'abc' at row 1"),
        ("symbol,sector,price,f1", "A,X,-{p},1", 60, "non-positive"),
        ("symbol,sector,price,f1", "A,X,{p},{i}", 10, "too few steps"),
        ("symbol,sector,date,price,f1", "A,X,2024-01-01,{p},{i}", 60, "one date"),
        ("symbol,sector,date,price,f1", "A,X,someday,{p},{i}", 60, "not dates"),
    ],
)
def test_csv_errors(tmp_path: Path, header: str, row: str, n: int, needle: str) -> None:
    with pytest.raises(DataError, match=needle) as err:
        panel.parse_data(_small_csv(tmp_path, header, row, n), {"seq_len": 5})
    msg = str(err.value)
    assert msg.endswith(".") and "bad.csv" in msg and "\n" not in msg


def test_non_numeric_in_the_middle_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "mid.csv"
    rows = [f"A,X,{100 + i},{i if i != 37 else 'n/a?'}" for i in range(60)]
    path.write_text("symbol,sector,price,f1\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"'f1'.*'n/a\?' at row 38"):
        panel.parse_data(str(path), {})


def test_min_steps_is_tight() -> None:
    task = panel._task({"seq_len": 20, "horizon": 1})
    need = panel._min_steps(task)
    _, data = _load(f"synthetic:symbols=2,sectors=1,steps={need}", seq_len=20)
    assert data.n_train >= 1 and data.n_val >= 1
    with pytest.raises(DataError, match="too few steps"):
        panel.parse_data(f"synthetic:steps={need - 1}", {"seq_len": 20})


def test_file_spec_pins_content(tmp_path: Path) -> None:
    path = _time_panel(tmp_path / "p.csv")
    spec = panel.parse_data(str(path), {"seq_len": 5})
    assert (spec["symbols"], spec["sectors"], spec["features"]) == (3, 2, ["clock", "noise"])
    assert len(spec["sha256"]) == 64
    path.write_text(path.read_text().replace("S0,", "S9,", 1))
    with pytest.raises(DataError, match="has changed since the study recorded it"):
        panel.load_data(spec, {"seq_len": 5})


def test_info_carries_model_options() -> None:
    # Workers build configs from the stored info, so launch-time model flags must travel in it.
    info = panel.data_info(panel.parse_data("synthetic", {}), {"variant": "tabular", "out_dim": None})
    assert info["variant"] == "tabular" and "out_dim" not in info
