"""Batch samplers for the two layouts of the definitions file.

* :func:`pair_batches` (Triplet, Triplet SH, NT-Xent): sample *captions* (an epoch
  visits every caption once) and take each caption's image, as VSE++ does. Two
  captions of one image may meet in a batch.
* :func:`ranking_batches` (SmoothAP): sample *images* (an epoch visits every image
  once), each with all its ``k`` captions.

Both are pure functions of ``(size, batch_size, seed)`` returning index arrays, so a
test can rebuild exactly the batches that a run used.
"""

from __future__ import annotations

import numpy as np

from cocos.errors import CocosError


def _permutation(n: int, seed: int) -> np.ndarray:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise CocosError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng(seed).permutation(n)


def _split(order: np.ndarray, batch_size: int, drop_last: bool, unit: str = "items") -> list[np.ndarray]:
    if batch_size < 1:
        raise CocosError(f"batch size must be positive, got {batch_size}")
    if batch_size > len(order):
        raise CocosError(f"batch size {batch_size} is larger than the data ({len(order)} {unit})")
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    return [order[i : i + batch_size] for i in range(0, stop, batch_size)]


def pair_batches(
    caption_image: np.ndarray, batch_size: int, seed: int, drop_last: bool = True
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pair batches: ``[(caption_idx, image_idx), ...]`` with ``image_idx = caption_image[caption_idx]``.

    ``caption_image`` maps every caption of the split to its image. ``drop_last``
    drops the final short batch (counting wants batches of equal size).
    """
    caption_image = np.asarray(caption_image)
    order = _permutation(len(caption_image), seed)
    return [(c, caption_image[c]) for c in _split(order, batch_size, drop_last, "captions for pair batches")]


def ranking_batches(
    n_images: int, batch_size: int, seed: int, drop_last: bool = True
) -> list[np.ndarray]:
    """Ranking batches: ``[image_idx, ...]``; each image comes with all its captions."""
    return _split(_permutation(n_images, seed), batch_size, drop_last, "images for ranking batches")


def regular_image_captions(n_images: int, k: int) -> np.ndarray:
    """``(N, k)`` caption indices for the regular layout where caption ``c`` belongs to image ``c // k``."""
    return np.arange(n_images * k).reshape(n_images, k)
