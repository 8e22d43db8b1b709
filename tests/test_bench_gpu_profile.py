"""`bench/gpu.py --sections profile`, the PatchTST kernel profile, on CPU.

The kernel arithmetic (busy share, gaps, kinds) is checked exactly on a made-up trace; the section
itself runs end to end with ``--dry-run`` (a CPU has no kernels, so its GPU columns stay empty)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.workers.test_gpu import _torch_only_env

REPO = Path(__file__).resolve().parents[1]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_profile", REPO / "bench" / "gpu_profile.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TRACE = {"traceEvents": [
    {"cat": "kernel", "name": "nvjet_sm90_tst_gemm", "ts": 0, "dur": 10},
    {"cat": "kernel", "name": "cudnn_sdpa_flash_fprop", "ts": 15, "dur": 5},   # gap 5 before it
    {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 18, "dur": 4},          # overlaps 2, ends at 22
    {"cat": "kernel", "name": "elementwise_kernel", "ts": 30, "dur": 10},      # gap 8 before it
    {"cat": "gpu_user_annotation", "name": "Optimizer.step#AdamW.step", "ts": 0, "dur": 40},  # a label
    {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},
    {"cat": "kernel", "name": "empty", "ts": 45, "dur": 0},                    # no duration: no work
]}


def test_the_trace_gives_the_kernels_and_not_the_annotation_that_spans_them() -> None:
    kernels = _module().trace_kernels(TRACE)
    assert [k[0] for k in kernels] == ["nvjet_sm90_tst_gemm", "cudnn_sdpa_flash_fprop", "Memcpy HtoD",
                                       "elementwise_kernel"]


def test_busy_share_gaps_and_kinds_are_computed_exactly() -> None:
    mod = _module()
    stats = mod.kernel_stats(mod.trace_kernels(TRACE), steps=2)
    # span 0..40; busy = 10 + (15..22 = 7) + 10 = 27
    assert stats["gpu_busy"] == round(27 / 40, 4) and stats["span_ms"] == 0.04
    assert stats["kernels_per_step"] == 2.0
    assert stats["median_gap_us"] == 5.0  # gaps 5, 0 (overlap), 8
    assert stats["share"] == {"matmul": round(10 / 29, 4), "attention": round(5 / 29, 4), "other": round(14 / 29, 4)}
    assert stats["top"][0] == ("nvjet_sm90_tst_gemm", round(100 * 10 / 29, 1))
    assert mod.kernel_stats([], steps=1) == {}


@pytest.mark.parametrize("keep", [True, False])
def test_the_profile_section_runs_end_to_end_on_cpu(tmp_path: Path, keep: bool) -> None:
    args = [sys.executable, str(REPO / "bench" / "gpu.py"), "--sections", "profile", "--dry-run",
            "--profile-batches", "8", "--profile-steps", "3", "--out", str(tmp_path)]
    res = subprocess.run(args + (["--profile-trace"] if keep else []), env=_torch_only_env(tmp_path),
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    row = json.loads((tmp_path / "gpu_bench.json").read_text())["profile"][0]
    assert row["config"] == "200M" and row["batch"] == 8 and row["steps"] == 3 and row["step_ms"] > 0
    assert row["step_mfu"] is None and "gpu_busy" not in row  # a CPU: no MFU, no kernels
    assert "| 200M | 8 |" in res.stdout and "PatchTST profile" in res.stdout
    trace = tmp_path / "trace_200M_b8.json.gz"
    assert trace.exists() == keep
    if keep:
        assert "traceEvents" in json.loads(gzip.decompress(trace.read_bytes()))


def test_an_lm_row_profiles_compiled(tmp_path: Path) -> None:
    """The next lease's question: what limits a compiled lm at 124M (docs/benchmarks.md §13)."""
    res = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--sections", "profile", "--dry-run",
                          "--profile-config", "lm-124M", "--profile-compile", "--profile-batches", "4",
                          "--profile-steps", "3", "--profile-trace", "--out", str(tmp_path)],
                         env=_torch_only_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    row = json.loads((tmp_path / "gpu_bench.json").read_text())["profile"][0]
    assert "error" not in row, row
    assert row["config"] == "lm-124M compiled" and row["batch"] == 4 and row["steps"] == 3
    assert (tmp_path / "trace_lm-124M_compiled_b4.json.gz").exists()
