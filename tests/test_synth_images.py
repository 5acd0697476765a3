"""The rendered demo world: determinism, the VSE++ layout, pixels and captions true to the scenes,
hard near-duplicates, atomic writing and `cocos data synth --images`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cocos.data import synth_images
from cocos.data.images import load_image_split
from cocos.data.synth import SceneObject, mentioned_attributes
from cocos.data.synth_images import CENTRES, RGB, make_synthetic_images, render_scene
from cocos.errors import CocosError
from tests.helpers import one_error_line, snapshot

TINY = dict(n_train=6, n_dev=2, n_test=3, image_size=16, progress=False)


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _scenes(folder):
    data = json.loads((folder / "dataset_synth.json").read_text())
    return data["images"]


def test_deterministic_and_readable(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    make_synthetic_images(a, seed=3, **TINY)
    make_synthetic_images(b, seed=3, **TINY)
    make_synthetic_images(c, seed=4, **TINY)
    assert _files(a) == _files(b) and _files(a) != _files(c)
    for split, n in (("train", 6), ("dev", 2), ("test", 3)):
        s = load_image_split(a, split)
        assert s.n_images == n and s.n_captions == 5 * n and s.image_captions().shape == (n, 5)
        assert s.image(0).size == (16, 16)
    # dev/test do not depend on n_train
    make_synthetic_images(b, seed=3, overwrite=True, **{**TINY, "n_train": 9})
    assert load_image_split(b, "test").fingerprint() == load_image_split(a, "test").fingerprint()


def test_captions_describe_their_scene(tmp_path):
    make_synthetic_images(tmp_path / "w", seed=1, **TINY)
    entries = _scenes(tmp_path / "w")
    assert [e["split"] for e in entries] == ["train"] * 6 + ["val"] * 2 + ["test"] * 3
    for entry in entries:
        scene = entry["scene"]
        for sent in entry["sentences"]:
            said = mentioned_attributes(sent["raw"])
            for key in ("shape", "colour", "size", "position"):
                assert said[key] <= {o[key] for o in scene}, (sent["raw"], scene)


def test_near_duplicates_differ_in_one_attribute(tmp_path):
    make_synthetic_images(tmp_path / "w", seed=2, p_near_duplicate=1.0, **{**TINY, "n_train": 8})
    scenes = [e["scene"] for e in _scenes(tmp_path / "w") if e["split"] == "train"]
    for i in range(1, len(scenes)):
        def n_diff(a, b):
            if len(a) != len(b):
                return None
            return sum(x[key] != y[key] for x, y in zip(a, b, strict=True) for key in x)
        assert any(n_diff(scenes[i], scenes[j]) == 1 for j in range(i)), i
        assert len({o["position"] for o in scenes[i]}) == len(scenes[i])  # positions stay distinct


def test_pixels_show_the_objects():
    rng = np.random.default_rng(0)
    for shape in ("sphere", "cube", "disc", "star", "cylinder"):
        for colour in ("red", "blue", "white"):
            for position in ("left", "top", "center"):
                img = np.asarray(render_scene((SceneObject(shape, colour, "large", position),), rng, 64), dtype=float)
                x, y = (int(f * 64) for f in CENTRES[position])
                assert np.abs(img[y, x] - RGB[colour]).max() < 40, (shape, colour, position, img[y, x])
                other = {"left": "right", "top": "bottom", "center": "left"}[position]
                ox, oy = (int(f * 64) for f in CENTRES[other])
                assert np.abs(img[oy, ox] - 128).max() < 45  # background there


def test_atomic_on_failure_and_refuses_non_empty(tmp_path, monkeypatch):
    out = tmp_path / "w"
    calls = []

    def broken(scene, rng, size):
        calls.append(1)
        if len(calls) > 3:
            raise CocosError("disk full")
        return render_scene(scene, rng, size)

    monkeypatch.setattr(synth_images, "render_scene", broken)
    with pytest.raises(CocosError, match="disk full"):
        make_synthetic_images(out, **TINY)
    assert list(tmp_path.iterdir()) == []
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CocosError, match="not empty"):
        make_synthetic_images(out, **TINY)
    with pytest.raises(CocosError, match="image_size"):
        make_synthetic_images(tmp_path / "x", **{**TINY, "image_size": 2})


def test_cli_synth_images(tmp_path):
    from typer.testing import CliRunner

    from cocos_cli.main import app

    runner = CliRunner()
    out = tmp_path / "world"
    args = ["data", "synth", str(out), "--images", "--n-train", "4", "--n-dev", "2", "--n-test", "2",
            "--image-size", "12", "--seed", "5", "--no-progress"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert len(list((out / "images").glob("*.jpg"))) == 8 and load_image_split(out, "dev").n_images == 2
    before = snapshot(tmp_path)
    line = one_error_line(runner.invoke(app, args))  # exists, no --overwrite
    assert "--overwrite" in line and "holds a cocos dataset" in line and snapshot(tmp_path) == before


def test_cli_info_on_image_datasets(tmp_path):
    from typer.testing import CliRunner

    from cocos_cli.main import app

    runner = CliRunner()
    out = tmp_path / "world"
    make_synthetic_images(out, seed=1, **TINY)
    res = runner.invoke(app, ["data", "info", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("train: 6 images, 30 captions (karpathy layout, from dataset_synth.json)")
    assert lines[2].startswith("test: 3 images, 15 captions")
    assert lines[1].endswith(load_image_split(out, "dev").fingerprint())
    (out / "images" / "synth_test_000001.jpg").unlink()
    line = one_error_line(runner.invoke(app, ["data", "info", str(out)]))
    assert "dataset_synth.json: 1 of 3 image files are missing" in line and "synth_test_000001.jpg" in line
    (out / "images" / "synth_test_000001.jpg").write_bytes(b"\xff\xd8garbage")
    assert runner.invoke(app, ["data", "info", str(out)]).exit_code == 0  # bytes are hashed, not decoded
    line = one_error_line(runner.invoke(app, ["data", "info", str(out), "--decode", "--no-progress"]))
    assert "synth_test_000001.jpg: " in line
    (tmp_path / "list.csv").write_text("image,caption\nworld/images/synth_test_000000.jpg,a\n")
    res = runner.invoke(app, ["data", "info", str(tmp_path / "list.csv"), "--decode", "--no-progress"])
    assert res.exit_code == 0 and res.output.startswith("train: 1 images, 1 captions (csv layout, from list.csv)")
