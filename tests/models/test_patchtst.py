"""models/patchtst: docs/design.md §4 structure, exact closed-form count, shapes and `archhpo params`."""

from __future__ import annotations

import json

import pytest
import torch

from archhpo.errors import ConfigError
from archhpo.models import get_family
from archhpo.models.patchtst import PatchTST, PatchTSTConfig, estimate, param_count
from tests.conftest import run_cli

CONFIGS = [
    PatchTSTConfig(64, 2, 2, 128), PatchTSTConfig(64, 48, 8, 256), PatchTSTConfig(128, 3, 4, 512),
    PatchTSTConfig(192, 4, 32, 384), PatchTSTConfig(256, 2, 16, 1024, num_features=1),
    PatchTSTConfig(64, 4, 8, 256, num_features=33, num_classes=3), PatchTSTConfig(384, 6, 8, 768, dropout=0.0),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_param_count_matches_module(cfg: PatchTSTConfig) -> None:
    assert param_count(cfg) == sum(p.numel() for p in PatchTST(cfg).parameters())


def test_spec_example_architecture_count() -> None:
    # d=64, 48 layers, d_ff 256, 8 features: the 2.4M model docs/design.md §10 measures.
    assert param_count(PatchTSTConfig(64, 48, 8, 256)) == 2_405_953
    assert estimate(PatchTSTConfig(64, 48, 8, 256)) == 10 * 8 * 64 + 11 * 64 + 48 * (4 * 64**2 + 2 * 64 * 256 + 4 * 64) + 11 * 64


def test_structure_follows_spec() -> None:
    model = PatchTST(PatchTSTConfig(64, 2, 8, 256))
    assert model.patch_embed.in_features == 10 * 8 and model.patch_embed.bias is not None
    assert tuple(model.pos_embed.shape) == (11, 64)
    layer = model.layers[0]
    assert layer.norm_first and layer.self_attn.batch_first and layer.linear1.out_features == 256
    assert model.head.in_features == 11 * 64 and model.head.out_features == 1


def test_forward_shapes_and_patching() -> None:
    model = PatchTST(PatchTSTConfig(64, 2, 8, 128, num_features=3)).eval()
    assert model(torch.randn(5, 60, 3)).shape == (5,)
    multi = PatchTST(PatchTSTConfig(64, 2, 8, 128, num_features=3, num_classes=4))
    assert multi(torch.randn(5, 60, 3)).shape == (5, 4)


def test_last_patch_sees_the_last_step() -> None:
    torch.manual_seed(0)
    model = PatchTST(PatchTSTConfig(64, 1, 8, 128, num_features=2, dropout=0.0)).eval()
    x = torch.randn(1, 60, 2)
    y = x.clone()
    y[0, -1] += 1.0
    assert not torch.allclose(model(x), model(y))


@pytest.mark.parametrize(("kwargs", "match"), [({"n_heads": 3}, "divide"), ({"d_model": 0}, "positive"),
                                               ({"num_features": 0}, "num_features"), ({"dropout": 1.0}, "dropout")])
def test_invalid_config_is_rejected(kwargs: dict, match: str) -> None:
    base = {"d_model": 64, "n_layers": 2, "n_heads": 8, "d_ff": 128}
    with pytest.raises(ConfigError, match=match):
        PatchTSTConfig(**{**base, **kwargs})


def test_family_baseline_is_base_rate_bce() -> None:
    fam = get_family("patchtst")
    data = fam.load_data(fam.parse_data("synthetic:steps=700", {}), {})
    p = float(data.train_target.mean())
    y = data.val_target
    expected = float(-(y * torch.log(torch.tensor(p)) + (1 - y) * torch.log(torch.tensor(1 - p))).mean())
    assert fam.baseline_loss(data) == pytest.approx(expected, rel=1e-5)


def test_params_cli_prints_the_exact_count() -> None:
    res = run_cli("params", "--d-model", "64", "--n-layers", "48", "--n-heads", "8", "--d-ff", "256",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["param_count"] == 2_405_953 and out["estimate"] < out["param_count"]
    text = run_cli("params", "--d-model", "64", "--n-layers", "4", "--n-heads", "8", "--d-ff", "256",
                   "--num-features", "3").stdout
    assert f"{param_count(PatchTSTConfig(64, 4, 8, 256, num_features=3)):,}" in text
