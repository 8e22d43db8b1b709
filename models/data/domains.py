"""Short strings (domain names) with integer class labels, for the char_cls family.

Two sources:

- ``synthetic`` (``synthetic:n=4000,seed=0``): a deterministic, balanced set of benign-looking
  names (label 0: pronounceable syllable names and dictionary-word combos) against
  algorithmically generated ones (label 1: random letters, hex strings, consonant runs and
  concatenations of 3-4 dictionary words).  Both classes draw their TLDs from the same pool
  of real TLDs, so the label cannot be read off the suffix: the model has to read the name.
- a CSV file with columns ``text`` and ``label`` (integer class ids 0..K-1, every class
  present, at least two classes).

The character encoding lives here too (``encode``), because it is part of what the data
means; ``models.char_cls`` re-exports it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
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


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789-_"  # 38 characters, ids 2..39
PAD_ID = 0
CLS_ID = 1
VOCAB_SIZE = len(ALPHABET) + 2  # 40: PAD, CLS and the alphabet
MAX_LEN = 64  # counts the CLS token: at most 63 characters are kept

# Byte-level lookup so that encoding runs in C (bytes.translate) rather than per character in
# Python: alphabet bytes map to their ids, every other byte is deleted.
_table = bytearray(256)
for _i, _c in enumerate(ALPHABET):
    _table[ord(_c)] = _i + 2
_ID_TABLE = bytes(_table)
_DELETE = bytes(b for b in range(256) if chr(b) not in ALPHABET)


def clean(text: str) -> str:
    """The characters ``encode`` keeps, as a string (lower-cased, only the 38-letter alphabet).

    Characters outside the alphabet are DROPPED, not mapped to an UNK id: that removes the
    dots (``"Example.co.uk"`` -> ``"examplecouk"``) by the same rule, spends no id on noise,
    and keeps the vocabulary at 40.  Non-ASCII characters are dropped too (``"café"`` ->
    ``"caf"``); punycode (``xn--...``) is plain ASCII and is kept as is.
    """
    return text.lower().encode("ascii", "ignore").translate(None, _DELETE).decode("ascii")


def encode(texts: Sequence[str], max_len: int = MAX_LEN) -> torch.Tensor:
    """Encode strings as ``[CLS] + characters`` padded with PAD (0) or cut to ``max_len`` ids.

    Returns a LongTensor (N, max_len).  Lower-cases, then drops every character outside
    ``ALPHABET`` (dots included, see ``clean``); ``max_len`` counts the CLS token.
    """
    import numpy as np
    import torch

    if max_len < 1:
        raise ValueError(f"max_len must be at least 1 (room for the CLS token), got {max_len}.")
    keep = max_len - 1
    cls, pad = bytes([CLS_ID]), bytes([PAD_ID])
    rows = []
    for text in texts:
        ids = text.lower().encode("ascii", "ignore").translate(_ID_TABLE, _DELETE)[:keep]
        rows.append(cls + ids + pad * (keep - len(ids)))
    flat = np.frombuffer(b"".join(rows), dtype=np.uint8)
    return torch.from_numpy(flat.reshape(len(rows), max_len).astype(np.int64))


# ---------------------------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------------------------

DEFAULT_N = 4000
QUICK_N = 1200  # --quick: enough rows for a tiny model to learn the easy styles in seconds
MIN_ROWS = 20  # below this a train/validation split says nothing
DEFAULT_VAL_FRACTION = 0.2

# Real TLDs, shared by both classes (see the module docstring).
TLDS = ("com", "com", "com", "org", "net", "io", "de", "co.uk", "fr", "nl", "info", "app")
SUBDOMAINS = ("www", "mail", "blog", "shop", "api")
PREFIXES = ("my", "get", "the", "go", "try")

WORDS = (
    "apple", "river", "stone", "cloud", "green", "house", "light", "music", "ocean", "paper",
    "silver", "garden", "market", "travel", "planet", "bright", "forest", "rocket", "summer",
    "winter", "yellow", "coffee", "castle", "dragon", "finance", "health", "energy", "mobile",
    "digital", "studio", "design", "media", "smart", "cyber", "secure", "cloud", "data", "code",
    "blue", "red", "fox", "bear", "wolf", "lion", "eagle", "tiger", "star", "moon", "sun", "sky",
    "sea", "lake", "hill", "rock", "tree", "leaf", "rose", "lily", "mint", "salt", "gold", "iron",
    "north", "south", "east", "west", "city", "town", "home", "shop", "store", "bank", "book",
    "news", "game", "play", "work", "tech", "labs", "hub", "net", "web", "app", "box", "base",
    "point", "line", "path", "road", "way", "bridge", "tower", "port", "bay", "field", "farm",
    "food", "fresh", "kitchen", "table", "chair", "glass", "water", "fire", "wind", "storm",
    "rain", "snow", "ice", "spring", "autumn", "happy", "quick", "simple", "clear", "prime",
    "alpha", "delta", "nova", "terra", "zen", "pixel", "vector", "signal", "motion", "spark",
)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "tr", "st", "pl", "gr", "ch", "sh", "")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ia", "ea", "ou")
_CODAS = ("n", "r", "s", "l", "m", "x", "t")
_CONSONANTS = "bcdfghjklmnpqrstvwxz"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_HEX = "0123456789abcdef"

BENIGN_STYLES = ("syllables", "words")
DGA_STYLES = ("random_letters", "hex", "consonants", "word_concat")


def _syllable_name(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(2, 4)):
        coda = rng.choice(_CODAS) if rng.random() < 0.3 else ""
        parts.append(rng.choice(_ONSETS) + rng.choice(_VOWELS) + coda)
    return "".join(parts)


def _word_name(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 2))]
    name = ("-" if rng.random() < 0.25 else "").join(words)
    if rng.random() < 0.15:
        name = rng.choice(PREFIXES) + name  # "getbluefox": makes word counting non-trivial
    if rng.random() < 0.15:
        name += str(rng.randint(1, 99))
    return name


def _dga_name(style: str, rng: random.Random) -> str:
    if style == "random_letters":
        return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(10, 20)))
    if style == "hex":
        return "".join(rng.choice(_HEX) for _ in range(rng.randint(12, 32)))
    if style == "consonants":
        # Mostly consonant runs with the odd vowel, so "has no vowels" is not the whole rule.
        return "".join(
            rng.choice("aeiou") if rng.random() < 0.1 else rng.choice(_CONSONANTS)
            for _ in range(rng.randint(8, 16))
        )
    if style == "word_concat":
        # The hard-ish style: real words, no separators, 3-4 of them (benign names use 1-2,
        # sometimes with a prefix), so only length and word count give it away.
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(3, 4)))
    raise ValueError(f"unknown style {style!r}")


def generate_synthetic(n: int = DEFAULT_N, seed: int = 0) -> tuple[list[str], list[int], list[str]]:
    """``n`` domain names with labels and generating styles, deterministic in ``seed``.

    Balanced (the class counts differ by at most one) and each class cycles through its
    styles, so every style appears whenever the class has at least that many rows.
    """
    rng = random.Random(seed)
    rows: list[tuple[str, int, str]] = []
    for i in range(n):
        label = i % 2
        if label == 0:
            style = BENIGN_STYLES[(i // 2) % len(BENIGN_STYLES)]
            name = _syllable_name(rng) if style == "syllables" else _word_name(rng)
            if rng.random() < 0.2:
                name = rng.choice(SUBDOMAINS) + "." + name
        else:
            style = DGA_STYLES[(i // 2) % len(DGA_STYLES)]
            name = _dga_name(style, rng)
        rows.append((f"{name}.{rng.choice(TLDS)}", label, style))
    rng.shuffle(rows)
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


# ---------------------------------------------------------------------------------------------
# CSV data
# ---------------------------------------------------------------------------------------------


def _read_csv(path: Path) -> tuple[list[str], np.ndarray, int]:
    """Read and validate a (text, label) CSV; returns texts, labels (int64) and K."""
    table = _read_table(path)
    texts = table["text"].to_pylist()
    for i, text in enumerate(texts):
        if text is None or not text.strip():
            raise DataError(f"Data file {path} has an empty text on data row {i + 1}; remove or fill that row.")
    labels = _integer_labels(path, table["label"])
    return texts, labels, _class_count(path, labels)


def _read_table(path: Path) -> pa.Table:
    """The CSV as a table of two string columns (text, label) with enough rows to split."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if not path.exists():
        raise DataError(f"Data file {path} does not exist; pass an existing CSV path or 'synthetic'.")
    if not path.is_file():
        raise DataError(f"Data path {path} is not a file; pass a CSV file with columns text,label.")
    try:
        table = pacsv.read_csv(
            path,
            # Read both as strings so labels are checked by us (with a row number), not coerced.
            convert_options=pacsv.ConvertOptions(column_types={"text": pa.string(), "label": pa.string()}),
        )
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"Data file {path} could not be read as CSV ({first}); save it as a UTF-8 CSV with columns text,label."
        ) from exc
    missing = [c for c in ("text", "label") if c not in table.column_names]
    if missing:
        have = ", ".join(table.column_names) or "none"
        raise DataError(
            f"Data file {path} lacks column(s) {', '.join(missing)} (found: {have}); "
            "give it a header row with columns text,label."
        )
    if table.num_rows < MIN_ROWS:
        raise DataError(
            f"Data file {path} has {table.num_rows} rows, too few to split into training and "
            f"validation; provide at least {MIN_ROWS}."
        )
    return table


