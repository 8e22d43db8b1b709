"""Token files for the lm family (--data tokens:PATH): the formats and their dtypes, the windows they
give, the checks at launch and per batch (one sentence each), the fingerprint that pins them, and
`archhpo tokens`, which writes a text file's bytes as one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from archhpo.cli._main import main
from archhpo.errors import ArchhpoError, DataError
from archhpo.models import get_family
from archhpo.models.data import file_fingerprint
from archhpo.models.data import tokens as tk
from archhpo.search import launch, prepare_settings

FAM = get_family("lm")
OPTIONS = {"seq_len": 16}
CPU = torch.device("cpu")


def _text(tmp: Path) -> Path:
    path = tmp / "corpus.txt"
    path.write_text("".join(f"line {i} of a small UTF-8 corpus, naïve café\n" for i in range(60)))
    return path


def _ids(tmp: Path, ids: np.ndarray, name: str = "train.bin") -> Path:
    path = tmp / name
    ids.astype("<u2").tofile(path)
    return path


def _sparse(tmp: Path, n_tokens: int, bad_at: int | None = None, vocab: int = 256) -> Path:
    """A uint16 token file of `n_tokens` that costs no disk: zeros, random ids at its start, and one
    id equal to `vocab` at `bad_at`."""
    path = tmp / "big.bin"
    with path.open("wb") as fh:
        fh.truncate(2 * n_tokens)
        fh.write(np.random.default_rng(0).integers(0, vocab, 4096, dtype="<u2").tobytes())
        if bad_at is not None:
            fh.seek(2 * bad_at)
            fh.write(np.array([vocab], dtype="<u2").tobytes())
    return path


def test_archhpo_tokens_writes_the_bytes_a_text_file_trains_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _text(tmp_path)
    out = tmp_path / "train.bin"
    assert main(["tokens", str(text), str(out)]) == 0
    assert f"--data tokens:{out},vocab=256" in capsys.readouterr().out
    raw = text.read_bytes()
    assert np.fromfile(out, dtype="<u2").tolist() == list(raw)
    as_text = FAM.load_data(FAM.parse_data(str(text), OPTIONS), OPTIONS)
    spec = FAM.parse_data(f"tokens:{out},vocab=256", OPTIONS)
    as_tokens = FAM.load_data(spec, OPTIONS)
    assert spec["kind"] == "tokens" and spec["n_tokens"] == len(raw) and spec["dtype"] == "uint16"
    assert FAM.data_info(spec, OPTIONS)["vocab_size"] == 256
    idx = torch.arange(as_text.n_train)
    assert as_tokens.n_train == as_text.n_train and as_tokens.n_val == as_text.n_val
    for d in (as_tokens, as_text):
        assert all(t.dtype == torch.int64 for t in (*d.train_batch(idx, CPU)[0], *d.val_batch(0, d.n_val, CPU)[0]))
    (x, *_), y = as_tokens.train_batch(idx, CPU)
    (tx, *_), ty = as_text.train_batch(idx, CPU)
    (vx, *_), vy = as_tokens.val_batch(0, as_tokens.n_val, CPU)
    (tvx, *_), tvy = as_text.val_batch(0, as_text.n_val, CPU)
    assert torch.equal(x, tx) and torch.equal(y, ty) and torch.equal(vx, tvx) and torch.equal(vy, tvy)
    assert FAM.baseline_loss(as_tokens) == FAM.baseline_loss(as_text)


def test_archhpo_tokens_refuses_a_file_that_is_not_utf8_and_writes_nothing(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine so far \xff\xfe")
    assert main(["tokens", str(bad), str(tmp_path / "out.bin")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"archhpo: error: Text file {bad} is not UTF-8 (near byte 12); save it as UTF-8."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


def test_a_npy_file_gives_its_dtype_and_a_bin_file_takes_the_dtype_key(tmp_path: Path) -> None:
    ids = np.random.default_rng(1).integers(0, 70_000, 400).astype(np.uint32)
    np.save(tmp_path / "ids.npy", ids)
    ids.astype("<u4").tofile(tmp_path / "ids32.bin")
    from_npy = FAM.parse_data(f"tokens:{tmp_path / 'ids.npy'},vocab=70000", OPTIONS)
    from_bin = FAM.parse_data(f"tokens:{tmp_path / 'ids32.bin'},vocab=70000,dtype=uint32", OPTIONS)
    assert from_npy["dtype"] == from_bin["dtype"] == "uint32" and from_npy["n_tokens"] == from_bin["n_tokens"] == 400
    a, b = (FAM.load_data(s, OPTIONS) for s in (from_npy, from_bin))
    idx = torch.tensor([0, 5, a.n_train - 1])
    assert torch.equal(a.train_batch(idx, CPU)[1], b.train_batch(idx, CPU)[1])
    assert a.train_batch(idx, CPU)[1][0].tolist() == ids[1:17].tolist()
    with pytest.raises(DataError, match=r"dtype=uint16 in --data .* disagrees with .*ids.npy's header \(uint32\)"):
        FAM.parse_data(f"tokens:{tmp_path / 'ids.npy'},vocab=70000,dtype=uint16", OPTIONS)


def test_a_val_file_validates_and_the_training_file_trains_whole(tmp_path: Path) -> None:
    train = _ids(tmp_path, np.arange(1000) % 250)
    val = _ids(tmp_path, (np.arange(330) * 7) % 250, "val.bin")
    spec = FAM.parse_data(f"tokens:{train},vocab=250,val={val}", OPTIONS)
    assert spec["val"]["path"] == str(val) and spec["val"]["fingerprint"] == file_fingerprint(val)
    data = FAM.load_data(spec, OPTIONS)
    assert data.n_train == (1000 - 1) // 16 and data.n_val == (330 - 1) // 16
    assert data.val_batch(0, 1, CPU)[0][0][0].tolist() == ((np.arange(16) * 7) % 250).tolist()


def test_the_tail_holds_at_most_the_fixed_validation_set_of_evenly_spaced_windows(tmp_path: Path) -> None:
    n = 1_000_000  # a tail of 100,000 tokens: more windows than the fixed set holds
    path = _ids(tmp_path, np.arange(n) % 256)
    data = FAM.load_data(FAM.parse_data(f"tokens:{path},vocab=256", OPTIONS), OPTIONS)
    cut = round(n * 0.9)
    assert data.n_train == (cut - 1) // 16
    assert data.n_val == tk.BUDGET_VAL_TOKENS // 16
    windows = (n - cut - 1) // 16  # windows of the tail at stride 16
    starts = cut + np.linspace(0, windows - 1, data.n_val).round().astype(np.int64) * 16
    assert data.val_batch(0, data.n_val, CPU)[1][:, 0].tolist() == ((starts + 1) % 256).tolist()


@pytest.mark.parametrize(("make", "data", "message"), [
    (lambda t: t / "missing.bin", "tokens:{p}", "Token file {p} does not exist or is not a file; pass nanoGPT's "
     "train.bin (flat uint16 ids) or a .npy, e.g. --data 'tokens:train.bin,vocab=50257,val=val.bin'."),
    (lambda t: _raw(t, b"\0" * 1001), "tokens:{p}", "Token file {p} has 1,001 bytes, not a whole number of uint16 "
     "ids (2 bytes each); check the dtype key (uint16 or uint32) or write the file again."),
    (lambda t: _raw(t, b"\0" * 1002), "tokens:{p},dtype=uint32", "Token file {p} has 1,002 bytes, not a whole "
     "number of uint32 ids (4 bytes each); check the dtype key (uint16 or uint32) or write the file again."),
    (lambda t: _ids(t, np.zeros(100)), "tokens:{p},vocab=256", "Token file {p} has 100 tokens, too few for a "
     "training and a validation window of 17 tokens; use at least 171 tokens or a smaller --seq-len."),
    (lambda t: _ids(t, np.arange(500)), "tokens:{p},vocab=300", "Token file {p} holds id 300 at token 300 (in the "
     "sample read at launch), not below vocab=300; pass the tokenizer's vocabulary as vocab=V in --data."),
    (lambda t: _ids(t, np.zeros(500)), "tokens:{p},vocab=70000", "vocab=70,000 does not fit uint16 ids (at most "
     "65,536); store the ids as uint32 and pass dtype=uint32."),
    (lambda t: _ids(t, np.zeros(500)), "tokens:{p},vocab=256,size=3", "Cannot read 'size=3' in --data "
     "'tokens:{p},vocab=256,size=3'; write e.g. 'tokens:train.bin,vocab=50257,val=val.bin' (keys: vocab, val, dtype)."),
])
def test_a_bad_token_file_is_refused_at_launch_with_one_sentence(tmp_path: Path, make, data: str, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(DataError) as info:
        FAM.parse_data(data.format(p=path), OPTIONS)
    assert str(info.value) == message.format(p=path)


def _raw(tmp: Path, content: bytes) -> Path:
    path = tmp / "raw.bin"
    path.write_bytes(content)
    return path


def test_the_command_line_refuses_a_bad_token_file_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _raw(tmp_path, b"\0" * 1001)
    code = main(["train", "--family", "lm", "--data", f"tokens:{path}", "--d-model", "32", "--n-layers", "1",
                 "--n-heads", "2", "--d-ff", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a whole number of uint16 ids" in err[0]


def test_an_id_the_launch_sample_missed_fails_the_batch_that_gathers_it(tmp_path: Path) -> None:
    n = 4 * tk.SAMPLE_BLOCKS * tk.SAMPLE_TOKENS  # four times the sample: most of the file is not read at launch
    bad = tk.sample_spans(0, n)[1][1] + 1000  # between the second and the third block read at launch
    assert not any(a <= bad < b for a, b in tk.sample_spans(0, n))
    path = _sparse(tmp_path, n, bad_at=bad)
    spec = FAM.parse_data(f"tokens:{path},vocab=256", OPTIONS)  # the launch sample does not see it
    data = FAM.load_data(spec, OPTIONS)
    ok = torch.tensor([0, 1, 2])
    assert data.train_batch(ok, CPU)[0][0].shape == (3, 16)
    window = torch.tensor([0, bad // 16])
    with pytest.raises(DataError) as info:
        data.train_batch(window, CPU)
    assert str(info.value) == (f"Token file {path} holds id 256 at token {bad:,} (in a training batch), not below "
                               "vocab=256; pass the tokenizer's vocabulary as vocab=V in --data.")


def test_a_token_dataset_stays_on_the_host(tmp_path: Path) -> None:
    path = _sparse(tmp_path, 1 << 20)
    data = FAM.load_data(FAM.parse_data(f"tokens:{path},vocab=256", OPTIONS), OPTIONS)
    assert data.to("cpu") is data and data.device_bytes("cuda") == 0
    assert data.index_device(torch.device("cuda")) == CPU  # the trainer's indices stay with the data
    (x,), y = data.train_batch(torch.tensor([0]), CPU)
    assert x.dtype == y.dtype == torch.int64 and torch.equal(x[0, 1:], y[0, :-1])


def test_a_changed_token_file_is_refused_by_the_loader(tmp_path: Path) -> None:
    path = _sparse(tmp_path, 1 << 20)
    spec = FAM.parse_data(f"tokens:{path},vocab=256", OPTIONS)
    FAM.load_data(spec, OPTIONS)
    with path.open("r+b") as fh:  # one id in the file's last MiB
        fh.seek(path.stat().st_size - 2)
        fh.write(np.array([7], dtype="<u2").tobytes())
    with pytest.raises(DataError, match=f"Data file {path} has changed since the study recorded it"):
        FAM.load_data(spec, OPTIONS)


def test_the_fingerprint_reads_blocks_spread_over_a_large_file(tmp_path: Path) -> None:
    path = _sparse(tmp_path, 1 << 26)  # 128 MiB, sparse
    before = file_fingerprint(path)
    with path.open("r+b") as fh:  # a change in the middle, inside one of the evenly spaced blocks
        size = path.stat().st_size
        inner = size - 2 * (1 << 20) - (1 << 16)
        fh.seek((1 << 20) + inner * 31 // 61 + 10)
        fh.write(b"\1")
    assert file_fingerprint(path) != before
    assert len(before) == 64


def test_relaunching_a_study_on_a_changed_token_file_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    path = _sparse(tmp_path, 1 << 20)
    data = f"tokens:{path},vocab=256"
    settings = prepare_settings("tokens", "150K", family="lm", n_trials=2, data=data, quick=True, pruner="none")
    launch(sqlite_url, dataclasses.replace(settings, plan=settings.plan[:1]))
    with path.open("r+b") as fh:
        fh.write(b"\7\0")
    again = prepare_settings("tokens", "150K", family="lm", n_trials=2, data=data, quick=True, pruner="none")
    with pytest.raises(ArchhpoError) as info:
        launch(sqlite_url, dataclasses.replace(again, plan=again.plan[:1]))
    assert str(info.value).startswith("Study 'tokens_150K' already exists with different settings "
                                      "(data.fingerprint: stored '")


def test_a_token_file_study_reports_its_loss_per_token() -> None:
    from archhpo.models.lm_spec import loss_per

    assert (loss_per("tokens"), loss_per("text"), loss_per("synthetic")) == ("token", "byte", "token")
