"""COCOS of the batch the loss sees under torch.distributed: the parts every rank observes, joined into the global
batch (``Tracker(batch="global")``), and open_clip's ``local_loss`` (``batch="local"``: each rank's queries against
every rank's candidates, :func:`count_local`). The :class:`~cocos.training.track.Tracker` gathers the parts with
:func:`cocos.distributed.gather_blocks`/``gather_rows``; this module holds what it checks and counts of them.
"""

from __future__ import annotations

import numpy as np
import torch

from cocos.counting import get_counter
from cocos.counting.blocks import BLOCK_BUDGET, whole_bytes
from cocos.data.layout import DIRECTIONS, QueryView, batch_similarity
from cocos.errors import CocosError

BATCHES = ("global", "local", "given")  # what a Tracker counts under torch.distributed (Tracker's ``batch``)

# ---------------------------------------------------------------------- the batch of several processes


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def batch_mode(batch) -> str:
    if batch is None:
        return "global"
    if not isinstance(batch, str) or batch not in BATCHES:
        raise CocosError(f"batch must be 'global' (every rank's embeddings gathered: the global batch), 'local' "
                         f"(each rank's queries against every rank's candidates, open_clip's local_loss) or "
                         f"'given' (the embeddings observe is given, as they are), got {batch!r}")
    return batch


def part_of(step: int, images: torch.Tensor, captions: torch.Tensor, caption_image, image_ids) -> dict:
    """What the other ranks need of this rank's part of a batch: its shape and dtypes, ``caption_image`` (rows
    of this part's images) and ``image_ids`` as integer arrays (one :class:`CocosError` line for bad ones)."""
    n, m = int(images.shape[0]), int(captions.shape[0])
    part = {"images": n, "captions": m, "dim": int(images.shape[1]), "dtypes": (str(images.dtype),
            str(captions.dtype)), "caption_image": None, "image_ids": None}
    if caption_image is not None:
        ci = np.asarray(torch.as_tensor(caption_image).detach().cpu())
        if ci.shape != (m,) or not np.issubdtype(ci.dtype, np.integer) or ci.min() < 0 or ci.max() >= n:
            raise CocosError(f"Tracker.observe at step {step}: caption_image must be {m} integers in [0, {n}) (the "
                             "rows of this process's own images)")
        part["caption_image"] = ci.astype(np.int64)
    if image_ids is not None:
        ids = np.asarray(torch.as_tensor(image_ids).detach().cpu())
        if ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer):
            raise CocosError(f"Tracker.observe at step {step}: image_ids must be {n} integers (one per image)")
        part["image_ids"] = ids.astype(np.int64)
    return part


def check_parts(step: int, parts: list[dict]) -> None:
    """Every rank's part of a batch (:func:`part_of`, in rank order) usable together: a rank's refusal is its
    one error line (naming the rank), and the ranks' embedding widths and dtypes must agree."""
    for rank, p in enumerate(parts):
        if "error" in p:
            raise CocosError(p["error"].replace(f"at step {step}:", f"at step {step}, rank {rank}:", 1))
    for key, what in (("dim", "embedding widths"), ("dtypes", "embedding dtypes")):
        if len({p[key] for p in parts}) > 1:
            raise CocosError(f"Tracker.observe at step {step}: the ranks' {what} differ "
                             f"({', '.join(str(p[key]) for p in parts)})")


def _part_caption_image(step: int, rank: int, part: dict) -> np.ndarray:
    """Rank ``rank``'s ``caption_image`` (rows of its own images): as given, else ``c // k`` for its ``k``
    captions per image (one error line where its captions are not a multiple of its images)."""
    if part["caption_image"] is not None:
        return part["caption_image"]
    if part["captions"] % part["images"]:
        raise CocosError(f"Tracker.observe at step {step}: rank {rank}'s {part['captions']} captions is not "
                         f"a multiple of its {part['images']} images; give caption_image")
    return np.arange(part["captions"]) // (part["captions"] // part["images"])


