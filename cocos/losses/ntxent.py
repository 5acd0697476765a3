"""COCOS for NT-Xent: softmax weights of the negatives above the threshold eps.

Per query, ``p(q, .)`` is the softmax of ``s / tau`` over its candidates (the same
log-softmax as the training loss). ``C^{qv-}`` counts negatives with ``p > eps``,
``W^{qv-}`` sums their weight, ``W_low`` sums the weight under the threshold and
``W^{qv+} = 1 - p(q, p)``. Batch values are means over **all** queries.
"""

from __future__ import annotations

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_TAU_NTXENT
from cocos.errors import check_params
from cocos.losses.counts import (
    COMPANIONS,
    DEFAULT_EPS,
    Count,
    Counter,
    companion_rows,
    companions,
    nanmean,
    nanmeans,
)
from cocos.losses.functional import ntxent_direction, ntxent_log_probs
from cocos.losses.kernels import per_query, per_view, positives, thresholded_sums_stacked, view_key
from cocos.losses.spec import Note, Objective


class NTXentCounter(Counter):
    uses_eps = True
    chunk_invariant = True
    autograd = False

    def __init__(self, tau: float = DEFAULT_TAU_NTXENT, eps: float = DEFAULT_EPS) -> None:
        check_params(tau=tau, eps=eps)
        self.tau = float(tau)
        self.eps = float(eps)

    def params(self) -> dict:
        return {"tau": self.tau, "eps": self.eps}

    def probabilities(self, view: QueryView) -> torch.Tensor:
        logp = ntxent_log_probs(view, self.tau)
        return logp.exp() if logp.requires_grad else logp.exp_()  # in place where nothing records it

    def _count(self, p: torch.Tensor, view: QueryView, eps: float, extras: bool = True) -> Count:
        neg_p = torch.where(view.neg, p, 0.0)
        above = view.neg & (p > eps)
        below = view.neg & (p < eps)
        per_query = {
            "C_qv-": above.sum(-1).to(torch.float64),
            "W_qv-": torch.where(above, p, 0.0).sum(-1).to(torch.float64),
            "W_qv+": self.positive_weight(p, view),
            "W_low": torch.where(below, p, 0.0).sum(-1).to(torch.float64),
        }
        batch = {k: v.mean(-1) for k, v in per_query.items()}
        if not extras:
            return Count(per_query, batch, view.n_excluded)
        comp_q, comp_b = companions(neg_p)
        batch.update(comp_b)
        return Count({**per_query, **comp_q}, batch, view.n_excluded, weights=neg_p)

    def count(self, view: QueryView) -> Count:
        return self._count(self.probabilities(view), view, self.eps)

    def blocks(self, direction: str, compat: bool) -> bool:
        """Row by row: a query's probabilities are a softmax over its own row."""
        return True

    def batch_of(self, values: dict[str, torch.Tensor], compat: bool) -> dict[str, torch.Tensor]:
        """The means over the queries, the companions' over those with weight (as :meth:`_count`)."""
        stats = {k: v.mean(-1) for k, v in values.items() if k not in COMPANIONS}
        return {**stats, **nanmeans({k: v for k, v in values.items() if k in COMPANIONS})}

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        p = self.probabilities(view)
        return {float(e): self._count(p, view, float(e), extras=False) for e in eps_values}

    def _per_query(self, view: QueryView, thresholds) -> dict[str, torch.Tensor]:
        """Every per-query value of :meth:`count_sweep` (row by row) as one float64 tensor ``{"stats": (S, ...,
        Q)}``, in this order: the counts (``C_qv-``), the weights above (``W_qv-``) and below (``W_low``) each of
        the ``E`` thresholds, ``W_qv+`` and the three companions. The weights on the negatives go to the view's
        memo."""
        p = self.probabilities(view)
        neg_p = per_view(view, self._neg_key(view), lambda: torch.where(view.neg, p, 0.0))
        neg_sum, neg_max = neg_p.sum(-1), neg_p.amax(-1)  # for the thresholds and the companions alike
        above, w_above, w_below = thresholded_sums_stacked(p, view.neg, thresholds, masked=neg_p, masked_sum=neg_sum,
                                                           masked_max=neg_max)  # (E, ..., Q)
        w_pos = self.positive_weight(p, view)
        parts = (above, w_above, w_below, w_pos[None], companion_rows(neg_p, total=neg_sum, largest=neg_max))
        rows = torch.empty((sum(len(x) for x in parts), *w_pos.shape), dtype=torch.float64, device=w_pos.device)
        for x, out in zip(parts, rows.split([len(x) for x in parts]), strict=True):
            out.copy_(x)  # to float64 on the way
        return {"stats": rows}

    def positive_weight(self, p: torch.Tensor, view: QueryView) -> torch.Tensor:
        """``W^{qv+}`` per query (float64): ``1 - sum of p over the positives``."""
        idx, valid = positives(view)
        if idx.shape[-1] == 1:  # one positive at most: the row's sum of p * pos is its entry (the others add 0)
            on_pos = torch.where(valid[..., 0], p.gather(-1, idx)[..., 0], 0.0)
        else:
            on_pos = torch.where(view.pos, p, 0.0).sum(-1)
        return 1.0 - on_pos.to(torch.float64)

    def key(self) -> tuple:
        """What the weights depend on besides the view (memo keys of the shared per-query values)."""
        return ("ntxent", self.tau)

    def _neg_key(self, view: QueryView) -> tuple:
        return (*self.key(), "neg_p", *view_key(view))

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """One softmax for the count and every threshold; the counts and weights at the counter's own threshold
        and every other by :func:`~cocos.losses.kernels.thresholded_sums` (only rows with negatives on both sides
        of a threshold are summed again, bit for bit the sums of :meth:`count`); ``W_qv+`` does not depend on
        ``eps``. Per-query values are shared by views that differ in a few rows
        (:func:`~cocos.losses.kernels.per_query`). Equal to ``count`` (without its weights: the engine's entry
        point) and ``sweep``."""
        thresholds = (self.eps, *(float(e) for e in eps_values))
        rows = per_query(view, (*self.key(), thresholds), lambda v: self._per_query(v, thresholds),
                         rest_first=True)["stats"]  # (S, ..., Q), _per_query's rows
        n = len(thresholds)
        c_at, w_at, low_at, pos_at, comp_at = 0, n, 2 * n, 3 * n, 3 * n + 1
        means = rows[:comp_at].mean(-1).unbind(0)  # every threshold at once, each row as alone
        comp_b = nanmean(rows[comp_at:]).unbind(0)
        rows = rows.unbind(0)

        def at(j: int) -> dict[str, torch.Tensor]:
            return {"C_qv-": means[c_at + j], "W_qv-": means[w_at + j], "W_qv+": means[pos_at],
                    "W_low": means[low_at + j]}

        per_q = {"C_qv-": rows[c_at], "W_qv-": rows[w_at], "W_qv+": rows[pos_at], "W_low": rows[low_at],
                 **dict(zip(COMPANIONS, rows[comp_at:], strict=True))}
        main = Count(per_q, {**at(0), **dict(zip(COMPANIONS, comp_b, strict=True))}, view.n_excluded)
        return main, {e: at(j) for j, e in enumerate(thresholds) if j}


# -- the family's spec: what the paper says about it -------------------------------------------------------------

NTXENT_WEIGHTS = Note(
    "Weights exclude the 1/τ factor of the gradient; W_low is the weight of the negatives under ε "
    "(beyond the paper).",
    r"Weights exclude the $1/\tau$ factor of the gradient; $W_{\mathrm{low}}$ is the weight of the "
    r"negatives under $\varepsilon$ (beyond the paper).",
)

NTXENT = Objective(
    name="ntxent", label="NT-Xent", layout="pair",
    direction_loss=ntxent_direction, defaults={"tau": DEFAULT_TAU_NTXENT}, combine="mean", reduce="mean",
    counter=NTXentCounter, stats=("C_qv-", "W_qv-", "W_qv+", "W_low"), main_stat="C_qv-", table="3",
    color="#2ca02c", marker="^", notes=(NTXENT_WEIGHTS,), description="softmax cross-entropy at temperature tau",
    temperature="tau",
)
