"""The sweep reads a run's results.json through the results model (issue 29): a file of any format version the
model reads (1, 3 and 4 here) tells whether the analysis is current and gives the run's rsum; a file the model
refuses is not current and has no rsum."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from cocos.pipelines.sweep import SweepRun, _rsum, analysis_current, run_results
from cocos.results import Results

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = json.loads((ROOT / "tests" / "fixtures" / "results_v3" / "triplet" / "results.json").read_text())
RSUM = 413.15999999999997  # tests/fixtures/results_v3/triplet/results.json (the example in format 3), its rsum
BEST = b"a model_best.pt stand-in"


def v3(sha: str) -> dict:
    data = copy.deepcopy(EXAMPLE)
    assert data["format_version"] == 3
    data["source"]["sha256"] = sha
    return data


def v4(sha: str) -> dict:
    return Results.from_dict(v3(sha)).to_dict()


def v1(sha: str) -> dict:
    """The example in the shape cocos 0.1 wrote (no ``format``; ``checkpoint`` instead of ``source``)."""
    data = v3(sha)
    source = data.pop("source")
    for key in ("format", "format_version", "presentation"):
        data.pop(key)
    data["checkpoint"] = {"path": source["path"], "sha256": source["sha256"], "epoch": source["epoch"]}
    return data


def make_run(tmp_path: Path, data: dict | None, *, split="test", compat=False, seed=0, batch_size=None) -> SweepRun:
    out, report = tmp_path / "ckpt", tmp_path / "report"
    out.mkdir(parents=True)
    report.mkdir()
    (out / "model_best.pt").write_bytes(BEST)
    if data is not None:
        (report / "results.json").write_text(json.dumps(data))
    return SweepRun("run", {"out": str(out), "seed": seed},
                    {"split": split, "compat": compat, "batch_size": batch_size, "eps": 0.01}, report=str(report))


SHA = hashlib.sha256(BEST).hexdigest()


@pytest.mark.parametrize("version", [v1, v3, v4])
def test_every_format_is_current_and_gives_its_rsum(tmp_path, version):
    run = make_run(tmp_path, version(SHA), batch_size=128)
    assert run_results(run).counting.batch_size == 128
    assert analysis_current(run) is True
    assert _rsum(run) == RSUM


@pytest.mark.parametrize("version", [v1, v3, v4])
@pytest.mark.parametrize("change", [
    {"split": "dev"}, {"compat": True}, {"seed": 1}, {"batch_size": 64},
])
def test_other_settings_are_not_current(tmp_path, version, change):
    run = make_run(tmp_path, version(SHA), **change)
    assert analysis_current(run) is False
    assert _rsum(run) == RSUM  # the rsum is the file's whatever the settings


@pytest.mark.parametrize("version", [v1, v3, v4])
def test_another_checkpoint_is_not_current(tmp_path, version):
    assert analysis_current(make_run(tmp_path, version("0" * 64))) is False


def test_missing_refused_and_metricless_files(tmp_path):
    assert analysis_current(make_run(tmp_path / "a", None)) is False
    assert _rsum(make_run(tmp_path / "b", None)) is None
    damaged = v4(SHA)
    damaged["statistics"][0]["n"] = -1  # a file the model refuses
    assert analysis_current(make_run(tmp_path / "c", damaged)) is False
    assert _rsum(make_run(tmp_path / "d", damaged)) is None
    counted = v4(SHA)
    counted["evaluation"] = None  # a cocos count file: no evaluation, so neither current nor an rsum
    assert analysis_current(make_run(tmp_path / "e", counted)) is False
    assert _rsum(make_run(tmp_path / "f", counted)) is None
    no_rsum = v4(SHA)
    del no_rsum["evaluation"]["metrics"]["rsum"]
    assert _rsum(make_run(tmp_path / "g", no_rsum)) is None
