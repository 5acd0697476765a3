"""``cocos train`` and ``cocos demo`` hardening: resume state, flags, every input and output before the first
step, no partial output, stale temporaries, and Ctrl-C (messages that say what is on disk, exit code 130).

Faults: exit code 2, exactly one ``error: ...`` line, inputs byte-identical, nothing new on disk.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import cocos.training.trainer as trainer_module
from cocos.data.synth import make_synthetic
from cocos.errors import CocosError
from cocos.io import MARKER
from cocos.training.checkpoint import load_checkpoint, save_checkpoint
from cocos.training.trainer import RUN_MARKER, TrainConfig, Trainer
from cocos_cli.main import app
from tests.helpers import one_error_line, snapshot

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
QUIET = {"progress": False, "log": lambda *a: None}
FLAGS = ["--loss", "triplet", "--lr", "2e-3", "--lr-update", "10", "--batch-size", "16", "--embed-size", "16",
         "--word-dim", "8", "--no-progress"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("trh")
    data = make_synthetic(root / "data", n_train=48, n_dev=16, n_test=16, feature_dim=16, seed=1)
    cfg = TrainConfig.of(data=str(data), out=str(root / "run"), loss="triplet", epochs=1, lr=2e-3, lr_update=10,
                      batch_size=16, embed_size=16, word_dim=8, device="cpu")
    Trainer(cfg, **QUIET).fit()
    return root, data




def _train(data, out, *extra):
    return runner.invoke(app, ["train", "--data", str(data), "--out", str(out), *FLAGS, *extra])


@pytest.fixture
def no_steps(monkeypatch):
    """Fail the test if a training step runs: the faults below must be found before the first one."""
    def step(*args, **kwargs):
        raise AssertionError("a training step ran before the fault was found")

    monkeypatch.setattr(Trainer, "step", step)


# -- resume ----------------------------------------------------------------------------------------------------


def _two_groups(c):
    """Structurally sound (every parameter once), but not the trainer's one group: torch refuses it on loading."""
    group = c["optimizer"]["param_groups"][0]
    c["optimizer"]["param_groups"] = [{**group, "params": group["params"][:2]}, {**group, "params": group["params"][2:]}]
    for key in ("base_lrs", "_last_lr"):
        c["scheduler"][key] = c["scheduler"][key] * 2


def _bad_rng(c):
    c["rng"]["torch"] = torch.full_like(c["rng"]["torch"], 0)


RESUME = {
    "no optimizer": (lambda c: c.pop("optimizer"), "holds no optimizer to resume from"),
    "no rng": (lambda c: c.pop("rng"), "holds no rng to resume from"),
    "model_best.pt as last.pt": (lambda c: [c.pop(k) for k in ("optimizer", "scheduler", "rng")],
                                 "holds no optimizer, scheduler, rng"),
    "wrong-shaped state dict": (lambda c: c["state_dict"].__setitem__("fc.bias", torch.zeros(5)),
                                "state_dict['fc.bias'] has shape (5,), expected (16,)"),
    "optimizer state of another shape": (
        lambda c: c["optimizer"]["state"][0].__setitem__("exp_avg", torch.zeros(3, 3)),
        "optimizer.state[0].exp_avg has shape (3, 3)"),
    "optimizer for fewer parameters": (
        lambda c: c["optimizer"]["param_groups"][0].__setitem__("params", [0, 1]), "optimizer covers 2 parameters"),
    "optimizer lr a word": (lambda c: c["optimizer"]["param_groups"][0].__setitem__("lr", "fast"),
                            "optimizer.param_groups[0].lr must be a number, got 'fast'"),
    "optimizer in two groups": (_two_groups, "its optimizer state does not fit this run"),
    "scheduler step size a word": (lambda c: c["scheduler"].__setitem__("step_size", "ten"),
                                   "scheduler.step_size must be an integer"),
    "scheduler with a foreign attribute": (lambda c: c["scheduler"].__setitem__("optimizer", 1),
                                           "scheduler.optimizer is not part of a StepLR state"),
    "rng of the wrong length": (lambda c: c["rng"].__setitem__("torch", torch.zeros(10, dtype=torch.uint8)),
                                "rng.torch has shape (10,)"),
    "rng not a generator state": (_bad_rng, "rng.torch is not a random generator state"),
}


