"""The feature cache under hostile input (issue 28, items 1-4): staging that cannot be hijacked or shared, resume
from damaged staging, and caches checked like checkpoints.

Each class of failure has one test. The reference is an uninterrupted run into another folder: a resumed,
concurrent or re-staged run must end byte-identical to it, with regular files only, nothing written outside its
output (a victim file beside it stays as it was) and nothing left behind. The CNN is a one-layer stand-in (the
cache code treats every CNN alike; ``tests/test_features.py`` checks the rows against a real ResNet); the world is
the smallest rendered one: 7 + 2 + 2 images of 16 px, batches of 3 (train's blocks: rows 0-2, 3-5, 6).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from cocos.data.images import load_image_split
from cocos.data.synth_images import make_synthetic_images
from cocos.embed import features as fc
from cocos.embed.features import (
    MANIFEST,
    FeatureCacheWarning,
    cache_key,
    cached_features,
    cnn_state_hash,
    pooled_features,
    staging_dirs,
    write_feature_cache,
)
from cocos.embed.images import ImageSource
from tests.helpers import one_error_line, snapshot

runner = CliRunner()
SIZES = {"resize": 16, "crop_size": 12}


class TinyCNN(torch.nn.Module):
    """A 6-d 'pooled feature': one convolution, ReLU, the spatial mean."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv = torch.nn.Conv2d(3, 6, 3)

    def forward(self, x):
        return self.conv(x).relu().mean((2, 3))


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    make_synthetic_images(root / "w", n_train=7, n_dev=2, n_test=2, image_size=16, seed=3, progress=False)
    (root / "tiny.pth").write_bytes(b"weights")  # the file the manifest names (its sha256)
    cnn = TinyCNN().eval()
    write_feature_cache(root / "w", root / "whole", cnn, **kwargs(root))
    return root, cnn


def kwargs(root) -> dict:
    return {"cnn_type": "tiny", "batch_size": 3, "weights_file": root / "tiny.pth", **SIZES}


def write(world, out, on_batch=None):
    root, cnn = world
    return write_feature_cache(root / "w", out, cnn, on_batch=on_batch, **kwargs(root))


def kill_after(n: int):
    calls = []

    def on_batch(split, done):
        calls.append((split, done))
        if len(calls) == n:
            raise Killed

    return on_batch


def assert_whole(world, out):
    """``out`` holds exactly the uninterrupted run's files, byte for byte, every one a regular file."""
    whole = world[0] / "whole"
    assert sorted(os.listdir(out)) == sorted(os.listdir(whole))
    for name in os.listdir(whole):
        st = os.lstat(out / name)
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, name
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o777 & ~umask  # not mkdtemp's 0700


def killed_staging(world, place) -> Path:
    """A run into ``place/out`` killed after train's three batches: its staging folder."""
    with pytest.raises(Killed):
        write(world, place / "out", kill_after(3))
    (staging,) = staging_dirs(place / "out")
    assert json.loads((staging / "progress.json").read_text())["done"] == {"train": 7, "dev": 0, "test": 0}
    return staging


