"""Several processes (torchrun, Gloo on CPU), one result: the same numbers as one process."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cocos.distributed import Dist, block
from tests import preloaded

TORCHRUN = shutil.which("torchrun")
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")


@given(n=st.integers(0, 200), world=st.integers(1, 9))
def test_blocks_tile_the_plan_in_order(n, world):
    blocks = [block(n, Dist(rank, world)) for rank in range(world)]
    assert [i for b in blocks for i in b] == list(range(n))
    assert max(len(b) for b in blocks) - min(len(b) for b in blocks) <= 1


def _here(args: list[str], cwd: Path):
    """One process: the same command in this process (one thread, as the torchrun ranks), from ``cwd``.

    In place of a ``cocos`` subprocess: the one-process reference needs no process start of its own. Its figures are
    empty files, as the launch's (:data:`SEVERAL`): the tests compare numbers, not drawings."""
    from typer.testing import CliRunner

    from cocos_cli.main import app
    from tests.helpers import figures_empty

    before = Path.cwd()
    os.chdir(cwd)
    try:
        with figures_empty():
            return CliRunner().invoke(app, args)
    finally:
        os.chdir(before)


def _close(a, b, path=""):
    """Equal structures; numbers to 1e-6 (relative), NaN equal to NaN."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            assert a is b, path
        elif math.isnan(a):
            assert math.isnan(b), path
        else:
            assert abs(a - b) <= 1e-6 * max(1.0, abs(a)), (path, a, b)
    else:
        assert a == b, (path, a, b)


def _global_batch_worker(rank: int, world: int, store: str, out: str) -> None:
    """Each rank embeds its block of a 7-row batch; the loss sees the gathered global batch."""
    import torch
    import torch.distributed as dist

    from cocos.distributed import Dist, all_gather_with_grad, average_gradients, block

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x = torch.randn(7, 5)
    group = Dist(rank, world)
    rows = block(7, group)
    z = all_gather_with_grad(model(x[rows.start:rows.stop]), group)
    loss = (z.softmax(0) * torch.arange(21.0).view(7, 3)).sum() + z.pow(2).mean()
    loss.backward()
    average_gradients(model.parameters(), group)
    if rank == 0:
        torch.save({"loss": loss.detach(), "w": model.weight.grad, "b": model.bias.grad}, out)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@needs_torchrun
def test_global_batch_gradient_on_two_processes_equals_one(run, two):
    import torch

    # the two ranks of the launch of :func:`two` ran _global_batch_worker (the "global_batch" entry of COMMANDS)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x = torch.randn(7, 5)
    z = model(x)
    loss = (z.softmax(0) * torch.arange(21.0).view(7, 3)).sum() + z.pow(2).mean()
    loss.backward()
    two = torch.load(run / "global_batch.pt", weights_only=True)
    assert torch.allclose(two["loss"], loss.detach(), atol=1e-6)
    assert torch.allclose(two["w"], model.weight.grad, atol=1e-6)  # uneven blocks (3 + 4 rows) included
    assert torch.allclose(two["b"], model.bias.grad, atol=1e-6)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny data folder and a one-epoch checkpoint, trained in this process; embeddings to count; a VSRN data
    folder (region features)."""
    from cocos.data.synth import make_synthetic
    from cocos.training.trainer import TrainConfig, Trainer

    root = tmp_path_factory.mktemp("dist")
    data = make_synthetic(root / "data", n_train=90, n_dev=20, n_test=20, feature_dim=16, seed=5)
    Trainer(TrainConfig.of(data=str(data), out=str(root / "ck"), loss="triplet_sh", epochs=1, lr=5e-3, batch_size=32,
                        embed_size=16, word_dim=8, device="cpu"), progress=False, log=lambda *a: None).fit()
    rng = np.random.default_rng(0)
    images = rng.normal(size=(150, 8)).astype(np.float32)
    captions = np.repeat(images, 5, axis=0) + rng.normal(size=(750, 8)).astype(np.float32)
    np.savez(root / "e.npz", images=images, captions=captions)
    make_synthetic(root / "vdata", n_train=41, n_dev=12, n_test=12, feature_dim=8, regions=True, seed=1)
    if importlib.util.find_spec("transformers") is not None:  # a tiny CLIP folder and raw images for it
        from cocos.data.synth_images import make_synthetic_images
        from tests.helpers import make_clip_folder

        make_clip_folder(root / "clip")
        make_synthetic_images(root / "imgs", n_train=12, n_dev=4, n_test=4, image_size=40, seed=2, progress=False)
    return root


COUNT = ["count", "e.npz", "--batch-size", "16", "--no-progress", "--loss", "all"]
ANALYZE = ["analyze", "ck/model_best.pt", "--no-progress", "--overwrite"]
TRAIN = ["train", "--data", "data", "--loss", "triplet_sh", "--epochs", "1", "--lr", "5e-3", "--batch-size", "30",
         "--embed-size", "16", "--word-dim", "8", "--device", "cpu", "--no-progress", "--track-cocos", "2"]
