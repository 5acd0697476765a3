"""``cocos sweep``: a tiny grid end to end (local executor and submitit's debug executor give the same
numbers), idempotent reruns, redoing one deleted analysis, and bad grids refused with nothing written."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from cocos_cli.main import app
from tests.helpers import one_error_line, snapshot

runner = CliRunner()

GRID = """\
name = "tiny"
data = "{data}"
reports = "{root}/reports"
checkpoints = "{root}/ck"
models = ["vsepp"]
seeds = {seeds}
[train]
epochs = 1
lr = 1e-3
batch_size = 16
embed_size = 16
word_dim = 8
device = "cpu"
[analyze]
split = "test"
[[loss]]
name = "triplet_sh"
[[loss]]
name = "ntxent"
params = {{ tau = 0.1 }}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from cocos.data.synth import make_synthetic

    root = tmp_path_factory.mktemp("sweep")
    make_synthetic(root / "data", n_train=48, n_dev=16, n_test=16, feature_dim=16, seed=0)
    return root


@pytest.fixture(autouse=True)
def quick_figures(monkeypatch):
    """Figures are tested elsewhere; here each one's files are written as placeholders (saves ~2 s a run)."""
    from pathlib import Path

    from cocos.report import style

    def save(fig, stem):
        import matplotlib.pyplot as plt

        plt.close(fig)
        paths = [Path(f"{stem}.{ext}") for ext in ("png", "pdf")]
        for p in paths:
            p.write_bytes(b"figure")
        return paths

    monkeypatch.setattr(style, "save", save)


