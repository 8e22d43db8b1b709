"""GPU faults, simulated on CPU: injected CUDA errors, a faked free-memory
reading, measured CPU peaks against the memory estimate."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from optuna.trial import TrialState

import archhpo.models._cpu_kernels
import archhpo.models.patchtst_spec
import archhpo.workers._memory
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import TrialShape, Worker, estimate_training_bytes, is_oom, is_sticky_cuda_error
from archhpo.workers._checkpoints import _atomic_save
from archhpo.workers._device import mfu
from tests.conftest import TINY_DATA, run_cli

STICKY = [
    "CUDA error: an illegal memory access was encountered",
    "CUDA error: device-side assert triggered",
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb)`",
]


def test_one_classifier_tells_sticky_faults_from_ooms() -> None:
    for text in STICKY:
        assert is_sticky_cuda_error(RuntimeError(text)) and not is_oom(RuntimeError(text)), text
    alloc = RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    assert is_oom(alloc) and not is_sticky_cuda_error(alloc)
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_sticky_cuda_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def _raising(message: str) -> type[torch.nn.Module]:
    class Raising(torch.nn.Module):
        def __init__(self, cfg) -> None:  # type: ignore[no-untyped-def]
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            raise RuntimeError(message)

    return Raising


def _queue(url: str, trials: int = 2) -> TrialQueue:
    s = prepare_settings("gf", "200K", n_trials=4, data=TINY_DATA, quick=True, pruner="none")
    launch(url, dataclasses.replace(s, plan=s.plan[:trials]))
    return TrialQueue(url, s.study_name)


@pytest.mark.parametrize("message", STICKY)
def test_a_sticky_cuda_fault_gives_the_trial_back_and_stops_the_worker(sqlite_url: str,
    message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fam = archhpo.models.patchtst_spec.FAMILY
    monkeypatch.setattr(archhpo.models.patchtst_spec, "FAMILY", dataclasses.replace(fam, build=_raising(message)))
    q = _queue(sqlite_url)
    summary = Worker([q], device="cpu", threads=1).run()
    assert summary.unhealthy and message[:40] in summary.unhealthy
    assert (summary.requeued, summary.failed, summary.complete) == (1, 0, 0), "the later trial is not touched"
    trials = q.storage.get_all_trials(q.study_id)
    assert [t.state for t in trials] == [TrialState.WAITING, TrialState.WAITING]
    assert all(t.user_attrs.get("attempt", 1) == 1 for t in trials), "no attempt spent"
    assert not any("fail_reason" in t.user_attrs for t in trials)


def test_the_worker_command_exits_non_zero_after_a_sticky_fault(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    q = _queue(url, trials=1)
    script = textwrap.dedent(f"""
        import dataclasses, sys
        import archhpo.models.patchtst_spec as p
        from archhpo.cli._main import main
        from tests.workers.test_gpu_faults import STICKY, _raising
        p.FAMILY = dataclasses.replace(p.FAMILY, build=_raising(STICKY[0]))
        sys.exit(main(["worker", "--experiment", "gf", "--budget", "200K", "--storage", {url!r},
                       "--device", "cpu", "--checkpoint-dir", {str(tmp_path / 'ck')!r}]))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parent.parent.parent)
    assert res.returncode == 3, res.stderr
    assert json.loads(res.stderr.strip().splitlines()[-1])["worker"] == "unhealthy"
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.state == TrialState.WAITING


