"""The image demo's attribute pre-training (cocos.training.pretrain) and its targets (cocos.data.synth_images):
targets hand-computed from scene records, the loss at uniform logits, the saved CNN read back by
load_cnn_weights giving the in-memory model's features, determinism for a seed, reuse, bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from cocos.data.synth import SceneObject
from cocos.data.synth_images import (
    attribute_classes,
    attribute_targets,
    flip_targets,
    generate_image_world,
    make_synthetic_images,
    read_scenes,
)
from cocos.errors import CocosError
from cocos.training.pretrain import (
    PretrainConfig,
    attribute_accuracy,
    attribute_loss,
    find_pretrained,
    n_outputs,
    pretrain_cnn,
)

TINY = PretrainConfig(epochs=1, batch_size=8, resize=18, crop_size=16, shift=1, seed=3)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pre") / "img"
    make_synthetic_images(folder, n_train=12, n_dev=6, n_test=4, image_size=20, seed=5, progress=False)
    return folder


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("pre") / "cnn"
    return pretrain_cnn(world, out, TINY, progress=False, log=lambda s: None)


def test_targets_are_the_scene_records_by_position_hand_computed():
    scenes = [(SceneObject("cube", "red", "large", "left"), SceneObject("disc", "black", "small", "center")),
              (SceneObject("sphere", "yellow", "medium", "right"),)]
    t = attribute_targets(scenes)
    assert t.shape == (2, 5, 3) and t.dtype == np.int64
    # positions left, right, top, bottom, center; classes 1 + the index of shape, colour, size (0: no object)
    expected = np.zeros((2, 5, 3), np.int64)
    expected[0, 0] = [2, 1, 3]  # cube (index 1), red (0), large (2), at the left
    expected[0, 4] = [8, 8, 1]  # disc (7), black (7), small (0), in the center
    expected[1, 1] = [1, 4, 2]  # sphere (0), yellow (3), medium (1), on the right
    np.testing.assert_array_equal(t, expected)
    flipped = flip_targets(t)  # mirrored: left and right swap, the rest stays
    np.testing.assert_array_equal(flipped[0, 1], [2, 1, 3])
    np.testing.assert_array_equal(flipped[1, 0], [1, 4, 2])
    np.testing.assert_array_equal(flipped[:, 2:], t[:, 2:])
    np.testing.assert_array_equal(flip_targets(flipped), t)
    assert attribute_classes() == (9, 9, 4) and n_outputs() == 110
    with pytest.raises(CocosError, match="two objects at position left"):
        attribute_targets([(SceneObject("cube", "red", "large", "left"), SceneObject("star", "red", "large", "left"))])


def test_read_scenes_gives_the_generated_scenes_in_image_order(world):
    """Two computations: the records written into the JSON and the scenes the generator draws for the seed."""
    drawn = generate_image_world(n_train=12, n_dev=6, n_test=4, seed=5)
    for split, label in (("train", "train"), ("dev", "dev"), ("test", "test")):
        assert read_scenes(world, split) == list(drawn[label][0])


def test_read_scenes_refuses_a_world_without_records(tmp_path, world):
    data = json.loads((world / "dataset_synth.json").read_text())
    for entry in data["images"]:
        entry.pop("scene")
    (tmp_path / "dataset_synth.json").write_text(json.dumps(data))
    with pytest.raises(CocosError, match="has no scene record") as err:
        read_scenes(tmp_path, "train")
    assert "\n" not in str(err.value)
    with pytest.raises(CocosError, match="cannot read the rendered world's scene records"):
        read_scenes(tmp_path / "absent", "train")
    data["images"][0]["scene"] = [{"shape": "hexagon", "colour": "red", "size": "small", "position": "left"}]
    (tmp_path / "dataset_synth.json").write_text(json.dumps(data))
    with pytest.raises(CocosError, match="shape 'hexagon' is not one of"):
        read_scenes(tmp_path, "train")


def test_loss_at_uniform_logits_and_accuracy():
    targets = torch.from_numpy(attribute_targets([(SceneObject("cube", "red", "large", "left"),)]))
    loss = attribute_loss(torch.zeros(1, n_outputs()), targets)
    # every head uniform: cross-entropy log(classes); mean over 5 positions x (shape, colour, size)
    assert float(loss) == pytest.approx((2 * math.log(9) + math.log(4)) / 3, rel=1e-6)
    logits = torch.full((1, 5, 22), -5.0)
    for p in range(5):  # predict "no object" everywhere but the right shape at the left
        logits[0, p, [0, 9, 18]] = 5.0
    logits[0, 0, 2] = 10.0
    acc = attribute_accuracy(logits.view(1, -1), targets)
    assert acc == pytest.approx({"shape": 1.0, "colour": 0.8, "size": 0.8})


def test_saved_cnn_loads_with_load_cnn_weights_and_gives_the_same_features(trained, world):
    from cocos.embed.features import load_cnn
    from cocos.models.cnn import build_cnn, load_cnn_weights, strip_classifier
    from cocos.training.pretrain import build_model

    assert trained.path.name.startswith("resnet18-") and trained.path.suffix == ".pth"
    state = torch.load(trained.path, weights_only=True)
    assert state["fc.weight"].shape == (110, 512)  # torchvision's resnet18(num_classes=110)
    model = build_model(TINY)
    model.load_state_dict(state)  # the full model, classifier included
    model.eval()
    trunk = load_cnn_weights(strip_classifier(build_cnn("resnet18")), trained.path).eval()
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pooled = torch.flatten(model.avgpool(model.feature_map(x)), 1)
        torch.testing.assert_close(trunk(x), pooled, rtol=0, atol=0)
        torch.testing.assert_close(load_cnn(trained.path, "resnet18")(x), pooled, rtol=0, atol=0)
    rec = json.loads((trained.path.parent / "pretrain.json").read_text())
    assert rec["weights"] == trained.path.name and rec["settings"]["epochs"] == 1 and rec["n_images"] == 12
    assert set(rec["dev_accuracy"]) == {"shape", "colour", "size"}


def test_pretraining_is_deterministic_for_a_seed_and_reused_only_when_it_matches(trained, world, tmp_path):
    from cocos.data.images import load_image_split
    from cocos.io import sha256_file

    again = pretrain_cnn(world, tmp_path / "again", TINY, progress=False, log=lambda s: None)
    assert sha256_file(again.path) == sha256_file(trained.path)
    other = pretrain_cnn(world, tmp_path / "other", replace(TINY, seed=4), progress=False, log=lambda s: None)
    assert sha256_file(other.path) != sha256_file(trained.path)
    fp = load_image_split(world, "train").fingerprint()
    assert find_pretrained(trained.path.parent, TINY, fp).path == trained.path
    assert find_pretrained(trained.path.parent, replace(TINY, device="cuda"), fp) is not None  # device: not a setting
    assert find_pretrained(trained.path.parent, replace(TINY, epochs=2), fp) is None
    assert find_pretrained(trained.path.parent, TINY, "0" * len(fp)) is None
    with open(again.path, "r+b") as fh:  # a damaged weights file is not reused
        fh.seek(200)
        fh.write(b"\0" * 8)
    assert find_pretrained(again.path.parent, TINY, fp) is None


@pytest.mark.parametrize("change, message", [({"epochs": 0}, "epochs must be an integer of at least 1"),
                                             ({"cnn": "alexnet"}, "unknown CNN 'alexnet'"),
                                             ({"lr": float("nan")}, "learning rate must be a positive number"),
                                             ({"crop_size": 0}, "crop size must be a positive")])
def test_bad_settings_are_one_line(change, message):
    with pytest.raises(CocosError, match=message) as err:
        replace(TINY, **change).validate()
    assert "\n" not in str(err.value)
