"""Benchmark of training VSE++ on raw images (``cocos train --data IMAGES``): images/s of training steps.

On Flickr30k-sized JPEGs (500 x 375, quality 90; one caption each, so every row of a batch is a
distinct image to decode, the worst case for the loader), ResNet-18 at a 224-px and a small crop,
frozen (``--cnn-weights``) and fine-tuned, with 0, 1 and 2 DataLoader workers. For each setting:

* ``decode``: the loader alone (open + RandomResizedCrop + flip + normalise of the epoch's batches,
  in the main process): what decoding costs per image;
* ``model``: the training steps alone, on pixels decoded beforehand: what the model costs;
* ``epoch w=N``: the real epoch (``Trainer.train_epoch``) with N workers.

Each figure is the best of ``--repeats`` timings (the machine may be shared).

``waits`` is the share of the epoch the training loop spent waiting for pixels (measured in the
same run, so it does not depend on how busy a shared machine is). Decoding is not the
bottleneck when it is small: the workers decode the next batches while the model trains
(with ``w=0`` decoding and training add up).

    python benchmarks/bench_train_images.py [--n 48] [--batch-size 16] [--sizes 224,64] [--workers 0,1,2]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from cocos.models.cnn import build_cnn
from cocos.training.trainer import TrainConfig, Trainer


def _flickr_like(folder: Path, n: int) -> None:
    """``n`` 500 x 375 JPEGs of smooth random content, one caption each, as train.csv and dev.csv."""
    rng = np.random.default_rng(0)
    (folder / "images").mkdir()
    rows = ["image,caption"]
    words = ["a", "red", "blue", "dog", "cat", "on", "the", "grass", "runs", "sits"]
    for i in range(n):
        small = rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)
        Image.fromarray(small).resize((500, 375), Image.BICUBIC).save(folder / "images" / f"{i}.jpg", "JPEG",
                                                                      quality=90)
        rows.append(f"images/{i}.jpg,{' '.join(rng.choice(words, 8))}")
    (folder / "train.csv").write_text("\n".join(rows) + "\n")
    (folder / "dev.csv").write_text("\n".join(rows[:9]) + "\n")


def _trainer(data: Path, out: Path, crop: int, finetune: bool, weights: Path, batch: int, workers: int) -> Trainer:
    cfg = TrainConfig.of(data=str(data), out=str(out), k=1, epochs=1, batch_size=batch, embed_size=1024, word_dim=300,
                      vocab_threshold=1, cnn="resnet18", finetune=finetune, crop_size=crop, workers=workers,
                      cnn_weights=None if finetune else str(weights), device="cpu")
    return Trainer(cfg, progress=False, log=lambda *a: None)


def _best(repeats: int, run) -> float:
    """The shortest of ``repeats`` timings of ``run()`` (the machine is shared: the best is the least disturbed)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _setting(data: Path, tmp: Path, crop: int, finetune: bool, weights: Path, args) -> str:
    trainer = _trainer(data, tmp / "out", crop, finetune, weights, args.batch_size, 0)
    batches = list(trainer.batches(1))
    n = sum(len(cap) for _, cap, _ in batches)
    decode = n / _best(args.repeats, lambda: list(trainer.pixel_batches(1, batches)))
    pixels = list(trainer.pixel_batches(1, batches))
    trainer.model.train()
    trainer.step(*batches[0], epoch=1, pixels=pixels[0])  # warm-up step (allocations, fused Adam)

    def steps():
        for (img, cap, ci), px in zip(batches, pixels, strict=True):
            trainer.step(img, cap, ci, epoch=1, pixels=px)

    model = n / _best(args.repeats, steps)
    kind = "fine-tuned" if finetune else "frozen    "
    row = f"resnet18 {crop:>3} px {kind}  decode {decode:7.1f}  model {model:7.1f}"
    waited = _timed_loader(trainer)
    for workers in args.workers:
        trainer.cfg.data.workers = workers
        waited.clear()
        seconds = _best(args.repeats, lambda: trainer.train_epoch(2))
        share = min(waited) / seconds  # the least-disturbed run's wait over the least-disturbed epoch
        row += f"  epoch w={workers} {n / seconds:7.1f} (waits {100 * share:4.1f}%)"
    return row


def _timed_loader(trainer: Trainer) -> list[float]:
    """Make ``trainer``'s epochs record how long the step loop waited for each epoch's pixels (one total
    per epoch, including the loader's start): the share of the epoch that decoding was not hidden."""
    waited: list[float] = []
    loader = trainer.pixel_batches

    def timed(epoch, batches):
        inner = loader(epoch, batches)

        class Timed:
            def __iter__(self):
                waited.append(0.0)
                start = time.perf_counter()
                it = iter(inner)
                waited[-1] += time.perf_counter() - start
                while True:
                    start = time.perf_counter()
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                    finally:
                        waited[-1] += time.perf_counter() - start
                    yield item

        return Timed()

    trainer.pixel_batches = timed
    return waited


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=48, help="training images (one caption each)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sizes", default="224,64")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--repeats", type=int, default=3, help="each timing is the best of this many")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    args = ap.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    torch.set_num_threads(args.threads)  # 2 threads on a busy 2-core machine wait for each other
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print(f"{args.n} JPEGs of 500 x 375, batch {args.batch_size}; images/s (one image per caption)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "data").mkdir()
        _flickr_like(tmp / "data", args.n)
        weights = tmp / "resnet18.pth"
        torch.save(build_cnn("resnet18").state_dict(), weights)
        for crop in (int(s) for s in args.sizes.split(",")):
            for finetune in (False, True):
                print(_setting(tmp / "data", tmp, crop, finetune, weights, args), flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
