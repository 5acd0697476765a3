"""One big batch counted under a memory budget: its queries in blocks of rows, each block against all candidates.

A whole count of a ``B x M`` batch holds temporaries of about :data:`ENTRY_BYTES` per (query, candidate) pair and
positive (float32; measured at 8192 x 8192: 4 GB). Where that passes ``budget`` (default :data:`BLOCK_BUDGET`)
and the counter allows it in both directions (:meth:`cocos.losses.counts.Counter.blocks`: every per-query value a
function of the query's own row), :func:`count_batch_values` computes the batch's similarity matrix and each
direction's masks once, counts ``rows`` queries at a time (:meth:`Counter.count` on the block's
:class:`~cocos.data.layout.QueryView`), copies each block's per-query values into tensors made before the first
block, and computes the batch values from them as the counter does (:meth:`Counter.batch_of`). The result is
the whole count's: the same per-query rows, reduced by the same code. Counters that do not say they may be
blocked (a plugin's, a whole-batch callable's, IMC's intra-modal terms, the published Triplet t2i grouping by
negative image and SmoothAP t2i layout) are counted whole.

SmoothAP's float32 sigmoid may round an element in the scalar tail of torch's vectorised loop differently in a
block than in the whole (:func:`cocos.losses.kernels.vectorised_whole`): its threshold-free companions then differ
at float32 rounding (1e-7 relative), and a count changes only where a weight lies within that rounding of ``eps``.
"""

from __future__ import annotations

import torch

from cocos.counting import count_queries, get_counter
from cocos.data.layout import DIRECTIONS, BatchLayout, QueryView, batch_similarity
from cocos.losses.counts import Counter

BLOCK_BUDGET = 256 * 2**20  # bytes of counting temporaries above which a batch is counted in blocks of queries
ENTRY_BYTES = 64  # temporaries per (query, candidate) pair and positive of a float32 count, measured at 8192 x 8192


def whole_bytes(n_images: int, n_captions: int, caption_image, itemsize: int) -> int:
    """Bytes of temporaries a whole count of the batch needs (:data:`ENTRY_BYTES` per pair and positive)."""
    k = -(-n_captions // n_images)  # positives per image query: on average, or the most any image has
    if caption_image is not None and n_captions != n_images:
        try:
            k = max(k, int(torch.bincount(torch.as_tensor(caption_image).reshape(-1).long().cpu()).max()))
        except (RuntimeError, TypeError, ValueError):  # not image rows: the count refuses it in one line
            pass
    return n_images * n_captions * k * ENTRY_BYTES * itemsize // 4


def count_batch_values(images, captions, loss, *, compat: bool = False, caption_image=None, image_ids=None,
                       budget: int | None = None, **params) -> dict[str, dict[str, torch.Tensor]]:
    """``{direction: {stat: batch value}}`` of one batch: ``count_queries(...)[d].batch``, counted in blocks of
    query rows where the whole count would need more than ``budget`` bytes (default :data:`BLOCK_BUDGET`) and the
    counter allows it (module docstring)."""
    budget = BLOCK_BUDGET if budget is None else int(budget)
    counter = get_counter(loss, **params)
    images = torch.as_tensor(images)
    captions = torch.as_tensor(captions, device=images.device)
    itemsize = 8 if torch.float64 in (images.dtype, captions.dtype) else 4
    whole = whole_bytes(len(images), len(captions), caption_image, itemsize)
    if whole <= budget or not all(counter.blocks(d, compat) for d in DIRECTIONS):
        counts = count_queries(images, captions, loss, compat=compat, caption_image=caption_image,
                               image_ids=image_ids, **params)
        return {d: dict(c.batch) for d, c in counts.items()}
    scores, layout = batch_similarity(images, captions, caption_image, image_ids)
    per_row = max(1, whole // (len(images) * len(captions)))  # bytes per candidate of a query row
    return {d: _count_direction(counter, scores, layout, d, compat, max(1, budget // (per_row * (
        layout.n_captions if d == "i2t" else layout.n_images)))) for d in DIRECTIONS}


def _count_direction(counter: Counter, scores: torch.Tensor, layout: BatchLayout, direction: str, compat: bool,
                     rows: int) -> dict[str, torch.Tensor]:
    """The batch values of one direction, counted ``rows`` queries at a time. Each block's per-query values are
    copied into tensors made at the first block (a block leaves nothing behind that would pin the heap)."""
    # a layout of its own: its cached masks go when the direction is done
    lay = BatchLayout.build(layout.n_images, layout.n_captions, layout.caption_image, layout.image_ids)
    pos, neg = lay.masks(direction, compat)
    oriented = scores if direction == "i2t" else scores.T
    n_queries = pos.shape[0]
    values: dict[str, torch.Tensor] = {}
    for a in range(0, n_queries, rows):
        view = QueryView(scores=oriented[a:a + rows].contiguous(), pos=pos[a:a + rows], neg=neg[a:a + rows],
                         direction=direction, group_size=lay.group_size, compat=compat)
        block = counter.count(view).per_query
        if not values:
            values = {k: torch.empty(n_queries, dtype=v.dtype, device=v.device) for k, v in block.items()}
        for k, v in values.items():
            v[a:a + rows] = block[k]
        del view, block
    return counter.batch_of(values, compat)