@pytest.mark.parametrize("case", list(RESUME))
def test_resume_from_a_bad_last_pt_is_one_line(world, tmp_path, case, no_steps):
    root, data = world
    mutate, expected = RESUME[case]
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    ckpt = load_checkpoint(out / "last.pt")
    mutate(ckpt)
    save_checkpoint(out / "last.pt", ckpt)
    before = snapshot(tmp_path, data)
    line = one_error_line(_train(data, out, "--resume", "--epochs", "2"))
    assert expected in line and "last.pt" in line, line
    assert snapshot(tmp_path, data) == before


def test_resume_from_a_valid_last_pt_still_works(world, tmp_path):
    root, data = world
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    res = _train(data, out, "--resume", "--epochs", "2")
    assert res.exit_code == 0, res.output
    assert load_checkpoint(out / "last.pt")["epoch"] == 2


# -- flags and inputs, all before the first step -----------------------------------------------------------------


@pytest.mark.parametrize("flags,expected", [
    (["--seed", str(2**64)], "--seed must be an integer in [0, 2**63 - 1]"),
    (["--seed", str(2**63)], "--seed must be an integer in [0, 2**63 - 1]"),
    (["--seed", str(10**30)], "--seed must be an integer"),
    (["--seed", "-1"], "--seed must be an integer"),
    (["--model", "vsrn", "--batch-size", "1"], "--model vsrn needs --batch-size of at least 2"),
    (["--batch-size", "1"], "a batch of one has no negatives"),
])
def test_flags_refused_up_front(world, tmp_path, flags, expected, no_steps):
    _, data = world
    before = snapshot(tmp_path, data)
    line = one_error_line(_train(data, tmp_path / "out", "--epochs", "1", *flags))
    assert expected in line, line
    assert snapshot(tmp_path, data) == before


def test_a_large_seed_below_the_limit_trains(world, tmp_path):
    _, data = world
    res = _train(data, tmp_path / "out", "--epochs", "1", "--seed", str(2**63 - 1))
    assert res.exit_code == 0, res.output


def test_dev_features_of_another_dimension_are_found_before_training(world, tmp_path, no_steps):
    _, data = world
    other = tmp_path / "data"
    shutil.copytree(data, other)
    np.save(other / "dev_ims.npy", np.zeros((16, 20), dtype=np.float32))
    before = snapshot(tmp_path)
    line = one_error_line(_train(other, tmp_path / "out", "--epochs", "1"))
    assert "dev_ims.npy" in line and "(20,)" in line and "(16,)" in line, line
    assert snapshot(tmp_path) == before


