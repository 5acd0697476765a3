"""``cocos demo --images`` at tiny size: the rendered world, the CNN pre-trained on its attribute task, its frozen
features (cocos data features), VSE++ on them, the report with its tables and figures; the fine-tuning variant
(--finetune) from the same pre-trained CNN; reuse of the pre-trained CNN, the features and matching checkpoints;
the flags and folders it refuses.

The pre-training itself (targets, saved weights, determinism) is tested in tests/test_pretrain.py; that a
ResNet-18 fine-tuned on the rendered world beats an untrained model in tests/test_train_images.py (the
fine-tuning variant trains it with the same trainer)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cocos.results import cnn_name, model_label
from cocos_cli.main import app
from tests.helpers import empty_figures, figures_empty, one_error_line

runner = CliRunner()
TINY = ["--images", "--loss", "triplet", "--epochs", "1", "--n-train", "30", "--n-test", "20", "--image-size", "20",
        "--crop-size", "16", "--embed-size", "16", "--word-dim", "8", "--batch-size", "10", "--pretrain-epochs", "1",
        "--no-progress"]


def _args(tmp_path, *extra, out="rep"):
    return ["demo", "--out", str(tmp_path / out), "--data", str(tmp_path / "img"), "--checkpoints",
            str(tmp_path / "ck"), *TINY, *extra]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dimg")
    with figures_empty({"pdf"}):  # the PNGs, which the report shows and the tests check, are drawn
        first = runner.invoke(app, _args(tmp))
    assert first.exit_code == 0, first.output
    return tmp, first.output


def _config(tmp, **kw):
    from cocos.pipelines.demo import image_demo_config

    return image_demo_config(out=str(tmp / "rep"), data=str(tmp / "img"), checkpoints=str(tmp / "ck"),
                             losses=["triplet"], epochs=1, n_train=30, n_dev=20, n_test=20, image_size=20,
                             crop_size=16, embed_size=16, word_dim=8, batch_size=10, pretrain_epochs=1, **kw)


def test_image_demo_pretrains_writes_features_and_the_report(demo):
    tmp, output = demo
    assert "generating the synthetic image world" in output and "training vsepp for 1 epochs" in output
    assert "[pre-training] resnet18 on the attribute task" in output and "[features] cocos data features" in output
    weights = list((tmp / "ck" / "cnn_pretrained").glob("resnet18-*.pth"))
    assert len(weights) == 1 and (tmp / "ck" / "cnn_pretrained" / "pretrain.json").is_file()
    # the features: the frozen CNN's, at the pre-training's transform Resize(round(16 * 256 / 224) = 18) + crop 16
    feats = list((tmp / "img" / "features").glob("resnet18-*-18-16"))
    assert len(feats) == 1
    manifest = json.loads((feats[0] / "cocos_features.json").read_text())
    assert manifest["weights_file"]["name"] == weights[0].name and manifest["dim"] == 512
    assert {s: e["n_images"] for s, e in manifest["splits"].items()} == {"train": 30, "dev": 20, "test": 20}
    rep = tmp / "rep"
    readme = (rep / "README.md").read_text()
    assert readme.startswith("# cocos demo --images: COCOS on the synthetic image world")
    assert "Table 1" in readme and "Table 2" in readme and "frozen ResNet-18 pre-trained on the attribute task" in readme
    assert "--resize 18 --crop-size 16" in readme and weights[0].name in readme and "Dev-split accuracy" in readme
    assert "warm-up" not in readme  # no Triplet SH model in this demo
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert "triplet/triplet_diagram.png" in figures and "triplet/eps_sweep.png" in figures  # its only model's
    assert all((rep / f).is_file() for f in figures), figures
    for name in ("summary/cocos_vs_rsum.png", "summary/tables.md", "triplet/counts.png", "triplet/triplet_diagram.png",
                 "triplet/eps_sweep.png", "triplet/batches.csv"):
        assert (rep / name).stat().st_size > 0, name
    res = json.loads((rep / "triplet" / "results.json").read_text())
    assert res["model"]["kind"] == "vsepp" and res["model"]["label"] == "VSE++ (frozen ResNet-18)"
    assert res["model"]["hparams"]["img_dim"] == 512
    # every training image counted once, k = 5 captions each; the 20 test images evaluated
    assert (res["data"]["n_images"], res["data"]["n_captions"]) == (30, 150)
    assert res["evaluation"]["split"] == "test"
    rsum = res["evaluation"]["metrics"]["rsum"]
    assert 0 <= rsum <= 600 and np.isfinite(rsum)
    # the rendered world went into its own folder in the VSE++ layout (JPEGs + Karpathy JSON)
    assert len(list((tmp / "img" / "images").glob("*.jpg"))) == 30 + 20 + 20
    assert (tmp / "img" / "dataset_synth.json").is_file() and not (tmp / "img" / "train_ims.npy").exists()
    assert res["training"]["loss"] == "triplet" and res["data"]["path"] == str(feats[0])


def test_image_demo_says_where_it_is_without_a_bar(demo):
    """--no-progress: the pre-training still reports each epoch (a long one also a line a minute, cocos.progress),
    and the report's figures are announced before they are drawn."""
    _, output = demo
    assert re.search(r"^\[pre-training\] epoch 1/1: loss \d+\.\d{4} \(\d+ s\)$", output, re.M), output
    assert "writing the report: the tables and figures of 1 model(s)" in output


