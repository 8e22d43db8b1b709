"""Multivariate time-series windows with binary "price moves up by > threshold" labels (docs/design.md §7).

``--data`` is either ``synthetic[:features=F,steps=N,seed=S]`` (generated, so a study needs no
files) or a path to a CSV/Parquet file holding a price column, numeric feature columns and an
optional ``date`` column.  ``parse_data`` validates eagerly and returns a JSON-able spec that
pins the data down (generator parameters, or path + sha256), so a worker on another machine
rebuilds exactly the same tensors with ``load_data``.

Window i covers rows i..i+L-1 (context L) and is labelled 1 when the price rises by more than the
threshold over the horizon h after its end.  The first n_train windows train; the validation
windows start after the last training window's label horizon, so no validation row lies inside a
training window or label, and features are standardised with the training windows' rows only.
The exact counts (and why T must be at least 2 (L + h) rows): docs/design.md §7.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archhpo.errors import DataError
from archhpo.models._family import TensorDataset
from archhpo.models.data import file_sha256 as _sha256
from archhpo.models.data import recorded_file

if TYPE_CHECKING:  # imported where used: `archhpo grid`/`params` read this module without them
    import numpy as np
    import pyarrow as pa
    import torch


DEFAULT_FEATURES = 8
# Task defaults of the labels; archhpo's --horizon/--threshold options take them from here.
DEFAULT_HORIZON = 1
DEFAULT_THRESHOLD = 0.01
DEFAULT_STEPS = 20000
QUICK_STEPS = 4000
SYNTHETIC_KEYS = ("features", "steps", "seed")
_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class _Options:
    horizon: int = 1
    threshold: float = 0.01
    quick: bool = False
    seed: int = 0
    context_length: int = 60
    val_fraction: float = 0.2
    price_column: str = "price"

    @property
    def min_rows(self) -> int:
        # One training window + its horizon, then one validation window + its horizon.
        return 2 * (self.context_length + self.horizon)


def column_name(text: str) -> str:
    """A data file's column name, one per study (a type of its own, so the CLI never turns a
    comma-separated value into a grid dimension: the column shapes the data)."""
    return str(text).strip()


def _options(options: Mapping[str, Any]) -> _Options:
    """Read the task settings with defaults; bad values are user errors, so DataError."""
    o = _Options(
        horizon=options.get("horizon", DEFAULT_HORIZON), threshold=options.get("threshold", DEFAULT_THRESHOLD),
        quick=bool(options.get("quick", False)), seed=options.get("seed", 0),
        context_length=options.get("context_length", 60), val_fraction=options.get("val_fraction", 0.2),
        price_column=options.get("price_column") or "price",
    )
    for name in ("horizon", "context_length"):
        value = getattr(o, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DataError(f"{name} must be a positive integer, got {value!r}; pass a whole number of steps.")
    if not isinstance(o.seed, int) or isinstance(o.seed, bool) or o.seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {o.seed!r}.")
    if not isinstance(o.threshold, (int, float)) or not math.isfinite(o.threshold) or o.threshold <= -1:
        raise DataError(f"threshold must be a finite number above -1, got {o.threshold!r}; pass e.g. --threshold 0.01.")
    if not isinstance(o.val_fraction, (int, float)) or not 0 < o.val_fraction < 1:
        raise DataError(f"val_fraction must be strictly between 0 and 1, got {o.val_fraction!r}.")
    return o


# --------------------------------------------------------------------------- parse_data


def parse_data(text: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``--data`` into a JSON-able spec, raising DataError with one sentence on bad input."""
    o = _options(options)
    text = text.strip()
    if text == "synthetic" or text.startswith("synthetic:"):
        return _parse_synthetic(text[len("synthetic:"):] if ":" in text else "", o)
    return _parse_file(text, o)


