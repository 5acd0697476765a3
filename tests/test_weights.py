"""Known CNN weights files and their evaluation transform (cocos.models.weights), and where cocos uses it.

The table's numbers are spot-checked against torchvision's ``Weights`` enums as written in its source
(``torchvision/models/resnet.py``, ``vgg.py``: ``transforms=partial(ImageClassification, crop_size=224,
resize_size=232)`` for the V2 files, ``resize_size`` left at its default 256 for the V1 files) and the
file names against the hashes in torchvision's URLs. Identification is by content: the tests put a
tiny file's own sha256 prefix in a monkeypatched table (computed here with hashlib, independently of
:func:`cocos.models.weights.file_sha256`), so nothing large is read or downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from cocos.embed.images import image_source_of, recorded_transform
from cocos.errors import CocosError
from cocos.models import weights as W
from cocos.models.cnn import CNN_TYPES, build_cnn, strip_classifier
from cocos.pipelines.folder import describe_transform, image_transform_text
from cocos.training.config import record_flat
from tests.helpers import empty_figures, one_error_line
from tests.test_features import eval_pixels

runner = CliRunner()
TABLE = W.KNOWN_WEIGHTS  # the real table (tests replace it with their own entries)
TORCHVISION_NAME = re.compile(r"(?P<stem>[a-z0-9_]+)-(?P<hash>[0-9a-f]{8})\.pth")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fake_entry(path: Path, arch: str = "resnet18", resize: int = 36, crop: int = 32, stem: str = "resnet18"):
    """A table entry whose hash prefix is the real sha256 prefix of ``path`` (as torchvision names its files)."""
    return W.KnownWeights(f"{stem}-{sha256_of(path)[:8]}.pth", arch, "fake ResNet18_Weights.V2", resize, crop,
                          "a test")


@pytest.fixture
def table(monkeypatch):
    """Replace the table by the entries given (and forget the hashes remembered so far)."""

    def use(*entries):
        monkeypatch.setattr(W, "KNOWN_WEIGHTS", tuple(entries))
        monkeypatch.setattr(W, "_HASHES", {})

    return use


# -- the table ----------------------------------------------------------------------------------------------------

def test_every_entry_is_a_torchvision_style_name_with_an_8_digit_hash_and_a_cocos_architecture():
    files = [w.file for w in W.KNOWN_WEIGHTS]
    assert len(set(files)) == len(files)
    assert len({w.hash_prefix for w in W.KNOWN_WEIGHTS}) == len(files)  # no prefix identifies two files
    for w in W.KNOWN_WEIGHTS:
        m = TORCHVISION_NAME.fullmatch(w.file)
        assert m is not None, w.file
        assert w.hash_prefix == m.group("hash") and len(w.hash_prefix) == 8
        assert w.arch in CNN_TYPES, w
        assert w.file.startswith(w.arch) or w.file.startswith("ig_resnext101_32x8-"), w
        assert (w.mean, w.std) == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # ImageNet's: what cocos applies
        assert w.crop_size == 224 and w.resize in (232, 256)
    assert {w.arch for w in W.KNOWN_WEIGHTS} == set(CNN_TYPES)  # every architecture cocos builds


@pytest.mark.parametrize(("file", "arch", "resize", "enum"), [
    # torchvision/models/resnet.py, vgg.py: Weights(url=".../<file>", transforms=partial(ImageClassification, ...))
    ("resnet50-0676ba61.pth", "resnet50", 256, "ResNet50_Weights.IMAGENET1K_V1"),
    ("resnet50-11ad3fa6.pth", "resnet50", 232, "ResNet50_Weights.IMAGENET1K_V2"),
    ("resnet101-cd907fc2.pth", "resnet101", 232, "ResNet101_Weights.IMAGENET1K_V2"),
    ("resnet152-394f9c45.pth", "resnet152", 256, "ResNet152_Weights.IMAGENET1K_V1"),
    ("resnext101_32x8d-110c445d.pth", "resnext101_32x8d", 232, "ResNeXt101_32X8D_Weights.IMAGENET1K_V2"),
    ("resnext50_32x4d-7cdf4587.pth", "resnext50_32x4d", 256, "ResNeXt50_32X4D_Weights.IMAGENET1K_V1"),
    ("resnet18-f37072fd.pth", "resnet18", 256, "ResNet18_Weights.IMAGENET1K_V1"),
    ("vgg19-dcbb9e9d.pth", "vgg19", 256, "VGG19_Weights.IMAGENET1K_V1"),
    ("resnet50-19c8e357.pth", "resnet50", 256, None),  # the 2017 file of the original VSE++ code's time
    ("ig_resnext101_32x8-c38310e5.pth", "resnext101_32x8d", 256, None),  # WSL, VSE infinity's backbone
])
def test_spot_checks_against_torchvision(file, arch, resize, enum):
    entry = W.known_by_name(file)
    assert entry is not None and (entry.arch, entry.resize, entry.crop_size) == (arch, resize, 224)
    if enum is not None:
        assert entry.name == f"torchvision {enum}"


# -- identification by content ------------------------------------------------------------------------------------

def test_file_sha256_streams_the_bytes_and_sees_a_changed_file(tmp_path, table):
    table()
    path = tmp_path / "w.pth"
    path.write_bytes(b"\x00\x01" * (3 << 19))  # 3 MB: more than one block
    assert W.file_sha256(path) == sha256_of(path)
    assert W.file_sha256(path) == sha256_of(path)  # remembered
    path.write_bytes(b"other bytes")
    assert W.file_sha256(path) == hashlib.sha256(b"other bytes").hexdigest()


def test_a_renamed_file_is_known_by_its_content(tmp_path, table):
    path = tmp_path / "my_backbone.pth"
    path.write_bytes(b"pretend state dict")
    entry = fake_entry(path)
    table(TABLE[0], entry)
    sizes = W.evaluation_transform(path)
    assert (sizes.resize, sizes.crop_size, sizes.weights, sizes.warning) == (36, 32, entry, None)
    assert sizes.record() == {"file": "my_backbone.pth", "sha256": sha256_of(path), "name": entry.name}
    # a crop of its own: the resize in the file's ratio 36 : 32; nothing given differs from the file: no warning
    assert W.evaluation_transform(path, crop_size=64)[:2] == (72, 64)
    assert W.evaluation_transform(path, resize=36).warning is None
    with pytest.raises(CocosError, match="fake ResNet18_Weights.V2, weights of a resnet18, not of a resnet50"):
        W.evaluation_transform(path, cnn="resnet50")


def test_the_users_sizes_win_with_one_warning_line(tmp_path, table):
    path = tmp_path / "w.pth"
    path.write_bytes(b"weights")
    table(fake_entry(path))
    sizes = W.evaluation_transform(path, resize=40)
    assert (sizes.resize, sizes.crop_size) == (40, 32)
    assert sizes.warning == ("w.pth is fake ResNet18_Weights.V2, evaluated at Resize 36 + CenterCrop 32; using "
                             "--resize 40 as given (Resize 40 + CenterCrop 32)")
    assert "\n" not in sizes.warning


def test_an_unknown_file_keeps_the_256_224_proportion_without_a_word(tmp_path, table):
    table()
    path = tmp_path / "weights-20240101.pth"  # a hex-looking name that is not a torchvision file's: no check
    path.write_bytes(b"someone's weights")
    assert W.evaluation_transform(path)[:2] + (W.evaluation_transform(path).warning,) == (256, 224, None)
    assert W.evaluation_transform(path, crop_size=448)[:2] == (512, 448)
    assert W.evaluation_transform(path, resize=300, crop_size=200)[:3] == (300, 200, None)


def test_a_torchvision_name_its_content_does_not_match_is_one_line(tmp_path, table):
    path = tmp_path / "resnet50-0676ba61.pth"
    path.write_bytes(b"a partial download")
    assert not sha256_of(path).startswith("0676ba61")
    table(*TABLE)
    with pytest.raises(CocosError, match=r"resnet50-0676ba61\.pth: its name carries the hash 0676ba61") as exc:
        W.identify(path)
    assert "\n" not in str(exc.value)
    # the content of another known file under a torchvision name: still the name's hash that decides
    renamed = tmp_path / "resnet18-f37072fd.pth"
    renamed.write_bytes(b"V2 content")
    table(fake_entry(renamed, stem="resnet18"), *TABLE)
    with pytest.raises(CocosError, match="its name carries the hash f37072fd"):
        W.evaluation_transform(renamed)


# -- cocos data features --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from cocos.data.synth_images import make_synthetic_images

    root = tmp_path_factory.mktemp("weights")
    make_synthetic_images(root / "w", n_train=4, n_dev=2, n_test=2, image_size=40, seed=2)
    torch.manual_seed(3)
    torch.save(build_cnn("resnet18").state_dict(), root / "r18_v2.pth")
    return root


def features(world, out, *extra):
    return runner.invoke(app, ["data", "features", str(world / "w"), "--cnn", "resnet18", "--cnn-weights",
                               str(world / "r18_v2.pth"), "--out", str(out), "--workers", "0", "--batch-size", "4",
                               "--split", "test", "--no-progress", *extra])


def test_data_features_evaluates_a_known_file_at_its_own_transform_and_records_it(world, tmp_path, table):
    entry = fake_entry(world / "r18_v2.pth", resize=36, crop=32)  # not 256 : 224 (that would be 37 for 32)
    table(entry)
    res = features(world, tmp_path / "c")
    assert res.exit_code == 0 and "warning" not in res.output, res.output
    assert "fake ResNet18_Weights.V2" in res.output and "Resize 36 + CenterCrop 32" in res.output
    manifest = json.loads((tmp_path / "c" / "cocos_features.json").read_text())
    assert (manifest["resize"], manifest["crop_size"]) == (36, 32)
    assert manifest["weights_file"] == {"name": "r18_v2.pth", "sha256": sha256_of(world / "r18_v2.pth"),
                                        "known": entry.name}
    # the rows are the CNN's features of Resize(36) + CenterCrop(32) pixels, restated independently
    cnn = strip_classifier(build_cnn("resnet18"))
    cnn.load_state_dict({k: v for k, v in torch.load(world / "r18_v2.pth", weights_only=True).items()
                         if not k.startswith("fc.")})
    entries = json.loads((world / "w" / "dataset_synth.json").read_text())["images"]
    test = [e for e in entries if e["split"] == "test"]
    with torch.no_grad():
        expected = cnn.eval()(torch.stack([eval_pixels(world / "w" / "images" / e["filename"], 36, 32)
                                           for e in test])).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "c" / "test_ims.npy"), expected, rtol=1e-4, atol=1e-5)


def test_data_features_takes_the_users_resize_with_a_warning(world, tmp_path, table):
    table(fake_entry(world / "r18_v2.pth", resize=36, crop=32))
    res = features(world, tmp_path / "c", "--resize", "40")
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.output.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "evaluated at Resize 36 + CenterCrop 32; using --resize 40" in warned[0]
    manifest = json.loads((tmp_path / "c" / "cocos_features.json").read_text())
    assert (manifest["resize"], manifest["crop_size"]) == (40, 32)


def test_data_features_refuses_a_torchvision_name_with_other_content_in_one_line(world, tmp_path):
    wrong = tmp_path / "resnet18-f37072fd.pth"
    shutil.copy(world / "r18_v2.pth", wrong)
    res = runner.invoke(app, ["data", "features", str(world / "w"), "--cnn", "resnet18", "--cnn-weights", str(wrong),
                              "--out", str(tmp_path / "c"), "--no-progress"])
    assert "its name carries the hash f37072fd" in one_error_line(res)
    assert not (tmp_path / "c").exists()


# -- checkpoints and reports ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(world, tmp_path_factory):
    """A raw-image checkpoint as cocos train writes it (ResNet-18 fine-tuned from random initialisation; no step)."""
    from cocos.training.config import TrainConfig
    from cocos.training.trainer import Trainer

    out = tmp_path_factory.mktemp("ckpt") / "r"
    cfg = TrainConfig.of(data=str(world / "w"), out=str(out), loss="triplet", epochs=1, batch_size=4, embed_size=8,
                         word_dim=8, vocab_threshold=1, device="cpu", cnn="resnet18", finetune=True, crop_size=32)
    return Trainer(cfg, progress=False, log=lambda *_: None).checkpoint({}, full=False)


def _saved(ckpt, path):
    from cocos.training.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(path, ckpt)
    return load_checkpoint(path)


def test_checkpoints_record_and_validate_the_transform_and_old_ones_still_load(checkpoint, world, tmp_path):
    from cocos.training.checkpoint import validate_checkpoint

    record = {"file": "r18_v2.pth", "sha256": sha256_of(world / "r18_v2.pth"), "name": "fake V2"}
    new = {**checkpoint, "data": {**checkpoint["data"], "resize": 36, "weights": record}}
    loaded = _saved(new, tmp_path / "new.pt")
    assert loaded["data"]["resize"] == 36 and loaded["data"]["weights"] == record
    assert recorded_transform(loaded) == (36, 32, "fake V2")
    old = {**checkpoint, "data": {k: v for k, v in checkpoint["data"].items() if k not in ("resize", "weights")}}
    assert recorded_transform(_saved(old, tmp_path / "old.pt")) == (37, 32, None)  # round(32 * 256 / 224)
    for change, field in (({"resize": 0}, "data.resize"), ({"resize": "232"}, "data.resize"),
                          ({"weights": {**record, "sha256": "0676ba61"}}, "data.weights.sha256"),
                          ({"weights": {"sha256": record["sha256"]}}, "data.weights.file"),
                          ({"weights": {**record, "extra": 1}}, "data.weights.extra"),
                          ({"weights": {**record, "name": 5}}, "data.weights.name")):
        bad = {**loaded, "data": {**loaded["data"], **change}}
        with pytest.raises(CocosError, match=field.replace(".", r"\.")):
            validate_checkpoint(bad, "x.pt")


def test_analyze_takes_the_checkpoints_transform_and_a_given_one_with_a_warning(checkpoint, world, tmp_path, table):
    ckpt = {**checkpoint, "data": {**checkpoint["data"], "resize": 36, "weights": {
        "file": "v2.pth", "sha256": "0" * 64, "name": "fake V2"}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing given: no warning
        source = image_source_of(ckpt, world / "w")
    assert (source.resize, source.crop_size, source.weights) == (36, 32, "fake V2")
    assert source.transform_record() == {"resize": 36, "crop_size": 32, "weights": "fake V2"}
    with pytest.warns(W.WeightsTransformWarning, match="are fake V2, evaluated at Resize 36 \\+ CenterCrop 32; "
                                                       "using Resize 40 \\+ CenterCrop 32 as given"):
        assert image_source_of(ckpt, world / "w", resize=40).resize == 40
    # a checkpoint written before the transform was recorded: the weights file it started from, known by content
    table(fake_entry(world / "r18_v2.pth", resize=36, crop=32))
    old = {**checkpoint, "data": {k: v for k, v in checkpoint["data"].items() if k not in ("resize", "weights")},
           "train": {**record_flat(checkpoint["train"]), "cnn_weights": str(world / "r18_v2.pth")}}  # flat, as then
    assert recorded_transform(old) == (36, 32, "fake ResNet18_Weights.V2")
    with pytest.warns(W.WeightsTransformWarning, match="records no evaluation transform .* not the Resize 37"):
        assert image_source_of(old, world / "w").resize == 36  # said: it was validated at 37 while training
    # ... or, when the file is gone, by torchvision's name of it
    gone = {**old, "train": {**old["train"], "cnn_weights": "/nowhere/resnet50-11ad3fa6.pth"}}
    table(*TABLE)
    assert recorded_transform({**gone, "data": {**gone["data"], "crop_size": 224}}) == (
        232, 224, "torchvision ResNet50_Weights.IMAGENET1K_V2")
    assert recorded_transform({**old, "legacy": {"opt": {}}}) == (256, 224, None)  # the original code: always 256


def test_reports_show_the_cnn_its_weights_and_the_transform():
    assert describe_transform("resnet50", 232, 224, "torchvision ResNet50_Weights.IMAGENET1K_V2") == (
        "ResNet-50 (torchvision ResNet50_Weights.IMAGENET1K_V2; eval Resize 232, CenterCrop 224)")
    assert describe_transform("resnet18", 37, 32) == "ResNet-18 (eval Resize 37, CenterCrop 32)"
    results = SimpleNamespace(data=SimpleNamespace(image_transform={"resize": 232, "crop_size": 224,
                                                                    "weights": "torchvision X"}),
                              model=SimpleNamespace(hparams={"cnn_type": "resnext101_32x8d"}))
    assert image_transform_text(results) == "ResNeXt-101 32x8d (torchvision X; eval Resize 232, CenterCrop 224)"
    assert image_transform_text(SimpleNamespace(data=SimpleNamespace(), model=SimpleNamespace(hparams={}))) is None


# -- cocos train and analyze ------------------------------------------------------------------------------------------

def train_frozen(world, out, *extra):
    return runner.invoke(app, ["train", "--data", str(world / "w"), "--out", str(out), "--cnn", "resnet18",
                               "--cnn-weights", str(world / "r18_v2.pth"), "--crop-size", "32", "--epochs", "1",
                               "--batch-size", "4", "--embed-size", "8", "--word-dim", "8", "--no-progress", *extra])


def test_train_evaluates_and_records_a_known_files_transform_and_analyze_shows_it(world, tmp_path, table, monkeypatch):
    empty_figures(monkeypatch)  # the files, not their drawing (tests/test_report_figures.py, test_figure_print.py)
    entry = fake_entry(world / "r18_v2.pth", resize=36, crop=32)
    table(entry)
    res = train_frozen(world, tmp_path / "run")
    assert res.exit_code == 0 and "warning" not in res.output, res.output
    ckpt = torch.load(tmp_path / "run" / "model_best.pt", weights_only=True)
    assert (ckpt["data"]["resize"], ckpt["data"]["crop_size"]) == (36, 32)
    assert ckpt["data"]["weights"] == {"file": "r18_v2.pth", "sha256": sha256_of(world / "r18_v2.pth"),
                                       "name": entry.name}
    report = runner.invoke(app, ["analyze", str(tmp_path / "run" / "model_best.pt"), "--out", str(tmp_path / "rep"),
                                 "--batch-size", "4", "--no-progress"])
    assert report.exit_code == 0, report.output
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert results["data"]["image_transform"] == {"resize": 36, "crop_size": 32, "weights": entry.name}
    assert "eval Resize 36, CenterCrop 32" in (tmp_path / "rep" / "tables.md").read_text()
    # the user's --resize wins, with one warning line, and is what the checkpoint records
    given = train_frozen(world, tmp_path / "given", "--resize", "40")
    assert given.exit_code == 0, given.output
    assert len([ln for ln in given.output.splitlines() if ln.startswith("warning:")]) == 1
    assert torch.load(tmp_path / "given" / "last.pt", weights_only=True)["data"]["resize"] == 40


def test_the_hash_cache_sees_a_file_rewritten_in_place(tmp_path, monkeypatch):
    """The remembered digest is keyed by the file's (device, inode, size, modification time): the same file
    rewritten in place with other bytes of the same size (same inode, same size) is hashed again."""
    monkeypatch.setattr(W, "_HASHES", {})
    path = tmp_path / "w.pth"
    path.write_bytes(b"a" * 4096)
    first = W.file_sha256(path)
    assert first == sha256_of(path)
    inode = path.stat().st_ino
    with open(path, "r+b") as fh:  # in place: no new inode
        fh.write(b"b" * 4096)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a later time, whatever the clock's grain
    assert path.stat().st_ino == inode and path.stat().st_size == 4096
    assert W.file_sha256(path) == sha256_of(path) != first
