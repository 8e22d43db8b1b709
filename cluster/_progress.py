"""What `archhpo run` shows while it runs: a progress bar on a terminal (rich), a plain line every
10-30 s otherwise, and the ETA in FLOPs (cluster/_flops.py)."""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from archhpo.cluster._flops import SlotWork, Work, eta_range, study_work
from archhpo.schema import Attr
from archhpo.search._queue import PlanStatus
from archhpo.search._trust import EVERY_RUNG

PLAIN_EVERY_S = (10.0, 30.0)  # off a terminal: a line when something changed (at most every 10 s), else every 30 s


Eta = float | tuple[float, float] | None  # seconds left; (without, with) undecided slots; None: not known yet


def _fmt_eta(seconds: Eta) -> str:
    if seconds is None:
        return "--:--"
    if isinstance(seconds, tuple):  # a second-wave confirmation rank not decided yet (cluster/_flops.py)
        return f"{_fmt_eta(seconds[0])}-{_fmt_eta(seconds[1])}"
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eta_s(statuses: dict[str, PlanStatus], workers: int, now: dt.datetime | None = None) -> float | None:
    """Seconds left by trial counts: the trials not yet final at the mean trial duration, less what
    the running ones have done already (each counted up to that mean), over the workers; None before
    any finished. `run` uses it only for studies that record no FLOPs (flops_eta otherwise)."""
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


def _counts(statuses: Mapping[str, PlanStatus]) -> dict[str, int]:
    keys = ("total", "final", "running", "failed", "held")
    return {k: sum(int(getattr(s, k)) for s in statuses.values()) for k in keys}


def _best(status: PlanStatus) -> str:
    return "-" if status.best_value is None else f"{status.best_value:.4f}"