def test_image_demo_rerun_reuses_the_cnn_the_features_and_the_model(demo, monkeypatch):
    empty_figures(monkeypatch)  # the files, not their drawing (tests/test_report_figures.py, test_figure_print.py)
    tmp, _ = demo
    again = runner.invoke(app, _args(tmp))
    assert again.exit_code == 0, again.output
    assert "[pre-training] reusing" in again.output and "[features] reusing" in again.output
    assert "[triplet] reusing" in again.output and "training vsepp" not in again.output


def test_image_demo_reuses_exactly_the_matching_checkpoints(demo):
    """The decision the second ``cocos demo --images`` takes: the same settings on the same features reuse the
    model, whatever the number of decoding workers; other features (another CNN) or epochs train again."""
    from dataclasses import replace

    from cocos.data.precomp import data_fingerprint
    from cocos.pipelines.demo import _reusable, _train_config

    tmp, _ = demo
    cfg = _config(tmp)
    feats = next((tmp / "img" / "features").glob("resnet18-*-18-16"))
    fingerprint = data_fingerprint(feats)
    assert _reusable(_train_config(cfg, "triplet", feats), fingerprint)
    assert _reusable(_train_config(replace(cfg, workers=2), "triplet", feats), fingerprint)
    assert not _reusable(_train_config(cfg, "triplet", feats.with_name("resnet18-0-18-16")), fingerprint)
    assert not _reusable(_train_config(replace(cfg, epochs=2), "triplet", feats), fingerprint)
    assert not _reusable(_train_config(cfg, "triplet", feats), "0" * len(fingerprint))


def test_image_demo_finetune_starts_from_the_pretrained_cnn(demo, monkeypatch):
    empty_figures(monkeypatch)  # the files, not their drawing (tests/test_report_figures.py, test_figure_print.py)
    from cocos.training.checkpoint import load_checkpoint

    tmp, _ = demo
    res = runner.invoke(app, _args(tmp, "--finetune", out="rep_ft"))
    assert res.exit_code == 0, res.output
    assert "[pre-training] reusing" in res.output and "[features]" not in res.output
    assert "training vsepp_full for 1 epochs" in res.output
    weights = next((tmp / "ck" / "cnn_pretrained").glob("resnet18-*.pth"))
    ckpt = load_checkpoint(tmp / "ck" / "finetune" / "triplet" / "model_best.pt")
    assert ckpt["train"]["model"]["cnn_weights"] == str(weights) and ckpt["model"]["hparams"]["finetune"] is True
    out = json.loads((tmp / "rep_ft" / "triplet" / "results.json").read_text())
    assert out["model"]["kind"] == "vsepp_full" and out["model"]["label"] == "VSE++ (ResNet-18, fine-tuned)"
    assert (out["data"]["n_images"], out["data"]["n_captions"]) == (30, 150)
    readme = (tmp / "rep_ft" / "README.md").read_text()
    assert readme.startswith("# cocos demo --images --finetune:") and "RandomResizedCrop(16)" in readme
    assert "Resize(18) + CenterCrop(16)" in readme
    assert (tmp / "rep" / "README.md").is_file()  # the frozen demo's report is left as it was


