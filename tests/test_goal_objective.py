"""GOAL as a training objective (designed gradients) and its counter."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting import EmbeddingSet, count_batch, count_embeddings
from cocos.errors import CocosError
from cocos.losses.goal import PAIR, TRIPLET
from cocos.objectives import get_loss
from cocos_cli.main import app
from tests.helpers import empty_figures

runner = CliRunner()
COMBOS = list(itertools.product(TRIPLET, PAIR))


def _batch(b=10, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, d, dtype=torch.float64, generator=g)
    captions = images + 0.8 * torch.randn(b, d, dtype=torch.float64, generator=g)
    return images, captions


def _grads(loss, images, captions):
    x, y = images.clone().requires_grad_(True), captions.clone().requires_grad_(True)
    value = loss(x, y)
    value.backward()
    return value, x.grad, y.grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_con_con_is_the_gradient_of_the_summed_triplet_sh_loss(seed):
    images, captions = _batch(seed=seed)
    value, gx, gy = _grads(get_loss("goal"), images, captions)
    ref_value, rx, ry = _grads(get_loss("triplet_sh"), images, captions)
    torch.testing.assert_close(gx, rx, rtol=0, atol=1e-9)
    torch.testing.assert_close(gy, ry, rtol=0, atol=1e-9)
    assert value.item() == pytest.approx(ref_value.item())  # the forward logs the Triplet SH value


def _hardest_nca(images, captions, tau):
    """Σ softplus(τ (S_n − S_p)) / τ with the hardest negative, both directions (pair batch)."""
    x = torch.nn.functional.normalize(images, dim=-1)
    y = torch.nn.functional.normalize(captions, dim=-1)
    s = x @ y.T
    eye = torch.eye(len(s), dtype=torch.bool)
    total = 0.0
    for m in (s, s.T):
        sp = m.diagonal()
        sn = m.masked_fill(eye, -torch.inf).amax(-1)
        total = total + torch.nn.functional.softplus(tau * (sn - sp)).sum() / tau
    return total


def test_nca_con_follows_the_gradient_of_the_hardest_negative_nca_loss():
    images, captions = _batch(seed=3)
    _, gx, gy = _grads(get_loss("goal", triplet_weight="nca", tau=10.0), images, captions)
    _, rx, ry = _grads(lambda x, y: _hardest_nca(x, y, 10.0), images, captions)
    torch.testing.assert_close(gx, rx, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gy, ry, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("triplet_weight, pair_weight", COMBOS)
def test_every_combination_gives_finite_non_zero_gradients(triplet_weight, pair_weight):
    images, captions = _batch(seed=4)
    _, gx, gy = _grads(get_loss("goal", triplet_weight=triplet_weight, pair_weight=pair_weight), images, captions)
    assert torch.isfinite(gx).all() and torch.isfinite(gy).all()
    assert gx.abs().sum() > 0 and gy.abs().sum() > 0


@pytest.mark.slow
def test_every_combination_trains_the_tiny_model_well_above_an_untrained_one(tmp_path, monkeypatch):
    empty_figures(monkeypatch)  # the files, not their drawing (tests/test_report_figures.py, test_figure_print.py)
    from cocos.data.synth import make_synthetic
    from cocos.training.evaluate import evaluate_model
    from cocos.training.trainer import TrainConfig, Trainer

    data = make_synthetic(tmp_path / "syn", n_train=100, n_dev=40, n_test=40, feature_dim=32, seed=1)
    for triplet_weight, pair_weight in COMBOS:
        cfg = TrainConfig.of(data=str(data), out=str(tmp_path / f"{triplet_weight}-{pair_weight}"), loss="goal",
                          epochs=2, lr=1e-2, lr_update=10, batch_size=32, embed_size=32, word_dim=16, seed=0,
                          device="cpu", params={"triplet_weight": triplet_weight, "pair_weight": pair_weight})
        trainer = Trainer(cfg, progress=False, log=lambda *a: None)
        untrained = evaluate_model(trainer.model, trainer.dev_split, trainer.dev_ids)["rsum"]
        best = trainer.fit()["rsum"]
        assert best > untrained + 10, (triplet_weight, pair_weight, untrained, best)  # chance is about 80
    # cocos analyze of a GOAL model: the paper's four counters and its own loss, at its own parameters, with the
    # distributions of its per-query weights and the diagram of its own triplet weight
    from cocos.pipelines.analyze import analyze_checkpoint
    from cocos.pipelines.folder import write_results_folder

    analysis = analyze_checkpoint(tmp_path / "cir-sig_ms" / "model_best.pt", device="cpu")
    results = analysis.results
    assert results.counting.losses == ["triplet", "triplet_sh", "ntxent", "smoothap", "goal"]
    assert results.counting.params["goal"]["triplet_weight"] == "cir" and results.counting.batch_size == 32
    files = write_results_folder(results, analysis.run, tmp_path / "report")
    assert "goal_distributions.png" in {f.name for f in files}
    assert "**COCOS w.r.t. query q, GOAL" in (tmp_path / "report" / "tables.md").read_text()


def test_the_counter_counts_the_hardest_negative_when_its_designed_weight_passes_eps():
    g = np.random.default_rng(0)
    images = g.normal(size=(16, 6))
    captions = images + g.normal(size=(16, 6))
    # con x con: the designed weight of the hardest negative is 1 exactly when it violates: Triplet SH's count
    goal = count_batch(images, captions, "goal")
    sh = count_batch(images, captions, "triplet_sh")
    for d in ("i2t", "t2i"):
        assert goal[d]["C_q"] == sh[d]["C_q"] and goal[d]["C_0"] == sh[d]["C_0"] and goal[d]["C_B"] == sh[d]["C_B"]
    # nca: T = sigmoid(tau (Sn - Sp)) > eps, by hand
    s = (images / np.linalg.norm(images, axis=1, keepdims=True)) @ (
        captions / np.linalg.norm(captions, axis=1, keepdims=True)).T
    sp, sn = np.diag(s), np.where(np.eye(16, dtype=bool), -np.inf, s).max(1)
    t = 1 / (1 + np.exp(10 * (sp - sn)))
    got = count_batch(images, captions, "goal", triplet_weight="nca", eps=0.3)["i2t"]
    assert got["C_B"] == (t > 0.3).sum() and got["T"] == pytest.approx(t.mean())


def test_engine_records_per_query_triplet_and_pair_weights_and_sweeps_eps():
    g = np.random.default_rng(1)
    images = g.normal(size=(64, 6))
    captions = np.repeat(images, 5, 0) + g.normal(size=(320, 6))
    run = count_embeddings(EmbeddingSet.from_arrays(images, captions), ["goal"], batch_size=16,
                           params={"goal": {"triplet_weight": "cir", "pair_weight": "sig_ms"}},
                           sweep_eps=[0.001, 0.01, 0.1])
    q = run.to_frame("query")
    assert {"T", "P_pos", "P_neg"} <= set(q.columns) and q["T"].between(0, 1).all()
    assert run.params["goal"]["triplet_weight"] == "cir"
    sweep = run.sweep()["goal"]["i2t"]
    assert sweep["0.001"]["C_B"]["mean"] >= sweep["0.01"]["C_B"]["mean"] >= sweep["0.1"]["C_B"]["mean"]


@pytest.mark.parametrize("args, message", [
    (["--triplet-weight", "circle"], "unknown triplet weight 'circle' (choose from con, nca, cir)"),
    (["--pair-weight", "ms"], "unknown pair weight 'ms' (choose from con, lin, sig, lin_ms, sig_ms)"),
    (["--tau", "0"], "tau must be positive"),
    (["-p", "alpha=-1"], "alpha must be positive"),
])
def test_bad_goal_flags_are_one_line_exit_2_nothing_written(tmp_path, args, message):
    res = runner.invoke(app, ["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--loss",
                              "goal", "--no-progress", *args])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
    assert not (tmp_path / "o").exists()


def test_get_loss_refuses_unknown_weights():
    with pytest.raises(CocosError, match="unknown pair weight"):
        get_loss("goal", pair_weight="square")


@pytest.mark.parametrize("scale", [2.0, 0.5])
def test_the_designed_gradient_scales_with_the_upstream_gradient(scale):
    """Loss weighting (or AMP's loss scaling) multiplies GOAL's designed gradient like any other loss's."""
    torch.manual_seed(0)
    loss = get_loss("goal", triplet_weight="nca", pair_weight="sig")
    images = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    captions = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    (g1,) = torch.autograd.grad(loss(images, captions), images)
    (g2,) = torch.autograd.grad(scale * loss(images, captions), images)
    assert g1.abs().sum() > 0
    assert torch.allclose(g2, scale * g1, rtol=1e-12, atol=0)
