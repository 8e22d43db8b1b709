"""The multisignal data: spec parsing, determinism, target definition, quantile bins, series split,
and faithfulness to the paper's generator (Lehtinen 2026, OssiLehtinen/channel-encoder-audit)."""

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
    expected = {"kind": "multisignal", "series": 512, "length": 160, "channels": 8, "seed": 0, "num_bins": 32,
                "positions": "all"}
    assert ms.parse_data("multisignal", {}) == expected
    assert ms.parse_data("synthetic", {}) == expected
    assert ms.parse_data(" Synthetic ", {"seed": None}) == expected


def test_parse_keys_win_over_options() -> None:
    spec = ms.parse_data("multisignal:series=64,length=40,channels=5,seed=3", {"seed": 9, "num_bins": 16})
    assert spec == {"kind": "multisignal", "series": 64, "length": 40, "channels": 5, "seed": 3, "num_bins": 16,
                    "positions": "all"}
    assert ms.parse_data("multisignal", {"positions": "predictable"})["positions"] == "predictable"
    assert ms.parse_data("multisignal:positions=all", {"positions": "predictable"})["positions"] == "all"
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
        ("multisignal", {"positions": "some"}, "positions must be 'all'"),
        ("multisignal:positions=first", {}, "positions must be 'all'"),
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
    assert info == {"channels": 5, "num_bins": 32, "seq_len": 29, "positions": "all"}
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
    assert s.shape == (6, 160, 5) and s.dtype == np.float32
    np.testing.assert_allclose(s.mean(axis=1, dtype=np.float64), 0.0, atol=1e-6)
    np.testing.assert_allclose(s.std(axis=1, dtype=np.float64), 1.0, atol=1e-5)  # / (std + 1e-6)
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


@pytest.mark.parametrize("positions", ms.POSITIONS)
def test_inputs_and_targets_are_aligned_to_the_next_step(positions: str) -> None:
    spec = ms.parse_data(SMALL, {"positions": positions})
    data = ms.load_data(spec, {})
    s = ms.generate_signals(40, 30, 5, seed=3)  # (N, T, C)
    y = ms.target_values(s)
    edges = np.array(data.info["bin_edges"])
    bin_of_zero = int(np.sum(edges <= 0.0))
    for inputs, target, series in (
        (data.train_inputs[0], data.train_target, data.info["train_series"]),
        (data.val_inputs[0], data.val_target, data.info["val_series"]),
    ):
        np.testing.assert_array_equal(inputs.numpy(), s[series, :-1])  # x[b, t] = s[t]
        if positions == "predictable":
            assert (target[:, : ms.MAX_LAG - 1] == ms.IGNORE_INDEX).all()  # y(t+1) has no lags yet
        else:  # the paper's: y is 0 where undefined, so those targets are the bin of 0
            assert (target[:, : ms.MAX_LAG - 1] == bin_of_zero).all()
        assert (target[:, ms.MAX_LAG - 1 :] >= 0).all()
        b, t = 1, 12
        assert int(target[b, t]) == int(np.sum(edges <= y[series[b], t + 1]))  # bin of y(t+1)
    assert data.info["ignored_steps"] == (6 if positions == "predictable" else 0)


def test_positions_scored_159_all_or_153_predictable() -> None:
    """The paper scores every one of the 159 next-step positions; 'predictable' leaves out the 6
    (t = 0..5) whose target y(t+1) needs lags before step 0."""
    counts = {}
    for positions in ms.POSITIONS:
        data = ms.load_data(ms.parse_data("multisignal:series=20", {"positions": positions}), {})
        labelled = (data.train_target != ms.IGNORE_INDEX).sum(dim=1)
        assert (labelled == labelled[0]).all()
        counts[positions] = int(labelled[0])
        assert data.info["scored_positions"] == counts[positions]
    assert counts == {"all": 159, "predictable": 153}


