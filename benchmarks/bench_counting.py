"""Benchmark: one batch of 128 images x 640 captions, d = 1024, all four losses, both directions.

Compares the cocos engine with a plain implementation in the shape of the
published counter (``reference_counter.py``: full M x M difference matrices, a
Python loop over queries). Prints both times (best of --repeat after a warm-up call), their ratio, both peak
memories (growth of the RSS high-water mark during one call, reset before it,
after a warm-up on tiny inputs; each in a fresh process; Linux) and the largest difference in outputs.

    python benchmarks/bench_counting.py [--repeat 5] [--compat]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_counter as ref  # noqa: E402

from cocos.counting import count_batch  # noqa: E402


def peak_memory_mb(loss: str, which: str, compat: bool, dim: int) -> float:
    """Peak memory of one call, in a fresh process: growth of the RSS high-water mark over the setup."""
    import subprocess

    cmd = [sys.executable, __file__, "--measure", loss, "--which", which, "--dim", str(dim)]
    if compat:
        cmd.append("--compat")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _measure(args) -> None:
    """Warm up on tiny inputs, reset the RSS high-water mark (Linux: clear_refs 5), run once, print the growth.

    The warm-up (d = 16) initialises kernels and thread pools, which are not the
    counter's memory, without leaving the real call's buffers cached.
    """
    which = 0 if args.which == "reference" else 1
    make_cases(argparse.Namespace(**{**vars(args), "dim": 16}))[args.measure][which]()
    fn = make_cases(args)[args.measure][which]
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = _status_kb("VmRSS")
    fn()
    print(max(_status_kb("VmHWM") - base, 0) / 1024)


def timed(fn, repeat):
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def max_diff(a, b):
    worst = 0.0
    for d in a:
        for k, v in a[d].items():
            w = b[d][k]
            if math.isnan(v) and math.isnan(w):
                continue
            worst = max(worst, abs(v - w))
    return worst


def make_cases(args):
    torch.manual_seed(0)
    b, k, d = 128, 5, args.dim
    images = torch.nn.functional.normalize(torch.randn(b, d), dim=-1)
    # captions close to their image so that the counts are not trivially zero
    captions = torch.nn.functional.normalize(
        images.repeat_interleave(k, 0) + 1.6 * torch.randn(b * k, d) / math.sqrt(d) * 8, dim=-1)
    pair_caps = captions[::k].contiguous()
    return {
        "triplet": (lambda: ref.triplet(images, pair_caps, compat=args.compat),
                    lambda: count_batch(images, pair_caps, "triplet", compat=args.compat)),
        "triplet_sh": (lambda: ref.triplet(images, pair_caps, hardest=True),
                       lambda: count_batch(images, pair_caps, "triplet_sh", compat=args.compat)),
        "ntxent": (lambda: ref.ntxent(images, pair_caps),
                   lambda: count_batch(images, pair_caps, "ntxent", compat=args.compat)),
        "smoothap": (lambda: ref.smoothap(images, captions, compat=args.compat),
                     lambda: count_batch(images, captions, "smoothap", compat=args.compat)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--compat", action="store_true")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--which", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return _measure(args)
    cases = make_cases(args)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; batch 128 images x 640 captions (pair batches 128 x 128), "
          f"d = {args.dim}, compat = {args.compat}")
    print(f"{'loss':<11} {'reference s':>12} {'cocos s':>10} {'speed-up':>9} "
          f"{'ref peak MB':>12} {'cocos peak MB':>14} {'max |diff|':>11}")
    for name, (slow, fast) in cases.items():
        slow(), fast()  # warm up
        t_ref, r_ref = timed(slow, args.repeat)
        t_new, r_new = timed(fast, args.repeat)
        m_ref = peak_memory_mb(name, "reference", args.compat, args.dim)
        m_new = peak_memory_mb(name, "cocos", args.compat, args.dim)
        diff = max_diff(r_ref, r_new)
        print(f"{name:<11} {t_ref:>12.4f} {t_new:>10.4f} {t_ref / t_new:>8.1f}x "
              f"{m_ref:>12.1f} {m_new:>14.1f} {diff:>11.2e}")


if __name__ == "__main__":
    main()
