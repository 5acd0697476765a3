"""The training and tracking figures at print size: per-batch lines that show, a note where a series keeps another
pace, the dev rsum per epoch (issue 40). Each test reads the drawn figure back; nothing is rasterised."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cocos.report import style
from cocos.report import training as T
from cocos.results import builtin_presentations

LOOKS = builtin_presentations()


@pytest.fixture
def figures(monkeypatch):
    """The figures the report layer draws, captured instead of written."""
    drawn = []
    monkeypatch.setattr(style, "save", lambda fig, stem: drawn.append(fig) or [])
    return drawn


def _lines(fig):
    return [line for ax in fig.axes if ax.get_visible() for line in ax.get_lines()]


def _steps(n=300, per_epoch=100, seed=0):
    g = np.random.default_rng(seed)
    return pd.DataFrame({"step": np.arange(1, n + 1), "epoch": np.arange(n) // per_epoch + 1,
                         "loss": 5 + g.random(n), "L_con": 5 + g.random(n)})


def _track(losses_pace, epochs=3, every=5):
    """A tidy track: per (loss, steps per epoch) ``C_q`` of both directions every ``every`` steps."""
    g = np.random.default_rng(1)
    rows = [(s, (s - 1) // pace + 1, loss, d, "C_q", 2 + g.random())
            for loss, pace in losses_pace for s in range(1, epochs * pace + 1, every) for d in ("i2t", "t2i")]
    return pd.DataFrame(rows, columns=["step", "epoch", "loss", "direction", "stat", "value"])


def _visible(line) -> bool:
    alpha = line.get_alpha()
    ink = style.ink(line.get_color()) * (1.0 if alpha is None else alpha)
    return line.get_linewidth() >= style.MIN_LINE_PT and ink >= 0.45


def test_per_step_values_are_visible_at_print_size_under_their_rolling_mean(figures):
    steps = _steps()
    T.plot_training(steps, "unused", color=LOOKS["triplet_sh"].color)
    lines = _lines(figures[-1])
    assert lines and all(_visible(line) for line in lines), [(ln.get_linewidth(), ln.get_alpha()) for ln in lines]
    raw = [ln for ln in lines if ln.get_gid() == "per-batch"]
    mean = [ln for ln in lines if ln.get_gid() == "rolling mean"]
    assert len(raw) == len(mean) == 1
    np.testing.assert_array_equal(raw[0].get_ydata(), steps["L_con"])  # the raw points, all of them
    assert raw[0].get_zorder() <= mean[0].get_zorder() and raw[0].get_linewidth() < mean[0].get_linewidth()


def test_per_batch_cocos_is_visible_at_print_size(figures):
    track = _track([("triplet", 200)], epochs=3, every=5)  # 120 values per line: faint under a rolling mean
    T.plot_track(track, "unused", looks=LOOKS)
    lines = _lines(figures[-1])
    assert {ln.get_gid() for ln in lines} == {"per-batch", "rolling mean"}
    assert all(_visible(line) for line in lines)
    few = _track([("triplet", 20)], epochs=2, every=5)  # 8 values per line: drawn as they are
    T.plot_track(few, "unused", looks=LOOKS)
    lines = _lines(figures[-1])
    assert {ln.get_gid() for ln in lines} == {"values"} and all(_visible(line) for line in lines)


def test_a_series_of_fewer_steps_per_epoch_is_noted(figures):
    out = T.plot_track(_track([("triplet", 120), ("smoothap", 24)], every=4), "unused", looks=LOOKS)
    note = out.data["note"]
    assert note.startswith("SmoothAP: fewer steps per epoch (≈24; the others ≈120)"), note
    assert "its 18 tracked batches end at step 69 (epoch 3)" in note.replace("\n", " ")
    fig = figures[-1]
    assert note in fig.legends[0].get_title().get_text()  # under the panels, in the figure
    assert " ".join(note.splitlines()) in fig.cocos_title  # and in the caption
    same = T.plot_track(_track([("triplet", 120), ("ntxent", 110)]), "unused", looks=LOOKS)
    assert "note" not in same.data and "steps per epoch" not in (figures[-1].legends[0].get_title().get_text())


def test_the_training_figure_draws_the_dev_rsum_of_each_epoch(figures):
    steps = _steps(n=300, per_epoch=100)
    history = [{"epoch": e, "loss": 1.0, "lr": 2e-4, "rsum": r} for e, r in ((1, 300.5), (2, 380.0), (3, 401.25),
                                                                            (4, 410.0))]  # epoch 4: not in the log
    T.plot_training(steps, "unused", history=history)
    fig = figures[-1]
    (ax,) = [a for a in fig.axes if a.get_title() == "dev rsum, per epoch"]
    (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == T.DEV_RSUM]
    np.testing.assert_array_equal(line.get_ydata(), [300.5, 380.0, 401.25])
    np.testing.assert_array_equal(line.get_xdata(), [100, 200, 300])  # each epoch's last step
    assert ax.get_xlim() == fig.axes[0].get_xlim()
    T.plot_training(steps, "unused")  # without a history: the loss alone
    assert [a.get_title() for a in figures[-1].axes] == [r"contrastive loss $\mathcal{L}_{con}$"]


def test_a_train_folder_draws_its_checkpoints_dev_rsum(tmp_path, figures):
    import torch

    from cocos.training.logs import write_log_csvs

    write_log_csvs(T.TrainingLogs(steps=_steps(n=40, per_epoch=20)), tmp_path)
    torch.save({"history": [{"epoch": 1, "loss": 1.0, "rsum": 120.0}, {"epoch": 2, "loss": 0.5, "rsum": 150.0}]},
               tmp_path / "last.pt")
    assert T.run_history(tmp_path)[1]["rsum"] == 150.0
    T.plot_run(tmp_path)
    (line,) = [ln for ln in _lines(figures[-1]) if ln.get_gid() == T.DEV_RSUM]
    np.testing.assert_array_equal(line.get_ydata(), [120.0, 150.0])
    assert T.run_history(tmp_path / "nowhere") is None
