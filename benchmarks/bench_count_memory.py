"""Peak memory of a whole ``cocos count`` against the size of its input.

For each size, an uncompressed ``.npz`` of random float32 embeddings (5 captions per image,
d = 1024) is written to a temporary folder and ``cocos count FILE --no-progress`` (the paper's
four losses, both modes, the eps sweep, per-query rows) runs in a fresh process; its peak RSS
(``ru_maxrss`` of the child) and wall time are reported beside the arrays' size and the RSS of a
process that only imports cocos and torch (the fixed cost).

    python benchmarks/bench_count_memory.py [--sizes 50,200,1000] [--dim 1024]

The contract (issue 16): peak RSS <= input arrays + 1 GB.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_input(path: Path, megabytes: float, dim: int, k: int = 5) -> int:
    n_images = max(8, int(megabytes * 2**20 / (4 * dim * (1 + k))))
    rng = np.random.default_rng(0)
    with open(path, "wb") as fh:  # numpy.savez: stored members, which cocos memory-maps
        np.savez(fh, images=rng.standard_normal((n_images, dim), dtype=np.float32),
                 captions=rng.standard_normal((n_images * k, dim), dtype=np.float32))
    return n_images


def child_peak(args: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50,200,1000", help="input sizes in MB")
    parser.add_argument("--dim", type=int, default=1024)
    a = parser.parse_args()
    cocos = [sys.executable, "-c", "from cocos_cli.main import run; run()"]
    print(f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, load "
          f"{os.getloadavg()[0]:.1f}")
    # ru_maxrss of children is the largest of all children so far: measure in increasing order of size
    _, base = child_peak([sys.executable, "-c", "import torch, cocos.counting, cocos.pipelines.count"])
    print(f"fixed cost (python + torch + cocos imported): {base:.0f} MB")
    print(f"{'input MB':>9} {'images':>8} {'captions':>9} {'peak RSS MB':>12} {'peak - input':>13} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in sorted(float(s) for s in a.sizes.split(",")):
            path = Path(tmp) / f"emb_{size:g}.npz"
            n = write_input(path, size, a.dim)
            mb = path.stat().st_size / 2**20
            wall, peak = child_peak([*cocos, "count", str(path), "--no-progress"])
            print(f"{mb:9.0f} {n:8d} {5 * n:9d} {peak:12.0f} {peak - mb:13.0f} {wall:7.1f}")
            path.unlink()


if __name__ == "__main__":
    main()
