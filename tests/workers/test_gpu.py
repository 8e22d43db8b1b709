"""The GPU path: device attributes and MFU, GPU placement on Ray, PyTorch-only hosts.

Everything that can be checked without a GPU runs here on CPU: the peak table and the MFU
arithmetic, the placement decision, Ray's placement of the chosen shares on *logical* GPUs
(ray.init(num_gpus=N) on a CPU machine), `run` with logical GPUs, and the plain worker, `train`
and the GPU benchmark on a host where Ray and psycopg2 cannot be imported.  Tests that need CUDA
are marked `gpu` and skip with the reason on CPU.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from archhpo.cluster._run import (
    CUDA_CONTEXT_BYTES,
    MAX_TRIALS_PER_GPU,
    choose_placement,
    largest_trial_bytes,
    task_options,
)
from archhpo.errors import ArchhpoError
from archhpo.workers import _device
from archhpo.workers._device import (
    dense_bf16_peak_flops,
    device_attrs,
    mfu,
    peak_memory_attrs,
    reset_peak_memory,
)
from tests.conftest import REPO, TINY_DATA

GiB = 2**30
CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible")


# ------------------------------------------------------------------------------ peak table and MFU
@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989.4),  # SXM
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.4),
    ("NVIDIA H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA L4", 121.0),
    ("NVIDIA L40S", 362.05),
    ("NVIDIA L40", 181.05),
    ("NVIDIA A10", 125.0),
    ("NVIDIA GeForce RTX 4090", 165.2),
    ("NVIDIA B200", 2250.0),
])
def test_dense_bf16_peak_of_known_gpus(name: str, tflops: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_device.PEAK_ENV, raising=False)
    assert dense_bf16_peak_flops(name) == pytest.approx(tflops * 1e12)


def test_unknown_gpus_have_no_peak_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_device.PEAK_ENV, raising=False)
    for name in ("Tesla V100-SXM2-16GB", "Tesla T4", "NVIDIA A10G", "Some Future GPU", ""):
        assert dense_bf16_peak_flops(name) is None, name  # no bf16 tensor cores, or no datasheet figure
    assert mfu(1e15, 1.0, "NVIDIA A10G") is None
    monkeypatch.setenv(_device.PEAK_ENV, "70e12")
    assert dense_bf16_peak_flops("NVIDIA A10G") == 70e12
    assert mfu(35e12 * 4, 4.0, "NVIDIA A10G") == pytest.approx(0.5)
    monkeypatch.setenv(_device.PEAK_ENV, "not a number")
    assert dense_bf16_peak_flops("NVIDIA A10G") is None


def test_mfu_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_device.PEAK_ENV, raising=False)
    # 2.4M-param PatchTST: ~1.6e8 training FLOPs a sample; 300k samples/s on an H100 SXM
    fps, sps, secs = 160_000_000, 300_000.0, 12.5
    got = mfu(fps * sps * secs, secs, "NVIDIA H100 80GB HBM3")
    assert got == pytest.approx(fps * sps / 989.4e12)
    assert mfu(989.4e12 * 10, 10.0, "NVIDIA H100 80GB HBM3") == pytest.approx(1.0)
    assert mfu(1e12, 0.0, "NVIDIA H100 80GB HBM3") is None  # no time, no rate
    assert mfu(-1.0, 1.0, "NVIDIA H100 80GB HBM3") is None
    assert mfu(1e12, 1.0, CPU) is None  # a CPU has no bf16 tensor-core peak to compare with


def test_cpu_records_no_gpu_attributes() -> None:
    assert device_attrs(CPU) == {} and peak_memory_attrs(CPU) == {}
    reset_peak_memory(CPU)
    _device.release_memory(CPU)
    before = torch.get_float32_matmul_precision()
    _device.configure_cuda_speed()  # a no-op without CUDA
    assert torch.get_float32_matmul_precision() == before


def test_a_tiny_models_mfu_keeps_its_significant_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 200K-parameter trial on an H100 reaches an MFU of ~1e-5: rounded to 4 decimals it was
    # recorded as 0.0 (seen on a real H100), which reads as "no work done".
    from archhpo.workers._loop import Worker

    monkeypatch.setattr(_device, "mfu", lambda *a, **k: 1.23456e-5)
    fake = types.SimpleNamespace(device=torch.device("cuda", 0), _gpu_share=lambda: 1.0)
    built = types.SimpleNamespace(flops_per_sample=1000, data_attrs=lambda path: {"train_samples": path})
    out = Worker._throughput(fake, built, samples=640, seconds=2.0, path=640, wall_s=4.0)  # type: ignore[arg-type]
    assert out == {"train_samples": 640, "samples_per_s": 320.0, "train_flops": 640_000, "mfu": 1.23e-5,
                   "step_mfu": 1.23e-5, "trial_mfu": 1.23e-5}  # issue 33: the step's and the wall clock's


def test_cuda_attributes_name_index_and_ray_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_index is the GPU as nvidia-smi numbers it (through CUDA_VISIBLE_DEVICES); Ray's ids are
    read only when Ray is already imported and initialised."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: f"NVIDIA H100 80GB HBM3 #{i}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setitem(sys.modules, "ray", None)  # as on a host without Ray
    assert device_attrs(torch.device("cuda", 1)) == {"gpu_name": "NVIDIA H100 80GB HBM3 #1", "gpu_index": 6}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c2d")  # UUIDs: the logical index is all we know
    assert device_attrs(torch.device("cuda", 0))["gpu_index"] == 0

    ctx = types.SimpleNamespace(get_accelerator_ids=lambda: {"GPU": ["6"], "neuron_cores": []})
    fake = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: ctx)
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert device_attrs(torch.device("cuda", 0))["ray_gpu_ids"] == ["6"]
    fake.is_initialized = lambda: False  # imported but not started: not a Ray task
    assert "ray_gpu_ids" not in device_attrs(torch.device("cuda", 0))


# ------------------------------------------------------------------------------ placement decision
def share(requested, device, gpus, workers, need, mem):  # type: ignore[no-untyped-def]
    p = choose_placement(requested, device, gpus, workers, need, mem)
    return p.share, p.device


def test_placement_packs_by_memory_and_spreads_over_every_gpu() -> None:
    small = 1 * GiB  # a 2M-20M trial
    # 8 x 80 GiB: small trials pack, but no more to a GPU than the workers need to cover them all
    assert share(None, "auto", 8, 8, small, 80 * GiB) == (1.0, "auto")  # one worker per GPU
    assert share(None, "auto", 8, 16, small, 80 * GiB) == (0.5, "auto")
    assert share(None, "auto", 8, 32, small, 80 * GiB) == (0.25, "auto")
    assert share(None, "auto", 8, 1000, small, 80 * GiB) == (1 / MAX_TRIALS_PER_GPU, "auto")  # capped
    assert share("auto", "auto", 8, 3, small, 80 * GiB) == (1.0, "auto")  # fewer workers than GPUs
    assert share(None, "cuda", 4, 12, small, 80 * GiB) == (pytest.approx(1 / 3, abs=1e-4), "cuda")
    s3, _ = share(None, "auto", 4, 12, small, 80 * GiB)
    assert 3 * s3 <= 1.0 and s3 == 0.3333  # Ray keeps 4 decimals: three shares fit one GPU
    # memory decides when the workers would pack tighter than the trials fit
    need = 20 * GiB  # 0.85 * 80 GiB holds 3 of (20 GiB + a CUDA context)
    assert int(0.85 * 80 * GiB // (need + CUDA_CONTEXT_BYTES)) == 3
    assert share(None, "auto", 8, 64, need, 80 * GiB)[0] == 0.3333
    assert share(None, "auto", 8, 64, 40 * GiB, 80 * GiB)[0] == 1.0  # a 2B trial: a whole GPU
    assert share(None, "auto", 8, 64, 200 * GiB, 80 * GiB)[0] == 1.0  # does not fit at all: the worker refuses it
    assert share(None, "auto", 1, 8, small, 8 * GiB)[0] == 0.3333  # a small GPU holds fewer: 3 of 2 GiB
    # GPU memory unknown (no probe answered): one trial per GPU rather than a guess
    assert share(None, "auto", 4, 16, small, None) == (1.0, "auto")
    note = choose_placement(None, "auto", 8, 32, small, 80 * GiB).note
    assert "0.25 GPU per trial" in note and "8 GPU" in note and "--device cpu" in note
    assert "wait for a free share" in choose_placement(None, "auto", 2, 20, small, 80 * GiB).note
    assert "--workers 8 or more" in choose_placement(None, "auto", 8, 2, small, 80 * GiB).note


def _best_fit(shares: list[float], gpus: int) -> list[int]:
    """Workers per GPU when each share, in order, goes to the fullest GPU it fits on (what Ray 2.60
    does with fractional GPUs, checked on logical GPUs below)."""
    free, count = [1.0] * gpus, [0] * gpus
    for s in shares:
        fits = [g for g in range(gpus) if free[g] >= s - 1e-9]
        if not fits:
            continue  # waits for a free share
        g = min(fits, key=lambda g: (free[g], g))
        free[g] -= s
        count[g] += 1
    return count


def test_uneven_workers_still_reach_every_gpu() -> None:
    """5 workers on 4 GPUs at an even 0.5 would fill GPUs 0 and 1, put one on GPU 2 and leave GPU 3
    idle; the placement gives 3 of them a whole GPU and 2 a half, the whole ones started first."""
    assert _best_fit([0.5] * 5, 4) == [2, 2, 1, 0]  # the trap
    p = choose_placement(None, "auto", 4, 5, 1 * GiB, 80 * GiB)
    assert p.worker_shares(5) == [1.0, 1.0, 1.0, 0.5, 0.5] and p.share == 0.5
    assert "1 or 0.5 GPU per trial, 1 or 2 per GPU" in p.note
    for gpus in range(1, 9):
        for workers in range(1, 80):
            p = choose_placement(None, "auto", gpus, workers, 1 * GiB, 80 * GiB)
            shares = p.worker_shares(workers)
            assert len(shares) == workers and shares == sorted(shares, reverse=True)
            count = _best_fit(shares, gpus)
            busy = min(workers, gpus * MAX_TRIALS_PER_GPU)
            assert sum(count) == busy, (gpus, workers, count)  # nobody waits while a share is free
            assert max(count) - min(count) <= 1, (gpus, workers, count)  # every GPU, evenly


def test_placement_override_opt_out_and_cpu_clusters() -> None:
    assert share(0.25, "auto", 8, 2, 1 * GiB, 80 * GiB) == (0.25, "auto")  # --gpus-per-trial wins
    assert share(1.0, "auto", 8, 64, 1 * GiB, 80 * GiB) == (1.0, "auto")
    p = choose_placement(0.5, "auto", 0, 2, None, None)
    assert p.share == 0.5 and "no GPU now" in p.note  # an autoscaling cluster may add one
    # --device cpu opts out: no share, and the workers are told cpu (a 0-GPU Ray task sees every GPU)
    assert share(None, "cpu", 8, 4, 1 * GiB, 80 * GiB) == (0.0, "cpu")
    assert "stay unused" in choose_placement(None, "cpu", 8, 4, None, None).note
    assert share(0.0, "auto", 8, 4, None, None) == (0.0, "cpu")  # an explicit 0 share: CPU too
    assert share(None, "auto", 0, 4, None, None) == (0.0, "cpu")  # a CPU-only cluster
    assert choose_placement(None, "auto", 0, 4, None, None).note == ""  # nothing to say there
    for bad in [(0.5, "cpu", 8), (0.0, "cuda", 8), (None, "cuda", 0)]:
        with pytest.raises(ArchhpoError):
            choose_placement(bad[0], bad[1], bad[2], 4, None, None)


def test_largest_trial_counts_unchosen_confirmation_entries(tmp_path: Path) -> None:
    from archhpo.search import PlanEntry, TrialQueue, launch, prepare_settings

    s = prepare_settings("gp", "2M", n_trials=6, seed=0)
    launch(f"sqlite:///{tmp_path / 'g.db'}", s)
    q = TrialQueue(f"sqlite:///{tmp_path / 'g.db'}", s.study_name)
    planned = largest_trial_bytes([q])
    assert planned > 0
    # a confirmation entry not yet filled in may be any architecture of the study
    stand_in = types.SimpleNamespace(settings=types.SimpleNamespace(
        family=s.family, info=s.info, archs=s.archs, search_space=s.search_space,
        plan=[*s.plan, PlanEntry(slot=99, phase=3, arch_idx=None, params=None, seed=7, rank=0)]))
    every = largest_trial_bytes([stand_in])  # type: ignore[list-item]
    rows = types.SimpleNamespace(settings=types.SimpleNamespace(
        family=s.family, info=s.info, archs=s.archs, search_space=s.search_space,
        plan=[PlanEntry(slot=i, phase=1, arch_idx=i, params=None) for i in range(len(s.archs))]))
    assert every == largest_trial_bytes([rows]) >= planned  # type: ignore[list-item]


def test_gpu_memory_probe_reads_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reads nvidia-smi (no CUDA initialised in the Ray worker) and takes the smallest GPU."""
    from archhpo.cluster._run import _probe_gpu_memory

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nprintf '81559\\n40960\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert _probe_gpu_memory() == 40960 * 2**20
    fake.write_text("#!/bin/sh\nexit 9\n")  # a broken driver: fall back to torch (no GPU here)
    if not torch.cuda.is_available():
        assert _probe_gpu_memory() is None


