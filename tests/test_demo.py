"""``cocos demo`` at tiny size: the report folder, its README, and reuse of matching checkpoints."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cocos_cli.main import app
from tests.helpers import empty_figures, figures_empty

runner = CliRunner()


COMMON = ["--loss", "triplet_sh", "--epochs", "2", "--n-train", "64", "--embed-size", "16", "--word-dim", "8",
          "--batch-size", "16", "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain demo, run once for the module: its folder and its output (its data and checkpoints are reused by
    the tests after it)."""
    tmp = tmp_path_factory.mktemp("demo")
    with figures_empty():  # the report's files, not their drawing (tests/test_report_figures.py): ~1 s a figure
        first = runner.invoke(app, _plain_args(tmp))
    assert first.exit_code == 0, first.output
    return tmp, first.output


def _plain_args(tmp):
    return ["demo", "--out", str(tmp / "rep"), "--data", str(tmp / "syn"), "--checkpoints", str(tmp / "ck"), *COMMON]


@pytest.mark.slow
def test_demo_end_to_end_and_reuse(plain, monkeypatch):
    empty_figures(monkeypatch)  # the report's files, not their drawing (tests/test_report_figures.py): ~1 s a figure
    tmp_path, output = plain
    assert "training vsepp" in output
    readme = (tmp_path / "rep" / "README.md").read_text()
    assert "Table 1" in readme and "Table 2" in readme and "Triplet loss SH" in readme
    assert "![COCOS vs rsum](summary/cocos_vs_rsum.png)" in readme
    assert (tmp_path / "rep" / "summary" / "cocos_vs_rsum.png").exists()
    assert (tmp_path / "rep" / "triplet_sh" / "triplet_diagram.png").exists()
    top = (tmp_path / "rep" / "index.html").read_text()  # the folder's page: the summary's first, then each model's
    assert top.index('href="summary/index.html"') < top.index('href="triplet_sh/index.html"')
    sh = json.loads((tmp_path / "rep" / "triplet_sh" / "results.json").read_text())
    assert sh["training"]["loss"] == "triplet_sh" and sh["model"]["kind"] == "vsepp"
    before = (tmp_path / "rep" / "triplet_sh" / "results.json").read_bytes()
    second = runner.invoke(app, _plain_args(tmp_path))
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


@pytest.mark.slow
def test_demo_of_a_bert_family_trains_it_beside_vsepp(plain, monkeypatch):
    """cocos demo --model vse_infty: VSE++ and VSE∞ with the same loss, one report with both models; the VSE∞ run
    takes the family's recipe on the demo's short schedule, and a VSE++ checkpoint of the plain demo is reused."""
    empty_figures(monkeypatch)  # the report's files, not their drawing (tests/test_report_figures.py)
    from tests.test_vse_infty import SPECIAL, synth_words, tiny_bert

    tmp_path, _ = plain  # the plain demo's data and checkpoints
    bert = tiny_bert(tmp_path / "bert", [w for w in synth_words(tmp_path / "syn") if w not in SPECIAL])
    res = runner.invoke(app, ["demo", "--model", "vse_infty", "--bert", str(bert), "--out", str(tmp_path / "infty"),
                              "--data", str(tmp_path / "syn"), "--checkpoints", str(tmp_path / "ck"), *COMMON])
    assert res.exit_code == 0, res.output
    assert "[triplet_sh] reusing" in res.output and "training vse_infty for 2 epochs" in res.output
    readme = (tmp_path / "infty" / "README.md").read_text()
    assert readme.startswith("# cocos demo --model vse_infty:") and "| VSE∞ | 2 |" in readme
    infty = json.loads((tmp_path / "infty" / "vse_infty_triplet_sh" / "results.json").read_text())
    assert infty["model"]["kind"] == "vse_infty" and infty["training"]["loss"] == "triplet_sh"
    from cocos.training.checkpoint import load_checkpoint
    from cocos.training.config import record_flat

    train = record_flat(load_checkpoint(tmp_path / "ck" / "vse_infty_triplet_sh" / "model_best.pt")["train"])
    assert (train["optimizer"], train["lr"], train["warmup_epochs"], train["sources"]) == \
        ("adamw", 5e-4, 1, {"bert": str(bert)})


def test_demo_bert_flag_needs_a_bert_family(tmp_path):
    res = runner.invoke(app, ["demo", "--out", str(tmp_path / "r"), "--bert", str(tmp_path)])
    assert res.exit_code == 2 and "--bert applies to cocos demo --model vse_infty" in res.output
    assert not (tmp_path / "r").exists()
