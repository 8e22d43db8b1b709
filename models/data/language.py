"""Token sequences for the ``lm`` family: a synthetic language with an exact entropy rate, or a text file.

Sources: ``synthetic`` (``synthetic:vocab=32,order=3,language=0,tokens=2000000``), a log-linear
back-off n-gram source, an order-k Markov chain over contexts whose entropy rate is therefore exact
(its stationary distribution by power iteration, ``stationary``); ``synthetic:vocab=50257,classes=32``,
the same source over ``classes`` symbols, each written as one of its own tokens drawn from a Zipf
law, so a GPT-2-sized vocabulary keeps an exact entropy rate at classes^(k+1) probabilities; any
UTF-8 text file, read as bytes (a contiguous split, sha256-pinned); and ``tokens:PATH`` files of
token ids (models/data/tokens.py).  Every source trains through ``tokens.WindowDataset``, batches
gathered on the host and copied to the device one at a time.  A sample is a window of
``seq_len + 1`` tokens; ``loss_floor`` is the least expected NLL per predicted token on such
windows, slightly above h since the first k-1 positions see less than a full context.  The
formulas: docs/design.md §7.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archhpo.errors import DataError
from archhpo.models._family import TensorDataset
from archhpo.models.data import file_sha256, recorded_file
from archhpo.models.data.tokens import (  # BUDGET_VAL_TOKENS and GPT2_VOCAB are defined there, read here too
    BUDGET_VAL_TOKENS,
    GPT2_VOCAB,
    PREFIX,
    WindowDataset,
    load_tokens,
    parse_tokens,
    windows_view,
)
from archhpo.schema import DataBudget

if TYPE_CHECKING:  # imported where used: `archhpo grid`/`params` read this module without them
    import numpy as np
    import torch

SIGMAS = (2.0, 1.2, 0.8, 0.5, 0.3)  # std of the order-1, order-2, ... logit tables
DEFAULT_VOCAB = 32
DEFAULT_ORDER = 3
DEFAULT_SEQ_LEN = 32  # an order-3 source needs little context; short windows give CPU runs more steps
DEFAULT_TOKENS = 2_000_000  # training tokens of the synthetic language
QUICK_TOKENS = 300_000  # --quick: enough for tiny models to separate in CPU minutes
BYTE_VOCAB = 256
DEFAULT_VAL_FRACTION = 0.1
MAX_TABLE = 1 << 22  # vocab^(order+1) next-symbol probabilities held in memory
_INT_KEYS = ("vocab", "order", "language", "tokens", "classes")


# ----------------------------------------------------------------------------- the source
@functools.lru_cache(maxsize=4)
def source_probs(vocab: int, order: int, language: int) -> np.ndarray:
    """P(next | context) as an array of shape (vocab,) * order + (vocab,), float64, rows summing to 1."""
    import numpy as np
    rng = np.random.default_rng(language)
    logits = np.zeros((vocab,) * (order + 1))
    for j in range(1, order + 1):
        w = rng.normal(0.0, SIGMAS[j - 1], size=(vocab,) * (j + 1))  # last j context symbols, next
        logits += w.reshape((1,) * (order - j) + w.shape)
    logits -= logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    p.setflags(write=False)
    return p


def stationary(probs: np.ndarray, tol: float = 1e-16, max_iter: int = 100_000) -> np.ndarray:
    """The stationary distribution over contexts (shape (vocab,) * order) of the chain ``probs``.

    Every transition has positive probability, so the chain is primitive and power iteration
    converges to the unique fixed point; it stops when an iteration no longer moves any entry by
    more than ``tol`` (machine precision for these sizes).
    """
    import numpy as np
    shape = probs.shape[:-1]
    pi = np.full(shape, 1.0 / math.prod(shape))
    for _ in range(max_iter):
        # context (a, b.., c) -> (b.., c, d) with probability P[a, b.., c, d]
        new = (pi[..., None] * probs).sum(axis=0)
        new /= new.sum()
        if np.abs(new - pi).max() <= tol:
            return new
        pi = new
    raise DataError("The synthetic language's context chain did not converge; choose another language seed.")


def _entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    import numpy as np
    return -(p * np.log(p, where=p > 0, out=np.zeros_like(p))).sum(axis=axis)


def class_bounds(vocab: int, classes: int) -> list[int]:
    """Token c owns ids bounds[c] .. bounds[c+1]-1 (every class at least one token)."""
    return [c * vocab // classes for c in range(classes + 1)]


def member_probs(n: int) -> np.ndarray:
    """The Zipf law over a class's n tokens: probability proportional to 1/rank."""
    import numpy as np
    w = 1.0 / np.arange(1, n + 1)
    return w / w.sum()


