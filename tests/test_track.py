"""COCOS tracked during training: the step's own embeddings, no effect on training, resume, epochs in reports."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting import count_batch
from cocos.data.synth import make_synthetic
from cocos.training.checkpoint import load_checkpoint
from cocos.training.track import COLUMNS, Tracker
from cocos.training.trainer import TrainConfig, Trainer
from cocos_cli.main import app
from tests.helpers import empty_figures

runner = CliRunner()
QUIET = {"progress": False, "log": lambda *a: None}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("track") / "d", n_train=56, n_dev=16, n_test=16, feature_dim=16,
                          seed=4)


def _cfg(data, out, **kw):
    base = dict(data=str(data), out=str(out), loss="triplet", epochs=1, lr=3e-3, batch_size=24, embed_size=16,
                word_dim=8, device="cpu")
    return TrainConfig.of(**{**base, **kw})


def test_counters_follow_the_batch_layout():
    assert list(Tracker.for_training(5, "triplet_sh", {"margin": 0.1}, "pair").losses) == ["triplet", "triplet_sh", "ntxent"]
    assert list(Tracker.for_training(5, "smoothap", {}, "ranking").losses) == ["triplet", "triplet_sh", "ntxent", "smoothap"]
    goal = Tracker.for_training(5, "goal", {"triplet_weight": "cir"}, "pair")
    assert list(goal.losses) == ["triplet", "triplet_sh", "ntxent", "goal"]
    # the training loss's margin applies to its own counter and to its paper table's (Triplet), not to NT-Xent
    sh = Tracker.for_training(5, "triplet_sh", {"margin": 0.1}, "pair").losses
    assert sh["triplet_sh"] == {"margin": 0.1} and sh["triplet"] == {"margin": 0.1} and sh["ntxent"] == {}
    assert [s for s in range(1, 30) if goal.due(s)] == [1, 6, 11, 16, 21, 26]


def test_tracking_counts_the_steps_own_embeddings_and_leaves_training_unchanged(data, tmp_path):
    plain = Trainer(_cfg(data, tmp_path / "plain", epochs=2), **QUIET)
    tracked = Trainer(_cfg(data, tmp_path / "tracked", epochs=2, track_cocos=1), **QUIET)
    calls = {"plain": 0, "tracked": 0}
    seen = {}

    def hook(name):
        def record(module, args, output):
            calls[name] += 1
            if module.training:
                seen.setdefault(calls[name], tuple(x.detach().clone() for x in output))
        return record

    plain.model.register_forward_hook(hook("plain"))
    tracked.model.register_forward_hook(hook("tracked"))
    plain.fit()
    tracked.fit()
    assert calls["plain"] == calls["tracked"]  # no extra forward pass
    a, b = (load_checkpoint(tmp_path / x / "last.pt") for x in ("plain", "tracked"))
    for name, tensor in a["state_dict"].items():  # and no effect on what is learnt
        assert torch.equal(tensor, b["state_dict"][name]), name

    track = pd.read_csv(tmp_path / "tracked" / "cocos_track.csv")
    assert list(track.columns) == COLUMNS
    # 280 captions in batches of 24: 11 full batches and a short one (16) per epoch; every step is due (N = 1)
    # but the short final batches (steps 12 and 24) are never counted: counts depend on the batch size
    assert sorted(set(track["step"])) == [s for s in range(1, 25) if s not in (12, 24)]
    assert set(track.loc[track["step"] < 12, "epoch"]) == {1} and set(track.loc[track["step"] > 12, "epoch"]) == {2}
    assert set(track["loss"]) == {"triplet", "triplet_sh", "ntxent"}

    # step 1's rows are the counts of step 1's forward pass, computed independently with count_batch
    images, captions = seen[1]
    first = tracked.batches(1).__next__()
    ids = torch.as_tensor(first[0])
    row = track[track["step"] == 1].set_index(["loss", "direction", "stat"])["value"].sort_index()
    for loss in ("triplet", "triplet_sh", "ntxent"):
        expected = count_batch(images, captions, loss, caption_image=first[2], image_ids=ids)
        for direction in ("i2t", "t2i"):
            for stat, value in row.loc[loss, direction].items():
                assert value == pytest.approx(expected[direction][stat], rel=1e-9, abs=1e-12), (loss, direction, stat)
    # at initialisation every triplet violates: Triplet counts nearly the whole batch as contributing
    assert row.loc[("triplet", "i2t", "C_q")] > 0.8 * 23


def test_ranking_run_counts_pair_counters_on_each_images_first_caption():
    torch.manual_seed(0)
    images, captions = torch.randn(6, 8), torch.randn(30, 8)
    tracker = Tracker.for_training(1, "smoothap", {}, "ranking")
    tracker.observe(1, images, captions, None, epoch=1, image_ids=torch.arange(6))
    frame = tracker.frame().set_index(["loss", "direction", "stat"])["value"]
    pair = count_batch(images, captions[::5], "ntxent")
    ranking = count_batch(images, captions, "smoothap")
    assert frame.loc[("ntxent", "i2t", "C_qv-")] == pytest.approx(pair["i2t"]["C_qv-"], rel=1e-6)
    assert frame.loc[("smoothap", "t2i", "C_0")] == pytest.approx(ranking["t2i"]["C_0"], rel=1e-6)


def test_resume_equals_an_uninterrupted_tracked_run(data, tmp_path):
    Trainer(_cfg(data, tmp_path / "a", epochs=2, track_cocos=4), **QUIET).fit()
    Trainer(_cfg(data, tmp_path / "b", epochs=1, track_cocos=4), **QUIET).fit()
    # a crash after the logs of epoch 2 were written but before last.pt: the resume cuts them back
    stale = pd.read_csv(tmp_path / "b" / "cocos_track.csv")
    pd.concat([stale, stale.assign(epoch=2, step=stale["step"] + 12)]).to_csv(tmp_path / "b" / "cocos_track.csv",
                                                                              index=False)
    Trainer(_cfg(data, tmp_path / "b", epochs=2, track_cocos=4), resume=True, **QUIET).fit()
    for name in ("cocos_track.csv", "train_log.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / name), pd.read_csv(tmp_path / "b" / name))


@pytest.mark.slow
def test_save_every_analyze_several_and_report_by_epoch(data, tmp_path, monkeypatch):
    empty_figures(monkeypatch)  # the files, not their drawing (tests/test_report_figures.py, test_figure_print.py)
    out = tmp_path / "ck" / "run"
    Trainer(_cfg(data, out, epochs=3, track_cocos=5, save_every=2), **QUIET).fit()
    assert sorted(p.name for p in out.glob("epoch_*.pt")) == ["epoch_002.pt"]
    assert load_checkpoint(out / "epoch_002.pt")["epoch"] == 2
    reports = tmp_path / "reports"
    res = runner.invoke(app, ["analyze", str(out / "epoch_002.pt"), str(out / "last.pt"), "--out", str(reports),
                              "--loss", "triplet", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in reports.iterdir()) == ["run_epoch_002", "run_last"]
    # each analysis carries the run's logs up to its own checkpoint's epoch
    early = pd.read_csv(reports / "run_epoch_002" / "cocos_track.csv")
    late = pd.read_csv(reports / "run_last" / "cocos_track.csv")
    assert early["epoch"].max() == 2 and late["epoch"].max() == 3
    pd.testing.assert_frame_equal(early, late[late["epoch"] <= 2])
    assert (reports / "run_last" / "cocos_track.png").is_file()

    res = runner.invoke(app, ["report", str(reports), "--out", str(tmp_path / "summary")])
    assert res.exit_code == 2 and "same seed" in res.output  # two checkpoints of one run are not replicates
    res = runner.invoke(app, ["report", str(reports), "--label", "epoch", "--out", str(tmp_path / "summary")])
    assert res.exit_code == 0, res.output
    tables = (tmp_path / "summary" / "tables.md").read_text()
    assert "VSE++ (epoch 2)" in tables and "VSE++ (epoch 3)" in tables
    assert tables.index("VSE++ (epoch 2)") < tables.index("VSE++ (epoch 3)")
    for figure in ("cocos_by_epoch.png", "cocos_track.png", "cocos_vs_rsum.png"):
        assert (tmp_path / "summary" / figure).is_file(), figure

    from cocos.report.merge import build_report, epoch_rows, training_logs

    report = build_report([reports], label="epoch")
    rows = epoch_rows(report.groups)
    c_q = rows[(rows["stat"] == "C_q") & (rows["direction"] == "i2t")].sort_values("epoch")
    assert list(c_q["epoch"]) == [2, 3]
    for r in report.results:  # the figure's values are the results' own
        assert c_q.loc[c_q["epoch"] == r.source.epoch, "value"].item() == r.stats["triplet"]["i2t"]["C_q"]["mean"]
    track, steps = training_logs(report.results)
    assert steps is None  # no LTD in this run
    pd.testing.assert_frame_equal(track.drop(columns="label").reset_index(drop=True),
                                  late[late["loss"] == "triplet"].reset_index(drop=True))


def test_report_label_and_analyze_flags_refuse_bad_values(data, tmp_path):
    res = runner.invoke(app, ["report", str(tmp_path), "--label", "seed", "--out", str(tmp_path / "s")])
    assert res.exit_code == 2 and "unknown --label 'seed'" in res.output
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    res = runner.invoke(app, ["analyze", str(a), str(b), "--label", "x"])
    assert res.exit_code == 2 and "--label names one checkpoint" in res.output
    res = runner.invoke(app, ["analyze", str(a), str(a)])
    assert res.exit_code == 2 and "given twice" in res.output
    res = runner.invoke(app, ["analyze", str(a), str(b), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "a.pt: no such checkpoint" in res.output and not (tmp_path / "r").exists()


def test_track_figure_panels_follow_the_statistics(tmp_path):
    from cocos.report.training import plot_track

    rows = [(s, 1, "triplet", d, stat, float(v)) for s, v in ((1, 20), (11, 5)) for d in ("i2t", "t2i")
            for stat in ("C_q", "C_B", "C_0")]
    rows += [(1, 1, "ntxent", "i2t", "W_low", 0.1)]  # not drawn
    frame = pd.DataFrame(rows, columns=COLUMNS)
    from cocos.results import builtin_presentations

    drawn = plot_track(frame, tmp_path / "t", looks=builtin_presentations())  # labels from the presentations
    assert [p.name for p in drawn.paths] == ["t.png", "t.pdf"]
    assert drawn.data == {"panels": ["C_q", "C_B", "C_0"], "series": ["Triplet loss"]}
    frame = pd.concat([frame, frame.assign(loss="ntxent", stat="W_qv-")])
    assert plot_track(frame, tmp_path / "u").data["panels"] == ["C_q", "C_B", "C_0", "W_qv-"]


def test_resume_with_a_damaged_log_is_one_line(data, tmp_path):
    out = tmp_path / "run"
    Trainer(_cfg(data, out, epochs=1, track_cocos=3), **QUIET).fit()
    base = ["train", "--data", str(data), "--out", str(out), "--resume", "--epochs", "2", "--loss", "triplet",
            "--lr", "0.003", "--batch-size", "24", "--embed-size", "16", "--word-dim", "8", "--device", "cpu",
            "--track-cocos", "3", "--no-progress"]
    for name, damage in (("train_log.csv", lambda t: t.replace("\n1,1,", "\n1,x,", 1)),
                         ("cocos_track.csv", lambda t: "\n".join(",".join(r.split(",")[:5]) for r in t.splitlines()))):
        path = out / name
        good = path.read_text()
        path.write_text(damage(good))
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        res = runner.invoke(app, base)
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and name in lines[0], (name, res.output)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        path.write_text(good)


def test_no_report_folder_of_several_checkpoints_may_hold_another_ones_input(data, tmp_path):
    out = tmp_path / "ck" / "run"
    Trainer(_cfg(data, out, epochs=1), **QUIET).fit()
    reports = tmp_path / "reports"
    hidden = reports / "run_last"  # the default folder of the second checkpoint below
    hidden.mkdir(parents=True)
    (hidden / ".cocos-output").write_text("")  # even a folder cocos wrote
    (hidden / "other.pt").write_bytes((out / "model_best.pt").read_bytes())
    res = runner.invoke(app, ["analyze", str(hidden / "other.pt"), str(out / "last.pt"), "--out", str(reports),
                              "--overwrite", "--no-progress"])
    assert res.exit_code == 2 and "would replace the input" in res.output, res.output
    assert (hidden / "other.pt").is_file()
