"""Helpers shared by the benchmark scripts (run as `python bench/NAME.py`, so importable as `_common`)."""

from __future__ import annotations

import os


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (user+nice+system+irq+softirq)."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:8]]
    except OSError:
        return float("nan")
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK")