def test_json_is_checked_before_training(world, tmp_path, no_steps, monkeypatch):
    _, data = world
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "out"
    before = snapshot(tmp_path, data)
    cases = {
        str(data / "train_caps.txt"): "would overwrite the input",
        str(data / "cache" / "m.json"): "would overwrite the input",
        str(data): "is a folder",
        str(tmp_path / "file" / "m.json"): "cannot write",
        str(out / "last.pt"): "is one of the files cocos train writes",
        str(out / "epoch_003.pt"): "is one of the files cocos train writes",
    }
    for target, expected in cases.items():
        line = one_error_line(_train(data, out, "--epochs", "1", "--json", target))
        assert expected in line, (target, line)
        assert snapshot(tmp_path, data) == before
    # a folder this user cannot write (root can write anywhere: the permission check is simulated)
    import cocos.io

    real = os.access
    monkeypatch.setattr(cocos.io.os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    line = one_error_line(_train(data, out, "--epochs", "1", "--json", str(tmp_path / "new" / "m.json")))
    assert "is not writable" in line, line
    assert snapshot(tmp_path, data) == before


# -- partial outputs ---------------------------------------------------------------------------------------------


def test_a_failed_first_write_leaves_no_folder(world, tmp_path, monkeypatch):
    import pandas as pd

    _, data = world

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    out = tmp_path / "a" / "b" / "run"
    before = snapshot(tmp_path, data)
    line = one_error_line(_train(data, out, "--epochs", "1"))
    assert "No space left on device" in line and "train_log.csv" in line, line
    assert snapshot(tmp_path, data) == before  # not even the parents this run made
    # a read-only place: refused before the first step, nothing made
    import cocos.io

    real = os.access
    monkeypatch.setattr(cocos.io.os, "access", lambda p, mode: real(p, mode) and tmp_path not in Path(p).parents)
    monkeypatch.setattr(Trainer, "step", lambda *a, **k: pytest.fail("trained on a read-only --out"))
    line = one_error_line(_train(data, out, "--epochs", "1"))
    assert "cannot write" in line, line
    assert snapshot(tmp_path, data) == before


def test_a_failure_after_a_saved_epoch_keeps_it(world, tmp_path, monkeypatch):
    _, data = world
    real = trainer_module.save_checkpoint

    def save(path, ckpt):
        if ckpt["epoch"] == 2:
            raise CocosError(f"{path}: cannot write (No space left on device)")
        real(path, ckpt)

    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    out = tmp_path / "run"
    res = _train(data, out, "--epochs", "2")
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 2 and lines[0].startswith("epoch   1"), res.output
    assert lines[1].startswith("error: ") and "No space left" in lines[1], res.output
    assert load_checkpoint(out / "last.pt")["epoch"] == 1  # the finished epoch stays
    assert (out / RUN_MARKER).is_file()


def test_stale_temporaries_of_its_own_outputs_are_removed_and_nothing_else(world, tmp_path):
    _, data = world
    out = tmp_path / "run"
    out.mkdir()
    dead = 2**22 + 12345  # above every pid_max: no such process
    stale = [f".last.pt.{dead}.abc_123x.tmp", ".model_best.pt.k2j4h5g6.tmp", f".train_log.csv.{dead}.q1w2e3r4.csv.tmp",
             f".epoch_007.pt.{dead}.zzzz1111.tmp", f".training.png.{dead}.aaaa2222.png.tmp"]
    for name in stale:  # what a SIGKILLed first run leaves: not a folder of someone else's
        (out / name).write_text("x")
    res = _train(data, out, "--epochs", "1")
    assert res.exit_code == 0, res.output
    assert not {p.name for p in out.iterdir()} & set(stale)
    kept = [".mine.tmp", ".last.pt.notes", "notes.txt", f".other.pt.{dead}.abcd1234.tmp",
            f".last.pt.{os.getppid()}.live1234.tmp"]  # the user's files, and a live process's temporary
    for name in stale + kept:
        (out / name).write_text("x")
    res = _train(data, out, "--epochs", "2", "--resume")
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert not names & set(stale), names & set(stale)
    assert set(kept) <= names and load_checkpoint(out / "last.pt")["epoch"] == 2
    # temporaries alone do not make a folder someone's; the user's files do
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "notes.txt").write_text("mine")
    assert "was not written by cocos" in one_error_line(_train(data, fresh, "--epochs", "1"))


# -- Ctrl-C --------------------------------------------------------------------------------------------------------


def _interrupt_when(monkeypatch, predicate):
    """Raise KeyboardInterrupt in the training step where ``predicate(trainer, epoch)`` holds."""
    real = Trainer.step

    def step(self, *args, epoch=0, **kwargs):
        if predicate(self, epoch):
            raise KeyboardInterrupt
        return real(self, *args, epoch=epoch, **kwargs)

    monkeypatch.setattr(Trainer, "step", step)


def _last_line(res) -> str:
    return [line for line in res.output.splitlines() if line.strip()][-1]


def test_ctrl_c_in_the_first_epoch_saves_nothing_and_says_so(world, tmp_path, monkeypatch):
    _, data = world
    _interrupt_when(monkeypatch, lambda t, epoch: True)
    res = _train(data, tmp_path / "run", "--epochs", "2")
    assert res.exit_code == 130 and _last_line(res) == "interrupted in epoch 1: nothing was saved", res.output
    assert list(tmp_path.iterdir()) == []  # the folder this run made is gone again
    assert "Traceback" not in res.output


