"""Outputs by kind (issue 37): a folder records what wrote it, and a command replaces only an output of its own kind.

Every command that writes a folder is pointed at a dataset, a feature cache, a run folder, a report, a sweep
folder and an input: one ``error:`` line, exit 2, and the target byte-identical (every file hashed, the marker
included), with and without ``--overwrite``. A folder cocos did not write is never replaced; a report is replaced
by a second ``cocos analyze`` only with ``--overwrite``; folders of an earlier cocos (a marker without a kind) are
read by their files.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.data.synth import make_synthetic
from cocos.data.synth_images import make_synthetic_images
from cocos.embed.features import write_feature_cache
from cocos.errors import CocosError
from cocos.io import (
    KINDS,
    MARKER,
    atomic_dir,
    check_output_dir,
    check_output_file,
    mark_output,
    marker_fields,
    output_kind,
)
from cocos.models.cnn import build_cnn, strip_classifier
from cocos.training.trainer import RUN_MARKER, TrainConfig, Trainer
from cocos_cli.main import app

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
OLD_MARKER = "written by cocos; cocos may replace this folder\n"  # the text of every earlier version


def _hashes(folder: Path) -> dict:
    """Every entry under ``folder`` (hidden ones included): a file's sha256, a folder's name."""
    folder = Path(folder)
    assert folder.exists()
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def _refused(args: list[str], target: Path, *words: str) -> str:
    """Run the CLI; it must refuse in one ``error:`` line (exit 2, no traceback) and leave ``target`` as it was."""
    before = _hashes(target)
    res = runner.invoke(app, [str(a) for a in args])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    assert _hashes(target) == before, lines[0]
    assert not list(target.parent.glob(f".{target.name}.*")), "a temporary or lock file was left"
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    """One folder of each kind, written by the commands themselves (small worlds)."""
    root = tmp_path_factory.mktemp("kinds")
    data = make_synthetic(root / "syn", n_train=32, n_dev=16, n_test=16, feature_dim=8, seed=1)
    other = make_synthetic(root / "other", n_train=8, n_dev=4, n_test=4, feature_dim=8, seed=2)
    cfg = TrainConfig.of(data=str(data), out=str(root / "train"), loss="triplet_sh", epochs=1, batch_size=16,
                         embed_size=8, word_dim=8, device="cpu")
    Trainer(cfg, progress=False, log=lambda *a: None).fit()
    shutil.copytree(root / "train", root / "run")  # a run folder that holds no input of the commands tested
    images = make_synthetic_images(root / "imgs", n_train=4, n_dev=2, n_test=2, image_size=16, seed=3,
                                   progress=False)
    torch.manual_seed(0)
    cnn = build_cnn("resnet18")
    torch.save(cnn.state_dict(), root / "r18.pth")
    write_feature_cache(images, root / "feat", strip_classifier(cnn).eval(), cnn_type="resnet18", resize=16,
                        crop_size=16, batch_size=4)
    g = np.random.default_rng(0)
    emb = g.normal(size=(16, 8))
    np.savez(root / "emb.npz", images=emb, captions=np.repeat(emb, 5, 0) + g.normal(size=(80, 8)))
    res = runner.invoke(app, ["count", str(root / "emb.npz"), "--out", str(root / "report"), "--batch-size", "8",
                              "--loss", "triplet", "--no-progress"])
    assert res.exit_code == 0, res.output
    (root / "sweep").mkdir()
    mark_output(root / "sweep", "sweep", by="sweep")
    (root / "sweep" / "logs").mkdir()
    return {"root": root, "data": data, "dataset": other, "images": images, "features": root / "feat",
            "run": root / "run", "report": root / "report", "sweep": root / "sweep",
            "ckpt": root / "train" / "model_best.pt", "emb": root / "emb.npz", "weights": root / "r18.pth"}


def test_every_folder_records_its_kind(kinds):
    assert output_kind(kinds["dataset"]) == "dataset" and output_kind(kinds["images"]) == "dataset"
    assert marker_fields(kinds["dataset"]) == {"kind": "dataset", "by": "data synth"}
    assert output_kind(kinds["features"]) == "features"
    assert marker_fields(kinds["features"]) == {"kind": "features", "by": "data features"}
    assert output_kind(kinds["run"]) == "run" and (kinds["run"] / RUN_MARKER).is_file()
    assert marker_fields(kinds["report"]) == {"kind": "report", "by": "count"}
    assert output_kind(kinds["sweep"]) == "sweep"
    assert output_kind(kinds["root"]) is None and output_kind(kinds["root"] / "missing") is None
    assert set(KINDS) >= {"dataset", "features", "run", "report", "track", "sweep", "pretrain"}


# -- each command against each other kind ----------------------------------------------------------------------

OTHER = ("dataset", "features", "run", "sweep")


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("kind", OTHER)
def test_analyze_refuses_a_folder_of_another_kind(kinds, kind, overwrite):
    line = _refused(["analyze", kinds["ckpt"], "--out", kinds[kind], "--no-progress"]
                    + (["--overwrite"] if overwrite else []), kinds[kind], "cocos analyze writes reports")
    assert KINDS[kind] in line


def test_analyze_into_a_feature_cache_names_both_kinds(kinds):
    """The issue's example: the line says what the folder is and what analyze writes."""
    line = _refused(["analyze", kinds["ckpt"], "--out", kinds["features"], "--overwrite"], kinds["features"])
    assert line == (f"error: {kinds['features']}: is a cocos feature cache (written by cocos data features); "
                    "cocos analyze writes reports: choose another --out")


