"""Embedded multi-channel signal data for the ``signal`` family: next-step quantile-bin prediction.

Generation (all seeded, numpy):

- N series (default 512) of T steps (default 160) with C channels (default 8).  Each channel is
  a sum of three sinusoids (frequencies uniform in [0.005, 0.08] cycles per step, amplitudes
  uniform in [0.5, 1.5], random phases) plus AR(1) noise (phi 0.8, innovation std 0.3, started
  from its stationary distribution), then standardised per (series, channel).  Standardising is
  part of *defining* s, not a preprocessing step fitted on data, so it leaks nothing between
  the splits.
- The target signal, defined only where its lags exist (t >= 7):

      y(t) = tanh(s0(t-3) * s1(t)) + 0.6 * sin(1.3 * s2(t-7)) + 0.4 * [s3(t) > 0] * s0(t)

  Channels 4.. never enter y: they are distractors (so C >= 4).
- y is binned into K (default 32) quantile bins whose K-1 interior edges are the quantiles of
  the training split's y values; bin(y) = number of edges <= y, in 0..K-1.

What the model sees (L = T - 1 steps, 159 by default):

    x[b, t]      = s[b, t, :]              for t = 0..T-2           (S, L, C) float32
    target[b, t] = bin(y[b, t + 1])        for t = 0..T-2           (S, L)    int64

so the model at step t sees v(<= t) and predicts the bin of the NEXT step's target.  The last
raw step only ever appears as a target.  y(t + 1) is undefined for t + 1 < 7 (its lags reach
before step 0); those targets (t = 0..5) are IGNORE_INDEX (-100) and drop out of the loss.

Split: 90/10 by series (a seeded permutation), so no series is shared between train and
validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from archhpo.errors import DataError
from archhpo.models._family import TensorDataset

DEFAULT_SERIES = 512
QUICK_SERIES = 128
DEFAULT_LENGTH = 160
DEFAULT_CHANNELS = 8
DEFAULT_BINS = 32
MIN_CHANNELS = 4  # y reads channels 0..3
MAX_LAG = 7  # y(t) needs s2(t - 7)
IGNORE_INDEX = -100  # torch cross-entropy's default ignore_index
VAL_FRACTION = 0.1

FREQ_RANGE = (0.005, 0.08)  # cycles per step
AMP_RANGE = (0.5, 1.5)
AR_PHI = 0.8
AR_SIGMA = 0.3

NAMES = ("multisignal", "synthetic")
_INT_KEYS = ("series", "length", "channels", "seed", "num_bins")
_ALIASES = {"n": "series", "bins": "num_bins", "c": "channels", "t": "length"}


# ---------------------------------------------------------------------------- generation


def generate_signals(series: int, length: int, channels: int, seed: int) -> np.ndarray:
    """Standardised channel signals s, shape (N, T, C) float64; deterministic in its arguments."""
    rng = np.random.default_rng([seed, 0])
    n, t, c = series, length, channels
    freq = rng.uniform(*FREQ_RANGE, size=(n, c, 3))  # (N, C, 3)
    amp = rng.uniform(*AMP_RANGE, size=(n, c, 3))
    phase = rng.uniform(0.0, 2 * np.pi, size=(n, c, 3))
    steps = np.arange(t, dtype=np.float64)  # (T,)
    waves = amp[..., None] * np.sin(2 * np.pi * freq[..., None] * steps + phase[..., None])  # (N, C, 3, T)
    s = waves.sum(axis=2)  # (N, C, T)

    innov = rng.normal(0.0, AR_SIGMA, size=(n, c, t))  # (N, C, T)
    noise = np.empty_like(innov)
    # Start from the stationary distribution so early steps are no quieter than late ones.
    noise[..., 0] = innov[..., 0] / np.sqrt(1 - AR_PHI**2)
    for i in range(1, t):
        noise[..., i] = AR_PHI * noise[..., i - 1] + innov[..., i]
    s = s + noise

    s = (s - s.mean(axis=-1, keepdims=True)) / s.std(axis=-1, keepdims=True)
    return np.ascontiguousarray(s.transpose(0, 2, 1))  # (N, T, C)


def target_values(s: np.ndarray) -> np.ndarray:
    """y(t) for s of shape (N, T, C >= 4): shape (N, T), NaN for t < MAX_LAG (lags before step 0)."""
    n, t, _ = s.shape
    y = np.full((n, t), np.nan)
    s0, s1, s2, s3 = (s[:, :, k] for k in range(4))  # each (N, T)
    u = slice(MAX_LAG, t)  # steps where every lag exists
    y[:, u] = (
        np.tanh(s0[:, MAX_LAG - 3 : t - 3] * s1[:, u])
        + 0.6 * np.sin(1.3 * s2[:, : t - MAX_LAG])
        + 0.4 * (s3[:, u] > 0) * s0[:, u]
    )
    return y


def split_series(series: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded 90/10 split of series indices: (train, validation), each sorted, disjoint."""
    perm = np.random.default_rng([seed, 1]).permutation(series)
    n_val = max(1, round(VAL_FRACTION * series))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def quantile_edges(values: np.ndarray, num_bins: int) -> np.ndarray:
    """The K-1 interior edges putting (about) equal shares of ``values`` into each of K bins."""
    return np.quantile(values, np.arange(1, num_bins) / num_bins)


