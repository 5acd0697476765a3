"""``cocos demo --model clip`` at tiny size: the demo's own random CLIP folder (tokenizer, processor, weights: the
same for a seed), its pre-training with CLIP's loss, the pre-trained CLIP folder (read back as any CLIP folder, with
the embeddings of the checkpoint it was saved from), fine-tuning with NT-Xent, SigLIP and Triplet SH, the report with
their COCOS, reuse of every stage, chance rsum, and the flags it refuses.

The sizes are the config's test knob (``ClipDemoConfig.tower``, no flag): a CLIP of one block of 16 units a tower on
16-px images, 16 training scenes, one epoch a stage."""

from __future__ import annotations

import json
import re

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers")

from cocos.pipelines.demo_clip import (  # noqa: E402
    CLIP_LOSSES,
    INIT_DIR,
    PRETRAIN_DIR,
    PRETRAINED_DIR,
    ClipDemoConfig,
    TinyCLIP,
    chance_rsum,
    learn_bpe,
    run_clip_demo,
    write_init_folder,
)
from cocos_cli.main import app  # noqa: E402
from tests.helpers import figures_empty  # noqa: E402

runner = CliRunner()
TINY = TinyCLIP(image_size=16, patch_size=8, width=16, layers=1, heads=2, projection_dim=8, max_positions=48)


def _config(tmp, **kw) -> ClipDemoConfig:
    return ClipDemoConfig(out=str(tmp / "rep"), data=str(tmp / "img"), checkpoints=str(tmp / "ck"), n_train=16,
                          n_dev=8, n_test=8, image_size=16, pretrain_epochs=1, epochs=1, batch_size=8, track_cocos=2,
                          device="cpu", tower=TINY, **kw)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dclip")
    lines: list[str] = []
    with figures_empty():  # the report's files, not their drawing (tests/test_report_figures.py)
        run_clip_demo(_config(tmp), progress=False, log=lines.append)
    return tmp, lines


def test_demo_writes_the_three_losses_cocos_and_their_checkpoints(demo):
    tmp, lines = demo
    log = "\n".join(lines)
    assert "generating the synthetic image world" in log and "building the demo's tiny CLIP" in log
    assert "[pre-training] training CLIP with NT-Xent for 1 epochs" in log
    ck, rep = tmp / "ck", tmp / "rep"
    for loss in CLIP_LOSSES:
        assert (ck / loss / "model_best.pt").is_file() and f"[{loss}] test rsum" in log
        ckpt = torch.load(ck / loss / "model_best.pt", weights_only=True)
        assert ckpt["train"]["model"]["sources"] == {"clip": str(ck / PRETRAINED_DIR)}
        res = json.loads((rep / loss / "results.json").read_text())
        assert res["model"]["kind"] == "clip" and res["training"]["loss"] == loss
        assert loss in res["counting"]["losses"]  # each model's own loss counted
        assert (res["data"]["n_images"], res["data"]["n_captions"]) == (16, 80)
        assert (rep / loss / "counts.png").is_file() and (rep / loss / "cocos_track.csv").is_file()
    ntxent = torch.load(ck / "ntxent" / "model_best.pt", weights_only=True)
    assert ntxent["train"]["loss"]["learn_tau"] is True  # NT-Xent at CLIP's learned temperature
    assert ntxent["loss"]["params"]["tau"] == pytest.approx(float(torch.exp(-ntxent["state_dict"]["clip.logit_scale"])))
    assert all(f'href="{name}/index.html"' in (rep / "index.html").read_text() for name in ("summary", "siglip"))
    readme = (rep / "README.md").read_text()
    assert readme.startswith("# cocos demo --model clip") and "**randomly initialised**" in readme
    assert "Table 1" in readme and "Table 2" in readme and f"Chance rsum is {chance_rsum(8):.1f}" in readme
    for name in ("NT-Xent (learned τ)", "SigLIP (learned t, b)", "Triplet SH"):
        assert f"| {name} |" in readme
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert "summary/cocos_vs_rsum.png" in figures and "summary/cocos_track.png" in figures
    assert all((rep / f).is_file() for f in figures), figures
    # the demo's own folders say what they are
    assert "randomly initialised" in (ck / INIT_DIR / "README.md").read_text()
    assert json.loads((ck / INIT_DIR / "cocos_demo.json").read_text())["made"] == "random initialisation"
    assert "pre-trained" in (ck / PRETRAINED_DIR / "README.md").read_text()


