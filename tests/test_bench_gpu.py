"""`bench/gpu.py --sections lm` runs end to end on CPU (`--dry-run`: tiny
configs, compile with the eager backend) and prints the table that docs/benchmarks.md takes, with
the SDPA op read from the profiler.  The GPU figures themselves need a GPU; nothing here is one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.test_gpu import _torch_only_env

REPO = Path(__file__).resolve().parents[1]
HEADER = ("| row | params | FLOPs/token | context | variant | batch (micro) | tokens/s | step ms | step MFU "
          "| TFLOP/s | compile s | peak GiB | estimate GiB | SDPA op (profiler) |")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("lm")
    res = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--sections", "lm", "--dry-run",
                          "--lm-rows", "124M", "2B", "--seconds", "0.2", "--out", str(out)],
                         env=_torch_only_env(out), cwd=out, capture_output=True, text=True, timeout=600)
    return res, out


def test_the_lm_section_dry_run_prints_a_pasteable_table(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    res, out = dry_run
    assert res.returncode == 0, res.stderr[-3000:]
    md = (out / "gpu_bench.md").read_text()
    assert md.strip() == res.stdout.strip()
    lines = md.splitlines()
    at = lines.index(HEADER)
    rows = lines[at + 2 : at + 2 + 8]
    assert [r.split(" | ")[4] for r in rows] == ["eager", "foreach", "bf16-weights", "compile"] * 2
    assert all(r.startswith("| 124M (tiny) |") for r in rows[:4]) and all(r.count("|") == HEADER.count("|")
                                                                             for r in rows)
    assert "scaled_dot_product" in rows[0]  # the profiler saw the SDPA op
    assert "Targets (issue 9)" not in md  # the issue-9 targets belong to the other sections


def test_the_lm_json_has_the_numbers_behind_the_table(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    res, out = dry_run
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((out / "gpu_bench.json").read_text())
    rows = result["lm"]
    assert len(rows) == 8 and not [r for r in rows if "error" in r]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["steps"] >= 3 and r["step_mfu"] is None  # no GPU: no MFU
        assert r["flops_per_token"] * r["seq_len"] * r["steps"] * r["batch"] > 0
    compiled = [r for r in rows if r["variant"] == "compile"]
    assert all(r["compile_s"] >= 0 for r in compiled)


def test_lm_is_asked_for_by_name() -> None:
    res = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--help"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "--dry-run" in res.stdout and "--lm-rows" in res.stdout
    assert "default: all but lm and profile" in res.stdout