def bin_values(y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index (number of edges <= y) as int64, IGNORE_INDEX where y is NaN."""
    bins = np.searchsorted(edges, y, side="right").astype(np.int64)
    bins[np.isnan(y)] = IGNORE_INDEX
    return bins


# ---------------------------------------------------------------------------- spec


def _as_int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise DataError(f"{where}: {key} must be an integer, got {value!r}.")
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: {key} must be an integer, got {value!r}.") from None
    if isinstance(value, float) and out != value:
        raise DataError(f"{where}: {key} must be an integer, got {value!r}.")
    return out


def _validate(spec: Mapping[str, Any]) -> None:
    if spec["series"] < 10:
        raise DataError(f"multisignal needs at least 10 series for a 90/10 split, got {spec['series']}.")
    if spec["length"] < MAX_LAG + 2:
        raise DataError(f"multisignal length must be at least {MAX_LAG + 2} steps, got {spec['length']}.")
    if spec["channels"] < MIN_CHANNELS:
        raise DataError(
            f"multisignal needs at least {MIN_CHANNELS} channels (the target reads channels 0-3), "
            f"got {spec['channels']}; use channels={MIN_CHANNELS} or more."
        )
    if spec["num_bins"] < 2:
        raise DataError(f"num_bins must be at least 2, got {spec['num_bins']}.")


def parse_data(text: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``multisignal``, ``synthetic`` (alias) or ``multisignal:series=512,length=160,channels=8,seed=0``.

    Keys given in the text win over ``options`` (seed, num_bins, channels), which win over
    the defaults.  ``quick`` is not folded in here: load_data/data_info apply it, so the spec
    stays what the user wrote.
    """
    raw = (text or "").strip()
    name, _, rest = raw.partition(":")
    name = name.strip().lower()
    if name not in NAMES:
        raise DataError(
            f"The signal family trains only on the embedded data, not {raw!r}; "
            "use --data multisignal or multisignal:series=512,length=160,channels=8,seed=0."
        )
    spec: dict[str, Any] = {
        "kind": "multisignal",
        "series": DEFAULT_SERIES,
        "length": DEFAULT_LENGTH,
        "channels": _as_int("channels", options.get("channels", DEFAULT_CHANNELS), "option"),
        "seed": _as_int("seed", options.get("seed", 0) or 0, "option"),
        "num_bins": _as_int("num_bins", options.get("num_bins", DEFAULT_BINS), "option"),
    }
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = _ALIASES.get(key.strip().lower(), key.strip().lower())
        if not eq or key not in _INT_KEYS:
            raise DataError(
                f"Cannot read {item!r} in --data {raw!r}; use key=value pairs with keys "
                f"{', '.join(_INT_KEYS)}."
            )
        spec[key] = _as_int(key, value.strip(), f"--data {raw!r}")
    _validate(spec)
    return spec


def _resolve(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings actually generated: spec values, defaults for missing keys, quick applied."""
    if spec.get("kind", "multisignal") not in NAMES:
        raise DataError(f"Data spec kind {spec.get('kind')!r} is not multisignal; re-create it with parse_data.")
    out = {
        "series": _as_int("series", spec.get("series", DEFAULT_SERIES), "data spec"),
        "length": _as_int("length", spec.get("length", DEFAULT_LENGTH), "data spec"),
        "channels": _as_int("channels", spec.get("channels", options.get("channels", DEFAULT_CHANNELS)), "data spec"),
        "seed": _as_int("seed", spec.get("seed", options.get("seed", 0) or 0), "data spec"),
        "num_bins": _as_int("num_bins", spec.get("num_bins", options.get("num_bins", DEFAULT_BINS)), "data spec"),
    }
    if options.get("quick"):
        out["series"] = min(out["series"], QUICK_SERIES)
    _validate(out)
    return out


def data_info(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Shape facts for config_for, without generating anything."""
    r = _resolve(spec, options)
    return {"channels": r["channels"], "num_bins": r["num_bins"], "seq_len": r["length"] - 1}


def load_data(spec: Mapping[str, Any], options: Mapping[str, Any]) -> TensorDataset:
    r = _resolve(spec, options)
    s = generate_signals(r["series"], r["length"], r["channels"], r["seed"])  # (N, T, C)
    y = target_values(s)  # (N, T), NaN before MAX_LAG
    train_idx, val_idx = split_series(r["series"], r["seed"])
    # Edges from the training split only, so validation bins carry no information about val.
    train_y = y[train_idx][:, 1:]
    edges = quantile_edges(train_y[~np.isnan(train_y)], r["num_bins"])

    x = torch.from_numpy(s[:, :-1, :].astype(np.float32))  # (N, L, C): steps 0..T-2
    target = torch.from_numpy(bin_values(y[:, 1:], edges))  # (N, L): bin of y at steps 1..T-1
    tr, va = torch.from_numpy(train_idx), torch.from_numpy(val_idx)
    info = {
        **data_info(spec, options),
        "kind": "multisignal",
        "series": r["series"],
        "length": r["length"],
        "seed": r["seed"],
        "n_train": len(train_idx),
        "n_val": len(val_idx),
        "train_series": train_idx.tolist(),
        "val_series": val_idx.tolist(),
        "ignored_steps": MAX_LAG - 1,  # target[:, :6] is IGNORE_INDEX
        "ignore_index": IGNORE_INDEX,
        "bin_edges": edges.tolist(),
    }
    return TensorDataset((x[tr],), target[tr], (x[va],), target[va], info)
