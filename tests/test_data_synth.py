"""The synthetic world: determinism, layout, captions true to their scenes, and `cocos data synth`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cocos.data.precomp import PrecompSplit
from cocos.data.synth import (
    COLOURS,
    POSITION_KEYWORDS,
    SHAPES,
    SIZES,
    generate_world,
    make_synthetic,
    mentioned_attributes,
)
from cocos.data.text import Vocabulary, tokenize
from cocos.errors import CocosError

TINY = dict(n_train=12, n_dev=4, n_test=5, feature_dim=16, n_regions=5)
FILES = [f"{s}_{kind}" for s in ("train", "dev", "test") for kind in ("ims.npy", "caps.txt")]


def _bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    a = make_synthetic(tmp_path / "a", seed=3, **TINY)
    b = make_synthetic(tmp_path / "b", seed=3, **TINY)
    c = make_synthetic(tmp_path / "c", seed=4, **TINY)
    ba, bb, bc = _bytes(a), _bytes(b), _bytes(c)
    assert sorted(ba) == sorted(FILES + ["synth.json"])
    assert ba == bb
    for name in FILES:
        assert ba[name] != bc[name], name


def test_dev_and_test_do_not_depend_on_train_size():
    small = generate_world(seed=1, **{**TINY, "n_train": 3})
    large = generate_world(seed=1, **{**TINY, "n_train": 9})
    for split in ("dev", "test"):
        assert small.splits[split].captions == large.splits[split].captions
        assert np.array_equal(small.splits[split].regions, large.splits[split].regions)
    assert len(large.splits["train"].captions) == 9 * 5


@pytest.mark.parametrize("regions", [False, True])
def test_layout_loads_through_precomp(tmp_path, regions):
    out = make_synthetic(tmp_path / "w", seed=0, regions=regions, k=3, **TINY)
    world = generate_world(seed=0, regions=regions, k=3, **TINY)
    for split, n in (("train", 12), ("dev", 4), ("test", 5)):
        s = PrecompSplit(out, split, k=3)
        assert isinstance(s.features, np.memmap) and s.features.dtype == np.float32
        assert s.n_images == n and s.n_captions == 3 * n
        assert s.feature_shape == ((5, 16) if regions else (16,)) and s.is_regions == regions
        assert s.captions == world.splits[split].captions
        assert np.isfinite(np.asarray(s.features)).all()
    params = json.loads((out / "synth.json").read_text())
    assert params["seed"] == 0 and params["regions"] == regions and params["k"] == 3
    assert (params["n_train"], params["n_dev"], params["n_test"]) == (12, 4, 5)


def test_global_features_are_the_mean_of_the_regions(tmp_path):
    g = make_synthetic(tmp_path / "g", seed=2, **TINY)
    r = make_synthetic(tmp_path / "r", seed=2, regions=True, **TINY)
    regions = np.load(r / "test_ims.npy")
    pooled = np.load(g / "test_ims.npy")
    assert regions.shape == (5, 5, 16) and pooled.shape == (5, 16)
    assert np.array_equal(pooled, regions.mean(axis=1, dtype=np.float64).astype(np.float32))
    assert (g / "test_caps.txt").read_bytes() == (r / "test_caps.txt").read_bytes()


def test_captions_describe_their_own_scene():
    world = generate_world(seed=5, n_train=150, n_dev=1, n_test=1, feature_dim=8)
    split = world.splits["train"]
    surface = {w: ("shape", c) for c, ws in SHAPES.items() for w in ws}
    surface.update({w: ("colour", c) for c, ws in COLOURS.items() for w in ws})
    surface.update({w: ("size", c) for c, ws in SIZES.items() for w in ws})
    n_pairs = 0
    for i, scene in enumerate(split.scenes):
        assert 1 <= len(scene) <= 4
        assert len({o.position for o in scene}) == len(scene)
        for caption in split.captions[5 * i : 5 * i + 5]:
            said = mentioned_attributes(caption)
            assert said["shape"] or said["colour"], caption
            assert said["shape"] <= {o.shape for o in scene}, caption
            assert said["colour"] <= {o.colour for o in scene}, caption
            assert said["size"] <= {o.size for o in scene}, caption
            assert said["position"] <= {o.position for o in scene}, caption
            # "<colour> <shape>" next to each other is one object of the scene (binding)
            tokens = tokenize(caption)
            for left, right in zip(tokens, tokens[1:], strict=False):
                a, b = surface.get(left), surface.get(right)
                if a and b and a[0] == "colour" and b[0] == "shape":
                    n_pairs += 1
                    assert any(o.colour == a[1] and o.shape == b[1] for o in scene), caption
    assert n_pairs > 100


def test_captions_are_partial_and_varied():
    world = generate_world(seed=0, n_train=200, n_dev=1, n_test=1, feature_dim=8)
    split = world.splits["train"]
    said = [mentioned_attributes(c) for c in split.captions]
    share_size = np.mean([bool(s["size"]) for s in said])
    share_pos = np.mean([bool(s["position"]) for s in said])
    assert 0.2 < share_size < 0.9 and 0.2 < share_pos < 0.9
    # captions that name fewer colours than the scene has distinct colours
    fewer = sum(
        len(s["colour"]) < len({o.colour for o in split.scenes[c // 5]})
        for c, s in enumerate(said)
    )
    assert fewer > 0.1 * len(said)
    distinct = [len(set(split.captions[5 * i : 5 * i + 5])) for i in range(200)]
    assert np.mean(distinct) > 4.5
    # synonyms are used: more than one surface word per colour
    words = {w for c in split.captions for w in tokenize(c)}
    assert all(len(words.intersection(ws)) >= 2 for ws in COLOURS.values())
    assert set(POSITION_KEYWORDS["left"]) <= words
    # and many images share a (colour, shape) object: captions are ambiguous across images
    objects = [(o.colour, o.shape) for scene in split.scenes for o in scene]
    _, counts = np.unique(np.array(objects), axis=0, return_counts=True)
    assert counts.max() >= 10
    vocab = Vocabulary.build(split.captions)
    assert all(w in vocab for ws in SHAPES.values() for w in ws[:1])


def test_features_carry_the_scene():
    """A linear probe on the global features finds which shapes and colours a scene holds."""
    world = generate_world(seed=0, n_train=400, n_dev=1, n_test=200, feature_dim=64)

    def xy(split):
        s = world.splits[split]
        x = np.c_[s.global_features.astype(np.float64), np.ones(len(s.scenes))]
        y = np.array([[any(o.shape == v for o in sc) for v in SHAPES]
                      + [any(o.colour == v for o in sc) for v in COLOURS] for sc in s.scenes], float)
        return x, y

    x, y = xy("train")
    xt, yt = xy("test")
    w = np.linalg.solve(x.T @ x + np.eye(x.shape[1]), x.T @ y)
    acc = ((xt @ w > 0.5) == (yt > 0.5)).mean(0)
    base = np.maximum(yt.mean(0), 1 - yt.mean(0))  # always guessing the majority
    assert acc.mean() > 0.85 and acc.mean() > base.mean() + 0.08
    shuffled = ((xt[::-1] @ w > 0.5) == (yt > 0.5)).mean(0)  # features of other scenes
    assert shuffled.mean() < base.mean() + 0.03


def test_refuses_non_empty_folder_and_bad_parameters(tmp_path):
    out = tmp_path / "w"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(CocosError, match="not empty"):
        make_synthetic(out, **TINY)
    assert (out / "keep.txt").read_text() == "precious"
    with pytest.raises(CocosError, match="not written by cocos"):  # a user's folder: never replaced
        make_synthetic(out, overwrite=True, **TINY)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    world = tmp_path / "world"
    make_synthetic(world, **TINY)
    with pytest.raises(CocosError, match="--overwrite"):  # a dataset: replaced only with --overwrite
        make_synthetic(world, **TINY)
    make_synthetic(world, overwrite=True, **TINY)
    assert (world / "train_ims.npy").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(CocosError, match="not a folder"):
        make_synthetic(tmp_path / "file", **TINY)
    for bad in ({"n_regions": 3}, {"n_train": 0}, {"k": 0}, {"seed": -1}, {"n_dev": 2.5}):
        with pytest.raises(CocosError):
            generate_world(**{**TINY, **bad})
    assert not (tmp_path / "x").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    make_synthetic(empty, **TINY)  # an existing empty folder is fine
    assert (empty / "synth.json").exists()


# -- cli ----------------------------------------------------------------------------------


def _cli():
    pytest.importorskip("typer")
    from typer.testing import CliRunner

    from cocos_cli.main import app

    return CliRunner(), app


def test_cli_synth(tmp_path):
    runner, app = _cli()
    out = tmp_path / "w"
    args = ["data", "synth", str(out), "--n-train", "6", "--n-dev", "2", "--n-test", "3",
            "--feature-dim", "8", "--seed", "7"]
    res = runner.invoke(app, [*args, "--regions"])
    assert res.exit_code == 0, res.output
    assert PrecompSplit(out, "test").feature_shape == (6, 8)
    expected = generate_world(n_train=6, n_dev=2, n_test=3, feature_dim=8, seed=7, regions=True)
    assert PrecompSplit(out, "train").captions == expected.splits["train"].captions
    res = runner.invoke(app, args)  # exists, no --overwrite
    assert res.exit_code == 2
    assert "--overwrite" in res.output and len(res.output.strip().splitlines()) == 1
    assert PrecompSplit(out, "test").is_regions  # untouched
    res = runner.invoke(app, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert PrecompSplit(out, "test").feature_shape == (8,)
    res = runner.invoke(app, ["data", "synth", str(tmp_path / "v"), "--n-regions", "2"])
    assert res.exit_code == 2 and "n_regions" in res.output
    assert not (tmp_path / "v").exists()
    res = runner.invoke(app, ["data", "info", str(out)])
    assert res.exit_code == 0 and "train: 6 images, 30 captions" in res.output
