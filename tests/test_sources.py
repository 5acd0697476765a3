"""A family's pre-trained sources in the run's settings (issue 38): ``--source NAME=PATH``, the spellings ``--bert``,
``--clip`` and ``NAME=`` of earlier records, and the run recorded as its sections with one read-only mapping of every
record written so far (``cocos.training.config.record_flat``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cocos.errors import CocosError
from cocos.training.config import TrainConfig, from_record, is_sectioned, record_flat
from cocos_cli.main import app

runner = CliRunner()


def _train(tmp_path, *args):
    return runner.invoke(app, ["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                               "--no-progress", *args])


@pytest.mark.parametrize(("args", "line"), [
    (["--source", "nope=x"], "error: --source nope: no model family takes a source of that name (sources: bert "
                             "(vse_infty, vse_infty_full); clip (clip); siglip (siglip))"),
    (["--source", "bert"], "error: --source takes NAME=PATH, got 'bert'"),
    (["--model", "vse_infty", "--source", "bert=a", "--bert", "b"], "error: --source bert: given twice"),
    (["--source", "bert=a"], "error: --bert applies to vse_infty, vse_infty_full, not to --model vsepp"),
    (["--model", "vse_infty"], "error: --model vse_infty needs --bert DIR (or --source bert=DIR): a Hugging Face "
                               "BERT folder"),
])
def test_a_wrong_source_is_one_line_and_nothing_is_written(tmp_path, args, line):
    res = _train(tmp_path, *args)
    assert res.exit_code == 2 and res.output.strip().startswith(line), res.output
    assert len(res.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_the_spellings_of_a_source_are_one_setting():
    by_flag = TrainConfig.of(data="d", model="vse_infty", bert="/b")
    by_name = TrainConfig.of(data="d", model="vse_infty", sources={"bert": "/b"})
    assert by_flag == by_name and by_flag.model.source("bert") == "/b" and by_flag.model.source("clip") is None
    assert by_flag.flat()["sources"] == {"bert": "/b"} and "bert" not in by_flag.flat()
    assert "sources" not in TrainConfig.of(data="d").flat()  # added since: written only where it is not the default


def test_records_of_earlier_versions_read_as_today():
    old = {"data": "d", "model": "clip", "loss": "ntxent", "clip": "/c", "lr": 1e-5, "batch_size": 8}
    flat = record_flat(old)
    assert flat["sources"] == {"clip": "/c"} and "clip" not in flat and flat["lr"] == 1e-5
    assert flat["ltd"] is False and flat["learn_tau"] is False and flat["optimizer"] == "adam"  # their defaults
    assert old == {"data": "d", "model": "clip", "loss": "ntxent", "clip": "/c", "lr": 1e-5, "batch_size": 8}
    assert not is_sectioned(old) and from_record(old).model.sources == {"clip": "/c"}


def test_the_run_recorded_as_its_sections_reads_back_as_the_same_run():
    cfg = TrainConfig.of(data="d", model="vse_infty", bert="/b", ltd=True, ltd_eta=0.2, lr_groups={"txt": 0.1},
                         params={"margin": 0.3}, embed_size=16, seed=7, track_cocos=3)
    record = cfg.record()
    assert is_sectioned(record) and set(record) == {"data", "model", "loss", "optim", "hooks", "out", "device"}
    assert record["model"]["sources"] == {"bert": "/b"} and record["hooks"]["ltd"]["eta"] == 0.2
    assert from_record(record) == cfg
    # both forms of the same run give the same flat view: what resume, sweep and the demo compare
    assert record_flat(record) == record_flat(cfg.flat())
    with pytest.raises(CocosError, match="does not fit a run's sections"):
        from_record({**record, "optim": {**record["optim"], "momentum": 0.9}})