# ---------------------------------------------------------------------------- bins and split


def test_predictable_bins_are_training_split_quantiles() -> None:
    spec = ms.parse_data("multisignal:series=100,length=60,channels=4,seed=1", {"num_bins": 10,
                                                                              "positions": "predictable"})
    data = ms.load_data(spec, {})
    s = ms.generate_signals(100, 60, 4, seed=1)
    train_y = ms.target_values(s)[data.info["train_series"], 1:]
    train_y = train_y[~np.isnan(train_y)].astype(np.float64)
    np.testing.assert_allclose(data.info["bin_edges"], np.quantile(train_y, np.arange(1, 10) / 10))
    labelled = data.train_target[data.train_target != ms.IGNORE_INDEX]
    freq = torch.bincount(labelled, minlength=10).double() / labelled.numel()
    assert freq.shape == (10,)
    assert (freq - 0.1).abs().max() < 0.005  # quantile bins: equal training shares
    val = data.val_target[data.val_target != ms.IGNORE_INDEX]
    assert int(val.min()) >= 0 and int(val.max()) <= 9


def test_all_bins_are_the_papers_pooled_quantiles() -> None:
    """'all': edges from every series and step, the undefined y counted as 0 (as the paper does)."""
    spec = ms.parse_data("multisignal:series=100,length=60,channels=4,seed=1", {"num_bins": 10})
    data = ms.load_data(spec, {})
    y = np.nan_to_num(ms.target_values(ms.generate_signals(100, 60, 4, seed=1)), nan=0.0)
    np.testing.assert_allclose(data.info["bin_edges"], np.quantile(y, np.linspace(0, 1, 11))[1:-1], rtol=1e-6)
    assert 0.0 in data.info["bin_edges"]  # 7 zeros per series (12%) pile up in the bin of 0
    assert data.train_target.min() >= 0 and data.val_target.min() >= 0  # nothing ignored


def test_split_by_series_with_no_shared_series(small: tuple) -> None:
    _, data = small
    train, val = set(data.info["train_series"]), set(data.info["val_series"])
    assert not train & val
    assert train | val == set(range(40))
    # The paper's max(32, N // 10) validation series, capped at N // 2 for tiny data.
    assert (len(train), len(val)) == (20, 20)
    assert (data.n_train, data.n_val) == (20, 20)
    assert [ms.val_count(n) for n in (10, 40, 128, 512, 5120)] == [5, 20, 32, 51, 512]
    # No validation series is a copy of a training one.
    x_train, x_val = data.train_inputs[0], data.val_inputs[0]
    assert not any(torch.equal(v, tr) for v in x_val for tr in x_train)
    # The split depends on the seed.
    other, _ = ms.split_series(40, seed=4)
    assert set(other.tolist()) != train


# ---------------------------------------------------------------------------- the paper's generator


def _paper_make_signal(t: int, rng: np.random.Generator) -> np.ndarray:
    """fft_encode/data.py's _make_signal, verbatim apart from names."""
    steps = np.arange(t)
    sig = np.zeros(t)
    for _ in range(3):
        freq = rng.uniform(0.005, 0.08)
        phase = rng.uniform(0, 2 * np.pi)
        amp = rng.uniform(0.5, 1.5)
        sig += amp * np.sin(2 * np.pi * freq * steps + phase)
    noise = np.zeros(t)
    for i in range(1, t):
        noise[i] = 0.85 * noise[i - 1] + rng.normal(0, 0.3)
    sig = sig + noise
    sig = (sig - sig.mean()) / (sig.std() + 1e-6)
    return sig.astype(np.float32)


def test_signals_are_the_papers_draw_for_draw() -> None:
    """AR(1) coefficient 0.85 from 0, the paper's draw order and arithmetic: bit-identical signals."""
    n, t, c, seed = 3, 50, 4, 11
    rng = np.random.default_rng(seed)
    ref = np.stack([np.stack([_paper_make_signal(t, rng) for _ in range(c)]) for _ in range(n)])  # (N, C, T)
    np.testing.assert_array_equal(ms.generate_signals(n, t, c, seed), ref.transpose(0, 2, 1))
    assert ms.AR_PHI == 0.85


