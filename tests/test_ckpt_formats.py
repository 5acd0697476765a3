"""Every checkpoint format cocos has written still loads, rebuilds its weights, evaluates and resumes bit-identically.

``tests/fixtures/checkpoints`` (its README.md) holds the ``last.pt`` after epoch 1 of one tiny run as the cocos of
each commit that changed the format wrote it; raw-image checkpoints are built here in the formats of their commits.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from cocos.models.registry import get_family
from cocos.training.checkpoint import (
    HASH_KEY,
    Checkpoint,
    content_hash,
    load_checkpoint,
    save_checkpoint,
    validate_checkpoint,
)
from cocos.training.evaluate import evaluate_model, tokenize_split
from cocos.training.trainer import TrainConfig, Trainer, build_from_checkpoint, open_split

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
MANIFEST = json.loads((FIXTURES / "formats.json").read_text())
FORMATS = MANIFEST["formats"]


def _digest(state: dict) -> str:
    """sha256 of a state dict's names, dtypes, shapes and bytes in name order (as formats.json records it)."""
    h = hashlib.sha256()
    for key in sorted(state):
        value = state[key].detach().cpu().contiguous()
        h.update(key.encode())
        h.update(str(value.dtype).encode())
        h.update(str(tuple(value.shape)).encode())
        h.update(value.view(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return h.hexdigest()


def _same_weights(model: torch.nn.Module, state: dict) -> None:
    built = model.state_dict()
    assert list(built) == list(state)
    for key, value in state.items():
        assert built[key].dtype == value.dtype and torch.equal(built[key], value), key


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("formats") / "data"
    shutil.copytree(FIXTURES / "data", folder)
    return folder


def test_every_fixture_is_listed_and_small():
    files = {p.stem for p in FIXTURES.glob("*.pt")}
    assert files == set(FORMATS)
    assert all(p.stat().st_size < 50_000 for p in FIXTURES.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_loads_and_rebuilds_its_weights(name):
    path, fmt = FIXTURES / f"{name}.pt", FORMATS[name]
    raw = torch.load(path, weights_only=True)
    assert ("step" in raw, HASH_KEY in raw, "presentation" in raw["loss"], "margin" in raw["train"]) == (
        fmt["step"], fmt["hash"], fmt["presentation"], fmt["flat_margin"])  # the fixture is of the format it says
    if fmt["hash"]:
        assert content_hash(raw) == raw[HASH_KEY]  # the canonical encoding has not changed
    ckpt = load_checkpoint(path)
    model, coder = build_from_checkpoint(ckpt)
    _same_weights(model, raw["state_dict"])
    assert list(coder.tokens) == raw["vocab"]
    entry = Checkpoint.of(ckpt)
    assert (entry.model.kind, entry.loss.name, entry.loss.params) == ("vsepp", "triplet", {"margin": 0.3})
    assert (entry.progress.epoch, entry.progress.step) == (1, raw.get("step", 0))
    assert entry.train == raw["train"] and entry.data.input == "features"


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_evaluates_to_the_metrics_it_recorded(name, data):
    ckpt = load_checkpoint(FIXTURES / f"{name}.pt")
    model, coder = build_from_checkpoint(ckpt)
    split = open_split(ckpt, data, "dev")
    metrics = evaluate_model(model, split, tokenize_split(split, coder))
    assert {k: metrics[k] for k in ckpt["metrics"]} == ckpt["metrics"]  # the old cocos's validation, exactly


@pytest.fixture(scope="module")
def scratch(data, tmp_path_factory) -> dict[int, str]:
    """The weights (:func:`_digest`) after epochs 1 and 2 of the fixtures' run trained here from scratch."""
    out = {}
    for epochs in (1, 2):
        folder = tmp_path_factory.mktemp(f"scratch{epochs}")
        Trainer(TrainConfig.of(data=str(data), out=str(folder), epochs=epochs, **MANIFEST["run"]), progress=False,
                log=lambda *a, **k: None).fit()
        out[epochs] = _digest(load_checkpoint(folder / "last.pt")["state_dict"])
    return out


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_resumes_to_the_uninterrupted_run(name, data, scratch, tmp_path):
    written = torch.load(FIXTURES / f"{name}.pt", weights_only=True)
    if _digest(written["state_dict"]) != scratch[1]:
        pytest.skip("this machine's arithmetic differs from the one that wrote the fixtures (epoch 1 is not theirs)")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(FIXTURES / f"{name}.pt", run / "last.pt")
    cfg = TrainConfig.of(data=str(data), out=str(run), epochs=2, **MANIFEST["run"])
    Trainer(cfg, resume=True, progress=False, log=lambda *a, **k: None).fit()
    resumed = load_checkpoint(run / "last.pt")
    assert resumed["epoch"] == 2 and _digest(resumed["state_dict"]) == scratch[2] == MANIFEST["epoch2_weights"]


# -- raw images: built here in the formats of 5e3ea95 (first raw-image runs) and 38daf63 (the transform recorded) --


def _raw_image_checkpoint(vocab: list[str], *, transform: bool) -> dict:
    """A vsepp_full checkpoint as cocos train wrote it (``data`` and ``train`` as those commits wrote them)."""
    torch.manual_seed(0)
    model = get_family("vsepp_full").build(vocab_size=len(vocab), cnn_type="resnet18", word_dim=8, embed_size=8,
                                           finetune=True)
    data = {"path": "/data/f30k", "fingerprint": "0" * 16, "k": 5, "feature_shape": [512], "input": "images",
            "crop_size": 224, "use_restval": False}
    train = {"data": "/data/f30k", "model": "vsepp_full", "loss": "triplet", "out": "/runs/r", "epochs": 1,
             "lr": 2e-4, "lr_update": 15, "batch_size": 16, "embed_size": 8, "word_dim": 8, "params": {"margin": 0.2},
             "grad_clip": 2.0, "warmup_epochs": 0, "vocab_threshold": 4, "k": 5, "seed": 0, "device": "cpu",
             "compat": False, "vocab": None, "ltd": False, "ltd_mode": "constraint", "ltd_eta": 0.2, "ltd_beta": 1.0,
             "ltd_targets": None, "track_cocos": None, "save_every": None, "cnn": "resnet18", "cnn_weights": None,
             "finetune": True, "crop_size": 224, "use_restval": False, "workers": 0}
    if transform:  # since #31: the evaluation Resize and the weights file it belongs to
        data.update(resize=232, weights={"file": "resnet18-f37072fd.pth", "sha256": "ab" * 32, "name": None})
        train.update(resize=232)
    return {"model": {"kind": "vsepp_full", "hparams": dict(model.hparams)}, "vocab": vocab,
            "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "loss": {"name": "triplet", "params": {"margin": 0.2}, "compat": False}, "data": data, "train": train,
            "epoch": 1, "metrics": {"rsum": 12.5}, "best_rsum": 12.5, "history": [{"epoch": 1, "rsum": 12.5}]}


@pytest.mark.parametrize("transform", [False, True], ids=["5e3ea95", "38daf63"])
def test_raw_image_formats_load_and_rebuild_their_weights(tmp_path, transform):
    vocab = torch.load(FIXTURES / "965a7ea.pt", weights_only=True)["vocab"]
    ckpt = _raw_image_checkpoint(vocab, transform=transform)
    validate_checkpoint({"format": "cocos-checkpoint", "format_version": 1, **copy.deepcopy(ckpt)}, "built")
    save_checkpoint(tmp_path / "r.pt", ckpt)
    loaded = load_checkpoint(tmp_path / "r.pt")
    assert ("resize" in loaded["data"]) is transform and Checkpoint.of(loaded).data.input == "images"
    model, _ = build_from_checkpoint(loaded)
    _same_weights(model, ckpt["state_dict"])
    old = {k: v for k, v in torch.load(tmp_path / "r.pt", weights_only=True).items() if k != HASH_KEY}
    torch.save(old, tmp_path / "old.pt")  # as written before the content hash
    _same_weights(build_from_checkpoint(load_checkpoint(tmp_path / "old.pt"))[0], ckpt["state_dict"])


def test_the_content_hash_of_every_kind_of_value_is_unchanged():
    """Checkpoints written so far verify: the canonical encoding's hash of each kind of value, as 8dce5fa gave it."""
    payload = {"s": "é\u2603", "i": -12345678901234567890, "f": 0.1, "inf": float("-inf"), "b": True, "n": None,
               "c": 1 + 2j, "y": b"\x00\xff", "l": [1, (2.5, "x"), []], "d": {"b": 1, "a": {}}, "dt": torch.float16,
               "dev": torch.device("cpu"), "t": torch.arange(6, dtype=torch.float32).reshape(2, 3),
               "e": torch.zeros(0, 4, dtype=torch.int64), "h": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
               "o": {"z": torch.tensor(3)}, HASH_KEY: "ignored"}
    assert content_hash(payload) == "0a1f2d812ab894e2e7a754e6b73418dbf4a7764dce10527147744cd7aa342b69"
