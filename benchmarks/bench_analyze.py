"""Benchmark of the analysis at Flickr30k size.

1. Counting stage: generated embeddings of Flickr30k size (29,000 images,
   145,000 captions, d = 1024), all four losses, both directions, with the
   default batch size 128 (1,132 pair batches, 226 ranking batches). The floor is
   the similarity matmuls alone, timed separately.
2. A whole ``analyze_checkpoint`` on synthetic features of Flickr30k dimensions
   (29,000 x 2048 global features, an untrained VSE++ with the paper's sizes),
   with the share of each stage (encoding, counting in both modes, evaluation).

    python benchmarks/bench_analyze.py [--skip-whole] [--device cpu]
"""

from __future__ import annotations

import argparse
import math
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from cocos.counting.engine import EmbeddingSet, count_embeddings
from cocos.data.samplers import pair_batches, ranking_batches
from cocos.objectives import names as loss_names


def flickr_embeddings(n_images=29_000, k=5, d=1024, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n_images, d, generator=g)
    captions = images.repeat_interleave(k, 0) + 1.5 * torch.randn(n_images * k, d, generator=g)
    return EmbeddingSet.from_arrays(images, captions, device=device)


def matmul_floor(emb: EmbeddingSet, batch_size=128, seed=0, chunk=32) -> float:
    """Time of the batch similarity matmuls alone (what any counter must do at least)."""
    pairs = pair_batches(emb.caption_image, batch_size, seed)
    cap = torch.as_tensor(np.stack([c for c, _ in pairs]))
    img = torch.as_tensor(np.stack([i for _, i in pairs]))
    rimg = torch.as_tensor(np.stack(ranking_batches(emb.n_images, batch_size, seed)))
    rcap = torch.as_tensor(emb.image_captions()[rimg.numpy()].reshape(len(rimg), -1))
    start = time.perf_counter()
    for c_idx, i_idx in ((cap, img), (rcap, rimg)):
        for s in range(0, len(c_idx), chunk):
            emb.images[i_idx[s:s + chunk]] @ emb.captions[c_idx[s:s + chunk]].transpose(-1, -2)
    return time.perf_counter() - start


def counting_stage(device: str, repeat: int) -> None:
    emb = flickr_embeddings(device=device)
    floor = min(matmul_floor(emb) for _ in range(repeat))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run = count_embeddings(emb, loss_names(), batch_size=128, seed=0, keep_per_query=True)
        times.append(time.perf_counter() - start)
    print(f"counting stage: {emb.n_images} images, {emb.captions.shape[0]} captions, d = {emb.images.shape[1]}, "
          f"{run.n_batches['pair']} pair + {run.n_batches['ranking']} ranking batches, 4 losses x 2 directions")
    print(f"  counting (best of {repeat}): {min(times):.2f} s   matmuls alone: {floor:.2f} s   "
          f"ratio {min(times) / floor:.1f}x")


def whole_analyze(device: str) -> None:
    from cocos.data.synth import make_synthetic
    from cocos.pipelines.analyze import analyze_checkpoint
    from cocos.training.checkpoint import save_checkpoint
    from cocos.training.trainer import TrainConfig, Trainer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        data = make_synthetic(tmp / "f30k", n_train=29_000, n_dev=1_000, n_test=1_000, feature_dim=2048, seed=0)
        made = time.perf_counter() - start
        trainer = Trainer(TrainConfig(data=str(data), out=str(tmp / "ckpt"), epochs=1, device=device),
                          progress=False, log=lambda *a: None)
        trainer.out.mkdir(parents=True)
        save_checkpoint(trainer.best_path, trainer.checkpoint({"rsum": math.nan}, full=False))
        start = time.perf_counter()
        analysis = analyze_checkpoint(trainer.best_path, device=device)
        total = time.perf_counter() - start
        print(f"whole analyze: synthetic features of Flickr30k dimensions (29,000 x 2048, generated in {made:.1f} s), "
              f"VSE++ embed 1024 / word 300, 1,000 test images")
        shares = ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f}%)" for k, v in analysis.timings.items())
        print(f"  total {total:.1f} s: {shares}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--skip-whole", action="store_true")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"device {args.device}")
    counting_stage(args.device, args.repeat)
    if not args.skip_whole:
        whole_analyze(args.device)


if __name__ == "__main__":
    main()
