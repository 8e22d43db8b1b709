"""`bench/gpu.py --sections lm` (and defaults, tokens, ranks) runs end to end on CPU (`--dry-run`: tiny
configs, compile with the eager backend, gloo ranks) and prints the tables that docs/benchmarks.md
and docs/gpu.md take, with the SDPA op read from the profiler.  The GPU figures themselves need a
GPU; nothing here is one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.test_gpu import _torch_only_env

# One xdist worker runs this module: its module-scoped fixtures are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("bench_gpu")

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
    assert "default: all but lm, profile, defaults, tokens and ranks" in " ".join(res.stdout.split())
    assert "--ranks-steps" in res.stdout and "--tokens-dir" in res.stdout


@pytest.fixture(scope="module")
def sections_58(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("g58")
    res = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--sections", "defaults,tokens,ranks",
                          "--dry-run", "--seconds", "0.1", "--tokens-file-mtokens", "1", "--tokens-steps", "3",
                          "--tokens-dir", str(out / "tok"), "--ranks-steps", "3", "--val-windows", "8",
                          "--out", str(out)],
                         env=_torch_only_env(out), cwd=out, capture_output=True, text=True, timeout=900)
    return res, out


def _table(md: str, header_start: str) -> list[list[str]]:
    lines = md.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_gpu_defaults_token_file_and_rank_sections_print_their_tables(
        sections_58: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """Each default on and off, validation capped and planned, a token file against on-device
    windows, K = 1 and 2 ranks (gloo): one table each, what the run printed is the file written."""
    res, out = sections_58
    assert res.returncode == 0, res.stderr[-3000:]
    md = (out / "gpu_bench.md").read_text()
    assert md.strip() == res.stdout.strip()
    steps = _table(md, "| row | params |")
    assert [r[4] for r in steps] == ["eager", "unpadded-head", "compile", "plan-batch"]
    assert [r[1] for r in _table(md, "| row | validation |")] == ["capped", "planned"]
    assert [r[1] for r in _table(md, "| row | data |")] == ["token file", "on the device"]
    ranks = _table(md, "| K | row |")
    assert [(r[0], r[2]) for r in ranks] == [("1", "16"), ("2", "32")] and ranks[0][-1] == "1"


def test_the_sections_json_holds_the_measurements_and_the_token_file_is_nanogpts(
        sections_58: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    res, out = sections_58
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads((out / "gpu_bench.json").read_text())
    steps = result["defaults"]["steps"]
    assert not [r for r in steps if "error" in r] and all(r["tokens_per_s"] > 0 for r in steps)
    by = {r["variant"]: r for r in steps}
    assert by["plan-batch"]["batch"] >= by["eager"]["batch"] == 16 and by["compile"]["compile_s"] >= 0
    assert all(r["seconds"] > 0 and r["batches"] >= 1 for r in result["defaults"]["validation"])
    tokens = result["tokens"]
    assert not [r for r in tokens if "error" in r] and all(r["tokens_per_s"] > 0 and r["steps"] == 3 for r in tokens)
    assert (out / "tok" / "train.bin").stat().st_size == 2 * tokens[0]["file_tokens"] == 2 * 2**20  # uint16
    ranks = result["ranks"]
    assert [r["ranks"] for r in ranks] == [1, 2] and all(r["tokens_per_s"] > 0 for r in ranks)
    assert ranks[1]["global_batch"] == 2 * ranks[0]["global_batch"] and ranks[0]["scaling"] == 1.0
