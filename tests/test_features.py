"""``cocos data features``: the frozen-CNN feature cache (cocos.embed.features).

The cached rows are recomputed here independently, image by image: Pillow opens the JPEG, the
evaluation transform is restated with Pillow and numpy (shorter side to ``resize``, truncated, BILINEAR;
the centre crop with Python's round; ``(x / 255 - mean) / std``), and the CNN is a fresh ResNet-18 with
the weights file loaded. Tiny: rendered 32 px images, Resize 32 + CenterCrop 28.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from cli.main import app
from cocos.data.synth_images import make_synthetic_images
from cocos.embed.features import MANIFEST, cnn_state_hash, staging_dir, write_feature_cache
from cocos.models.cnn import build_cnn, load_cnn_weights, strip_classifier

runner = CliRunner()
RESIZE, CROP = 32, 28
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def eval_pixels(path: Path, resize: int, crop: int) -> torch.Tensor:
    """VSE++'s val transform, restated: Resize(resize) (shorter side), CenterCrop(crop), ToTensor, Normalize."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    size = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    img = img.resize(size, Image.BILINEAR)
    top, left = int(round((img.size[1] - crop) / 2.0)), int(round((img.size[0] - crop) / 2.0))
    img = img.crop((left, top, left + crop, top + crop))
    x = (np.asarray(img, dtype=np.float64) / 255.0 - MEAN) / STD
    return torch.from_numpy(x.transpose(2, 0, 1).copy()).float()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    make_synthetic_images(root / "w", n_train=10, n_dev=3, n_test=4, image_size=32, seed=3)
    torch.manual_seed(11)
    cnn = build_cnn("resnet18")
    with torch.no_grad():  # BatchNorm statistics away from identity: a test that can tell them apart
        for m in cnn.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    torch.save(cnn.state_dict(), root / "r18.pth")
    with torch.device("meta"):
        shapes = {k: (v.shape, v.dtype) for k, v in build_cnn("resnet34").state_dict().items()}
    torch.save({k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in shapes.items()}, root / "r34.pth")
    return root


def features(world, out, *extra):
    return runner.invoke(app, ["data", "features", str(world / "w"), "--cnn", "resnet18", "--cnn-weights",
                               str(world / "r18.pth"), "--out", str(out), "--resize", str(RESIZE), "--crop-size",
                               str(CROP), "--workers", "0", "--batch-size", "3", "--no-progress", *extra])


def test_cached_rows_are_the_cnn_pooled_features_of_each_image(world, tmp_path):
    out = tmp_path / "cache"
    res = features(world, out)
    assert res.exit_code == 0, res.output
    trunk = load_cnn_weights(strip_classifier(build_cnn("resnet18")), world / "r18.pth").eval()
    entries = json.loads((world / "w" / "dataset_synth.json").read_text())["images"]
    for split, label in (("train", "train"), ("dev", "val"), ("test", "test")):
        mine = [e for e in entries if e["split"] == label]
        rows = np.load(out / f"{split}_ims.npy")
        with torch.no_grad():
            want = trunk(torch.stack([eval_pixels(world / "w" / "images" / e["filename"], RESIZE, CROP)
                                      for e in mine])).numpy()
        assert rows.shape == (len(mine), 512) and rows.dtype == np.float32
        np.testing.assert_allclose(rows, want, rtol=0, atol=1e-4)
        assert np.abs(want).max() > 1e-2 and np.abs(want[0] - want[1]).max() > 1e-3  # not degenerate
        captions = (out / f"{split}_caps.txt").read_text().splitlines()
        assert captions == [" ".join(s["raw"].split()) for e in mine for s in e["sentences"][:5]]
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["cnn_type"] == "resnet18" and (manifest["resize"], manifest["crop_size"]) == (RESIZE, CROP)
    assert manifest["weights_file"]["sha256"] == hashlib.sha256((world / "r18.pth").read_bytes()).hexdigest()
    assert manifest["cnn_hash"] == cnn_state_hash(trunk)
    assert {s: v["n_images"] for s, v in manifest["splits"].items()} == {"train": 10, "dev": 3, "test": 4}
    info = runner.invoke(app, ["data", "info", str(out)])  # a precomputed folder like any other
    assert info.exit_code == 0 and "train: 10 images, 50 captions, features (512,)" in info.output, info.output
    from cocos.pipelines.analyze import _dataset_name

    # an analysis on the cache names the image dataset and the CNN, not the cache folder's hash-like name
    assert _dataset_name(out) == f"{_dataset_name(world / 'w')}, ResNet-18 features"


