"""SigLIP's sigmoid loss (issue 39): open_clip's own loss, the definitions' counts on a hand-checked batch, autograd
against the closed form, and t and b learned in training (resumed bit for bit, counted at their learned values)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from cocos.data.layout import batch_similarity
from cocos.errors import CocosError
from cocos.losses.base import LearnedParameters
from cocos.losses.generic import count_from_gradients, negative_gradients
from cocos.objectives import get_loss, get_objective
from cocos_cli.main import app

EMPTY_FIGURES = True  # no test here reads a figure
runner = CliRunner()
REFERENCE = Path(__file__).parent / "reference" / "open_clip_loss" / "loss.py"


def _open_clip_loss():
    spec = importlib.util.spec_from_file_location("open_clip_loss_3_3_0", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SigLipLoss()


def sigma(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.parametrize("t, b", [(10.0, -10.0), (3.7, 1.25)])
def test_loss_and_gradients_equal_open_clips_siglip_loss_with_t_and_b_learned(t, b):
    torch.manual_seed(1)
    x, y = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    ours = LearnedParameters(get_loss("siglip", t=t, b=b)).double()  # the loss's own log t and b, as trained
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    value = ours(xs, ys)
    grads = torch.autograd.grad(value, [xs, ys, ours.own["logit_scale"], ours.own["logit_bias"]])
    # open_clip's SigLipLoss on the same (normalised) features, its logit_scale the exp of the raw parameter
    xo, yo = x.clone().requires_grad_(), y.clone().requires_grad_()
    scale = ours.own["logit_scale"].detach().clone().requires_grad_()
    bias = ours.own["logit_bias"].detach().clone().requires_grad_()
    theirs = _open_clip_loss()(F.normalize(xo, dim=-1), F.normalize(yo, dim=-1), scale.exp(), bias)
    expected = torch.autograd.grad(theirs, [xo, yo, scale, bias])
    assert float(value.detach()) == pytest.approx(float(theirs.detach()), abs=1e-10, rel=0)
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-10, rtol=0)
    assert ours.params() == pytest.approx({"t": math.exp(float(scale.detach())), "b": float(bias.detach())})
    # the loss without learning: the same value at plain numbers
    assert float(get_loss("siglip", t=t, b=b)(x, y)) == pytest.approx(float(theirs.detach()), abs=1e-6, rel=1e-6)


# images e1, e2, e3; captions (1, 0, 0), (0.6, 0.8, 0), (0, 0.5, sqrt(0.75)): S[i, j] = image i . caption j
S = [[1.0, 0.6, 0.0], [0.0, 0.8, 0.5], [0.0, 0.0, math.sqrt(0.75)]]


def _hand(t=10.0, b=-10.0, eps=0.01) -> dict:
    """The definitions file's SigLIP statistics of :data:`S`, written out: each direction's per-query values
    (i2t: rows, t2i: columns), then their means."""
    out = {}
    for direction, m in (("i2t", S), ("t2i", [list(c) for c in zip(*S, strict=True)])):
        c, w, low, pos = [], [], [], []
        for q, row in enumerate(m):
            weights = [sigma(t * s + b) for n, s in enumerate(row) if n != q]
            c.append(sum(v > eps for v in weights))
            w.append(sum(v for v in weights if v > eps))
            low.append(sum(v for v in weights if v <= eps))
            pos.append(1.0 - sigma(t * row[q] + b))
        out[direction] = {"C_qv-": np.mean(c), "W_qv-": np.mean(w), "W_low": np.mean(low), "W_qv+": np.mean(pos)}
    return out


def test_count_of_a_hand_checked_batch_is_the_definitions(tmp_path):
    # by hand at t = 10, b = -10: only (image 1, caption 2) at s = 0.6 passes eps (sigma(-4) = 0.018; s = 0.5
    # gives sigma(-5) = 0.0067): one query of three in each direction counts one negative
    hand = _hand()
    assert hand["i2t"]["C_qv-"] == hand["t2i"]["C_qv-"] == pytest.approx(1 / 3)
    assert hand["i2t"]["W_qv-"] == pytest.approx(sigma(-4.0) / 3)
    assert hand["i2t"]["W_qv+"] == pytest.approx((0.5 + (1 - sigma(-2.0)) + (1 - sigma(10 * math.sqrt(0.75) - 10))) / 3)
    images = np.eye(3)
    captions = np.array([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.5, math.sqrt(0.75)]])
    np.savez(tmp_path / "e.npz", images=images, captions=captions)
    res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "-l", "siglip", "--batch-size", "3", "--json",
                              str(tmp_path / "o.json"), "--no-progress"])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "o.json").read_text())["statistics"]
    got = {(r["direction"], r["stat"]): r["mean"] for r in rows
           if r["loss"] == "siglip" and r["mode"] == "corrected" and r["eps"] == 0.01}
    for direction, stats in hand.items():
        for stat, value in stats.items():
            assert got[direction, stat] == pytest.approx(value, rel=1e-6, abs=1e-9), (direction, stat)
    # another t, b and eps, through the library
    counter = get_objective("siglip").make_counter(eps=0.05, t=4.0, b=-1.0)
    scores, layout = batch_similarity(torch.tensor(images), torch.tensor(captions))
    hand = _hand(4.0, -1.0, 0.05)
    for direction in ("i2t", "t2i"):
        count = counter.count(layout.view(scores, direction, False))
        for stat, value in hand[direction].items():
            assert float(count.batch[stat]) == pytest.approx(value, rel=1e-9), (direction, stat)


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_autograd_of_the_loss_equals_the_closed_form_weights(direction):
    torch.manual_seed(4)
    n, k = 9, 1
    images = torch.randn(n, 6, dtype=torch.float64)
    captions = images + 0.7 * torch.randn(n * k, 6, dtype=torch.float64)
    image_ids = torch.tensor([0, 1, 2, 3, 3, 5, 6, 7, 8])  # two rows of one image: a same-image pair excluded
    scores, layout = batch_similarity(images, captions, image_ids=image_ids)
    view = layout.view(scores, direction, False)
    t, b = 6.0, -2.5
    loss = get_loss("siglip", t=t, b=b)
    g = negative_gradients(view, loss.direction_loss)  # |dL/ds| on the negatives = (t / B) sigma(z)
    counter = get_objective("siglip").make_counter(t=t, b=b)
    count = counter.count(view)
    assert torch.allclose(g * n / t, count.weights, atol=1e-12, rtol=0)
    generic = count_from_gradients(g * n / t, view, eps=0.01, relative=False)
    assert torch.equal(generic.per_query["C_q"], count.per_query["C_qv-"])
    assert bool(view.excludes_any())  # the excluded pair is in neither the loss nor the count


def test_parameters_are_checked_and_a_model_with_its_own_logit_scale_takes_no_t():
    from cocos.training.checks import _check_learned
    from cocos.training.config import DataConfig, LossConfig, ModelConfig, TrainConfig

    with pytest.raises(CocosError, match="t must be positive"):
        get_loss("siglip", t=0.0)
    with pytest.raises(CocosError, match="b must be finite"):
        get_objective("siglip").make_counter(b=float("nan"))

    def run(model: str) -> TrainConfig:
        return TrainConfig(data=DataConfig(path="x"), model=ModelConfig(name=model),
                           loss=LossConfig(name="siglip", params={"t": 5.0}))

    with pytest.raises(CocosError, match="^--t: the CLIP model's own logit_scale is the SigLIP loss's t"):
        _check_learned(run("clip"))  # it would be ignored: the model's logit_scale is t
    _check_learned(run("vsepp"))  # the loss's own log t starts at it


def test_t_and_b_train_resume_bit_for_bit_and_are_what_an_analysis_counts_at(tmp_path):
    from cocos.data.synth import make_synthetic
    from cocos.training.checkpoint import load_checkpoint

    data = make_synthetic(tmp_path / "data", n_train=48, n_dev=16, n_test=16, feature_dim=12, seed=3)
    common = ["train", "--data", str(data), "--loss", "siglip", "--batch-size", "16", "--lr", "5e-3",
              "--embed-size", "12", "--word-dim", "8", "--seed", "0", "--device", "cpu", "--no-progress",
              "--track-cocos", "2"]
    for args in ([*common, "--epochs", "2", "--out", str(tmp_path / "run")],
                 [*common, "--epochs", "1", "--b", "-10", "--out", str(tmp_path / "half")],
                 [*common, "--epochs", "2", "--b", "-10", "--resume", "--out", str(tmp_path / "half")]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    whole, again = load_checkpoint(tmp_path / "run" / "last.pt"), load_checkpoint(tmp_path / "half" / "last.pt")
    assert whole["learned"].keys() == {"logit_scale", "logit_bias"}
    for part in ("state_dict", "learned"):
        assert all(torch.equal(whole[part][k], again[part][k]) for k in whole[part])
    t, b = whole["loss"]["params"]["t"], whole["loss"]["params"]["b"]
    assert (t, b) != (10.0, -10.0) and t == pytest.approx(math.exp(float(whole["learned"]["logit_scale"])))
    assert b == float(whole["learned"]["logit_bias"])
    track = (tmp_path / "run" / "cocos_track.csv").read_text()  # counted at the values learned so far
    assert "siglip,i2t,C_qv-" in track and "siglip,t2i,W_qv+" in track
    res = runner.invoke(app, ["analyze", str(tmp_path / "run" / "last.pt"), "--out", str(tmp_path / "rep"),
                              "--loss", "siglip", "--no-progress"])
    assert res.exit_code == 0, res.output
    results = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert results["counting"]["params"]["siglip"] == {"t": t, "b": b, "eps": 0.01}
