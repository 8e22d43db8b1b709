"""Embedded multi-channel signal data for the ``signal`` family: next-step quantile-bin prediction.

The data of Lehtinen (2026), "An Empirical Audit of Input Encoders for Multi-Channel Signal
Transformers" (OssiLehtinen/channel-encoder-audit), reproduced draw for draw: for the same seed,
series, length, channels and bins the signals, targets and train/validation split are the paper's
own (tests pin values computed with the paper's code).  Each channel is three sinusoids plus AR(1)
noise, standardised per series and channel; the target y(t) mixes channels 0-3 at lags up to 7
(channels 4.. are distractors).  The model at step t sees every channel up to t and predicts the
quantile bin of y(t + 1).  ``positions`` says what the six positions whose target is undefined
are: ``all`` (default, the paper's: scored as 0, the bins over every y value) or ``predictable``
(IGNORE_INDEX, the bins over the training split's defined values only).  The split is by series,
as the paper's ``torch.randperm``.  Every constant, formula and shape: docs/design.md §7.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from archhpo.errors import DataError
from archhpo.models._family import TensorDataset

if TYPE_CHECKING:  # imported where used: `archhpo grid`/`params` read this module without them
    import numpy as np


DEFAULT_SERIES = 512
QUICK_SERIES = 128
DEFAULT_LENGTH = 160
DEFAULT_CHANNELS = 8
DEFAULT_BINS = 32
MIN_CHANNELS = 4  # y reads channels 0..3
MAX_LAG = 7  # y(t) needs s2(t - 7)
IGNORE_INDEX = -100  # torch cross-entropy's default ignore_index
MIN_VAL_SERIES = 32  # the paper: n_val = max(32, N // 10)
POSITIONS = ("all", "predictable")
DEFAULT_POSITIONS = "all"

N_MODES = 3
FREQ_RANGE = (0.005, 0.08)  # cycles per step
AMP_RANGE = (0.5, 1.5)
AR_PHI = 0.85
AR_SIGMA = 0.3
STD_EPS = 1e-6
EDGE_PAD = 1e-3  # the paper widens its outer edges by this much

NAMES = ("multisignal", "synthetic")
_INT_KEYS = ("series", "length", "channels", "seed", "num_bins")
_ALIASES = {"n": "series", "bins": "num_bins", "c": "channels", "t": "length"}


# ---------------------------------------------------------------------------- generation


def generate_signals(series: int, length: int, channels: int, seed: int) -> np.ndarray:
    """Standardised channel signals s, shape (N, T, C) float32: the paper's, draw for draw.

    The paper draws, per signal (series-major, then channel), per mode the frequency, phase
    and amplitude (``rng.uniform``), then T-1 innovations (``rng.normal(0, 0.3)``).  The same
    stream is taken here two calls per signal (``random(9)`` scaled as ``uniform`` scales it,
    ``normal(0, 0.3, T-1)``), and the arithmetic is the paper's, vectorised over signals.
    """
    import numpy as np
    rng = np.random.default_rng(seed)
    n, t, c = series, length, channels
    u = np.empty((n * c, N_MODES, 3))  # per signal and mode: freq, phase, amp in [0, 1)
    innov = np.empty((n * c, t - 1))
    for i in range(n * c):
        u[i] = rng.random(3 * N_MODES).reshape(N_MODES, 3)
        innov[i] = rng.normal(0.0, AR_SIGMA, size=t - 1)
    lo, hi = FREQ_RANGE
    freq = lo + (hi - lo) * u[..., 0]  # (S, 3), S = N*C signals; as Generator.uniform computes it
    phase = 0.0 + (2 * np.pi - 0.0) * u[..., 1]
    lo, hi = AMP_RANGE
    amp = lo + (hi - lo) * u[..., 2]
    steps = np.arange(t)  # (T,)
    sig = np.zeros((n * c, t))
    for m in range(N_MODES):
        sig += amp[:, m, None] * np.sin(2 * np.pi * freq[:, m, None] * steps + phase[:, m, None])
    noise = np.zeros((n * c, t))  # AR(1) from 0: noise[0] = 0
    for i in range(1, t):
        noise[:, i] = AR_PHI * noise[:, i - 1] + innov[:, i - 1]
    sig = sig + noise
    sig = (sig - sig.mean(axis=-1, keepdims=True)) / (sig.std(axis=-1, keepdims=True) + STD_EPS)
    s = sig.astype(np.float32).reshape(n, c, t)
    return np.ascontiguousarray(s.transpose(0, 2, 1))  # (N, T, C)


def target_values(s: np.ndarray) -> np.ndarray:
    """y(t) for s of shape (N, T, C >= 4): shape (N, T) in s's dtype, NaN for t < MAX_LAG."""
    import numpy as np
    n, t, _ = s.shape
    y = np.full((n, t), np.nan, dtype=s.dtype)
    s0, s1, s2, s3 = (s[:, :, k] for k in range(4))  # each (N, T)
    u = slice(MAX_LAG, t)  # steps where every lag exists
    y[:, u] = (
        np.tanh(s0[:, MAX_LAG - 3 : t - 3] * s1[:, u])
        + 0.6 * np.sin(1.3 * s2[:, : t - MAX_LAG])
        + 0.4 * (s3[:, u] > 0).astype(s.dtype) * s0[:, u]
    )
    return y


