"""Counting over a whole set of frozen embeddings.

With a frozen model every item's embedding is independent of the batch, so the
training set is encoded once and batches are formed from the cache. Pair batches
(Triplet, Triplet SH, NT-Xent) sample captions; ranking batches (SmoothAP) sample
images with all their captions (:mod:`cocos.data.samplers`, seeded; the final
short batch is dropped so that every batch has ``batch_size`` images). Many
batches are stacked and counted in one tensor operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from cocos.counting import COUNTERS, DIRECTIONS, get_counter
from cocos.counting.aggregate import summarise_tree
from cocos.data.layout import BatchLayout, _check_embeddings
from cocos.data.samplers import pair_batches, ranking_batches
from cocos.errors import CocosError, check_params
from cocos.losses import LOSSES
from cocos.progress import progress_bar

DEFAULT_SWEEP = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


@dataclass
class EmbeddingSet:
    """Normalised image and caption embeddings with the caption -> image map."""

    images: torch.Tensor  # (N, d)
    captions: torch.Tensor  # (Nc, d)
    caption_image: np.ndarray  # (Nc,) image index of each caption

    @classmethod
    def from_arrays(cls, images, captions, caption_image=None, device="cpu") -> EmbeddingSet:
        for name, arr in (("images", images), ("captions", captions)):
            kind = arr.dtype.kind if isinstance(arr, np.ndarray) else "f"
            if kind not in "iuf":
                raise CocosError(f"{name} must hold numbers, got dtype {arr.dtype}")
        images = torch.as_tensor(np.asarray(images) if not torch.is_tensor(images) else images)
        captions = torch.as_tensor(np.asarray(captions) if not torch.is_tensor(captions) else captions)
        _check_embeddings(images, captions)
        if images.ndim != 2 or captions.ndim != 2:
            raise CocosError(
                f"expected images (N, d) and captions (M, d), got {tuple(images.shape)} "
                f"and {tuple(captions.shape)}"
            )
        n, m = images.shape[0], captions.shape[0]
        if caption_image is None:
            if m % n:
                raise CocosError(
                    f"{m} captions is not a multiple of {n} images; "
                    "provide a caption_image array"
                )
            caption_image = np.arange(m) // (m // n)
        caption_image = np.asarray(caption_image)
        if caption_image.shape != (m,) or not np.issubdtype(caption_image.dtype, np.integer):
            raise CocosError(f"caption_image must be {m} integers, got {caption_image.shape} "
                             f"of {caption_image.dtype}")
        if m and (caption_image.min() < 0 or caption_image.max() >= n):
            raise CocosError(f"caption_image values must lie in [0, {n})")
        dtype = images.dtype if images.dtype in (torch.float32, torch.float64) else torch.float32
        norm = torch.nn.functional.normalize
        return cls(
            images=norm(images.to(device=device, dtype=dtype), dim=-1),
            captions=norm(captions.to(device=device, dtype=dtype), dim=-1),
            caption_image=caption_image.astype(np.int64),
        )

    @property
    def n_images(self) -> int:
        return int(self.images.shape[0])

    def image_captions(self) -> np.ndarray:
        """``(N, k)`` caption indices per image; every image must have the same number."""
        counts = np.bincount(self.caption_image, minlength=self.n_images)
        if counts.min() != counts.max():
            raise CocosError(
                "ranking batches (SmoothAP) need the same number of captions for every image; "
                f"found between {counts.min()} and {counts.max()}"
            )
        order = np.argsort(self.caption_image, kind="stable")
        return order.reshape(self.n_images, counts[0])


@dataclass
class CountRun:
    """Per-batch statistics (and per-query values) of a sweep over an embedding set."""

    batch_stats: dict = field(default_factory=dict)  # loss -> dir -> stat -> (n_batches,)
    per_query: dict = field(default_factory=dict)  # loss -> dir -> stat -> (n_queries,)
    sweep: dict = field(default_factory=dict)  # loss -> dir -> eps -> stat -> (n_batches,)
    n_batches: dict = field(default_factory=dict)  # "pair" / "ranking" -> int
    params: dict = field(default_factory=dict)  # loss -> counter params

    def summary(self) -> dict:
        return summarise_tree(self.batch_stats)

    def sweep_summary(self) -> dict:
        return summarise_tree(self.sweep)


def _append(tree: dict, keys: tuple, values: dict) -> None:
    node = tree
    for key in keys:
        node = node.setdefault(key, {})
    for stat, v in values.items():
        node.setdefault(stat, []).append(v.detach().to("cpu", torch.float64).numpy().reshape(-1))


def _concat(tree):
    if isinstance(tree, dict):
        return {k: _concat(v) for k, v in tree.items()}
    return np.concatenate(tree)


# Statistics that are undefined for some batches (no query with a gradient, no weight on any negative).
MAY_BE_UNDEFINED = ("C_q", "N_eff", "N_invsimpson", "top1_share")


def _check_defined(batch_stats: dict) -> None:
    """Any other NaN is a numerical failure, not a skipped batch: say so instead of averaging it away."""
    for loss, by_dir in batch_stats.items():
        for d, stats in by_dir.items():
            for stat, values in stats.items():
                if stat not in MAY_BE_UNDEFINED and np.isnan(values).any():
                    batch = int(np.flatnonzero(np.isnan(values))[0])
                    raise CocosError(f"{loss} {d} {stat} is not a number in batch {batch}")


def count_embeddings(
    emb: EmbeddingSet,
    losses=tuple(COUNTERS),
    *,
    batch_size: int = 128,
    seed: int = 0,
    compat: bool = False,
    params: dict | None = None,
    sweep_eps=None,
    keep_per_query: bool = True,
    chunk: int = 32,
    progress: bool = False,
) -> CountRun:
    """Count every loss in ``losses`` on seeded batches of ``emb``, both directions.

    ``params`` maps a loss name to its counter parameters (``margin``, ``tau``,
    ``eps``). ``sweep_eps``: thresholds for the eps sweep of the counters that use
    one. Returns a :class:`CountRun`; ``run.summary()`` gives mean/std/n per stat.
    """
    params = params or {}
    losses = list(losses)
    if sweep_eps is not None:
        for e in sweep_eps:
            check_params(eps=e)
    for name in losses:
        if name not in COUNTERS:
            raise CocosError(f"unknown loss '{name}' (choose from {', '.join(COUNTERS)})")
    counters = {name: get_counter(name, **params.get(name, {})) for name in losses}
    run = CountRun(params={n: c.params() for n, c in counters.items()})
    groups: dict[str, list[str]] = {}
    for name in losses:
        groups.setdefault(LOSSES[name].batch_layout, []).append(name)

    plans = {}
    if "pair" in groups:
        batches = pair_batches(emb.caption_image, batch_size, seed)
        plans["pair"] = (np.stack([c for c, _ in batches]), np.stack([i for _, i in batches]))
    if "ranking" in groups:
        image_captions = emb.image_captions()
        img = np.stack(ranking_batches(emb.n_images, batch_size, seed))
        plans["ranking"] = (image_captions[img].reshape(len(img), -1), img)
    total = sum(len(p[0]) for p in plans.values())

    device = emb.images.device
    with progress_bar(total, "counting", enabled=progress) as advance:
        for layout_name, (cap_idx, img_idx) in plans.items():
            run.n_batches[layout_name] = len(cap_idx)
            for start in range(0, len(cap_idx), chunk):
                c = torch.as_tensor(cap_idx[start : start + chunk], device=device)
                i = torch.as_tensor(img_idx[start : start + chunk], device=device)
                scores = emb.images[i] @ emb.captions[c].transpose(-1, -2)  # (nb, B, M)
                if layout_name == "pair":
                    layout = BatchLayout.build(batch_size, batch_size,
                                               torch.arange(batch_size, device=device), image_ids=i)
                else:
                    layout = BatchLayout.build(batch_size, c.shape[-1], device=device)
                for d in DIRECTIONS:
                    view = layout.view(scores, d, compat)
                    for name in groups[layout_name]:
                        counter = counters[name]
                        result = counter.count(view, compat=compat)
                        _append(run.batch_stats, (name, d), result.batch)
                        _append(run.batch_stats, (name, d), {"n_excluded": result.n_excluded})
                        if keep_per_query:
                            _append(run.per_query, (name, d), result.per_query)
                        if sweep_eps is not None and counter.uses_eps:
                            for eps, res in counter.sweep(view, sweep_eps, compat=compat).items():
                                _append(run.sweep, (name, d, f"{eps:g}"), res.batch)
                advance(len(c))
    run.batch_stats = _concat(run.batch_stats)
    _check_defined(run.batch_stats)
    run.per_query = _concat(run.per_query)
    run.sweep = _concat(run.sweep)
    return run
