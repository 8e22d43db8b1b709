"""Panel data for the categorical + numerical families (ft_transformer, csn_transformer).

A panel is many symbols, each in one sector, observed over time: numeric features and a price
per (symbol, step).  A sample is the window of ``seq_len`` feature rows of one symbol ending at
step t plus its [symbol_id, sector_id]; the label is 1 when price[t+h]/price[t] − 1 > threshold.
The split is chronological on a time axis shared by all symbols: training samples use only
steps before the cut, validation samples only steps at or after it (so their end times are at
least seq_len + horizon apart), and features are standardised with training-period statistics.

``--data``: ``synthetic[:symbols=100,sectors=5,features=8,steps=400,seed=0]`` (``quick`` shrinks it
to at most 50 symbols × 200 steps) or a CSV/Parquet file with columns symbol, sector, price,
numeric feature columns and an optional date (orders rows within a symbol and defines the
shared time axis; without it, file order and the row's position within its symbol do).  The file
spec pins the content by sha256; ``quick`` does not shrink files.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archhpo.errors import DataError
from archhpo.models._family import TensorDataset
from archhpo.models.data import file_sha256 as _sha256

if TYPE_CHECKING:  # imported where used: `archhpo grid`/`params` read this module without them
    import numpy as np
    import pyarrow as pa
    import torch


DEFAULT_FEATURES = 8
DEFAULT_SYMBOLS = 100
DEFAULT_SECTORS = 5
DEFAULT_STEPS = 400
DEFAULT_SEQ_LEN = 20
DEFAULT_CARDINALITIES = (DEFAULT_SYMBOLS, DEFAULT_SECTORS)
QUICK_SYMBOLS = 50  # --quick shrinks the synthetic panel to at most this many symbols ...
QUICK_STEPS = 200  # ... and steps
REQUIRED_COLUMNS = ("symbol", "sector", "price")
_SYNTHETIC_KEYS = ("symbols", "sectors", "features", "steps", "seed")
_RETURN_SCALE = 0.01  # synthetic moves are 0.01·z, so the default threshold 0.01 means z > 1


@dataclass(frozen=True)
class _Task:
    horizon: int
    threshold: float
    seq_len: int
    val_fraction: float
    quick: bool
    seed: int


@dataclass
class _Panel:
    features: np.ndarray  # (R, N) float64; rows grouped by symbol, each group in time order
    price: np.ndarray  # (R,)
    symbol: np.ndarray  # (R,) int64 ids 0..n_symbols-1
    sector: np.ndarray  # (R,) int64 ids 0..n_sectors-1
    time: np.ndarray  # (R,) int64 step on the time axis shared by all symbols
    n_times: int
    n_symbols: int
    n_sectors: int
    feature_names: tuple[str, ...]


def _task(options: Mapping[str, Any] | None) -> _Task:
    opts = {k: v for k, v in (options or {}).items() if v is not None}
    ints = {"horizon": opts.get("horizon", 1), "seq_len": opts.get("seq_len", DEFAULT_SEQ_LEN),
            "seed": opts.get("seed", 0)}
    for name, value in ints.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "seed" else 1):
            raise DataError(f"{name} must be a {'non-negative' if name == 'seed' else 'positive'} integer, "
                            f"got {value!r}; pass a whole number.")
    threshold, val_fraction = opts.get("threshold", 0.01), opts.get("val_fraction", 0.2)
    if not isinstance(threshold, (int, float)) or not math.isfinite(threshold) or threshold <= -1:
        raise DataError(f"threshold must be a finite number above -1, got {threshold!r}; "
                        "pass e.g. --threshold 0.01.")
    if not isinstance(val_fraction, (int, float)) or not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be strictly between 0 and 1, got {val_fraction!r}.")
    return _Task(horizon=ints["horizon"], threshold=float(threshold), seq_len=ints["seq_len"],
                 val_fraction=float(val_fraction), quick=bool(opts.get("quick", False)), seed=ints["seed"])


def _cut(n_times: int, val_fraction: float) -> int:
    """First step of the validation period: validation is the last val_fraction of the time axis."""
    return int(round(n_times * (1.0 - val_fraction)))


def _min_steps(task: _Task) -> int:
    """Fewest steps per symbol that give one training and one validation window."""
    t, h = task.seq_len, task.horizon
    n = t + h
    # train needs an end t-1 whose label step t-1+h lies before the cut; validation needs a window
    # starting at the cut whose label step still exists.
    while not (_cut(n, task.val_fraction) >= t + h and _cut(n, task.val_fraction) + t + h <= n):
        n += 1
    return n


def _too_few(where: str, task: _Task) -> DataError:
    return DataError(
        f"{where} has too few steps for one training and one validation window (seq_len {task.seq_len}, "
        f"horizon {task.horizon}, val_fraction {task.val_fraction}): give each symbol at least "
        f"{_min_steps(task)} steps or lower seq_len."
    )


# ----------------------------------------------------------------------------- parse / info


def parse_data(text: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``synthetic``, ``synthetic:symbols=100,sectors=5,features=8,steps=400,seed=0`` or a file path."""
    task = _task(options)
    text = str(text).strip()
    if text == "synthetic" or text.startswith("synthetic:"):
        return _parse_synthetic(text, task)
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isfile(path):
        raise DataError(f"Data file {text!r} does not exist; "
                        "pass --data synthetic or the path of a CSV or Parquet file.")
    fmt = "parquet" if path.lower().endswith((".parquet", ".pq")) else "csv"
    spec: dict[str, Any] = {"kind": "file", "path": path, "format": fmt}
    p = _load_panel(spec, task)
    _split(p, task, os.path.basename(path))  # eager: fail now, not on a worker
    # Pin the file's content and shape facts: workers elsewhere check the hash, info needs no read.
    spec.update(
        sha256=_sha256(path), features=list(p.feature_names), symbols=p.n_symbols, sectors=p.n_sectors
    )
    return spec


