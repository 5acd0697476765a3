"""Model families as plugins, and checkpoints that stand alone (issue 29).

A model family in a separate package (a linear map of precomputed features and a bag-of-words caption encoder,
``cocos_linbow``) registers through the ``cocos.models`` entry-point group (a ``.dist-info`` folder on the path, as
``pip install`` leaves it) and is trained, evaluated, analysed and reported with no edit to cocos. A checkpoint
trained with a loss plugin is evaluated and analysed, with the same numbers, once the plugin is gone; only
``--resume`` needs it. A plugin that takes a built-in's name is refused in one line naming its package. The commands
with a plugin run in fresh processes (forked from the tests' preloaded interpreter, :mod:`tests.preloaded`; the
commands of one test one after another in one, :func:`cocos_several`), so nothing of the test process's registries
leaks into them; a command without a plugin may run in the test process, whose registries never have one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cocos.data.synth import make_synthetic
from cocos.data.text import tokenize
from tests import preloaded
from tests.helpers import empty_figures

MODEL_PLUGIN = '''
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from cocos.data.text import SPECIALS, Vocabulary
from cocos.errors import CocosError
from cocos.models.family import ModelFamily, Source


class LinBow(nn.Module):
    """Images: a linear map of the features; captions: the mean (or sum) of pre-trained word vectors, mapped to the
    joint space; both l2-normalised."""

    kind = "linbow"

    def __init__(self, img_dim, vocab_size, vectors_dim, embed_size=24, pool="mean"):
        super().__init__()
        self.hparams = {"img_dim": int(img_dim), "vocab_size": int(vocab_size), "vectors_dim": int(vectors_dim),
                        "embed_size": int(embed_size), "pool": pool}
        self.fc = nn.Linear(img_dim, embed_size)
        self.words = nn.Embedding(vocab_size, vectors_dim, padding_idx=0)
        self.proj = nn.Linear(vectors_dim, embed_size)
        self.pool = pool

    def encode_images(self, features):
        if features.dim() == 3:
            features = features.mean(dim=1)
        return nn.functional.normalize(self.fc(features), dim=-1)

    def encode_captions(self, tokens, lengths):
        summed = self.words(tokens).sum(dim=1)
        if self.pool == "mean":
            summed = summed / torch.as_tensor(lengths, dtype=summed.dtype, device=summed.device).unsqueeze(1)
        return nn.functional.normalize(self.proj(summed), dim=-1)

    def forward(self, features, tokens, lengths):
        return self.encode_images(features), self.encode_captions(tokens, lengths)


@dataclass
class Vectors:
    """A word-vectors file opened: its path, the vocabulary of its words (the caption coder) and their vectors."""

    path: str
    coder: Vocabulary
    weights: torch.Tensor


def read_vectors(path):
    """GloVe's text format: a word and its numbers on each line, every line as long; the special tokens get zeros."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CocosError(f"{path}: cannot read the word vectors ({exc})") from None
    words, rows = [], []
    for number, line in enumerate(lines, start=1):
        word, *values = line.split()
        try:
            rows.append([float(v) for v in values])
        except ValueError:
            raise CocosError(f"{path}: line {number}: the numbers of '{word}' are not numbers") from None
        words.append(word)
    if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
        raise CocosError(f"{path}: not a word-vectors file (a word and as many numbers on every line)")
    weights = torch.cat([torch.zeros(len(SPECIALS), len(rows[0])), torch.tensor(rows)])
    return Vectors(str(path), Vocabulary([*SPECIALS, *words]), weights)


def check(params):
    if params["pool"] not in ("mean", "sum"):
        raise ValueError("pool is mean or sum")


VECTORS = Source(name="vectors", what="a word-vectors text file (GloVe's format: a word and its numbers per line)",
                 read=read_vectors, records=lambda v: {"vectors_dim": int(v.weights.shape[1])},
                 recorded=("vectors_dim",), load=lambda model, v: model.words.weight.data.copy_(v.weights),
                 coder_words="the words of its vectors file", metavar="FILE")
family = ModelFamily(name="linbow", label="LinBoW", module=LinBow, input="features", check=check,
                     defaults={"embed_size": 24, "pool": "mean"}, sources=(VECTORS,),
                     description="a linear map and a bag of pre-trained word vectors")
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


# The figures of `cocos analyze`, `cocos report` and `cocos sweep` written as empty files in these processes (matplotlib's own
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
    prelude = NO_DRAWING if args[0] in ("analyze", "report", "sweep") else ""
    return preloaded.run([sys.executable, "-c", prelude + "from cocos_cli.main import run; run()", *args], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=600)


SEVERAL = NO_DRAWING + """
import json, sys
from cocos_cli.main import app
for args in json.loads(sys.argv[1]):
    try:
        app(args)
    except SystemExit as exc:
        print(f"@@ exit {exc.code or 0}", flush=True)
"""