def test_task_options() -> None:
    """Every task with a GPU share runs in a fresh process (max_calls=1), the whole-GPU retry too."""
    assert task_options(0.25, 4, cluster=False) == {"num_cpus": 4, "num_gpus": 0.25, "max_retries": 3,
                                                    "max_calls": 1}
    assert task_options(1.0, 4, cluster=False)["max_calls"] == 1
    assert task_options(0.0, 4, cluster=True) == {"num_cpus": 1, "num_gpus": 0.0, "max_retries": 3}


# ------------------------------------------------------------------------------ Ray, logical GPUs
@pytest.fixture
def logical_gpu_ray(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    ray = pytest.importorskip("ray")
    from archhpo.cluster._ray_private import loopback_only

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    with loopback_only():
        ray.init(address="local", num_cpus=4, num_gpus=3, include_dashboard=False, logging_level="WARNING",
                 _node_ip_address="127.0.0.1")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.ray
def test_ray_places_the_chosen_shares_on_every_gpu(logical_gpu_ray) -> None:  # type: ignore[no-untyped-def]
    """Four workers on three (logical) GPUs, started as `run` starts them: every GPU gets a worker,
    one gets two; each task sees only its GPU."""
    from collections import Counter

    from archhpo.cluster._run import start_by_share

    ray = logical_gpu_ray
    p = choose_placement(None, "auto", ray.cluster_resources()["GPU"], 4, 1 * GiB, 80 * GiB)
    assert p.worker_shares(4) == [1.0, 1.0, 0.5, 0.5]

    def probe(start: float, share: float) -> tuple[list[str], str | None, float]:
        time.sleep(max(0.0, start - time.time()) + 1.0)  # all four hold their share at once
        ids = ray.get_runtime_context().get_accelerator_ids()["GPU"]
        return [str(i) for i in ids], os.environ.get("CUDA_VISIBLE_DEVICES"), share

    def task(share: float) -> Any:
        return ray.remote(**task_options(share, 1, cluster=False))(probe)

    start = time.time() + 3
    got = ray.get(start_by_share(task, p.worker_shares(4), lambda share: (start, share)), timeout=120)
    per_gpu = Counter(g[0] for g, _, _ in got)
    assert sorted(per_gpu.values()) == [1, 1, 2] and len(per_gpu) == 3, got  # every GPU busy
    assert all(len(g) == 1 and env == g[0] for g, env, _ in got), got  # the task sees only its GPU
    halves = [g[0] for g, _, share in got if share == 0.5]
    assert len(set(halves)) == 1, got  # the two halves share the third GPU


@pytest.mark.ray
def test_run_on_logical_gpus_records_the_share_and_trains(tmp_path: Path) -> None:
    """`run` on a (logical) 2-GPU machine: the automatic share, each worker its GPU; no CUDA here,
    so the trials train on CPU and say so."""
    import io

    import optuna

    from archhpo.cluster._run import RunOptions, run_workers
    from archhpo.search import launch, prepare_settings

    url = f"sqlite:///{tmp_path / 'lg.db'}"
    s = prepare_settings("lg", "200K", n_trials=3, data=TINY_DATA, quick=True, pruner="none", seed=0)
    launch(url, s)
    out = io.StringIO()
    st = run_workers(url, [s.study_name], RunOptions(workers=2, refresh_s=0.5,
                                                     local_gpus=2), out=out)[s.study_name]
    assert st.done and st.final == 3, st
    assert "GPU placement: 1 GPU per trial" in out.getvalue() and "GPU memory unknown" in out.getvalue()
    trials = optuna.load_study(study_name=s.study_name, storage=url).get_trials(deepcopy=False)
    by_worker: dict[str, set[str]] = {}
    for t in trials:
        a = t.user_attrs
        assert a["gpu_share"] == 1.0 and len(a["ray_gpu_ids"]) == 1 and a["device"] == "cpu", a
        by_worker.setdefault(a["ray_worker"], set()).update(a["ray_gpu_ids"])
    ids = [next(iter(v)) for v in by_worker.values()]
    assert len(ids) == len(set(ids)), by_worker  # two workers never share a whole-GPU share


# ------------------------------------------------------------------------------ PyTorch-only hosts
BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = ("ray", "psycopg2", "psycopg")
    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"No module named {name!r} (blocked: this host has only PyTorch)")
            return None
    sys.meta_path.insert(0, _NotInstalled())
