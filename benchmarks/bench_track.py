"""Benchmark: the cost of ``cocos train --track-cocos N`` (COCOS of the training batch every N steps).

For each setting, the same training steps (same seed, same batches) are timed with
and without tracking, alternately, best of ``--repeats``; the overhead is
``(t_tracked - t_plain) / t_plain`` at N = 10. The tracking cost per observation is
also timed on its own (the counters on one batch's embeddings), which gives the
overhead at any N: ``t_observe / (N * t_step)``.

Settings: VSE++ at the paper's sizes (2048-d features, embed 1024, word 300, batch
128) with Triplet SH (pair batches: training loss + Triplet, NT-Xent) and with
SmoothAP (ranking batches of 128 images x 640 captions: all four counters); and
the ``cocos demo`` model (embed 256, word 128) with Triplet SH.

    python benchmarks/bench_track.py [--steps 40] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from cocos.data.synth import make_synthetic

SETTINGS = (
    ("paper VSE++, Triplet SH", dict(loss="triplet_sh", embed_size=1024, word_dim=300), 2048),
    ("paper VSE++, SmoothAP", dict(loss="smoothap", embed_size=1024, word_dim=300), 2048),
    ("demo VSE++, Triplet SH", dict(loss="triplet_sh", embed_size=256, word_dim=128), 64),
)


def _trainer(data: Path, out: Path, track: int | None, **kw):
    from cocos.training.trainer import TrainConfig, Trainer

    cfg = TrainConfig.of(data=str(data), out=str(out), device="cpu", batch_size=128, track_cocos=track, seed=0, **kw)
    return Trainer(cfg, overwrite=True, progress=False, log=lambda *a: None)


def time_steps(trainer, batches) -> float:
    trainer.model.train()
    start = time.perf_counter()
    for img, cap, caption_image in batches:
        trainer.step(img, cap, caption_image, epoch=1)
    return time.perf_counter() - start


def time_observe(trainer, batch, repeats: int = 10) -> float:
    """Seconds per tracking observation: the counters on one batch's (already computed) embeddings."""
    img, cap, caption_image = batch
    from cocos.data.text import pad_batch

    with torch.no_grad():
        feats = trainer.train_split.features_for(img)
        tokens, lengths = pad_batch([trainer.train_ids[c] for c in cap])
        img_emb, cap_emb = trainer.model(feats, tokens, lengths)
    ids = torch.as_tensor(img)
    trainer.tracker.observe(0, 0, img_emb, cap_emb, caption_image, ids)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        trainer.tracker.observe(0, 0, img_emb, cap_emb, caption_image, ids)
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, CPU; "
          f"{args.steps} steps, N = {args.every}, best of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, kw, dim in SETTINGS:
            n_train = (args.steps + 2) * 128 // (1 if kw["loss"] == "smoothap" else 5) + 8
            data = make_synthetic(tmp / f"d{dim}_{kw['loss']}", n_train=n_train, n_dev=8, n_test=8, feature_dim=dim,
                                  seed=0)
            plain = _trainer(data, tmp / "plain", None, **kw)
            tracked = _trainer(data, tmp / "tracked", args.every, **kw)
            batches = list(plain.batches(1))[: args.steps + 1]
            time_steps(plain, batches[:1])
            time_steps(tracked, batches[:1])  # warm-up (and step 1's observation)
            t_plain, t_tracked = float("inf"), float("inf")
            for _ in range(args.repeats):  # alternate, so drifts of a shared machine hit both
                tracked.step_count = 0  # observations at steps 1, N+1, ... of every repeat
                t_plain = min(t_plain, time_steps(plain, batches[1:]))
                t_tracked = min(t_tracked, time_steps(tracked, batches[1:]))
            step = t_plain / args.steps
            observe = time_observe(tracked, batches[0])
            counters = ", ".join(tracked.tracker.losses)
            overhead = 100 * (t_tracked - t_plain) / t_plain
            print(f"{name:<24} step {step * 1000:7.1f} ms | tracked run {overhead:+5.1f} % "
                  f"| one observation {observe * 1000:6.1f} ms ({counters}) = "
                  f"{100 * observe / (args.every * step):.2f} % of step time at N = {args.every}")


if __name__ == "__main__":
    main()
