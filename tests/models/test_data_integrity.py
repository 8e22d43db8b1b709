"""Data integrity for every family: a data file is pinned by its sha256 when the
study is launched, and a worker whose copy differs refuses it, for every family's file format
(PatchTST time series, FT-/CSN-Transformer panels, char_cls text CSVs, lm text files; signal reads no files)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from optuna.trial import TrialState

from archhpo.errors import DataError
from archhpo.models import get_family
from archhpo.search import TrialQueue, launch, prepare_settings
from archhpo.workers import Worker
from tests.models.test_data_panel import _time_panel
from tests.models.test_data_timeseries import price_table, write_table_csv


def _series(tmp: Path) -> Path:
    return write_table_csv(tmp / "series.csv", price_table(120))


def _panel(tmp: Path) -> Path:
    return _time_panel(tmp / "panel.csv", symbols=4, steps=60)


def _names(tmp: Path) -> Path:
    path = tmp / "names.csv"
    path.write_text("text,label\n" + "".join(f"host{i}.example.com,{i % 2}\n" for i in range(80)))
    return path


def _text(tmp: Path) -> Path:
    path = tmp / "corpus.txt"
    path.write_text("".join(f"sentence {i} of a small UTF-8 corpus, naïve café\n" for i in range(40)))
    return path


FILES: dict[str, tuple[Callable[[Path], Path], dict]] = {
    "patchtst": (_series, {"context_length": 5, "horizon": 1, "threshold": 0.0}),
    "ft_transformer": (_panel, {"seq_len": 5}),
    "csn_transformer": (_panel, {"seq_len": 5}),
    "char_cls": (_names, {}),
    "lm": (_text, {"seq_len": 16}),
}


def _flip_one_byte(path: Path) -> None:
    """A change a glance would miss: one digit of the last row."""
    text = path.read_text()
    i = max(i for i, ch in enumerate(text) if ch.isdigit())
    path.write_text(text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1:])


@pytest.mark.parametrize("family", list(FILES))
def test_a_changed_file_is_refused_by_the_loader(family: str, tmp_path: Path) -> None:
    fam = get_family(family)
    make, options = FILES[family]
    path = make(tmp_path)
    spec = fam.parse_data(str(path), options)
    assert len(spec["sha256"]) == 64, "the spec pins the file's content"
    fam.load_data(spec, options)  # the same file loads
    _flip_one_byte(path)
    with pytest.raises(DataError, match="has changed since the study recorded it"):
        fam.load_data(spec, options)


def test_signal_reads_no_files(tmp_path: Path) -> None:
    path = _names(tmp_path)
    with pytest.raises(DataError, match="embedded data"):
        get_family("signal").parse_data(str(path), {})


def test_a_worker_refuses_a_changed_char_cls_file(sqlite_url: str, tmp_path: Path) -> None:
    path = _names(tmp_path)
    url = sqlite_url
    s = prepare_settings("integrity", "150K", family="char_cls", n_trials=4, data=str(path), quick=True,
                         pruner="none")
    assert s.data["sha256"]
    launch(url, dataclasses.replace(s, plan=s.plan[:1]))
    _flip_one_byte(path)
    q = TrialQueue(url, s.study_name)
    summary = Worker([q], device="cpu", threads=1).run()
    (trial,) = q.storage.get_all_trials(q.study_id)
    assert summary.failed == 1 and trial.state == TrialState.FAIL
    assert "has changed since the study recorded it" in trial.user_attrs["fail_reason"]
