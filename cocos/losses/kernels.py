"""Kernels: faster ways to compute what the losses and counters define, apart from the definitions.

**Contract.** Every kernel here is bit-identical to the plain formula it replaces (named in its docstring): same
values, same dtype, for every input the counters pass it (``tests/test_kernels.py`` compares each with its
formula with ``torch.equal`` on random inputs of awkward sizes, float32 and float64). The maths lives in
:mod:`cocos.losses.functional` and the counters, which call a kernel where speed needs it; nothing here defines
what is counted. Three kinds:

* **vectorised sigmoid** (:func:`sigmoid_vectorised`): torch's float32 ``sigmoid`` rounds some elements
  differently in the SIMD body and the scalar tail of its loop, so a tensor is padded to a tail-free size and
  a part of a tensor gets the whole tensor's bits (SmoothAP's counter computes only the rows it needs);
* **memo** (:func:`per_view`, :func:`per_query`, :class:`RowStack`, :func:`positives`): values computed once
  for the views the engine builds from one chunk of batches (keyed by the ``id`` of the view's tensors), and
  once for the rows both counting modes and directions share;
* **reductions** (:func:`counts_above`, :func:`counts_above_summed`, :func:`thresholded_sums_stacked`,
  :func:`smoothap_pair_weights`, :func:`fill_outside`): one pass where the formula makes several, in place where
  the formula makes copies.

This module sits under :mod:`cocos.losses.functional` (it imports only :mod:`cocos.data.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from cocos.data.layout import QueryView, positive_index

VECTOR_ALIGN = 64  # elements: a multiple of every CPU vector loop's step (2 x 16 float32 lanes with AVX-512)
GRAIN = 32768  # torch's internal GRAIN_SIZE: elementwise loops of fewer elements run on one thread
BLOCK = 64  # entries per block of counts_above's first look


# -- the vectorised sigmoid -------------------------------------------------------------------------------------

def vectorised_whole(numel: int) -> bool:
    """Whether torch computes every element of a contiguous ``numel``-element CPU tensor in the vectorised body
    of its elementwise loop (no scalar tail).

    torch's float32 ``sigmoid`` rounds some elements differently in the body (SIMD) and in the scalar tail of a
    loop, and each thread's range ``[t * ceil(n / parts), ...)`` has its own tail (``parts``: the threads used,
    ``min(threads, ceil(n / GRAIN))``, 1 below ``GRAIN``). Where every part is a multiple of
    :data:`VECTOR_ALIGN`, every element takes the body, and the same element of a differently sized tensor that
    is also tail-free gets the same bits. (``exp``, ``log_softmax``, sums over the last axis and the basic
    arithmetic give the same bits either way; measured.)"""
    threads = torch.get_num_threads()
    parts = 1 if numel < GRAIN or threads == 1 else min(threads, -(-numel // GRAIN))
    return numel % VECTOR_ALIGN == 0 and (-(-numel // parts)) % VECTOR_ALIGN == 0


def sigmoid_vectorised(x: torch.Tensor) -> torch.Tensor:
    """``torch.sigmoid(x)`` with every element computed in the vectorised body of the loop (see
    :func:`vectorised_whole`): ``x`` is padded to a tail-free size. On CPU equal bit for bit to the elements of
    any tail-free tensor's ``sigmoid``; elsewhere plain ``sigmoid``."""
    if x.device.type != "cpu":
        return torch.sigmoid(x)
    n = x.numel()
    size = -(-max(n, 1) // VECTOR_ALIGN) * VECTOR_ALIGN
    while not vectorised_whole(size):
        size += VECTOR_ALIGN
    flat = x.new_zeros(size)
    flat[:n] = x.reshape(-1)
    return flat.sigmoid_()[:n].view(x.shape)


# -- in place -----------------------------------------------------------------------------------------------------

def fill_outside(x: torch.Tensor, fill: float, *masks: torch.Tensor) -> torch.Tensor:
    """``torch.where(masks[0] & masks[1] & ..., x, fill)`` (the masks broadcast against ``x``): an all-true
    mask is left out of the conjunction, and the result is written into ``x`` where nothing records it (``x``
    must then be a tensor of the caller's own, e.g. the result of an arithmetic expression); with autograd, the
    plain ``where``."""
    value = x.new_full((), fill)
    kept = [m for m in masks if not bool(m.all())]
    if not kept:
        kept = masks[:1]  # every entry kept: one mask for where's shape
    mask = kept[0]
    for other in kept[1:]:
        mask = mask & other
    if x.requires_grad:
        return torch.where(mask, x, value)
    return torch.where(mask, x, value, out=x)


def smoothap_pair_weights(scores: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor,
                          candidates: torch.Tensor | None, tau: float, clamp: float, vectorised: bool = False
                          ) -> torch.Tensor:
    """SmoothAP's pair weights ``w(a, b) = G (1 - G) / R(a)^2`` (``(..., Q, A, K)``), no gradient.

    Replaces: with ``x = clamp((s_b - s_a) / tau, -clamp, clamp)``, ``g = sigmoid(x)`` with ``g(a, a) = 0`` and
    ``g = 0`` off the candidates and on padding anchors, ``g * sigmoid(-x) / (1 + g.sum(-1, keepdim=True)) ** 2``
    (:func:`cocos.losses.functional.smoothap_sigmoid` and the definitions file's ``w``), in place: two full-size
    tensors instead of six. ``candidates`` ``None``: every pair is a candidate. ``vectorised``: both sigmoids by
    :func:`sigmoid_vectorised` (for a part of a tensor whose whole would be tail-free)."""
    s_a = torch.gather(scores, -1, anchors)  # (..., Q, A)
    x = scores[..., None, :] - s_a[..., :, None]
    x.div_(tau).clamp_(-clamp, clamp)
    g = sigmoid_vectorised(x) if vectorised else torch.sigmoid(x)
    g.scatter_(-1, anchors[..., None], 0.0)  # G(a, a) = 0
    if candidates is not None and not bool(candidates.all()):
        g.mul_(candidates[..., None, :])
    if not bool(anchor_valid.all()):
        g.mul_(anchor_valid[..., None])
    one_minus_g = sigmoid_vectorised(x.neg_()) if vectorised else x.neg_().sigmoid_()  # sigmoid(-x)
    rank = 1.0 + g.sum(-1, keepdim=True)
    return g.mul_(one_minus_g).div_(rank * rank)


# -- the memo: values shared by the engine's views ----------------------------------------------------------------

def per_view(view: QueryView, key: tuple, make):
    """``make()``, computed once for the views that share a memo (the engine's views of one chunk of batches).

    ``key`` names what is computed and from what: the ``id`` of the view's tensors it reads and the
    parameters (the engine keeps the tensors alive while the memo lives, and gives both counting modes
    the same mask tensors where their masks are equal). Views without a memo compute it every time."""
    memo = getattr(view, "memo", None)
    if memo is None:
        return make()
    if key not in memo:  # the view's tensors stay referenced with the value: their ids are not reused meanwhile
        memo[key] = (make(), view.scores, view.pos, view.neg)
    return memo[key][0]


def view_key(view: QueryView) -> tuple:
    """The identity of a view's scores and masks, for :func:`per_view` keys."""
    return (id(view.scores), id(view.pos), id(view.neg), view.direction)


@dataclass(frozen=True)
class RowStack:
    """The query rows of a chunk's corrected view and the few rows where its compat view's masks differ (the
    engine's chunks holding same-image pairs), stacked as ``N`` views of one query each (``view``, ``(N, 1, K)``,
    which may hold other views' rows too, the other direction's): from ``offset``, the ``n_main`` rows of the
    corrected view in order, then the compat view's rows ``changed`` (flat indices over the leading and query
    axes). :func:`per_query` computes every mode's and direction's rows in one pass."""

    view: QueryView
    n_main: int
    changed: torch.Tensor
    offset: int = 0

    @cached_property
    def compat_rows(self) -> torch.Tensor:
        """The stacked rows of the compat view, in its order: the corrected ones, the changed ones from after them."""
        start, n = self.offset, self.n_main
        rows = torch.arange(start, start + n, device=self.changed.device)
        rows[self.changed] = torch.arange(start + n, start + n + len(self.changed), device=rows.device)
        return rows


def per_query(view: QueryView, key: tuple, compute, rest_first: bool = False) -> dict[str, torch.Tensor]:
    """``compute(view)``, a dict of per-query tensors (each ``(..., Q, *rest)``, or ``(*rest, ..., Q)`` with
    ``rest_first``: one row of queries per value, as means over the queries read them), memoised like
    :func:`per_view`.

    A view with a :class:`RowStack` (``view.stack``, the engine's views of a chunk holding same-image pairs) takes
    its values from one ``compute`` of the stacked rows, shared by both modes (and directions): the corrected view
    its rows (with ``rest_first`` a view of them, no copy), the compat view the same with the changed rows
    replaced by the stacked ones after them. Every ``compute`` given here must work row by row (the same bits for
    any number and arrangement of rows) and not read the view's direction, so this equals ``compute(view)``."""
    stack = getattr(view, "stack", None)
    if stack is None:
        return per_view(view, (*key, *view_key(view)), lambda: compute(view))

    def split() -> dict[str, torch.Tensor]:
        rows = stack.view
        full = per_view(rows, (*key, *view_key(rows)), lambda: compute(rows))  # (N, 1, *rest) or (*rest, N, 1)
        lead, n = view.scores.shape[:-1], stack.n_main
        axis = -2 if rest_first else 0
        out = {}
        for name, value in full.items():
            # compat: the corrected rows, but the changed ones from after them
            main = (value.index_select(axis, stack.compat_rows) if view.compat
                    else value.narrow(axis, stack.offset, n))
            out[name] = main.reshape(*value.shape[:-2], *lead) if rest_first else main.reshape(*lead, *value.shape[2:])
        return out

    return per_view(view, (*key, *view_key(view)), split)


def positives(view: QueryView) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~cocos.data.layout.positive_index` of the view's positives: given with the view where its maker
    knows them (the engine's views: its ``positive``, from the layout), otherwise made once per mask in the
    view's memo."""
    known = getattr(view, "positive", None)
    if known is not None:
        return known
    return per_view(view, ("positive_index", id(view.pos)), lambda: positive_index(view.pos))


# -- companions of 0/1 weights -----------------------------------------------------------------------------------

def binary_companion_rows(weights: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
    """``companion_rows(weights.to(torch.int64))`` (:func:`cocos.losses.counts.companion_rows`, ``(3, ..., Q)``
    float64) of 0/1 weights (booleans; a family's passing terms with one positive), without making them
    numbers: ``u`` is ``1 / n`` on a query's ``n`` violations and 0 elsewhere, so ``u log u`` and ``u^2`` are
    computed once per query and spread over its row by ``where`` (the elementwise products' values: ``-0`` for
    ``0 * log(tiny)``, ``+0`` for ``0 * 0``), the same tensors, summed alike, at a third of the memory traffic.
    ``counts``: the number of ones in each row, where known."""
    hit = weights if weights.dtype == torch.bool else weights > 0
    counts = hit.sum(-1, dtype=torch.int32) if counts is None else counts
    if not counts.numel() or int(counts.max()) <= 1:  # at most one 1 per row (Triplet SH): u = 1 there, so the
        # values are exp(-(+0)) = 1, 1 / 1 and 1 exactly, NaN for a row without
        one = torch.where(counts > 0, 1.0, torch.nan).to(torch.float64)
        return torch.stack([one, one, one])
    n = counts.unsqueeze(-1).to(torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    u = 1.0 / n.clamp(min=tiny)  # (..., 1): u on a violation
    spread = torch.where(hit, u.clamp(min=tiny).log().mul_(u), -0.0)
    entropy = -spread.sum(-1)
    zero = torch.zeros((), dtype=torch.float64, device=u.device)
    simpson = torch.where(hit, u * u, zero, out=spread).sum(-1)  # the same buffer, still in the cache
    values = torch.stack([torch.exp(entropy), 1.0 / simpson.clamp(min=tiny), u.squeeze(-1)])
    return torch.where(n.squeeze(-1) > 0, values, torch.nan)


# -- counts and sums above thresholds -----------------------------------------------------------------------------

def counts_above(w: torch.Tensor, eps_values) -> list[torch.Tensor]:
    """``[(w > e).sum(-1) for e in eps_values]`` (int64, ``(...)`` each): the entries of ``w`` (``(..., R)``)
    above each threshold.

    One comparison with the smallest threshold keeps the entries that can pass any of
    them; one ``bucketize`` sorts those between the thresholds, and one ``bincount``
    per (row, bucket) gives every count, without one pass over ``w`` per threshold.
    The comparison runs only on the blocks whose largest entry passes (:func:`_entries_above`): where the
    entries that pass are few (SmoothAP's pair weights), a small part of ``w``. The thresholds are compared in
    ``w``'s dtype, as ``w > e`` compares them."""
    eps_values = [float(e) for e in eps_values]
    if not eps_values:
        return []
    flat = w.reshape(w.shape[:-1].numel(), w.shape[-1])  # (rows, width), also with a width of 0
    least = torch.tensor(min(eps_values), dtype=w.dtype, device=w.device)
    found = _entries_above(flat, least)
    if found is None:  # a NaN (it passes no threshold, but hides its block's largest entry): every entry compared
        rows, cols = (flat > least).nonzero(as_tuple=True)
        found = rows, cols, flat[rows, cols]
    rows, _, values = found
    return _bucket_counts(rows, values, flat.shape[0], eps_values, w.shape[:-1])


def counts_above_summed(w: torch.Tensor, w_sum: torch.Tensor, eps_values) -> list[torch.Tensor]:
    """``[(w > e).sum((-2, -1)) for e in eps_values]`` of non-negative ``w`` (``(..., A, K)``), given ``w_sum =
    w.sum(-2)``.

    A rounded sum of non-negative numbers is at least each of them, so an entry can pass a threshold
    only where its column's sum does, and only those columns' ``A`` entries are compared (SmoothAP's pair weights,
    summed over the anchors for the companions anyway; the columns found as :func:`_entries_above` finds
    entries). With a NaN, :func:`counts_above`."""
    eps_values = [float(e) for e in eps_values]
    if not eps_values:
        return []
    a, k = w.shape[-2:]
    cols = w_sum.reshape(w_sum.shape[:-1].numel(), k)
    least = torch.tensor(min(eps_values), dtype=w.dtype, device=w.device)
    found = _entries_above(cols, least)
    if found is None:
        return counts_above(w.reshape(*w.shape[:-2], a * k), eps_values)
    row, col, _ = found  # the columns whose sum passes
    values = w.reshape(cols.shape[0], a, k)[row, :, col]  # (h, A)
    hit, anchor = (values > least).nonzero(as_tuple=True)
    return _bucket_counts(row[hit], values[hit, anchor], cols.shape[0], eps_values, w.shape[:-2])


def _entries_above(flat: torch.Tensor, least: torch.Tensor) -> tuple | None:
    """``(rows, cols, values)`` of the entries of a 2-D ``flat`` above ``least``, or ``None`` where ``flat`` holds
    a NaN. A first look at the largest entry of each block of :data:`BLOCK` entries (of each row, where the
    width is not a multiple of it) finds the blocks with an entry that passes, and only those are compared: one
    reduction over ``flat`` instead of a comparison and a scan of its booleans. ``amax`` propagates a NaN, which
    is how one is found (beside it, an entry that passes would be hidden)."""
    n_rows, width = flat.shape
    if not flat.numel():
        empty = torch.zeros(0, dtype=torch.int64, device=flat.device)
        return empty, empty, flat.reshape(-1)
    block = BLOCK if width % BLOCK == 0 else width
    blocks = flat.reshape(-1, block)
    top = blocks.amax(-1)
    if bool(torch.isnan(top).any()):
        return None
    hot = (top > least).nonzero().squeeze(-1)  # the blocks with an entry that passes
    sub = blocks[hot]
    r, c = (sub > least).nonzero(as_tuple=True)
    at, per_row = hot[r], width // block
    return at // per_row, at % per_row * block + c, sub[r, c]


def _bucket_counts(rows: torch.Tensor, values: torch.Tensor, n_rows: int, eps_values: list, shape) -> list:
    """Per row and threshold, the number of ``values`` (the entries above the smallest threshold, with their row)
    above it: one ``bucketize`` sorts them between the thresholds, one ``bincount`` per (row, bucket)."""
    if not len(values):  # nothing passes (SmoothAP's caption queries, mostly)
        return list(torch.zeros((len(eps_values), *shape), dtype=torch.int64, device=values.device).unbind(0))
    order = sorted(range(len(eps_values)), key=lambda j: eps_values[j])
    bounds = torch.tensor([eps_values[j] for j in order], dtype=values.dtype, device=values.device)
    bucket = torch.bucketize(values, bounds)  # number of thresholds strictly below each value
    hist = torch.bincount(rows * (len(order) + 1) + bucket, minlength=n_rows * (len(order) + 1))
    above = hist.reshape(n_rows, len(order) + 1).flip(-1).cumsum(-1).flip(-1)  # above[:, j]: bucket >= j
    out = [None] * len(eps_values)
    for rank, j in enumerate(order):
        out[j] = above[:, rank + 1].reshape(shape)
    return out


def thresholded_sums(p: torch.Tensor, mask: torch.Tensor, eps_values) -> list[tuple]:
    """Per row of ``p`` (``(..., K)`` float) and threshold ``e``: ``(n_above, sum_above, sum_below)``, see
    :func:`thresholded_sums_stacked` (the same values, one tuple per threshold)."""
    count, above, below = thresholded_sums_stacked(p, mask, eps_values)
    return list(zip(count, above, below, strict=True))


def thresholded_sums_stacked(p: torch.Tensor, mask: torch.Tensor, eps_values, masked: torch.Tensor | None = None,
                             masked_sum: torch.Tensor | None = None, masked_max: torch.Tensor | None = None) -> tuple:
    """Per row of ``p`` (``(..., K)`` float) and threshold ``e``: ``(n_above, sum_above, sum_below)``, each
    ``(E, ...)`` (one row per threshold): the count
    and the sum of the masked entries ``> e`` and the sum of those ``< e``, bit for bit
    ``(mask & (p > e)).sum(-1)``, ``where(mask & (p > e), p, 0).sum(-1)`` and ``where(mask & (p < e), p, 0).sum(-1)``.

    A row whose masked entries all stay on one side of a threshold has a known value there: the row's masked
    sum (its sum of ``where(mask, p, 0)``, computed once) or zero. Only the other (row, threshold) pairs are
    summed again: on every row at once for a threshold where many rows are partial, otherwise on the gathered
    rows, all thresholds in one gather (each row of a contiguous ``(n, K)`` reduction is summed the same way
    whatever ``n``). Thresholds are compared in ``p``'s dtype, as ``p > e`` compares them.

    For finite ``p`` and thresholds ``>= 0`` (as the counters pass them) the rows are told apart by their
    largest masked entry alone (a row whose entries all pass above, or none below, counts as partial: summed
    like the others), and sums select from
    ``p * mask`` (``where(mask, p, 0)`` bit for bit; ``masked``, when given, is that tensor), whose entries
    outside the mask are zeros: never above ``e >= 0``, and adding a zero below changes no sum (at most the
    sign of a zero sum). A whole-row sum selects by :func:`torch.nn.functional.threshold` (``x if x > e else
    0``, in ``p``'s dtype: the tensor of ``where``, without a boolean mask or its conversion): above the
    threshold on ``p * mask``, below it on the negated entries (``-p > -e``, exact), whose sum is the negated
    sum (rounding is symmetric); the count above is the number of nonzero kept entries (all ``> e >= 0``),
    summed as exact small integers. ``masked_sum``, ``masked_max``: ``masked.sum(-1)`` and ``masked.amax(-1)``,
    where the caller has them."""
    if not p.numel():  # no entries: the formula's empty sums, 0 everywhere
        zeros = p.new_zeros((len(eps_values), *p.shape[:-1]))
        return zeros.to(torch.int64), zeros, zeros.clone()
    k, n = p.shape[-1], p.shape[:-1].numel()
    rows, m = p.reshape(n, k), mask.reshape(n, k)
    eps = torch.tensor([float(e) for e in eps_values], dtype=p.dtype, device=p.device)[:, None]  # (E, 1)
    # p * mask is where(mask, p, 0) bit for bit (p * 1 = p, p * 0 = +-0) where p is finite (its sum is finite)
    given = masked is not None and masked_sum is not None and masked_max is not None
    low = masked.reshape(n, k) if masked is not None else rows * m.to(rows.dtype)
    total = masked_sum.reshape(-1) if given else low.sum(-1)
    fast = bool(len(eps_values)) and bool(eps.min() >= 0) and bool(torch.isfinite(total).all())
    if fast:  # rows told apart by their largest masked entry (a row without entries has hi 0: none passes above)
        hi, lo, n_in, high = masked_max.reshape(-1) if given else low.amax(-1), None, None, None
    else:  # the masked entries, the others never above (-inf) or below (+inf) a threshold
        low, total = torch.where(m, rows, float("-inf")), torch.where(m, rows, 0.0).sum(-1)
        high = torch.where(m, rows, float("inf"))
        hi, lo = low.amax(-1), high.amin(-1)
        n_in = m.sum(-1, dtype=torch.int32)  # boolean counts in int32 (3x faster than int64), int64 at the end
    buffer = torch.empty_like(low) if fast else None  # every threshold's kept entries, in cache between passes
    negated = []  # where fast, -low for the sums below, made when first needed

    def below_source() -> torch.Tensor:
        if not fast:
            return high
        if not negated:
            negated.append(low.neg())
        return negated[0]

    def whole_row(j: int, above: bool) -> tuple:
        e = float(eps[j, 0])
        if fast:
            kept = torch.threshold(low if above else below_source(), e if above else -e, 0.0, out=buffer)
            if not above:
                return None, 0.0 - kept.sum(-1)
            value = kept.sum(-1)
            return kept.sign_().sum(-1).to(torch.int32), value
        hit = (low > eps[j]) if above else (high < eps[j])  # mask & (p > e), mask & (p < e)
        return (hit.sum(-1, dtype=torch.int32) if above else None), torch.where(hit, rows, 0.0).sum(-1)

    def side(every, none, above):
        """``every``: rows whose masked entries all pass, ``none``: rows where none does (either ``None``: not
        known)."""
        partial = ~every if none is None else ~none if every is None else ~every & ~none
        if every is None:
            count = torch.zeros(partial.shape, dtype=torch.int32, device=p.device) if above else None
            value = torch.zeros(partial.shape, dtype=rows.dtype, device=p.device)
        else:
            count = torch.where(every, n_in, 0) if above else None
            value = torch.where(every, total, 0.0)
        # thresholds where more than a tenth of the rows are partial: every row (a pass over every row costs about
        # as much as gathering a tenth of them and comparing those)
        whole = partial.sum(-1) * 10 > partial.shape[-1]
        for j in whole.nonzero().squeeze(-1).tolist():
            c, value[j] = whole_row(j, above)  # every row: equal to the values above where not partial
            if above:
                count[j] = c
        e_idx, r_idx = (partial & ~whole[:, None]).nonzero(as_tuple=True)
        if len(r_idx):  # the others: only the partial rows, all thresholds in one gather
            # equal to p where the mask holds; elsewhere never passing, or (fast, below) zeros that add nothing
            sub = (low if above or fast else high)[r_idx]
            hit = (sub > eps[e_idx]) if above else (sub < eps[e_idx])
            if above:
                count[e_idx, r_idx] = hit.sum(-1, dtype=torch.int32)
            value[e_idx, r_idx] = torch.where(hit, sub, 0.0).sum(-1)
        return count, value

    count, w_above = side(None if fast else lo > eps, hi <= eps, True)  # (E, rows)
    _, w_below = side(hi < eps, None if fast else lo >= eps, False)
    shape = (len(eps_values), *p.shape[:-1])
    return count.to(torch.int64).reshape(shape), w_above.reshape(shape), w_below.reshape(shape)
