"""``cocos train`` on every failure path: a full disk at any write, a second writer of the same run folder, flags out
of range. The contract (:mod:`cocos.training.trainer`): a failed run leaves either nothing or a resumable run folder,
marked (``.cocos-train``), that ``--resume`` finishes to a result byte-identical to an uninterrupted run; each
failure is one ``error:`` line and exit code 2.

A full disk is simulated where it strikes: the write of a file's temporary runs out of space (``OSError(ENOSPC)``)
inside :func:`cocos.io.atomic_path`, the one writer of checkpoints, logs, the marker and the figures. (A full disk at
the first ``train_log.csv``, an error after a saved epoch and Ctrl-C are in ``tests/test_train_hardening.py``.) Figures are written as a few bytes here
(matplotlib's rendering is not what is tested, and it would be most of the time).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import matplotlib.figure
import pytest
from typer.testing import CliRunner

import cocos.io
import cocos.report.style
from cocos.data.synth import make_synthetic
from cocos.errors import CocosError
from cocos.io import check_output_dir
from cocos.training.trainer import RUN_MARKER, Trainer
from cocos_cli.main import app
from tests.helpers import one_error_line, snapshot

runner = CliRunner()
FLAGS = ["--loss", "triplet", "--lr", "2e-3", "--lr-update", "10", "--batch-size", "16", "--embed-size", "16",
         "--word-dim", "8", "--epochs", "2", "--no-progress"]
KEPT = ("last.pt", "model_best.pt", "train_log.csv")  # what a finished run's result is


def _quick_figures(mp) -> None:
    mp.setattr(matplotlib.figure.Figure, "savefig", lambda self, fh, format=None, **kw: fh.write(b"figure"))


@pytest.fixture(autouse=True)
def quick_figures(monkeypatch):
    _quick_figures(monkeypatch)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny data, and an uninterrupted run's files (``--out run`` from its own folder: the recorded ``out`` is the
    same relative name in every run here, so the checkpoints of equal runs are equal byte for byte)."""
    root = tmp_path_factory.mktemp("cleanup")
    data = make_synthetic(root / "data", n_train=48, n_dev=16, n_test=16, feature_dim=16, seed=1)
    (root / "ref").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root / "ref")
        _quick_figures(mp)
        res = _train(data)
    assert res.exit_code == 0, res.output
    return data, {name: (root / "ref" / "run" / name).read_bytes() for name in KEPT}


def _train(data, *extra):
    return runner.invoke(app, ["train", "--data", str(data), "--out", "run", *FLAGS, *extra])


def _error_line(res) -> str:
    """A failed run: exit code 2 and one ``error:`` line, the last (epoch lines before it are progress)."""
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], res.output
    assert "Traceback" not in res.output
    return lines[-1]


def _disk_full_at(monkeypatch, name: str, nth: int = 1) -> list:
    """The ``nth`` write of the file ``name`` runs out of space; returns the list of writes that failed."""
    real, seen, failed = cocos.io.atomic_path, [], []

    @contextlib.contextmanager
    def atomic_path(path, suffix=""):
        with real(path, suffix) as tmp:
            yield tmp
            if Path(path).name == name:
                seen.append(path)
                if len(seen) == nth:
                    failed.append(path)
                    raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    monkeypatch.setattr(cocos.io, "atomic_path", atomic_path)
    monkeypatch.setattr(cocos.report.style, "atomic_path", atomic_path)
    return failed


# where the disk fills: (file, which write of it, whether a resumable run folder stays, the refusal of a rerun)
FULL = {
    "the marker, the first write": (RUN_MARKER, 1, False, None),
    "model_best.pt of epoch 1": ("model_best.pt", 1, False, None),
    "last.pt of epoch 2": ("last.pt", 2, True, "stopped after epoch 1; continue it with --resume"),
    "the last figure": ("training.pdf", 1, True, "figures were not written; finish it with --resume"),
}