def _integer_labels(path: Path, column: pa.ChunkedArray) -> np.ndarray:
    """The label column as int64, naming the first row that is not an integer."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    label_col = pc.utf8_trim_whitespace(column)
    try:
        return np.array(pc.cast(label_col, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        for i, value in enumerate(label_col.to_pylist()):
            try:
                int(value)
            except (TypeError, ValueError):
                raise DataError(
                    f"Data file {path} has label {value!r} on data row {i + 1}, which is not an integer; "
                    "labels must be integer class ids 0..K-1."
                ) from exc
        raise DataError(f"Data file {path} has labels that are not integers; use class ids 0..K-1.") from exc


def _class_count(path: Path, labels: np.ndarray) -> int:
    """K, once the labels are class ids 0..K-1 with every class present and at least two classes."""
    import numpy as np

    if labels.min() < 0:
        row = int(np.argmax(labels < 0))
        raise DataError(
            f"Data file {path} has negative label {labels[row]} on data row {row + 1}; "
            "labels must be class ids 0..K-1."
        )
    k = int(labels.max()) + 1
    counts = np.bincount(labels, minlength=k)
    if k < 2 or (counts > 0).sum() < 2:
        raise DataError(
            f"Data file {path} has only one class ({int(labels[0])}); a classifier needs at least two label values."
        )
    absent = [c for c in range(k) if counts[c] == 0]
    if absent:
        raise DataError(
            f"Data file {path} never uses class id(s) {', '.join(map(str, absent[:5]))} although its "
            f"largest label is {k - 1}; renumber the labels as 0..K-1 with every class present."
        )
    return k


# ---------------------------------------------------------------------------------------------
# Family hooks
# ---------------------------------------------------------------------------------------------


def _parse_synthetic(text: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "synthetic", "n": DEFAULT_N, "seed": 0}
    _, _, rest = text.partition(":")
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("n", "seed"):
            raise DataError(
                f"Unknown synthetic data option {item!r}; write e.g. 'synthetic:n=4000,seed=0' (keys: n, seed)."
            )
        try:
            spec[key] = int(value)
        except ValueError:
            raise DataError(f"Synthetic data option {key}={value!r} is not an integer; write e.g. {key}=4000.") from None
    if spec["n"] < MIN_ROWS:
        raise DataError(f"Synthetic data size n={spec['n']} is too small; use n >= {MIN_ROWS}.")
    return spec


def _val_fraction(options: Mapping[str, Any]) -> float:
    vf = float(options.get("val_fraction", DEFAULT_VAL_FRACTION))
    if not 0.0 < vf < 1.0:
        raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {vf}; the default is 0.2.")
    return vf


def parse_data(text: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``--data`` into a JSON-able spec, validating a CSV file eagerly (reads it once)."""
    text = (text or "").strip()
    _val_fraction(options)
    if not text:
        raise DataError("The data spec is empty; pass 'synthetic', 'synthetic:n=4000,seed=0' or a CSV path.")
    if text == "synthetic" or text.startswith("synthetic:"):
        return _parse_synthetic(text)
    path = Path(text).expanduser().resolve()
    _, labels, k = _read_csv(path)
    # Pin the file's content: a worker whose copy differs refuses it (load_data), as for every family.
    return {"kind": "csv", "path": str(path), "num_classes": k, "n_rows": int(labels.shape[0]),
            "sha256": _sha256(path)}


