"""Benchmark of counting at Flickr30k size: whole CLI, in-process, matmul floor, peak memory, equality.

One run on generated embeddings of Flickr30k size (29,000 images, 145,000 captions,
5 per image, d = 1024, float32, an uncompressed ``.npz`` of 713 MB; written once to
``--npz`` and reused), counted as ``cocos count`` counts it (the paper's four losses,
both counting modes, the eps sweep, batch size 128: 1,132 pair + 226 ranking batches):

1. the whole ``cocos count FILE --no-progress`` in a fresh process: wall, user and system
   CPU time and peak RSS (against the input's size + 1 GB);
2. the counting in-process (``count_embeddings`` on the loaded set, as ``cocos count`` calls it, under the
   same heap policy, ``cocos.device.steady_heap``);
3. the matmul floor: the similarity matmuls of the same batches in the same chunks, nothing else;
4. (unless ``--no-compare``) the same counting by the frozen per-threshold loop of
   ``tests/reference_engine.py`` and the largest absolute difference of every batch value.

Prints a small table with the load average of the machine (timings on a shared machine move
with it; user CPU time moves less than wall time).

    python benchmarks/bench_analyze.py [--npz /tmp/f30k.npz] [--repeat 2] [--no-compare] [--device cpu]
    python benchmarks/bench_analyze.py --whole-analyze   # also a whole analyze_checkpoint (minutes)
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cocos.counting.engine import (  # noqa: E402
    CHUNK,
    DEFAULT_SWEEP,
    SMALL_CHUNK,
    batches_per_chunk,
    count_embeddings,
    make_plan,
    rows_of,
)
from cocos.device import steady_heap  # noqa: E402
from cocos.pipelines.count import read_embeddings  # noqa: E402

MODES = ["corrected", "compat"]


def write_flickr(path: Path, n_images=29_000, k=5, d=1024, seed=0) -> None:
    """Images N(0, 1), each caption its image plus 1.5 x N(0, 1) noise, float32, ``numpy.savez`` (uncompressed)."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((n_images, d), dtype=np.float32)
    captions = np.repeat(images, k, 0) + 1.5 * rng.standard_normal((n_images * k, d), dtype=np.float32)
    tmp = path.with_name(path.name + ".part.npz")
    np.savez(tmp, images=images, captions=captions)
    os.replace(tmp, path)


