"""Model families as plugins, and checkpoints that stand alone (issue 29).

A model family in a separate package (a linear map of precomputed features and a bag-of-words caption encoder,
``cocos_linbow``) registers through the ``cocos.models`` entry-point group (a ``.dist-info`` folder on the path, as
``pip install`` leaves it) and is trained, evaluated, analysed and reported with no edit to cocos. A checkpoint
trained with a loss plugin is evaluated and analysed, with the same numbers, once the plugin is gone; only
``--resume`` needs it. A plugin that takes a built-in's name is refused in one line naming its package. Each command
runs in a fresh process, so nothing of the test process's registries leaks into it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cocos.data.synth import make_synthetic

MODEL_PLUGIN = '''
import torch
from torch import nn

from cocos.models.family import ModelFamily


class LinBow(nn.Module):
    """Images: a linear map of the features; captions: the mean (or sum) of word embeddings; both l2-normalised."""

    kind = "linbow"

    def __init__(self, img_dim, vocab_size, embed_size=24, pool="mean"):
        super().__init__()
        self.hparams = {"img_dim": int(img_dim), "vocab_size": int(vocab_size), "embed_size": int(embed_size),
                        "pool": pool}
        self.fc = nn.Linear(img_dim, embed_size)
        self.words = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.pool = pool

    def encode_images(self, features):
        if features.dim() == 3:
            features = features.mean(dim=1)
        return nn.functional.normalize(self.fc(features), dim=-1)

    def encode_captions(self, tokens, lengths):
        summed = self.words(tokens).sum(dim=1)
        if self.pool == "mean":
            summed = summed / torch.as_tensor(lengths, dtype=summed.dtype, device=summed.device).unsqueeze(1)
        return nn.functional.normalize(summed, dim=-1)

    def forward(self, features, tokens, lengths):
        return self.encode_images(features), self.encode_captions(tokens, lengths)


def check(params):
    if params["pool"] not in ("mean", "sum"):
        raise ValueError("pool is mean or sum")


family = ModelFamily(name="linbow", label="LinBoW", module=LinBow, input="features", check=check,
                     defaults={"embed_size": 24, "pool": "mean"}, description="a linear map and a bag of words")
clash = ModelFamily(name="vsepp", label="Not VSE++", module=LinBow, description="takes a built-in's name")
'''

LOSS_PLUGIN = '''
from cocos.losses.functional import triplet_hinge
from cocos.objectives import Objective


def squared_hinge(view, margin=0.1):
    return triplet_hinge(view, margin).clamp(min=0).pow(2).sum()


objective = Objective(name="sqhinge", label="Squared hinge", direction_loss=squared_hinge,
                      defaults={"margin": 0.1}, color="#9467bd")
'''


def _package(root: Path, module: str, source: str, entry_points: str) -> Path:
    """A package as ``pip install`` leaves it: the module and a ``.dist-info`` with its entry points."""
    root.mkdir(parents=True)
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


# The figures of `cocos analyze` and `cocos report` written as empty files in these processes (matplotlib's own
# savefig replaced before the command starts; about 1 s a figure): the tests read results.json and tables.md, the
# drawing is tests/test_report_figures.py's. Nothing of cocos or its registries is touched.
NO_DRAWING = """
from pathlib import Path
from matplotlib.figure import Figure
def savefig(self, fname, *args, **kwargs):
    fname.write(b"") if hasattr(fname, "write") else Path(fname).write_bytes(b"")