def test_a_memory_refusal_on_a_shared_gpu_is_retried_on_a_whole_gpu(sqlite_url: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neighbours' cached memory can make a shared GPU look full: the refusal is not final."""
    monkeypatch.setattr(archhpo.workers._memory, "available_bytes", lambda device: 2**20)
    q = _queue(sqlite_url, trials=1)
    assert Worker([q], device="cpu", threads=1, extra_attrs={"gpu_share": 0.25}).run().failed == 1
    first, retry = sorted(q.storage.get_all_trials(q.study_id), key=lambda t: t.number)
    assert first.user_attrs["oom_shared"] is True and "GiB" in first.user_attrs["fail_reason"]
    assert retry.state == TrialState.WAITING and retry.user_attrs["whole_gpu"] is True


def test_a_refusal_on_a_whole_device_stays_final(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archhpo.workers._memory, "available_bytes", lambda device: 2**20)
    q = _queue(sqlite_url, trials=1)
    Worker([q], device="cpu", threads=1).run()
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert trial.state == TrialState.FAIL and "oom_shared" not in trial.user_attrs
    assert q.maintain().done


def test_a_resumed_checkpoint_is_read_to_the_cpu(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    real = torch.load

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("map_location"))
        return real(*args, **kwargs)

    q = _queue(sqlite_url, trials=1)
    worker = Worker([q], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck")
    claim = q.claim(worker.attrs)
    path = worker._checkpoint_path(q, claim)
    path.parent.mkdir(parents=True)
    _atomic_save({"params": claim.params, "epoch": 1}, path)
    monkeypatch.setattr(torch, "load", spy)
    assert worker._load_resume(q, claim) is not None
    assert seen == ["cpu"]


def test_mfu_of_a_packed_trial_is_against_its_share() -> None:
    whole = mfu(1e15, 10.0, "NVIDIA H100 80GB HBM3")
    assert whole is not None
    assert mfu(1e15, 10.0, "NVIDIA H100 80GB HBM3", share=0.25) == pytest.approx(4 * whole)


# --------------------------------------------------------------------------- the memory estimate
def _shape(tokens: int, sequences: int = 1, batch: int = 32, eval_batch: int = 1024) -> TrialShape:
    return TrialShape(150_000, batch, eval_batch, tokens, sequences, 64, 3, 4, 256)


def test_the_estimate_counts_what_cuda_keeps() -> None:
    """On CUDA: bf16 activations and no attention maps (SDPA), so T^2 does not enter; on CPU the
    math path keeps the maps; channel-independent attention (ci) keeps C maps of (T/C)^2."""
    cat_gpu, cat_cpu = estimate_training_bytes(_shape(1272), "cuda"), estimate_training_bytes(_shape(1272), "cpu")
    assert cat_gpu < cat_cpu / 5
    assert estimate_training_bytes(_shape(1272, sequences=8), "cpu") < cat_cpu / 3
    data = TrialShape(150_000, 32, 1024, 159, 1, 64, 3, 4, 256, data_bytes=3 * 2**30)
    assert estimate_training_bytes(data, "cuda") - estimate_training_bytes(_shape(159), "cuda") == 3 * 2**30
    # evaluation at eval_batch_size: a large eval batch can be the peak
    assert estimate_training_bytes(_shape(159, batch=1, eval_batch=4096), "cuda") > estimate_training_bytes(
        _shape(159, batch=1, eval_batch=1), "cuda")


def test_cpu_training_keeps_attention_maps_only_without_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused kernels (and SDPA's flash kernel) keep no T^2 maps for backward; the tensor path
    that stands in for them without a C compiler keeps TRAIN_MAPS_CPU per layer."""
    memory = archhpo.workers._memory
    shape = _shape(1272, eval_batch=1)  # cat's 1272 tokens; a small eval batch, so training is the peak
    monkeypatch.setattr(archhpo.models._cpu_kernels, "lib", lambda: object())
    fused = estimate_training_bytes(shape, "cpu")
    monkeypatch.setattr(archhpo.models._cpu_kernels, "lib", lambda: None)
    tensor_path = estimate_training_bytes(shape, "cpu")
    maps = shape.batch_size * shape.n_layers * memory.TRAIN_MAPS_CPU * shape.n_heads * 1272**2 * 4
    assert tensor_path - fused == maps


MEASURE = textwrap.dedent("""
    import json, sys, torch
    from archhpo.search import prepare_settings
    from archhpo.workers import TrialSpec, build_trial, estimate_training_bytes, trial_shape
    enc, batch = sys.argv[1], int(sys.argv[2])
    s = prepare_settings("m", None, family="signal", family_options={"encoder": enc},
                         pins={"d_model": 64, "n_layers": 3, "n_heads": 4, "d_ff": 256})
    a = s.archs[0]
    spec = TrialSpec(family="signal", data=dict(s.data), options=s.options.as_dict(), info=dict(s.info), arch=dict(a),
                     params={"batch_size": 32, "learning_rate": 1e-4, "epochs": 1, "weight_decay": 0.0,
                             "warmup_steps": 0})
    built = build_trial(spec, "cpu")
    d, fam = built.data, built.family
    status = lambda key: next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
    before = status("VmRSS:")
    # Reset the peak-RSS mark (VmHWM): building the data has transient peaks of its own, which
    # ru_maxrss would count against training.
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    opt = torch.optim.AdamW(built.model.parameters())
    for i in range(2):
        idx = torch.arange(i * batch, (i + 1) * batch) % d.n_train
        fam.loss(built.model(*(t[idx] for t in d.train_inputs)), d.train_target[idx]).backward()
        opt.step(); opt.zero_grad(set_to_none=True)
    built.model.eval()
    with torch.no_grad():
        built.model(*(t[:1024] for t in d.val_inputs))
    peak = status("VmHWM:") - before
    shape = trial_shape(fam, built.config, a, batch, min(1024, d.n_val))
    readme = trial_shape(fam, built.config, a, 32, min(1024, d.n_val))  # study.toml's batch
    print(json.dumps({"peak": peak, "estimate": estimate_training_bytes(shape, "cpu"),
                      "readme": estimate_training_bytes(readme, "cpu")}))
""")


@pytest.mark.parametrize(("encoder", "batch"), [("sum", 32), ("ci", 32), ("cat", 8)])
def test_the_cpu_estimate_covers_the_measured_peak_without_refusing_what_fits(encoder: str, batch: int) -> None:
    """The README's study.toml (signal, d_model 64, 3 layers, batch 32): measured peak RSS growth
    of training and evaluation against the estimate, in a fresh process each (cat at batch 8: at
    32 it peaks at 8.8 GiB, too much beside a parallel test run; estimated 10.5 GiB)."""
    res = subprocess.run([sys.executable, "-c", MEASURE, encoder, str(batch)], capture_output=True, text=True,
                         timeout=600,
                         cwd=Path(__file__).parent.parent.parent)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["peak"] <= got["estimate"] <= 1.6 * got["peak"] + 2**28, got
    assert got["readme"] < 0.85 * 16 * 2**30, "study.toml's trials fit a 24 GiB machine with 16 GiB free"


def test_run_on_a_finished_study_says_so_without_starting_ray(sqlite_url: str, tmp_path: Path) -> None:
    url = sqlite_url
    q = _queue(url, trials=1)
    Worker([q], device="cpu", threads=1).run()
    assert q.maintain().done
    res = run_cli("run", "--experiment", "gf", "--budget", "200K", "--trials", "4", "--quick", "--data", TINY_DATA,
                  "--pruner", "none", "--storage", url, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "finished; nothing to run" in res.stderr
    assert "trials 1/1 done" not in res.stderr, "no worker pool was started"
    with open(tmp_path / "results" / "experiment_results.csv") as fh:  # a killed driver's stale export is rewritten
        assert len(list(csv.DictReader(fh))) == 1
    assert (tmp_path / "results" / "gf_report.html").exists()


def test_the_checkpoint_cadence_is_a_flag(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import archhpo.workers._loop as loop

    saved: list[int] = []
    monkeypatch.setattr(loop, "_atomic_save", lambda obj, path: saved.append(int(obj["epoch"])))
    q = _queue(sqlite_url, trials=1)
    Worker([q], device="cpu", threads=1, checkpoint_dir=tmp_path / "ck", checkpoint_every=2).run()
    (trial,) = q.storage.get_all_trials(q.study_id)
    epochs = int(trial.params["epochs"])
    assert saved == list(range(2, epochs + 1, 2))
    assert "--checkpoint-every N" in run_cli("run", "--help", cwd=tmp_path).stdout
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    res = run_cli("run", "--experiment", "x", "--budget", "200K", "--checkpoint-every", "0", cwd=fresh)
    assert res.returncode == 2 and "--checkpoint-every must be at least 1" in res.stderr
    assert not list(fresh.iterdir()), "nothing written"


def _gpu_e2e():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_e2e", Path(__file__).parent.parent.parent / "bench" / "gpu_e2e.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_e2e_honours_an_inherited_cuda_visible_devices() -> None:
    bench = _gpu_e2e()
    assert bench.visible_gpus(2, "2,3") == ["2", "3"], "a SLURM allocation of GPUs 2,3 stays on 2,3"
    assert bench.visible_gpus(2, None) == ["0", "1"]
    assert bench.visible_gpus(2, "") == ["0", "1"]


def test_gpu_e2e_names_a_gpu_missing_from_the_peak_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARCHHPO_PEAK_BF16_FLOPS", raising=False)
    bench = _gpu_e2e()
    assert bench.missing_peak(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]) is None
    why = bench.missing_peak(["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"])
    assert why is not None and "\n" not in why and why.endswith(".")
    assert "Tesla V100-SXM2-32GB" in why and "ARCHHPO_PEAK_BF16_FLOPS" in why


def test_samples_per_s_times_only_the_training_steps() -> None:
    """Validation, database calls (on_eval) and checkpoints are not training time."""
    import time

    from archhpo.models import get_family
    from archhpo.models._family import TensorDataset
    from archhpo.workers import TrainConfig, train

    torch.manual_seed(0)
    fam = get_family("patchtst")
    model = fam.build(fam.config_for({"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
                                     {"num_features": 2, "dropout": 0.0}))
    x = torch.randn(96, 60, 2)
    data = TensorDataset((x[:64],), (x[:64, -1, 0] > 0).float(), (x[64:],), (x[64:, -1, 0] > 0).float())
    res = train(model, data, fam.loss, TrainConfig(epochs=3, batch_size=32, warmup_steps=0),
                on_eval=lambda e, v: time.sleep(0.4), checkpoint=lambda st: time.sleep(0.4))
    assert res.duration_s - res.train_s >= 6 * 0.4
    assert res.samples == 3 * 64 and res.samples_per_s == pytest.approx(res.samples / res.train_s)


def test_large_models_are_built_one_at_a_time_per_host(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another worker of the host holds the build slot, a large trial waits to be built."""
    import fcntl
    import threading
    import time

    from tests.conftest import wait_for

    monkeypatch.setattr(archhpo.workers._memory, "LARGE_MODEL_PARAMS", 1)
    monkeypatch.setattr(archhpo.workers._memory, "HOST_BUILD_LOCK", tmp_path / "build.lock")
    fam = archhpo.models.patchtst_spec.FAMILY
    built: list[int] = []

    def build(cfg):  # type: ignore[no-untyped-def]
        built.append(1)
        return fam.build(cfg)

    monkeypatch.setattr(archhpo.models.patchtst_spec, "FAMILY", dataclasses.replace(fam, build=build))
    q = _queue(sqlite_url, trials=1)
    worker = Worker([q], device="cpu", threads=1)
    with open(tmp_path / "build.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another worker is building
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert wait_for(lambda: q.storage.get_all_trials(q.study_id)[0].state == TrialState.RUNNING, timeout=120)
        time.sleep(2.0)
        assert not built, "the trial waits for the slot"
        fcntl.flock(other, fcntl.LOCK_UN)
    thread.join(timeout=300)
    assert built and q.storage.get_all_trials(q.study_id)[0].state == TrialState.COMPLETE
