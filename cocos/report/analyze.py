"""``cocos analyze``: checkpoint -> frozen encoding of the training set -> all counts -> report.

What section 5 of the COCOS paper did by hand: freeze the model at its best
validation checkpoint, walk the training set in random batches (pair batches for
Triplet, Triplet SH and NT-Xent, ranking batches for SmoothAP), count per loss
and direction, and put the counts next to the retrieval scores they explain.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cocos import __version__
from cocos.counting import COUNTERS
from cocos.counting.engine import DEFAULT_SWEEP, CountRun, EmbeddingSet, count_embeddings
from cocos.embed import FrozenModel, save_embeddings
from cocos.errors import CocosError


@dataclass
class Analysis:
    results: dict  # the results.json content (see cocos/report/SCHEMA.md)
    run: CountRun  # per-batch and per-query values of the shown mode
    embeddings: EmbeddingSet  # the training split's frozen embeddings


def counter_params(checkpoint: dict, losses) -> dict:
    """Counter parameters: the paper's defaults, and the training loss's own parameters for its counter."""
    trained = checkpoint["loss"]["name"]
    own = {k: v for k, v in checkpoint["loss"].get("params", {}).items() if k in ("margin", "tau")}
    return {name: (dict(own) if name == trained else {}) for name in losses}


def _clean(tree):
    """NaN -> None so that JSON stays valid; numpy scalars -> Python."""
    if isinstance(tree, dict):
        return {str(k): _clean(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_clean(v) for v in tree]
    if isinstance(tree, (np.floating, float)):
        return None if math.isnan(float(tree)) else float(tree)
    if isinstance(tree, np.integer):
        return int(tree)
    return tree


def analyze_checkpoint(
    checkpoint: str | os.PathLike,
    data: str | os.PathLike | None = None,
    *,
    losses=tuple(COUNTERS),
    batch_size: int = 128,
    seed: int = 0,
    compat: bool = False,
    split: str = "test",
    device: str = "auto",
    eps: float = 0.01,
    sweep_eps=DEFAULT_SWEEP,
    save_embeddings_to: str | os.PathLike | None = None,
    progress: bool = False,
) -> Analysis:
    """Encode the training split once, count every loss both ways (and in the other mode), evaluate."""
    losses = list(losses)
    frozen = FrozenModel.load(checkpoint, data, device)
    ckpt = frozen.checkpoint
    train = frozen.open_split("train")
    emb = frozen.encode(train, progress=progress)
    if save_embeddings_to is not None:
        save_embeddings(save_embeddings_to, emb)
    params = counter_params(ckpt, losses)
    for name in losses:
        if COUNTERS[name].uses_eps:
            params[name]["eps"] = eps
    run = count_embeddings(emb, losses, batch_size=batch_size, seed=seed, compat=compat, params=params,
                           sweep_eps=sweep_eps, progress=progress)
    alt = count_embeddings(emb, losses, batch_size=batch_size, seed=seed, compat=not compat,
                           params=params, keep_per_query=False)
    eval_split = frozen.open_split(split)
    metrics = frozen.evaluate(eval_split, progress=progress)
    data_info = ckpt["data"]
    results = {
        "cocos_version": __version__,
        "checkpoint": {"path": str(checkpoint), "sha256": frozen.sha256(), "epoch": int(ckpt["epoch"])},
        "data": {"path": str(frozen.data_folder), "name": _dataset_name(frozen.data_folder),
                 "fingerprint": data_info["fingerprint"], "k": frozen.k, "split_counted": "train",
                 "n_images": train.n_images, "n_captions": train.n_captions},
        "model": {"kind": ckpt["model"]["kind"], "hparams": ckpt["model"]["hparams"]},
        "training": {"loss": ckpt["loss"]["name"], "params": ckpt["loss"].get("params", {}),
                     "seed": int(ckpt.get("train", {}).get("seed", 0))},
        "counting": {"compat": compat, "seed": seed, "batch_size": batch_size, "n_batches": run.n_batches,
                     "losses": losses, "params": run.params, "eps_sweep": [float(e) for e in sweep_eps]},
        "stats": run.summary(),
        "alt_stats": alt.summary(),
        "sweep": run.sweep_summary(),
        "evaluation": {"split": eval_split.split, "metrics": metrics},
    }
    return Analysis(results=_clean(results), run=run, embeddings=emb)


def _dataset_name(folder: Path) -> str:
    """The dataset's name: ``name`` in a ``synth.json``/``dataset.json`` if present, else the folder name."""
    import json

    for meta in ("dataset.json", "synth.json"):
        path = folder / meta
        if path.is_file():
            try:
                name = json.loads(path.read_text()).get("name")
            except (ValueError, OSError, AttributeError):
                name = None
            if isinstance(name, str) and name:
                return name
    return folder.resolve().name


def check_finite_stats(results: dict) -> None:
    """Every mean that is defined must be finite (the engine already refuses NaN embeddings)."""
    for loss, by_dir in results["stats"].items():
        for d, stats in by_dir.items():
            for stat, entry in stats.items():
                m = entry["mean"]
                if m is not None and not math.isfinite(m):
                    raise CocosError(f"{loss} {d} {stat}: the count is not finite")