def test_analyze_refuses_its_input_and_a_folder_inside_it(kinds):
    _refused(["analyze", kinds["ckpt"], "--data", kinds["data"], "--out", kinds["data"], "--overwrite"], kinds["data"],
             "input")
    _refused(["analyze", kinds["ckpt"], "--out", kinds["data"] / "report", "--overwrite"], kinds["data"],
             "lies inside a cocos dataset")


def test_analyze_of_several_checkpoints_writes_into_no_cocos_folder(kinds):
    _refused(["analyze", kinds["ckpt"], kinds["ckpt"].with_name("last.pt"), "--out", kinds["features"]],
             kinds["features"], "cocos writes nothing inside it")


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("kind", OTHER)
def test_count_refuses_a_folder_of_another_kind(kinds, kind, overwrite):
    _refused(["count", kinds["emb"], "--out", kinds[kind], "--no-progress"] + (["--overwrite"] if overwrite else []),
             kinds[kind], "cocos count writes reports", KINDS[kind])


def test_count_refuses_a_folder_holding_its_input(kinds, tmp_path):
    folder = tmp_path / "holder"
    folder.mkdir()
    shutil.copy(kinds["emb"], folder / "emb.npz")
    _refused(["count", folder / "emb.npz", "--out", folder, "--overwrite"], folder, "input")


@pytest.mark.parametrize("kind", OTHER)
def test_report_refuses_a_folder_of_another_kind(kinds, kind):
    _refused(["report", kinds["report"] / "results.json", "--out", kinds[kind], "--overwrite"], kinds[kind],
             "cocos report writes reports", KINDS[kind])


