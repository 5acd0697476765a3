"""The counting engine: COCOS statistics per loss and direction.

Public entry point (stable, used by notebooks and by the tests)::

    count_batch(images, captions, loss, *, compat=False, caption_image=None, **params)
        -> {"i2t": {stat: float}, "t2i": {stat: float}}

Statistic names: ``C_q``, ``C_B``, ``C_0`` (Triplet, Triplet SH, SmoothAP),
``C_qv-``, ``W_qv-``, ``W_qv+``, ``W_low`` (NT-Xent), plus the threshold-free
companions ``N_eff``, ``N_invsimpson``, ``top1_share`` and ``n_excluded`` (the
same-image pairs left out of the negatives). ``C_q`` is NaN for a batch where no
query has a gradient.
"""

from __future__ import annotations

from cocos.counting.base import COMPANIONS, DEFAULT_EPS, Count, Counter
from cocos.counting.generic import count_generic
from cocos.counting.ntxent import NTXentCounter
from cocos.counting.smoothap import SmoothAPCounter
from cocos.counting.triplet import TripletCounter, TripletSHCounter
from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.errors import CocosError

COUNTERS: dict[str, type[Counter]] = {
    c.name: c for c in (TripletCounter, TripletSHCounter, NTXentCounter, SmoothAPCounter)
}
PARAMS = ("margin", "tau", "eps")


def get_counter(name: str, **params) -> Counter:
    """Build the counter of a loss; parameters it does not use are ignored, ``None`` means default."""
    if name not in COUNTERS:
        raise CocosError(f"unknown loss '{name}' (choose from {', '.join(COUNTERS)})")
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise CocosError(f"unknown parameter {', '.join(unknown)} (use {', '.join(PARAMS)})")
    return COUNTERS[name].create(**params)


def count_queries(
    images, captions, loss: str, *, compat: bool = False, caption_image=None, image_ids=None,
    **params,
) -> dict[str, Count]:
    """Like :func:`count_batch` but returns the :class:`Count` objects with per-query tensors."""
    counter = get_counter(loss, **params)
    scores, layout = batch_similarity(images, captions, caption_image, image_ids)
    return {d: counter.count(layout.view(scores, d, compat), compat=compat) for d in DIRECTIONS}


def count_batch(
    images, captions, loss: str, *, compat: bool = False, caption_image=None, image_ids=None,
    **params,
) -> dict[str, dict[str, float]]:
    """COCOS statistics of one batch, both directions.

    ``images`` ``(B, d)``, ``captions`` ``(M, d)``; caption ``c`` belongs to image
    ``caption_image[c]``, by default ``c // (M // B)``. ``image_ids`` (dataset ids
    of the image rows) marks same-image pairs of a pair batch: negatives with
    ``compat=True``, excluded otherwise. ``params``: ``margin`` (0.2), ``tau``
    (NT-Xent 0.1, SmoothAP 0.01), ``eps`` (0.01). Inputs are normalised inside.
    """
    counts = count_queries(
        images, captions, loss, compat=compat, caption_image=caption_image,
        image_ids=image_ids, **params,
    )
    out = {}
    for direction, c in counts.items():
        stats = {k: float(v) for k, v in c.batch.items()}
        stats["n_excluded"] = float(c.n_excluded)
        out[direction] = stats
    return out


__all__ = [
    "COMPANIONS", "COUNTERS", "DEFAULT_EPS", "DIRECTIONS", "Count", "Counter",
    "count_batch", "count_generic", "count_queries", "get_counter",
]
