"""Several processes (torchrun, Gloo on CPU), one result: the same numbers as one process."""

from __future__ import annotations

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

TORCHRUN = shutil.which("torchrun")
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not on PATH")


@given(n=st.integers(0, 200), world=st.integers(1, 9))
def test_blocks_tile_the_plan_in_order(n, world):
    blocks = [block(n, Dist(rank, world)) for rank in range(world)]
    assert [i for b in blocks for i in b] == list(range(n))
    assert max(len(b) for b in blocks) - min(len(b) for b in blocks) <= 1


def _torchrun(nproc: int, args: list[str], cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COCOS_DIST_TIMEOUT": "60"}
    cmd = [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", "--no-python", "cocos", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


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


@needs_torchrun
def test_count_on_two_processes_equals_one(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(150, 8)).astype(np.float32)
    captions = np.repeat(images, 5, axis=0) + rng.normal(size=(750, 8)).astype(np.float32)
    np.savez(tmp_path / "e.npz", images=images, captions=captions)
    one = subprocess.run(["cocos", "count", "e.npz", "--batch-size", "16", "--json", "one.json", "--no-progress",
                          "--loss", "all"], cwd=tmp_path, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    two = _torchrun(2, ["count", "e.npz", "--batch-size", "16", "--json", "two.json", "--no-progress", "--loss",
                        "all"], tmp_path)
    assert two.returncode == 0, two.stderr[-2000:]
    # rank 0 alone writes and prints: one table, one "wrote" line
    assert two.stdout.count("wrote two.json") == 1
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    _close(a["statistics"], b["statistics"])  # both modes and the eps sweep
    assert a["counting"]["n_batches"] == b["counting"]["n_batches"]


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


def test_global_batch_gradient_on_two_processes_equals_one(tmp_path):
    import torch
    import torch.multiprocessing as mp

    mp.spawn(_global_batch_worker, args=(2, str(tmp_path / "store"), str(tmp_path / "two.pt")), nprocs=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x = torch.randn(7, 5)
    z = model(x)
    loss = (z.softmax(0) * torch.arange(21.0).view(7, 3)).sum() + z.pow(2).mean()
    loss.backward()
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert torch.allclose(two["loss"], loss.detach(), atol=1e-6)
    assert torch.allclose(two["w"], model.weight.grad, atol=1e-6)  # uneven blocks (3 + 4 rows) included
    assert torch.allclose(two["b"], model.bias.grad, atol=1e-6)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny data folder and a one-epoch checkpoint, trained in this process."""
    from cocos.data.synth import make_synthetic
    from cocos.training.trainer import TrainConfig, Trainer

    root = tmp_path_factory.mktemp("dist")
    data = make_synthetic(root / "data", n_train=90, n_dev=20, n_test=20, feature_dim=16, seed=5)
    Trainer(TrainConfig(data=str(data), out=str(root / "ck"), loss="triplet_sh", epochs=1, lr=5e-3, batch_size=32,
                        embed_size=16, word_dim=8, device="cpu"), progress=False, log=lambda *a: None).fit()
    return root


TRAIN = ["train", "--data", "data", "--loss", "triplet_sh", "--epochs", "1", "--lr", "5e-3", "--batch-size", "30",
         "--embed-size", "16", "--word-dim", "8", "--device", "cpu", "--no-progress", "--track-cocos", "2"]


@needs_torchrun
def test_analyze_on_two_processes_equals_one(run):
    import pandas as pd

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["analyze", "ck/model_best.pt", "--no-progress", "--overwrite"]
    one = subprocess.run(["cocos", *args, "--out", "one"], cwd=run, env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    two = _torchrun(2, [*args, "--out", "two"], run)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = (json.loads((run / f / "results.json").read_text()) for f in ("one", "two"))
    for key in ("statistics", "evaluation", "counting", "data"):
        _close(a[key], b[key], key)
    x, y = (pd.read_csv(run / f / "batches.csv") for f in ("one", "two"))  # every batch, in the same order
    pd.testing.assert_frame_equal(x.drop(columns="value"), y.drop(columns="value"))
    np.testing.assert_allclose(x["value"], y["value"], rtol=1e-6, atol=1e-9)


@needs_torchrun
def test_train_on_two_processes_equals_one(run):
    import pandas as pd
    import torch

    from cocos.training.checkpoint import load_checkpoint

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # 450 captions in global batches of 30 (15 rows per rank), with COCOS tracked on the global batch
    one = subprocess.run(["cocos", *TRAIN, "--out", "t1", "--overwrite"], cwd=run, env=env, capture_output=True,
                         text=True)
    assert one.returncode == 0, one.stderr
    two = _torchrun(2, [*TRAIN, "--out", "t2", "--overwrite"], run)
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("best validation rsum") == 1  # rank 0 alone prints and writes
    a, b = (load_checkpoint(run / f / "last.pt") for f in ("t1", "t2"))
    for name, tensor in a["state_dict"].items():
        assert torch.allclose(tensor.float(), b["state_dict"][name].float(), atol=1e-4), name
    assert a["metrics"]["rsum"] == pytest.approx(b["metrics"]["rsum"], abs=1e-6)
    x, y = (pd.read_csv(run / f / "train_log.csv") for f in ("t1", "t2"))
    assert x["loss"].iloc[0] == pytest.approx(y["loss"].iloc[0], rel=1e-6)  # the first step: same global batch
    np.testing.assert_allclose(x["loss"], y["loss"], rtol=1e-4)
    x, y = (pd.read_csv(run / f / "cocos_track.csv") for f in ("t1", "t2"))
    np.testing.assert_allclose(x["value"], y["value"], rtol=1e-5, atol=1e-6)


@needs_torchrun
def test_a_process_that_dies_stops_the_others_and_leaves_no_output(run, tmp_path):
    # rank 1 dies at its third step (a sitecustomize that only this test puts on the path)
    (tmp_path / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    import cocos.training.trainer as t\n"
        "    original = t.Trainer.step\n"
        "    def step(self, *a, **k):\n"
        "        if self.step_count >= 2:\n"
        "            os._exit(3)\n"
        "        return original(self, *a, **k)\n"
        "    t.Trainer.step = step\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COCOS_DIST_TIMEOUT": "60", "OMP_NUM_THREADS": "1"}
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "--no-python", "cocos", *TRAIN, "--out", "dead"]
    res = subprocess.run(cmd, cwd=run, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "error: rank 0: another process stopped" in res.stdout + res.stderr
    assert not (run / "dead").exists()


@needs_torchrun
def test_vsrn_on_two_processes_saves_the_model_it_validated(tmp_path):
    """BatchNorm: rank 0's running statistics on every rank (the recorded dev rsum is the saved model's), and
    a global batch too small for two rows per rank (the epoch's last, 2 captions) is computed whole."""
    from cocos.data.synth import make_synthetic

    make_synthetic(tmp_path / "data", n_train=41, n_dev=12, n_test=12, feature_dim=8, regions=True, seed=1)
    args = ["train", "--data", "data", "--model", "vsrn", "--epochs", "1", "--batch-size", "7", "--embed-size", "8",
            "--word-dim", "8", "--lr", "1e-2", "--device", "cpu", "--no-progress", "--out", "v"]
    res = _torchrun(2, args, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    from cocos.training.checkpoint import load_checkpoint

    recorded = load_checkpoint(tmp_path / "v" / "last.pt")["metrics"]["rsum"]
    again = subprocess.run(["cocos", "evaluate", "v/last.pt", "--split", "dev", "--json", "dev.json",
                            "--no-progress"], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "dev.json").read_text())["rsum"] == pytest.approx(recorded, abs=1e-9)