Figure.savefig = savefig
"""


def cocos(args, cwd: Path, path: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COCOS_PLUGINS")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    prelude = NO_DRAWING if args[0] in ("analyze", "report") else ""
    return subprocess.run([sys.executable, "-c", prelude + "from cocos_cli.main import run; run()", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


TRAIN = ["--epochs", "2", "--lr", "5e-3", "--batch-size", "24", "--seed", "0", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    data = make_synthetic(root / "data", n_train=48, n_dev=20, n_test=20, feature_dim=16, seed=3)
    models = _package(root / "models", "cocos_linbow", MODEL_PLUGIN, "[cocos.models]\nlinbow = cocos_linbow:family\n")
    losses = _package(root / "losses", "cocos_sqhinge", LOSS_PLUGIN, "[cocos.losses]\nsqhinge = cocos_sqhinge:objective\n")
    return root, data, models, losses


@pytest.mark.slow
def test_a_model_family_plugin_is_trained_evaluated_analysed_and_reported(world):
    root, data, models, _ = world
    work = root / "model"
    work.mkdir()
    listed = cocos(["models"], work, path=models)
    assert listed.returncode == 0 and "linbow" in listed.stdout and "pool=mean" in listed.stdout, listed.stderr
    trained = cocos(["train", "--data", str(data), "--model", "linbow", "--pool", "sum", "--embed-size", "12",
                     "--loss", "triplet_sh", "--out", str(work / "run"), *TRAIN], work, path=models)
    assert trained.returncode == 0, trained.stderr
    evaluated = cocos(["evaluate", str(work / "run" / "model_best.pt"), "--json", str(work / "m.json"),
                       "--no-progress"], work, path=models)
    assert evaluated.returncode == 0, evaluated.stderr
    analysed = cocos(["analyze", str(work / "run" / "model_best.pt"), "--out", str(work / "rep"), "--no-progress"],
                     work, path=models)
    assert analysed.returncode == 0, analysed.stderr
    reported = cocos(["report", str(work / "rep"), "--out", str(work / "again")], work, path=models)
    assert reported.returncode == 0, reported.stderr
    results = json.loads((work / "rep" / "results.json").read_text())
    # the family's own hyper-parameters, from its flags, rebuilt the model the checkpoint holds
    assert results["model"]["kind"] == "linbow" and results["model"]["label"] == "LinBoW"
    assert results["model"]["hparams"] == {"img_dim": 16, "vocab_size": results["model"]["hparams"]["vocab_size"],
                                           "embed_size": 12, "pool": "sum"}
    # two independent computations of the test metrics: cocos evaluate, and the analysis's evaluation
    metrics = json.loads((work / "m.json").read_text())
    assert results["evaluation"]["metrics"]["rsum"] == pytest.approx(metrics["rsum"], abs=1e-9)
    assert {r["loss"] for r in results["statistics"]} >= {"triplet", "triplet_sh", "ntxent", "smoothap"}
    assert "LinBoW" in (work / "again" / "tables.md").read_text()
    # a bad value of the family's own hyper-parameter is its own check: one line, nothing trained
    bad = cocos(["train", "--data", str(data), "--model", "linbow", "--out", str(work / "bad"), "--pool", "max",
                 *TRAIN], work, path=models)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: model 'linbow': pool is mean or sum"
    assert not (work / "bad").exists()


@pytest.mark.slow
def test_a_checkpoint_of_a_loss_plugin_is_evaluated_and_analysed_after_the_plugin_is_gone(world):
    root, data, _, losses = world
    work = root / "loss"
    work.mkdir()
    trained = cocos(["train", "--data", str(data), "--loss", "sqhinge", "--out", str(work / "run"),
                     "--embed-size", "16", "--word-dim", "8", *TRAIN], work, path=losses)
    assert trained.returncode == 0, trained.stderr
    best = str(work / "run" / "model_best.pt")
    runs = {}
    for name, path in (("with", losses), ("without", None)):
        ev = cocos(["evaluate", best, "--json", str(work / f"{name}.json"), "--no-progress"], work, path=path)
        an = cocos(["analyze", best, "--out", str(work / name), "--no-progress"], work, path=path)
        assert ev.returncode == 0 and an.returncode == 0, (ev.stderr, an.stderr)
        runs[name] = (json.loads((work / f"{name}.json").read_text()),
                      json.loads((work / name / "results.json").read_text()))
    (metrics_with, results_with), (metrics_without, results_without) = runs["with"], runs["without"]
    assert metrics_with == metrics_without
    assert results_with["evaluation"] == results_without["evaluation"]
    paper = {"triplet", "triplet_sh", "ntxent", "smoothap"}
    assert [r for r in results_with["statistics"] if r["loss"] in paper] == \
        [r for r in results_without["statistics"] if r["loss"] in paper]
    # the training loss shown from the checkpoint: the plugin's own presentation
    assert results_without["training"]["loss"] == "sqhinge"
    assert results_without["presentation"]["sqhinge"] == results_with["presentation"]["sqhinge"]
    assert results_without["presentation"]["sqhinge"]["label"] == "Squared hinge"
    assert "Squared hinge" in (work / "without" / "tables.md").read_text()
    # only --resume needs the plugin, and says so in one line
    res = cocos(["train", "--data", str(data), "--loss", "sqhinge", "--out", str(work / "run"), "--resume",
                 "--epochs", "3"], work)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--resume needs the loss 'sqhinge'" in res.stderr and "install the plugin" in res.stderr


def test_a_plugin_taking_a_built_in_name_is_refused_in_one_line_naming_its_package(tmp_path):
    _package(tmp_path / "p", "cocos_clash", MODEL_PLUGIN.replace("family = ModelFamily", "other = ModelFamily"),
             "[cocos.models]\nvsepp = cocos_clash:clash\n")
    res = cocos(["models"], tmp_path, path=tmp_path / "p")
    assert res.returncode == 0, res.stderr
    assert re.search(r"^vsepp +VSE\+\+:", res.stdout, re.M) and "Not VSE++" not in res.stdout
    warning = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("warning: model plugin vsepp (cocos_clash:clash) of package "
                                                       "cocos-clash: refused"), res.stderr


def test_a_loss_plugin_taking_a_built_in_name_is_refused_the_same_way(tmp_path):
    """One mechanism for both registries (cocos.plugins): a loss plugin named like a built-in is refused with one
    warning line naming its package, and the built-in stays what it was."""
    clash = LOSS_PLUGIN.replace('name="sqhinge", label="Squared hinge"', 'name="triplet", label="Not Triplet"')
    _package(tmp_path / "p", "cocos_trip", clash, "[cocos.losses]\ntriplet = cocos_trip:objective\n")
    res = cocos(["losses"], tmp_path, path=tmp_path / "p")
    assert res.returncode == 0, res.stderr
    assert "Not Triplet" not in res.stdout and "triplet     Triplet loss:" in res.stdout
    warning = [line for line in res.stderr.splitlines() if line.strip()]
    assert warning == ["warning: loss plugin triplet (cocos_trip:objective) of package cocos-trip: refused, its name "
                       "'triplet' is a built-in loss family's"], res.stderr
