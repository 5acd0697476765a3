"""The learned temperature (``--learn-tau``) is clamped as open_clip clamps it: the parameter ``logit_scale`` is
clamped in place to ``[0, log 100]`` after each optimizer step (and once when a run starts), the forward pass is
``tau = exp(-logit_scale)`` unclamped. A temperature at the clamp therefore moves back when the loss asks for it,
where a clamp inside the forward pass (``exp(-min(s, log 100))``) has a zero gradient above the clamp and freezes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from cocos.defaults import MAX_LOGIT_SCALE
from cocos.losses.base import LearnedTemperature
from cocos.objectives import get_loss

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
CLAMP = float(torch.tensor(MAX_LOGIT_SCALE))  # log 100 as a float32 parameter holds it


def easy_batch(n=8, d=16, noise=3.0, seed=0):
    """Pairs whose positives are barely more similar than their negatives: NT-Xent asks for a *higher*
    temperature (a smaller logit scale) than 0.01."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, d, generator=g)
    images = torch.nn.functional.normalize(base + noise * torch.randn(n, d, generator=g), dim=-1)
    captions = torch.nn.functional.normalize(base + noise * torch.randn(n, d, generator=g), dim=-1)
    return images, captions


def train_scale(start: float, steps: int, project: bool, lr: float = 0.05) -> list[float]:
    """``logit_scale`` over ``steps`` Adam steps of NT-Xent on a fixed batch, clamped after each step or not."""
    scale = torch.nn.Parameter(torch.tensor(start))
    loss = LearnedTemperature(get_loss("ntxent"), scale)
    opt = torch.optim.Adam([scale], lr=lr)
    images, captions = easy_batch()
    path = []
    for _ in range(steps):
        opt.zero_grad()
        loss(images, captions).backward()
        opt.step()
        if project:
            loss.project_()
        path.append(float(scale.detach()))
    return path


def test_forward_is_unclamped_with_its_gradient_above_the_clamp():
    images, captions = easy_batch()
    scale = torch.nn.Parameter(torch.tensor(5.0))  # above log 100
    loss = LearnedTemperature(get_loss("ntxent"), scale)
    value = loss(images, captions)
    assert float(value.detach()) == pytest.approx(float(get_loss("ntxent", tau=math.exp(-5.0))(images, captions)), rel=1e-6)
    value.backward()
    assert float(scale.grad) > 0  # the loss asks for a smaller scale (a higher temperature): a gradient, not 0
    assert loss.params()["tau"] == pytest.approx(math.exp(-5.0))
    loss.project_()
    assert float(scale.detach()) == CLAMP and loss.params()["tau"] == pytest.approx(0.01)
    low = torch.nn.Parameter(torch.tensor(-2.0))
    LearnedTemperature(get_loss("ntxent"), low).project_()
    assert float(low.detach()) == 0.0  # open_clip's lower bound: tau <= 1


def test_temperature_moves_back_from_the_clamp():
    path = train_scale(5.0, 30, project=True)
    assert path[0] <= CLAMP  # clamped after the first step
    assert all(s <= CLAMP for s in path)
    assert path[-1] < CLAMP - 0.5  # the loss wanted a higher temperature: it left the clamp
    assert all(b <= a for a, b in zip(path, path[1:], strict=False))
    # the same steps with the forward-pass clamp of before: the gradient above the clamp is exactly zero
    scale = torch.nn.Parameter(torch.tensor(5.0))
    images, captions = easy_batch()
    tau = torch.exp(-scale.clamp(max=MAX_LOGIT_SCALE))
    logits = images @ captions.T / tau
    torch.nn.functional.cross_entropy(logits, torch.arange(len(images))).backward()
    assert float(scale.grad) == 0.0  # why the old clamp froze the temperature at 0.01


def test_clip_fine_tuned_from_above_the_clamp(tmp_path, monkeypatch):
    """A CLIP folder saved with ``logit_scale = 5.0`` fine-tuned with ``--learn-tau``: the scale is clamped when the
    run starts and after every optimizer step (the trainer's calls counted), the checkpoint ends at or below
    ``log 100``, and its recorded temperature is ``exp(-logit_scale)``."""
    pytest.importorskip("transformers")
    from cocos.data.synth_images import make_synthetic_images
    from cocos_cli.main import app
    from tests.helpers import make_clip_folder

    clip = make_clip_folder(tmp_path / "clip", logit_scale=5.0)
    clamped, real = [], LearnedTemperature.project_

    def project_(self):
        real(self)
        clamped.append(float(self._scale[0].detach()))

    monkeypatch.setattr(LearnedTemperature, "project_", project_)
    data = make_synthetic_images(tmp_path / "images", n_train=16, n_dev=8, n_test=8, image_size=40, seed=0,
                                 progress=False)
    result = runner.invoke(app, ["train", "--model", "clip", "--clip", str(clip), "--data", str(data), "--out",
                                 str(tmp_path / "run"), "--epochs", "1", "--batch-size", "8", "--no-progress",
                                 "--lr", "1e-3", "--loss", "ntxent", "--learn-tau"])
    assert result.exit_code == 0, result.output
    steps = len((tmp_path / "run" / "train_log.csv").read_text().splitlines()) - 1
    assert steps >= 2 and len(clamped) == steps + 1  # at the start, then after each step
    assert all(0.0 <= s <= CLAMP for s in clamped)
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    learned = float(ckpt["state_dict"]["clip.logit_scale"])
    assert 0.0 <= learned <= CLAMP
    assert ckpt["loss"]["params"]["tau"] == pytest.approx(math.exp(-learned), rel=1e-6)
    assert json.loads(json.dumps(ckpt["train"]))["loss"]["learn_tau"] is True
