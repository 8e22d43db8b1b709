"""One suite per family contract, run over every registered family (`family_names()`).

A new family registered in archhpo/models/__init__.py gets every test here without writing one:
- count = numel: the closed-form ``param_count`` equals ``sum(p.numel())`` of the built module,
  for small rows on the CPU and for a 2B-parameter row built on the meta device;
- FLOPs: ``flops_per_sample`` = FlopCounterMode's count(B=2) - count(B=1) on the family's own
  quick synthetic data;
- config validation: every family refuses a head count that does not divide d_model and a
  non-positive dimension with one ConfigError sentence;
- data: the quick synthetic data loads deterministically (same spec, same tensors) with the
  shapes ``data_info`` promised to ``config_for``;
- what code outside models/ asks of a family (tests/test_family_names.py): its --data help names a
  form its parse_data reads, its task options are exactly those that change its data, a head with
  a sequence axis counts its logits (``logits_per_sample``, the memory plan's) and nothing else
  does, and its loss has a unit on every data kind.
A family's own behaviour (variants, masks, encoders) is tested in its own file.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from archhpo.errors import ConfigError
from archhpo.models import Family, TensorDataset, count_flops, family_names, get_family

FAMILIES = family_names()
SMALL_ROWS = (
    {"d_model": 8, "n_layers": 1, "n_heads": 1, "d_ff": 16},
    {"d_model": 16, "n_layers": 2, "n_heads": 4, "d_ff": 24},
    {"d_model": 24, "n_layers": 3, "n_heads": 2, "d_ff": 64},
)
LARGE_ROW = {"d_model": 2048, "n_layers": 48, "n_heads": 32, "d_ff": 8192}  # > 2B parameters
QUICK = {"quick": True, "seed": 0}


def _info(family: Family) -> Mapping[str, Any]:
    return family.data_info(family.parse_data("synthetic", QUICK), QUICK)


@functools.cache
def _data(name: str) -> TensorDataset:
    family = get_family(name)
    return family.load_data(family.parse_data("synthetic", QUICK), QUICK)


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("row", SMALL_ROWS, ids=lambda r: "-".join(map(str, r.values())))
@pytest.mark.parametrize("name", FAMILIES)
def test_param_count_equals_numel(name: str, row: dict[str, int]) -> None:
    family = get_family(name)
    cfg = family.config_for(row, _info(family))
    assert family.param_count(cfg) == _numel(family.build(cfg))


@pytest.mark.parametrize("name", FAMILIES)
def test_param_count_of_a_2b_row_built_on_the_meta_device(name: str) -> None:
    family = get_family(name)
    cfg = family.config_for(LARGE_ROW, _info(family))
    with torch.device("meta"):
        model = family.build(cfg)
    assert family.param_count(cfg) == _numel(model) > 2_000_000_000


@pytest.mark.parametrize("row", SMALL_ROWS[:2], ids=lambda r: "-".join(map(str, r.values())))
@pytest.mark.parametrize("name", FAMILIES)
def test_flops_per_sample_equals_flop_counter_mode(name: str, row: dict[str, int]) -> None:
    family = get_family(name)
    assert family.flops_per_sample is not None, f"{name} must set Family.flops_per_sample"
    data = _data(name)
    cfg = family.config_for(row, {**data.info})
    torch.manual_seed(0)
    model = family.build(cfg)

    def count(b: int) -> int:
        return count_flops(model, tuple(t[:b] for t in data.train_inputs), family.loss, data.train_target[:b])

    assert count(2) - count(1) == family.flops_per_sample(cfg)


@pytest.mark.parametrize(("change", "needle"), [
    ({"n_heads": 3}, "divide"),
    ({"d_model": 0}, "positive"),
    ({"n_layers": -1}, "positive"),
    ({"d_ff": 0}, "positive"),
])
@pytest.mark.parametrize("name", FAMILIES)
def test_config_refuses_a_bad_architecture(name: str, change: dict[str, int], needle: str) -> None:
    family = get_family(name)
    with pytest.raises(ConfigError, match=needle):
        family.config_for({**SMALL_ROWS[1], **change}, _info(family))


@pytest.mark.parametrize("name", FAMILIES)
def test_quick_synthetic_data_is_deterministic_and_fits_the_config(name: str) -> None:
    family = get_family(name)
    first = _data(name)
    again = family.load_data(family.parse_data("synthetic", QUICK), QUICK)
    for a, b in zip((*first.train_inputs, first.train_target, *first.val_inputs, first.val_target),
                    (*again.train_inputs, again.train_target, *again.val_inputs, again.val_target), strict=True):
        assert torch.equal(a, b)
    assert first.n_train > 0 and first.n_val > 0
    assert dict(_info(family)).items() <= first.info.items()  # what data_info promised, loaded
    cfg = family.config_for(SMALL_ROWS[0], first.info)
    model = family.build(cfg).eval()
    with torch.no_grad():
        loss = family.loss(model(*(t[:4] for t in first.val_inputs)), first.val_target[:4])
    assert torch.isfinite(loss)
    assert family.baseline_loss(first) > 0


@pytest.mark.parametrize("name", FAMILIES)
def test_the_data_help_names_a_form_the_family_reads(name: str) -> None:
    from archhpo.cli._options import TASK_OPTIONS

    family = get_family(name)
    assert family.data_help, f"{name} must set Family.data_help (its --data forms, for --help)"
    first = family.data_help.split("[")[0].split()[0]  # "synthetic", "multisignal": the first form
    assert family.parse_data(first, QUICK)["kind"]
    assert set(family.task_options) <= set(TASK_OPTIONS)


@pytest.mark.parametrize(("option", "value"), [("horizon", 3), ("threshold", 0.005)])
@pytest.mark.parametrize("name", FAMILIES)
def test_the_task_options_a_family_lists_are_those_its_data_reads(name: str, option: str, value: float) -> None:
    family = get_family(name)
    first = _data(name)
    options = {**QUICK, option: value}
    again = family.load_data(family.parse_data("synthetic", options), options)
    tensors = [(a, b) for a, b in zip((*first.train_inputs, first.train_target, *first.val_inputs, first.val_target),
                                      (*again.train_inputs, again.train_target, *again.val_inputs, again.val_target),
                                      strict=True)]
    same = all(a.shape == b.shape and torch.equal(a, b) for a, b in tensors)
    assert same != (option in family.task_options), (name, option, family.task_options)


@pytest.mark.parametrize("row", SMALL_ROWS[:2], ids=lambda r: "-".join(map(str, r.values())))
@pytest.mark.parametrize("name", FAMILIES)
def test_logits_per_sample_counts_a_sequence_head(name: str, row: dict[str, int]) -> None:
    """A head with a sequence axis ((B, T, K): a next-token or per-step head) writes logits the
    layers' memory estimate leaves out, so the family counts them; a class or value per sample
    ((B,) or (B, K)) does not."""
    family = get_family(name)
    data = _data(name)
    cfg = family.config_for(row, data.info)
    model = family.build(cfg).eval()
    with torch.no_grad():
        logits = model(*(t[:2] for t in data.val_inputs))
    if logits.dim() > 2:
        assert family.logits_per_sample is not None, f"{name} must set Family.logits_per_sample"
        assert family.logits_per_sample(cfg) == logits.numel() // 2 > 0
    else:
        assert family.logits_per_sample is None, (name, tuple(logits.shape))


@pytest.mark.parametrize("name", FAMILIES)
def test_the_loss_has_a_unit_on_every_data_kind(name: str) -> None:
    family = get_family(name)
    kind = family.parse_data("synthetic", QUICK)["kind"]
    for k in (kind, "text", None):
        unit = family.loss_per(k)
        assert unit and unit == unit.strip() and not unit.startswith("per"), (name, k, unit)


@pytest.mark.parametrize(("row", "seq_len"), [("124M", 1024), ("124M", 2048), ("200M", 1024), ("2B", 1024)])
def test_lm_gpu_rows_count_and_flops_on_the_meta_device(row: str, seq_len: int) -> None:
    """The lm family's GPU-scale rows (GPT-2's vocabulary, context 1024 and 2048): the
    closed-form count and FLOPs (attention included) equal the built module's numel and
    FlopCounterMode's count, on the meta device (nothing is allocated or computed)."""
    from archhpo.models.lm_spec import gpu_config

    family = get_family("lm")
    cfg = gpu_config(row, seq_len)
    with torch.device("meta"):
        model = family.build(cfg)
        ids = torch.zeros(2, seq_len, dtype=torch.long)

    def count(b: int) -> int:
        return count_flops(model, ids[:b], family.loss, ids[:b])

    assert family.param_count(cfg) == _numel(model)
    assert count(2) - count(1) == family.flops_per_sample(cfg)