def test_ctrl_c_later_names_each_file_with_its_epoch(world, tmp_path, monkeypatch):
    _, data = world
    out = tmp_path / "run"
    _interrupt_when(monkeypatch, lambda t, epoch: epoch == 2)
    res = _train(data, out, "--epochs", "3")
    assert res.exit_code == 130, res.output
    assert _last_line(res) == (f"interrupted in epoch 2: {out}/last.pt holds epoch 1, {out}/model_best.pt epoch 1; "
                               "continue with --resume")
    assert load_checkpoint(out / "last.pt")["epoch"] == 1
    assert (out / RUN_MARKER).is_file()  # a resumable folder, marked as cocos train's
    assert "stopped after epoch 1; continue it with --resume" in one_error_line(_train(data, out, "--epochs", "3"))


def test_ctrl_c_between_model_best_and_last_names_both_epochs(world, tmp_path, monkeypatch):
    """The case the old message got wrong: model_best.pt already holds the new epoch, last.pt the one before."""
    _, data = world
    out = tmp_path / "run"
    assert _train(data, out, "--epochs", "1").exit_code == 0
    real_eval, real_save = trainer_module.evaluate_model, trainer_module.save_checkpoint
    monkeypatch.setattr(trainer_module, "evaluate_model",
                        lambda *a, **k: {**real_eval(*a, **k), "rsum": 1000.0})  # epoch 2 is the best
    def save(path, ckpt):
        if Path(path).name == "last.pt":
            raise KeyboardInterrupt
        real_save(path, ckpt)

    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    res = _train(data, out, "--epochs", "2", "--resume")
    assert res.exit_code == 130, res.output
    assert _last_line(res) == (f"interrupted in epoch 2: {out}/last.pt holds epoch 1, {out}/model_best.pt epoch 2; "
                               "continue with --resume")
    assert load_checkpoint(out / "last.pt")["epoch"] == 1 and load_checkpoint(out / "model_best.pt")["epoch"] == 2


def test_a_swallowed_ctrl_c_still_stops_and_a_second_one_exits_at_once(world, tmp_path, monkeypatch):
    import cocos_cli.common
    import cocos_cli.train

    _, data = world
    out = tmp_path / "run"
    real = Trainer.step
    calls = []

    def step(self, *args, **kwargs):  # a Ctrl-C that lands in code that swallows it (a finaliser, say)
        calls.append(1)
        if len(calls) == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                pass
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", step)
    res = _train(data, out, "--epochs", "2")
    assert res.exit_code == 130 and _last_line(res) == "interrupted in epoch 1: nothing was saved", res.output
    assert len(calls) == 2  # stopped in that very step (cocos.io.check_interrupt), not at the end of training

    def second(trainer):  # the second Ctrl-C arrives while the first one's message is being made
        os.kill(os.getpid(), signal.SIGINT)
        return "unreachable"

    def hard_exit(code):
        raise SystemExit(code)

    calls.clear()
    monkeypatch.setattr(cocos_cli.train, "interrupted_message", second)
    monkeypatch.setattr(cocos_cli.common, "_hard_exit", hard_exit)
    res = _train(data, out, "--epochs", "2")
    assert res.exit_code == 130, res.output
    assert "interrupted again: stopped at once" in res.output and "Traceback" not in res.output
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is the default again


