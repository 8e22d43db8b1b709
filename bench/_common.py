"""Helpers shared by the benchmark scripts (run as `python bench/NAME.py`, so importable as `_common`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (user+nice+system+irq+softirq)."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:8]]
    except OSError:
        return float("nan")
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK")


def git_commit() -> str:
    """The commit measured: `git rev-parse --short HEAD`, plus " + uncommitted" when the tree is dirty."""
    repo = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' + uncommitted' if dirty else ''}"
