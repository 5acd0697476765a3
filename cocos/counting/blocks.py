"""One big batch counted under a memory budget: its queries in blocks of rows, each block against all candidates,
no ``B x M`` matrix held whole.

A whole count of a ``B x M`` batch holds temporaries of about :data:`ENTRY_BYTES` per (query, candidate) pair and
positive (float32; measured at 8192 x 8192: 4 GB). Where that passes ``budget`` (default :data:`BLOCK_BUDGET`)
and the counter allows it in both directions (:meth:`cocos.losses.counts.Counter.blocks`: every per-query value a
function of the query's own row), :func:`count_batch_values` normalises the embeddings once (as
:func:`~cocos.data.layout.batch_similarity` does: the same checks, the same bits) and counts ``rows`` queries at a
time: each block computes its own rows of the similarity (:func:`block_similarity`: i2t, a block of images against
all captions; t2i, a block of captions against all images) and its own rows of the positive and negative masks
(:func:`block_masks`, the layout's masks restricted to the block's rows), :meth:`Counter.count` counts the block's
:class:`~cocos.data.layout.QueryView`, and its per-query values are copied into tensors made before the first block.
The batch values come from those as the counter computes them (:meth:`Counter.batch_of`). Peak memory is
``O(rows x M)`` (the block's similarity, masks and the counter's temporaries) plus the embeddings and the
``O(B + M)`` per-query values; the budget sets ``rows``. Counters that do not say they may be blocked (a plugin's,
a whole-batch callable's, IMC's intra-modal terms, the published Triplet t2i grouping by negative image and SmoothAP
t2i layout) are counted whole, as are stacks of batches (inputs of more than two dimensions, ``image_ids`` with
leading dimensions).

**Bits.** The result is the whole count's (:func:`cocos.counting.count_queries`) where each block's similarity
rows are the bits of the same rows of the whole product ``I Cᵀ``. A BLAS computes a row of a product the same way
whatever the other rows only for some shapes: with MKL (torch's CPU build) in float32, a product of 1, 2, 3, 5, 6,
7, 9, 10 or 11 rows may round differently from the same rows of a larger one (another kernel), products of a
multiple of 4 rows do not. So every block's product has exactly ``rows`` rows, a multiple of :data:`ROW_ALIGN`
(the last block takes the ``rows`` rows that end the batch and keeps its own): measured bit for bit against the
whole product for batches of 300 to 4,096 rows, d from 3 to 1,024, with 1 to 32 threads, and for every batch size
with 1 or 2 threads (with 3 or more threads MKL splits a product of under ~50 rows differently by shape). Where
that does not hold, the similarities differ by float rounding (about 1e-7 of a value in float32), and a count
changes only where a value lies within that rounding of its threshold: float64 (MKL's dgemm rounds a block of
rows differently from the whole for many shapes; about 1e-16), CUDA (cuBLAS chooses its kernels by shape) and
other BLAS libraries.

SmoothAP's float32 sigmoid may round an element in the scalar tail of torch's vectorised loop differently in a
block than in the whole (:func:`cocos.losses.kernels.vectorised_whole`): its threshold-free companions then differ
at float32 rounding (1e-7 relative), and a count changes only where a weight lies within that rounding of ``eps``.
"""

from __future__ import annotations

import torch

from cocos.counting import count_queries, get_counter
from cocos.data.layout import DIRECTIONS, BatchLayout, QueryView, unit_rows
from cocos.losses.counts import Counter

