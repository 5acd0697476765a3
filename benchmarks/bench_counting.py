"""Benchmark: one batch of 128 images x 640 captions, d = 1024, all four losses, both directions.

Compares the cocos engine with a plain implementation in the shape of the
published counter (``reference_counter.py``: full M x M difference matrices, a
Python loop over queries). Prints both times, their ratio, both peak memories
(torch profiler, largest op allocation) and the largest difference in outputs.

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


def peak_memory(fn):
    """Largest single-op memory allocation by torch's CPU allocator during ``fn`` (profiler)."""
    import os

    from torch.profiler import ProfilerActivity, profile

    saved = os.dup(2)  # the profiler prints start/stop lines on stderr: keep the table clean
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    events = [e for e in prof.key_averages() if e.cpu_memory_usage > 0]
    return max((e.cpu_memory_usage for e in events), default=0)


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compat", action="store_true")
    parser.add_argument("--dim", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    b, k, d = 128, 5, args.dim
    images = torch.nn.functional.normalize(torch.randn(b, d), dim=-1)
    # captions close to their image so that the counts are not trivially zero
    captions = torch.nn.functional.normalize(
        images.repeat_interleave(k, 0) + 1.6 * torch.randn(b * k, d) / math.sqrt(d) * 8, dim=-1)
    pair_caps = captions[::k].contiguous()
    cases = {
        "triplet": (lambda: ref.triplet(images, pair_caps, compat=args.compat),
                    lambda: count_batch(images, pair_caps, "triplet", compat=args.compat)),
        "triplet_sh": (lambda: ref.triplet(images, pair_caps, hardest=True),
                       lambda: count_batch(images, pair_caps, "triplet_sh", compat=args.compat)),
        "ntxent": (lambda: ref.ntxent(images, pair_caps),
                   lambda: count_batch(images, pair_caps, "ntxent", compat=args.compat)),
        "smoothap": (lambda: ref.smoothap(images, captions, compat=args.compat),
                     lambda: count_batch(images, captions, "smoothap", compat=args.compat)),
    }
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; batch {b} images x {b * k} captions (pair batches {b} x {b}), "
          f"d = {d}, compat = {args.compat}")
    print(f"{'loss':<11} {'reference s':>12} {'cocos s':>10} {'speed-up':>9} "
          f"{'ref peak MB':>12} {'cocos peak MB':>14} {'max |diff|':>11}")
    for name, (slow, fast) in cases.items():
        t_ref, r_ref = timed(slow, 1 if name == "smoothap" else args.repeat)
        t_new, r_new = timed(fast, args.repeat)
        m_ref, m_new = peak_memory(slow), peak_memory(fast)
        diff = max_diff(r_ref, r_new)
        print(f"{name:<11} {t_ref:>12.4f} {t_new:>10.4f} {t_ref / t_new:>8.1f}x "
              f"{m_ref / 2**20:>12.1f} {m_new / 2**20:>14.1f} {diff:>11.2e}")


if __name__ == "__main__":
    main()
