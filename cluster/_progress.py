"""The progress line of `archhpo run` and its ETA."""

from __future__ import annotations

import datetime as dt

from archhpo.search._queue import PlanStatus


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eta_s(statuses: dict[str, PlanStatus], workers: int, now: dt.datetime | None = None) -> float | None:
    """Seconds left: the trials not yet final at the mean trial duration, less what the running
    ones have done already (each counted up to that mean), over the workers; None before any finished."""
    total = sum(s.total for s in statuses.values())
    final = sum(s.final for s in statuses.values())
    if final >= total:
        return 0.0
    durations = [s.mean_duration_s for s in statuses.values() if s.mean_duration_s]
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    now = now or dt.datetime.now()  # the database's datetime_start is the claiming host's local time
    done = sum(min(max(0.0, (now - t).total_seconds()), mean) for s in statuses.values() for t in s.running_since)
    return max(0.0, (total - final) * mean - done) / max(1, workers)


def progress_line(statuses: dict[str, PlanStatus], workers: int, elapsed: float) -> str:
    total = sum(s.total for s in statuses.values())
    final = sum(s.final for s in statuses.values())
    failed = sum(s.failed for s in statuses.values())
    running = sum(s.running for s in statuses.values())
    bests = {n: s.best_value for n, s in statuses.items() if s.best_value is not None}
    eta = eta_s(statuses, workers)
    best = "  ".join(f"{n}={v:.4f}" for n, v in bests.items()) or "-"
    held = sum(s.held for s in statuses.values())
    return (
        f"[{_fmt_eta(elapsed)}] trials {final}/{total} done, {running} running, {failed} failed"
        f"{f', {held} held at a rung' if held else ''} | "
        f"best {best} | ETA {_fmt_eta(eta)}"
    )
