"""One interface for every counter: a :class:`QueryView` in, a :class:`Count` out.

All tensors may carry leading batch dimensions, so a whole stack of batches is
counted in one pass. Per-query values stay available for distributions; batch
values follow the definitions file (``C^q`` is the mean over queries **with** a
gradient and is NaN for a batch where no query has one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch

from cocos.data.layout import QueryView, positive_index
from cocos.defaults import DEFAULT_EPS  # noqa: F401  (re-exported for the counters)
from cocos.errors import CocosError

COMPANIONS = ("N_eff", "N_invsimpson", "top1_share")
BLOCK = 64  # entries per block of counts_above's first look


@dataclass
class Count:
    """Counts of one loss in one direction, for one batch (or a stack of batches).

    ``per_query[stat]`` is ``(..., Q)``; ``batch[stat]`` is ``(...)``. ``n_excluded``
    is the number of same-image pairs excluded from the negatives per batch. ``weights``
    (each query's weights on its candidates) is ``None`` where a counter does not keep
    them: the engine's row-patched compat views (:func:`per_query`) do not need them.
    """

    per_query: dict[str, torch.Tensor]
    batch: dict[str, torch.Tensor]
    n_excluded: torch.Tensor
    weights: torch.Tensor | None = field(default=None, repr=False)
    item_kind: str | None = None  # what a per-query entry is when not the query itself ("image": regrouped)


class Counter:
    """Base class: subclasses implement :meth:`count` (and :meth:`sweep` if they use ``eps``).

    A counter is built by its family's :class:`~cocos.objectives.Objective`, which
    holds its name and statistics; the counting mode comes with the view.
    """

    uses_eps: ClassVar[bool] = False  # whether the count depends on the threshold eps
    # whether counting fewer batches at a time gives the same bits where the chunks are tail-free
    # (cocos.losses.functional.vectorised_whole); the engine then counts ranking batches in smaller chunks
    chunk_invariant: ClassVar[bool] = False
    # whether counting may need autograd (the generic counter's gradients, and any counter not known not to): the
    # engine counts under torch.no_grad then, otherwise under torch.inference_mode (less bookkeeping per operation)
    autograd: ClassVar[bool] = True

    def params(self) -> dict:
        return {}

    def count(self, view: QueryView) -> Count:
        raise NotImplementedError

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        """Counts as a function of the threshold ``eps`` (for counters that use one)."""
        raise CocosError(f"{type(self).__name__} has no threshold to sweep")

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """:meth:`count` at the counter's own threshold and the batch values of :meth:`sweep` at each of
        ``eps_values``, in one pass over the view where the counter can (the engine's entry point).

        Equal to ``count(view)`` and ``{e: c.batch for e, c in sweep(view, eps_values).items()}``; this
        default computes exactly that, counters override it to share the per-query weights between the
        thresholds."""
        main = self.count(view)
        if not eps_values:
            return main, {}
        return main, {e: c.batch for e, c in self.sweep(view, eps_values).items()}


def batch_counts(c_q: torch.Tensor) -> dict[str, torch.Tensor]:
    """``C^B``, ``C^0`` and ``C^q`` (mean over queries with a gradient) from per-query counts."""
    c_b = c_q.sum(-1).to(torch.float64)
    c_0 = (c_q == 0).sum(-1).to(torch.float64)
    with_grad = c_q.shape[-1] - c_0
    mean = torch.where(with_grad > 0, c_b / with_grad.clamp(min=1), torch.nan)
    return {"C_q": mean, "C_B": c_b, "C_0": c_0}


def companions(weights: torch.Tensor, binary: bool = False, counts: torch.Tensor | None = None
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Threshold-free companions from each query's non-negative weights on its negatives.

    With ``u_n = w_n / sum w``: effective number of negatives ``exp(H(u))``, inverse
    Simpson ``1 / sum u_n^2`` and the largest share ``max u_n``. Queries whose
    negatives carry no weight get NaN; the batch value is the mean over the others.
    ``(per_query, batch)``; :func:`companion_values` gives the per-query values alone. ``counts``: with
    ``binary``, the weights' row sums where the caller has them (:func:`_binary_companion_rows`).
    """
    per_query = companion_values(weights, binary, counts)
    return per_query, nanmeans(per_query)


def companion_values(weights: torch.Tensor, binary: bool = False, counts: torch.Tensor | None = None
                     ) -> dict[str, torch.Tensor]:
    """The per-query values of :func:`companions` (float64, ``(..., Q)`` each), views of :func:`companion_rows`."""
    return dict(zip(COMPANIONS, companion_rows(weights, binary, counts=counts).unbind(0), strict=True))


def companion_rows(weights: torch.Tensor, binary: bool = False, total: torch.Tensor | None = None,
                   largest: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> torch.Tensor:
    """The per-query values of :func:`companions` as one float64 tensor ``(3, ..., Q)``, in the order of
    :data:`COMPANIONS`.

    Every operation is row by row (the same bits for any number of rows): where fewer than half of the queries
    have weight only those rows are computed, otherwise every row and the others set to NaN after. Two full-size
    temporaries. ``binary``: the weights are 0 or 1 (or booleans), see :func:`_binary_companion_rows` (``counts``:
    their row sums, where the caller has them). ``total``,
    ``largest``: ``weights.sum(-1)`` and ``weights.amax(-1)`` of float weights, where the caller has them (the
    largest share ``max u`` is then ``largest / total``: division by a positive number keeps the order, so the
    largest quotient is the quotient of the largest, correctly rounded alike)."""
    if binary:
        return _binary_companion_rows(weights, counts)
    given = total is not None and largest is not None and weights.is_floating_point()
    w, total = weights, (total.unsqueeze(-1) if given else weights.sum(-1, keepdim=True))  # ints: exact sums
    has = total.squeeze(-1) > 0
    shape = has.shape
    rows = has.reshape(-1).nonzero().squeeze(-1)
    some = len(rows) < has.numel()
    gather = some and 2 * len(rows) < has.numel()
    if gather:  # only the queries with weight
        w, total = w.reshape(-1, w.shape[-1])[rows], total.reshape(-1, 1)[rows]
        largest = largest.reshape(-1)[rows] if given else None
    if not w.is_floating_point():
        w, total = w.to(torch.float64), total.to(torch.float64)
    tiny = torch.finfo(w.dtype).tiny
    u = w / total.clamp(min=tiny)
    work = u.clamp(min=tiny).log_().mul_(u)  # u log u -> 0 as u -> 0
    entropy = -work.sum(-1)
    simpson = torch.mul(u, u, out=work).sum(-1)
    top = largest / total.clamp(min=tiny).squeeze(-1) if given else u.amax(-1)
    values = torch.stack([torch.exp(entropy), 1.0 / simpson.clamp(min=tiny), top]).to(torch.float64)
    values = values.reshape(len(COMPANIONS), -1)
    if gather:
        values = torch.full((len(COMPANIONS), has.numel()), torch.nan, dtype=torch.float64,
                            device=w.device).index_copy_(1, rows, values)
    elif some:
        values = torch.where(has.reshape(-1), values, torch.nan)
    return values.reshape(len(COMPANIONS), *shape)


def _binary_companion_rows(weights: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`companion_rows` of 0/1 weights (the triplet losses' violations with one positive), in float64 as
    for any integer weights, without making them floats: ``u`` is ``1 / n`` on a query's ``n`` violations and 0
    elsewhere, so ``u log u`` and ``u^2`` are computed once per query and spread over its row by ``where`` (the
    elementwise products' values: ``-0`` for ``0 * log(tiny)``, ``+0`` for ``0 * 0``), the same tensors, summed
    alike, at a third of the memory traffic. ``counts``: the number of ones in each row, where known."""
    hit = weights if weights.dtype == torch.bool else weights > 0
    n = (hit.sum(-1, dtype=torch.int32) if counts is None else counts).unsqueeze(-1).to(torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    u = 1.0 / n.clamp(min=tiny)  # (..., 1): u on a violation
    spread = torch.where(hit, u.clamp(min=tiny).log().mul_(u), -0.0)
    entropy = -spread.sum(-1)
    zero = torch.zeros((), dtype=torch.float64, device=u.device)
    simpson = torch.where(hit, u * u, zero, out=spread).sum(-1)  # the same buffer, still in the cache
    values = torch.stack([torch.exp(entropy), 1.0 / simpson.clamp(min=tiny), u.squeeze(-1)])
    return torch.where(n.squeeze(-1) > 0, values, torch.nan)


def nanmeans(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`nanmean` of each of several tensors of one shape and dtype, in one call (each row as alone)."""
    if not values:
        return {}
    return dict(zip(values, nanmean(torch.stack(list(values.values()))).unbind(0), strict=True))


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
    replaced by the stacked ones after them. Every ``compute`` given here works row by row (the same bits for any
    number and arrangement of rows) and does not read the view's direction, so this equals ``compute(view)``."""
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


def view_key(view: QueryView) -> tuple:
    """The identity of a view's scores and masks, for :func:`per_view` keys."""
    return (id(view.scores), id(view.pos), id(view.neg), view.direction)


def counts_above(w: torch.Tensor, eps_values) -> list[torch.Tensor]:
    """``#{entries of w > e}`` over the last axis of ``w`` (``(..., R)`` -> ``(...)`` int64) for every ``e``.

    One comparison with the smallest threshold keeps the entries that can pass any of
    them; one ``bucketize`` sorts those between the thresholds, and one ``bincount``
    per (row, bucket) gives every count (exact integer counts, equal to
    ``(w > e).sum(-1)`` for each ``e``, without one pass over ``w`` per threshold).
    The comparison runs only on the blocks whose largest entry passes (:func:`_entries_above`): where the
    entries that pass are few (SmoothAP's pair weights), a small part of ``w``. The thresholds are compared in
    ``w``'s dtype, as ``w > e`` compares them."""
    eps_values = [float(e) for e in eps_values]
    if not eps_values:
        return []
    flat = w.reshape(-1, w.shape[-1])
    least = torch.tensor(min(eps_values), dtype=w.dtype, device=w.device)
    found = _entries_above(flat, least)
    if found is None:  # a NaN (it passes no threshold, but hides its block's largest entry): every entry compared
        rows, cols = (flat > least).nonzero(as_tuple=True)
        found = rows, cols, flat[rows, cols]
    rows, _, values = found
    return _bucket_counts(rows, values, flat.shape[0], eps_values, w.shape[:-1])


def counts_above_summed(w: torch.Tensor, w_sum: torch.Tensor, eps_values) -> list[torch.Tensor]:
    """:func:`counts_above` of non-negative ``w`` (``(..., A, K)``) over its last two axes, given ``w_sum =
    w.sum(-2)``: a rounded sum of non-negative numbers is at least each of them, so an entry can pass a threshold
    only where its column's sum does, and only those columns' ``A`` entries are compared (SmoothAP's pair weights,
    summed over the anchors for the companions anyway; the columns found as :func:`_entries_above` finds
    entries). Exact counts; with a NaN, :func:`counts_above`."""
    eps_values = [float(e) for e in eps_values]
    if not eps_values:
        return []
    a, k = w.shape[-2:]
    cols = w_sum.reshape(-1, k)
    least = torch.tensor(min(eps_values), dtype=w.dtype, device=w.device)
    found = _entries_above(cols, least)
    if found is None:
        return counts_above(w.reshape(*w.shape[:-2], -1), eps_values)
    row, col, _ = found  # the columns whose sum passes
    values = w.reshape(-1, a, k)[row, :, col]  # (h, A)
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
    k = p.shape[-1]
    rows, m = p.reshape(-1, k), mask.reshape(-1, k)
    eps = torch.tensor([float(e) for e in eps_values], dtype=p.dtype, device=p.device)[:, None]  # (E, 1)
    # p * mask is where(mask, p, 0) bit for bit (p * 1 = p, p * 0 = +-0) where p is finite (its sum is finite)
    given = masked is not None and masked_sum is not None and masked_max is not None
    low = masked.reshape(-1, k) if masked is not None else rows * m.to(rows.dtype)
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


def nanmean(x: torch.Tensor) -> torch.Tensor:
    """Mean over the last axis ignoring NaN; NaN when every entry is NaN.

    For floats :func:`torch.nanmean` (the sum of the entries that are not NaN, in the order of ``sum``, over their
    number: bit for bit ``where(ok, x, 0).sum(-1) / ok.sum(-1)``, in one call instead of seven)."""
    if x.is_floating_point():
        return torch.nanmean(x, -1)
    n = torch.full(x.shape[:-1], x.shape[-1], device=x.device)  # integers have no NaN
    return torch.where(n > 0, x.sum(-1) / n.clamp(min=1), torch.nan)
