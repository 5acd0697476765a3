"""cocos.typed: the one check of records (results.json parts, checkpoint entries) against their annotations."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from cocos import typed
from cocos.data.synth import make_synthetic
from cocos.training.checkpoint import Checkpoint, load_checkpoint
from cocos.training.trainer import TrainConfig, Trainer


@dataclass
class Record:
    name: str
    count: int
    share: float | None = None
    best: inf | None = None  # noqa: F821
    tags: list = field(default_factory=list)
    flag: bool = False
    extra: SomethingElse = None  # noqa: F821 - not a plain type: left to the format's own checks


@pytest.mark.parametrize("node, found", [
    ({"name": "a", "count": 2}, None),
    ({"name": "a", "count": 2, "share": 3, "best": -math.inf, "tags": (1,), "flag": True, "extra": object()}, None),
    ({"count": 2}, ("name", "is missing")),
    ({"name": "a", "count": True}, ("count", "must be an integer, got True")),  # a bool is no integer
    ({"name": "a", "count": 2.0}, ("count", "must be an integer, got 2.0")),
    ({"name": "a", "count": 2, "share": math.inf}, ("share", "must be a number or null, got inf")),
    ({"name": "a", "count": 2, "share": "0.5"}, ("share", "must be a number or null, got '0.5'")),
    ({"name": "a", "count": 2, "best": math.nan}, ("best", "must be a number or null, got nan")),
    ({"name": "a", "count": 2, "flag": 1}, ("flag", "must be true or false, got 1")),
    ({"name": 5, "count": 2}, ("name", "must be a string, got 5")),
])
def test_problem_finds_the_first_wrong_field_by_hand(node, found):
    assert typed.problem(Record, node) == found


def test_partial_records_check_only_what_they_hold():
    assert typed.problem(Record, {"count": 1}, complete=False) is None
    assert typed.problem(Record, {"count": "1"}, complete=False) == ("count", "must be an integer, got '1'")
    assert typed.build(Record, {"name": "x", "count": 1, "other": 3}) == Record("x", 1)


def test_the_typed_view_of_a_checkpoint_is_its_dict(tmp_path):
    data = make_synthetic(tmp_path / "d", n_train=40, n_dev=16, n_test=16, feature_dim=8, seed=3)
    cfg = TrainConfig.of(data=str(data), out=str(tmp_path / "run"), loss="triplet", epochs=1, batch_size=16,
                      embed_size=8, word_dim=8, device="cpu", params={"margin": 0.3})
    Trainer(cfg, progress=False, log=lambda *a: None).fit()
    ckpt = load_checkpoint(tmp_path / "run" / "last.pt")
    entry = Checkpoint.of(ckpt)
    assert (entry.model.kind, entry.model.hparams) == ("vsepp", ckpt["model"]["hparams"])
    assert (entry.loss.name, entry.loss.params, entry.loss.compat) == ("triplet", {"margin": 0.3}, False)
    assert (entry.data.fingerprint, entry.data.k, entry.data.input) == (ckpt["data"]["fingerprint"], 5, "features")
    assert (entry.progress.epoch, entry.progress.best_rsum) == (1, ckpt["best_rsum"]) and entry.train["seed"] == 0
