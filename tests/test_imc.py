"""IMC: Triplet SH plus intra-modal constraints; its loss on a hand-made batch and its counter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting import count_batch
from cocos.errors import CocosError
from cocos.objectives import get_loss
from cocos_cli.main import app

runner = CliRunner()


def _unit(deg):
    return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]


# Images at 0°, 30°, 90°: cosines 0.866 (δ = 0.134, in the band 0.05 < δ < 0.5), 0 (δ = 1) and 0.5 (δ = 0.5, the
# band is strict: out). Captions at 5°, 40°, 100°: 35° apart (δ = 0.181, in), 60° (δ = 0.5, out), 95° (δ = 1.087, out).
IMAGES = np.array([_unit(0), _unit(30), _unit(90)])
CAPTIONS = np.array([_unit(5), _unit(40), _unit(100)])


def test_imc_loss_is_triplet_sh_plus_lambda_times_the_in_band_similarities_by_hand():
    i, c = torch.tensor(IMAGES), torch.tensor(CAPTIONS)
    sh = get_loss("triplet_sh")(i, c).item()
    cos30, cos35 = math.cos(math.radians(30)), math.cos(math.radians(35))
    imc_images = 2 * cos30 / 3  # the pair (0°, 30°) in both orders, over B = 3
    imc_captions = 2 * cos35 / 3  # only (5°, 40°) is in the band
    for lam in (0.0, 1.0, 2.5):
        value = get_loss("imc", lam=lam)(i, c).item()
        assert value == pytest.approx(sh + lam * (imc_images + imc_captions), rel=1e-12)
    # a narrower band drops the pairs: the loss is Triplet SH's
    assert get_loss("imc", mu_down=0.2, mu_up=0.3)(i, c).item() == pytest.approx(sh)


def test_imc_gradient_pushes_in_band_images_apart():
    i = torch.tensor(IMAGES, requires_grad=True)
    c = torch.tensor(CAPTIONS)
    (get_loss("imc", lam=1.0)(i, c) - get_loss("triplet_sh")(i, c)).backward()
    # d/dx0 of (2/3) x0·x1 over normalised unit vectors: along x1 minus its radial part; x2 (out of band) none
    g = i.grad.numpy()
    assert np.dot(g[0], IMAGES[1]) > 0 and np.dot(g[1], IMAGES[0]) > 0  # descent moves them apart
    assert np.allclose(g[2], 0.0)


def test_imc_counter_reports_the_cross_modal_count_and_in_band_intra_modal_negatives():
    out = count_batch(IMAGES, CAPTIONS, "imc")
    sh = count_batch(IMAGES, CAPTIONS, "triplet_sh")
    for d in ("i2t", "t2i"):
        assert out[d]["C_q"] == sh[d]["C_q"] and out[d]["C_B"] == sh[d]["C_B"] and out[d]["C_0"] == sh[d]["C_0"]
    assert out["i2t"]["C_intra"] == pytest.approx(2 / 3)  # images 0 and 1 each have one in-band neighbour
    assert out["t2i"]["C_intra"] == pytest.approx(2 / 3)


def test_imc_trains_the_tiny_model_above_an_untrained_one(tmp_path):
    from cocos.data.synth import make_synthetic
    from cocos.training.evaluate import evaluate_model
    from cocos.training.trainer import TrainConfig, Trainer

    data = make_synthetic(tmp_path / "syn", n_train=100, n_dev=40, n_test=40, feature_dim=32, seed=1)
    cfg = TrainConfig.of(data=str(data), out=str(tmp_path / "imc"), loss="imc", epochs=3, lr=1e-2, lr_update=10,
                      batch_size=32, embed_size=32, word_dim=16, seed=0, device="cpu")
    trainer = Trainer(cfg, progress=False, log=lambda *a: None)
    untrained = evaluate_model(trainer.model, trainer.dev_split, trainer.dev_ids)["rsum"]
    assert trainer.fit()["rsum"] > untrained + 15
    # the step log names IMC's parts (issue 29): L_intra beside the whole loss, which is never below it (the
    # contrastive part is a hinge sum, >= 0) and equals it when the intra-modal part is 0
    import pandas as pd

    log = pd.read_csv(tmp_path / "imc" / "train_log.csv")
    assert "L_intra" in log and log["L_intra"].notna().all() and (log["L_intra"] >= 0).all()
    assert (log["L_con"] >= log["L_intra"] - 1e-5).all() and (log["L_intra"] > 0).any()


@pytest.mark.parametrize("args, message", [
    (["-p", "lam=-1"], "lam must be >= 0"),
    (["-p", "mu_down=0.5", "-p", "mu_up=0.4"], "IMC needs 0 <= mu_down < mu_up"),
    (["-p", "tau=0.1"], "no counted loss takes 'tau'"),
])
def test_bad_imc_parameters_are_one_line_exit_2(tmp_path, args, message):
    res = runner.invoke(app, ["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"), "--loss", "imc",
                              "--no-progress", *args])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
    assert not (tmp_path / "o").exists()


def test_get_loss_refuses_a_band_upside_down():
    with pytest.raises(CocosError, match="mu_down < mu_up"):
        get_loss("imc", mu_down=0.6)