def _parse_synthetic(params: str, o: _Options) -> dict[str, Any]:
    values: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in SYNTHETIC_KEYS:
            raise DataError(
                f"Unknown synthetic data setting {item!r}; use synthetic:features=F,steps=N,seed=S "
                f"with keys {', '.join(SYNTHETIC_KEYS)}."
            )
        try:
            values[key] = int(raw.strip())
        except ValueError:
            raise DataError(f"Synthetic data setting {key}={raw.strip()!r} is not an integer; give a whole number.") from None
    spec: dict[str, Any] = {
        "kind": "synthetic",
        "features": values.get("features", DEFAULT_FEATURES),
        "steps": values.get("steps", QUICK_STEPS if o.quick else DEFAULT_STEPS),
        "seed": values.get("seed", o.seed),
    }
    if spec["features"] < 1:
        raise DataError(f"Synthetic data needs at least 1 feature, got features={spec['features']}.")
    if spec["seed"] < 0:
        raise DataError(f"Synthetic data seed must be non-negative, got seed={spec['seed']}.")
    _check_rows(spec["steps"], o, "Synthetic data", "use steps={} or more")
    return spec


def _check_rows(rows: int, o: _Options, what: str, fix: str) -> None:
    if rows < o.min_rows:
        raise DataError(
            f"{what} has {rows} rows but needs at least {o.min_rows} (one training and one validation "
            f"window of {o.context_length} steps plus horizon {o.horizon} each); {fix.format(o.min_rows)}"
            ", or lower the horizon."
        )


def _parse_file(text: str, o: _Options) -> dict[str, Any]:
    path = Path(text).expanduser().resolve()
    if path.is_dir():
        raise DataError(f"Data path {path} is a directory; pass a .csv or .parquet file.")
    if not path.is_file():
        raise DataError(f"Data file {path} does not exist; check the path or use --data synthetic.")
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"Data file {path} has unknown extension {path.suffix!r}; use a .csv, .parquet or .pq file.")
    spec: dict[str, Any] = {"kind": "file", "path": str(path), "format": fmt, "price_column": o.price_column}
    names, _x, price, date_column = _read_file(spec, o)
    spec.update(date_column=date_column, features=names, sha256=_sha256(path), rows=len(price))
    return spec


# --------------------------------------------------------------------------- file reading


def _read_table(path: Path, fmt: str) -> pa.Table:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    try:
        if fmt == "parquet":
            return pq.read_table(path)
        # Read every column as text and cast ourselves: pyarrow's own type inference fails
        # mid-file with an opaque message, and we want the column and row of a bad cell.
        names = pacsv.open_csv(path).schema.names
        convert = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=False)
        return pacsv.read_csv(path, convert_options=convert)
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
        raise DataError(f"Data file {path} could not be read as {fmt.upper()} ({reason}); check the file format.") from None