# CLIP on raw images, its temperature learned: global batches of 8 captions, 4 rows per rank
CLIP = ["train", "--model", "clip", "--clip", "clip", "--data", "imgs", "--loss", "ntxent", "--epochs", "1",
        "--batch-size", "8", "--lr", "1e-3", "--device", "cpu", "--no-progress", "--track-cocos", "1"]
VSRN = ["train", "--data", "vdata", "--model", "vsrn", "--epochs", "1", "--batch-size", "7", "--embed-size", "8",
        "--word-dim", "8", "--lr", "1e-2", "--device", "cpu", "--no-progress", "--out", "v"]
# Every command on two processes in one torchrun launch (each command joins the group and leaves it, as in its own
# launch): one launcher and two interpreters to start instead of one set per command. Markers on rank 0's stdout
# split it per command; whatever rank 1 printed would be in it too. A group joined again in the same processes
# would find the last group's addresses under the same names in torchrun's store (torch numbers groups from 0
# again after destroy_process_group), so each command's groups are numbered apart; and torch.distributed.nn binds
# the group of its first import as its functions' default, so it is imported before any group exists (test harness
# only: a real launch runs one command). The first entry is no command: the library's global batch of
# test_global_batch_gradient_on_two_processes_equals_one, in the same two interpreters (not two more to spawn).
SEVERAL = """
import json, os, sys
import torch.distributed.distributed_c10d as c10d
import torch.distributed.nn  # noqa: F401
from matplotlib.figure import Figure
from cocos_cli.main import app
def savefig(self, fname, *args, **kwargs):  # figures as empty files: no test here reads them
    if hasattr(fname, "write"):
        fname.write(b"")
    else:
        open(fname, "wb").close()
Figure.savefig = savefig
commands = json.loads(sys.argv[1])
failed = False
for i, args in enumerate(commands):
    c10d._world.group_count = 1000 * i
    if i == len(commands) - 1 and os.environ.get("RANK") == "1" and os.environ.get("LAST_ONE_DIES"):
        import cocos.training.trainer as t  # rank 1 dies at its third step of the last command
        original = t.Trainer.step
        def step(self, *a, **k):
            if self.step_count >= 2:
                os._exit(3)
            return original(self, *a, **k)
        t.Trainer.step = step
    try:
        if args[0] == "@global_batch":  # not a command: test_global_batch_gradient_on_two_processes_equals_one
            sys.path.insert(0, args[1])
            from tests.test_distributed import _global_batch_worker
            _global_batch_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), *map(os.path.abspath, args[2:]))
        else:
            app(args)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    failed = failed or code != 0
    if os.environ.get("RANK") == "0":
        print(f"@@ exit {code}", flush=True)
sys.exit(1 if failed else 0)
"""
COMMANDS = {"global_batch": ["@global_batch", str(Path(__file__).resolve().parents[1]), "global_batch.store",
                             "global_batch.pt"],
            "count": [*COUNT, "--json", "two.json"], "analyze": [*ANALYZE, "--out", "two"],
            "train": [*TRAIN, "--out", "t2", "--overwrite"], "vsrn": VSRN,
            **({"clip": [*CLIP, "--out", "c2"]} if importlib.util.find_spec("transformers") else {})}
DIES = [*TRAIN, "--out", "dead"]  # last in the launch: rank 1 dies in it (LAST_ONE_DIES)


@pytest.fixture(scope="module")
def two(run):
    """The commands of :data:`COMMANDS` on two processes, then :data:`DIES`: ``{name: rank 0's stdout of it}``,
    ``"all"``: every line, ``"dies"``: the launch's exit code and every line of stdout and stderr."""

    env = {**os.environ, "OMP_NUM_THREADS": "1", "COCOS_DIST_TIMEOUT": "60", "LAST_ONE_DIES": "1"}
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "--no-python", *preloaded.command(SEVERAL),
           json.dumps([*COMMANDS.values(), DIES])]
    res = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True, timeout=300)
    parts = res.stdout.split("@@ exit ")
    assert len(parts) >= len(COMMANDS) + 1 and all(p.startswith("0\n") for p in parts[1:len(COMMANDS) + 1]), (
        res.stdout[-2000:], res.stderr[-3000:])
    outputs = [parts[0], *(p[2:] for p in parts[1:len(COMMANDS)])]
    return {"all": res.stdout, **dict(zip(COMMANDS, outputs, strict=True)),
            "dies": (res.returncode, res.stdout + res.stderr)}


@pytest.mark.slow
@needs_torchrun
def test_count_on_two_processes_equals_one(run, two):
    one = _here([*COUNT, "--json", "one.json"], run)
    assert one.exit_code == 0, one.output
    # rank 0 alone writes and prints: one table, one "wrote" line
    assert "wrote two.json" in two["count"] and two["all"].count("wrote two.json") == 1
    a, b = (json.loads((run / f).read_text()) for f in ("one.json", "two.json"))
    _close(a["statistics"], b["statistics"])  # both modes and the eps sweep
    assert a["counting"]["n_batches"] == b["counting"]["n_batches"]


