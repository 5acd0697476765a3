"""Benchmark of image decoding and transforms (the input side of raw-image training and feature extraction).

1. ``open_image`` + ``eval_transform`` (Resize(256) + CenterCrop(224)) and ``train_transform``
   (RandomResizedCrop(224) + flip) on Flickr30k-sized JPEGs (500 x 375, quality 90), images/s
   on one core, and through a DataLoader with 0, 1 and 2 workers.
2. Rendering the demo world (``cocos data synth --images``, 64 x 64 px), images/s.

    python benchmarks/bench_images.py [--n 200]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from cocos.data.images import ImageCaptionDataset, load_image_split
from cocos.data.synth_images import make_synthetic_images
from cocos.data.transforms import eval_transform, train_transform


def _flickr_like(folder: Path, n: int) -> None:
    """``n`` 500 x 375 JPEGs of smooth random content and a CSV file list."""
    rng = np.random.default_rng(0)
    (folder / "images").mkdir()
    rows = ["image,caption"]
    for i in range(n):
        small = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((500, 375), Image.BICUBIC)
        img.save(folder / "images" / f"{i}.jpg", "JPEG", quality=90)
        rows.append(f"images/{i}.jpg,image {i}")
    (folder / "train.csv").write_text("\n".join(rows) + "\n")


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:8.1f} images/s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _flickr_like(tmp, args.n)
        split = load_image_split(tmp, "train")
        start = time.perf_counter()
        for i in range(split.n_images):
            split.image(i)
        print(f"decode only (500 x 375 JPEG)     {_rate(args.n, time.perf_counter() - start)}")
        for name, fn in (("eval", eval_transform), ("train", train_transform)):
            start = time.perf_counter()
            g = torch.Generator().manual_seed(0)
            for i in range(split.n_images):
                fn(split.image(i), g)
            print(f"decode + {name}_transform, 1 core  {_rate(args.n, time.perf_counter() - start)}")
        for workers in (0, 1, 2):
            ds = ImageCaptionDataset(split, functools.partial(train_transform), seed=0)
            loader = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=workers)
            start = time.perf_counter()
            for _ in loader:
                pass
            print(f"DataLoader, train transform, {workers} workers {_rate(args.n, time.perf_counter() - start)}")
        start = time.perf_counter()
        make_synthetic_images(tmp / "world", n_train=args.n, n_dev=1, n_test=1, progress=False)
        print(f"rendering the demo world (64 px) {_rate(args.n + 2, time.perf_counter() - start)}")


if __name__ == "__main__":
    main()
