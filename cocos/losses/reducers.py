"""Terms and reducers (pytorch-metric-learning's pattern), and the closed-form counter of a family given by terms.

A family's *terms* (:attr:`cocos.losses.spec.Objective.terms`) are a function ``terms(view, **params)`` of one
direction (a :class:`~cocos.data.layout.QueryView`) returning its non-negative per-(query, candidate) terms,
``(..., Q, K)``, or per (query, positive, candidate), ``(..., Q, A, K)`` (several positives per query). A
*reducer* turns them into a number:

* :class:`SumReducer`: their sum (the training loss of a hinge family: Triplet's is the sum of its terms);
* :class:`AvgNonZeroReducer`: their mean over the terms above 0, recording how many passed (``n_passed``);
* :class:`CountAboveReducer`: the number of terms above ``eps`` (0 for hinge-like terms: strictly above).

Each reduces the whole tensor (``reducer(terms)``, a scalar) or each query's terms (``reducer.per_query(terms,
view)``, ``(..., Q)``).

Where a term's gradient weight on its score is its indicator (hinge-like terms, whose gradient is 1 where the
hinge is active and 0 elsewhere), the terms are all a counter needs: :class:`TermsCounter` counts per query
``C_q(q) = #{terms of q > eps}`` (definitions file, "Triplet": ``eps = 0``, a term exactly at 0 has no
gradient), ``C^B``, ``C^0`` and ``C^q`` as :func:`~cocos.losses.counts.batch_counts` (``C^q`` over the queries
with a gradient, NaN where none has one), and the companions of each query's weights on its negatives, the
number of its passing terms per negative. Hand-written counters remain only where a gradient weight is not the
term's indicator (NT-Xent's softmax, SmoothAP's sigmoid derivatives, GOAL's designed weights).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cocos.data.layout import QueryView
from cocos.errors import check_params
from cocos.losses import kernels
from cocos.losses.counts import Count, Counter, batch_counts, companion_values, companions, nanmeans


class Reducer:
    """Reduces a family's terms: :meth:`__call__` over all of them, :meth:`per_query` per query."""

    def __call__(self, terms: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def per_query(self, terms: torch.Tensor, view: QueryView) -> torch.Tensor:
        raise NotImplementedError


def query_axes(terms: torch.Tensor, view: QueryView) -> tuple[int, ...]:
    """The axes of ``terms`` after its query axis: ``(-1,)`` for ``(..., Q, K)``, ``(-2, -1)`` for ``(..., Q, A,
    K)`` (the view's scores are ``(..., Q, K)``)."""
    return tuple(range(-1 - (terms.ndim - view.scores.ndim), 0))


class SumReducer(Reducer):
    """``sum`` of the terms (per query: of its terms)."""

    def __call__(self, terms: torch.Tensor) -> torch.Tensor:
        return terms.sum()

    def per_query(self, terms: torch.Tensor, view: QueryView) -> torch.Tensor:
        return terms.sum(query_axes(terms, view))


class AvgNonZeroReducer(Reducer):
    """The mean of the terms above 0 (0 where none is): ``sum / #{terms > 0}``. A call records that number in
    ``n_passed`` (an int), as pytorch-metric-learning's ``AvgNonZeroReducer`` records its pairs."""

    def __init__(self) -> None:
        self.n_passed = 0

    def __call__(self, terms: torch.Tensor) -> torch.Tensor:
        n = int((terms > 0).sum())
        self.n_passed = n
        return terms.sum() / max(n, 1)

    def per_query(self, terms: torch.Tensor, view: QueryView) -> torch.Tensor:
        axes = query_axes(terms, view)
        return terms.sum(axes) / (terms > 0).sum(axes).clamp(min=1)


class CountAboveReducer(Reducer):
    """The number of terms above ``eps`` (int64), strictly: ``(terms > eps).sum()``."""

    def __init__(self, eps: float = 0.0) -> None:
        self.eps = float(eps)

    def passed(self, terms: torch.Tensor) -> torch.Tensor:
        """The terms that count, as booleans of the terms' shape."""
        return terms > self.eps

    def __call__(self, terms: torch.Tensor) -> torch.Tensor:
        return self.passed(terms).sum()

    def per_query(self, terms: torch.Tensor, view: QueryView) -> torch.Tensor:
        return self.passed(terms).sum(query_axes(terms, view))


class TermsLoss:
    """A direction loss ``(view, **params) -> scalar`` made of a family's terms and a reducer (by default their
    sum): the direction loss of a family given only by its terms."""

    def __init__(self, terms: Callable[..., torch.Tensor], reducer: Reducer | None = None) -> None:
        self.terms = terms
        self.reducer = SumReducer() if reducer is None else reducer

    def __call__(self, view: QueryView, **params) -> torch.Tensor:
        return self.reducer(self.terms(view, **params))

    def __repr__(self) -> str:
        return f"TermsLoss({getattr(self.terms, '__name__', self.terms)!r}, {type(self.reducer).__name__})"


class TermsCounter(Counter):
    """The closed-form count of a family given by hinge-like terms (see the module docstring).

    ``terms(view, **params)`` as :attr:`~cocos.losses.spec.Objective.terms`; ``eps``: the threshold a term must
    pass (0: strictly positive). ``row_wise``: the terms of a query depend on its row alone (and not on the
    view's direction), so the engine's stacked rows of both counting modes share one computation
    (:func:`~cocos.losses.kernels.per_query`); a plugin's terms are computed view by view.
    """

    autograd = False
    row_wise = False

    def __init__(self, terms: Callable[..., torch.Tensor], eps: float = 0.0, **params) -> None:
        if eps:
            check_params(eps=eps)
        self.terms = terms
        self.reducer = CountAboveReducer(eps)
        self.loss_params = dict(params)

    def params(self) -> dict:
        return dict(self.loss_params)

    def _key(self, what: str) -> tuple:
        return (what, self.terms, self.reducer.eps, *sorted(self.loss_params.items()))

    def _memo(self, view: QueryView, what: str, compute) -> dict[str, torch.Tensor]:
        if self.row_wise:
            return kernels.per_query(view, self._key(what), compute)
        return kernels.per_view(view, (*self._key(what), *kernels.view_key(view)), lambda: compute(view))

    def passed(self, view: QueryView) -> torch.Tensor:
        """The passing terms, booleans ``(..., Q, K)``, or ``(..., Q, A, K)`` with several positives per query
        (one positive: its axis dropped), once per view."""
        def compute(v: QueryView) -> dict[str, torch.Tensor]:
            hits = self.reducer.passed(self.terms(v, **self.loss_params))
            return {"hit": hits[..., 0, :] if hits.ndim > v.scores.ndim and hits.shape[-2] == 1 else hits}

        return self._memo(view, "terms_passed", compute)["hit"]

    def weights(self, view: QueryView) -> torch.Tensor:
        """``(..., Q, K)``: each query's number of passing terms on each candidate (float64 0/1 with one term per
        candidate, int64 counts otherwise): the weights the companions read."""
        hits = self.passed(view)
        return hits.to(torch.float64) if hits.ndim == view.scores.ndim else hits.sum(-2)

    def _per_query(self, view: QueryView) -> dict[str, torch.Tensor]:
        """``C_q`` and the companions of each query (row by row)."""
        hits = self.passed(view)
        if hits.ndim == view.scores.ndim:  # one term per candidate: 0/1 weights, counted from the booleans
            n = hits.sum(-1, dtype=torch.int32)
            return {"C_q": n.to(torch.int64), **companion_values(hits, binary=True, counts=n)}
        per_negative = hits.sum(-2)
        return {"C_q": per_negative.sum(-1), **companion_values(per_negative)}

    def count(self, view: QueryView) -> Count:
        return self._count(view, keep_weights=True)

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """:meth:`count` without the weights (the engine's entry point; the count has no threshold to sweep)."""
        if eps_values:
            return super().count_sweep(view, eps_values)
        return self._count(view, keep_weights=False), {}

    def blocks(self, direction: str, compat: bool) -> bool:
        """False: nothing in a family's ``terms`` says a query's terms read its own row alone (a plugin's may read a
        column's maximum); a family whose terms are row by row says so (Triplet, Triplet SH)."""
        return False

    def batch_of(self, values: dict[str, torch.Tensor], compat: bool) -> dict[str, torch.Tensor]:
        """``C^B``, ``C^0``, ``C^q`` of the per-query counts and the companions' means (as :meth:`_count`)."""
        return {**batch_counts(values["C_q"]), **nanmeans({k: v for k, v in values.items() if k != "C_q"})}

    def _grouped(self, view: QueryView) -> tuple[torch.Tensor, dict, dict, str | None]:
        """``(per-item counts, companions per item, their batch values, item kind)``: per query here."""
        q = self._memo(view, "terms_queries", self._per_query)
        comp_q = {k: v for k, v in q.items() if k != "C_q"}
        return q["C_q"], comp_q, nanmeans(comp_q), None

    def _count(self, view: QueryView, keep_weights: bool) -> Count:
        grouped, comp_q, comp_b, item_kind = self._grouped(view)
        batch = batch_counts(grouped)
        batch.update(comp_b)
        return Count(per_query={"C_q": grouped.to(torch.float64), **comp_q}, batch=batch, n_excluded=view.n_excluded,
                     weights=self.weights(view) if keep_weights else None, item_kind=item_kind)


def by_candidate(counter: TermsCounter, view: QueryView) -> tuple[torch.Tensor, dict, dict]:
    """``(C(i), companions per candidate, their batch values)``: the passing terms grouped by *candidate* instead
    of query, ``C(i) = #{passing terms on candidate i}`` over all queries (the published Triplet counter's t2i
    grouping, definitions file "compat, Triplet t2i")."""
    hits = counter.passed(view)
    if hits.ndim == view.scores.ndim:  # 0/1 per (query, candidate): kept as booleans
        n = hits.sum(-2, dtype=torch.int32)
        comp_q, comp_b = companions(hits.transpose(-1, -2), binary=True, counts=n)
        return n.to(torch.int64), comp_q, comp_b
    v = hits.sum(-2)
    comp_q, comp_b = companions(v.transpose(-1, -2))
    return v.sum(-2), comp_q, comp_b