@pytest.mark.slow
@needs_torchrun
def test_analyze_on_two_processes_equals_one(run, two):
    import pandas as pd

    one = _here([*ANALYZE, "--out", "one"], run)
    assert one.exit_code == 0, one.output
    a, b = (json.loads((run / f / "results.json").read_text()) for f in ("one", "two"))
    for key in ("statistics", "evaluation", "counting", "data"):
        _close(a[key], b[key], key)
    x, y = (pd.read_csv(run / f / "batches.csv") for f in ("one", "two"))  # every batch, in the same order
    pd.testing.assert_frame_equal(x.drop(columns="value"), y.drop(columns="value"))
    np.testing.assert_allclose(x["value"], y["value"], rtol=1e-6, atol=1e-9)


@pytest.mark.slow
@needs_torchrun
def test_train_on_two_processes_equals_one(run, two):
    import pandas as pd
    import torch

    from cocos.training.checkpoint import load_checkpoint

    # 450 captions in global batches of 30 (15 rows per rank), with COCOS tracked on the global batch
    one = _here([*TRAIN, "--out", "t1", "--overwrite"], run)
    assert one.exit_code == 0, one.output
    # rank 0 alone prints and writes (one line per training of the launch)
    trainings = 2 + ("clip" in two)  # this one, the VSRN's and the CLIP's
    assert two["train"].count("best validation rsum") == 1 and two["all"].count("best validation rsum") == trainings
    a, b = (load_checkpoint(run / f / "last.pt") for f in ("t1", "t2"))
    for name, tensor in a["state_dict"].items():
        assert torch.allclose(tensor.float(), b["state_dict"][name].float(), atol=1e-4), name
    assert a["metrics"]["rsum"] == pytest.approx(b["metrics"]["rsum"], abs=1e-6)
    x, y = (pd.read_csv(run / f / "train_log.csv") for f in ("t1", "t2"))
    assert x["loss"].iloc[0] == pytest.approx(y["loss"].iloc[0], rel=1e-6)  # the first step: same global batch
    np.testing.assert_allclose(x["loss"], y["loss"], rtol=1e-4)
    x, y = (pd.read_csv(run / f / "cocos_track.csv") for f in ("t1", "t2"))
    np.testing.assert_allclose(x["value"], y["value"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@needs_torchrun
def test_clip_on_two_processes_equals_one(run, two):
    """A CLIP fine-tuned on two processes (each encodes its half of the pixels and captions, the learned
    temperature's gradient averaged with the rest) is the one-process model, its track included."""
    import pandas as pd
    import torch

    from cocos.training.checkpoint import load_checkpoint

    if "clip" not in two:
        pytest.skip("transformers is not installed")
    one = _here([*CLIP, "--out", "c1"], run)
    assert one.exit_code == 0, one.output
    a, b = (load_checkpoint(run / f / "last.pt") for f in ("c1", "c2"))
    for name, tensor in a["state_dict"].items():
        if name.endswith("k_proj.bias"):  # its true gradient is 0 (softmax ignores a constant per query): Adam
            continue                      # steps on rounding noise, which differs with the order of sums
        assert torch.allclose(tensor.float(), b["state_dict"][name].float(), atol=1e-4), name
    assert a["loss"]["params"]["tau"] == pytest.approx(b["loss"]["params"]["tau"], rel=1e-5)
    x, y = (pd.read_csv(run / f / "cocos_track.csv") for f in ("c1", "c2"))
    np.testing.assert_allclose(x["value"], y["value"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@needs_torchrun
def test_vsrn_on_two_processes_saves_the_model_it_validated(run, two):
    """BatchNorm: rank 0's running statistics on every rank (the recorded dev rsum is the saved model's), and
    a global batch too small for two rows per rank (the epoch's last, 2 captions) is computed whole."""
    from cocos.training.checkpoint import load_checkpoint

    recorded = load_checkpoint(run / "v" / "last.pt")["metrics"]["rsum"]
    again = _here(["evaluate", "v/last.pt", "--split", "dev", "--json", "dev.json", "--no-progress"], run)
    assert again.exit_code == 0, again.output
    assert json.loads((run / "dev.json").read_text())["rsum"] == pytest.approx(recorded, abs=1e-9)


@pytest.mark.slow
@needs_torchrun
def test_a_process_that_dies_stops_the_others_and_leaves_no_output(run, two):
    code, output = two["dies"]  # rank 1 died at its third step of the launch's last command (a training)
    assert code != 0
    # rank 0 notices the lost peer in its next collective, unless torchrun's SIGTERM to the survivors comes first
    # (a race on a loaded machine): then it stops as on Ctrl-C (exit code 130), with one line; either way cleanly,
    # nothing left. The ranks and torchrun share stderr, so that line may be joined to another one
    from cocos_cli.common import INTERRUPTED

    stopped = "error: rank 0: another process stopped" in output
    assert stopped or ("@@ exit 130" in output and INTERRUPTED in output), output[-3000:]
    assert not (run / "dead").exists()
