"""Benchmark of the bundled trainer on CPU.

1. Training throughput (captions/s) of VSE++ (2048-d global features) and VSRN
   (36 x 2048 region features), Flickr30k dimensions, the paper's sizes (embed
   1024, word 300, batch 128), Triplet SH; timed over a number of training steps
   after a warm-up step.
2. Wall time of training the four demo models (the ``cocos demo`` schedule) on
   the default synthetic world.

    python benchmarks/bench_train.py [--steps 5] [--skip-demo]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from cocos.data.synth import make_synthetic
from cocos.objectives import names as loss_names


def throughput(model: str, regions: bool, steps: int, tmp: Path) -> float:
    from cocos.training.trainer import TrainConfig, Trainer

    data = make_synthetic(tmp / model, n_train=(steps + 1) * 128 // 5 + 8, n_dev=8, n_test=8,
                          feature_dim=2048, n_regions=36, regions=regions, seed=0)
    trainer = Trainer(TrainConfig.of(data=str(data), out=str(tmp / f"{model}_out"), model=model, loss="triplet_sh",
                                  device="cpu"), progress=False, log=lambda *a: None)
    batches = list(trainer.batches(1))
    trainer.model.train()
    trainer.step(*batches[0])  # warm-up
    start = time.perf_counter()
    n = 0
    for img, cap, caption_image in batches[1 : steps + 1]:
        trainer.step(img, cap, caption_image)
        n += len(cap)
    return n / (time.perf_counter() - start)


def demo_training(tmp: Path) -> dict[str, float]:
    from cocos.pipelines.demo import DemoConfig, _train_config
    from cocos.training.trainer import Trainer

    cfg = DemoConfig(data=str(tmp / "synth"), checkpoints=str(tmp / "ck"), device="cpu")
    make_synthetic(cfg.data, n_train=cfg.n_train, n_dev=cfg.n_dev, n_test=cfg.n_test, seed=cfg.seed)
    times = {}
    for loss in loss_names():
        start = time.perf_counter()
        Trainer(_train_config(cfg, loss), progress=False, log=lambda *a: None).fit()
        times[loss] = time.perf_counter() - start
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, CPU")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model, regions, what in (("vsepp", False, "2048-d global"), ("vsrn", True, "36 x 2048 regions")):
            rate = throughput(model, regions, args.steps, tmp)
            print(f"{model:<6} ({what}), embed 1024, word 300, batch 128, Triplet SH: {rate:,.0f} captions/s "
                  f"(a Flickr30k epoch of 145,000 captions: {145_000 / rate / 60:.1f} min)")
        if not args.skip_demo:
            times = demo_training(tmp)
            parts = ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
            print(f"demo training (cocos demo schedule, 4 models): {sum(times.values()):.0f} s ({parts})")


if __name__ == "__main__":
    main()
