"""Training throughput under load: ``cocos train`` captions/s beside 0, 2, 4 and 8 competing busy processes.

Each cell is a fresh process (OpenMP reads its wait policy once, when torch loads) that builds the ``cocos demo``
model (VSE++ on the demo's synthetic world, Triplet SH, batch 128, embed 256, word 128), takes one warm-up step and
then trains for ``--seconds`` (at least ``--min-steps`` steps), beside N processes that spin
(``while True: pass``). Policies:

- ``cocos``: what ``cocos train`` does by default (``cocos_cli.main.configure_process`` before torch loads, then
  ``cocos.device.set_threads(None)``);
- ``spin-2``: 2 threads, OpenMP's default wait policy (active spinning), the default before this change;
- ``passive-2``: 2 threads, ``OMP_WAIT_POLICY=PASSIVE``;
- ``spin-1``: 1 thread.

The table gives captions/s and the ratio to the same policy's idle speed, and to the idle speed of ``spin-2``.

    python benchmarks/bench_load.py [--loads 0,2,4,8] [--policies cocos,spin-2,passive-2,spin-1] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICIES = {
    "cocos": ({}, None),
    "spin-2": ({"OMP_WAIT_POLICY": "", "COCOS_BENCH_RAW": "1"}, 2),
    "passive-2": ({"OMP_WAIT_POLICY": "PASSIVE", "COCOS_BENCH_RAW": "1"}, 2),
    "spin-1": ({"OMP_WAIT_POLICY": "", "COCOS_BENCH_RAW": "1"}, 1),
    "spin10k-2": ({"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000", "COCOS_BENCH_RAW": "1"}, 2),
    "spin1k-2": ({"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "1000", "COCOS_BENCH_RAW": "1"}, 2),
    "spin100k-2": ({"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "100000", "COCOS_BENCH_RAW": "1"}, 2),
}


def child(data: str, out: str, threads: int | None, seconds: float, min_steps: int) -> None:
    """One cell: the demo model's training steps for ``seconds``; prints a JSON line."""
    if not os.environ.get("COCOS_BENCH_RAW"):  # the "cocos" policy: as the console script starts `cocos train`
        from cocos_cli.main import configure_process

        configure_process(["train"])
    from cocos.device import set_threads
    from cocos.pipelines.demo import DemoConfig, _train_config
    from cocos.training.trainer import Trainer

    n = set_threads(threads)
    cfg = DemoConfig(data=data, checkpoints=out, device="cpu")
    trainer = Trainer(_train_config(cfg, "triplet_sh"), progress=False, log=lambda *a: None)
    trainer.model.train()
    batches = list(trainer.batches(1))
    trainer.step(*batches[0], epoch=1)  # warm-up (epochs count from 1: the demo's run tracks COCOS)
    done, start = 0, time.perf_counter()
    for i, (img, cap, caption_image) in enumerate(batches[1:] * 4):
        trainer.step(img, cap, caption_image, epoch=1)
        done += len(cap)
        if i + 1 >= min_steps and time.perf_counter() - start >= seconds:
            break
    elapsed = time.perf_counter() - start
    print(json.dumps({"captions_per_s": done / elapsed, "threads": n, "seconds": elapsed,
                      "wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}))


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def cell(policy: str, load: int, data: Path, tmp: Path, seconds: float, min_steps: int) -> dict:
    env_extra, threads = POLICIES[policy]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update({k: v for k, v in env_extra.items() if v})
    if "OMP_WAIT_POLICY" in env_extra and not env_extra["OMP_WAIT_POLICY"]:
        env.pop("OMP_WAIT_POLICY", None)
    spinners = busy(load)
    try:
        time.sleep(1.0)  # let the load average see them (the policy may read it)
        out = subprocess.run([sys.executable, __file__, "--child", str(data), str(tmp / f"{policy}-{load}"),
                              str(threads or 0), str(seconds), str(min_steps)], env=env, capture_output=True,
                             text=True, check=True)
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        data, out, threads, seconds, min_steps = sys.argv[2:7]
        child(data, out, int(threads) or None, float(seconds), int(min_steps))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0,2,4,8")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--min-steps", type=int, default=2)
    args = parser.parse_args()
    loads = [int(x) for x in args.loads.split(",")]
    policies = args.policies.split(",")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        from cocos.data.synth import make_synthetic
        from cocos.pipelines.demo import DemoConfig

        cfg = DemoConfig()
        data = make_synthetic(tmp / "synth", n_train=cfg.n_train, n_dev=cfg.n_dev, n_test=cfg.n_test, seed=cfg.seed)
        rates: dict[tuple[str, int], dict] = {}
        for load in loads:  # policies interleaved per load: a drift of the machine's speed hits all alike
            for policy in policies:
                rates[policy, load] = cell(policy, load, data, tmp, args.seconds, args.min_steps)
                r = rates[policy, load]
                print(f"  {policy:<10} beside {load}: {r['captions_per_s']:7.0f} captions/s "
                      f"({r['threads']} threads, {r['seconds']:.1f} s)", flush=True)
    base = rates.get(("spin-2", 0), {}).get("captions_per_s")
    print("\n| policy | " + " | ".join(f"beside {n}" for n in loads) + " |")
    print("| --- | " + " | ".join("--:" for _ in loads) + " |")
    for policy in policies:
        idle = rates[policy, loads[0]]["captions_per_s"]
        cells = []
        for load in loads:
            v = rates[policy, load]["captions_per_s"]
            rel = f" ({v / idle:.2f}× own idle" + (f", {v / base:.2f}× spin-2 idle)" if base else ")")
            cells.append(f"{v:,.0f}{rel}")
        print(f"| {policy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