def progress_line(statuses: dict[str, PlanStatus], workers: int, elapsed: float,
                  eta: Eta | str = "trials") -> str:
    """One plain line; `eta` in seconds (None: not known yet; a pair: a range), or "trials" for
    eta_s's estimate."""
    c = _counts(statuses)
    seconds = eta_s(statuses, workers) if eta == "trials" else eta
    best = "  ".join(f"{n}={_best(s)}" for n, s in statuses.items() if s.best_value is not None) or "-"
    held = f", {c['held']} held at a rung" if c["held"] else ""
    waits = "  ".join(f"{n}: {w}" for n, s in statuses.items() if (w := s.waits_for))
    return (
        f"[{_fmt_eta(elapsed)}] trials {c['final']}/{c['total']} done, {c['running']} running, {c['failed']} failed"
        f"{held} | best {best} | ETA {_fmt_eta(None if isinstance(seconds, str) else seconds)}"
        + (f" | waiting: {waits}" if waits else "")
    )


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class _PlainStream:
    """A stream that drops ANSI escape sequences (what it wraps is not a terminal)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_ANSI.sub("", text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def plain_ray_logs(*streams: TextIO) -> None:
    """Ray colours the (pid=...) prefix of every worker line it copies to the driver unless
    RAY_COLOR_PREFIX is "0" (read per line, ray/_private/worker.py print_worker_logs): off a
    terminal (a log file, a pipe) or under NO_COLOR, ask for plain lines; a value already set wins.
    Its "[repeated Nx across cluster]" note is coloured regardless (ray_logging._color), up to the
    flush at ray.shutdown: so sys.stdout and sys.stderr, where they are not a terminal, drop escape
    codes from here on (Ray writes to them as they are when it prints)."""
    if not os.environ.get("RAY_COLOR_PREFIX") and (os.environ.get("NO_COLOR")
                                                   or not all(_is_tty(s) for s in streams)):
        os.environ["RAY_COLOR_PREFIX"] = "0"
    if not _is_tty(sys.stdout) and not isinstance(sys.stdout, _PlainStream):
        sys.stdout = _PlainStream(sys.stdout)
    if not _is_tty(sys.stderr) and not isinstance(sys.stderr, _PlainStream):
        sys.stderr = _PlainStream(sys.stderr)


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class RunProgress:
    """The driver's display of one `run`: update() each poll, close() at the end (or use `with`).

    On a terminal a rich progress bar per study (done/total, running, held, failed, best) and a
    line with the elapsed time and the ETA; `file` is where other messages go meanwhile, printed
    above the bar. Off a terminal, plain lines (progress_line) every PLAIN_EVERY_S."""

    def __init__(self, out: TextIO, queues: Mapping[str, Any], workers: int, *,
                 read_work: Callable[[], Work] | None = None, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], dt.datetime] = dt.datetime.now, console: Any = None) -> None:
        self.out, self.queues, self.workers = out, queues, workers
        self.read_work = read_work or self._read_work
        self.clock, self.now = clock, now
        self.start = clock()
        self.work: Work | None = None
        self._work_key: Any = None
        self._next_read = 0.0
        self._last: tuple[float, Any] | None = None  # off a terminal: when the last line was written, and what
        self.bar = _Bar(console, out, clock) if console is not None or _is_tty(out) else None
        self.file: TextIO = self.bar.file if self.bar is not None else out

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def eta(self, statuses: Mapping[str, PlanStatus]) -> Eta:
        """Seconds left from the FLOPs left and the measured throughput (eta_range: a range while a
        confirmation rank waits for its decision): the finished trials', else what the running ones
        have reported so far (`running_progress`); "--:--" (None) before any trial reported; by trial
        counts only for studies that record no FLOPs."""
        if all(s.done for s in statuses.values()):
            return 0.0
        key = tuple(sorted(_counts(statuses).items())) + tuple((s.waiting, s.retries) for s in statuses.values())
        # Before a throughput is measured the counts may stay put for a whole trial, so the work is
        # re-read (no more often than _next_read allows) until a running trial's progress measures one.
        stale = key != self._work_key or self.work is None or self.work.rate is None
        if self.work is None or (stale and self.clock() >= self._next_read):
            began = self.clock()
            try:
                self.work = self.read_work()
                self._work_key = key
            except Exception:  # noqa: BLE001 - a database hiccup costs the display a poll, never the run
                pass
            self._next_read = self.clock() + 9 * (self.clock() - began)  # at most ~10% of the driver's time
        if self.work is None or (self.work.rate is None and any(s.mean_duration_s for s in statuses.values())):
            return eta_s(dict(statuses), self.workers)  # finished trials that record no FLOPs
        return eta_range(self.work, self.workers, self.now())

    def update(self, statuses: Mapping[str, PlanStatus]) -> None:
        elapsed = self.clock() - self.start
        eta = self.eta(statuses)
        if self.bar is not None:
            self.bar.show(statuses, elapsed, eta)
            return
        changed = tuple(sorted(_counts(statuses).items()))
        wait = PLAIN_EVERY_S[0] if self._last is None or changed != self._last[1] else PLAIN_EVERY_S[1]
        if self._last is None or self.clock() - self._last[0] >= wait:
            self._plain(statuses, elapsed, eta, changed)

    def _plain(self, statuses: Mapping[str, PlanStatus], elapsed: float, eta: Eta, key: Any) -> None:
        self.out.write(progress_line(dict(statuses), self.workers, elapsed, eta) + "\n")
        self.out.flush()
        self._last = (self.clock(), key)

    def close(self, statuses: Mapping[str, PlanStatus] | None = None) -> None:
        """The last state (`statuses`, when given) shown, then the bar stopped; idempotent."""
        if statuses is not None:
            if self.bar is not None:
                self.bar.show(statuses, self.clock() - self.start, self.eta(statuses))
            elif self._last is None or self._last[1] != tuple(sorted(_counts(statuses).items())):
                self._plain(statuses, self.clock() - self.start, self.eta(statuses), None)
        if self.bar is not None:
            self.bar.stop()

    def _read_work(self) -> Work:
        work = Work()
        running: list[tuple[float, float, float]] = []
        for queue in self.queues.values():
            upkeep = getattr(queue, "upkeep", None)
            settings = getattr(upkeep, "settings", None) or queue.settings
            never = upkeep.never_filled() if upkeep is not None else frozenset()
            undecided = upkeep.undecided() if upkeep is not None else frozenset()
            rungs = getattr(upkeep, "rungs", None)  # a --ladder budget's trust, once its record is written
            trust = rungs.trust() if rungs is not None else EVERY_RUNG
            trials = queue.study.get_trials(deepcopy=False)
            first = len(work.slots)
            study_work(settings, trials, work, never, undecided, trust)
            planned_costs(settings, work.slots[first:])
            running += running_progress(settings, trials, work.slots[first:], self.now())
        if work.rate is None:  # no trial finished yet: what the running ones trained so far measures it
            for size, flops, seconds in running:
                work.measure(size, flops, seconds)
        return work


def planned_costs(settings: Any, slots: list[SlotWork]) -> None:
    """An IsoFLOP study's slots cost what its plan trains (each architecture's FLOPs per sample times
    its planned samples: within 1% of the study's C), known before any of its trials finished; the
    per-epoch calibration would price each C at another C's samples. `slots` align with its plan."""
    options = settings.options
    if not hasattr(options, "planned_samples"):
        return
    for entry, slot in zip(settings.plan, slots, strict=False):
        arch_idx = _entry(entry, "arch_idx")
        if slot.done or arch_idx is None or int(arch_idx) >= len(settings.archs):
            continue
        arch = settings.archs[int(arch_idx)]
        samples = options.planned_samples(arch)
        if samples and arch.get("flops_per_sample"):
            slot.cost = float(arch["flops_per_sample"]) * samples


