"""CSV and best-config JSON (docs/design.md §8), written atomically from the database alone."""

from __future__ import annotations

import collections
import contextlib
import csv
import datetime as dt
import fcntl
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from archhpo._io import atomic_write
from archhpo.errors import DiskFull
from archhpo.report._columns import SPEED_COLUMNS
from archhpo.report._confirm import CHOSEN_ON_MEAN, CHOSEN_ON_TRIAL, confirmation_summary, paired_summary
from archhpo.report._truth import TRUTH_KEYS
from archhpo.schema import ARCH_RECORD, TRAINING_PARAMS, Attr
from archhpo.search._space import PARAM_NAMES
from archhpo.search._study import StudySettings, experiment_studies, load_study

SPEC_COLUMNS = (
    "experiment", "trial", "budget", "horizon", *ARCH_RECORD, *TRAINING_PARAMS, "val_loss", "train_loss",
    "duration_s", "timestamp",
)
# The data a trial trained on (--tokens-per-param studies; train_tokens for every token family).
DATA_COLUMNS = (Attr.TRAIN_TOKENS, Attr.TOKENS_PER_PARAM)
# An IsoFLOP trial's compute budget C and its size's position (--isoflop: search/_isoflop_study.py).
ISOFLOP_COLUMNS = ("compute_budget", "isoflop_size")
# The data's known truth (a synthetic language's entropy rate and loss floor, from the study's data
# info; empty for other data), so that a report read from the CSV checks E against the same floor.
# Appended after docs/design.md §8's columns (which stay first and unchanged); readers must cope without them.
EXTRA_COLUMNS = (
    "state", "phase", "plan_slot", "seed", "family", "choices", "best_epoch", "flops_per_sample",
    "train_flops", "samples_per_s", "val_curve", "baseline_val_loss", Attr.RUNG, Attr.RUNG_SCORES, Attr.FLOPS_SPENT,
    Attr.FLOPS_FULL, Attr.CONFIRM_RUNG,
    Attr.BASELINE, Attr.LR_PROBE, Attr.TRAIN_SAMPLES, Attr.SAMPLES_PER_PARAM, Attr.DATA_PASSES, *ISOFLOP_COLUMNS,
    *TRUTH_KEYS, *SPEED_COLUMNS,
)
# Then each family metric a trial recorded (``val_accuracy``, ...), sorted by name.
CSV_COLUMNS = SPEC_COLUMNS + DATA_COLUMNS + EXTRA_COLUMNS
RESULTS_CSV = "experiment_results.csv"


def _iso(t: dt.datetime | None) -> str:
    if t is None:
        return ""
    return t.astimezone(dt.UTC).isoformat()  # Optuna returns naive local time


def _val_loss(t: FrozenTrial) -> float | None:
    if t.value is not None:  # COMPLETE; or PRUNED: its best loss, or its score at a halving rung
        return t.value
    inter = [v for v in t.intermediate_values.values() if v == v]
    return min(inter) if inter else None  # a pruned trial without a value: the best loss it reached


def finished_trials(study: optuna.Study) -> list[FrozenTrial]:
    """COMPLETE and PRUNED trials (the ones with a validation loss), by trial number."""
    states = (TrialState.COMPLETE, TrialState.PRUNED)
    return sorted(study.get_trials(deepcopy=False, states=states), key=lambda t: t.number)


def _family_metrics(attrs: dict[str, Any]) -> dict[str, Any]:
    """The family's own metrics of a trial (``val_<name>`` numbers), so a report read from the
    CSV shows the same family-metrics table as one read from the database."""
    return {k: v for k, v in attrs.items() if k.startswith("val_") and k not in ("val_loss", "val_curve")
            and isinstance(v, int | float) and not isinstance(v, bool)}