def val_count(series: int) -> int:
    """Validation series: the paper's max(32, N // 10), capped at N // 2 so tiny data still trains."""
    return max(1, min(max(MIN_VAL_SERIES, series // 10), series // 2))


def split_series(series: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's seeded split of series indices: (train, validation), each sorted, disjoint.

    ``random_split(ds, [N - n_val, n_val], generator=Generator().manual_seed(seed))`` takes
    ``randperm(N, generator)`` and gives the first N - n_val entries to training.
    """
    import numpy as np
    import torch

    perm = torch.randperm(series, generator=torch.Generator().manual_seed(seed)).numpy()
    n_val = val_count(series)
    return np.sort(perm[: series - n_val]), np.sort(perm[series - n_val :])


def quantile_edges(values: np.ndarray, num_bins: int) -> np.ndarray:
    """The K-1 interior edges putting (about) equal shares of ``values`` into each of K bins."""
    import numpy as np
    return np.quantile(values, np.arange(1, num_bins) / num_bins)


def paper_edges(y: np.ndarray, num_bins: int) -> np.ndarray:
    """The paper's K+1 edges: quantiles of every y value (NaN counted as 0), outer ones widened."""
    import numpy as np
    edges = np.quantile(np.nan_to_num(y, nan=0.0).reshape(-1), np.linspace(0, 1, num_bins + 1))
    edges[0] -= EDGE_PAD
    edges[-1] += EDGE_PAD
    return edges


def paper_bins(y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The paper's bins: ``clip(digitize(y, edges) - 1, 0, K - 1)`` with undefined y counted as 0."""
    import numpy as np
    k = len(edges) - 1
    return np.clip(np.digitize(np.nan_to_num(y, nan=0.0), edges) - 1, 0, k - 1).astype(np.int64)


def bin_values(y: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index (number of interior edges <= y) as int64, IGNORE_INDEX where y is NaN."""
    import numpy as np
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


def _as_positions(value: Any, where: str) -> str:
    text = str(value).strip().lower() if value is not None else DEFAULT_POSITIONS
    if text not in POSITIONS:
        raise DataError(
            f"{where}: positions must be 'all' (the paper's: every next-step position scored) or "
            f"'predictable' (the first {MAX_LAG - 1} positions, whose target is undefined, left out), "
            f"got {value!r}."
        )
    return text


def _validate(spec: Mapping[str, Any]) -> None:
    if spec["series"] < 10:
        raise DataError(f"multisignal needs at least 10 series for a train/validation split, got {spec['series']}.")
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

    Keys given in the text win over ``options`` (seed, num_bins, channels, positions), which win
    over the defaults.  ``quick`` is not folded in here: load_data/data_info apply it, so the
    spec stays what the user wrote.
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
        "positions": _as_positions(options.get("positions", DEFAULT_POSITIONS), "option"),
    }
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        key = _ALIASES.get(key.strip().lower(), key.strip().lower())
        if eq and key == "positions":
            spec[key] = _as_positions(value, f"--data {raw!r}")
            continue
        if not eq or key not in _INT_KEYS:
            raise DataError(
                f"Cannot read {item!r} in --data {raw!r}; use key=value pairs with keys "
                f"{', '.join(_INT_KEYS)}, positions."
            )
        spec[key] = _as_int(key, value.strip(), f"--data {raw!r}")
    _validate(spec)
    return spec


def _resolve(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The settings actually generated: spec values, defaults for missing keys, quick applied."""
    if spec.get("kind", "multisignal") not in NAMES:
        raise DataError(f"Data spec kind {spec.get('kind')!r} is not multisignal; re-create it with parse_data.")
    out: dict[str, Any] = {
        "series": _as_int("series", spec.get("series", DEFAULT_SERIES), "data spec"),
        "length": _as_int("length", spec.get("length", DEFAULT_LENGTH), "data spec"),
        "channels": _as_int("channels", spec.get("channels", options.get("channels", DEFAULT_CHANNELS)), "data spec"),
        "seed": _as_int("seed", spec.get("seed", options.get("seed", 0) or 0), "data spec"),
        "num_bins": _as_int("num_bins", spec.get("num_bins", options.get("num_bins", DEFAULT_BINS)), "data spec"),
        "positions": _as_positions(spec.get("positions", options.get("positions", DEFAULT_POSITIONS)), "data spec"),
    }
    if options.get("quick"):
        out["series"] = min(out["series"], QUICK_SERIES)
    _validate(out)
    return out


def data_info(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Shape facts for config_for, without generating anything (plus the position convention)."""
    r = _resolve(spec, options)
    return {"channels": r["channels"], "num_bins": r["num_bins"], "seq_len": r["length"] - 1,
            "positions": r["positions"]}


def load_data(spec: Mapping[str, Any], options: Mapping[str, Any]) -> TensorDataset:
    import numpy as np
    import torch

    r = _resolve(spec, options)
    s = generate_signals(r["series"], r["length"], r["channels"], r["seed"])  # (N, T, C) float32
    y = target_values(s)  # (N, T) float32, NaN before MAX_LAG
    train_idx, val_idx = split_series(r["series"], r["seed"])
    if r["positions"] == "all":
        full = paper_edges(y, r["num_bins"])  # every series, every step, zeros included
        edges = full[1:-1]
        bins = paper_bins(y, full)  # (N, T)
    else:
        # Edges from the training split's defined targets only: validation bins carry no
        # information about validation data.
        train_y = y[train_idx][:, 1:]
        edges = quantile_edges(train_y[~np.isnan(train_y)].astype(np.float64), r["num_bins"])
        bins = bin_values(y.astype(np.float64), edges)

    x = torch.from_numpy(s[:, :-1, :])  # (N, L, C): steps 0..T-2
    target = torch.from_numpy(np.ascontiguousarray(bins[:, 1:]))  # (N, L): bin of y at steps 1..T-1
    ignored = 0 if r["positions"] == "all" else MAX_LAG - 1
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
        "ignored_steps": ignored,  # target[:, :ignored] is IGNORE_INDEX
        "scored_positions": r["length"] - 1 - ignored,  # per series: 159 (all) or 153 (predictable)
        "ignore_index": IGNORE_INDEX,
        "bin_edges": [float(e) for e in edges],
    }
    return TensorDataset((x[tr],), target[tr], (x[va],), target[va], info)