def test_planted_links_and_foreign_staging_are_never_followed_or_resumed(world, tmp_path):
    """Item 1: a link planted where cocos stages (the report's fixed name, or inside a staging folder of ours, or
    a hard link) is never written through, and the finished cache holds no link; staging folders that are not
    verifiably cocos's (a link, writable by others, a marker naming another folder) are left alone."""
    place = tmp_path / "place"
    place.mkdir()
    victim = tmp_path / "victim.npy"  # another cache's rows: the header a staging rows file has
    np.save(victim, np.ones((7, 6), dtype=np.float32))
    precious = victim.read_bytes()
    legacy = place / ".out.features-partial"  # what earlier versions reused: now never read
    legacy.mkdir()
    (legacy / "train_ims.npy").symlink_to(victim)
    (legacy / "progress.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (place / ".out.features-partial.linked00").symlink_to(elsewhere, target_is_directory=True)

    staging = killed_staging(world, place)  # ours, resumable: its rows file becomes a link to the victim
    (staging / "train_ims.npy").unlink()
    (staging / "train_ims.npy").symlink_to(victim)
    foreign = place / ".out.features-partial.shared00"  # a copy writable by the group: not ours any more
    shutil.copytree(staging, foreign, symlinks=True)
    (foreign / "cocos-staging").write_text(f"cocos feature staging\n{foreign.name}\n")
    foreign.chmod(0o770)
    kept = snapshot(legacy, foreign, elsewhere)
    calls = []
    write(world, place / "out", lambda s, d: calls.append((s, d)))
    assert calls[0] == ("train", 3)  # the link is not the rows file: train is recomputed from row 0
    assert_whole(world, place / "out")
    assert victim.read_bytes() == precious and not any(p.is_symlink() for p in (place / "out").iterdir())
    assert snapshot(legacy, foreign, elsewhere) == kept and (legacy / "train_ims.npy").is_symlink()
    assert sorted(os.listdir(place)) == sorted(["out", legacy.name, foreign.name, ".out.features-partial.linked00"])

    hard = tmp_path / "victim2.npy"  # a hard link: writing the file in place would write the victim
    shutil.copy(victim, hard)
    staging = killed_staging(world, tmp_path / "p2")
    (staging / "train_ims.npy").unlink()
    os.link(hard, staging / "train_ims.npy")
    write(world, tmp_path / "p2" / "out")
    assert hard.read_bytes() == precious and os.stat(hard).st_nlink == 1
    assert_whole(world, tmp_path / "p2" / "out")
    assert os.listdir(tmp_path / "p2") == ["out"]


def test_a_second_writer_of_the_same_output_is_refused_and_the_first_completes(world, tmp_path, monkeypatch):
    """Item 2: while one run writes ``out``, ``cocos data features --out out`` is refused in one line; the first
    run's cache is complete and byte-identical to an uninterrupted run; nothing is left beside it."""
    root, cnn = world
    monkeypatch.setattr(fc, "load_cnn", lambda path, cnn_type: cnn)  # the CLI's CNN: the tiny one
    place = tmp_path / "place"
    lines = []

    def second_writer(split, done):
        if not lines:
            res = runner.invoke(app, ["data", "features", str(root / "w"), "--cnn", "resnet18", "--cnn-weights",
                                      str(root / "tiny.pth"), "--out", str(place / "out"), "--resize", "16",
                                      "--crop-size", "12", "--batch-size", "3", "--workers", "0", "--no-progress"])
            lines.append(one_error_line(res))

    write(world, place / "out", second_writer)
    assert "another cocos process is writing this output" in lines[0] and str(place / "out") in lines[0], lines
    assert_whole(world, place / "out")
    assert os.listdir(place) == ["out"]


def _tamper(folder: Path, split: str = "train") -> None:
    """Every row of ``split``'s features set to 1.0, the header and the manifest untouched."""
    path = folder / f"{split}_ims.npy"
    rows = np.load(path)
    head = path.read_bytes()[: path.stat().st_size - rows.nbytes]
    path.write_bytes(head + np.ones_like(rows).tobytes())


def test_a_changed_cache_is_not_used_and_the_images_are_encoded_instead(world, tmp_path):
    """Item 3: rows that no longer have their recorded sha256 (changed in place, a link, no hash recorded) are
    not used: one one-line warning naming the folder, and ``cocos analyze``'s image source encodes the images
    (the same features as an intact cache). Caches of the earlier format (no hashes) are read unchecked."""
    root, cnn = world
    train = load_image_split(root / "w", "train")
    key = cache_key(train.fingerprint(), "tiny", cnn_state_hash(cnn), **SIZES)
    intact = cached_features([root / "whole"], train, key)
    assert intact is not None and intact[1] == root / "whole"
    want = np.load(root / "whole" / "train_ims.npy")
    np.testing.assert_array_equal(intact[0], want)

    cache = tmp_path / "cache"
    shutil.copytree(root / "whole", cache)
    _tamper(cache)
    with pytest.warns(FeatureCacheWarning) as caught:
        assert cached_features([cache], train, key) is None
    (line,) = [str(w.message) for w in caught]
    assert str(cache) in line and "sha256" in line and "encoded from the images" in line and "\n" not in line

    class Model:  # what ImageSource.open takes from a vsepp_full model
        hparams = {"cnn_type": "tiny"}

    Model.cnn = cnn
    used = []
    source = ImageSource(root / "w", features=[cache], batch_size=3, log=used.append, **SIZES)
    with pytest.warns(FeatureCacheWarning, match="sha256"):
        split = source.open(Model(), "train", "cpu")
    np.testing.assert_array_equal(split.features, want)  # encoded from the images: the intact rows
    np.testing.assert_array_equal(split.features, pooled_features(cnn, train, batch_size=3, **SIZES))
    assert used == [] and split.features_path == train.source

    manifest = json.loads((cache / MANIFEST).read_text())
    (cache / "train_ims.npy").unlink()
    (cache / "train_ims.npy").symlink_to(root / "whole" / "train_ims.npy")  # right bytes, but through a link
    with pytest.warns(FeatureCacheWarning, match="link"):
        assert cached_features([cache], train, key) is None
    (cache / "train_ims.npy").unlink()
    shutil.copy(root / "whole" / "train_ims.npy", cache / "train_ims.npy")
    del manifest["splits"]["train"]["ims_sha256"]
    (cache / MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(FeatureCacheWarning, match="no sha256"):
        assert cached_features([cache], train, key) is None

    manifest["format"] = "cocos-features/1"  # written by the previous version: read as it is
    (cache / MANIFEST).write_text(json.dumps(manifest))
    _tamper(cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old = cached_features([cache], train, key)
    assert old is not None and (old[0] == 1).all()
    for odd in ({"splits": ["train"]}, {"resize": "16"}, {"splits": {"train": 5}}):  # wrong types: no match
        (cache / MANIFEST).write_text(json.dumps({**manifest, **odd}))
        assert cached_features([cache], train, key) is None


DAMAGE = {  # how a killed run's staging folder is damaged -> the first batch the rerun computes
    "truncated rows file": ("truncate", ("train", 6)),
    "recorded rows overwritten": ("overwrite", ("train", 6)),
    "random bytes for the rows file": ("random_rows", ("train", 3)),
    "random bytes for progress.json": ("random_progress", ("train", 3)),
    "progress.json nested 100,000 deep": ("nested_progress", ("train", 3)),
    "progress.json of wrong types": ("typed_progress", ("train", 3)),
    "rows done that the blocks do not cover": ("done_progress", ("train", 3)),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_from_damaged_staging_ends_byte_identical(world, tmp_path, damage):
    """Item 4: whatever is damaged in a killed run's staging folder, the rerun exits normally with the
    uninterrupted run's bytes: blocks whose checksum fails are recomputed from the first such block; an
    unreadable or odd progress record makes the staging folder not resumable (removed, as ours; a fresh one is
    used); never a traceback, nothing left behind."""
    kind, first = DAMAGE[damage]
    place = tmp_path / "place"
    staging = killed_staging(world, place)
    rows, progress = staging / "train_ims.npy", staging / "progress.json"
    record = json.loads(progress.read_text())
    head = rows.stat().st_size - 7 * 6 * 4
    if kind == "truncate":  # rows 0-4 kept: block 1 (rows 3-5) fails
        os.truncate(rows, head + 5 * 6 * 4)
    elif kind == "overwrite":  # rows 3-5, recorded as done, overwritten (the file's size unchanged)
        with open(rows, "r+b") as fh:
            fh.seek(head + 3 * 6 * 4 + 4)
            fh.write(b"\x01\x02\x03\x04")
    elif kind == "random_rows":
        rows.write_bytes(np.random.default_rng(0).bytes(500))
    elif kind == "random_progress":
        progress.write_bytes(np.random.default_rng(1).bytes(500))
    elif kind == "nested_progress":
        progress.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "typed_progress":
        progress.write_text(json.dumps({**record, "blocks": {"train": 5}, "done": {"train": "7"}}))
    else:
        progress.write_text(json.dumps({**record, "done": {"train": 7, "dev": 2, "test": 2}}))
    calls = []
    write(world, place / "out", lambda s, d: calls.append((s, d)))
    assert calls[0] == first, calls
    assert_whole(world, place / "out")
    assert os.listdir(place) == ["out"]  # the damaged staging folder was ours: removed or finished