def _to_float(column: pa.ChunkedArray, name: str, path: Path, fmt: str) -> np.ndarray:
    """One column as float64, or DataError naming the column and the first bad row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = column.combine_chunks()

    def where(i: int) -> str:  # rows are 1-based data rows; CSV line = row + 1 (header)
        return f"row {i + 1} (line {i + 2})" if fmt == "csv" else f"row {i + 1}"

    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        text = pc.utf8_trim_whitespace(arr)
        empty = pc.or_kleene(pc.is_null(text), pc.equal(text, "")).to_numpy(zero_copy_only=False)
        if empty.any():
            raise DataError(f"Data file {path} has an empty cell in column {name!r} at {where(int(empty.argmax()))}; "
                            "fill it in or drop that row.")
        try:
            arr = pc.cast(text, pa.float64())
        except pa.ArrowInvalid:
            # Error path only: find the offending cell to point the user at it.
            for i, value in enumerate(text.to_pylist()):
                try:
                    float(value)
                except ValueError:
                    raise DataError(f"Data file {path} has a non-numeric value {value!r} in column {name!r} at "
                                    f"{where(i)}; fix that cell or remove the column.") from None
            raise DataError(f"Data file {path} has non-numeric values in column {name!r}; "
                            "fix them or remove the column.") from None
    elif not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_decimal(arr.type)):
        raise DataError(f"Data file {path} column {name!r} has type {arr.type}, not numbers; "
                        "convert it to numbers or remove the column.")
    if arr.null_count:
        first = int(pc.is_null(arr).to_numpy(zero_copy_only=False).argmax())
        raise DataError(f"Data file {path} has an empty cell in column {name!r} at {where(first)}; "
                        "fill it in or drop that row.")
    values = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(bad.argmax())
        raise DataError(f"Data file {path} has a NaN or infinite value in column {name!r} at {where(i)}; "
                        "fill it in or drop that row.")
    return values


def _read_file(spec: Mapping[str, Any], o: _Options) -> tuple[list[str], np.ndarray, np.ndarray, str | None]:
    """(feature names, features (T, F) float64, price (T,), date column or None) from a data file."""
    import numpy as np
    path, fmt, price_col = Path(spec["path"]), spec["format"], spec.get("price_column", "price")
    table = _read_table(path, fmt)
    names = table.column_names
    if price_col not in names:
        flag = "" if price_col != "price" else " or pass --price-column NAME"
        raise DataError(f"Data file {path} has no {price_col!r} column; add one{flag} (columns: {', '.join(names)}).")
    date_col = "date" if "date" in names and price_col != "date" else None
    features = [n for n in names if n not in (price_col, date_col)]
    if not features:
        raise DataError(f"Data file {path} has no feature columns besides {price_col!r}; "
                        "add at least one numeric feature column.")
    _check_rows(table.num_rows, o, f"Data file {path}", "supply at least {} rows")
    price = _to_float(table.column(price_col), price_col, path, fmt)
    if (price <= 0).any():
        i = int((price <= 0).argmax())
        raise DataError(f"Data file {path} has a non-positive price {price[i]:g} at row {i + 1}; "
                        "prices must be above zero to compute returns.")
    x = np.stack([_to_float(table.column(n), n, path, fmt) for n in features], axis=1)
    return features, x, price, date_col


# --------------------------------------------------------------------------- synthetic generator


def generate(features: int, steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic synthetic series: (features (steps, F) standardised, price (steps,)).

    Features: three sinusoids (frequencies in [0.005, 0.08] cycles/step) + AR(1) noise.
    Next log-return: a non-linear function of current and lagged features + noise, so
    windows carry real but not trivial signal.  With F < 4 the signal terms reuse features
    (index k % F) rather than refusing: any F >= 1 works.
    """
    import numpy as np
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=np.float64)[:, None]
    freq = rng.uniform(0.005, 0.08, size=(3, features))
    phase = rng.uniform(0.0, 2 * np.pi, size=(3, features))
    amp = rng.uniform(0.5, 1.5, size=(3, features))
    x = sum(amp[k] * np.sin(2 * np.pi * freq[k] * t + phase[k]) for k in range(3))
    # AR(1) has no closed vectorised form without scipy; a loop over steps is ~50 ms at 20k.
    eps = rng.normal(0.0, 0.4, size=(steps, features))
    noise = np.empty_like(eps)
    noise[0] = eps[0] / math.sqrt(1 - 0.9**2)  # start in the stationary distribution
    for i in range(1, steps):
        noise[i] = 0.9 * noise[i - 1] + eps[i]
    x = x + noise
    x = (x - x.mean(0)) / x.std(0)

    def f(k: int, lag: int = 0) -> np.ndarray:  # feature k at t - lag (edge-padded)
        col = x[:, k % features]
        return np.concatenate([np.full(lag, col[0]), col[: steps - lag]]) if lag else col

    g = np.tanh(f(0) * f(1)) + 0.8 * np.sin(2.0 * f(2, 3)) + 0.6 * np.where(f(3) > 0, f(0, 1), -f(1, 2))
    g = (g - g.mean()) / g.std()
    # r[t+1] depends on features up to t; scale and noise set so that h=1, threshold=0.01
    # gives roughly a 30% positive rate that a small model learns clearly.
    r = 0.015 * g[:-1] + 0.006 * rng.normal(size=steps - 1)
    price = 100.0 * np.exp(np.concatenate([[0.0], np.cumsum(r)]))
    return x, price


