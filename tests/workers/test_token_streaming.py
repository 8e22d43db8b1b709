"""The trainer on host-held lm data: a 2 GiB token file trains in a worker process of bounded
memory and repeats itself bit for bit; the synthetic language and text files, held on the host and
gathered per batch, train exactly as the same windows held as plain tensors; a batch meeting an id
at or above the vocabulary fails its trial in one sentence; on CUDA the batches reach the device as
int64 through pinned memory."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from optuna.trial import TrialState

from archhpo.models import TensorDataset, get_family
from archhpo.models.data import tokens as tk
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import Worker
from archhpo.workers._train import TrainConfig, train

FAM = get_family("lm")
SEQ_LEN = 64
GIB = 1 << 30
RANDOM_BLOCKS = 1024  # 64 KiB blocks of random ids spread over the file: batches differ, disk stays sparse

WORKER = """
import json, sys
import torch
torch.set_num_threads(1)
from archhpo.workers._build import TrialSpec, build_trial
from archhpo.workers._train import train
built = build_trial(TrialSpec(**json.loads(sys.argv[1])), "cpu")
result = train(built.model, built.data, built.family.loss, built.train_config)
print(json.dumps({"history": result.history, "n_train": built.data.n_train, "baseline": built.baseline_loss,
                  "peak_rss": peak_rss()}))
"""
# The worker's own peak: VmHWM, the high-water mark of this process's memory since its exec. Not
# getrusage's ru_maxrss, which Linux carries over from the parent across fork and exec, so it reported
# the pytest worker's own size (1.57 GiB late in a CI run) rather than the trial's.
PEAK_RSS = """
def peak_rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
"""
WORKER = PEAK_RSS + WORKER


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


def _scattered_bad_ids(tmp: Path, n: int, vocab: int, every: int) -> Path:
    """A uint16 token file of `n` ids below `vocab`, but for the id `vocab` at every `every`-th position
    outside the blocks read at launch and by the unigram baseline: only a training batch meets one."""
    ids = (np.arange(n) % vocab).astype("<u2")
    bad = np.zeros(n, dtype=bool)
    bad[::every] = True
    read = [*tk.sample_spans(0, n), *tk.sample_spans(1, n - (n - 1) % 16)]
    for a, b in read:
        bad[max(0, a - 32):b + 32] = False
    ids[bad] = vocab
    path = tmp / "train.bin"
    ids.tofile(path)
    return path


def test_a_worker_fails_the_trial_whose_batch_meets_an_id_at_or_above_vocab(sqlite_url: str, tmp_path: Path) -> None:
    n = 4 * tk.SAMPLE_BLOCKS * tk.SAMPLE_TOKENS
    path = _scattered_bad_ids(tmp_path, n, 256, 97)
    val = tmp_path / "val.bin"
    (np.arange(5000) % 256).astype("<u2").tofile(val)
    # A data-budget study trains on the whole file (--quick would keep its first 300,000 ids, all of
    # which the unigram baseline reads at load): the bad ids are left for the batches to meet.
    s = prepare_settings("badids", "150K", family="lm", n_trials=2, data=f"tokens:{path},vocab=256,val={val}",
                         quick=True, pruner="none", family_options={"seq_len": 16}, tokens_per_param=1.0)
    launch(sqlite_url, dataclasses.replace(s, plan=s.plan[:1]))
    q = TrialQueue(sqlite_url, s.study_name)
    summary = Worker([q], device="cpu", threads=1).run()
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert summary.failed == 1 and trial.state == TrialState.FAIL
    reason = trial.user_attrs["fail_reason"]
    assert f"Token file {path} holds id 256 at token " in reason and "(in a training batch), not below vocab=256" in reason
