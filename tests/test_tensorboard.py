"""``cocos train --tensorboard`` (cocos.training.hooks.TensorBoardHook): the event files hold the values of
train_log.csv and the checkpoint's history, a resumed run appends (hiding what an interrupted run wrote past its
checkpoint), the setting is recorded (old records lack it: off), and a missing package is one line.

The heartbeat of cocos.progress (a long phase without a bar says where it is) is tested here too."""

from __future__ import annotations

import shutil
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from cocos.data.synth import make_synthetic
from cocos.training.checkpoint import load_checkpoint
from cocos.training.config import TrainConfig, from_record, record_flat
from cocos.training.trainer import Trainer
from cocos_cli.main import app
from tests.helpers import one_error_line

pytest.importorskip("tensorboard", reason="the tensorboard package (cocos[tensorboard]) is not installed")

QUIET = {"progress": False, "log": lambda *a: None}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("syn") / "d", n_train=40, n_dev=20, n_test=20, feature_dim=8,
                          seed=3)


def _cfg(data, out, epochs, **kw):
    return TrainConfig.of(data=str(data), out=str(out), loss="siglip", epochs=epochs, lr=1e-3, lr_update=1,
                          batch_size=50, embed_size=8, word_dim=8, seed=0, device="cpu", tensorboard=True, **kw)


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _check_against_the_logs(folder) -> dict:
    """Every scalar equals its value in train_log.csv / last.pt (float32), each step once."""
    tb, log, last = _scalars(folder), pd.read_csv(folder / "train_log.csv"), load_checkpoint(folder / "last.pt")
    for column in ("loss", "L_con", "L_con/query"):
        steps, values = zip(*tb[f"train/{column}"], strict=True)
        assert list(steps) == list(log["step"]), column  # each step once, in order
        assert list(values) == pytest.approx(list(log[column]), rel=1e-6)
    ends = log.groupby("epoch")["step"].max()
    history = {h["epoch"]: h for h in last["history"]}
    for tag, key in (("dev/rsum", "rsum"), ("dev/i2t_R1", "i2t_R@1"), ("dev/t2i_R1", "t2i_R@1"), ("train/lr", "lr"),
                     ("train/epoch_loss", "loss")):
        assert tb[tag] == [(int(ends[e]), pytest.approx(history[e][key], rel=1e-6)) for e in sorted(history)], tag
    end = int(ends[last["epoch"]])
    for name in ("i2t_R@5", "i2t_R@10", "t2i_R@5", "t2i_R@10"):  # the last epoch's full metrics: last.pt's
        assert tb[f"dev/{name.replace('@', '')}"][-1] == (end, pytest.approx(last["metrics"][name], rel=1e-6))
    for name in ("t", "b"):  # SigLIP learns t and b: their values after the epoch, as the checkpoint holds them
        assert tb[f"loss/{name}"][-1] == (end, pytest.approx(last["loss"]["params"][name], rel=1e-6))
    return tb


def test_event_files_hold_the_logs_values_and_a_resume_appends(tiny, tmp_path):
    straight = tmp_path / "straight"
    Trainer(_cfg(tiny, straight, 2), **QUIET).fit()
    assert list((straight / "tensorboard").glob("events.out.tfevents.*"))
    whole = _check_against_the_logs(straight)
    assert load_checkpoint(straight / "last.pt")["train"]["hooks"]["tensorboard"] is True

    run, saved = tmp_path / "run", tmp_path / "epoch1"
    Trainer(_cfg(tiny, run, 1), **QUIET).fit()
    shutil.copytree(run, saved, ignore=shutil.ignore_patterns("tensorboard"))
    Trainer(_cfg(tiny, run, 2), resume=True, **QUIET).fit()
    # as if epoch 2 had been interrupted after its events were written: last.pt and the log of epoch 1 again
    for name in ("last.pt", "train_log.csv"):
        shutil.copy(saved / name, run / name)
    Trainer(_cfg(tiny, run, 2), resume=True, **QUIET).fit()
    resumed = _check_against_the_logs(run)  # epoch 2's first events hidden (purge_step): each step once
    assert resumed.keys() == whole.keys()
    for tag in whole:  # the same values as the uninterrupted run (a resume is bit-identical)
        assert resumed[tag] == whole[tag], tag
    # the run started over without --tensorboard: the earlier run's events go with its other files
    (straight / "tensorboard" / "notes.txt").write_text("mine")  # a file of the user's: the folder stays
    Trainer(TrainConfig.of(**{**_cfg(tiny, straight, 1).flat(), "tensorboard": False}), overwrite=True, **QUIET).fit()
    assert [p.name for p in (straight / "tensorboard").iterdir()] == ["notes.txt"]
    (straight / "tensorboard" / "notes.txt").unlink()
    Trainer(_cfg(tiny, straight, 1), **QUIET, overwrite=True).fit()  # events of this run only
    Trainer(TrainConfig.of(**{**_cfg(tiny, straight, 1).flat(), "tensorboard": False}), overwrite=True, **QUIET).fit()
    assert not (straight / "tensorboard").exists()


def test_the_setting_is_recorded_and_old_records_read_it_as_off(tiny, tmp_path):
    cfg = _cfg(tiny, tmp_path / "x", 1)
    assert cfg.hooks.tensorboard is True and cfg.flat()["tensorboard"] is True
    assert from_record(cfg.record()).hooks.tensorboard is True
    plain = TrainConfig.of(data=str(tiny), out=str(tmp_path / "y"))
    assert "tensorboard" not in plain.flat()  # an added setting appears where it is not its default
    old = plain.record()
    del old["hooks"]["tensorboard"]  # a record of an earlier version
    assert from_record(old).hooks.tensorboard is False and record_flat(old)["tensorboard"] is False
    assert record_flat(plain.flat())["tensorboard"] is False  # an earlier version's flat record


def test_a_missing_package_is_one_line_before_anything_is_written(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    res = CliRunner().invoke(app, ["train", "--data", str(tiny), "--out", str(tmp_path / "r"), "--epochs", "1",
                                   "--tensorboard", "--no-progress"])
    assert "--tensorboard needs the tensorboard package: pip install tensorboard" in one_error_line(res)
    assert not (tmp_path / "r").exists()


def test_a_long_phase_without_a_bar_says_where_it_is_at_most_once_a_minute():
    from cocos.progress import Heartbeat, progress_bar

    now, lines = [0.0], []
    beat = Heartbeat(10, "encoding train", lines.append, clock=lambda: now[0])
    for t in (10, 59, 61, 62, 100, 125):
        now[0] = float(t)
        beat.advance(1, status=f"loss {t}")
    assert lines == ["encoding train: 3/10 (30%) after 61 s; loss 61",
                     "encoding train: 6/10 (60%) after 125 s; loss 125"]
    quick = []
    with progress_bar(3, "quick", enabled=False, log=quick.append) as advance:
        for _ in range(3):
            advance()
    assert quick == []  # a phase shorter than a minute prints nothing
    with progress_bar(2, "every", enabled=False, log=quick.append, every=0) as advance:
        advance(2)
    assert quick[0].startswith("every: 2/2 (100%) after ")