# --------------------------------------------------------------------------- info / load


def data_info(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Shape facts for config_for, without generating or reading the data."""
    if spec.get("kind") == "synthetic":
        return {"num_features": int(spec["features"])}
    if spec.get("kind") == "file":
        if "features" in spec:
            return {"num_features": len(spec["features"])}
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        path, fmt = Path(spec["path"]), spec["format"]
        try:  # schema only: parquet metadata, or the first CSV block
            names = pq.read_schema(path).names if fmt == "parquet" else pacsv.open_csv(path).schema.names
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"Data file {path} could not be read ({exc}); check the path and format.") from None
        drop = {spec.get("price_column", "price"), "date"}
        return {"num_features": sum(n not in drop for n in names)}
    raise DataError(f"Unknown data spec kind {spec.get('kind')!r}; re-create the study with --data.")


def load_data(spec: Mapping[str, Any], options: Mapping[str, Any]) -> TensorDataset:
    o = _options(options)
    if spec.get("kind") == "synthetic":
        _check_rows(int(spec["steps"]), o, "Synthetic data", "use steps={} or more")
        x, price = generate(int(spec["features"]), int(spec["steps"]), int(spec["seed"]))
    elif spec.get("kind") == "file":
        recorded_file(spec)
        _names, x, price, _date = _read_file(spec, o)
    else:
        raise DataError(f"Unknown data spec kind {spec.get('kind')!r}; re-create the study with --data.")
    return make_windows(x, price, o)


def split_bounds(rows: int, o: _Options) -> tuple[int, int, int]:
    """(n_train, first validation window index, n_val) for ``rows`` steps (docs/design.md §7)."""
    n_windows = rows - o.context_length - o.horizon + 1
    gap = o.context_length + o.horizon - 1
    usable = n_windows - gap
    n_train = min(max(round((1 - o.val_fraction) * usable), 1), usable - 1)
    val_start = n_train + gap  # window index == its first row
    return n_train, val_start, n_windows - val_start


def make_windows(x: np.ndarray, price: np.ndarray, o: _Options) -> TensorDataset:
    import numpy as np
    L, h = o.context_length, o.horizon
    n_train, val_start, n_val = split_bounds(len(price), o)
    # Standardise with rows covered by training windows only (0 .. n_train + L - 2).
    train_rows = x[: n_train + L - 1]
    mean, std = train_rows.mean(0), train_rows.std(0)
    std = np.where(std > 0, std, 1.0)  # a constant column stays 0 rather than dividing by zero
    xs = ((x - mean) / std).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(xs, L, axis=0).transpose(0, 2, 1)  # (T-L+1, L, F) view
    windows = windows[: val_start + n_val]  # the last h windows have no label
    ends = np.arange(len(windows)) + L - 1
    labels = (price[ends + h] / price[ends] - 1.0 > o.threshold).astype(np.float32)

    def part(a: np.ndarray, lo: int, n: int) -> torch.Tensor:
        import torch

        return torch.from_numpy(np.ascontiguousarray(a[lo: lo + n]))

    train_y, val_y = part(labels, 0, n_train), part(labels, val_start, n_val)
    for name, y in (("training", train_y), ("validation", val_y)):
        if y.min() == y.max():
            raise DataError(
                f"All {name} labels are {int(y[0])} with horizon {h} and threshold {o.threshold:g}, so there is "
                "nothing to learn; pass a different --threshold (or --horizon)."
            )
    info = {
        "num_features": int(x.shape[1]), "n_train": n_train, "n_val": n_val,
        "train_pos_rate": float(train_y.mean()), "val_pos_rate": float(val_y.mean()),
        "horizon": h, "threshold": float(o.threshold),
    }
    return TensorDataset((part(windows, 0, n_train),), train_y, (part(windows, val_start, n_val),), val_y, info)