def test_image_demo_refuses_a_feature_world_and_image_flags_without_images(tmp_path):
    feats = tmp_path / "feat"
    feats.mkdir()
    np.save(feats / "train_ims.npy", np.zeros((5, 4), np.float32))
    res = runner.invoke(app, ["demo", "--out", str(tmp_path / "r"), "--data", str(feats), "--checkpoints",
                              str(tmp_path / "c"), *TINY])
    assert res.exit_code == 2 and "holds precomputed features" in one_error_line(res)
    assert sorted(p.name for p in feats.iterdir()) == ["train_ims.npy"]
    assert not (tmp_path / "r").exists() and not (tmp_path / "c").exists()
    res = runner.invoke(app, ["demo", "--out", str(tmp_path / "r"), "--crop-size", "16"])
    assert res.exit_code == 2 and "--crop-size only apply to cocos demo --images" in one_error_line(res)
    res = runner.invoke(app, _args(tmp_path, "--n-train", "1"))  # pair batches of 10 from 5 captions: before training
    assert "--batch-size 10 is larger than the training split" in one_error_line(res)
    res = runner.invoke(app, _args(tmp_path, "--cnn", "alexnet"))
    assert res.exit_code == 2 and "unknown CNN 'alexnet'" in one_error_line(res)
    res = runner.invoke(app, _args(tmp_path, "--pretrain-epochs", "0"))
    assert "--pretrain-epochs must be an integer of at least 1" in one_error_line(res)
    res = runner.invoke(app, ["demo", "--out", str(tmp_path / "r"), "--finetune"])
    assert "--finetune only apply to cocos demo --images" in one_error_line(res)
    assert not (tmp_path / "img").exists() and not (tmp_path / "rep").exists()


def test_image_demo_refuses_images_without_scene_records(tmp_path):
    """An image dataset that cocos did not render has no attribute labels: one line before anything is written."""
    from cocos.data.synth_images import make_synthetic_images

    img = tmp_path / "img"
    make_synthetic_images(img, n_train=12, n_dev=4, n_test=4, image_size=16, progress=False)
    data = json.loads((img / "dataset_synth.json").read_text())
    for entry in data["images"]:
        entry.pop("scene")
    (img / "dataset_synth.json").write_text(json.dumps(data))
    res = runner.invoke(app, _args(tmp_path, "--n-train", "12"))
    assert "has no scene record" in one_error_line(res)
    assert not (tmp_path / "ck").exists() and not (tmp_path / "rep").exists() and not (img / "features").exists()


def test_model_labels_name_the_cnn_and_whether_it_trained():
    assert model_label("vsepp") == "VSE++" and model_label("vsrn", {"cnn_type": "resnet18"}) == "VSRN"
    assert model_label("vsepp_full", {"cnn_type": "resnet152", "finetune": False}) == "VSE++ (ResNet-152, frozen)"
    assert model_label("vsepp_full", {"cnn_type": "vgg19", "finetune": True}) == "VSE++ (VGG-19, fine-tuned)"
    assert cnn_name("resnet50") == "ResNet-50" and cnn_name("other") == "other"


def test_image_demo_writes_only_where_git_ignores():
    """Its default folders, like the feature demo's (tests/test_packaging.py), are ignored by git."""
    import subprocess
    from pathlib import Path

    from cocos.pipelines.demo import image_demo_config

    cfg, root = image_demo_config(), Path(__file__).resolve().parents[1]
    tuned = image_demo_config(finetune=True)
    paths = [cfg.out + "/x", cfg.data + "/x", cfg.checkpoints + "/x/last.pt", tuned.out + "/x",
             cfg.data + "/features/x/train_ims.npy", cfg.checkpoints + "/cnn_pretrained/resnet18-0.pth"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.stdout.split() == paths
    assert cfg.images and (cfg.out, cfg.data) == ("reports/demo_images", "data/synth_images")
    assert tuned.finetune and (tuned.data, tuned.checkpoints) == (cfg.data, cfg.checkpoints) and tuned.out != cfg.out