def _parse_synthetic(text: str, task: _Task) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "synthetic", "symbols": DEFAULT_SYMBOLS, "sectors": DEFAULT_SECTORS,
        "features": DEFAULT_FEATURES, "steps": DEFAULT_STEPS, "seed": task.seed,
    }
    body = text.partition(":")[2]
    for item in filter(None, (s.strip() for s in body.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if key not in _SYNTHETIC_KEYS or not sep:
            raise DataError(f"Unknown synthetic option {item!r}; "
                            f"use key=value with keys {', '.join(_SYNTHETIC_KEYS)}.")
        try:
            spec[key] = int(value)
        except ValueError:
            raise DataError(f"Synthetic option {key} must be an integer, got {value!r}.") from None
    if spec["symbols"] < 1 or spec["features"] < 1:
        raise DataError("Synthetic symbols and features must be at least 1.")
    if not 1 <= spec["sectors"] <= spec["symbols"]:
        raise DataError(f"Synthetic sectors must be between 1 and symbols ({spec['symbols']}), "
                        f"got {spec['sectors']}.")
    if _synthetic_shape(spec, task.quick)[3] < _min_steps(task):
        raise _too_few(f"The synthetic panel (steps={_synthetic_shape(spec, task.quick)[3]})", task)
    return spec


def _synthetic_shape(spec: Mapping[str, Any], quick: bool) -> tuple[int, int, int, int]:
    """(symbols, sectors, features, steps) actually generated; --quick shrinks the panel."""
    s, k, steps = int(spec["symbols"]), int(spec["sectors"]), int(spec["steps"])
    if quick:
        s, steps = min(s, QUICK_SYMBOLS), min(steps, QUICK_STEPS)
    return s, min(k, s), int(spec["features"]), steps


MODEL_OPTIONS = ("variant", "out_dim", "dropout")  # family flags that reach config_for via info


def data_info(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    task = _task(options)
    if spec.get("kind") == "synthetic":
        s, k, n, _ = _synthetic_shape(spec, task.quick)  # no generation needed
        info: dict[str, Any] = {"num_numerical": n, "cat_cardinalities": [s, k], "seq_len": task.seq_len}
    else:
        if not {"features", "symbols", "sectors"} <= spec.keys():
            p = _load_panel(spec, task)
            spec = {**spec, "features": p.feature_names, "symbols": p.n_symbols, "sectors": p.n_sectors}
        info = {
            "num_numerical": len(spec["features"]),
            "cat_cardinalities": [int(spec["symbols"]), int(spec["sectors"])],
            "seq_len": task.seq_len,
        }
    # A study stores only (spec, options, info) and workers build configs from info, so model
    # options given at launch (e.g. --variant tabular) must travel in it; shape facts stay the data's.
    info.update({k: options[k] for k in MODEL_OPTIONS if (options or {}).get(k) is not None})
    return info


def load_data(spec: Mapping[str, Any], options: Mapping[str, Any]) -> TensorDataset:
    import numpy as np
    task = _task(options)
    panel = _load_panel(spec, task)
    where = "The synthetic panel" if spec.get("kind") == "synthetic" else os.path.basename(str(spec["path"]))
    train_end, val_end = _split(panel, task, where)
    cut = _cut(panel.n_times, task.val_fraction)

    # Standardise with statistics of the training period only (rows before the cut).
    fit = panel.features[panel.time < cut]
    mean, std = fit.mean(0), fit.std(0)
    std[std < 1e-12] = 1.0
    z = ((panel.features - mean) / std).astype(np.float32)  # (R, N)
    windows = np.lib.stride_tricks.sliding_window_view(z, task.seq_len, axis=0)  # (R-T+1, N, T) view

    def take(end: np.ndarray) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        import torch

        x = np.ascontiguousarray(windows[end - task.seq_len + 1].transpose(0, 2, 1))  # (S, T, N)
        cat = np.stack([panel.symbol[end], panel.sector[end]], axis=1).astype(np.int64)  # (S, 2)
        move = panel.price[end + task.horizon] / panel.price[end] - 1.0
        y = (move > task.threshold).astype(np.float32)  # (S,)
        return (torch.from_numpy(x), torch.from_numpy(cat)), torch.from_numpy(y)

    train_inputs, train_y = take(train_end)
    val_inputs, val_y = take(val_end)
    info = {
        "num_numerical": len(panel.feature_names),
        "cat_cardinalities": [panel.n_symbols, panel.n_sectors],
        "seq_len": task.seq_len,
        "feature_names": list(panel.feature_names),
        "horizon": task.horizon,
        "threshold": task.threshold,
        "n_train": int(train_y.numel()),
        "n_val": int(val_y.numel()),
        "train_positive_rate": float(train_y.mean()),
        "val_positive_rate": float(val_y.mean()),
    }
    return TensorDataset(train_inputs, train_y, val_inputs, val_y, info)


def _split(panel: _Panel, task: _Task, where: str) -> tuple[np.ndarray, np.ndarray]:
    """End rows of training and validation windows (vectorised over all rows)."""
    import numpy as np
    t, h, r = task.seq_len, task.horizon, len(panel.symbol)
    new = np.r_[True, panel.symbol[1:] != panel.symbol[:-1]]  # first row of each symbol
    first = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    pos = np.arange(r) - first[group]  # position within the symbol
    left = np.diff(np.r_[first, r])[group] - 1 - pos  # rows after this one in the symbol
    end = np.flatnonzero((pos >= t - 1) & (left >= h))  # full window behind, label step ahead
    cut = _cut(panel.n_times, task.val_fraction)
    train_end = end[panel.time[end + h] < cut]  # every step used lies before the cut
    val_end = end[panel.time[end - t + 1] >= cut]  # every step used lies at or after the cut
    if len(train_end) == 0 or len(val_end) == 0:
        raise _too_few(where, task)
    return train_end, val_end


def _load_panel(spec: Mapping[str, Any], task: _Task) -> _Panel:
    kind = spec.get("kind")
    if kind == "synthetic":
        return _synthetic_panel(*_synthetic_shape(spec, task.quick), int(spec["seed"]))
    if kind == "file":
        path = str(spec["path"])
        try:
            st = os.stat(path)
        except OSError:
            raise DataError(f"Data file {path!r} does not exist; "
                            "pass --data synthetic or an existing file.") from None
        if spec.get("sha256") and _sha256(path) != spec["sha256"]:
            raise DataError(f"Data file {path} has changed since the study recorded it; "
                            "restore the original file or start a new study.")
        return _file_panel(path, str(spec.get("format", "csv")), st.st_mtime_ns, st.st_size)
    raise DataError(f"Unknown panel data kind {kind!r}; "
                    "re-create the study with --data synthetic or a file path.")


# ----------------------------------------------------------------------------- synthetic


@functools.lru_cache(maxsize=4)
def _synthetic_panel(symbols: int, sectors: int, features: int, steps: int, seed: int) -> _Panel:
    """Smooth features per symbol; the next move depends on them through hidden per-sector loadings
    and per-symbol/sector drifts, so symbol and sector ids carry signal the features cannot."""
    import numpy as np
    rng = np.random.default_rng(seed)
    s, k, n = symbols, sectors, features
    sector_of = rng.permutation(np.arange(s) % k)  # every sector has members
    t = np.arange(steps)
    freq = rng.uniform(0.005, 0.08, (s, n, 3, 1))
    phase = rng.uniform(0.0, 2 * np.pi, (s, n, 3, 1))
    wave = np.sin(2 * np.pi * freq * t + phase).sum(2) / np.sqrt(1.5)  # (S, N, steps), unit variance
    shocks = rng.normal(size=(s, n, steps))
    ar = np.empty_like(shocks)
    ar[..., 0] = shocks[..., 0]
    for i in range(1, steps):  # AR(1) with unit stationary variance; vectorised over symbols and features
        ar[..., i] = 0.8 * ar[..., i - 1] + 0.6 * shocks[..., i]
    feats = (0.5 * wave + np.sqrt(0.75) * ar).transpose(0, 2, 1)  # (S, steps, N)

    common = rng.normal(size=n)
    common /= np.linalg.norm(common)
    loadings = rng.normal(size=(k, n))
    loadings /= np.linalg.norm(loadings, axis=1, keepdims=True)
    sector_drift = rng.normal(0.0, 0.6, k)
    symbol_drift = rng.normal(0.0, 0.4, s)
    sensitivity = rng.uniform(0.5, 1.5, s)

    f = feats[:, :-1]  # features at t drive the move t → t+1   (S, steps-1, N)
    lag = np.concatenate([feats[:, :1], feats[:, :-2]], axis=1)  # features at t-1
    own = np.einsum("stn,sn->st", f, loadings[sector_of])  # sector-specific direction
    z = (
        0.2 + symbol_drift[:, None] + sector_drift[sector_of][:, None]
        + sensitivity[:, None] * (0.9 * (f @ common) + 0.6 * own)
        + 0.5 * np.tanh(f[..., 0] * lag[..., min(1, n - 1)])
        + 0.7 * rng.normal(size=(s, steps - 1))
    )  # (S, steps-1), about 25–35% above 1
    ret = np.clip(_RETURN_SCALE * z, -0.5, None)
    log_price = np.log(100.0) + np.concatenate([np.zeros((s, 1)), np.cumsum(np.log1p(ret), axis=1)], axis=1)
    return _Panel(
        features=feats.reshape(s * steps, n),
        price=np.exp(log_price).reshape(-1),
        symbol=np.repeat(np.arange(s, dtype=np.int64), steps),
        sector=np.repeat(sector_of.astype(np.int64), steps),
        time=np.tile(t.astype(np.int64), s),
        n_times=steps, n_symbols=s, n_sectors=k,
        feature_names=tuple(f"f{j}" for j in range(n)),
    )


# ----------------------------------------------------------------------------- files


@functools.lru_cache(maxsize=4)
def _file_panel(path: str, fmt: str, mtime_ns: int, size: int) -> _Panel:
    """Read and validate a panel file; cached on (path, mtime, size) so parse/info/load read it once."""
    import numpy as np
    name = os.path.basename(path)
    table = _read_table(path, fmt, name)
    cols = {c.strip().lower(): c for c in table.column_names}
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise DataError(
            f"{name} has no {' or '.join(repr(c) for c in missing)} column; it needs columns symbol, sector, "
            "price and numeric feature columns (date optional)."
        )
    special = {*REQUIRED_COLUMNS, "date"}
    feature_cols = [c for c in table.column_names if c.strip().lower() not in special]
    if not feature_cols:
        raise DataError(f"{name} has no feature columns; "
                        "add numeric columns besides symbol, sector, date and price.")
    if table.num_rows == 0:
        raise DataError(f"{name} has no data rows; add rows with symbol, sector, price and feature values.")
    price = _numeric(table, cols["price"], name)
    bad = np.flatnonzero(price <= 0)
    if len(bad):
        raise DataError(f"Column 'price' of {name} has a non-positive value at row {bad[0] + 1}; "
                        "prices must be positive.")
    feats = np.stack([_numeric(table, c, name) for c in feature_cols], axis=1)  # (R, N)
    symbol_names, symbol = np.unique(_labels(table, cols["symbol"], name), return_inverse=True)
    sector_names, sector = np.unique(_labels(table, cols["sector"], name), return_inverse=True)

    if "date" in cols:
        date_names, date = np.unique(_dates(table, cols["date"], name), return_inverse=True)
        order = np.lexsort((date, symbol))
        dup = np.flatnonzero((np.diff(symbol[order]) == 0) & (np.diff(date[order]) == 0))
        if len(dup):
            raise DataError(
                f"{name} has two rows for symbol {str(symbol_names[symbol[order[dup[0]]]])!r} on one date; "
                "keep one row per symbol and date."
            )
        time, n_times = date[order], len(date_names)
    else:
        order = np.argsort(symbol, kind="stable")  # file order within each symbol
        counts = np.bincount(symbol)
        time = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
        n_times = int(counts.max())
    return _Panel(
        features=feats[order], price=price[order], symbol=symbol[order].astype(np.int64),
        sector=sector[order].astype(np.int64), time=time.astype(np.int64), n_times=int(n_times),
        n_symbols=len(symbol_names), n_sectors=len(sector_names), feature_names=tuple(feature_cols),
    )


def _read_table(path: str, fmt: str, name: str) -> pa.Table:
    import pyarrow as pa
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        import pyarrow.csv as pacsv

        return pacsv.read_csv(path)
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"Could not read {name} as {fmt.upper()} ({reason}); "
                        "check the file's format.") from None


def _numeric(table: pa.Table, col: str, name: str) -> np.ndarray:
    import numpy as np
    import pyarrow as pa
    arr = table[col]
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        if arr.null_count:
            row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0]) + 1
            raise DataError(f"Column {col!r} of {name} has a missing value at row {row}; "
                            "fill it or drop the row.")
        values = arr.to_numpy().astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            raise DataError(f"Column {col!r} of {name} has a non-finite value at row {bad[0] + 1}; "
                            "replace it.")
        return values
    for i, value in enumerate(arr.to_pylist()):  # error path only: name the first offending value
        if value is None:
            raise DataError(f"Column {col!r} of {name} has a missing value at row {i + 1}; "
                            "fill it or drop the row.")
        try:
            float(value)
        except (TypeError, ValueError):
            raise DataError(
                f"Column {col!r} of {name} has a non-numeric value {value!r} at row {i + 1}; "
                "make every price and feature value a number or drop the column."
            ) from None
    raise DataError(f"Column {col!r} of {name} is not numeric ({arr.type}); store it as numbers.")


def _labels(table: pa.Table, col: str, name: str) -> np.ndarray:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = table[col]
    if arr.null_count:
        raise DataError(f"Column {col!r} of {name} has empty values; give every row a {col}.")
    return np.asarray(pc.cast(arr, pa.string()).to_numpy(zero_copy_only=False), dtype=str)


def _dates(table: pa.Table, col: str, name: str) -> np.ndarray:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = table[col]
    if arr.null_count:
        raise DataError(f"Column {col!r} of {name} has empty values; "
                        "give every row a date or drop the column.")
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        try:
            arr = pc.cast(arr, pa.timestamp("s"))
        except pa.ArrowException:
            raise DataError(f"Column {col!r} of {name} has values that are not dates; "
                            "use ISO dates like 2024-01-31.") from None
    if pa.types.is_temporal(arr.type):
        arr = pc.cast(arr, pa.timestamp("ns"))
        return arr.to_numpy().astype("datetime64[ns]").astype(np.int64)
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        return arr.to_numpy().astype(np.float64)
    raise DataError(f"Column {col!r} of {name} has type {arr.type}, not dates; "
                    "use ISO dates like 2024-01-31.")