def test_ar1_noise_starts_from_zero_with_coefficient_085() -> None:
    """Remove the sinusoids (amplitudes drawn as the paper draws them): what is left is the AR(1)."""
    n, t, c, seed = 2, 40, 4, 2
    s = ms.generate_signals(n, t, c, seed).transpose(0, 2, 1).reshape(n * c, t).astype(np.float64)
    rng = np.random.default_rng(seed)
    for row in s:
        u = rng.random(9).reshape(3, 3)
        innov = rng.normal(0.0, 0.3, t - 1)
        steps = np.arange(t)
        waves = sum((0.5 + u[m, 2]) * np.sin(2 * np.pi * (0.005 + 0.075 * u[m, 0]) * steps + 2 * np.pi * u[m, 1])
                    for m in range(3))
        raw = waves.copy()
        raw[1:] += [sum(0.85 ** (i - j) * innov[j - 1] for j in range(1, i + 1)) for i in range(1, t)]
        expected = (raw - raw.mean()) / (raw.std() + 1e-6)
        np.testing.assert_allclose(row, expected, atol=1e-5)
        # noise[0] = 0: step 0 is the (standardised) sinusoids alone.
        assert row[0] == pytest.approx((waves[0] - raw.mean()) / (raw.std() + 1e-6), abs=1e-5)


def test_pinned_values_from_the_papers_code() -> None:
    """Numbers printed by the paper's own MultiSignalDataset(n_series, T, C, K, seed) and its
    random_split (computed once with fft_encode/data.py at commit 8bf07cf)."""
    data = ms.load_data(ms.parse_data("multisignal:series=12,length=40,channels=4,seed=5,bins=8", {}), {})
    s = ms.generate_signals(12, 40, 4, seed=5)
    np.testing.assert_allclose(s[3, :4, 1], [-0.830703, -0.954732, -0.700049, -0.332634], atol=1e-6)
    np.testing.assert_allclose(
        data.info["bin_edges"],
        [-0.8390931487083435, -0.494313508272171, -0.1101689338684082, 0.0, 0.11964292079210281,
         0.4882255792617798, 0.8233623504638672], rtol=1e-6)
    paper_targets_3 = [4, 4, 4, 4, 4, 4, 4, 7, 7, 5, 7, 6, 2, 1, 1, 0, 1, 1, 2, 6, 5, 6, 2, 5, 0, 1, 1, 1, 1,
                       0, 0, 0, 1, 6, 7, 5, 7, 7, 7, 5]  # the paper's targets[3], steps 0..39
    rows = {int(k): i for i, k in enumerate(data.info["train_series"])}
    target = data.train_target[rows[3]] if 3 in rows else data.val_target[data.info["val_series"].index(3)]
    assert target.tolist() == paper_targets_3[1:]  # ours is shifted: target[t] = bin(y(t + 1))

    full = ms.load_data(ms.parse_data("multisignal:channels=4", {}), {})  # 512 series, T 160, K 32, seed 0
    assert full.info["val_series"][:10] == [8, 21, 22, 23, 28, 33, 40, 62, 71, 81]
    assert (full.n_train, full.n_val) == (461, 51)
    total = int(full.train_target.sum() + full.val_target.sum())
    first = full.info["train_series"].index(0)
    # The paper's targets.sum() is 1271637 over all 160 steps; step 0's target (never scored) is
    # the bin of 0 (16) in each of the 512 series.
    assert total + 512 * 16 == 1271637
    assert full.train_target[first, :19].tolist() == [16] * 6 + [0, 1, 5, 14, 20, 20, 14, 17, 11, 5, 4, 3, 3]
