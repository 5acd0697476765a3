"""The counting engine: COCOS statistics per loss and direction.

Public entry points (stable, used by notebooks and by the tests)::

    count_batch(images, captions, loss, *, compat=False, caption_image=None, image_ids=None, **params)
        -> {"i2t": {stat: float}, "t2i": {stat: float}}
    count_embeddings(EmbeddingSet.from_arrays(images, captions), losses=[...], ...) -> CountRun

``loss`` is a registered name (:mod:`cocos.objectives`), an ``Objective``, or a
callable ``(images, captions, caption_image=None) -> scalar`` (counted by the generic
autograd counter). Statistic names: ``C_q``, ``C_B``, ``C_0`` (Triplet, Triplet SH,
SmoothAP, generic), ``C_qv-``, ``W_qv-``, ``W_qv+``, ``W_low`` (NT-Xent), plus the
threshold-free companions ``N_eff``, ``N_invsimpson``, ``top1_share`` and
``n_excluded`` (the same-image pairs left out of the negatives). ``C_q`` is NaN for
a batch where no query has a gradient (0 for SmoothAP in compat mode, as published).
"""

from __future__ import annotations

import torch

from cocos.counting import engine
from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.losses.base import intra_similarities
from cocos.losses.counts import COMPANIONS, DEFAULT_EPS, Count, Counter
from cocos.losses.generic import count_generic
from cocos.objectives import resolve


def get_counter(loss, **params) -> Counter:
    """The counter of a loss (name, ``Objective`` or callable); ``None`` parameters take the defaults."""

    return resolve(loss).make_counter(**params)


def count_queries(
    images, captions, loss, *, compat: bool = False, caption_image=None, image_ids=None,
    **params,
) -> dict[str, Count]:
    """Like :func:`count_batch` but returns the :class:`Count` objects with per-query tensors."""
    counter = get_counter(loss, **params)
    scores, layout = batch_similarity(images, captions, caption_image, image_ids)
    if getattr(counter, "needs_embeddings", False):  # a whole-batch callable: count its dL/dS
        images = torch.nn.functional.normalize(torch.as_tensor(images).to(scores.dtype), dim=-1)
        captions = torch.nn.functional.normalize(torch.as_tensor(captions).to(scores.dtype), dim=-1)
        scores = counter.gradients(images, captions, caption_image)
    intra = {}
    if getattr(counter, "needs_intra", False):  # e.g. IMC: the queries' intra-modal similarities

        intra = intra_similarities(torch.as_tensor(images).to(scores.dtype), torch.as_tensor(captions).to(scores.dtype))
    return {d: counter.count(layout.view(scores, d, compat, intra=intra.get(d))) for d in DIRECTIONS}


def count_batch(
    images, captions, loss, *, compat: bool = False, caption_image=None, image_ids=None,
    **params,
) -> dict[str, dict[str, float]]:
    """COCOS statistics of one batch, both directions.

    ``images`` ``(B, d)``, ``captions`` ``(M, d)``; caption ``c`` belongs to image
    ``caption_image[c]``, by default ``c // (M // B)``. ``image_ids`` (dataset ids
    of the image rows) marks same-image pairs of a pair batch: negatives with
    ``compat=True``, excluded otherwise. ``params``: the family's (``margin`` 0.2;
    ``tau``: NT-Xent 0.1, SmoothAP 0.01) and ``eps`` (0.01). Inputs are normalised inside.
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


def __getattr__(name):  # the engine's names, imported on first use (it needs pandas)
    if name in ("EmbeddingSet", "CountRun", "count_embeddings"):

        return getattr(engine, name)
    raise AttributeError(name)


__all__ = [
    "COMPANIONS", "DEFAULT_EPS", "DIRECTIONS", "Count", "CountRun", "Counter", "EmbeddingSet",
    "count_batch", "count_embeddings", "count_generic", "count_queries", "get_counter",
]