def result_rows(study: optuna.Study, settings: StudySettings) -> list[dict[str, Any]]:
    rows = []
    for t in finished_trials(study):
        arch = settings.archs[int(t.params["arch_idx"])]
        row = {
            "experiment": settings.experiment, "trial": t.number, "budget": settings.budget,
            "horizon": settings.options.horizon,
            **{k: arch[k] for k in ARCH_RECORD},
            **{k: t.params.get(k) for k in PARAM_NAMES[1:]},
            "val_loss": _val_loss(t), "train_loss": t.user_attrs.get(Attr.TRAIN_LOSS, ""),
            "duration_s": t.user_attrs.get(Attr.DURATION_S, ""), "timestamp": _iso(t.datetime_complete),
            "state": t.state.name, "phase": t.user_attrs.get(Attr.PHASE), "plan_slot": t.user_attrs.get(Attr.PLAN_SLOT),
            "seed": t.user_attrs.get(Attr.SEED), "family": settings.family,
            "choices": json.dumps(arch.get("choices") or {}, sort_keys=True),
            **{k: t.user_attrs.get(k) for k in ("best_epoch", "flops_per_sample", "train_flops", "samples_per_s")},
            "val_curve": json.dumps([[int(step), v] for step, v in sorted(t.intermediate_values.items())]),
            "baseline_val_loss": t.user_attrs.get(Attr.BASELINE_VAL_LOSS),
            **{k: t.user_attrs.get(k) for k in (Attr.RUNG, Attr.FLOPS_SPENT, Attr.FLOPS_FULL, Attr.BASELINE)},
            Attr.RUNG_SCORES: json.dumps([float(v) for v in t.user_attrs.get(Attr.RUNG_SCORES) or []]),
            Attr.CONFIRM_RUNG: t.user_attrs.get(Attr.CONFIRM_RUNG),
            **{k: t.user_attrs.get(k) for k in (*DATA_COLUMNS, Attr.TRAIN_SAMPLES, Attr.SAMPLES_PER_PARAM,
                                                Attr.DATA_PASSES, *SPEED_COLUMNS, Attr.LR_PROBE, *ISOFLOP_COLUMNS)},
            **{k: settings.info.get(k) for k in TRUTH_KEYS},
            **_family_metrics(t.user_attrs),
        }
        rows.append(row)
    return rows


def csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    metrics = sorted({k for row in rows for k in row if k not in CSV_COLUMNS})
    columns = [*CSV_COLUMNS, *metrics]
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return buf.getvalue()


def _answer(complete: list[FrozenTrial], confirmation: dict[str, Any] | None) -> FrozenTrial | None:
    """The budget's answer: the best of phases 1-2 (and of a paired study's trials; confirmation
    retrains re-measure, they do not compete), or, where the confirmation chose the winner on its
    means (`chosen_on_means`), that architecture's best phase-1/2 trial."""
    answer = [t for t in complete if t.user_attrs.get(Attr.PHASE) != 3]
    chosen = (confirmation or {}).get("chosen")
    if chosen:
        trial = chosen["trials"][str(chosen["rank"])]
        picked = [t for t in answer if t.number == trial]
        if picked:
            return picked[0]
    return min(answer, key=lambda t: (t.value, t.number)) if answer else None


def best_summary(study: optuna.Study, settings: StudySettings) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
    confirmation = confirmation_summary(trials, settings.archs, settings.phase3) if any(e.phase == 3 for e in settings.plan) else None
    best = _answer(complete, confirmation)
    arch = settings.archs[int(best.params["arch_idx"])] if best else None
    summary: dict[str, Any] = {
        "experiment": settings.experiment,
        "budget": settings.budget,
        "best_params": {k: best.params[k] for k in PARAM_NAMES} if best else None,
        "best_value": best.value if best else None,
        "n_trials_completed": len(complete),
        "n_trials_pruned": sum(t.state == TrialState.PRUNED for t in trials),
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "study_name": settings.study_name,
        "optuna_version": optuna.__version__,
        "architecture": (
            {k: arch[k] for k in ARCH_RECORD} if arch else None
        ),
        # Beyond docs/design.md §8: what a reader needs to judge and reproduce the winner.
        "family": settings.family,
        "best_trial": best.number if best else None,
        "plan_slot": best.user_attrs.get(Attr.PLAN_SLOT) if best else None,
        "n_trials_failed": sum(t.state == TrialState.FAIL and "fail_reason" in t.user_attrs for t in trials),
        "n_trials_planned": len(settings.plan),
        "baseline_val_loss": best.user_attrs.get(Attr.BASELINE_VAL_LOSS) if best else None,
        "data": {k: v for k, v in settings.data.items() if k != "sha256"},
        "options": settings.options.as_dict(),
        "info": settings.info,
        "choices": dict(arch.get("choices") or {}) if arch else {},  # the winner's categorical choices
        "seed": best.user_attrs.get(Attr.SEED) if best else None,  # the winner's paired/confirmation seed
    }
    summary.update(flops_summary(trials))
    if confirmation is not None:
        summary["confirmation"] = confirmation
        summary.update(_choice(confirmation, best))
    if settings.options.paired_seeds:
        summary["paired"] = paired_summary(trials, settings.archs)
    return summary


def _choice(confirmation: dict[str, Any], best: FrozenTrial | None) -> dict[str, Any]:
    """How a confirmed study's winner was chosen: "chosen_on" (CHOSEN_ON_MEAN, or CHOSEN_ON_TRIAL while
    no paired means decide) and "reverses_trial", the phase-1/2 best the means displaced (else None)."""
    chosen = confirmation.get("chosen")
    if not chosen or best is None or best.number != chosen["trials"][str(chosen["rank"])]:
        return {"chosen_on": CHOSEN_ON_TRIAL if best is not None else None, "reverses_trial": None}
    return {"chosen_on": CHOSEN_ON_MEAN, "reverses_trial": chosen["trials"]["0"] if chosen["reversed"] else None}


