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
from cocos.losses.counts import DEFAULT_EPS, Count, Counter, companions, thresholded_sums
from cocos.losses.functional import ntxent_log_probs


class NTXentCounter(Counter):
    uses_eps = True

    def __init__(self, tau: float = DEFAULT_TAU_NTXENT, eps: float = DEFAULT_EPS) -> None:
        check_params(tau=tau, eps=eps)
        self.tau = float(tau)
        self.eps = float(eps)

    def params(self) -> dict:
        return {"tau": self.tau, "eps": self.eps}

    def probabilities(self, view: QueryView) -> torch.Tensor:
        return ntxent_log_probs(view, self.tau).exp()

    def _count(self, p: torch.Tensor, view: QueryView, eps: float, extras: bool = True) -> Count:
        neg_p = torch.where(view.neg, p, 0.0)
        above = view.neg & (p > eps)
        below = view.neg & (p < eps)
        per_query = {
            "C_qv-": above.sum(-1).to(torch.float64),
            "W_qv-": torch.where(above, p, 0.0).sum(-1).to(torch.float64),
            "W_qv+": 1.0 - torch.where(view.pos, p, 0.0).sum(-1).to(torch.float64),
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

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        p = self.probabilities(view)
        return {float(e): self._count(p, view, float(e), extras=False) for e in eps_values}

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """One softmax for the count and every threshold; the thresholds' counts and weights by
        :func:`~cocos.losses.counts.thresholded_sums` (only rows with negatives on both sides of a threshold
        are summed again); ``W_qv+`` does not depend on ``eps``. Equal to ``count`` and ``sweep``."""
        p = self.probabilities(view)
        main = self._count(p, view, self.eps)
        if not eps_values:
            return main, {}
        swept = {}
        for e, (c_above, w_above, w_below) in zip(eps_values, thresholded_sums(p, view.neg, eps_values), strict=True):
            swept[float(e)] = {"C_qv-": c_above.to(torch.float64).mean(-1),
                               "W_qv-": w_above.to(torch.float64).mean(-1),
                               "W_qv+": main.batch["W_qv+"],
                               "W_low": w_below.to(torch.float64).mean(-1)}
        return main, swept
