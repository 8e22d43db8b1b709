"""The trainer on host-held lm data: a 2 GiB token file trains in a worker process of bounded
memory and repeats itself bit for bit; the synthetic language and text files, held on the host and
gathered per batch, train exactly as the same windows held as plain tensors; on CUDA the batches
reach the device as int64 through pinned memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from archhpo.models import TensorDataset, get_family
from archhpo.workers._train import TrainConfig, train

FAM = get_family("lm")
SEQ_LEN = 64
GIB = 1 << 30
RANDOM_BLOCKS = 1024  # 64 KiB blocks of random ids spread over the file: batches differ, disk stays sparse

WORKER = """
import json, resource, sys
import torch
torch.set_num_threads(1)
from archhpo.workers._build import TrialSpec, build_trial
from archhpo.workers._train import train
built = build_trial(TrialSpec(**json.loads(sys.argv[1])), "cpu")
result = train(built.model, built.data, built.family.loss, built.train_config)
print(json.dumps({"history": result.history, "n_train": built.data.n_train, "baseline": built.baseline_loss,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _two_gib_file(tmp: Path) -> Path:
    path = tmp / "train.bin"
    rng = np.random.default_rng(0)
    with path.open("wb") as fh:
        fh.truncate(2 * GIB)
        for i in range(RANDOM_BLOCKS):
            fh.seek(i * (2 * GIB // RANDOM_BLOCKS))
            fh.write(rng.integers(0, 256, 1 << 15, dtype="<u2").tobytes())
    return path


def _trial(path: Path) -> dict:
    options = {"seq_len": SEQ_LEN, "seed": 0}
    spec = FAM.parse_data(f"tokens:{path},vocab=256", options)
    return {"family": "lm", "data": spec, "options": options, "info": FAM.data_info(spec, options),
            "arch": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64},
            "params": {"learning_rate": 1e-3, "epochs": 3, "batch_size": 16, "warmup_steps": 2,
                       "weight_decay": 0.0, "epoch_samples": 128, "eval_every": 1}}


def test_a_two_gib_token_file_trains_in_bounded_memory_and_repeats_bit_for_bit(tmp_path: Path) -> None:
    path = _two_gib_file(tmp_path)
    assert path.stat().st_size == 2 * GIB
    trial = json.dumps(_trial(path))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", WORKER, trial], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["n_train"] == (round(GIB * 0.9) - 1) // SEQ_LEN
    assert first["peak_rss"] < 1.5 * GIB, f"peak RSS {first['peak_rss'] / GIB:.2f} GiB"
    assert [h["epoch"] for h in first["history"]] == [1, 2, 3]
    assert first["history"] == second["history"] and first["baseline"] == second["baseline"]
    assert len({h["train_loss"] for h in first["history"]}) == 3


def _text_options(tmp: Path) -> tuple[str, dict]:
    path = tmp / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox, {i * 7 % 13} times\n" for i in range(400)))
    return str(path), {"seq_len": 16}


@pytest.mark.parametrize("source", ["synthetic", "text"])
def test_host_held_lm_data_train_exactly_as_the_same_windows_held_as_tensors(source: str, tmp_path: Path) -> None:
    text, options = ("synthetic", {"seq_len": 16, "quick": True}) if source == "synthetic" else _text_options(tmp_path)
    data = FAM.load_data(FAM.parse_data(text, options), options)
    plain = TensorDataset(tuple(t.contiguous().clone() for t in data.train_inputs), data.train_target.contiguous().clone(),
                          tuple(t.contiguous().clone() for t in data.val_inputs), data.val_target.contiguous().clone(),
                          dict(data.info))
    cfg = FAM.config_for({"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64}, data.info)
    histories = []
    for d in (data, plain):
        torch.manual_seed(3)
        model = FAM.build(cfg)
        result = train(model, d.to("cpu"), FAM.loss, TrainConfig(learning_rate=1e-3, epochs=2, batch_size=16,
                                                                 warmup_steps=2, epoch_samples=256, seed=5))
        histories.append(result.history)
    assert histories[0] == histories[1]
    assert FAM.baseline_loss(data) == FAM.baseline_loss(plain)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_token_batches_reach_the_gpu_as_int64_through_pinned_memory(tmp_path: Path) -> None:
    path = tmp_path / "ids.bin"
    ids = np.random.default_rng(2).integers(0, 50257, 200_000).astype("<u2")
    ids.tofile(path)
    options = {"seq_len": SEQ_LEN}
    data = FAM.load_data(FAM.parse_data(f"tokens:{path}", options), options)
    cuda, idx = torch.device("cuda"), torch.tensor([0, 7, 100])
    (x,), y = data.train_batch(idx, cuda)
    (cx,), cy = data.train_batch(idx, torch.device("cpu"))
    assert x.device.type == "cuda" and x.dtype == torch.int64
    assert torch.equal(x.cpu(), cx) and torch.equal(y.cpu(), cy)
    assert cx[0].tolist() == ids[:SEQ_LEN].tolist()
    (vx,), vy = data.val_batch(0, 4, cuda)
    assert vx.device.type == "cuda" and torch.equal(vy.cpu(), data.val_target[:4])