def data_info(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Shape facts for ``config_for``; cheap (the CSV's class count is stored in its spec)."""
    if spec.get("kind") == "synthetic":
        k = 2
    elif "num_classes" in spec:
        k = int(spec["num_classes"])
    else:
        k = _read_csv(Path(spec["path"]))[2]
    return {"vocab_size": VOCAB_SIZE, "max_len": MAX_LEN, "num_classes": k}


def load_data(spec: Mapping[str, Any], options: Mapping[str, Any]) -> TensorDataset:
    """Encode the texts and split them at random (seeded by ``options['seed']``) into train/val.

    Options: ``seed`` (split and, for CSV under ``quick``, subsampling; default 0),
    ``val_fraction`` (default 0.2), ``quick`` (at most QUICK_N rows).
    """
    import numpy as np
    import torch

    quick = bool(options.get("quick", False))
    rng = np.random.default_rng(int(options.get("seed", 0) or 0))  # CSV subsampling, then the split
    styles: list[str] | None = None
    if spec.get("kind") == "synthetic":
        texts, labels, k, source, styles = _synthetic_rows(spec, quick)
    elif spec.get("kind") == "csv":
        texts, labels, k, source = _csv_rows(spec, quick, rng)
    else:
        raise DataError(f"Unknown data spec {dict(spec)!r}; pass 'synthetic' or a CSV path.")

    n = len(texts)
    n_val = min(max(1, round(n * _val_fraction(options))), n - 1)
    perm = rng.permutation(n)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    ids = encode(texts, MAX_LEN)  # (N, max_len)
    target = torch.from_numpy(labels)  # (N,)
    tr, va = torch.from_numpy(train_idx), torch.from_numpy(val_idx)
    info: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "max_len": MAX_LEN,
        "num_classes": k,
        "source": source,
        "n_train": int(tr.numel()),
        "n_val": int(va.numel()),
        "class_counts_train": np.bincount(labels[train_idx], minlength=k).tolist(),
        "class_counts_val": np.bincount(labels[val_idx], minlength=k).tolist(),
        # Texts longer than max_len - 1 characters (after cleaning) lose their tail.
        "n_truncated": sum(len(clean(t)) > MAX_LEN - 1 for t in texts),
    }
    if styles is not None:
        info["style_counts"] = {s: styles.count(s) for s in (*BENIGN_STYLES, *DGA_STYLES)}
    return TensorDataset((ids[tr],), target[tr], (ids[va],), target[va], info)


def _synthetic_rows(spec: Mapping[str, Any], quick: bool) -> tuple[list[str], np.ndarray, int, str, list[str]]:
    """Texts, labels, K = 2, the source line and each text's style, of the synthetic set."""
    import numpy as np

    n = int(spec.get("n", DEFAULT_N))
    n = min(n, QUICK_N) if quick else n
    texts, label_list, styles = generate_synthetic(n, int(spec.get("seed", 0)))
    source = f"synthetic:n={n},seed={int(spec.get('seed', 0))}"
    return texts, np.asarray(label_list, dtype=np.int64), 2, source, styles


def _csv_rows(
    spec: Mapping[str, Any], quick: bool, rng: np.random.Generator,
) -> tuple[list[str], np.ndarray, int, str]:
    """Texts, labels, K and the source of the recorded CSV, refused if it changed since launch."""
    import numpy as np

    path = recorded_file(spec)
    texts, labels, k = _read_csv(path)
    if "num_classes" in spec and int(spec["num_classes"]) != k:
        raise DataError(
            f"Data file {spec['path']} now has {k} classes but the study was launched with "
            f"{spec['num_classes']}; launch a new experiment for the changed file."
        )
    if quick and len(texts) > QUICK_N:
        keep = np.sort(rng.choice(len(texts), QUICK_N, replace=False))
        texts, labels = [texts[i] for i in keep], labels[keep]
    return texts, labels, k, str(spec["path"])
