"""``cocos demo`` at tiny size: the report folder, its README, and reuse of matching checkpoints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cocos_cli.main import app

runner = CliRunner()


@pytest.mark.slow
def test_demo_end_to_end_and_reuse(tmp_path):
    args = ["demo", "--out", str(tmp_path / "rep"), "--data", str(tmp_path / "syn"), "--checkpoints",
            str(tmp_path / "ck"), "--loss", "triplet_sh", "--epochs", "2", "--n-train", "64",
            "--embed-size", "16", "--word-dim", "8", "--batch-size", "16", "--no-progress"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "training vsepp" in first.output
    readme = (tmp_path / "rep" / "README.md").read_text()
    assert "Table 1" in readme and "Table 2" in readme and "Triplet loss SH" in readme
    assert "![COCOS vs rsum](summary/cocos_vs_rsum.png)" in readme
    assert (tmp_path / "rep" / "summary" / "cocos_vs_rsum.png").exists()
    assert (tmp_path / "rep" / "triplet_sh" / "triplet_diagram.png").exists()
    sh = json.loads((tmp_path / "rep" / "triplet_sh" / "results.json").read_text())
    assert sh["training"]["loss"] == "triplet_sh" and sh["model"]["kind"] == "vsepp"
    before = (tmp_path / "rep" / "triplet_sh" / "results.json").read_bytes()
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "training" not in second.output and second.output.count("reusing") == 1
    assert (tmp_path / "rep" / "triplet_sh" / "results.json").read_bytes() == before


def test_demo_unknown_loss(tmp_path):
    res = runner.invoke(app, ["demo", "--out", str(tmp_path / "r"), "--loss", "hinge"])
    assert res.exit_code == 2 and "unknown loss 'hinge'" in res.output
    assert not (tmp_path / "r").exists()


def test_demo_with_one_epoch_skips_the_warm_up(tmp_path):
    from cocos.pipelines.demo import DemoConfig, _train_config

    cfg = DemoConfig(epochs=1, data=str(tmp_path / "d"))
    assert _train_config(cfg, "triplet_sh").loss.warmup_epochs == 0  # scaled to fit: no warm-up in a 1-epoch demo
    assert _train_config(DemoConfig(epochs=8), "triplet_sh").loss.warmup_epochs == 1
    assert _train_config(DemoConfig(epochs=8), "ntxent").loss.warmup_epochs == 0
    _train_config(cfg, "triplet_sh").validate()  # `cocos demo --epochs 1` passes validation
