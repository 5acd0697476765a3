"""An epoch's batch plan: which training rows each step reads, and which of them this process encodes.

Pair batches (Triplet, Triplet SH, NT-Xent) sample captions, every caption once per epoch; ranking batches
(SmoothAP) sample images with all ``k`` captions, every image once. Only a final batch of a single item is dropped
(nothing to contrast; VSRN's BatchNorm needs two). The order depends only on ``(seed, epoch)``
(:func:`epoch_seed`), so a resumed run equals an uninterrupted one. Under torchrun each rank encodes a contiguous
block of the global batch (:func:`local_rows`).
"""

from __future__ import annotations

import numpy as np

from cocos.data.samplers import pair_batches, ranking_batches
from cocos.distributed import block


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch


def epoch_batches(split, image_captions: np.ndarray, layout: str, batch_size: int, seed: int, epoch: int):
    """The epoch's batches as ``(image rows, caption rows, caption -> image column or None)``."""
    seed = epoch_seed(seed, epoch)
    if layout == "ranking":
        n = split.n_images
        images = ranking_batches(n, min(batch_size, n), seed, drop_last=False)
        if len(images) > 1 and len(images[-1]) == 1:  # a batch of one image: nothing to contrast
            images = images[:-1]
        for img in images:
            yield img, image_captions[img].reshape(-1), None
        return
    caption_image = split.caption_image
    batches = pair_batches(caption_image, min(batch_size, len(caption_image)), seed, drop_last=False)
    if len(batches) > 1 and len(batches[-1][0]) == 1:  # a batch of one caption: nothing to contrast
        batches = batches[:-1]
    for cap, img in batches:
        yield img, cap, np.arange(len(cap))


def is_full(split, layout: str, img: np.ndarray, cap: np.ndarray, batch_size: int) -> bool:
    """Whether a batch has the configured size (counts depend on it; the short final batch is not tracked)."""
    if layout == "ranking":
        return len(img) == min(batch_size, split.n_images)
    return len(cap) == min(batch_size, len(split.caption_image))


def local_rows(layout: str, img: np.ndarray, cap: np.ndarray, group, least: int) -> tuple[np.ndarray, np.ndarray,
                                                                                         bool]:
    """This rank's contiguous block of the global batch (images and their captions), and whether it is split. A
    batch with fewer than ``least`` items per process (a model with BatchNorm needs two) is not split: every
    rank computes all of it."""
    if layout == "ranking":
        if not group.active or len(img) < least * group.world:
            return img, cap, False
        rows, k = block(len(img), group), len(cap) // len(img)
        return img[rows.start:rows.stop], cap[rows.start * k:rows.stop * k], True
    if not group.active or len(cap) < least * group.world:
        return img, cap, False
    rows = block(len(cap), group)
    return img[rows.start:rows.stop], cap[rows.start:rows.stop], True
