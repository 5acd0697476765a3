"""``cocos demo --images`` at tiny size: the rendered world, a fine-tuned ResNet-18, the report with its
tables and figures, reuse of matching checkpoints, and the flags and folders it refuses.

That a ResNet-18 fine-tuned from random initialisation on the rendered world beats an untrained
model is proved in tests/test_train_images.py (the demo trains it with the same trainer)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cocos.results import cnn_name, model_label
from cocos_cli.main import app
from tests.helpers import one_error_line

runner = CliRunner()
TINY = ["--images", "--loss", "triplet", "--epochs", "1", "--n-train", "30", "--n-test", "20", "--image-size", "20",
        "--crop-size", "16", "--embed-size", "16", "--word-dim", "8", "--batch-size", "10", "--no-progress"]


def _args(tmp_path, *extra):
    return ["demo", "--out", str(tmp_path / "rep"), "--data", str(tmp_path / "img"), "--checkpoints",
            str(tmp_path / "ck"), *TINY, *extra]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dimg")
    first = runner.invoke(app, _args(tmp))
    assert first.exit_code == 0, first.output
    return tmp, first.output


def test_image_demo_writes_the_report_with_tables_and_figures(demo):
    tmp, output = demo
    assert "generating the synthetic image world" in output and "training vsepp_full for 1 epochs" in output
    rep = tmp / "rep"
    readme = (rep / "README.md").read_text()
    assert readme.startswith("# cocos demo --images: COCOS on the synthetic image world")
    assert "Table 1" in readme and "Table 2" in readme and "ResNet-18" in readme and "RandomResizedCrop(16)" in readme
    assert "Resize(18) + CenterCrop(16)" in readme  # round(16 * 256 / 224) = 18
    assert "warm-up" not in readme  # no Triplet SH model in this demo
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert "triplet/triplet_diagram.png" in figures and "triplet/eps_sweep.png" in figures  # its only model's
    assert all((rep / f).is_file() for f in figures), figures
    for name in ("summary/cocos_vs_rsum.png", "summary/tables.md", "triplet/counts.png", "triplet/triplet_diagram.png",
                 "triplet/eps_sweep.png", "triplet/batches.csv"):
        assert (rep / name).stat().st_size > 0, name
    res = json.loads((rep / "triplet" / "results.json").read_text())
    assert res["model"]["kind"] == "vsepp_full" and res["model"]["label"] == "VSE++ (ResNet-18, fine-tuned)"
    assert res["model"]["hparams"]["finetune"] is True and res["model"]["hparams"]["cnn_type"] == "resnet18"
    # every training image counted once, k = 5 captions each; the 20 test images evaluated
    assert (res["data"]["n_images"], res["data"]["n_captions"]) == (30, 150)
    assert res["evaluation"]["split"] == "test"
    rsum = res["evaluation"]["metrics"]["rsum"]
    assert 0 <= rsum <= 600 and np.isfinite(rsum)
    # the rendered world went into its own folder in the VSE++ layout (JPEGs + Karpathy JSON)
    assert len(list((tmp / "img" / "images").glob("*.jpg"))) == 30 + 20 + 20
    assert (tmp / "img" / "dataset_synth.json").is_file() and not (tmp / "img" / "train_ims.npy").exists()
    ckpt_train = json.loads((rep / "triplet" / "results.json").read_text())["training"]
    assert ckpt_train["loss"] == "triplet"


def test_image_demo_reuses_exactly_the_matching_checkpoints(demo):
    """The decision the second ``cocos demo --images`` takes (tests/test_demo.py runs the feature demo twice):
    the same settings on the same images reuse the model, whatever the number of decoding workers; another
    crop, CNN or image content trains again."""
    from dataclasses import replace

    from cocos.data.images import load_image_split
    from cocos.pipelines.demo import _reusable, _train_config, image_demo_config

    tmp, _ = demo
    cfg = image_demo_config(out=str(tmp / "rep"), data=str(tmp / "img"), checkpoints=str(tmp / "ck"),
                            losses=["triplet"], epochs=1, n_train=30, n_dev=20, n_test=20, image_size=20,
                            crop_size=16, embed_size=16, word_dim=8, batch_size=10)
    fingerprint = load_image_split(tmp / "img", "train").fingerprint()
    assert _reusable(_train_config(cfg, "triplet"), fingerprint)
    assert _reusable(_train_config(replace(cfg, workers=2), "triplet"), fingerprint)
    assert not _reusable(_train_config(replace(cfg, crop_size=12), "triplet"), fingerprint)
    assert not _reusable(_train_config(replace(cfg, cnn="resnet34"), "triplet"), fingerprint)
    assert not _reusable(_train_config(replace(cfg, epochs=2), "triplet"), fingerprint)
    assert not _reusable(_train_config(cfg, "triplet"), "0" * len(fingerprint))


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
    assert not (tmp_path / "img").exists() and not (tmp_path / "rep").exists()


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
    paths = [cfg.out + "/x", cfg.data + "/x", cfg.checkpoints + "/x/last.pt"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.stdout.split() == paths
    assert cfg.images and (cfg.out, cfg.data) == ("reports/demo_images", "data/synth_images")