def flops_summary(trials: list[FrozenTrial]) -> dict[str, int | None]:
    """The study's FLOPs against those of training every planned trial to the end once (what
    successive halving saves): every trial's flops_spent (all its claims, cooldown branches and
    failed or pruned work included) and, per plan slot, the full-length cost of its trial."""
    spent = [int(t.user_attrs[Attr.FLOPS_SPENT]) for t in trials if Attr.FLOPS_SPENT in t.user_attrs]
    full: dict[Any, int] = {}
    for t in trials:
        if Attr.FLOPS_FULL in t.user_attrs:
            full[t.user_attrs.get(Attr.PLAN_SLOT, f"trial {t.number}")] = int(t.user_attrs[Attr.FLOPS_FULL])
    return {"flops_spent": sum(spent) if spent else None, "flops_full_plan": sum(full.values()) if full else None}


def best_path(out_dir: Path, settings: StudySettings) -> Path:
    """{experiment}_{budget}_best.json; a pinned study's label stands for the budget
    ({experiment}_d64-L3-h4-ff256_best.json)."""
    return out_dir / f"{settings.experiment}_{settings.budget}_best.json"


_STUDIES: collections.OrderedDict[tuple[int, str], tuple[RDBStorage, optuna.Study]] = collections.OrderedDict()


def _loaded_study(storage: RDBStorage, name: str) -> optuna.Study:
    """The same Study object for repeated exports (the driver exports whenever a trial finishes):
    Optuna's caching storage then reads only trials that are new or were unfinished, not the
    whole study each time.  A few (storage, study) pairs are kept, the least recently used dropped."""
    key = (id(storage), name)
    hit = _STUDIES.get(key)
    if hit is not None and hit[0] is storage:
        _STUDIES.move_to_end(key)
        return hit[1]
    study = load_study(storage, name)
    _STUDIES[key] = (storage, study)
    while len(_STUDIES) > 8:
        _STUDIES.popitem(last=False)
    return study


def export_studies(storage: RDBStorage, names: list[str], out_dir: Path) -> list[Path]:
    """Write one best JSON per given study and the folder's CSV.

    The CSV holds every study of the given studies' experiments, rewritten from the database (so
    `export --budget 200K` of a multi-budget experiment refreshes that budget's rows and keeps the
    others'), after the rows of every other experiment exported into the same folder, kept as
    they were written (`other_experiments_rows`)."""
    settings = {}
    written = []
    for name in names:
        study = _loaded_study(storage, name)
        settings[name] = StudySettings.from_attrs(study.user_attrs, name)
        path = best_path(out_dir, settings[name])
        _write(path, json.dumps(best_summary(study, settings[name]), indent=2) + "\n")
        written.append(path)
    everything = list(names)
    for experiment in dict.fromkeys(s.experiment for s in settings.values()):
        everything += [n for n in experiment_studies(storage, experiment) if n not in everything]
    rows: list[dict[str, Any]] = []
    for name in everything:
        study = _loaded_study(storage, name)
        rows.extend(result_rows(study, settings.get(name) or StudySettings.from_attrs(study.user_attrs, name)))
    csv_path = out_dir / RESULTS_CSV
    ours = {str(s.experiment) for s in settings.values()}
    with _folder_lock(out_dir):  # two experiments exporting into one folder at once: neither loses rows
        _write(csv_path, csv_text([*other_experiments_rows(csv_path, ours), *rows]))
    return [csv_path, *written]


def _write(path: Path, text: str) -> None:
    """One results file, whole or not at all; a write that fails for lack of space raises DiskFull
    (its one sentence names the folder: `run` stops as on Ctrl-C, `export` exits 2)."""
    try:
        atomic_write(path, text)
    except OSError as exc:
        full = DiskFull.of(exc, path.parent, len(text.encode("utf-8")))
        if full is None:
            raise
        raise full from None


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on the folder itself (no lock file left behind), held across the CSV's
    read, merge and rewrite."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def other_experiments_rows(path: Path, experiments: set[str]) -> list[dict[str, str]]:
    """The rows of `path` (an experiment_results.csv) that belong to experiments other than
    `experiments`, as written: the CSV holds every experiment exported into its folder, and each
    export rewrites only its own experiments' rows from the database.  A file that is missing or
    not an archhpo CSV (no `experiment` column) keeps nothing."""
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if "experiment" not in (reader.fieldnames or ()):
                return []
            return [row for row in reader if row.get("experiment") not in experiments]
    except FileNotFoundError:
        return []