def test_weights_hash_tells_weights_apart_but_not_the_batchnorm_counter():
    import copy

    a = strip_classifier(build_cnn("resnet18"))
    b = copy.deepcopy(a)
    b.bn1.num_batches_tracked.fill_(7)
    assert cnn_state_hash(a) == cnn_state_hash(b)
    with torch.no_grad():
        b.layer4[1].bn2.running_var[0] += 1e-3
    assert cnn_state_hash(a) != cnn_state_hash(b)


class Killed(Exception):
    pass


def test_a_killed_run_resumes_after_its_last_batch_and_gives_the_same_files(world, tmp_path):
    trunk = load_cnn_weights(strip_classifier(build_cnn("resnet18")), world / "r18.pth")
    kw = {"cnn_type": "resnet18", "resize": RESIZE, "crop_size": CROP, "batch_size": 3,
          "weights_file": world / "r18.pth"}
    whole = tmp_path / "whole"
    write_feature_cache(world / "w", whole, trunk, **kw)

    calls = []

    def kill_after_four(split, done):
        calls.append((split, done))
        if len(calls) == 4:  # train's rows 0-8 and 9 done, dev not started
            raise Killed

    out = tmp_path / "out"
    with pytest.raises(Killed):
        write_feature_cache(world / "w", out, trunk, on_batch=kill_after_four, **kw)
    assert not out.exists() and staging_dir(out).is_dir()  # nothing visible half-written
    assert json.loads((staging_dir(out) / "progress.json").read_text())["done"] == {"train": 10, "dev": 0,
                                                                                    "test": 0}
    resumed = []
    write_feature_cache(world / "w", out, trunk, workers=1, on_batch=lambda s, d: resumed.append((s, d)), **kw)
    assert resumed == [("dev", 3), ("test", 3), ("test", 4)]  # only the missing batches were computed
    assert not staging_dir(out).exists()
    for name in sorted(p.name for p in whole.iterdir()):
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name

    # other inputs (another crop): the stale partial run is not continued
    with pytest.raises(Killed):
        calls.clear()
        write_feature_cache(world / "w", tmp_path / "o2", trunk, on_batch=kill_after_four, **kw)
    again = []
    write_feature_cache(world / "w", tmp_path / "o2", trunk, on_batch=lambda s, d: again.append(d),
                        **{**kw, "crop_size": CROP - 4})
    assert again[0] == 3 and np.load(tmp_path / "o2" / "train_ims.npy").shape == (10, 512)


def test_bad_input_is_one_line_and_writes_nothing(world, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(world / "w", broken)
    first = sorted((broken / "images").iterdir())[0]
    first.write_bytes(first.read_bytes()[:200])  # a truncated JPEG
    out = tmp_path / "o1"
    res = runner.invoke(app, ["data", "features", str(broken), "--cnn", "resnet18", "--cnn-weights",
                              str(world / "r18.pth"), "--out", str(out), "--crop-size", "28", "--resize", "32",
                              "--workers", "0", "--no-progress"])
    line = one_error_line(res)
    assert first.name in line and ("corrupt" in line or "truncated" in line), line
    assert not out.exists() and not staging_dir(out).exists()

    first.unlink()  # a Karpathy JSON naming a missing file
    line = one_error_line(runner.invoke(app, ["data", "features", str(broken), "--cnn", "resnet18", "--cnn-weights",
                                              str(world / "r18.pth"), "--out", str(out), "--no-progress"]))
    assert "missing" in line and first.name in line, line

    line = one_error_line(runner.invoke(app, ["data", "features", str(world / "w"), "--cnn", "resnet18",
                                              "--cnn-weights", str(world / "r34.pth"), "--out", str(out)]))
    assert "r34.pth" in line and "resnet34" in line, line
    line = one_error_line(runner.invoke(app, ["data", "features", str(world / "w"), "--cnn", "inception_v3",
                                              "--cnn-weights", str(world / "r18.pth"), "--out", str(out)]))
    assert "inception_v3" in line, line
    assert not out.exists() and not staging_dir(out).exists()

    existing = tmp_path / "mine"
    existing.mkdir()
    (existing / "notes.txt").write_text("keep")
    line = one_error_line(features(world, existing))
    assert "not written by cocos" in line and (existing / "notes.txt").read_text() == "keep"
