"""Benchmark of the frozen-CNN feature cache (``cocos data features``): images/s end to end.

Flickr30k-sized JPEGs (500 x 375, quality 90, a CSV file list), the evaluation transform
(Resize(256) + CenterCrop(224)), ResNet-50 and ResNet-18 (random weights: the speed does not
depend on them), DataLoader workers 0, 1 and 2; each figure is :func:`write_feature_cache`
from the call to the renamed folder (fingerprint, decoding, CNN, writing). A second table
times the CNN alone on ready pixels, to show what share decoding takes.

    python benchmarks/bench_features.py [--n 64] [--batch-size 32] [--device cpu] [--cnn resnet50,resnet18]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_images import _flickr_like  # noqa: E402

from cocos.embed.features import write_feature_cache  # noqa: E402
from cocos.models.cnn import build_cnn, strip_classifier  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cnn", default="resnet50,resnet18")
    ap.add_argument("--workers", default="0,1,2")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device {device}, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _flickr_like(tmp, args.n)
        for name in args.cnn.split(","):
            torch.manual_seed(0)
            cnn = strip_classifier(build_cnn(name)).to(device).eval()
            pixels = torch.randn(args.batch_size, 3, 224, 224, device=device)
            with torch.no_grad():
                cnn(pixels[:2])  # warm-up
                start = time.perf_counter()
                for _ in range(max(1, args.n // args.batch_size)):
                    cnn(pixels)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            done = max(1, args.n // args.batch_size) * args.batch_size
            print(f"{name:9s} CNN alone (224 px, batch {args.batch_size})       "
                  f"{done / (time.perf_counter() - start):8.1f} images/s")
            for workers in map(int, args.workers.split(",")):
                out = tmp / f"out_{name}_{workers}"
                start = time.perf_counter()
                write_feature_cache(tmp / "train.csv", out, cnn, cnn_type=name, splits=["train"],
                                    batch_size=args.batch_size, workers=workers, device=device)
                seconds = time.perf_counter() - start
                print(f"{name:9s} cocos data features, {workers} workers, {args.n} images "
                      f"{args.n / seconds:8.1f} images/s  (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