""")


def _torch_only_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1",
            "RAY_USAGE_STATS_ENABLED": "0"}


def test_worker_and_train_run_without_ray_or_postgres_drivers(tmp_path: Path) -> None:
    """launch + a plain worker on SQLite + train, in a Python where `import ray` and
    `import psycopg2` fail; none of them imports either."""
    db = f"sqlite:///{tmp_path / 'po.db'}"
    script = textwrap.dedent(f"""
        import json, sys
        try:
            import ray
        except ImportError:
            pass
        else:
            sys.exit("the blocker did not work")
        from archhpo.cli import main
        common = ["--experiment", "po", "--budget", "200K", "--storage", {db!r}]
        assert main(["launch", *common, "--trials", "3", "--quick", "--data", {TINY_DATA!r}]) == 0
        assert main(["worker", *common, "--device", "cpu", "--threads", "1"]) == 0
        assert main(["train", "--family", "patchtst", "--d-model", "32", "--n-layers", "1", "--n-heads", "4",
                     "--d-ff", "64", "--epochs", "1", "--quick", "--data", {TINY_DATA!r}, "--device", "cpu"]) == 0
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("ray", "psycopg2"))))
    """)
    res = subprocess.run([sys.executable, "-c", script], env=_torch_only_env(tmp_path), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == []
    assert json.loads(lines[-2])["val_loss"] > 0  # train's metrics line
    assert '"complete": 3' in res.stderr, res.stderr[-2000:]  # the worker's summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is visible")
def test_gpu_bench_refuses_clearly_without_a_gpu_and_needs_no_ray(tmp_path: Path) -> None:
    env = _torch_only_env(tmp_path)
    for script in ("gpu.py", "gpu_e2e.py"):
        res = subprocess.run([sys.executable, str(REPO / "bench" / script), "--help"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "usage" in res.stdout, res.stderr[-2000:]
        res = subprocess.run([sys.executable, str(REPO / "bench" / script)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, (script, res.stdout, res.stderr[-2000:])
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "no CUDA GPU is visible" in lines[0], res.stderr
    assert not list(tmp_path.glob("gpu_bench.*"))  # nothing measured, nothing written


# ------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@needs_cuda
def test_tf32_and_the_peak_of_this_gpu() -> None:
    _device.configure_cuda_speed()
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.get_float32_matmul_precision() == "high"  # the legacy getter still works
    name = torch.cuda.get_device_name(0)
    if dense_bf16_peak_flops(name) is None:
        pytest.skip(f"{name!r} is not in the peak table; MFU is not recorded on it")


@pytest.mark.gpu
@needs_cuda
def test_a_tiny_trial_on_cuda_records_its_gpu(tmp_path: Path) -> None:
    """A planned trial on cuda: bf16 autocast, and the GPU attributes beside the estimate."""
    import optuna

    from archhpo.search import TrialQueue, launch, prepare_settings
    from archhpo.workers import Worker

    url = f"sqlite:///{tmp_path / 'cu.db'}"
    s = prepare_settings("cu", "200K", n_trials=3, data=TINY_DATA, quick=True, pruner="none", seed=0)
    launch(url, s)
    summary = Worker([TrialQueue(url, s.study_name)], device="cuda").run()
    assert summary.complete == 3, summary
    for t in optuna.load_study(study_name=s.study_name, storage=url).get_trials(deepcopy=False):
        a = t.user_attrs
        assert a["device"].startswith("cuda") and a["gpu_name"] == torch.cuda.get_device_name(0), a
        assert isinstance(a["gpu_index"], int) and a["samples_per_s"] > 0
        # measured beside the estimate (the peak also holds the data and cuBLAS's workspace)
        assert 0 < a["peak_memory_gib"] <= a["memory_estimate_gib"] + 1.0, a
        if dense_bf16_peak_flops(a["gpu_name"]) is not None:
            assert 0 < a["mfu"] < 1, a


@pytest.mark.gpu
@needs_cuda
def test_gpu_bench_measures_one_config(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--sections", "throughput",
                          "--configs", "2M-wide", "--batches", "64", "--seconds", "1", "--out", str(tmp_path)],
                         env=_torch_only_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_bench.json").read_text())
    row = result["throughput"][0]
    assert result["machine"]["gpu"] and row["samples_per_s"] > 0 and row["peak_memory_gib"] > 0
    assert row["mfu"] is None or 0 < row["mfu"] < 1
    assert math.isfinite(row["seconds"])