def test_report_refuses_the_report_it_reads(kinds):
    _refused(["report", kinds["report"] / "results.json", "--out", kinds["report"], "--overwrite"], kinds["report"],
             "input")
    _refused(["report", kinds["report"] / "results.json", "--out", kinds["report"]], kinds["report"], "input")
    copy = shutil.copytree(kinds["report"], kinds["root"] / "report_copy")  # another report: only with --overwrite
    _refused(["report", kinds["report"] / "results.json", "--out", copy], copy, "--overwrite", "holds a cocos report")
    res = runner.invoke(app, ["report", str(kinds["report"] / "results.json"), "--out", str(copy), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert marker_fields(copy) == {"kind": "report", "by": "report"}


@pytest.mark.parametrize("kind", ("features", "run", "report", "sweep"))
def test_data_synth_refuses_a_folder_of_another_kind(kinds, kind):
    for images in ([], ["--images", "--no-progress"]):
        _refused(["data", "synth", kinds[kind], "--n-train", "4", "--n-dev", "2", "--n-test", "2", "--overwrite",
                  *images], kinds[kind], "cocos data synth writes datasets", KINDS[kind])


@pytest.mark.parametrize("kind", ("dataset", "run", "report", "sweep"))
def test_data_features_refuses_a_folder_of_another_kind(kinds, kind):
    _refused(["data", "features", kinds["images"], "--cnn", "resnet18", "--cnn-weights", kinds["weights"], "--out",
              kinds[kind], "--overwrite", "--no-progress", "--workers", "0"], kinds[kind],
             "cocos data features writes feature caches", KINDS[kind])


def test_data_features_refuses_its_input(kinds):
    _refused(["data", "features", kinds["images"], "--cnn", "resnet18", "--cnn-weights", kinds["weights"], "--out",
              kinds["images"], "--overwrite", "--no-progress"], kinds["images"], "input")


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("kind", ("dataset", "features", "report", "sweep"))
def test_train_refuses_a_folder_of_another_kind(kinds, kind, overwrite):
    _refused(["train", "--data", kinds["data"], "--out", kinds[kind], "--epochs", "1", "--batch-size", "16",
              "--device", "cpu", "--no-progress"] + (["--overwrite"] if overwrite else []), kinds[kind],
             "cocos train writes training runs", KINDS[kind])


def test_train_refuses_a_folder_inside_its_data(kinds):
    _refused(["train", "--data", kinds["data"], "--out", kinds["data"] / "run", "--epochs", "1", "--device", "cpu",
              "--no-progress"], kinds["data"], "input")


def _grid(tmp_path: Path, data: Path) -> Path:
    grid = tmp_path / "g.toml"
    grid.write_text(f'name = "g"\ndata = "{data}"\nmodels = ["vsepp"]\nseeds = [0]\n[train]\nepochs = 1\n'
                    'batch_size = 16\nembed_size = 8\nword_dim = 8\ndevice = "cpu"\n[[loss]]\nname = "triplet_sh"\n')
    return grid


@pytest.mark.parametrize("kind", ("dataset", "features", "run", "report"))
def test_sweep_refuses_a_folder_of_another_kind(kinds, kind, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    shutil.copytree(kinds[kind], reports / "g", symlinks=True)
    grid = _grid(tmp_path, kinds["data"])
    for extra in (["--dry-run"], []):
        _refused(["sweep", grid, "--reports", reports, "--checkpoints", tmp_path / "ck", *extra], reports / "g",
                 "cocos sweep writes sweep folders", KINDS[kind])
    assert not (tmp_path / "ck").exists()


def test_demo_refuses_a_folder_of_another_kind(kinds, tmp_path):
    small = ["--n-train", "32", "--n-test", "16", "--batch-size", "16", "--epochs", "1", "--loss", "triplet_sh",
             "--device", "cpu"]
    _refused(["demo", "--out", kinds["dataset"], "--data", kinds["data"], "--checkpoints", tmp_path / "ck", *small,
              "--overwrite"], kinds["dataset"], "cocos demo writes reports")
    _refused(["demo", "--out", tmp_path / "rep", "--data", kinds["report"], "--checkpoints", tmp_path / "ck", *small,
              "--overwrite"], kinds["report"], "cocos demo writes datasets", "--data")
    assert not (tmp_path / "rep").exists() and not (tmp_path / "ck").exists()


def test_import_refuses_a_dataset_or_feature_cache(kinds):
    for kind in ("dataset", "features"):
        _refused(["import", kinds["ckpt"], "--out", kinds[kind], "--overwrite"], kinds[kind])
        _refused(["import", kinds["ckpt"], "--out", kinds[kind] / "model.pt", "--overwrite"], kinds[kind],
                 KINDS[kind])


# -- the same kind: replaced only with --overwrite -------------------------------------------------------------

def test_analyze_twice_needs_overwrite(kinds, tmp_path, monkeypatch):
    from tests.helpers import empty_figures

    empty_figures(monkeypatch)
    out = tmp_path / "rep"
    args = ["analyze", str(kinds["ckpt"]), "--out", str(out), "--no-progress"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert marker_fields(out) == {"kind": "report", "by": "analyze"}
    (out / "results.json").write_text("{}")  # tell the replaced folder from the one that was there
    line = _refused(args, out, "--overwrite")
    assert "holds a cocos report" in line
    res = runner.invoke(app, args + ["--overwrite"])
    assert res.exit_code == 0, res.output
    assert (out / "results.json").read_text() != "{}" and output_kind(out) == "report"


def test_a_folder_cocos_did_not_write_is_never_replaced(kinds, tmp_path):
    mine = tmp_path / "home"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    for args in (["analyze", kinds["ckpt"], "--out", mine], ["count", kinds["emb"], "--out", mine],
                 ["report", kinds["report"] / "results.json", "--out", mine], ["data", "synth", mine],
                 ["train", "--data", kinds["data"], "--out", mine, "--epochs", "1", "--device", "cpu"]):
        _refused([*args, "--overwrite"], mine, "not written by cocos")
    assert (mine / "notes.txt").read_text() == "keep"


# -- folders of an earlier cocos: a marker without a kind ------------------------------------------------------

def _old(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / MARKER).write_text(OLD_MARKER)
    return dst


def test_old_markers_are_read_by_their_files(kinds, tmp_path):
    assert output_kind(_old(kinds["report"], tmp_path / "report")) == "report"
    assert output_kind(_old(kinds["features"], tmp_path / "feat")) == "features"
    assert output_kind(_old(kinds["dataset"], tmp_path / "syn")) == "dataset"
    assert output_kind(_old(kinds["images"], tmp_path / "imgs")) == "dataset"
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "notes.txt").write_text("x")
    (odd / MARKER).write_text(OLD_MARKER)
    assert output_kind(odd) == "unknown"
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / MARKER).write_text("written by cocos sweep; cocos may replace this folder\n")
    assert output_kind(sweep) == "sweep" and marker_fields(sweep)["by"] == "sweep"


def test_old_folders_follow_the_rule(kinds, tmp_path):
    old_cache = _old(kinds["features"], tmp_path / "feat")
    _refused(["count", kinds["emb"], "--out", old_cache, "--overwrite"], old_cache, KINDS["features"])
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "notes.txt").write_text("x")
    (odd / MARKER).write_text(OLD_MARKER)
    _refused(["count", kinds["emb"], "--out", odd, "--overwrite"], odd, "earlier cocos")
    old_report = _old(kinds["report"], tmp_path / "report")
    _refused(["count", kinds["emb"], "--out", old_report, "--batch-size", "8", "--no-progress"], old_report,
             "--overwrite")
    res = runner.invoke(app, ["count", str(kinds["emb"]), "--out", str(old_report), "--batch-size", "8",
                              "--loss", "triplet", "--no-progress", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert marker_fields(old_report) == {"kind": "report", "by": "count"}


# -- the library rule ------------------------------------------------------------------------------------------

def test_the_demo_and_a_sweep_rewrite_only_their_own_folders(tmp_path):
    with atomic_dir(tmp_path / "demo", kind="report", by="demo") as tmp:
        (tmp / "README.md").write_text("one")
    with atomic_dir(tmp_path / "demo", kind="report", by="demo") as tmp:  # a rerun: no --overwrite needed
        (tmp / "README.md").write_text("two")
    assert (tmp_path / "demo" / "README.md").read_text() == "two"
    with pytest.raises(CocosError, match="--overwrite"):  # another command's report: only with --overwrite
        check_output_dir(tmp_path / "demo", kind="report", by="analyze")
    with atomic_dir(tmp_path / "mine", kind="report", by="analyze") as tmp:
        (tmp / "results.json").write_text("{}")
    with pytest.raises(CocosError, match="--overwrite"):  # the demo does not take over another command's report
        check_output_dir(tmp_path / "mine", kind="report", by="demo")
    with pytest.raises(CocosError, match="writes datasets"):  # nor a folder of another kind, even its own
        check_output_dir(tmp_path / "demo", overwrite=True, kind="dataset", by="demo")
    with pytest.raises(ValueError):
        check_output_dir(tmp_path / "x", kind="nonsense")


def test_no_file_is_written_into_a_dataset(kinds):
    with pytest.raises(CocosError, match="cocos writes nothing inside it"):
        check_output_file(kinds["dataset"] / "metrics.json", overwrite=True)
    with pytest.raises(CocosError, match="lies inside a cocos dataset"):  # at any depth
        check_output_file(kinds["dataset"] / "sub" / "deeper" / "metrics.json", overwrite=True)
    check_output_file(kinds["report"] / "extra.json")  # a report may take a file beside its own


@pytest.mark.parametrize("holder", ["dataset", "features"])
def test_nothing_is_written_inside_a_folder_of_another_kind_at_any_depth(kinds, holder):
    """A report inside a dataset would be deleted with it by `cocos data synth --overwrite`: `--out DATASET/rep`
    (and deeper) is refused like `--out DATASET`, for every command that writes a folder."""
    target = kinds[holder]
    for out in (target / "rep", target / "a" / "b"):
        line = _refused(["count", kinds["emb"], "--out", out, "--batch-size", "8", "--no-progress"], target,
                        "lies inside a cocos")
        assert str(target) in line and not out.exists()
    _refused(["analyze", kinds["ckpt"], "--out", target / "rep", "--no-progress"], target, "lies inside a cocos")
    _refused(["train", "--data", kinds["data"], "--out", target / "run", "--epochs", "1", "--no-progress"], target,
             "lies inside a cocos")
    _refused(["data", "synth", target / "more"], target, "lies inside a cocos")


def test_a_report_may_lie_beside_a_run_s_checkpoints_and_in_a_sweep(kinds, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(kinds["run"], run)
    res = runner.invoke(app, ["count", str(kinds["emb"]), "--out", str(run / "analysis"), "--batch-size", "8",
                              "--loss", "triplet", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert output_kind(run / "analysis") == "report" and output_kind(run) == "run"
    check_output_dir(kinds["sweep"] / "new-run", kind="run")  # a sweep holds its runs and reports
    with pytest.raises(CocosError, match="lies inside a cocos sweep folder"):
        check_output_dir(kinds["sweep"] / "data", kind="dataset")


@pytest.mark.parametrize("name", [".", ".."])
def test_an_output_folder_needs_a_name_of_its_own(kinds, tmp_path, monkeypatch, name):
    """`--out .` was refused only after the whole count, when the rename of the finished folder failed."""
    monkeypatch.chdir(kinds["report"])
    _refused(["count", kinds["emb"], "--out", name, "--batch-size", "8", "--no-progress", "--overwrite"],
             kinds["report"], "not '.' or '..'")


def test_a_demo_rerun_after_an_upgrade_takes_its_earlier_folders(kinds, tmp_path):
    """Folders an earlier cocos wrote name no writer: where the demo puts them they are the demo's (reused or
    rewritten without --overwrite, as before), and a run the demo trains again records the demo from then on; a
    run cocos train wrote now says so (``by: train``) and stays the user's."""
    from cocos.pipelines.demo import _check_run_folder
    from cocos.training.trainer import run_writer

    old = tmp_path / "reports-demo"
    old.mkdir()
    (old / MARKER).write_text(OLD_MARKER)
    (old / "README.md").write_text("x")
    (old / "summary").mkdir()
    (old / "summary" / "tables.md").write_text("x")
    check_output_dir(old, kind="report", by="demo")  # the demo's earlier report: no --overwrite needed
    with pytest.raises(CocosError, match="--overwrite"):
        check_output_dir(old, kind="report", by="analyze")
    run = tmp_path / "triplet_sh"
    shutil.copytree(kinds["run"], run)
    (run / RUN_MARKER).write_text("written by cocos train\n")  # an earlier version's marker: no writer
    assert run_writer(run) is None
    _check_run_folder(run, overwrite=False)
    assert run_writer(kinds["run"]) == "train"  # written by this version's cocos train
    with pytest.raises(CocosError, match="the demo did not train"):
        _check_run_folder(kinds["run"], overwrite=False)
