"""Benchmark: the cost of COCOS tracking (``cocos.track.Tracker``, ``cocos train --track-cocos N``).

Two parts.

**Track length** (default): the cost of one counted observation (counting and writing ``cocos_track.csv``)
against the length of the track: 100, 1,000, 10,000 and 100,000 counted steps. The track is prefilled (the
rows of N counted steps restored, written once, untimed), then ``--observations`` observations of a batch of
``--batch`` pairs (d = ``--dim``, the paper's pair counters: Triplet, Triplet SH, NT-Xent) are timed one by
one, as ``autoflush`` runs them: the counting (``observe``) and the writing (``flush``: the rows appended to
the CSV, the unchanged json left alone) timed apart, the tracks taking turns; medians, ``--threads 1``. For
comparison, one rewrite of the whole CSV and json (what each observation wrote before rows were appended) is
timed at each length (``--rewrites`` times). Results go to ``--out`` (``benchmarks/results/track_length.json``).

**Training overhead** (``--train``): the same training steps (same seed, same batches) timed with and
without ``--track-cocos N``, alternately, best of ``--repeats``; the overhead is
``(t_tracked - t_plain) / t_plain``; one observation (the counters on one batch's embeddings) timed on its
own gives the overhead at any N: ``t_observe / (N * t_step)``. Settings: VSE++ at the paper's sizes (2048-d
features, embed 1024, word 300, batch 128) with Triplet SH (pair batches) and SmoothAP (ranking batches of 128
images x 640 captions: all four counters), and the ``cocos demo`` model (embed 256, word 128) with Triplet SH.

    python benchmarks/bench_track.py [--quick] [--lengths 100,1000,10000,100000] [--batch 32] [--out PATH]
    python benchmarks/bench_track.py --train [--steps 40] [--repeats 3] [--every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "track_length.json"
LOSSES = "triplet,triplet_sh,ntxent"


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch "
            f"{torch.__version__}, CPU, load {os.getloadavg()[0]:.1f}")


# ---------------------------------------------------------------------- track length


def prefilled(folder: Path, length: int, rows_of_one: list[tuple]):
    """A Tracker (``every=1``, rows written at :meth:`flush`) whose track already holds ``length`` counted steps
    (written once, untimed)."""
    from cocos.track import Tracker

    tracker = Tracker(folder, every=1, losses=LOSSES, overwrite=True, autoflush=False)
    if length:
        rows = [(s, 1, *r[2:]) for s in range(1, length + 1) for r in rows_of_one]
        tracker.restore(pd.DataFrame(rows, columns=["step", "epoch", "loss", "direction", "stat", "value"]))
        tracker.flush()
    return tracker


def time_lengths(tmp: Path, lengths: list[int], batches: list, rows_of_one: list, rewrites: int) -> list[dict]:
    """Median seconds of one observation at a track of each length, as ``autoflush`` makes it: the counting
    (:meth:`observe`) and the writing (:meth:`flush`: the rows appended, the json unchanged) timed apart, the
    tracks taking turns (a shared machine's drifts hit every length alike); and of one whole rewrite of the CSV
    and the json (what each observation wrote before rows were appended)."""
    from cocos.io import write_json

    trackers = [prefilled(tmp / f"len{length}", length, rows_of_one) for length in lengths]
    t_count, t_write = [[] for _ in lengths], [[] for _ in lengths]
    for i, (img, cap) in enumerate(batches):
        for j in [(i + k) % len(lengths) for k in range(len(lengths))]:  # a rotating order
            start = time.perf_counter()
            assert trackers[j].observe(lengths[j] + 1 + i, img, cap)
            middle = time.perf_counter()
            trackers[j].flush()
            t_count[j].append(middle - start)
            t_write[j].append(time.perf_counter() - middle)
    results = []
    for j, (length, tracker) in enumerate(zip(lengths, trackers, strict=True)):
        t_rewrite = []
        for _ in range(rewrites):
            start = time.perf_counter()
            tracker.write(tmp / f"len{length}" / "rewrite.csv")
            write_json(tmp / f"len{length}" / "rewrite.json", tracker.meta())
            t_rewrite.append(time.perf_counter() - start)
        tracker.close()
        count, write = statistics.median(t_count[j]), statistics.median(t_write[j])
        results.append({"length": length, "rows": len(tracker.rows), "csv_bytes": tracker.path.stat().st_size,
                        "observe_s": count + write, "count_s": count, "write_s": write,
                        "rewrite_s": statistics.median(t_rewrite) if t_rewrite else None})
    return results


def run_lengths(args) -> None:
    from cocos.track import Tracker

    lengths = [int(n) for n in args.lengths.split(",")]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batches = [(torch.randn(args.batch, args.dim), torch.randn(args.batch, args.dim))
               for _ in range(args.observations)]
    one = Tracker(every=1, losses=LOSSES)
    one.observe(1, *batches[0])
    rows_of_one = one.rows
    print(f"machine: {machine()}")
    print(f"batch {args.batch} pairs, d = {args.dim}, counters {LOSSES} ({len(rows_of_one)} rows per step); "
          f"{args.observations} observations per length, medians")
    print(f"{'counted steps':>14} {'CSV MB':>8} {'observe ms':>11} {'count ms':>9} {'write ms':>9} "
          f"{'whole rewrite ms':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        results = time_lengths(Path(tmp), lengths, batches, rows_of_one, args.rewrites)
    for r in results:
        rewrite = f"{1000 * r['rewrite_s']:17.1f}" if r["rewrite_s"] is not None else f"{'-':>17}"
        print(f"{r['length']:14,d} {r['csv_bytes'] / 2**20:8.1f} {1000 * r['observe_s']:11.2f} "
              f"{1000 * r['count_s']:9.2f} {1000 * r['write_s']:9.3f} {rewrite}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"machine": machine(), "batch": args.batch, "dim": args.dim, "losses": LOSSES,
           "observations": args.observations, "mode": "quick" if args.quick else "full", "results": results}
    out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


# ---------------------------------------------------------------------- training overhead

SETTINGS = (
    ("paper VSE++, Triplet SH", dict(loss="triplet_sh", embed_size=1024, word_dim=300), 2048),
    ("paper VSE++, SmoothAP", dict(loss="smoothap", embed_size=1024, word_dim=300), 2048),
    ("demo VSE++, Triplet SH", dict(loss="triplet_sh", embed_size=256, word_dim=128), 64),
)


def _trainer(data: Path, out: Path, track: int | None, **kw):
    from cocos.training.trainer import TrainConfig, Trainer

    cfg = TrainConfig.of(data=str(data), out=str(out), device="cpu", batch_size=128, track_cocos=track, seed=0, **kw)
    return Trainer(cfg, overwrite=True, progress=False, log=lambda *a: None)


def _tracker(trainer):
    from cocos.training.hooks import TrackHook

    return next(h.tracker for h in trainer.hooks if isinstance(h, TrackHook))


def time_steps(trainer, batches) -> float:
    trainer.model.train()
    start = time.perf_counter()
    for img, cap, caption_image in batches:
        trainer.step(img, cap, caption_image, epoch=1)
    return time.perf_counter() - start


def time_observe(trainer, batch, repeats: int = 10) -> float:
    """Seconds per tracking observation: the run's counters on one batch's (already computed) embeddings."""
    from cocos.data.text import pad_batch
    from cocos.track import Tracker

    img, cap, caption_image = batch
    with torch.no_grad():
        feats = trainer.train_split.features_for(img)
        tokens, lengths = pad_batch([trainer.train_ids[c] for c in cap])
        img_emb, cap_emb = trainer.model(feats, tokens, lengths)
    ids = torch.as_tensor(img)
    run = _tracker(trainer)
    tracker = Tracker(every=1, losses=list(run.losses), params={n: p for n, p in run.losses.items() if p})
    tracker.observe(1, img_emb, cap_emb, caption_image, image_ids=ids)  # warm-up
    best = float("inf")
    for step in range(2, repeats + 2):
        start = time.perf_counter()
        tracker.observe(step, img_emb, cap_emb, caption_image, image_ids=ids)
        best = min(best, time.perf_counter() - start)
    return best


def run_train(args) -> None:
    from cocos.data.synth import make_synthetic

    print(f"machine: {machine()}; {args.steps} steps, N = {args.every}, best of {args.repeats}")
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
                _tracker(tracked).restore(pd.DataFrame(columns=["step", "epoch", "loss", "direction", "stat",
                                                                "value"]))
                _tracker(tracked)._last = (0, 0)
                t_plain = min(t_plain, time_steps(plain, batches[1:]))
                t_tracked = min(t_tracked, time_steps(tracked, batches[1:]))
            step = t_plain / args.steps
            observe = time_observe(tracked, batches[0])
            counters = ", ".join(_tracker(tracked).losses)
            overhead = 100 * (t_tracked - t_plain) / t_plain
            print(f"{name:<24} step {step * 1000:7.1f} ms | tracked run {overhead:+5.1f} % "
                  f"| one observation {observe * 1000:6.1f} ms ({counters}) = "
                  f"{100 * observe / (args.every * step):.2f} % of step time at N = {args.every}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="lengths 100,1000,10000 and 50 observations each")
    parser.add_argument("--lengths", default="100,1000,10000,100000", help="counted steps already in the track")
    parser.add_argument("--batch", type=int, default=32, help="pairs per batch")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--observations", type=int, default=300, help="timed observations per length")
    parser.add_argument("--rewrites", type=int, default=3, help="timed whole rewrites per length")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the track-length part")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--train", action="store_true", help="the training overhead instead (see above)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.observations = "100,1000,10000", 50
    run_train(args) if args.train else run_lengths(args)


if __name__ == "__main__":
    main()