@functools.lru_cache(maxsize=8)
def language_facts(vocab: int, order: int, language: int, seq_len: int,
                   classes: int | None = None) -> dict[str, float]:
    """Exact entropy rate, unigram entropy and loss floor (nats per token) of the synthetic language.

    With ``classes`` < ``vocab`` the n-gram runs over the classes and each class's token is drawn
    independently of everything else: every conditional entropy gains the class-weighted entropy
    of the token within its class (the class is a function of the token, so nothing is lost)."""
    import numpy as np
    alphabet = vocab if classes is None else classes
    probs = source_probs(alphabet, order, language)
    pi = stationary(probs)
    rate = float((pi * _entropy(probs)).sum())
    # H_j: entropy of j consecutive symbols (a marginal of the stationary k-block), j = 1..order
    blocks = [float(_entropy(pi.sum(axis=tuple(range(order - j))).ravel(), 0)) for j in range(1, order + 1)]
    # H(X_t | X_0..X_{t-1}) = H_{t+1} - H_t for t < order, h afterwards; targets are t = 1..seq_len
    cond = [blocks[t] - blocks[t - 1] if t < order else rate for t in range(1, seq_len + 1)]
    within = 0.0
    if classes is not None and classes < vocab:
        marginal = pi.sum(axis=tuple(range(order - 1))).ravel()  # the stationary class unigram
        bounds = class_bounds(vocab, classes)
        within = float(sum(marginal[c] * _entropy(member_probs(bounds[c + 1] - bounds[c]), 0)
                           for c in range(classes)))
    return {"entropy_rate": rate + within, "unigram_entropy": blocks[0] + within,
            "loss_floor": float(np.mean(cond)) + within}


def sample_windows(vocab: int, order: int, language: int, n: int, length: int,
                   seed: int | np.random.SeedSequence) -> np.ndarray:
    """``n`` windows of ``length`` tokens of the stationary process, int64 (n, length); deterministic."""
    import numpy as np
    probs = source_probs(vocab, order, language)
    pi = stationary(probs).ravel()
    cdf = np.cumsum(probs.reshape(-1, vocab), axis=-1)  # (vocab^order, vocab)
    rng = np.random.default_rng(seed)
    out = np.empty((n, max(length, order)), dtype=np.int64)
    start = rng.choice(pi.size, size=n, p=pi)  # the first `order` symbols, drawn jointly from pi
    ctx = start.copy()
    for i in range(order):
        out[:, order - 1 - i] = start % vocab
        start //= vocab
    for t in range(order, out.shape[1]):
        u = rng.random(n)
        nxt = np.minimum((u[:, None] > cdf[ctx]).sum(axis=1), vocab - 1)
        out[:, t] = nxt
        ctx = (ctx * vocab + nxt) % pi.size  # drop the oldest symbol, append the new one
    return out[:, :length]


def expand_classes(windows: np.ndarray, vocab: int, classes: int,
                   seed: int | np.random.SeedSequence) -> np.ndarray:
    """Write each class symbol of ``windows`` as one of its tokens (its Zipf law), from a stream of
    its own: the class sequence is the one ``sample_windows`` drew with the same seed."""
    import numpy as np
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    rng = np.random.default_rng(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 7)))
    u = rng.random(windows.shape)
    out = np.empty_like(windows)
    bounds = class_bounds(vocab, classes)
    for c in range(classes):
        at = windows == c
        cdf = np.cumsum(member_probs(bounds[c + 1] - bounds[c]))
        member = np.minimum(np.searchsorted(cdf, u[at], side="right"), len(cdf) - 1)
        out[at] = bounds[c] + member
    return out