def running_progress(settings: Any, trials: list[Any], slots: list[SlotWork],
                     now: dt.datetime) -> list[tuple[float, float, float]]:
    """(budget, FLOPs, seconds) each running trial has trained since its claim: the share of its
    validation intervals it has reported times its slot's cost, over the time since it started (a
    lower bound on its throughput: the last report came before now). The ETA's measurement until a
    trial finishes (a first trial may take most of a run)."""
    out = []
    by_slot = {int(_entry(e, "slot")): slot for e, slot in zip(settings.plan, slots, strict=False)}
    size = float(getattr(settings, "budget_value", 0) or 0)
    for t in trials:
        slot = by_slot.get(int(t.user_attrs.get(Attr.PLAN_SLOT, -1)))
        epochs = (t.params or {}).get("epochs")
        steps = getattr(t, "intermediate_values", None) or {}
        if str(getattr(t.state, "name", t.state)) != "RUNNING" or slot is None or not slot.cost or not epochs or not steps:
            continue
        seconds = (now - t.datetime_start).total_seconds() if t.datetime_start else 0.0
        flops = min(1.0, max(steps) / float(epochs)) * slot.cost - slot.spent
        if flops > 0 and seconds > 0:
            out.append((size, flops, seconds))
    return out


def _entry(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


class _Bar:
    """rich's Progress: a row per study and a row for the whole run (elapsed, ETA)."""

    def __init__(self, console: Any, out: TextIO, clock: Callable[[], float]) -> None:
        from rich.console import Console
        from rich.file_proxy import FileProxy
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console = console or Console(file=out, highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=self.console, auto_refresh=False, get_time=clock,  # drawn on each poll, no thread
        )
        self.tasks: dict[str, Any] = {}
        self.file: TextIO = FileProxy(self.console, out)  # type: ignore[assignment]
        self.started = self.stopped = False

    def show(self, statuses: Mapping[str, PlanStatus], elapsed: float, eta: Eta) -> None:
        if self.stopped:
            return
        if not self.started:
            self.progress.start()
            self.started = True
        width = max(len(n) for n in [*statuses, "all"])
        rows = {n: (s.total, s.final, _study_detail(s)) for n, s in statuses.items()}
        c = _counts(statuses)
        run_detail = f"elapsed {_fmt_eta(elapsed)}  ETA {_fmt_eta(eta)}"
        if len(statuses) > 1:
            rows["all"] = (c["total"], c["final"], run_detail)
        else:
            rows = {n: (t, f, f"{d}  {run_detail}") for n, (t, f, d) in rows.items()}
        for name, (total, final, detail) in rows.items():
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name.ljust(width), total=total, detail="")
            self.progress.update(self.tasks[name], total=total, completed=final, detail=detail)
        self.progress.refresh()

    def stop(self) -> None:
        if self.started and not self.stopped:
            self.progress.stop()
        self.stopped = True


def _study_detail(s: PlanStatus) -> str:
    held = f", {s.held} held at a rung" if s.held else ""
    waits = f"  ({w})" if (w := s.waits_for) else ""
    return f"{s.running} running{held}, {s.failed} failed  best {_best(s)}{waits}"
