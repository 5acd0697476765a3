"""Trainer: it learns, resuming equals an uninterrupted run, checkpoints load safely, bad input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.data.precomp import PrecompSplit
from cocos.data.synth import make_synthetic
from cocos.errors import CocosError
from cocos.models import build_model
from cocos.training.checkpoint import load_checkpoint, save_checkpoint
from cocos.training.evaluate import evaluate_model, tokenize_split
from cocos.training.trainer import TrainConfig, Trainer, build_from_checkpoint
from cocos_cli.main import app

runner = CliRunner()
QUIET = {"progress": False, "log": lambda *a: None}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("syn") / "d", n_train=240, n_dev=60, n_test=60,
                          feature_dim=32, seed=1)


def _cfg(data, out, **kw):
    base = dict(data=str(data), out=str(out), model="vsepp", loss="ntxent", epochs=3, lr=2e-3, lr_update=10,
                batch_size=32, embed_size=32, word_dim=16, seed=0, device="cpu")
    base.update(kw)
    return TrainConfig.of(**base)


def test_training_beats_an_untrained_model_by_a_wide_margin(tiny, tmp_path):
    trainer = Trainer(_cfg(tiny, tmp_path / "run", epochs=4, lr=1e-2), **QUIET)  # rsum about 60 -> 260
    untrained = evaluate_model(trainer.model, trainer.dev_split, trainer.dev_ids)["rsum"]
    best = trainer.fit()["rsum"]
    # chance level on 60 dev images is about 2 * (1 + 5 + 10) / 60 * 100 = 53
    assert best > untrained + 100, (untrained, best)
    ckpt = load_checkpoint(tmp_path / "run" / "model_best.pt")
    assert ckpt["metrics"]["rsum"] == best and ckpt["best_rsum"] == best
    assert [h["epoch"] for h in ckpt["history"]][-1] == ckpt["epoch"]


def test_same_seed_same_result_and_resume_equals_uninterrupted(tiny, tmp_path):
    straight = Trainer(_cfg(tiny, tmp_path / "a", epochs=2, loss="triplet_sh"), **QUIET)
    straight.fit()
    again = Trainer(_cfg(tiny, tmp_path / "b", epochs=2, loss="triplet_sh"), **QUIET)
    again.fit()
    first = Trainer(_cfg(tiny, tmp_path / "c", epochs=1, loss="triplet_sh"), **QUIET)
    first.fit()
    resumed = Trainer(_cfg(tiny, tmp_path / "c", epochs=2, loss="triplet_sh"), resume=True, **QUIET)
    assert resumed.epoch == 1
    resumed.fit()
    a, b, c = (load_checkpoint(tmp_path / x / "last.pt") for x in "abc")
    assert a["metrics"] == b["metrics"] == c["metrics"]
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name
        assert torch.equal(tensor, c["state_dict"][name]), name


def test_smoothap_trains_on_ranking_batches(tiny, tmp_path):
    trainer = Trainer(_cfg(tiny, tmp_path / "s", epochs=1, loss="smoothap", batch_size=16), **QUIET)
    batches = list(trainer.batches(1))
    img, cap, caption_image = batches[0]
    assert caption_image is None and len(cap) == 5 * len(img)
    np.testing.assert_array_equal(cap // 5, np.repeat(img, 5))
    assert len(batches) == 240 // 16  # every image once per epoch, short batch dropped


def test_pair_batches_visit_every_caption_once(tiny, tmp_path):
    trainer = Trainer(_cfg(tiny, tmp_path / "p", epochs=1, batch_size=50), **QUIET)
    caps = np.concatenate([cap for _, cap, _ in trainer.batches(1)])
    assert len(caps) == 1200 and len(np.unique(caps)) == 1200  # 1200 = 24 batches of 50


def test_checkpoint_is_plain_data_and_rebuilds_the_model(tiny, tmp_path):
    trainer = Trainer(_cfg(tiny, tmp_path / "r", epochs=1), **QUIET)
    trainer.fit()
    ckpt = torch.load(tmp_path / "r" / "model_best.pt", weights_only=True)
    assert ckpt["model"]["kind"] == "vsepp" and isinstance(ckpt["vocab"][0], str)
    look = ckpt["loss"].pop("presentation")  # how reports show the loss: the checkpoint stands alone (#29)
    assert look["label"] == "NT-Xent" and look["params"] == {"tau": 0.1}
    assert ckpt["loss"] == {"name": "ntxent", "params": {"tau": 0.1}, "compat": False}
    model, vocab = build_from_checkpoint(ckpt)
    split = PrecompSplit(tiny, "dev")
    assert evaluate_model(model, split, tokenize_split(split, vocab)) == ckpt["metrics"]


class _Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def test_loading_never_runs_code_from_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": "cocos-checkpoint", "x": _Evil()}, path)
    with pytest.raises(CocosError, match="refers to exec, which a safe load does not run") as info:
        load_checkpoint(path)
    assert "weights_only" not in str(info.value)  # torch's advice to disable safe loading is never quoted
    assert not (tmp_path / "PWNED").exists()
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CocosError):
        load_checkpoint(path)


def test_truncated_checkpoint_and_foreign_dict(tmp_path):
    good = tmp_path / "good.pt"
    save_checkpoint(good, {"model": {}, "vocab": [], "state_dict": {}, "loss": {}, "data": {}, "epoch": 0})
    data = good.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CocosError, match="cut.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CocosError, match="not a cocos checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_bad_input_is_one_line_and_exit_2(tiny, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    cases = [
        ["train", "--data", str(tiny), "--out", str(out)],  # exists without --resume/--overwrite
        ["train", "--data", str(tiny), "--out", str(tmp_path / "x"), "--loss", "hinge"],
        ["train", "--data", str(tiny), "--out", str(tmp_path / "x"), "--model", "clip"],
        ["train", "--data", str(tmp_path / "nodata"), "--out", str(tmp_path / "x")],
        ["train", "--data", str(tiny), "--out", str(tmp_path / "y"), "--resume"],
        ["evaluate", str(tmp_path / "missing.pt"), "--data", str(tiny)],
    ]
    for args in cases:
        res = runner.invoke(app, args + ["--no-progress"])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2, (args, res.output)
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, res.output)
    assert (out / "keep.txt").read_text() == "mine"


def test_resume_refuses_another_model_kind_and_evaluate_refuses_wrong_dims(tiny, tmp_path):
    Trainer(_cfg(tiny, tmp_path / "k", epochs=1), **QUIET).fit()
    with pytest.raises(CocosError, match="is a vsepp model, not vsrn"):
        Trainer(_cfg(tiny, tmp_path / "k", epochs=2, model="vsrn"), resume=True, **QUIET)
    other = make_synthetic(tmp_path / "wide", n_train=20, n_dev=10, n_test=10, feature_dim=40, seed=2)
    res = runner.invoke(app, ["evaluate", str(tmp_path / "k" / "model_best.pt"), "--data", str(other),
                              "--no-progress"])
    assert res.exit_code == 2 and "dimension 40" in res.output and "expects 32" in res.output


def test_vsrn_trains_on_region_features(tmp_path):
    data = make_synthetic(tmp_path / "reg", n_train=64, n_dev=20, n_test=20, feature_dim=16, regions=True)
    trainer = Trainer(_cfg(data, tmp_path / "v", model="vsrn", epochs=1, batch_size=16), **QUIET)
    assert trainer.train_split.is_regions
    metrics = trainer.fit()
    assert set(metrics) >= {"rsum", "i2t_R@1", "mAP@5"}
    assert build_model("vsrn", **load_checkpoint(tmp_path / "v" / "last.pt")["model"]["hparams"]).kind == "vsrn"


def test_an_epoch_visits_every_caption_even_with_a_short_last_batch(tiny, tmp_path):
    trainer = Trainer(_cfg(tiny, tmp_path / "short", epochs=1, batch_size=70), **QUIET)
    caps = np.concatenate([cap for _, cap, _ in trainer.batches(1)])
    assert sorted(caps.tolist()) == list(range(1200))  # 17 batches of 70 and one of 10


def test_nonsense_flags_fail_before_anything_is_written(tiny, tmp_path):
    for flags in (["--lr", "-1"], ["--lr", "nan"], ["--lr-update", "0"], ["--seed", "-3"], ["--epochs", "0"],
                  ["--tau", "0", "--loss", "ntxent"], ["--margin", "inf"], ["--warmup-epochs", "2", "--loss", "ntxent"]):
        out = tmp_path / "never"
        res = runner.invoke(app, ["train", "--data", str(tiny), "--out", str(out), "--no-progress", *flags])
        assert res.exit_code == 2, (flags, res.output)
        assert len([x for x in res.output.splitlines() if x.strip()]) == 1, res.output
        assert not out.exists(), flags


def test_resume_refuses_changed_flags(tiny, tmp_path):
    Trainer(_cfg(tiny, tmp_path / "f", epochs=1), **QUIET).fit()
    with pytest.raises(CocosError, match="--lr 0.002, not 0.5"):
        Trainer(_cfg(tiny, tmp_path / "f", epochs=2, lr=0.5), resume=True, **QUIET)
    with pytest.raises(CocosError, match="--embed-size 32, not 64"):
        Trainer(_cfg(tiny, tmp_path / "f", epochs=2, embed_size=64), resume=True, **QUIET)


def test_warm_up_epochs_use_the_specs_warm_up_loss_and_are_marked_in_the_log(tiny, tmp_path):
    lines = []
    trainer = Trainer(_cfg(tiny, tmp_path / "w", epochs=2, loss="triplet_sh", warmup_epochs=1), progress=False,
                      log=lines.append)
    assert trainer.warmup_fn.name == "triplet" and trainer.loss_fn.name == "triplet_sh"
    trainer.fit()
    epochs = [line for line in lines if line.startswith("epoch")]
    assert "(warm-up: triplet loss)" in epochs[0] and "warm-up" not in epochs[1]
