"""Benchmark: 1 vs N processes (torchrun, Gloo on CPU) for cocos count and cocos analyze.

Wall time of the whole command, process start included, best of ``--repeats``; the
results of every run are compared with the one-process run (statistics to 1e-6).

1. ``cocos count`` on generated embeddings of Flickr30k size (29,000 images,
   145,000 captions, d = 1024), the paper's four losses, both modes, ε sweep.
2. ``cocos analyze`` of an untrained VSE++ checkpoint (embed 1024, word 300) on
   synthetic features of Flickr30k dimensions (``--n-train`` images x 2048).

    python benchmarks/bench_distributed.py [--nproc 2] [--repeats 2] [--n-train 29000] [--skip-analyze]

One process uses all cores for its matrix products (torch's intra-op threads); under
torchrun each process gets one thread (``OMP_NUM_THREADS=1``, torchrun's default), so
on a 2-core machine the speed-up measures how well the split work runs side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np


def _run(cmd: list[str], cwd: Path, threads: int | None = None) -> float:
    env = {**os.environ, "COCOS_DIST_TIMEOUT": "900"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return time.perf_counter() - start


def _best(cmd: list[str], cwd: Path, repeats: int, threads: int | None = None) -> float:
    return min(_run(cmd, cwd, threads) for _ in range(repeats))


def _max_diff(a, b) -> float:
    if isinstance(a, dict):
        return max([_max_diff(a[k], b[k]) for k in a] or [0.0])
    if isinstance(a, list):
        return max([_max_diff(x, y) for x, y in zip(a, b, strict=True)] or [0.0])
    if isinstance(a, float) and isinstance(b, float):
        if np.isnan(a) and np.isnan(b):
            return 0.0
        return abs(a - b) / max(1.0, abs(a))
    return 0.0 if a == b else float("inf")


def _torchrun(nproc: int) -> list[str]:
    return [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc_per_node={nproc}", "--no-python"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--n-train", type=int, default=29000)
    parser.add_argument("--skip-analyze", action="store_true")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; 1 vs {args.nproc} processes (Gloo), "
          f"best of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rng = np.random.default_rng(0)
        n = args.n_train
        images = rng.normal(size=(n, 1024)).astype(np.float32)
        captions = (np.repeat(images, 5, axis=0) + rng.normal(size=(5 * n, 1024)).astype(np.float32) * 2)
        np.savez(tmp / "emb.npz", images=images, captions=captions)
        del images, captions
        count = ["cocos", "count", "emb.npz", "--no-progress"]
        t1 = _best([*count, "--json", "one.json"], tmp, args.repeats)
        t1s = _best([*count, "--json", "one_t1.json"], tmp, args.repeats, threads=1)
        tn = _best([*_torchrun(args.nproc), *count, "--json", "many.json"], tmp, args.repeats)
        diff = _max_diff(*(json.loads((tmp / f).read_text())["statistics"] for f in ("one.json", "many.json")))
        print(f"cocos count ({n:,} images, {5 * n:,} captions, d 1024): 1 process {t1:.1f} s (1 thread {t1s:.1f} s), "
              f"{args.nproc} processes x 1 thread {tn:.1f} s: speed-up {t1 / tn:.2f}x ({t1s / tn:.2f}x per thread); "
              f"largest relative difference {diff:.1e}")
        if args.skip_analyze:
            return
        from cocos.data.synth import make_synthetic
        from cocos.training.trainer import TrainConfig, Trainer

        data = make_synthetic(tmp / "synth", n_train=n, n_dev=100, n_test=1000, feature_dim=2048, seed=0)
        trainer = Trainer(TrainConfig.of(data=str(data), out=str(tmp / "ck"), epochs=1, device="cpu"),
                          progress=False, log=lambda *a: None)
        trainer.out.mkdir(parents=True, exist_ok=True)
        from cocos.training.checkpoint import save_checkpoint

        save_checkpoint(tmp / "ck" / "model_best.pt", trainer.checkpoint(metrics={"rsum": 0.0}, full=False))
        analyze = ["cocos", "analyze", "ck/model_best.pt", "--no-progress", "--overwrite"]
        t1 = _best([*analyze, "--out", "r1"], tmp, args.repeats)
        t1s = _best([*analyze, "--out", "r1s"], tmp, args.repeats, threads=1)
        tn = _best([*_torchrun(args.nproc), *analyze, "--out", "rn"], tmp, args.repeats)
        diff = _max_diff(*(json.loads((tmp / f / "results.json").read_text())["statistics"] for f in ("r1", "rn")))
        print(f"cocos analyze (VSE++ embed 1024, {n:,} x 2048 training features, 1,000 test images): 1 process "
              f"{t1:.1f} s (1 thread {t1s:.1f} s), {args.nproc} processes x 1 thread {tn:.1f} s: speed-up "
              f"{t1 / tn:.2f}x ({t1s / tn:.2f}x per thread); largest relative difference {diff:.1e}")


if __name__ == "__main__":
    main()
