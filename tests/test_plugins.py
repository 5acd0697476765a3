"""Loss plugins: one module in a separate package reaches every command (issue 17).

The plugin is a module ``cocos_sqhinge`` written to a temporary folder, found either through an
entry point of the ``cocos.losses`` group (a ``.dist-info`` folder on the path, as ``pip install``
leaves it) or through ``COCOS_PLUGINS``. Each command with the plugin runs in a fresh process (forked from the tests'
preloaded interpreter, :mod:`tests.preloaded`, which imports no cocos), so nothing of the test process's registry
leaks into it; a command without it may run in the test process, whose registry never has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cocos.data.synth import make_synthetic
from tests import preloaded
from tests.helpers import empty_figures

PLUGIN = '''
from cocos.losses.functional import triplet_hinge
from cocos.objectives import Objective


def squared_hinge(view, margin=0.1):
    """One direction: the squared hinge of every (positive, negative) pair."""
    return triplet_hinge(view, margin).clamp(min=0).pow(2).sum()


objective = Objective(name="sqhinge", label="Squared hinge", direction_loss=squared_hinge,
                      defaults={"margin": 0.1}, color="#9467bd", stats=("C_q", "C_B", "C_0"))
'''


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The plugin's folder (holding the module and an installed-package entry point) and embeddings to count."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "cocos_sqhinge.py").write_text(PLUGIN)
    info = root / "cocos_sqhinge-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cocos-sqhinge\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[cocos.losses]\nsqhinge = cocos_sqhinge:objective\n")
    rng = np.random.default_rng(0)
    np.savez(root / "emb.npz", images=rng.normal(size=(32, 8)).astype(np.float32),
             captions=rng.normal(size=(160, 8)).astype(np.float32))
    return root


def cocos(args, cwd: Path, path: Path | None = None, plugins: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COCOS_PLUGINS")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    if plugins is not None:
        env["COCOS_PLUGINS"] = plugins
    return preloaded.run([sys.executable, "-c", "from cocos_cli.main import run; run()", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=300)


SEVERAL = """
import json, sys
from matplotlib.figure import Figure
from cocos_cli.main import app
def savefig(self, fname, *args, **kwargs):  # figures as empty files: the tests read tables (drawing is tested in
    if hasattr(fname, "write"):             # tests/test_report_figures.py)
        fname.write(b"")
    else:
        open(fname, "wb").close()
Figure.savefig = savefig
for args in json.loads(sys.argv[1]):
    try:
        app(args)
    except SystemExit as exc:
        print(f"@@ exit {exc.code or 0}", flush=True)
"""


def cocos_several(commands, cwd: Path, path: Path | None = None) -> list[tuple[int, str]]:
    """Several commands one after another in one fresh process (one process start), figures written as empty files:
    ``[(exit code, stdout)]``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COCOS_PLUGINS")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    res = preloaded.run([sys.executable, "-c", SEVERAL, json.dumps(commands)], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)
    parts = res.stdout.split("@@ exit ")
    assert len(parts) == len(commands) + 1, (res.stdout, res.stderr)
    codes = [int(p.split("\n", 1)[0]) for p in parts[1:]]
    outputs = [parts[0], *(p.split("\n", 1)[1] for p in parts[1:-1])]
    assert codes == [0] * len(commands), (codes, res.stderr)
    return list(zip(codes, outputs, strict=True))


@pytest.mark.slow
def test_an_entry_point_plugin_is_listed_counted_and_reported_without_being_installed(plugin, tmp_path, monkeypatch):
    # one process with the plugin on the path (listed, counted, reported), one without it (reported)
    (_, listed), _, _ = cocos_several(
        [["losses"], ["count", str(plugin / "emb.npz"), "--loss", "sqhinge", "--loss", "triplet", "--batch-size",
                      "16", "--out", str(tmp_path / "with"), "--no-progress"],
         ["report", str(tmp_path / "with"), "--out", str(tmp_path / "plugged" / "report")]], tmp_path, path=plugin)
    assert "sqhinge" in listed and "Squared hinge" in listed
    results = json.loads((tmp_path / "with" / "results.json").read_text())
    assert results["presentation"]["sqhinge"]["label"] == "Squared hinge"
    assert {r["direction"] for r in results["statistics"] if r["loss"] == "sqhinge"} == {"i2t", "t2i"}
    # the same report without the plugin: identical tables. In this process, which never had the plugin's folder
    # on its path (no fresh process to start: the plugin is absent from this one's registry, checked first)
    from typer.testing import CliRunner

    from cocos import objectives
    from cocos_cli.main import app

    assert "sqhinge" not in objectives.names()
    empty_figures(monkeypatch)  # as in the plugin's process: the tables are compared
    rendered = CliRunner().invoke(app, ["report", str(tmp_path / "with"), "--out",
                                          str(tmp_path / "without" / "report")])  # the same name: the same labels
    assert rendered.exit_code == 0, rendered.output
    assert "sqhinge" not in objectives.names()
    for name in ("tables.md", "tables.tex"):
        assert (tmp_path / "without" / "report" / name).read_text() == \
            (tmp_path / "plugged" / "report" / name).read_text()
    assert "Squared hinge" in (tmp_path / "without" / "report" / "tables.md").read_text()


def test_cocos_plugins_names_a_module_on_the_path(plugin, tmp_path):
    # the module alone (no dist-info): copy it elsewhere so that the entry point is not found
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "cocos_sqhinge.py").write_text(PLUGIN)
    without = cocos(["losses"], tmp_path, path=tmp_path / "mods")
    assert "sqhinge" not in without.stdout
    listed = cocos(["losses"], tmp_path, path=tmp_path / "mods", plugins="cocos_sqhinge")
    assert listed.returncode == 0 and "sqhinge" in listed.stdout, listed.stderr


def test_a_broken_plugin_is_one_error_line_naming_it(tmp_path):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('oops')\n")
    res = cocos(["losses"], tmp_path, path=tmp_path, plugins="broken_plugin")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: loss plugin module broken_plugin (COCOS_PLUGINS) failed to "
                                               "load: oops"]


@pytest.mark.parametrize("raises, words", [
    ("raise SystemExit(0)", "called sys.exit(0) while it was imported"),
    ("import sys; sys.exit('bye')", "called sys.exit('bye') while it was imported"),
    ("raise KeyboardInterrupt", "raised KeyboardInterrupt while it was imported"),
])
def test_a_plugin_that_exits_on_import_stops_the_command_naming_its_package(tmp_path, raises, words):
    """A model plugin whose import exits (``sys.exit(0)``) or raises KeyboardInterrupt: before, ``cocos train
    --model vsepp`` exited 0 having done nothing; now one error line naming the entry point and its package, exit 2,
    and no run folder."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "cocos_quitter.py").write_text(f"{raises}\n")
    info = root / "cocos_quitter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cocos-quitter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[cocos.models]\nquitter = cocos_quitter:family\n")
    data = make_synthetic(tmp_path / "data", n_train=40, n_dev=10, n_test=10, seed=0)
    res = cocos(["train", "--model", "vsepp", "--data", str(data), "--out", str(tmp_path / "run"), "--epochs", "1",
                 "--no-progress"], tmp_path, path=root)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model plugin quitter (cocos_quitter:family) of package "
                                                   "cocos-quitter ") and words in lines[0], lines
    assert not (tmp_path / "run").exists()