@pytest.mark.parametrize("case", list(FULL))
def test_a_full_disk_leaves_nothing_or_a_marked_folder_that_resume_finishes(world, tmp_path, monkeypatch, case):
    data, reference = world
    name, nth, kept, refusal = FULL[case]
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path, data)
    with monkeypatch.context() as mp:
        failed = _disk_full_at(mp, name, nth)
        line = _error_line(_train(data))
    assert len(failed) == 1, case
    assert line == f"error: run/{name}: cannot write (No space left on device)", line
    run = tmp_path / "run"
    if not kept:
        assert snapshot(tmp_path, data) == before  # nothing left: not the folder, not the lock, no temporary
        return
    assert (run / RUN_MARKER).is_file() and (run / "last.pt").is_file()
    with pytest.raises(CocosError, match="is a cocos training run folder"):  # no other command replaces a run folder
        check_output_dir(run, overwrite=True, kind="report")
    assert not [p for p in tmp_path.rglob(".*") if p.name != RUN_MARKER]  # no temporary, no lock file
    assert refusal in one_error_line(_train(data)), case  # the same command says what is there and what to do
    res = _train(data, "--resume")
    assert res.exit_code == 0 and "wrote run/training.png" in res.output, res.output
    assert {n: (run / n).read_bytes() for n in KEPT} == reference  # as if the disk had never filled


def test_overwrite_removes_the_previous_runs_files_and_a_failure_then_leaves_nothing_of_either(world, tmp_path,
                                                                                                monkeypatch):
    data, _ = world
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    for old in ("last.pt", "epoch_007.pt", "cocos_track.csv", "training.png"):  # an older run (no marker)
        (run / old).write_text("old")
    (run / "notes.txt").write_text("the user's")
    # a folder with a file of the user's is not an earlier run, whatever names its other files have (an open_clip
    # folder holds epoch_1.pt, ...): refused even with --overwrite, and nothing in it is touched
    before = snapshot(run)
    assert "run: exists, is not empty and was not written by cocos" in _error_line(_train(data, "--overwrite"))
    assert snapshot(run) == before
    (run / "notes.txt").unlink()  # cocos train's files alone: an earlier run, replaced with --overwrite
    with monkeypatch.context() as mp:
        _disk_full_at(mp, "last.pt")
        line = _error_line(_train(data, "--overwrite"))
    assert "run/last.pt: cannot write (No space left on device)" in line
    # the old run's files went when training started (a folder never mixes two runs); the failed run's went too
    assert [p.name for p in tmp_path.rglob("*")] == ["run"]


def test_a_second_writer_of_a_run_folder_is_refused_and_the_first_finishes(world, tmp_path, monkeypatch):
    data, reference = world
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()  # what a run killed in its first epoch leaves: its marker and a temporary: the same command starts
    (run / RUN_MARKER).write_text("written by cocos train")
    (run / f".last.pt.{2**22 + 12345}.abcd1234.tmp").write_text("x")
    real, seconds = Trainer.step, []

    def step(self, *args, **kwargs):
        if not seconds:  # while the first run trains: a second cocos train into the same folder, any flags
            before = snapshot(tmp_path)
            for extra in ((), ("--resume",), ("--overwrite",)):
                seconds.append(one_error_line(_train(data, *extra)))
            assert snapshot(tmp_path) == before  # refused before it touched anything
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", step)
    res = _train(data)
    assert res.exit_code == 0, res.output
    assert len(seconds) == 3
    assert all("run: another cocos process is writing this output now" in line for line in seconds), seconds
    assert {n: (run / n).read_bytes() for n in KEPT} == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the lock file went with the run


@pytest.mark.parametrize("flags,expected", [
    (["--epochs", "0"], "--epochs must be an integer of at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be an integer of at least 1, got 0"),
    (["--workers", "-1"], "--workers must be an integer >= 0, got -1"),
    (["--lr-update", "-2"], "--lr-update must be an integer of at least 1"),
    (["--k", "0"], "--k must be an integer of at least 1"),
    (["--save-every", "0"], "--save-every must be a positive integer"),
    (["--warmup-epochs", "-1"], "--warmup-epochs must lie in [0, epochs)"),
    (["--lr", "nan"], "lr must be finite"),
    (["--embed-size", str(10**7), "--word-dim", str(10**7)], "more than the"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--grad-clip", "inf"], "grad"),
])
def test_flags_out_of_range_are_one_line_before_anything_is_touched(world, tmp_path, monkeypatch, flags, expected):
    data, _ = world
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Trainer, "__init__", lambda *a, **k: pytest.fail("a Trainer was built"))
    before = snapshot(tmp_path, data)
    line = one_error_line(_train(data, *flags))
    assert expected in line, line
    assert snapshot(tmp_path, data) == before


def test_threads_out_of_range_is_one_line(world, tmp_path, monkeypatch):
    data, _ = world
    monkeypatch.chdir(tmp_path)
    assert "--threads must be at least 1, got 0" in one_error_line(_train(data, "--threads", "0"))
    assert not os.listdir(tmp_path)
