"""Domain-name data: encoding rules, the synthetic set, CSV validation and the split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from archhpo.errors import DataError
from archhpo.models.data import domains
from archhpo.models.data.domains import (
    ALPHABET,
    CLS_ID,
    PAD_ID,
    VOCAB_SIZE,
    clean,
    data_info,
    encode,
    generate_synthetic,
    load_data,
    parse_data,
)


def test_alphabet_is_38_characters_plus_two_specials():
    assert len(ALPHABET) == len(set(ALPHABET)) == 38
    assert VOCAB_SIZE == 40 and (PAD_ID, CLS_ID) == (0, 1)
    ids = encode([ALPHABET], 40)  # (1, 40): CLS + every character once + PAD
    assert ids[0, 0] == CLS_ID
    assert ids[0, 1:39].tolist() == list(range(2, 40))
    assert ids[0, 39] == PAD_ID


def test_encoding_lower_cases_drops_dots_and_pads():
    ids = encode(["Ex-Am_ple.CO.uk", "a"], 16)
    assert ids.dtype == torch.int64 and ids.shape == (2, 16)
    assert ids[0].tolist() == encode(["ex-am_plecouk"], 16)[0].tolist()
    assert ids[0, :14].tolist() == [CLS_ID] + [ALPHABET.index(c) + 2 for c in "ex-am_plecouk"]
    assert (ids[0, 14:] == PAD_ID).all()
    assert ids[1].tolist() == [CLS_ID, 2] + [PAD_ID] * 14


def test_encoding_drops_characters_outside_the_alphabet():
    assert clean("Café!  Bar/42.de") == "cafbar42de"
    assert encode(["Café!  Bar/42.de"], 12)[0].tolist() == encode(["cafbar42de"], 12)[0].tolist()
    assert encode(["..."], 4)[0].tolist() == [CLS_ID, PAD_ID, PAD_ID, PAD_ID]


def test_encoding_truncates_to_max_len_counting_cls():
    ids = encode(["abcdefghij"], 5)
    assert ids[0].tolist() == [CLS_ID, 2, 3, 4, 5]
    assert encode([], 7).shape == (0, 7)
    with pytest.raises(ValueError):
        encode(["a"], 0)


def test_synthetic_is_deterministic_balanced_and_has_every_style():
    a = generate_synthetic(400, seed=3)
    assert a == generate_synthetic(400, seed=3)
    assert a[0] != generate_synthetic(400, seed=4)[0]
    texts, labels, styles = a
    assert labels.count(0) == labels.count(1) == 200
    assert set(styles) == {*domains.BENIGN_STYLES, *domains.DGA_STYLES}
    for text, label, style in zip(texts, labels, styles, strict=True):
        assert (label == 0) == (style in domains.BENIGN_STYLES)
        assert any(text.endswith("." + tld) for tld in domains.TLDS)
    word_concat = [t for t, s in zip(texts, styles, strict=True) if s == "word_concat"]
    assert all(len(t.split(".")[0]) >= 9 for t in word_concat)


def test_parse_synthetic_specs():
    assert parse_data("synthetic", {}) == {"kind": "synthetic", "n": 4000, "seed": 0}
    assert parse_data("synthetic:n=500,seed=7", {}) == {"kind": "synthetic", "n": 500, "seed": 7}
    with pytest.raises(DataError, match="Unknown synthetic data option"):
        parse_data("synthetic:rows=5", {})
    with pytest.raises(DataError, match="not an integer"):
        parse_data("synthetic:n=lots", {})
    with pytest.raises(DataError, match="too small"):
        parse_data("synthetic:n=3", {})
    with pytest.raises(DataError, match="empty"):
        parse_data("  ", {})


def test_load_synthetic_split_quick_and_seed():
    spec = parse_data("synthetic:n=300,seed=1", {})
    data = load_data(spec, {"seed": 0})
    assert (data.n_train, data.n_val) == (240, 60)
    (x,) = data.train_inputs
    assert x.shape == (240, 64) and x.dtype == torch.int64 and data.train_target.dtype == torch.int64
    assert (x[:, 0] == CLS_ID).all()
    info = data.info
    assert info["num_classes"] == 2 and info["vocab_size"] == 40 and info["max_len"] == 64
    assert sum(info["class_counts_train"]) == 240 and sum(info["class_counts_val"]) == 60
    assert info["class_counts_train"][0] + info["class_counts_val"][0] == 150
    again = load_data(spec, {"seed": 0})
    assert torch.equal(again.val_inputs[0], data.val_inputs[0])
    assert not torch.equal(load_data(spec, {"seed": 1}).val_inputs[0], data.val_inputs[0])
    assert load_data(spec, {"seed": 1, "val_fraction": 0.5}).n_val == 150
    quick = load_data(parse_data("synthetic", {}), {"quick": True})
    assert quick.n_train + quick.n_val == domains.QUICK_N
    with pytest.raises(DataError, match="val_fraction"):
        load_data(spec, {"val_fraction": 1.0})


def _write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "names.csv"
    path.write_text(body)
    return str(path)


def _rows(n: int, classes: int = 2) -> str:
    return "".join(f"name{i}.example.com,{i % classes}\n" for i in range(n))


def test_csv_round_trip(tmp_path):
    path = _write(tmp_path, "label,text,extra\n" + "".join(f"{i % 3}, Host{i}.Example.com,x\n" for i in range(30)))
    spec = parse_data(path, {})
    assert spec["kind"] == "csv" and spec["num_classes"] == 3 and spec["n_rows"] == 30
    assert data_info(spec, {}) == {"vocab_size": 40, "max_len": 64, "num_classes": 3}
    data = load_data(spec, {"seed": 0})
    assert (data.n_train, data.n_val) == (24, 6)
    assert data.info["class_counts_train"] == torch.bincount(data.train_target, minlength=3).tolist()
    all_ids = torch.cat([data.train_inputs[0], data.val_inputs[0]])
    assert encode([" Host0.Example.com"])[0].tolist() in all_ids.tolist()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("name,label\n" + _rows(30), "lacks column(s) text"),
        ("text,class\n" + _rows(30), "lacks column(s) label"),
        ("text,label\n" + _rows(29) + "bad.com,spam\n", "'spam' on data row 30, which is not an integer"),
        ("text,label\n" + _rows(29) + "bad.com,1.5\n", "not an integer"),
        ("text,label\n" + _rows(10) + ",1\n" + _rows(20), "empty text on data row 11"),
        ("text,label\n" + _rows(30, classes=1), "only one class"),
        ("text,label\n" + _rows(5), "too few"),
        ("text,label\n" + _rows(29) + "neg.com,-1\n", "negative label"),
        ("text,label\n" + "".join(f"n{i}.com,{2 * (i % 2)}\n" for i in range(30)), "never uses class id(s) 1"),
        ("", "could not be read as CSV"),
    ],
)
def test_csv_errors(tmp_path, body, fragment):
    path = _write(tmp_path, body)
    with pytest.raises(DataError) as err:
        parse_data(path, {})
    message = str(err.value)
    assert fragment in message
    assert message.endswith(".") and "\n" not in message  # one sentence


def test_csv_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist; pass an existing CSV path"):
        parse_data(str(tmp_path / "nope.csv"), {})
    with pytest.raises(DataError, match="not a file"):
        parse_data(str(tmp_path), {})


def test_csv_quick_subsamples(tmp_path):
    path = _write(tmp_path, "text,label\n" + _rows(domains.QUICK_N + 100))
    data = load_data(parse_data(path, {}), {"quick": True, "seed": 2})
    assert data.n_train + data.n_val == domains.QUICK_N
