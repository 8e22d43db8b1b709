"""The multisignal data: spec parsing, determinism, target definition, quantile bins, series split."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from archhpo.errors import DataError
from archhpo.models.data import multisignal as ms

SMALL = "multisignal:series=40,length=30,channels=5,seed=3"


@pytest.fixture(scope="module")
def small() -> tuple[dict, object]:
    spec = ms.parse_data(SMALL, {})
    return spec, ms.load_data(spec, {})


# ---------------------------------------------------------------------------- parsing


def test_parse_defaults_and_alias() -> None:
    expected = {"kind": "multisignal", "series": 512, "length": 160, "channels": 8, "seed": 0, "num_bins": 32}
    assert ms.parse_data("multisignal", {}) == expected
    assert ms.parse_data("synthetic", {}) == expected
    assert ms.parse_data(" Synthetic ", {"seed": None}) == expected


def test_parse_keys_win_over_options() -> None:
    spec = ms.parse_data("multisignal:series=64,length=40,channels=5,seed=3", {"seed": 9, "num_bins": 16})
    assert spec == {"kind": "multisignal", "series": 64, "length": 40, "channels": 5, "seed": 3, "num_bins": 16}
    assert ms.parse_data("multisignal", {"seed": 9})["seed"] == 9
    assert ms.parse_data("multisignal:bins=10", {"num_bins": 16})["num_bins"] == 10


@pytest.mark.parametrize(
    "text, options, match",
    [
        ("prices.csv", {}, "trains only on the embedded data"),
        ("multisignal:channels=3", {}, "at least 4 channels"),
        ("multisignal", {"channels": 2}, "at least 4 channels"),
        ("multisignal:series=5", {}, "at least 10 series"),
        ("multisignal:length=8", {}, "length must be at least"),
        ("multisignal:num_bins=1", {}, "num_bins must be at least 2"),
        ("multisignal:series=many", {}, "series must be an integer"),
        ("multisignal:width=3", {}, "Cannot read 'width=3'"),
        ("multisignal:series", {}, "Cannot read 'series'"),
        ("multisignal", {"num_bins": 2.5}, "num_bins must be an integer"),
    ],
)
def test_parse_errors_are_one_clear_sentence(text: str, options: dict, match: str) -> None:
    with pytest.raises(DataError, match=match) as err:
        ms.parse_data(text, options)
    message = str(err.value)
    assert "\n" not in message and message.endswith(".")


def test_data_info_matches_loaded_shapes_and_quick_caps_series(small: tuple) -> None:
    spec, data = small
    info = ms.data_info(spec, {})
    assert info == {"channels": 5, "num_bins": 32, "seq_len": 29}
    assert data.train_inputs[0].shape[1:] == (29, 5) and data.train_inputs[0].dtype == torch.float32
    assert data.train_target.shape == (data.n_train, 29) and data.train_target.dtype == torch.int64
    assert data.n_train + data.n_val == 40
    assert ms.data_info(ms.parse_data("multisignal", {}), {"quick": True})["seq_len"] == 159
    quick = ms.load_data(ms.parse_data("multisignal:length=20", {}), {"quick": True})
    assert quick.info["series"] == ms.QUICK_SERIES == quick.n_train + quick.n_val
    assert len(quick.info["bin_edges"]) == 31


# ---------------------------------------------------------------------------- determinism


def test_deterministic_in_the_seed(small: tuple) -> None:
    spec, data = small
    again = ms.load_data(spec, {})
    assert torch.equal(data.train_inputs[0], again.train_inputs[0])
    assert torch.equal(data.val_target, again.val_target)
    assert data.info == again.info
    other = ms.load_data({**spec, "seed": 4}, {})
    assert not torch.equal(data.train_inputs[0], other.train_inputs[0])


def test_signals_are_standardised_channels() -> None:
    s = ms.generate_signals(6, 160, 5, seed=0)  # (N, T, C)
    assert s.shape == (6, 160, 5)
    np.testing.assert_allclose(s.mean(axis=1), 0.0, atol=1e-9)
    np.testing.assert_allclose(s.std(axis=1), 1.0, atol=1e-9)
    # Smooth sinusoids plus AR(1) noise: strongly autocorrelated at lag 1.
    lag1 = np.mean(s[:, 1:] * s[:, :-1]) / np.mean(s * s)
    assert lag1 > 0.8


# ---------------------------------------------------------------------------- target definition


def test_target_values_on_a_hand_computed_example() -> None:
    t = 10
    s = np.zeros((1, t, 4))
    s[0, :, 0] = np.arange(t) * 0.1  # s0(t) = 0.1 t
    s[0, :, 1] = 1.0 - np.arange(t) * 0.2  # s1(t) = 1 - 0.2 t
    s[0, :, 2] = np.arange(t) * 0.5 - 1  # s2(t) = 0.5 t - 1
    s[0, :, 3] = [1, -1] * (t // 2)  # s3 > 0 at even steps
    y = ms.target_values(s)
    assert np.isnan(y[0, :7]).all()
    # t = 7: tanh(s0(4) s1(7)) + 0.6 sin(1.3 s2(0)) + 0.4 [s3(7) > 0] s0(7)
    #      = tanh(0.4 * -0.4) + 0.6 sin(-1.3) + 0
    assert y[0, 7] == pytest.approx(math.tanh(-0.16) + 0.6 * math.sin(-1.3))
    # t = 8: tanh(0.5 * -0.6) + 0.6 sin(1.3 * -0.5) + 0.4 * 0.8
    assert y[0, 8] == pytest.approx(math.tanh(-0.3) + 0.6 * math.sin(-0.65) + 0.32)
    # t = 9: tanh(0.6 * -0.8) + 0.6 sin(1.3 * 0) + 0
    assert y[0, 9] == pytest.approx(math.tanh(-0.48))


def test_inputs_and_targets_are_aligned_to_the_next_step(small: tuple) -> None:
    spec, data = small
    s = ms.generate_signals(40, 30, 5, seed=3)  # (N, T, C)
    y = ms.target_values(s)
    edges = np.array(data.info["bin_edges"])
    for inputs, target, series in (
        (data.train_inputs[0], data.train_target, data.info["train_series"]),
        (data.val_inputs[0], data.val_target, data.info["val_series"]),
    ):
        np.testing.assert_allclose(inputs.numpy(), s[series, :-1].astype(np.float32))  # x[b, t] = s[t]
        assert (target[:, : ms.MAX_LAG - 1] == ms.IGNORE_INDEX).all()  # y(t+1) has no lags yet
        assert (target[:, ms.MAX_LAG - 1 :] >= 0).all()
        b, t = 1, 12
        assert int(target[b, t]) == int(np.sum(edges <= y[series[b], t + 1]))  # bin of y(t+1)
    assert data.info["ignored_steps"] == 6


# ---------------------------------------------------------------------------- bins and split


def test_bins_are_training_split_quantiles() -> None:
    spec = ms.parse_data("multisignal:series=100,length=60,channels=4,seed=1", {"num_bins": 10})
    data = ms.load_data(spec, {})
    s = ms.generate_signals(100, 60, 4, seed=1)
    train_y = ms.target_values(s)[data.info["train_series"], 1:]
    train_y = train_y[~np.isnan(train_y)]
    np.testing.assert_allclose(data.info["bin_edges"], np.quantile(train_y, np.arange(1, 10) / 10))
    labelled = data.train_target[data.train_target != ms.IGNORE_INDEX]
    freq = torch.bincount(labelled, minlength=10).double() / labelled.numel()
    assert freq.shape == (10,)
    assert (freq - 0.1).abs().max() < 0.005  # quantile bins: equal training shares
    val = data.val_target[data.val_target != ms.IGNORE_INDEX]
    assert int(val.min()) >= 0 and int(val.max()) <= 9


def test_split_by_series_90_10_with_no_shared_series(small: tuple) -> None:
    _, data = small
    train, val = set(data.info["train_series"]), set(data.info["val_series"])
    assert not train & val
    assert train | val == set(range(40))
    assert (len(train), len(val)) == (36, 4)
    assert (data.n_train, data.n_val) == (36, 4)
    # No validation series is a copy of a training one.
    x_train, x_val = data.train_inputs[0], data.val_inputs[0]
    assert not any(torch.equal(v, tr) for v in x_val for tr in x_train)
    # The split depends on the seed.
    other, _ = ms.split_series(40, seed=4)
    assert set(other.tolist()) != train