# ----------------------------------------------------------------------------- parsing
def _as_int(key: str, value: Any, where: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise DataError(f"{key}={value!r} in {where} is not an integer; write e.g. {key}=3.") from None


def _validate_synthetic(spec: Mapping[str, Any]) -> None:
    v, k = spec["vocab"], spec["order"]
    c = spec.get("classes", v)
    if v < 2:
        raise DataError(f"The synthetic language needs a vocabulary of at least 2 symbols, got vocab={v}.")
    if not 2 <= c <= v:
        raise DataError(f"classes={c} must be between 2 and the vocabulary ({v}).")
    if not 1 <= k <= len(SIGMAS):
        raise DataError(f"The synthetic language's order must be 1..{len(SIGMAS)}, got order={k}.")
    if c ** (k + 1) > MAX_TABLE:
        raise DataError(
            f"vocab={c} with order={k} needs {c ** (k + 1):,} probabilities (more than {MAX_TABLE:,}); "
            f"lower the vocabulary or the order, or keep the vocabulary and add classes={DEFAULT_VOCAB} "
            f"(e.g. 'synthetic:vocab={GPT2_VOCAB},classes={DEFAULT_VOCAB}')."
        )
    if spec["tokens"] < 1000:
        raise DataError(f"tokens={spec['tokens']} is too few to train on; use at least 1000.")


def _seq_len(options: Mapping[str, Any]) -> int:
    seq_len = _as_int("seq_len", options.get("seq_len", DEFAULT_SEQ_LEN), "--seq-len")
    if seq_len < 1:
        raise DataError(f"--seq-len must be at least 1 token, got {seq_len}.")
    return seq_len


def _val_fraction(options: Mapping[str, Any]) -> float:
    vf = float(options.get("val_fraction", DEFAULT_VAL_FRACTION))
    if not 0.0 < vf < 1.0:
        raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {vf}; the default is 0.1.")
    return vf


def _parse_synthetic(raw: str, options: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kind": "synthetic", "language": 0, "tokens": DEFAULT_TOKENS,
        "vocab": _as_int("vocab_size", options.get("vocab_size", DEFAULT_VOCAB), "--vocab-size"),
        "order": _as_int("order", options.get("order", DEFAULT_ORDER), "--order"),
    }
    given: set[str] = set()
    for item in filter(None, (s.strip() for s in raw.partition(":")[2].split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        given.add(key)
        if not eq or key not in _INT_KEYS:
            raise DataError(
                f"Cannot read {item!r} in --data {raw!r}; write e.g. "
                f"'synthetic:vocab=32,order=3,language=0,tokens=2000000' (keys: {', '.join(_INT_KEYS)})."
            )
        spec[key] = _as_int(key, value, f"--data {raw!r}")
    if spec.get("classes") == spec["vocab"]:
        del spec["classes"]  # the plain language: the same spec (and study) as without the key
    budget = DataBudget.of(options)
    if budget is not None and "tokens" not in given:
        # Sized to D: every token is fresh (one pass). tokens=N given explicitly caps it (passes repeat).
        seq_len = _seq_len(options)
        spec["tokens"] = max(1000, math.ceil(budget.target / seq_len) * seq_len)
    _validate_synthetic(spec)
    return spec


def _read_text(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"Data file {path} does not exist or is not a file; pass a UTF-8 text file or 'synthetic'.")
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"Data file {path} is not UTF-8 text (byte {exc.start} cannot be decoded); save it as UTF-8."
        ) from None
    return raw


def parse_data(text: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``synthetic[:vocab=..,order=..,language=..,tokens=..]``, ``tokens:PATH[,..]`` or the path of a
    UTF-8 text file."""
    raw = (text or "").strip()
    seq_len, vf = _seq_len(options), _val_fraction(options)
    if not raw:
        raise DataError("The data spec is empty; pass 'synthetic', 'synthetic:vocab=32,order=3' or a text file.")
    if raw.split(":")[0].lower() == "synthetic":
        return _parse_synthetic(raw, options)
    if raw.split(":")[0].lower() == PREFIX:
        return parse_tokens(raw, options, seq_len, vf)
    if "vocab_size" in options and int(options["vocab_size"]) != BYTE_VOCAB:
        raise DataError(f"A text file is read as bytes (vocabulary {BYTE_VOCAB}); drop --vocab-size.")
    path = Path(raw).expanduser().resolve()
    size = len(_read_text(path))
    need = math.ceil((seq_len + 1) / min(vf, 1 - vf)) + 1
    if size < need:
        raise DataError(
            f"Data file {path} has {size} bytes, too few for a training and a validation window of "
            f"{seq_len + 1} bytes; use a file of at least {need} bytes or a smaller --seq-len."
        )
    return {"kind": "text", "path": str(path), "n_bytes": size, "sha256": file_sha256(path)}


def data_info(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """Shape facts for the config, and for the synthetic language its exact entropy facts."""
    seq_len = _seq_len(options)
    if spec.get("kind") == "text":
        return {"vocab_size": BYTE_VOCAB, "seq_len": seq_len}
    if spec.get("kind") == PREFIX:
        return {"vocab_size": int(spec["vocab"]), "seq_len": seq_len}
    v, k = int(spec["vocab"]), int(spec["order"])
    classes = {"classes": int(spec["classes"])} if "classes" in spec else {}
    return {"vocab_size": v, "seq_len": seq_len, "order": k, **classes,
            **language_facts(v, k, int(spec["language"]), seq_len, classes.get("classes"))}


# ----------------------------------------------------------------------------- loading
def _windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Windows of seq_len + 1 tokens at stride seq_len: every token after the first is a target once."""
    import numpy as np
    n = (len(stream) - 1) // seq_len
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    return stream[idx]


def _load_text(spec: Mapping[str, Any], seq_len: int, vf: float, quick: bool,
               budget: bool) -> tuple[tuple[torch.Tensor, torch.Tensor], np.ndarray]:
    """The training windows as views of the file's bytes (int64), and the validation windows."""
    import numpy as np
    import torch
    path = recorded_file(spec)
    stream = np.frombuffer(_read_text(path), dtype=np.uint8).astype(np.int64)
    cut = int(round(len(stream) * (1 - vf)))
    n_train, val = (cut - 1) // seq_len, _windows(stream[cut:], seq_len)
    if budget:  # evenly spaced windows over the whole validation split, the same at every budget
        n_val = min(len(val), max(1, BUDGET_VAL_TOKENS // seq_len))
        val = val[np.linspace(0, len(val) - 1, n_val).round().astype(np.int64)]
    elif quick:  # a data-budget study trains on D whatever --quick says
        n_train = min(n_train, max(1, QUICK_TOKENS // seq_len))
    return windows_view(torch.from_numpy(stream), n_train, seq_len), val


def load_data(spec: Mapping[str, Any], options: Mapping[str, Any]) -> TensorDataset:
    """Windows as (ids (N, seq_len), next ids (N, seq_len)); ``options['seed']`` draws the samples.

    The ``language`` seed fixes the source (and its entropy rate); the study seed only draws which
    stretches of it are seen, so paired seeds resample the same language.
    """
    import numpy as np
    import torch
    seq_len, vf = _seq_len(options), _val_fraction(options)
    quick = bool(options.get("quick", False))
    # A data-budget or IsoFLOP study (its trials train their own D): the fixed, cheap validation set
    budget = DataBudget.of(options) is not None or bool(options.get("isoflop"))
    info = data_info(spec, options)
    if spec.get("kind") == "synthetic":
        v, k, lang = int(spec["vocab"]), int(spec["order"]), int(spec["language"])
        c = int(spec.get("classes", v))
        tokens = min(int(spec["tokens"]), QUICK_TOKENS) if quick and not budget else int(spec["tokens"])
        n_train = max(1, tokens // seq_len)
        n_val = max(1, BUDGET_VAL_TOKENS // seq_len) if budget else max(1, round(n_train * vf / (1 - vf)))
        seed = int(options.get("seed", 0) or 0)
        # Separate streams: adding training tokens never changes the validation set.
        seeds = [np.random.SeedSequence([lang, seed, 1]), np.random.SeedSequence([lang, seed, 0])]
        val, train = (sample_windows(c, k, lang, n, seq_len + 1, s) for n, s in zip((n_val, n_train), seeds, strict=True))
        if c < v:
            val, train = (expand_classes(w, v, c, s) for w, s in zip((val, train), seeds, strict=True))
        named = f",classes={c}" if c < v else ""
        info["source"] = f"synthetic:vocab={v}{named},order={k},language={lang},tokens={n_train * seq_len}"
        tr = torch.from_numpy(np.ascontiguousarray(train))
        x, y = tr[:, :-1], tr[:, 1:]
    elif spec.get("kind") == "text":
        (x, y), val = _load_text(spec, seq_len, vf, quick, budget)
        info["source"] = str(spec["path"])
    elif spec.get("kind") == PREFIX:
        cap = max(1, QUICK_TOKENS // seq_len) if quick and not budget else None
        return load_tokens(spec, seq_len, vf, cap, info)
    else:
        raise DataError(f"Unknown data spec {dict(spec)!r}; pass 'synthetic', a UTF-8 text file or tokens:PATH.")
    va = torch.from_numpy(np.ascontiguousarray(val))
    info.update(n_train=int(y.shape[0]), n_val=int(va.shape[0]), train_tokens=int(y.shape[0]) * seq_len)
    return WindowDataset((x,), y, (va[:, :-1],), va[:, 1:], info, seq_len=seq_len, vocab=int(info["vocab_size"]))


def unigram_loss(data: TensorDataset) -> float:
    """Validation NLL (nats per token) of the training targets' unigram frequencies, add-one smoothed."""
    import torch
    v = int(data.info.get("vocab_size", 0)) or int(max(data.train_target.max(), data.val_target.max())) + 1
    # A token file's baseline counts a sample of its training ids; every other dataset all of them.
    train = data.target_sample() if isinstance(data, WindowDataset) else data.train_target.reshape(-1)
    counts = torch.bincount(train.cpu(), minlength=v).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[data.val_target.reshape(-1).cpu()].mean())
