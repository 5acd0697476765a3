"""Checks of a checkpoint's structure split into named helpers (#29 complexity): the messages they give."""

from __future__ import annotations

import copy

import pytest
import torch

from cocos.data.synth import make_synthetic
from cocos.errors import CocosError
from cocos.training.checkpoint import HASH_KEY, load_checkpoint, validate_checkpoint
from cocos.training.trainer import TrainConfig, Trainer

TINY = dict(model="vsepp", epochs=1, lr=2e-3, lr_update=10, batch_size=16, embed_size=16, word_dim=8, device="cpu")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("cc")
    data = make_synthetic(root / "data", n_train=32, n_dev=16, n_test=16, feature_dim=16, seed=1)
    Trainer(TrainConfig.of(data=str(data), out=str(root / "run"), loss="triplet", **TINY), progress=False,
            log=lambda *a: None).fit()
    return load_checkpoint(root / "run" / "last.pt")


def _refusal(ckpt: dict) -> str:
    with pytest.raises(CocosError) as info:
        validate_checkpoint(ckpt, "x.pt")
    return str(info.value)


def test_a_tensor_inside_the_loss_presentation_is_one_line(ckpt):
    bad = copy.deepcopy(ckpt)
    assert bad["loss"]["presentation"] is not None
    bad["loss"]["presentation"]["params"] = torch.zeros(3)  # truth value of a tensor: RuntimeError, not CocosError
    assert _refusal(bad).startswith("x.pt: loss.presentation is not a loss presentation (")


def test_header_and_hash_field(ckpt):
    assert validate_checkpoint(copy.deepcopy(ckpt), "x.pt")["epoch"] == 1
    assert _refusal({**ckpt, "format": 3}) == "x.pt: not a cocos checkpoint"
    assert _refusal({k: v for k, v in ckpt.items() if k not in ("vocab", "data")}) == "x.pt: checkpoint lacks vocab, data"
    assert _refusal({**ckpt, HASH_KEY: "AB" * 32}).startswith("x.pt: content_sha256 must be a sha256 hex digest")


def test_resume_state_scheduler_groups_and_tensor_dtype(ckpt):
    no_optimizer = {k: v for k, v in ckpt.items() if k != "optimizer"}
    validate_checkpoint(no_optimizer, "x.pt")  # a scheduler without an optimizer: one parameter group
    bad = copy.deepcopy(ckpt)
    bad["rng"]["torch"] = bad["rng"]["torch"].to(torch.int64)
    assert _refusal(bad) == "x.pt: rng.torch has dtype torch.int64, expected torch.uint8"
    half = copy.deepcopy(ckpt)
    half["state_dict"] = {k: v.half() for k, v in half["state_dict"].items()}  # any floating dtype is a weight
    validate_checkpoint(half, "x.pt")
    ints = copy.deepcopy(ckpt)
    name = next(iter(ints["state_dict"]))
    ints["state_dict"][name] = ints["state_dict"][name].long()
    assert _refusal(ints).startswith(f"x.pt: state_dict[{name!r}] has dtype torch.int64, expected a floating point")