BLOCK_BUDGET = 256 * 2**20  # bytes of counting temporaries above which a batch is counted in blocks of queries
ENTRY_BYTES = 64  # temporaries per (query, candidate) pair and positive of a float32 count, measured at 8192 x 8192
ROW_ALIGN = 4  # rows of every block's similarity product: a multiple of this (module docstring, "Bits")


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
    counter allows it (module docstring): each block computes its own similarity rows and masks."""
    budget = BLOCK_BUDGET if budget is None else int(budget)
    counter = get_counter(loss, **params)
    images = torch.as_tensor(images)
    captions = torch.as_tensor(captions, device=images.device)
    itemsize = 8 if torch.float64 in (images.dtype, captions.dtype) else 4
    whole = whole_bytes(len(images), len(captions), caption_image, itemsize)
    one_batch = images.ndim == 2 and captions.ndim == 2 and (image_ids is None or torch.as_tensor(image_ids).ndim == 1)
    if whole <= budget or not one_batch or not all(counter.blocks(d, compat) for d in DIRECTIONS):
        counts = count_queries(images, captions, loss, compat=compat, caption_image=caption_image,
                               image_ids=image_ids, **params)
        return {d: dict(c.batch) for d, c in counts.items()}
    images, captions = unit_rows(images, captions)
    layout = BatchLayout.build(len(images), len(captions), caption_image, image_ids, device=images.device)
    per_row = max(1, whole // (len(images) * len(captions)))  # bytes per candidate of a query row
    out = {}
    with torch.no_grad():  # closed-form counters: no autograd graph through the blocks
        for d in DIRECTIONS:
            queries, candidates = (images, captions) if d == "i2t" else (captions, images)
            rows = block_rows(budget // (per_row * len(candidates)), len(queries))
            out[d] = _count_direction(counter, queries, candidates, layout, d, compat, rows)
    return out


def block_rows(rows: int, n_queries: int) -> int:
    """Rows of every block of a direction's ``n_queries`` queries: ``rows`` (what the budget allows) rounded down to
    a multiple of :data:`ROW_ALIGN` (at least that), or all the queries where they are fewer."""
    return min(n_queries, max(ROW_ALIGN, rows - rows % ROW_ALIGN))


def block_similarity(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """``(rows, K)`` similarities of a block of unit query rows with all unit candidates: i2t, images against
    captions (rows of ``I Cᵀ``); t2i, captions against images (rows of ``(I Cᵀ)ᵀ``)."""
    return queries @ candidates.T


def block_masks(layout: BatchLayout, direction: str, compat: bool, a: int, b: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pos, neg)`` of queries ``a:b`` of one direction (``(b - a, K)`` bool each): the rows ``a:b`` of
    ``layout.masks(direction, compat)``, computed from the layout's parts without its full masks. Positives: i2t,
    the captions of the image row; t2i, the caption's image row. Negatives: every other candidate but, outside
    compat mode, the same-image pairs (a candidate whose image row holds the query's dataset image)."""
    cap_img = layout.caption_image
    device = cap_img.device
    if direction == "i2t":
        query_rows, candidate_rows = torch.arange(a, b, device=device), cap_img
    else:
        query_rows, candidate_rows = cap_img[a:b], torch.arange(layout.n_images, device=device)
    pos = query_rows[:, None] == candidate_rows[None, :]
    if layout.image_ids is None or compat:
        return pos, ~pos
    ids = layout.image_ids
    same = ids[query_rows][:, None] == ids[candidate_rows][None, :]  # the same dataset image (positives too)
    return pos, ~(pos | same)


def _count_direction(counter: Counter, queries: torch.Tensor, candidates: torch.Tensor, layout: BatchLayout,
                     direction: str, compat: bool, rows: int) -> dict[str, torch.Tensor]:
    """The batch values of one direction, counted ``rows`` queries at a time, each block's similarity rows and masks
    computed for it. Every block's product has ``rows`` rows (the last one's window ends at the last query and its
    view keeps its own rows). Each block's per-query values are copied into tensors made at the first block (a
    block leaves nothing behind that would pin the heap)."""
    n_queries = len(queries)
    values: dict[str, torch.Tensor] = {}
    for a in range(0, n_queries, rows):
        b = min(n_queries, a + rows)
        lo = b - rows  # the window of `rows` rows ending at b: a for every block but a shorter last one
        scores = block_similarity(queries[lo:b], candidates)[a - lo:]
        pos, neg = block_masks(layout, direction, compat, a, b)
        view = QueryView(scores=scores, pos=pos, neg=neg, direction=direction, group_size=layout.group_size,
                         compat=compat)
        block = counter.count(view).per_query
        if not values:
            values = {k: torch.empty(n_queries, dtype=v.dtype, device=v.device) for k, v in block.items()}
        for k, v in values.items():
            v[a:b] = block[k]
        del view, block, scores, pos, neg
    return counter.batch_of(values, compat)