def cocos_several(commands, cwd: Path, path: Path | None = None) -> list[str]:
    """Several commands one after another in one fresh process (one start, one import of torch), with ``path`` as
    its PYTHONPATH and figures written as empty files (:data:`NO_DRAWING`); each must succeed: their stdouts."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COCOS_PLUGINS")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    res = preloaded.run([sys.executable, "-c", SEVERAL, json.dumps(commands)], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)
    parts = res.stdout.split("@@ exit ")
    assert len(parts) == len(commands) + 1, (res.stdout, res.stderr)
    codes = [int(p.split("\n", 1)[0]) for p in parts[1:]]
    assert codes == [0] * len(commands), (codes, res.stdout, res.stderr)
    return [parts[0], *(p.split("\n", 1)[1] for p in parts[1:-1])]


TRAIN = ["--epochs", "2", "--lr", "5e-3", "--batch-size", "24", "--seed", "0", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    data = make_synthetic(root / "data", n_train=48, n_dev=20, n_test=20, feature_dim=16, seed=3)
    models = _package(root / "models", "cocos_linbow", MODEL_PLUGIN, "[cocos.models]\nlinbow = cocos_linbow:family\n")
    losses = _package(root / "losses", "cocos_sqhinge", LOSS_PLUGIN, "[cocos.losses]\nsqhinge = cocos_sqhinge:objective\n")
    # the plugin family's pre-trained source: a vector for each training word, and one for a word no caption has
    words = sorted({w for line in (data / "train_caps.txt").read_text().splitlines() for w in tokenize(line)})
    rng = np.random.default_rng(5)
    vectors = {w: rng.standard_normal(6).round(4) for w in [*words, "zzzunused"]}
    (root / "vectors.txt").write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items()))
    return root, data, models, losses, vectors


@pytest.fixture
def in_process(world):
    """The plugin family registered in this process (imported from its package's folder), for the checks that are
    not about a fresh process: `cocos models`, `cocos evaluate`, refusals."""
    import importlib.util

    from typer.testing import CliRunner

    from cocos.models.registry import register, unregister
    from cocos_cli.main import app

    spec = importlib.util.spec_from_file_location("cocos_linbow", world[2] / "cocos_linbow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register(module.family)
    try:
        yield lambda args: CliRunner().invoke(app, args)
    finally:
        unregister("linbow")


def _saved(path: Path) -> dict:
    """A checkpoint of the plugin's model, read without it (this process has no plugin registered): tensors and
    plain data only, nothing run."""
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
def test_a_model_family_plugin_with_its_own_source_trains_resumes_analyses_sweeps_and_reports(world, in_process):
    """Issue 38's proof: a family in a separate package with a pre-trained source of its own (a word-vectors file
    that gives the caption coder and the word embeddings' start) through every command, in a fresh process, with
    nothing of cocos/training or cli/ naming it."""
    root, data, models, _, vectors = world
    work = root / "model"
    work.mkdir()
    listed = in_process(["models"])
    assert listed.exit_code == 0 and "linbow" in listed.output and "pool=mean" in listed.output, listed.output
    source = str(root / "vectors.txt")
    common = ["--data", str(data), "--model", "linbow", "--pool", "sum", "--embed-size", "12", "--loss",
              "triplet_sh", *TRAIN]
    grid = work / "grid.toml"
    grid.write_text(f'name = "bow"\ndata = "{data}"\nmodels = ["linbow"]\nseeds = [0]\ncheckpoints = "{work / "ck"}"\n'
                    f'reports = "{work / "sw"}"\n[train]\nepochs = 1\nbatch_size = 24\nlr = 5e-3\nembed_size = 12\n'
                    f'vectors = "{source}"\ndevice = "cpu"\n[[loss]]\nname = "triplet_sh"\n[[loss]]\nname = "ntxent"\n')
    # every command with the plugin in one fresh process where it is installed only through its entry point (each
    # must succeed): the run; the same run stopped after one epoch (the source under --source) and resumed; the
    # analysis and report of the run; a sweep of it, its source under its own name in [train]. Each train seeds
    # itself: the runs are bit for bit those of three processes (checked when these were merged)
    *_, swept = cocos_several([
        ["train", *common, "--vectors", source, "--out", str(work / "run")],
        ["train", *common, "--source", f"vectors={source}", "--epochs", "1", "--out", str(work / "half")],
        ["train", *common, "--vectors", source, "--resume", "--out", str(work / "half")],
        ["analyze", str(work / "run" / "model_best.pt"), "--out", str(work / "rep"), "--no-progress"],
        ["report", str(work / "rep"), "--out", str(work / "again")],
        ["sweep", str(grid), "--no-progress"]], work, path=models)
    # the run resumed after one epoch equals the run of two, bit for bit
    whole, again = _saved(work / "run" / "last.pt")["state_dict"], _saved(work / "half" / "last.pt")["state_dict"]
    assert whole.keys() == again.keys() and all(torch.equal(whole[k], again[k]) for k in whole)
    # the word embeddings started from the file: a word no caption has gets no gradient and keeps its vector
    ckpt = _saved(work / "run" / "model_best.pt")
    unused = ckpt["vocab"].index("zzzunused")
    assert torch.equal(ckpt["state_dict"]["words.weight"][unused], torch.tensor(vectors["zzzunused"],
                                                                                 dtype=torch.float32))
    assert ckpt["train"]["model"]["sources"] == {"vectors": source} and ckpt["model"]["hparams"]["vectors_dim"] == 6
    evaluated = in_process(["evaluate", str(work / "run" / "model_best.pt"), "--json", str(work / "m.json"),
                            "--no-progress"])
    assert evaluated.exit_code == 0, evaluated.output
    results = json.loads((work / "rep" / "results.json").read_text())
    # the family's own hyper-parameters, from its flags, and its source's record rebuilt the model
    assert results["model"]["kind"] == "linbow" and results["model"]["label"] == "LinBoW"
    assert results["model"]["hparams"] == {"img_dim": 16, "vocab_size": len(vectors) + 4, "vectors_dim": 6,
                                           "embed_size": 12, "pool": "sum"}
    # two independent computations of the test metrics: cocos evaluate, and the analysis's evaluation
    metrics = json.loads((work / "m.json").read_text())
    assert results["evaluation"]["metrics"]["rsum"] == pytest.approx(metrics["rsum"], abs=1e-9)
    assert {r["loss"] for r in results["statistics"]} >= {"triplet", "triplet_sh", "ntxent", "smoothap"}
    assert "LinBoW" in (work / "again" / "tables.md").read_text()
    # the sweep
    assert "2 of 2 runs ok" in swept and (work / "sw" / "bow" / "summary" / "tables.md").is_file()
    swept_results = json.loads((work / "sw" / "bow" / "linbow_ntxent_s0" / "results.json").read_text())
    assert swept_results["model"]["hparams"]["vectors_dim"] == 6
    # a bad value of the family's own hyper-parameter is its own check, a missing source one line: nothing trained
    bad = in_process(["train", "--data", str(data), "--model", "linbow", "--out", str(work / "bad"), "--pool", "max",
                      "--vectors", source, *TRAIN])
    assert bad.exit_code == 2 and bad.output.strip() == "error: model 'linbow': pool is mean or sum"
    bare = in_process(["train", "--data", str(data), "--model", "linbow", "--out", str(work / "bad"), *TRAIN])
    assert bare.exit_code == 2 and bare.output.strip().startswith(
        "error: --model linbow needs --vectors FILE (or --source vectors=FILE): a word-vectors")
    assert not (work / "bad").exists()


@pytest.mark.slow
def test_a_checkpoint_of_a_loss_plugin_is_evaluated_and_analysed_after_the_plugin_is_gone(world, monkeypatch):
    root, data, _, losses, _ = world
    work = root / "loss"
    work.mkdir()
    best = str(work / "run" / "model_best.pt")
    # with the plugin: trained, evaluated and analysed in one fresh process where it is installed (its entry point)
    cocos_several([["train", "--data", str(data), "--loss", "sqhinge", "--out", str(work / "run"), "--embed-size",
                    "16", "--word-dim", "8", *TRAIN],
                   ["evaluate", best, "--json", str(work / "with.json"), "--no-progress"],
                   ["analyze", best, "--out", str(work / "with"), "--no-progress"]], work, path=losses)
    # without it: in this process, which never had the plugin's folder on its path (checked first, and after)
    from typer.testing import CliRunner

    from cocos import objectives
    from cocos_cli.main import app

    assert "sqhinge" not in objectives.names()
    empty_figures(monkeypatch)  # as in the plugin's process: the tables are compared
    monkeypatch.chdir(work)
    ev = CliRunner().invoke(app, ["evaluate", best, "--json", str(work / "without.json"), "--no-progress"])
    an = CliRunner().invoke(app, ["analyze", best, "--out", str(work / "without"), "--no-progress"])
    assert ev.exit_code == 0 and an.exit_code == 0, (ev.output, an.output)
    runs = {name: (json.loads((work / f"{name}.json").read_text()),
                   json.loads((work / name / "results.json").read_text())) for name in ("with", "without")}
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
    res = CliRunner().invoke(app, ["train", "--data", str(data), "--loss", "sqhinge", "--out", str(work / "run"),
                                   "--resume", "--epochs", "3"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (res.stdout, res.stderr)
    assert "--resume needs the loss 'sqhinge'" in res.stderr and "install the plugin" in res.stderr
    assert "sqhinge" not in objectives.names()


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
