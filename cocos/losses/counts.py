"""One interface for every counter: a :class:`QueryView` in, a :class:`Count` out.

All tensors may carry leading batch dimensions, so a whole stack of batches is
counted in one pass. Per-query values stay available for distributions; batch
values follow the definitions file (``C^q`` is the mean over queries **with** a
gradient and is NaN for a batch where no query has one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_EPS  # noqa: F401  (re-exported for the counters)
from cocos.errors import CocosError
from cocos.losses.kernels import (  # noqa: F401  (re-exported: their home was here before cocos.losses.kernels)
    BLOCK,
    RowStack,
    binary_companion_rows,
    counts_above,
    counts_above_summed,
    per_query,
    per_view,
    positives,
    thresholded_sums,
    thresholded_sums_stacked,
    view_key,
)

COMPANIONS = ("N_eff", "N_invsimpson", "top1_share")


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
    # (cocos.losses.kernels.vectorised_whole); the engine then counts ranking batches in smaller chunks
    chunk_invariant: ClassVar[bool] = False
    # whether counting may need autograd (the generic counter's gradients, and any counter not known not to): the
    # engine counts under torch.no_grad then, otherwise under torch.inference_mode (less bookkeeping per operation)
    autograd: ClassVar[bool] = True

    def params(self) -> dict:
        return {}

    def count(self, view: QueryView) -> Count:
        raise NotImplementedError

    def blocks(self, direction: str, compat: bool) -> bool:
        """Whether the view's queries may be counted in blocks of rows (each block against all candidates): every
        per-query value of :meth:`count` is a function of its query's row alone, and :meth:`batch_of` gives the
        batch values from the blocks' rows. False here: a counter that does not say so is counted whole (what lets
        :func:`cocos.counting.blocks.count_batch_values` bound the memory of a big batch)."""
        return False

    def batch_of(self, values: dict[str, torch.Tensor], compat: bool) -> dict[str, torch.Tensor]:
        """``count(view).batch`` from ``count(view).per_query`` (all the view's queries), computed as :meth:`count`
        computes it: the same values, bit for bit, for the counters whose :meth:`blocks` is True."""
        raise NotImplementedError(f"{type(self).__name__} does not count in blocks")

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
    ``binary``, the weights' row sums where the caller has them (:func:`~cocos.losses.kernels.binary_companion_rows`).
    """
    values = companion_values(weights, binary, counts)
    return values, nanmeans(values)


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
    temporaries. ``binary``: the weights are 0 or 1 (or booleans), see
    :func:`~cocos.losses.kernels.binary_companion_rows` (``counts``: their row sums, where the caller has them).
    ``total``, ``largest``: ``weights.sum(-1)`` and ``weights.amax(-1)`` of float weights, where the caller has
    them (the largest share ``max u`` is then ``largest / total``: division by a positive number keeps the order, so the
    largest quotient is the quotient of the largest, correctly rounded alike)."""
    if binary:
        return binary_companion_rows(weights, counts)
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


def nanmeans(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`nanmean` of each of several tensors of one shape and dtype, in one call (each row as alone)."""
    if not values:
        return {}
    return dict(zip(values, nanmean(torch.stack(list(values.values()))).unbind(0), strict=True))


def nanmean(x: torch.Tensor) -> torch.Tensor:
    """Mean over the last axis ignoring NaN; NaN when every entry is NaN.

    For floats :func:`torch.nanmean` (the sum of the entries that are not NaN, in the order of ``sum``, over their
    number: bit for bit ``where(ok, x, 0).sum(-1) / ok.sum(-1)``, in one call instead of seven)."""
    if x.is_floating_point():
        return torch.nanmean(x, -1)
    n = torch.full(x.shape[:-1], x.shape[-1], device=x.device)  # integers have no NaN
    return torch.where(n > 0, x.sum(-1) / n.clamp(min=1), torch.nan)