def whole_cli(path: Path) -> dict:
    """``cocos count FILE --no-progress`` in a fresh process: wall, user, sys (s) and peak RSS (MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("cocos")), "count", str(path), "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": wall, "user": after.ru_utime - before.ru_utime, "sys": after.ru_stime - before.ru_stime,
            "rss": after.ru_maxrss / 1024}


def timed(fn):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = fn()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return out, {"wall": time.perf_counter() - t0, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime}


def matmul_floor(emb, batch_size=128, seed=0, chunk=CHUNK) -> None:
    """The similarity matmuls of every batch (both layouts), gathered and chunked as the engine does, without
    autograd bookkeeping as the engine counts."""
    with torch.no_grad():
        _matmuls(emb, batch_size, seed, chunk)
    if emb.images.is_cuda:
        torch.cuda.synchronize()


def _matmuls(emb, batch_size, seed, chunk) -> None:
    for layout in ("pair", "ranking"):
        plan = make_plan(emb, layout, batch_size, seed)
        step = batches_per_chunk(plan, chunk, emb.images.device, True)  # the paper's four counters are chunk-invariant
        for s in range(0, plan.n_batches, step):
            c = torch.as_tensor(plan.captions[s:s + step], device=emb.images.device)
            i = torch.as_tensor(plan.images[s:s + step], device=emb.images.device)
            rows_of(emb.images, i) @ rows_of(emb.captions, c).transpose(-1, -2)


def count(emb):
    run = count_embeddings(emb, None, modes=MODES, sweep_eps=DEFAULT_SWEEP, keep_per_query=False)
    if emb.images.is_cuda:
        torch.cuda.synchronize()
    return run


def max_difference(new, old) -> float:
    a, b = new.batches, old.batches
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return math.inf
    keys = ["loss", "direction", "mode", "stat", "batch"]
    if not (a[keys].equals(b[keys]) and np.array_equal(a["eps"].to_numpy(), b["eps"].to_numpy(), equal_nan=True)):
        return math.inf
    x, y = a["value"].to_numpy(), b["value"].to_numpy()
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        return math.inf
    ok = ~np.isnan(x)
    return float(np.max(np.abs(x[ok] - y[ok]), initial=0.0))


def row(name, t, extra=""):
    return f"{name:<34} {t['wall']:>8.2f} {t.get('user', math.nan):>8.2f} {t.get('sys', math.nan):>7.2f}  {extra}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", default=os.path.join(tempfile.gettempdir(), "cocos_f30k_bench.npz"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2, help="in-process runs and floors (best of)")
    parser.add_argument("--no-compare", action="store_true", help="skip the frozen per-threshold loop")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--whole-analyze", action="store_true")
    args = parser.parse_args()
    steady_heap()  # the heap policy of every cocos command (cocos.device.steady_heap), for the in-process runs too
    path = Path(args.npz)
    if not path.exists():
        print(f"writing {path} ...", flush=True)
        write_flickr(path)
    size_mb = path.stat().st_size / 2**20
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, device {args.device}; load average {os.getloadavg()[0]:.2f}")
    print(f"input: {path} ({size_mb:.0f} MB); paper's four losses, modes {'+'.join(MODES)}, "
          f"sweep {len(DEFAULT_SWEEP)} eps, batch 128, chunks of {SMALL_CHUNK['pair']} pair and "
          f"{SMALL_CHUNK['ranking']} ranking batches")
    lines = []
    cli = None if args.skip_cli else whole_cli(path)
    if cli:
        lines.append(row("whole CLI (cocos count)", cli, f"peak RSS {cli['rss']:.0f} MB (input + 1 GB = "
                                                          f"{size_mb + 1024:.0f} MB)"))
    emb, t_load = timed(lambda: read_embeddings(path, device=args.device))
    lines.append(row("load (memory-mapped, normalised)", t_load))
    floors, runs = [], []
    for _ in range(args.repeat):  # interleaved: both measured under the same conditions
        floors.append(timed(lambda: matmul_floor(emb))[1])
        runs.append(timed(lambda: count(emb)))
    floor = min(floors, key=lambda t: t["wall"])
    run, best = min(runs, key=lambda r: r[1]["wall"])
    lines.append(row("count_embeddings (in-process)", best, f"best of {args.repeat}"))
    lines.append(row("matmul floor (same batches, chunks)", floor, f"best of {args.repeat}"))
    print(f"\n{'':<34} {'wall s':>8} {'user s':>8} {'sys s':>7}")
    print("\n".join(lines))
    print(f"\nin-process / floor: {best['wall'] / floor['wall']:.1f}x wall, {best['user'] / floor['user']:.1f}x user"
          + (f"; whole CLI / floor: {cli['wall'] / floor['wall']:.1f}x wall" if cli else ""))
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if not args.no_compare:
        from tests.reference_engine import reference_count_embeddings

        old, t_old = timed(lambda: reference_count_embeddings(emb, None, modes=MODES, sweep_eps=DEFAULT_SWEEP,
                                                              keep_per_query=False))
        diff = max_difference(run, old)
        print(f"frozen per-threshold loop: {t_old['wall']:.2f} s wall, {t_old['user']:.2f} s user; "
              f"{len(old.batches)} batch values, max |difference| {diff:.3g}")
    print(f"load average now {os.getloadavg()[0]:.2f}")
    if args.whole_analyze:
        whole_analyze(args.device)


def whole_analyze(device: str) -> None:
    from cocos.data.synth import make_synthetic
    from cocos.pipelines.analyze import analyze_checkpoint
    from cocos.training.checkpoint import save_checkpoint
    from cocos.training.trainer import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = make_synthetic(tmp / "f30k", n_train=29_000, n_dev=1_000, n_test=1_000, feature_dim=2048, seed=0)
        trainer = Trainer(TrainConfig.of(data=str(data), out=str(tmp / "ckpt"), epochs=1, device=device),
                          progress=False, log=lambda *a: None)
        trainer.out.mkdir(parents=True)
        save_checkpoint(trainer.best_path, trainer.checkpoint({"rsum": math.nan}, full=False))
        start = time.perf_counter()
        analysis = analyze_checkpoint(trainer.best_path, device=device)
        total = time.perf_counter() - start
        shares = ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in analysis.timings.items())
        print(f"whole analyze (29,000 x 2048 synthetic features, VSE++): total {total:.1f} s: {shares}")


if __name__ == "__main__":
    main()
