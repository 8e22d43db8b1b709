"""The contract every model family fulfils, so budgets/, search/ and workers/ stay family-agnostic.

A family is a config dataclass, an ``nn.Module`` built from it, an exact closed-form
parameter count, and the data it trains on.  Everything a worker needs to rebuild the
same model on another machine is plain JSON: the architecture row (d_model, n_layers,
n_heads, d_ff), the data spec and the data ``info`` (shape facts such as the number of
features) stored in the study.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from archhpo.errors import ConfigError

if TYPE_CHECKING:  # only annotations: `archhpo grid`/`params` never import torch (see models/__init__.py)
    import torch
    from torch import nn


@dataclass
class TensorDataset:
    """A whole train/validation split held as tensors; batches are taken by index.

    ``inputs`` are the positional arguments of the model's ``forward``; ``target`` is what
    the family's loss compares the logits with.  ``info`` holds JSON-able facts about the
    data (shape facts for counting parameters, base rates, label statistics).  The trainer
    takes every batch through ``train_batch`` and ``val_batch``: here a gather on the device the
    dataset was moved to; a dataset held on the host (models/data/tokens.py) gathers there.
    """

    train_inputs: tuple[torch.Tensor, ...]
    train_target: torch.Tensor
    val_inputs: tuple[torch.Tensor, ...]
    val_target: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_train(self) -> int:
        return int(self.train_target.shape[0])

    @property
    def n_val(self) -> int:
        return int(self.val_target.shape[0])

    def to(self, device: torch.device | str) -> TensorDataset:
        return TensorDataset(
            tuple(t.to(device) for t in self.train_inputs),
            self.train_target.to(device),
            tuple(t.to(device) for t in self.val_inputs),
            self.val_target.to(device),
            dict(self.info),
        )

    def index_device(self, device: torch.device) -> torch.device:
        """Where the trainer draws a batch's indices: where the data are (`device`, after `to(device)`)."""
        return self.train_target.device

    def train_batch(self, idx: torch.Tensor, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The training samples at `idx` (on `index_device(device)`) as (inputs, target) on `device`
        (a gather there; the copy is a no-op for data already moved to `device`)."""
        return tuple(t[idx].to(device) for t in self.train_inputs), self.train_target[idx].to(device)

    def val_batch(self, start: int, stop: int, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Validation samples start..stop-1 as (inputs, target) on `device`."""
        return tuple(t[start:stop].to(device) for t in self.val_inputs), self.val_target[start:stop].to(device)

    def device_bytes(self, device: torch.device | str) -> int:
        """Bytes this dataset holds on `device` once `to(device)` has moved it: what the memory plan
        adds to a trial's own (none on the CPU, whose memory the plan does not budget)."""
        if (device if isinstance(device, str) else device.type).split(":")[0] == "cpu":
            return 0
        tensors = (*self.train_inputs, self.train_target, *self.val_inputs, self.val_target)
        return sum(int(t.numel()) * t.element_size() for t in tensors)


@functools.cache
def _resolve(module: str, name: str) -> Callable[..., Any]:
    """Imported once: a family's loss is called every training step."""
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Lazy:
    """A function or class of ``module``, imported on its first call.

    A family's torch parts (its ``nn.Module``, loss, metrics, data loader) are given to
    ``Family`` as ``Lazy("archhpo.models.patchtst", "PatchTST")``, so that building the record
    (and counting parameters, the command line's ``grid``/``params``) never imports torch.
    """

    module: str
    name: str

    def resolve(self) -> Callable[..., Any]:
        return _resolve(self.module, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class FlagSpec:
    """A family-specific command-line flag of ``archhpo params``/``grid`` (e.g. --num-features)."""

    name: str  # config/info key, e.g. "num_features"; the flag is --num-features
    type: Callable[[str], Any]
    default: Any
    help: str


def per_sample(kind: str | None) -> str:
    """``Family.loss_per`` of a family whose loss is a mean over samples, whatever its data."""
    return "sample"


@dataclass(frozen=True)
class Family:
    """Everything archhpo needs to count, build, feed and score one model family.

    - ``config_for(arch, info)``: a grid row ({d_model, n_layers, n_heads, d_ff}) and the data's
      ``info`` as the family's config dataclass (validated in __post_init__); ``param_count(config)``
      is closed form and equals ``sum(p.numel())`` of ``build(config)``; ``flops_per_sample(config)``
      is one training sample's forward+backward FLOPs, counted as FlopCounterMode counts them.
    - ``parse_data(text, options)``: ``--data`` as a JSON-able spec (DataError, one sentence, on bad
      input); ``data_info(spec, options)``: the shape facts ``config_for`` needs, cheaply;
      ``load_data(spec, options)``: the TensorDataset (``options``: the study's task settings).
    - ``loss`` (training and validation, a mean over the batch), ``baseline_loss`` (a trivial
      predictor's), ``metrics`` (extra validation metrics); ``flags`` (``params``/``grid``'s shape
      flags), ``estimate`` (a legacy formula shown beside the count), ``train_defaults`` (`archhpo
      train`'s); the fields below say what the other layers ask, so none tells families by name.

    A built module's ``extra_loss()`` (a penalty) joins the training loss, never the validation loss."""

    name: str
    config_cls: type
    build: Callable[[Any], nn.Module]
    param_count: Callable[[Any], int]
    config_for: Callable[[Mapping[str, int], Mapping[str, Any]], Any]
    parse_data: Callable[[str, Mapping[str, Any]], dict[str, Any]]
    data_info: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]
    load_data: Callable[[Mapping[str, Any], Mapping[str, Any]], TensorDataset]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    baseline_loss: Callable[[TensorDataset], float]
    metrics: Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
    flags: tuple[FlagSpec, ...] = ()
    estimate: Callable[[Any], int] | None = None
    description: str = ""
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    tokens: Callable[[Any], int] | None = None  # sequence length seen by attention (memory estimate)
    # independent attention sequences per sample (ci: one per channel), each of tokens/sequences
    sequences: Callable[[Any], int] | None = None
    flops_per_sample: Callable[[Any], int] | None = None
    """Forward+backward FLOPs of one training sample (FlopCounterMode's count); every family sets it."""
    data_unit: str = "samples"
    """What a study's data budget counts (``--tokens-per-param`` or ``--samples-per-param``): "tokens"
    for families that read a sequence of tokens per sample (``tokens(config)`` of them), else "samples"."""

    data_help: str = ""
    """The forms ``--data`` accepts, as ``--family NAME --help`` prints them (what ``parse_data``
    reads); empty: the generic help."""
    task_options: tuple[str, ...] = ()
    """The study's task options (the command line's TASK_OPTIONS: "horizon", "threshold") that this
    family's data labelling reads; its help lists only these, though every one is accepted."""
    logits_per_sample: Callable[[Any], int] | None = None
    """Logits one sample's head writes, when they are a sequence's (lm: seq_len x vocab_size): the
    memory plan adds them to the layers' estimate, which leaves a (B, L, V) head out.  None for a
    head per sample (a class or a value), which the estimate already covers."""
    loss_per: Callable[[str | None], str] = per_sample
    """What one loss value is a mean over ("sample", "token", "byte", ...: the report prints
    "nats per" it), given the studies' data kind (a data spec's ``kind``; None when it is unknown or
    the studies' kinds differ)."""

    def units_per_sample(self, config: Any) -> int:
        """Data units (tokens or samples, see ``data_unit``) in one training sample."""
        if self.data_unit == "tokens" and self.tokens is not None:
            return int(self.tokens(config))
        return 1


def check_arch(d_model: int, n_layers: int, n_heads: int, d_ff: int) -> None:
    """Shared validation of the four search dimensions (called from configs' __post_init__)."""
    for name, value in (("d_model", d_model), ("n_layers", n_layers), ("n_heads", n_heads), ("d_ff", d_ff)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
    if d_model % n_heads:
        raise ConfigError(f"n_heads ({n_heads}) must divide d_model ({d_model}); pick another head count.")