def test_evaluate_stops_on_a_swallowed_ctrl_c_before_writing(world, tmp_path, monkeypatch):
    import cocos.training.evaluate as evaluate

    root, data = world
    real = evaluate.evaluate_embeddings

    def swallowing(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_embeddings", swallowing)
    res = runner.invoke(app, ["evaluate", str(root / "run" / "model_best.pt"), "--data", str(data), "--json",
                              str(tmp_path / "m.json"), "--no-progress"])
    assert res.exit_code == 130 and res.output.strip() == "interrupted", res.output
    assert list(tmp_path.iterdir()) == []


# -- cocos demo ----------------------------------------------------------------------------------------------------


DEMO = ["--loss", "triplet", "--epochs", "1", "--n-train", "32", "--embed-size", "16", "--word-dim", "8",
        "--batch-size", "16", "--no-progress"]


def _demo(tmp_path, *extra):
    return runner.invoke(app, ["demo", "--out", str(tmp_path / "rep"), "--data", str(tmp_path / "syn"),
                               "--checkpoints", str(tmp_path / "ck"), *DEMO, *extra])


def test_demo_refuses_a_foreign_data_or_report_folder_even_with_overwrite(tmp_path, monkeypatch):
    """Outputs by kind: a folder cocos did not write is never replaced (not even with --overwrite); a report of
    another command is replaced only with --overwrite."""
    from cocos.io import mark_output

    (tmp_path / "syn").mkdir()
    (tmp_path / "syn" / "thesis.tex").write_text("mine")
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        line = one_error_line(_demo(tmp_path, *extra))
        assert "syn: exists, is not empty and was not written by cocos" in line and "--data" in line
        assert snapshot(tmp_path) == before
    (tmp_path / "syn" / "thesis.tex").unlink()
    (tmp_path / "rep").mkdir()  # e.g. what an interrupted demo of an earlier version left: no marker
    (tmp_path / "rep" / "triplet").mkdir()
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        line = one_error_line(_demo(tmp_path, *extra))
        assert "rep: exists, is not empty and was not written by cocos" in line
        assert snapshot(tmp_path) == before
    mark_output(tmp_path / "rep", "report", by="analyze")  # a report of another command: only with --overwrite
    line = one_error_line(_demo(tmp_path))
    assert "rep: holds a cocos report" in line and "--overwrite" in line
    # --overwrite passes the checks (interrupted at the analysis, before the report: the old folder stays)
    import cocos.pipelines.demo

    monkeypatch.setattr(cocos.pipelines.demo, "analyze_checkpoint",
                        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    res = _demo(tmp_path, "--overwrite")
    assert res.exit_code == 130 and "training vsepp" in res.output, res.output
    assert (tmp_path / "rep" / "triplet").is_dir() and "by: analyze" in (tmp_path / "rep" / MARKER).read_text()


def test_interrupted_demo_leaves_no_report_folder_and_exits_130(tmp_path, monkeypatch):
    import cocos.pipelines.demo

    real = cocos.pipelines.analyze.analyze_checkpoint

    def swallowing(*args, **kwargs):  # Ctrl-C during the analysis, swallowed on its way up
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(cocos.pipelines.demo, "analyze_checkpoint", swallowing)
    res = _demo(tmp_path)
    assert res.exit_code == 130, res.output
    assert _last_line(res).startswith(f"interrupted: {tmp_path / 'rep'} was left as it was"), res.output
    assert not (tmp_path / "rep").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries either
    assert (tmp_path / "ck" / "triplet" / "last.pt").is_file()  # the finished model is reused next time


def test_demo_checks_model_folders_it_did_not_write(tmp_path):
    (tmp_path / "ck" / "triplet").mkdir(parents=True)
    (tmp_path / "ck" / "triplet" / "paper.pdf").write_text("mine")
    before = snapshot(tmp_path)
    line = one_error_line(_demo(tmp_path))
    assert "triplet: exists, is not empty and was not written by cocos" in line
    assert snapshot(tmp_path) == before


def test_trainer_objects_keep_working_from_python(world, tmp_path):
    """The library path (no CLI, no signal handler): fit, then resume; a copy of a checkpoint dict is untouched."""
    _, data = world
    cfg = TrainConfig.of(data=str(data), out=str(tmp_path / "r"), loss="triplet", epochs=1, lr=2e-3, lr_update=10,
                      batch_size=16, embed_size=16, word_dim=8, device="cpu")
    Trainer(cfg, **QUIET).fit()
    before = copy.deepcopy(load_checkpoint(tmp_path / "r" / "last.pt"))
    cfg.optim.epochs = 2
    resumed = Trainer(cfg, resume=True, **QUIET)
    assert resumed.epoch == 1 and resumed.saved() == {"last": 1, "best": 1}
    resumed.fit()
    assert load_checkpoint(tmp_path / "r" / "last.pt")["epoch"] == 2 and before["epoch"] == 1
