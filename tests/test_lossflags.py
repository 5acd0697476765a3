"""Loss parameters are flags generated from the specs (``cocos_cli.lossflags``), not options written per loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cocos.errors import CocosError
from cocos.losses.functional import triplet_direction
from cocos.objectives import Objective, register, unregister
from cocos_cli import lossflags
from cocos_cli.main import app

runner = CliRunner()


def test_flags_become_typed_parameters_of_the_losses_that_take_them():
    got = lossflags.merge(["ntxent.tau=0.05"], ["--margin", "0.3", "--triplet-weight=cir"], ["triplet", "goal",
                                                                                               "ntxent"], "count")
    assert got["triplet"] == {"margin": 0.3} and got["goal"] == {"margin": 0.3, "triplet_weight": "cir"}
    assert got["ntxent"] == {"tau": 0.05}
    assert isinstance(got["triplet"]["margin"], float) and got["goal"]["triplet_weight"] == "cir"


def test_negative_values_switches_and_their_negation():
    assert lossflags.as_params(["--margin", "-0.1", "--hard", "--no-soft"]) == [
        ("--margin", "margin=-0.1"), ("--hard", "hard=true"), ("--soft", "soft=false")]


@pytest.mark.parametrize("args, message", [
    (["--epoch", "3"], "no such option --epoch: not an option of cocos train nor a parameter of triplet_sh "
                       "(loss parameters: margin)"),
    (["--margin", "wide"], "--margin: 'wide' is not a number"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_unknown_or_bad_flags_are_one_line(args, message):
    with pytest.raises(CocosError) as err:
        lossflags.merge([], args, ["triplet_sh"], "train")
    assert str(err.value) == message


def test_a_flag_and_a_param_of_the_same_value_are_refused_as_twice():
    with pytest.raises(CocosError, match="triplet.margin is given twice"):
        lossflags.merge(["margin=0.1"], ["--margin", "0.2"], ["triplet"], "count")


def test_a_plugin_families_parameter_is_a_flag_of_cocos_count(tmp_path):
    spec = Objective(name="flaghinge", label="Flag hinge", direction_loss=triplet_direction,
                     defaults={"margin": 0.2, "hardest": False})
    register(spec)
    try:
        g = np.random.default_rng(0)
        images = g.normal(size=(24, 6))
        np.savez(tmp_path / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(120, 6)))
        res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "--loss", "flaghinge,triplet", "--margin", "0.35",
                                  "--hardest", "--batch-size", "8", "--json", str(tmp_path / "r.json"),
                                  "--no-progress"])
        assert res.exit_code == 0, res.output
        params = json.loads((tmp_path / "r.json").read_text())["counting"]["params"]
        assert params["flaghinge"]["margin"] == 0.35 and params["flaghinge"]["hardest"] is True
        assert params["triplet"]["margin"] == 0.35 and "hardest" not in params["triplet"]
    finally:
        unregister("flaghinge")


def test_train_takes_a_loss_flag_and_refuses_one_its_loss_lacks(tmp_path):
    res = runner.invoke(app, ["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--loss",
                              "ntxent", "--margin", "0.3", "--no-progress"])
    assert res.exit_code == 2 and "no such option --margin" in res.output and "(loss parameters: tau)" in res.output
    assert not (tmp_path / "o").exists()


def test_settings_of_older_runs_give_the_same_loss_parameters_for_resume():
    from cocos.training.config import TrainConfig
    from cocos.training.config import loss_params_of as recorded_loss_params

    old = {"margin": 0.3, "tau": None, "params": None}  # written when margin and tau were fields of their own
    assert recorded_loss_params(old) == TrainConfig.of(data="", params={"margin": 0.3}).loss_params() == {"margin": 0.3}
    assert recorded_loss_params({"margin": None, "tau": None, "params": {"tau": 0.05}}) == {"tau": 0.05}
    assert recorded_loss_params({"params": {"margin": 0.1}}) != recorded_loss_params(old)
