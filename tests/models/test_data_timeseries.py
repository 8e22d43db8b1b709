"""Tests for models/data/timeseries.py: the synthetic generator, file parsing, labels and the split."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from archhpo.errors import DataError
from archhpo.models.data import timeseries as ts

SMALL = {"context_length": 5, "horizon": 1, "threshold": 0.0, "val_fraction": 0.25}


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join([",".join(header)] + [",".join(str(v) for v in r) for r in rows]) + "\n")
    return path


def price_table(n: int = 40, seed: int = 0) -> dict[str, list[float]]:
    """A small zig-zag price with two features; returns move both ways so both classes occur."""
    rng = np.random.default_rng(seed)
    price = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, n)))
    return {
        "date": [f"2024-01-{i + 1:02d}" for i in range(n)],
        "price": price.round(4).tolist(),
        "a": rng.normal(size=n).round(4).tolist(),
        "b": np.arange(n, dtype=float).tolist(),
    }


def write_table_csv(path: Path, cols: dict[str, list[object]]) -> Path:
    names = list(cols)
    return write_csv(path, names, [list(r) for r in zip(*(cols[n] for n in names), strict=True)])


def load(text: str, options: dict) -> ts.TensorDataset:
    return ts.load_data(ts.parse_data(text, options), options)


# --------------------------------------------------------------------------- synthetic


def test_synthetic_spec_defaults_quick_and_seed_from_options() -> None:
    assert ts.parse_data("synthetic", {}) == {"kind": "synthetic", "features": 8, "steps": 20000, "seed": 0}
    assert ts.parse_data("synthetic", {"quick": True, "seed": 7})["steps"] == 4000
    assert ts.parse_data("synthetic:steps=900,seed=3,features=4", {"quick": True, "seed": 7}) == {
        "kind": "synthetic", "features": 4, "steps": 900, "seed": 3,
    }


def test_synthetic_is_deterministic_for_a_seed() -> None:
    a, b = (load("synthetic:steps=600,seed=5", {}) for _ in range(2))
    assert torch.equal(a.train_inputs[0], b.train_inputs[0]) and torch.equal(a.val_target, b.val_target)
    assert a.info == b.info


def test_different_seeds_give_different_series() -> None:
    (xa, pa_), (xb, pb) = ts.generate(8, 500, 0), ts.generate(8, 500, 1)
    assert not np.allclose(xa, xb) and not np.allclose(pa_, pb)


def test_synthetic_data_with_one_feature_loads_with_both_classes() -> None:
    data = load("synthetic:features=1,steps=800", {})
    assert data.train_inputs[0].shape[-1] == 1 and 0 < data.info["train_pos_rate"] < 1


def test_shapes_dtypes_and_info_are_plain() -> None:
    data = load("synthetic:steps=600", {})
    x, y = data.train_inputs[0], data.train_target
    assert x.shape == (data.n_train, 60, 8) and y.shape == (data.n_train,)
    assert x.dtype == y.dtype == torch.float32 and x.is_contiguous() and data.val_inputs[0].is_contiguous()
    info = data.info
    assert set(info) >= {"num_features", "n_train", "n_val", "train_pos_rate", "val_pos_rate", "horizon", "threshold"}
    assert all(type(v) in (int, float) for v in info.values())
    assert (info["n_train"], info["n_val"], info["num_features"]) == (data.n_train, data.n_val, 8)


def test_data_info_is_cheap_and_matches_loaded_data(tmp_path: Path) -> None:
    # A trillion steps would take forever to generate: data_info must not generate.
    assert ts.data_info({"kind": "synthetic", "features": 5, "steps": 10**12, "seed": 0}, {}) == {"num_features": 5}
    path = write_table_csv(tmp_path / "d.csv", price_table(200))
    spec = ts.parse_data(str(path), {})
    assert ts.data_info(spec, {})["num_features"] == 2 == ts.load_data(spec, {}).info["num_features"]
    schema_only = {k: v for k, v in spec.items() if k != "features"}
    assert ts.data_info(schema_only, {})["num_features"] == 2


# --------------------------------------------------------------------------- windows, labels, split


def test_features_standardised_with_training_rows_only() -> None:
    data = load("synthetic:steps=1500,seed=2", {})
    train = data.train_inputs[0].double()
    rows = torch.cat([train[:, 0, :], train[-1, 1:, :]])  # every row covered by a training window once
    assert rows.shape[0] == data.n_train + 59
    assert rows.mean(0).abs().max() < 1e-5 and (rows.std(0, unbiased=False) - 1).abs().max() < 1e-4


@pytest.mark.parametrize("horizon,threshold", [(1, 0.0), (2, 0.01), (3, 0.02)])
def test_labels_match_hand_computation_on_csv(tmp_path: Path, horizon: int, threshold: float) -> None:
    cols = price_table(40)
    path = write_table_csv(tmp_path / "d.csv", cols)
    opts = {**SMALL, "horizon": horizon, "threshold": threshold}
    data = load(str(path), opts)
    L, p = 5, cols["price"]
    n_train, val_start, n_val = ts.split_bounds(40, ts._options(opts))
    expected = [1.0 if p[i + L - 1 + horizon] / p[i + L - 1] - 1 > threshold else 0.0 for i in range(40 - L - horizon + 1)]
    assert data.train_target.tolist() == expected[:n_train]
    assert data.val_target.tolist() == expected[val_start: val_start + n_val]
    assert (data.info["horizon"], data.info["threshold"]) == (horizon, threshold)
    # Window i holds rows i..i+L-1 of the standardised features, in file order ("b" is the row index).
    b = np.asarray(cols["b"])
    mean, std = b[: n_train + L - 1].mean(), b[: n_train + L - 1].std()
    assert np.allclose(data.train_inputs[0][3, :, 1].numpy(), (b[3:3 + L] - mean) / std, atol=1e-5)


def test_threshold_and_horizon_change_the_positive_rate() -> None:
    spec = ts.parse_data("synthetic:steps=3000", {})
    low = ts.load_data(spec, {"threshold": 0.0})
    high = ts.load_data(spec, {"threshold": 0.02})
    assert low.info["train_pos_rate"] > high.info["train_pos_rate"]
    assert ts.load_data(spec, {"horizon": 5}).info["horizon"] == 5


def test_validation_windows_overlap_neither_training_windows_nor_their_horizon(tmp_path: Path) -> None:
    n, horizon, L = 120, 3, 5
    cols = price_table(n)
    path = write_table_csv(tmp_path / "d.csv", cols)
    opts = {**SMALL, "horizon": horizon}
    data = load(str(path), opts)
    # Undo the standardisation of column "b" (= row index) to recover each window's rows.
    train_rows = np.arange(data.n_train + L - 1, dtype=float)
    to_row = lambda x: torch.round(x.double() * train_rows.std() + train_rows.mean()).long()  # noqa: E731
    train_idx, val_idx = to_row(data.train_inputs[0][..., 1]), to_row(data.val_inputs[0][..., 1])
    last_train_label_row = int(train_idx.max()) + horizon
    assert int(val_idx.min()) == last_train_label_row + 1
    assert int(val_idx.max()) + horizon == n - 1  # the last window uses the last price
    assert data.n_train + data.n_val == n - L - horizon + 1 - (L + horizon - 1)
    assert abs(data.n_val / (data.n_train + data.n_val) - 0.25) < 0.02


def test_parquet_and_csv_give_identical_tensors(tmp_path: Path) -> None:
    cols = price_table(60)
    csv = write_table_csv(tmp_path / "d.csv", cols)
    pq.write_table(pa.table(cols), tmp_path / "d.parquet")
    pq.write_table(pa.table(cols), tmp_path / "d.pq")
    a, b, c = (load(str(p), SMALL) for p in (csv, tmp_path / "d.parquet", tmp_path / "d.pq"))
    for other in (b, c):
        assert torch.equal(a.train_inputs[0], other.train_inputs[0]) and torch.equal(a.val_inputs[0], other.val_inputs[0])
        assert torch.equal(a.train_target, other.train_target) and torch.equal(a.val_target, other.val_target)


def test_file_spec_records_columns_hash_and_ignores_date(tmp_path: Path) -> None:
    path = write_table_csv(tmp_path / "d.csv", price_table(40))
    spec = ts.parse_data(str(path), SMALL)
    assert spec["kind"] == "file" and spec["path"] == str(path.resolve()) and spec["format"] == "csv"
    assert (spec["price_column"], spec["date_column"], spec["features"], spec["rows"]) == ("price", "date", ["a", "b"], 40)
    assert len(spec["sha256"]) == 64


def test_price_column_option_selects_another_column(tmp_path: Path) -> None:
    cols = price_table(40)
    cols["close"] = cols.pop("price")
    path = write_table_csv(tmp_path / "d.csv", cols)
    spec = ts.parse_data(str(path), {**SMALL, "price_column": "close"})
    assert spec["price_column"] == "close" and spec["features"] == ["a", "b"] and spec["date_column"] == "date"


def test_changed_file_is_refused_on_load(tmp_path: Path) -> None:
    path = write_table_csv(tmp_path / "d.csv", price_table(40))
    spec = ts.parse_data(str(path), SMALL)
    write_table_csv(path, price_table(40, seed=1))
    with pytest.raises(DataError, match="changed since the study recorded it"):
        ts.load_data(spec, SMALL)


# --------------------------------------------------------------------------- errors


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist; check the path or use --data synthetic"):
        ts.parse_data(str(tmp_path / "nope.csv"), {})
    with pytest.raises(DataError, match=r"is a directory; pass a .csv or .parquet file"):
        ts.parse_data(str(tmp_path), {})


def test_unknown_extension_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_text("price,a\n1,2\n")
    with pytest.raises(DataError, match=r"unknown extension '.txt'; use a .csv, .parquet or .pq"):
        ts.parse_data(str(path), {})


def test_malformed_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"this is not parquet")
    with pytest.raises(DataError, match=r"could not be read as PARQUET"):
        ts.parse_data(str(path), {})
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=r"could not be read as CSV"):
        ts.parse_data(str(empty), {})


def test_missing_price_column_names_the_fix(tmp_path: Path) -> None:
    cols = price_table(40)
    cols["close"] = cols.pop("price")
    path = write_table_csv(tmp_path / "d.csv", cols)
    with pytest.raises(DataError, match=r"has no 'price' column; add one or pass --price-column NAME"):
        ts.parse_data(str(path), SMALL)


def test_no_feature_columns_is_refused(tmp_path: Path) -> None:
    cols = price_table(40)
    path = write_table_csv(tmp_path / "d.csv", {"date": cols["date"], "price": cols["price"]})
    with pytest.raises(DataError, match=r"no feature columns besides 'price'"):
        ts.parse_data(str(path), SMALL)


def test_non_numeric_cell_names_column_and_row(tmp_path: Path) -> None:
    cols = price_table(40)
    cols["a"][6] = "oops"
    path = write_table_csv(tmp_path / "d.csv", cols)
    with pytest.raises(DataError, match=r"non-numeric value 'oops' in column 'a' at row 7 \(line 8\)"):
        ts.parse_data(str(path), SMALL)


def test_empty_or_nan_cell_names_column_and_row(tmp_path: Path) -> None:
    cols = price_table(40)
    cols["b"][3] = ""
    with pytest.raises(DataError, match=r"empty cell in column 'b' at row 4"):
        ts.parse_data(str(write_table_csv(tmp_path / "d.csv", cols)), SMALL)
    cols = price_table(40)
    cols["a"][9] = float("nan")
    pq.write_table(pa.table(cols), tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"NaN or infinite value in column 'a' at row 10"):
        ts.parse_data(str(tmp_path / "d.parquet"), SMALL)


def test_non_positive_price_is_refused(tmp_path: Path) -> None:
    cols = price_table(40)
    cols["price"][12] = 0
    with pytest.raises(DataError, match=r"non-positive price 0 at row 13; prices must be above zero"):
        ts.parse_data(str(write_table_csv(tmp_path / "d.csv", cols)), SMALL)


def test_too_few_rows_says_how_many_are_needed(tmp_path: Path) -> None:
    path = write_table_csv(tmp_path / "d.csv", price_table(100))
    with pytest.raises(DataError, match=r"has 100 rows but needs at least 122 .*window of 60 steps plus horizon 1"):
        ts.parse_data(str(path), {})
    with pytest.raises(DataError, match=r"Synthetic data has 100 rows but needs at least 122"):
        ts.parse_data("synthetic:steps=100", {})


@pytest.mark.parametrize("text,pattern", [
    ("synthetic:colour=3", r"Unknown synthetic data setting 'colour=3'; use synthetic:features=F,steps=N,seed=S"),
    ("synthetic:steps", r"Unknown synthetic data setting 'steps'"),
    ("synthetic:steps=1e4", r"steps='1e4' is not an integer"),
    ("synthetic:features=0", r"at least 1 feature"),
])
def test_bad_synthetic_spec_is_refused(text: str, pattern: str) -> None:
    with pytest.raises(DataError, match=pattern):
        ts.parse_data(text, {})


def test_constant_labels_suggest_another_threshold() -> None:
    with pytest.raises(DataError, match=r"All training labels are 0 .* pass a different --threshold"):
        load("synthetic:steps=600", {"threshold": 5.0})


def test_bad_options_are_refused() -> None:
    with pytest.raises(DataError, match=r"horizon must be a positive integer"):
        ts.parse_data("synthetic", {"horizon": 0})
    with pytest.raises(DataError, match=r"val_fraction must be strictly between 0 and 1"):
        ts.parse_data("synthetic", {"val_fraction": 1.0})


# --------------------------------------------------------------------------- learnability


def test_default_synthetic_data_is_learnable_beyond_the_base_rate() -> None:
    data = load("synthetic", {})
    assert 0.2 <= data.info["train_pos_rate"] <= 0.4 and 0.2 <= data.info["val_pos_rate"] <= 0.4
    torch.manual_seed(0)
    xtr, xva = (x[0][:, -4:, :].reshape(len(x[0]), -1) for x in (data.train_inputs, data.val_inputs))
    model = torch.nn.Sequential(torch.nn.Linear(xtr.shape[1], 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    for _ in range(200):
        opt.zero_grad()
        bce(model(xtr).squeeze(-1), data.train_target).backward()
        opt.step()
    with torch.no_grad():
        learned = float(bce(model(xva).squeeze(-1), data.val_target))
    p, y = float(data.train_target.mean()), data.val_target
    base = float(-(y * math.log(p) + (1 - y) * math.log(1 - p)).mean())
    assert learned < 0.9 * base, (learned, base)
