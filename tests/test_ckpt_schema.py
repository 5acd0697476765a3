"""The declarative checkpoint schema: the rules of cocos.typed by hand, and the one line each part's record gives."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from cocos import typed
from cocos.errors import CocosError
from cocos.training.checkpoint import HASH_KEY, load_checkpoint, validate_checkpoint
from cocos.training.ckpt_schema import LossEntry, ModelEntry, hparams_record
from cocos.typed import each, number, spec

CURRENT = Path(__file__).resolve().parent / "fixtures" / "checkpoints" / "04c9adc.pt"


@dataclass(frozen=True)
class Inner:
    file: str = spec(nonempty=True)
    name: str | None = None
    EXTRA = "is not a field of inner (file, name)"


@dataclass(frozen=True)
class Outer:
    k: int = spec(minimum=1)
    rate: number = spec(None, above=0, maximum=2)
    shape: list = spec(None, lengths=(1, 2), says="must be (D,) or (R, D), got {got}", items=each("int", minimum=1))
    kind: str = spec("a", choices=("a", "b"))
    inner: Inner | None = None
    scores: dict | None = spec(None, keys=True, values=each("number"))
    lam: number = spec(None, key="lambda", minimum=0)
    digest: any = spec(None, pattern="[0-9a-f]{4}", says="must be 4 hex digits")
    EXTRA = each("setting")


@pytest.mark.parametrize("node, found", [
    ({"k": 1}, None),
    ({"k": 1, "rate": 2, "shape": (3, 4), "kind": "b", "inner": {"file": "f"}, "scores": {"a": 1.5}, "lambda": 0,
      "digest": "00af", "other": [1, "x", None]}, None),
    ({}, ("k", "is missing")),
    ({"k": 0}, ("k", "must be at least 1, got 0")),
    ({"k": 1, "rate": 0}, ("rate", "must be greater than 0, got 0")),
    ({"k": 1, "rate": 3}, ("rate", "must be at most 2, got 3")),
    ({"k": 1, "rate": math.inf}, ("rate", "must be finite, got inf")),
    ({"k": 1, "rate": math.nan}, ("rate", "must be a number, got nan")),
    ({"k": 1, "rate": None}, ("rate", "must be a number, got None")),  # optional, never null
    ({"k": 1, "shape": [1, 2, 3]}, ("shape", "must be (D,) or (R, D), got [1, 2, 3]")),
    ({"k": 1, "shape": "12"}, ("shape", "must be a list, got '12'")),
    ({"k": 1, "shape": [4, 0]}, ("shape[1]", "must be at least 1, got 0")),
    ({"k": 1, "kind": "c"}, ("kind", "must be one of a, b, got 'c'")),
    ({"k": 1, "inner": []}, ("inner", "must be a dict or null, got []")),
    ({"k": 1, "inner": {1: "f"}}, ("inner", "must have string keys, has 1")),
    ({"k": 1, "inner": {"name": "n"}}, ("inner.file", "is missing")),
    ({"k": 1, "inner": {"file": ""}}, ("inner.file", "must not be empty")),
    ({"k": 1, "inner": {"fle": "f"}}, ("inner.fle", "is not a field of inner (file, name)")),  # before "missing"
    ({"k": 1, "scores": {0: 1}}, ("scores", "must have string keys, has 0")),
    ({"k": 1, "scores": {"a": "high"}}, ("scores.a", "must be a number, got 'high'")),
    ({"k": 1, "lambda": -1}, ("lambda", "must be at least 0, got -1")),
    ({"k": 1, "digest": 5}, ("digest", "must be 4 hex digits")),
    ({"k": 1, "digest": "00AF"}, ("digest", "must be 4 hex digits")),
    ({"k": 1, "other": {"a": 1}}, ("other", "must be plain numbers, got {'a': 1}")),
    ({"k": 1, "other": [1, math.inf]}, ("other", "must be finite, got [1, inf]")),
])
def test_rules_of_a_record_by_hand(node, found):
    assert typed.problem(Outer, node) == found


def test_records_build_with_their_keys_and_check_as_dicts():
    assert typed.build(Outer, {"k": 2, "lambda": 0.5, "x": 1}) == Outer(k=2, lam=0.5)
    assert typed.check_record(Outer, [1]) == ("", "must be a dict, got [1]")
    assert typed.check_record(Outer, {"k": 1, "inner": {"file": ""}}) == (".inner.file", "must not be empty")
    assert typed.check_record(Outer, {"rate": 1}, complete=False) is None
    assert typed.check([1, "a"], "list", each("name")) is None
    assert typed.check(["a", ""], "list", typed.Rule(items=each("name"))) == ("[1]", "must be a non-empty string, got ''")


def test_model_records_are_generated_from_the_constructor():
    from cocos.models.registry import get_family

    record = hparams_record(get_family("vsepp").module)
    assert hparams_record(get_family("vsepp").module) is record  # made once per class
    assert typed.problem(record, {"vocab_size": 3, "img_dim": 8, "depth": 1}) == (
        "depth", "is not a parameter of the vsepp model (it takes img_dim, vocab_size, word_dim, embed_size, "
                 "num_layers, use_abs)")
    assert typed.problem(record, {"vocab_size": 3}) == ("img_dim", "is missing")
    assert typed.problem(record, {"vocab_size": 3, "img_dim": 8, "use_abs": 1}) == (
        "use_abs", "must be true or false, got 1")
    assert typed.problem(ModelEntry, {"kind": "vsepp", "hparams": {1: 2}}) == ("hparams", "must have string keys, has 1")
    assert typed.problem(LossEntry, {"name": "", "params": {}}) == ("name", "must not be empty")


# -- the one line of each part ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt() -> dict:
    return load_checkpoint(CURRENT)


def _at(path, value):
    def mutate(c):
        *head, last = path
        for key in head:
            c = c[key]
        if value is _DROP:
            del c[last]
        else:
            c[last] = value
    return mutate


_DROP = object()
LINES = {
    "feature shape of three dimensions": (_at(["data", "feature_shape"], [1, 2, 8]),
                                          "data.feature_shape must be (D,) or (R, D), got a list of 3 items"),
    "a resize on features": (_at(["data", "resize"], 256), "data.resize applies to raw images (data.input images) only"),
    "an unknown input": (_at(["data", "input"], "video"), "data.input must be features or images, got 'video'"),
    "train.k differs": (_at(["data", "k"], 4), "data.k is 4 but train.k is 5"),
    "a negative train setting": (_at(["train", "epochs"], -1), "train.epochs must not be negative, got -1"),
    "a seed past the limit": (_at(["train", "seed"], 2**63), "train.seed must be at most 9223372036854775807, got "
                                                              "9223372036854775808"),
    "a missing batch size": (_at(["train", "batch_size"], None), "train.batch_size must be an integer, got None"),
    "a train setting of another type": (_at(["train", "lr"], "fast"), "train.lr must be a number, got 'fast'"),
    "an infinite metric": (_at(["metrics", "rsum"], math.inf), "metrics.rsum must be finite, got inf"),
    "a history row with a number key": (_at(["history", 0, 1], 2), "history[0] must have string keys, has 1"),
    "a loss parameter that is a list": (_at(["loss", "params", "margin"], [1]),
                                        "loss.params.margin must be a number, a name or a switch, got a list of 1 items"),
    "an empty loss name": (_at(["loss", "name"], ""), "loss.name must not be empty"),
    "an embedding of size 0": (_at(["model", "hparams", "embed_size"], 0),
                               "model.hparams.embed_size must be at least 1, got 0"),
    "an empty token": (_at(["vocab", 4], ""), "vocab[4] must be a non-empty string, got ''"),
    "a negative step": (_at(["step"], -1), "step must be at least 0, got -1"),
    "a NaN best rsum": (_at(["best_rsum"], math.nan), "best_rsum must be a number or null, got nan"),
    "a hash in capitals": (_at([HASH_KEY], "AB" * 32), "content_sha256 must be a sha256 hex digest"),
    "a foreign scheduler key": (_at(["scheduler", "optimizer"], 1), "scheduler.optimizer is not part of a StepLR state"),
    "a scheduler without a step size": (_at(["scheduler", "step_size"], _DROP), "scheduler.step_size is missing"),
    "two rates for one group": (_at(["scheduler", "base_lrs"], [0.1, 0.1]),
                                "scheduler.base_lrs has 2 values for 1 parameter groups"),
    "an infinite beta": (_at(["optimizer", "param_groups", 0, "betas"], (0.9, math.inf)),
                         "optimizer.param_groups[0].betas must be finite, got a tuple of 2 items"),
    "a negative rate": (_at(["optimizer", "param_groups", 0, "lr"], -0.1),
                        "optimizer.param_groups[0].lr must be at least 0, got -0.1"),
    "a parameter id twice": (_at(["optimizer", "param_groups", 0, "params", 1], 0), "optimizer covers"),
    "a state of no parameter": (_at(["optimizer", "state", 99], {}),
                                "optimizer.state holds the state of parameter 99, which no group names"),
    "a negative step count": (_at(["optimizer", "state", 0, "step"], torch.tensor(-1.0)),
                              "optimizer.state[0].step must be at least 0, got -1.0"),
    "rng of another dtype": (_at(["rng", "torch"], torch.zeros(5056, dtype=torch.int64)),
                             "rng.torch has dtype torch.int64, expected torch.uint8"),
    "rng missing its state": (_at(["rng", "torch"], _DROP), "rng.torch is missing"),
}


@pytest.mark.parametrize("case", list(LINES))
def test_each_part_is_refused_in_one_line_naming_the_field(ckpt, case):
    mutate, expected = LINES[case]
    bad = copy.deepcopy(ckpt)
    mutate(bad)
    with pytest.raises(CocosError) as info:
        validate_checkpoint(bad, "x.pt")
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"x.pt: {expected}"), line


def test_ltd_records_by_mode(ckpt):
    """``ltd`` in dual mode needs no multiplier; in constraint mode its lambda is checked against its range."""
    from cocos.training.ckpt_schema import Checker, ConstraintLTD, LTDEntry

    ltd = {"mode": "dual", "eta": 0.2, "beta": 1.0, "targets": None, "hparams": {}, "decoder": {}}
    assert Checker("x").record(LTDEntry, ltd, "ltd") is ltd
    for node, expected in (({**ltd, "mode": None}, "x: ltd.mode must be one of constraint, dual, got None"),
                           ({**ltd, "eta": 0}, "x: ltd.eta must be greater than 0, got 0"),
                           ({**ltd, "mode": "constraint"}, "x: ltd.lambda is missing"),
                           ({**ltd, "mode": "constraint", "lambda": 101.0}, "x: ltd.lambda must be at most 100.0"),
                           ({**ltd, "mode": "constraint", "lambda": 1.0, "lambda_optimizer": None},
                            "x: ltd.lambda_optimizer must be a dict, got None")):
        cls = ConstraintLTD if node["mode"] == "constraint" else LTDEntry
        with pytest.raises(CocosError) as info:
            Checker("x").record(cls, node, "ltd")
        assert str(info.value).startswith(expected), str(info.value)