def _joined_caption_image(step: int, parts: list[dict]) -> np.ndarray | None:
    """``caption_image`` of the global batch: each rank's caption rows offset by the images of the ranks before
    it (None where no rank gives one and every rank has the same ``k`` captions per image: ``c // k`` holds for
    the whole)."""
    ks = {p["captions"] // p["images"] if p["captions"] % p["images"] == 0 else None for p in parts}
    if not (any(p["caption_image"] is not None for p in parts) or len(ks) > 1 or None in ks):
        return None
    rows, offset = [], 0
    for rank, p in enumerate(parts):
        rows.append(_part_caption_image(step, rank, p) + offset)
        offset += p["images"]
    return np.concatenate(rows)


def _joined_image_ids(step: int, parts: list[dict]) -> np.ndarray | None:
    """``image_ids`` of the global batch: the ranks' ids concatenated (None where no rank gives them; one error
    line where only some do)."""
    given = [p["image_ids"] is not None for p in parts]
    if any(given) and not all(given):
        raise CocosError(f"Tracker.observe at step {step}: image_ids given on rank(s) "
                         f"{', '.join(str(r) for r, g in enumerate(given) if g)} only; give them on every rank or none")
    return np.concatenate([p["image_ids"] for p in parts]) if all(given) else None


def joined(step: int, parts: list[dict]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``caption_image`` and ``image_ids`` of the global batch (the ranks' parts in rank order): each rank's
    caption rows offset by the images of the ranks before it (None where no rank gives one and every rank has
    the same ``k`` captions per image: ``c // k`` holds for the whole); the ids concatenated (None where no rank
    gives them)."""
    caption_image = _joined_caption_image(step, parts)
    return caption_image, _joined_image_ids(step, parts)


# ---------------------------------------------------------------------- open_clip's local loss


def _check_blocks(counter, loss, compat: bool) -> None:
    """One :class:`CocosError` line for a counter whose per-query values do not read the query's own row alone
    (:meth:`Counter.blocks`): it cannot be counted per query block."""
    refused = [d for d in DIRECTIONS if not counter.blocks(d, compat)]
    if refused:
        raise CocosError(f"{getattr(loss, 'name', loss)} ({'/'.join(refused)}{', compat' if compat else ''}) cannot "
                         "be counted per query block: its per-query values do not read the query's row alone")


def _bytes_per_pair(scores: torch.Tensor, layout, caption_image) -> int:
    """The temporaries a whole count of the batch needs per query-candidate pair (at least one byte), as
    :func:`cocos.counting.blocks.whole_bytes` estimates them."""
    itemsize = 8 if scores.dtype == torch.float64 else 4
    return max(1, whole_bytes(layout.n_images, layout.n_captions, caption_image, itemsize)
               // (layout.n_images * layout.n_captions))


def _query_edges(bounds, n_queries: int, direction: str) -> list[int]:
    """``bounds`` as the edges of the ranks' query blocks: from 0 to ``n_queries``, never decreasing (one
    :class:`CocosError` line otherwise)."""
    edges = [int(b) for b in bounds]
    if edges[0] != 0 or edges[-1] != n_queries or any(a > b for a, b in zip(edges[:-1], edges[1:], strict=True)):
        raise CocosError(f"query blocks {edges} do not cut the {n_queries} {direction} queries")
    return edges


def _query_rows(edges: list[int], rows: int):
    """The ``(start, stop)`` query rows counted together: each rank's block cut into pieces of at most ``rows``."""
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        for a in range(lo, hi, rows):
            yield a, min(hi, a + rows)


def _per_query_local(counter, scores: torch.Tensor, layout, direction: str, bounds, per_pair: int, budget: int,
                     compat: bool) -> dict[str, torch.Tensor]:
    """``{stat: per-query values}`` of one direction's queries: ``bounds`` cuts them into the ranks' blocks
    (:func:`_query_edges`), each counted against every candidate in pieces of as many rows as ``budget`` bytes
    of temporaries allow at ``per_pair`` bytes a pair (:func:`_query_rows`)."""
    pos, neg = layout.masks(direction, compat)
    oriented = scores if direction == "i2t" else scores.T
    edges = _query_edges(bounds, pos.shape[0], direction)
    rows = max(1, budget // (per_pair * pos.shape[1]))
    values: dict[str, torch.Tensor] = {}
    for a, b in _query_rows(edges, rows):
        view = QueryView(scores=oriented[a:b].contiguous(), pos=pos[a:b], neg=neg[a:b], direction=direction,
                         group_size=layout.group_size, compat=compat)
        block = counter.count(view).per_query
        if not values:
            values = {k: torch.empty(pos.shape[0], dtype=v.dtype, device=v.device) for k, v in block.items()}
        for k, v in values.items():
            v[a:b] = block[k]
    return values


def count_local(images, captions, loss, bounds: dict[str, list[int]], *, compat: bool = False, caption_image=None,
                image_ids=None, budget: int | None = None, **params) -> dict[str, dict[str, torch.Tensor]]:
    """``{direction: {stat: batch value}}`` of the batch the ranks' losses see with open_clip's ``local_loss``:
    each block of queries against every candidate, the blocks' per-query values reduced together.

    ``bounds[direction]`` cuts that direction's queries (images for ``i2t``, captions for ``t2i``) into the ranks'
    blocks (``[0, n_0, n_0 + n_1, ..., Q]``). Each block is counted against all candidates (in smaller blocks of
    rows where the budget of :func:`cocos.counting.blocks.count_batch_values` asks for them); the batch values
    are those of all the blocks' queries (:meth:`Counter.batch_of`). Only counters whose per-query values read
    the query's own row (:meth:`Counter.blocks`) have such a count: one :class:`CocosError` line for others."""
    budget = BLOCK_BUDGET if budget is None else int(budget)
    counter = get_counter(loss, **params)
    _check_blocks(counter, loss, compat)
    scores, layout = batch_similarity(images, captions, caption_image, image_ids)
    per_pair = _bytes_per_pair(scores, layout, caption_image)
    out = {}
    for direction in DIRECTIONS:
        values = _per_query_local(counter, scores, layout, direction, bounds[direction], per_pair, budget, compat)
        out[direction] = counter.batch_of(values, compat)
    return out