def write_grid(folder, data, seeds="[0, 1]"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "grid.toml"
    path.write_text(GRID.format(data=data, root=folder, seeds=seeds))
    return path


def rsums(reports):
    return {p.parent.name: json.loads(p.read_text())["evaluation"]["metrics"]["rsum"]
            for p in sorted(reports.glob("*/results.json"))}


def stats(reports):
    return {p.parent.name: json.loads(p.read_text())["statistics"] for p in sorted(reports.glob("*/results.json"))}


@pytest.mark.slow
def test_sweep_end_to_end_rerun_and_redo_one(world):
    grid = write_grid(world / "local", world / "data")
    res = runner.invoke(app, ["sweep", str(grid)])
    assert res.exit_code == 0, res.output
    reports = world / "local" / "reports" / "tiny"
    names = ["vsepp_ntxent_0.1_s0", "vsepp_ntxent_0.1_s1", "vsepp_triplet_sh_s0", "vsepp_triplet_sh_s1"]
    assert sorted(rsums(reports)) == names
    assert res.output.count(": trained, analysed") == 4 and "4 of 4 runs ok, 0 failed" in res.output
    md = (reports / "summary" / "tables.md").read_text()
    assert "Table 1" in md and "±" in md  # two seeds: mean ± sample std
    top = (reports / "index.html").read_text()  # the sweep's page: the summary and every run's page
    assert all(f'href="{name}/index.html"' in top for name in ["summary", *names])
    # the merged Table 1 mean is the mean of the two seeds' rsum (computed here from the per-run files)
    values = rsums(reports)
    mean_sh = (values["vsepp_triplet_sh_s0"] + values["vsepp_triplet_sh_s1"]) / 2
    assert f"{mean_sh:.1f}" in md
    assert (reports / "summary" / "cocos_vs_rsum.png").exists()

    before = snapshot(reports, world / "local" / "ck")
    again = runner.invoke(app, ["sweep", str(grid)])
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.output and "training" not in again.output
    assert snapshot(reports, world / "local" / "ck") == before

    shutil.rmtree(reports / "vsepp_ntxent_0.1_s1")
    ckpt = (world / "local" / "ck" / "tiny" / "vsepp_ntxent_0.1_s1" / "model_best.pt").read_bytes()
    redo = runner.invoke(app, ["sweep", str(grid)])
    assert redo.exit_code == 0, redo.output
    assert "vsepp_ntxent_0.1_s1: analyse" in redo.output and redo.output.count(": skip") == 3
    assert redo.output.count("analysed") == 1 and "trained" not in redo.output
    assert rsums(reports) == values
    assert (world / "local" / "ck" / "tiny" / "vsepp_ntxent_0.1_s1" / "model_best.pt").read_bytes() == ckpt


def test_submitit_debug_executor_gives_the_same_numbers(world):
    pytest.importorskip("submitit")
    local = world / "local" / "reports" / "tiny"
    if not local.exists():
        runner.invoke(app, ["sweep", str(write_grid(world / "local", world / "data"))])
    grid = write_grid(world / "slurm", world / "data", seeds="[1]")
    res = runner.invoke(app, ["sweep", str(grid), "--executor", "slurm", "--cluster", "debug"])
    assert res.exit_code == 0, res.output
    assert "submitted 2 jobs to debug" in res.output
    other = world / "slurm" / "reports" / "tiny"
    assert sorted(rsums(other)) == ["vsepp_ntxent_0.1_s1", "vsepp_triplet_sh_s1"]
    assert rsums(other) == {k: v for k, v in rsums(local).items() if k.endswith("_s1")}
    assert stats(other) == {k: v for k, v in stats(local).items() if k.endswith("_s1")}


def test_failed_run_is_reported_and_the_others_go_on(world, monkeypatch):
    from cocos.pipelines import sweep

    grid = sweep.load_grid(write_grid(world / "fail", world / "data", seeds="[0]"))
    real = sweep._train_and_analyse

    def broken(run, *a, **kw):
        if run.name == "vsepp_ntxent_0.1_s0":
            raise RuntimeError("boom")
        return real(run, *a, **kw)

    monkeypatch.setattr(sweep, "_train_and_analyse", broken)
    lines = []
    results = sweep.run_sweep(grid, log=lines.append)
    failed = [r for r in results if r["status"] != "ok"]
    assert [r["name"] for r in failed] == ["vsepp_ntxent_0.1_s0"] and failed[0]["error"] == "boom"
    assert "RuntimeError: boom" in open(failed[0]["log"]).read()
    assert any("FAILED: boom" in line for line in lines) and any("1 of 2 runs ok, 1 failed" in x for x in lines)
    assert (grid.summary / "tables.md").exists()


BAD = {  # (top-level keys, tables, the message)
    "unknown key": ("colour = 'red'\n", "", "unknown key colour"),
    "unknown train key": ("", "[train]\nepochz = 3\n", "unknown key epochz"),
    "unknown loss": ("", "[[loss]]\nname = 'hinge'\n", "unknown loss 'hinge'"),
    "bad parameter": ("", "[[loss]]\nname = 'ntxent'\nparams = { tau = -1 }\n", "tau"),
    "zero runs": ("seeds = []\n", "", "zero runs"),
    "one name twice": ("", "[[loss]]\nname = 'triplet'\nid = 'x'\n[[loss]]\nname = 'ntxent'\nid = 'x'\n",
                       "two runs are named 'vsepp_x_s0'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_grid_one_line_nothing_written(tmp_path, world, case):
    top, tables, message = BAD[case]
    if "[[loss]]" not in tables:
        tables += "[[loss]]\nname = 'triplet'\n"
    text = (f'name = "bad"\n{top}data = "{world / "data"}"\nreports = "{tmp_path}/r"\n'
            f'checkpoints = "{tmp_path}/c"\n{tables}')
    (tmp_path / "g.toml").write_text(text)
    before = snapshot(tmp_path)
    line = one_error_line(runner.invoke(app, ["sweep", str(tmp_path / "g.toml")]))
    assert message in line
    assert snapshot(tmp_path) == before


def test_unwritable_output_and_missing_submitit(tmp_path, world, monkeypatch):
    import os
    import sys

    grid = write_grid(tmp_path / "g", world / "data")
    (tmp_path / "g" / "reports").write_text("a file, not a folder")
    line = one_error_line(runner.invoke(app, ["sweep", str(grid)]))
    assert "reports" in line
    (tmp_path / "g" / "reports").unlink()
    if os.geteuid() != 0:
        os.chmod(tmp_path / "g", 0o500)
        try:
            assert "cannot write" in one_error_line(runner.invoke(app, ["sweep", str(grid)]))
        finally:
            os.chmod(tmp_path / "g", 0o700)
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit fails as when it is not installed
    before = snapshot(tmp_path)
    line = one_error_line(runner.invoke(app, ["sweep", str(grid), "--executor", "slurm"]))
    assert "pip install 'cocos[slurm]'" in line
    assert snapshot(tmp_path) == before


def test_paper_grid_expands_to_the_papers_runs():
    from pathlib import Path

    from cocos.pipelines.sweep import load_grid

    grid = load_grid(Path(__file__).parent.parent / "examples" / "cocos_paper_grid.toml")
    assert len(grid.runs) == 2 * 4 * 5
    epochs = {r.train["loss"]: (r.train["epochs"], r.train["lr_update"]) for r in grid.runs}
    assert epochs == {"triplet": (30, 15), "triplet_sh": (30, 15), "ntxent": (30, 15), "smoothap": (150, 75)}
    assert len({r.name for r in grid.runs}) == 40
    demo = load_grid(Path(__file__).parent.parent / "examples" / "demo_grid.toml")
    assert len(demo.runs) == 6


def test_dry_run_writes_nothing(tmp_path, world):
    grid = write_grid(tmp_path / "d", world / "data")
    before = snapshot(tmp_path)
    res = runner.invoke(app, ["sweep", str(grid), "--dry-run", "--executor", "slurm", "--partition", "gpu"])
    assert res.exit_code == 0, res.output
    assert res.output.count("cocos train ") == 4 and "slurm_partition': 'gpu'" in res.output
    assert snapshot(tmp_path) == before
