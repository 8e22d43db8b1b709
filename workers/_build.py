"""One way to build a trial: the only place a planned trial becomes (model, data, TrainConfig, seeds).

The worker loop and `archhpo train` (flags or ``--from X_best.json``) both call ``build_trial``,
so a best JSON replays its trial exactly: same data, same family training defaults, same seeds,
same TrainConfig.  ``TrialSpec`` is plain JSON (what a study, a claim or a best JSON holds).

Seeds (``trial_seeds``): an ordinary trial trains the study's data with init seed
``trial_seed(study_seed, slot)`` and batch-order seed ``slot``; a seeded trial of a paired study
lets ``seed`` drive its data, init and batch order, the same whatever the configuration (a paired
comparison); a confirmation trial keeps the study's data and lets ``seed`` drive init and batch
order.  ``--data-seed`` fixes the data for every trial, so seeds vary only the initialisation.
Replicate seeds are kept apart from slot seeds (``REPLICATE_BASE + seed``): confirmation seed 2
must not repeat plan slot 2's run.  Each case in full: docs/design.md §6.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from archhpo.config import StoredOptions
from archhpo.errors import ConfigError
from archhpo.models import Family, TensorDataset, get_family
from archhpo.schema import TRAINING_PARAMS, Attr, DataBudget
from archhpo.workers._device import compile_by_default, compile_model
from archhpo.workers._train import TrainConfig, trial_seed

# The planned training parameters (the search space's keys): they always win over a family's
# train_defaults, which fill in the rest of TrainConfig (min_lr_ratio, eval_every, grad_clip, ...).
PLANNED_KEYS = TRAINING_PARAMS
REPLICATE_BASE = 1_000_000  # above any plan slot: replicate seeds never coincide with slot seeds
DATA_CACHE_SIZE = 2  # datasets a worker keeps loaded (on its device) across trials (paired plans are seed-major)


@dataclass(frozen=True)
class Seeds:
    data: int  # data generation and train/validation split
    init: int  # torch.manual_seed right before the model is built (weights; dropout after)
    batches: int  # the trainer's batch-order generator (TrainConfig.seed)


def trial_seeds(study_seed: int, slot: int, seed: int | None = None, paired: bool = False,
                data_seed: int | None = None) -> Seeds:
    """The seeds of one trial (see the module docstring)."""
    study_seed = int(study_seed)
    if seed is None:
        data = study_seed if data_seed is None else int(data_seed)
        return Seeds(data=data, init=trial_seed(study_seed, int(slot)), batches=int(slot))
    s = int(seed)
    data = int(data_seed) if data_seed is not None else s if paired else study_seed
    return Seeds(data=data, init=REPLICATE_BASE + s, batches=REPLICATE_BASE + s)


@dataclass
class TrialSpec:
    """Everything that defines one trial, as plain JSON."""

    family: str
    data: dict[str, Any]  # the data spec (a file's spec carries its sha256: it is checked on load)
    options: dict[str, Any]  # the study's options as stored (the family's loaders read them; typed: `study_options`)
    info: dict[str, Any]  # data shape facts for config_for
    arch: dict[str, Any]  # d_model, n_layers, n_heads, d_ff (+ the grid row's other keys, "choices")
    params: dict[str, Any]  # the planned training parameters (+ optional other TrainConfig keys)
    slot: int = 0
    seed: int | None = None

    @property
    def choices(self) -> dict[str, Any]:
        return dict(self.arch.get("choices") or {})

    @property
    def study_options(self) -> StoredOptions:
        """`options`, typed (archhpo.config.StoredOptions)."""
        return StoredOptions.from_dict(self.options)

    @property
    def paired(self) -> bool:
        return int(self.study_options.paired_seeds or 0) > 0

    @property
    def data_seed(self) -> int | None:
        value = self.study_options.data_seed
        return None if value is None else int(value)

    def seeds(self) -> Seeds:
        return trial_seeds(int(self.study_options.seed or 0), self.slot, self.seed, self.paired, self.data_seed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialSpec:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    # ------------------------------------------------------------------ derived, pure
    def data_spec_and_options(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The data spec and options the data is loaded with (a paired seed replaces the data seed,
        unless the study fixed it with --data-seed)."""
        spec, options = dict(self.data), dict(self.options)
        if self.data_seed is not None or (self.seed is not None and self.paired):
            s = self.seeds().data
            if "seed" in spec:
                spec["seed"] = s
            options["seed"] = s
        return spec, options

    @property
    def parametrization(self) -> str:
        """"sp" or "mup" (docs/mup.md): the study's (or `train`'s) option; a trial without it is sp."""
        return str(self.options.get("parametrization") or "sp")

    @property
    def mup_base_width(self) -> int | None:
        """µP's base d_model as stored (the study's smallest budget's, or --mup-base-width)."""
        value = self.options.get("mup_base_width")
        return None if value is None else int(value)

    @property
    def mup_base_depth(self) -> int | None:
        """CompleteP's base n_layers as stored (--mup-base-depth); None: µP scales width only."""
        value = self.options.get("mup_base_depth")
        return None if value is None else int(value)

    def model_info(self) -> dict[str, Any]:
        """settings.info with the row's categorical choices merged over it (e.g. encoder), and the
        parametrization under µP: a family whose config has no µP refuses it here, before any data."""
        info = {**self.info, **self.choices}
        if self.parametrization == "sp":
            return info  # nothing added: a standard trial's config is what it always was
        fam = get_family(self.family)
        if "parametrization" not in getattr(fam.config_cls, "__dataclass_fields__", {}):
            raise ConfigError(f"The {fam.name} family has no µP (only lm has: docs/mup.md); "
                              "drop --parametrization mup or train an lm.")
        if self.mup_base_width is None:  # m = 1 at every width would be sp under another name
            raise ConfigError("A µP trial needs its base width and this one stores none; pass "
                              "--mup-base-width D (a study stores its smallest budget's d_model).")
        out = {**info, "parametrization": self.parametrization, "mup_base_width": self.mup_base_width}
        return out if self.mup_base_depth is None else {**out, "mup_base_depth": self.mup_base_depth}

    @property
    def data_budget(self) -> DataBudget | None:
        return self.study_options.budget

    def train_config(self, fam: Family | None = None) -> TrainConfig:
        """The family's train_defaults, then the planned parameters over them; batch order seeded.
        In a data-budget study each epoch is an interval of D/epochs (DataBudget)."""
        fam = fam or get_family(self.family)
        known = set(TrainConfig.__dataclass_fields__) - {"seed"}
        merged = {**dict(fam.train_defaults), **self.params}
        values = {k: v for k, v in merged.items() if k in known}
        for key in PLANNED_KEYS:  # the plan's values, with the plan's types
            if key in self.params:
                values[key] = (int if key in ("epochs", "batch_size", "warmup_steps") else float)(self.params[key])
        options = self.study_options  # the schedule is a study option (every trial's), not a plan one
        if options.schedule is not None:
            values["schedule"] = options.schedule
        if options.cooldown is not None:
            values["cooldown"] = options.cooldown
        budget = self.data_budget
        if budget is not None:
            units = fam.units_per_sample(fam.config_for(self.arch, self.model_info()))
            values["epoch_samples"] = budget.samples_per_interval(units, int(values.get("epochs", 1)))
        planned = options.planned_samples(self.arch)  # an IsoFLOP study: this architecture's own samples
        if planned is not None:
            values["epoch_samples"] = max(1, -(-planned // int(values.get("epochs", 1))))
        return TrainConfig(**values, seed=self.seeds().batches)


@dataclass
class BuiltTrial:
    model: nn.Module
    data: TensorDataset  # on the device, or held on the host and gathered per batch (an lm's: tokens.WindowDataset)
    train_config: TrainConfig
    seeds: Seeds
    config: Any  # the family's config dataclass
    family: Family
    baseline_loss: float
    flops_per_sample: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    data_budget: DataBudget | None = None
    compile_s: float | None = None  # compiled on CUDA: the compile's seconds, apart from the steps

    @property
    def epoch_samples(self) -> int:
        """Samples one epoch (a data-budget study: one validation interval) trains on."""
        return self.train_config.samples_per_epoch(self.data.n_train)

    def data_attrs(self, path_samples: int) -> dict[str, Any]:
        """What a trial that trained `path_samples` samples since its start records of its data: the
        tokens (token families) or samples, the passes over the training set, the study's ratio."""
        units = self.family.units_per_sample(self.config)
        out: dict[str, Any] = {Attr.TRAIN_SAMPLES: int(path_samples),
                               Attr.DATA_PASSES: round(path_samples / max(1, self.data.n_train), 4)}
        if self.family.data_unit == "tokens":
            out[Attr.TRAIN_TOKENS] = int(path_samples) * units
        if self.data_budget is not None:
            key = Attr.TOKENS_PER_PARAM if self.data_budget.unit == "tokens" else Attr.SAMPLES_PER_PARAM
            out[key] = self.data_budget.per_param
        return out


class DataCache:
    """Datasets loaded for earlier trials (moved with `to(device)`: an lm's stay on the host), keyed by
    what defines them."""

    def __init__(self, size: int = DATA_CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[TensorDataset, float]] = OrderedDict()

    def get(self, fam: Family, spec: dict[str, Any], options: dict[str, Any],
            device: torch.device) -> tuple[TensorDataset, float]:
        key = repr((fam.name, spec, sorted(options.items()), str(device)))
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        # The file loaders compare the file's sha256 with the spec's: a copy that differs is refused.
        data = fam.load_data(spec, options)
        item = (data.to(device), fam.baseline_loss(data))
        self._items[key] = item
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return item

    def clear(self) -> None:
        self._items.clear()


def build_trial(
    spec: TrialSpec,
    device: torch.device | str,
    *,
    data_cache: DataCache | None = None,
    before_build: Callable[[Any, TrainConfig, TensorDataset], None] | None = None,
) -> BuiltTrial:
    """Load the data (sha256-checked), make the config and TrainConfig, seed, build the model.

    ``before_build(config, train_config, data)`` runs after everything cheap is known and before
    the model is allocated (the worker's memory check refuses a trial that cannot fit there).
    """
    device = torch.device(device)
    fam = get_family(spec.family)
    seeds = spec.seeds()
    cfg = fam.config_for(spec.arch, spec.model_info())
    tcfg = spec.train_config(fam)
    data_spec, data_options = spec.data_spec_and_options()
    cache = data_cache if data_cache is not None else DataCache(1)
    data, baseline = cache.get(fam, data_spec, data_options, device)
    if before_build is not None:
        before_build(cfg, tcfg, data)
    torch.manual_seed(seeds.init)  # right before building: the weights depend on nothing else
    model = fam.build(cfg).to(device)
    compile_s = None
    if compile_by_default(device.type, bool(spec.study_options.compile), tcfg.steps_per_epoch(data.n_train)
                          * int(tcfg.epochs)):  # asked, or on CUDA by default where it wins
        compile_s = compile_model(model, device, _warm_loss(fam, data, tcfg, device))
    return BuiltTrial(
        model=model, data=data, train_config=tcfg, seeds=seeds, config=cfg, family=fam, baseline_loss=baseline,
        flops_per_sample=int(fam.flops_per_sample(cfg)) if fam.flops_per_sample is not None else None,
        data_budget=spec.data_budget, compile_s=compile_s,
    )


def _warm_loss(fam: Family, data: TensorDataset, tcfg: TrainConfig,
               device: torch.device) -> Callable[[nn.Module], torch.Tensor]:
    """One training micro-batch's loss, as the trainer's step computes it (bf16 autocast on CUDA):
    what `compile_model` compiles the model on before the trial's steps are timed."""
    n = min(int(tcfg.micro_batch or tcfg.batch_size), data.n_train)

    def loss(model: nn.Module) -> torch.Tensor:
        inputs, target = data.train_batch(torch.arange(n, device=data.index_device(device)), device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            return fam.loss(model(*inputs), target)

    return loss