def test_pretrained_folder_reads_as_a_clip_folder_with_the_same_embeddings(demo):
    from cocos.embed import FrozenModel

    tmp, _ = demo
    folder = FrozenModel.load(tmp / "ck" / PRETRAINED_DIR, tmp / "img")  # the cocos analyze CLIP_DIR --data path
    ckpt = FrozenModel.load(tmp / "ck" / PRETRAIN_DIR / "model_best.pt")
    a, b = folder.encode(folder.open_split("test")), ckpt.encode(ckpt.open_split("test"))
    assert torch.allclose(a.images, b.images, atol=1e-6) and torch.allclose(a.captions, b.captions, atol=1e-6)
    assert folder.checkpoint["loss"]["name"] == "ntxent"
    assert folder.checkpoint["loss"]["params"]["tau"] == pytest.approx(ckpt.checkpoint["loss"]["params"]["tau"])


def test_rerun_reuses_every_stage(demo):
    tmp, _ = demo
    lines: list[str] = []
    before = (tmp / "ck" / "triplet_sh" / "model_best.pt").read_bytes()
    with figures_empty():
        run_clip_demo(_config(tmp), progress=False, log=lines.append)
    log = "\n".join(lines)
    assert "training CLIP" not in log and log.count("reusing") == 2 + len(CLIP_LOSSES), log
    assert (tmp / "ck" / "triplet_sh" / "model_best.pt").read_bytes() == before
    assert f"(reusing the trained runs of pre-training, {', '.join(CLIP_LOSSES)})" in (tmp / "rep" / "README.md") \
        .read_text()


def test_the_random_folder_is_the_same_for_a_seed(demo, tmp_path):
    tmp, _ = demo
    cfg = _config(tmp)
    write_init_folder(cfg, tmp / "img", tmp_path / "again", "fingerprint")
    for name in ("model.safetensors", "vocab.json", "merges.txt", "tokenizer.json", "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp / "ck" / INIT_DIR / name).read_bytes(), name
    vocab = json.loads((tmp_path / "again" / "vocab.json").read_text())
    assert "sphere</w>" in vocab and list(vocab)[-2:] == ["<|startoftext|>", "<|endoftext|>"]


def test_learn_bpe_merges_frequent_pairs_deterministically():
    from collections import Counter

    words = Counter({"red": 5, "bed": 3, "cube": 1})
    merges = learn_bpe(words)
    assert merges[:2] == [("e", "d</w>"), ("r", "ed</w>")] and learn_bpe(Counter(dict(reversed(words.items())))) \
        == merges
    assert ("c", "u") not in merges  # seen once


def test_chance_rsum():
    # 200 images, 5 captions: i2t 0.5 + 2.480 + 4.911, t2i 0.5 + 2.5 + 5 (the README's 16)
    assert chance_rsum(200) == pytest.approx(15.891, abs=1e-3)
    # 2 images, 1 caption each: R@1 is a coin toss, R@5 and R@10 certain, both ways
    assert chance_rsum(2, k=1) == pytest.approx(500.0)


def test_cli_refuses_the_other_demos_flags(tmp_path):
    res = runner.invoke(app, ["demo", "--model", "clip", "--images", "--embed-size", "32", "--out",
                              str(tmp_path / "r"), "--data", str(tmp_path / "d"), "--checkpoints", str(tmp_path / "c")])
    assert res.exit_code == 2 and "--images, --embed-size do not apply to cocos demo --model clip" in res.output
    assert not any((tmp_path / n).exists() for n in ("r", "d", "c"))
