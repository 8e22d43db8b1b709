"""Token files for the ``lm`` family, and the host-held windows every lm source trains through.

``--data tokens:PATH[,vocab=V][,val=PATH][,dtype=uint16|uint32]``: PATH is a flat binary of
little-endian token ids (nanoGPT's ``train.bin``) or a 1-D ``.npy``; ``val=PATH`` names the
validation file, else the last ``val_fraction`` of PATH validates (contiguous).  Checked at launch
(``parse_tokens``, before anything heavy) on a sample of ``SAMPLE_BLOCKS`` blocks, and by the worker
on every gathered batch, so a stray id fails its trial with one sentence; the spec pins each file
by its ``file_fingerprint``.  Batches are gathered on the host: ``WindowDataset.train_batch`` maps
the file afresh for each batch (as nanoGPT does, so pages read are not kept mapped) and sends the
windows from a pinned buffer.  The synthetic language and text files go through the same class.
Each rule in full: docs/design.md §7.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archhpo.errors import DataError
from archhpo.models._family import TensorDataset
from archhpo.models.data import file_fingerprint, recorded_file

if TYPE_CHECKING:  # imported where used: `archhpo grid`/`params` read this module without them
    import numpy as np
    import torch

PREFIX = "tokens"
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}  # little-endian, as numpy writes them on x86 and ARM
DEFAULT_DTYPE = "uint16"
GPT2_VOCAB = 50257  # GPT-2's BPE vocabulary: nanoGPT's train.bin, and GPU-scale lm configurations
SAMPLE_BLOCKS = 64  # blocks read at launch (and for the unigram baseline), evenly spaced
SAMPLE_TOKENS = 1 << 15  # tokens a block
# A data-budget study (--tokens-per-param) validates on this many tokens at every budget: the same
# windows for every budget (the loss of one is comparable with another's), and a validation that
# costs a fixed amount instead of a tenth of D at each of the run's intervals.  A token file's
# validation is always this cheap, fixed set.
BUDGET_VAL_TOKENS = 1 << 16
_KEYS = ("vocab", "val", "dtype")
_EXAMPLE = "'tokens:train.bin,vocab=50257,val=val.bin'"


# ----------------------------------------------------------------------------- the file
@dataclass(frozen=True)
class TokenFile:
    """A token file on disk: ``n_tokens`` ids of ``dtype`` from byte ``offset`` (a .npy's header)."""

    path: str
    dtype: str  # "uint16" or "uint32"
    offset: int
    n_tokens: int

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "uint16" else 4

    def open(self) -> np.ndarray:
        """A fresh read-only memory map of the ids (dropped with the array)."""
        import numpy as np
        return np.memmap(self.path, dtype=TOKEN_DTYPES[self.dtype], mode="r", offset=self.offset,
                         shape=(self.n_tokens,))

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Ids lo..hi-1 read with a plain file read (nothing stays mapped), as int64."""
        import numpy as np
        with open(self.path, "rb") as fh:
            fh.seek(self.offset + lo * self.itemsize)
            raw = fh.read((hi - lo) * self.itemsize)
        return np.frombuffer(raw, dtype=TOKEN_DTYPES[self.dtype]).astype(np.int64)


def _npy_header(path: Path) -> tuple[str, int, int]:
    """(dtype name, data offset, n_tokens) of a .npy file, refused unless it is a 1-D uint16/uint32 array."""
    import numpy as np
    fmt = np.lib.format
    try:
        with path.open("rb") as fh:
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(fh)
            offset = fh.tell()
    except ValueError as exc:
        raise DataError(f"Token file {path} is not a readable .npy file ({exc}); save it with numpy.save.") from None
    name = next((k for k, v in TOKEN_DTYPES.items() if np.dtype(v) == dtype), None)
    if name is None or len(shape) != 1:
        raise DataError(f"Token file {path} holds a {shape} array of {dtype}; save a 1-D uint16 or uint32 array.")
    size = path.stat().st_size - offset
    if size < shape[0] * dtype.itemsize:
        raise DataError(f"Token file {path} is cut short: its header promises {shape[0]:,} tokens; write it again.")
    return name, offset, int(shape[0])


def token_file(path_text: str, dtype: str | None, where: str) -> TokenFile:
    """The token file at `path_text`, checked: it exists and holds a whole number of ids."""
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise DataError(f"Token file {path} does not exist or is not a file; pass nanoGPT's train.bin "
                        f"(flat uint16 ids) or a .npy, e.g. --data {_EXAMPLE}.")
    if dtype is not None and dtype not in TOKEN_DTYPES:
        raise DataError(f"dtype={dtype} in {where} is not a token type; write dtype=uint16 or dtype=uint32.")
    if path.suffix == ".npy":
        name, offset, n = _npy_header(path)
        if dtype is not None and dtype != name:
            raise DataError(f"dtype={dtype} in {where} disagrees with {path}'s header ({name}); drop the dtype key.")
        return TokenFile(str(path), name, offset, n)
    name = dtype or DEFAULT_DTYPE
    itemsize = 2 if name == "uint16" else 4
    size = path.stat().st_size
    if size % itemsize:
        raise DataError(f"Token file {path} has {size:,} bytes, not a whole number of {name} ids "
                        f"({itemsize} bytes each); check the dtype key (uint16 or uint32) or write the file again.")
    return TokenFile(str(path), name, 0, size // itemsize)


def sample_spans(lo: int, hi: int) -> list[tuple[int, int]]:
    """SAMPLE_BLOCKS spans of SAMPLE_TOKENS ids evenly spaced over lo..hi-1 (the first and the last
    included; the whole range when it is shorter than the blocks together)."""
    if hi - lo <= SAMPLE_BLOCKS * SAMPLE_TOKENS:
        return [(lo, hi)]
    step = (hi - lo - SAMPLE_TOKENS) / (SAMPLE_BLOCKS - 1)
    return [(lo + round(i * step), lo + round(i * step) + SAMPLE_TOKENS) for i in range(SAMPLE_BLOCKS)]


def check_ids(ids: np.ndarray, where: int | np.ndarray, vocab: int, path: str, what: str) -> None:
    """Refuse an id ≥ vocab among `ids`, read from positions `where` of `path` (an array of ids'
    positions, or the first one's for a contiguous run)."""
    import numpy as np
    if ids.size == 0 or int(ids.max()) < vocab:
        return
    at = int(np.argmax(ids.reshape(-1) >= vocab))
    pos = where + at if isinstance(where, int) else int(where.reshape(-1)[at])
    raise DataError(f"Token file {path} holds id {int(ids.reshape(-1)[at])} at token {pos:,} ({what}), not "
                    f"below vocab={vocab}; pass the tokenizer's vocabulary as vocab=V in --data.")


def _sample(tf: TokenFile, lo: int, hi: int, vocab: int, what: str) -> np.ndarray:
    """The ids of `sample_spans(lo, hi)`, each span checked against `vocab`."""
    import numpy as np
    parts = []
    for a, b in sample_spans(lo, hi):
        part = tf.read(a, b)
        check_ids(part, a, vocab, tf.path, what)
        parts.append(part)
    return np.concatenate(parts)


# ----------------------------------------------------------------------------- parsing
def _items(raw: str) -> tuple[str, dict[str, str]]:
    path, *rest = [s.strip() for s in raw.partition(":")[2].split(",")]
    keys: dict[str, str] = {}
    for item in filter(None, rest):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in _KEYS or not value.strip():
            raise DataError(f"Cannot read {item!r} in --data {raw!r}; write e.g. {_EXAMPLE} (keys: {', '.join(_KEYS)}).")
        keys[key] = value.strip()
    if not path:
        raise DataError(f"--data {raw!r} names no token file; write e.g. {_EXAMPLE}.")
    return path, keys


def _vocab(keys: Mapping[str, str], options: Mapping[str, Any], tf: TokenFile, raw: str) -> int:
    flag = options.get("vocab_size")
    try:
        vocab = int(keys.get("vocab", flag if flag is not None else GPT2_VOCAB))
    except ValueError:
        raise DataError(f"vocab={keys['vocab']!r} in --data {raw!r} is not an integer; write e.g. vocab=50257.") from None
    if flag is not None and "vocab" in keys and int(flag) != vocab:
        raise DataError(f"--vocab-size {flag} disagrees with vocab={vocab} in --data; give the vocabulary once.")
    if vocab < 2:
        raise DataError(f"A token file needs a vocabulary of at least 2 ids, got vocab={vocab}.")
    if vocab > 1 << (8 * tf.itemsize):
        raise DataError(f"vocab={vocab:,} does not fit {tf.dtype} ids (at most {1 << (8 * tf.itemsize):,}); "
                        "store the ids as uint32 and pass dtype=uint32.")
    return vocab


def _pinned(tf: TokenFile) -> dict[str, Any]:
    return {"path": tf.path, "dtype": tf.dtype, "n_tokens": tf.n_tokens, "fingerprint": file_fingerprint(tf.path)}


def parse_tokens(raw: str, options: Mapping[str, Any], seq_len: int, vf: float) -> dict[str, Any]:
    """The spec of ``tokens:PATH[,vocab=V][,val=PATH][,dtype=..]``, every launch check done (module docstring)."""
    path, keys = _items(raw)
    where = f"--data {raw!r}"
    tf = token_file(path, keys.get("dtype"), where)
    vocab = _vocab(keys, options, tf, raw)
    window = seq_len + 1
    val = token_file(keys["val"], keys.get("dtype"), where) if "val" in keys else None
    if val is None:
        need = math.ceil(window / min(vf, 1 - vf)) + 1
        short = [(tf, need)] if tf.n_tokens < need else []
    else:
        short = [(f, window) for f in (tf, val) if f.n_tokens < window]
    if short:
        f, need = short[0]
        raise DataError(f"Token file {f.path} has {f.n_tokens:,} tokens, too few for a training and a "
                        f"validation window of {window} tokens; use at least {need:,} tokens or a smaller --seq-len.")
    for f in (tf, *([val] if val is not None else [])):
        _sample(f, 0, f.n_tokens, vocab, "in the sample read at launch")
    spec: dict[str, Any] = {"kind": PREFIX, **_pinned(tf), "vocab": vocab}
    if val is not None:
        spec["val"] = _pinned(val)
    return spec


# ----------------------------------------------------------------------------- the windows
def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` as int64 on `device`; to CUDA through a pinned buffer, asynchronously (the caching host
    allocator keeps the buffer until the copy is done)."""
    import torch
    if device.type != "cuda":
        return t.to(torch.int64)
    buf = torch.empty(t.shape, dtype=torch.int64, pin_memory=True)
    buf.copy_(t)
    return buf.to(device, non_blocking=True)


def _as_tensor(ids: np.ndarray) -> torch.Tensor:
    """A tensor over `ids` without a copy (a read-only map: torch's warning about it is moot, nothing writes)."""
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(ids)


def windows_view(stream: torch.Tensor, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the first `n` windows of seq_len + 1 ids at stride seq_len: views, no copy."""
    return stream.as_strided((n, seq_len), (seq_len, 1), 0), stream.as_strided((n, seq_len), (seq_len, 1), 1)


@dataclass
class WindowDataset(TensorDataset):
    """An lm split held on the host; each batch is gathered there and copied to the device.

    In memory (``source`` None: the synthetic language, a text file) ``train_inputs`` and
    ``train_target`` are the windows themselves; over a token file (``source``) they are views of
    its map that the trainer never reads: ``train_batch`` gathers the windows from a fresh map and
    checks them against ``vocab``.  The validation windows are small and always in memory.
    """

    source: TokenFile | None = None  # training window k: ids k * seq_len .. k * seq_len + seq_len
    seq_len: int = 0
    vocab: int = 0

    def to(self, device: torch.device | str) -> WindowDataset:
        return self  # held on the host: batches go to the device one at a time

    def device_bytes(self, device: torch.device | str) -> int:
        return 0  # never moved: only a batch at a time reaches the device

    def index_device(self, device: torch.device) -> torch.device:
        import torch
        return torch.device("cpu")

    def train_batch(self, idx: torch.Tensor, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        if self.source is None:
            x, y = self.train_inputs[0][idx], self.train_target[idx]
        else:
            w = self._gather(idx.numpy())
            x, y = w[:, :-1], w[:, 1:]
        return (_to(x, device),), _to(y, device)

    def val_batch(self, start: int, stop: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return (_to(self.val_inputs[0][start:stop], device),), _to(self.val_target[start:stop], device)

    def _gather(self, idx: np.ndarray) -> torch.Tensor:
        """The windows at `idx` as int64 (B, seq_len + 1), from a map opened for them alone."""
        import numpy as np
        import torch
        assert self.source is not None
        where = (idx.astype(np.int64) * self.seq_len)[:, None] + np.arange(self.seq_len + 1)
        ids = self.source.open()[where]  # a copy: the map goes with this call
        check_ids(ids, where, self.vocab, self.source.path, "in a training batch")
        return _as_tensor(ids).to(torch.int64)

    def target_sample(self) -> torch.Tensor:
        """Training targets the unigram baseline counts: all of them in memory, else the ids of
        `sample_spans` over the training part (a full pass over a large file is too slow)."""
        if self.source is None:
            return self.train_target.reshape(-1)
        hi = 1 + self.n_train * self.seq_len
        return _as_tensor(_sample(self.source, 1, hi, self.vocab, "in the unigram baseline's sample"))


def _val_windows(tf: TokenFile, lo: int, hi: int, seq_len: int, vocab: int) -> np.ndarray:
    """Evenly spaced windows of ids lo..hi-1, at most BUDGET_VAL_TOKENS ids of them, as int64, checked."""
    import numpy as np
    n = (hi - lo - 1) // seq_len
    pick = np.linspace(0, n - 1, min(n, max(1, BUDGET_VAL_TOKENS // seq_len))).round().astype(np.int64)
    where = (lo + pick * seq_len)[:, None] + np.arange(seq_len + 1)
    ids = np.asarray(tf.open()[where], dtype=np.int64)
    check_ids(ids, where, vocab, tf.path, "in the validation windows")
    return ids


def load_tokens(spec: Mapping[str, Any], seq_len: int, vf: float, train_cap: int | None,
                info: dict[str, Any]) -> WindowDataset:
    """The token file's windows (each file checked against its fingerprint); `train_cap` windows at most."""
    import torch
    tf = token_file(str(recorded_file(spec)), str(spec["dtype"]), "the study's data spec")
    vocab = int(spec["vocab"])
    if "val" in spec:
        val_file = token_file(str(recorded_file(spec["val"])), str(spec["val"]["dtype"]), "the study's data spec")
        cut, val = tf.n_tokens, _val_windows(val_file, 0, val_file.n_tokens, seq_len, vocab)
    else:
        cut = int(round(tf.n_tokens * (1 - vf)))
        val = _val_windows(tf, cut, tf.n_tokens, seq_len, vocab)
    n_train = (cut - 1) // seq_len
    if train_cap is not None:
        n_train = min(n_train, train_cap)
    x, y = windows_view(_as_tensor(tf.open()), n_train, seq_len)
    va = torch.from_numpy(val)
    info.update(source=str(spec["path"]), n_train=n_train, n_val=int(va.shape[0]), train_tokens=n_train * seq_len)
    return WindowDataset((x,), y, (va[:, :-1],), va[:, 1:], info, source=tf, seq_len=seq_len, vocab=vocab)
