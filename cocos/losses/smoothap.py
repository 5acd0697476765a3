"""COCOS for SmoothAP, computed from positive rows only (``Q x |P| x M``, never ``Q x M x M``).

For query ``q`` and anchor ``a`` (a positive): ``G(a, b) = sigmoid((s_b - s_a) / tau)``
(the training loss's own sigmoid, exponent clamped to [-50, 50], ``G(a, a) = 0``),
``R(a) = 1 + sum_b G(a, b)`` and ``w(a, b) = G (1 - G) / R(a)^2`` (``1 - G`` as
``sigmoid(-x)``, so that float32 and float64 agree) (the sigmoid's
derivative without its ``1/tau``, as in the published counter). Per query
``C^q(q) = 1/|P_q| sum_a #{b != a : w(a, b) > eps}``.

``compat`` t2i reproduces the published counter: caption query ``q`` takes the rows
``k q .. k q + k - 1`` (those ``< B``) of its image-by-image matrix instead of the
row of its own image, and divides by 1; for ``q >= B / k`` nothing is counted. A batch
where no query has a weight above ``eps`` gets ``C^q = 0`` in compat mode (the published
counter averages that 0 in) and NaN otherwise (left out of the mean, reported as skipped).
"""

from __future__ import annotations

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_TAU_SMOOTHAP
from cocos.errors import check_params
from cocos.losses.counts import DEFAULT_EPS, Count, Counter, companion_values, companions, nanmeans
from cocos.losses.functional import SIGMOID_CLAMP, smoothap_direction
from cocos.losses.kernels import (
    counts_above_summed,
    per_view,
    positives,
    smoothap_pair_weights,
    vectorised_whole,
    view_key,
)
from cocos.losses.spec import Note, Objective


class SmoothAPCounter(Counter):
    uses_eps = True
    chunk_invariant = True
    autograd = False

    def __init__(self, tau: float = DEFAULT_TAU_SMOOTHAP, eps: float = DEFAULT_EPS) -> None:
        check_params(tau=tau, eps=eps)
        self.tau = float(tau)
        self.eps = float(eps)

    def params(self) -> dict:
        return {"tau": self.tau, "eps": self.eps}

    @staticmethod
    def anchors(view: QueryView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(anchors, valid, divisor)``: which rows of the ``K x K`` matrix each query uses."""
        if view.compat and view.direction == "t2i":
            q, k_cand = view.scores.shape[-2:]
            k = view.group_size
            device = view.scores.device
            rows = torch.arange(q, device=device)[:, None] * k + torch.arange(k, device=device)
            valid = rows < k_cand
            lead = view.scores.shape[:-2]
            rows = rows.clamp(max=k_cand - 1).expand(*lead, q, k)
            valid = valid.expand(*lead, q, k)
            divisor = torch.ones(q, device=device, dtype=view.scores.dtype)
            return rows, valid, divisor
        idx, valid = positives(view)
        return idx, valid, valid.sum(-1).clamp(min=1).to(view.scores.dtype)

    def pair_weights(self, view: QueryView):
        """``w(a, b)`` of shape ``(..., Q, A, K)`` and the per-query divisor."""
        w, divisor, n = self._weights(view)
        return _pad_queries(w, view.scores.shape[-2], 0.0, dim=-3), divisor

    def _weights(self, view: QueryView) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(w, divisor, n)``: the pair weights of the first ``n`` queries; every other query's are 0.

        ``n`` is ``Q`` except in the published t2i layout, where only the first ``ceil(K / k)`` caption queries
        have an anchor row ``< K`` (26 of 640 at batch 128): only those are computed, with every sigmoid in the
        vectorised loop, bit for bit what the whole tensor gives where it is tail-free
        (:func:`~cocos.losses.kernels.vectorised_whole`; otherwise the whole tensor is computed)."""
        rows, valid, divisor = self.anchors(view)
        scores = view.scores
        candidates = view.candidates if view.excludes_any() else None  # None: every pair is a candidate
        q, n = scores.shape[-2], scores.shape[-2]
        if view.compat and view.direction == "t2i":
            first = min(q, -(-scores.shape[-1] // view.group_size))
            whole = rows.numel() * scores.shape[-1]
            if first < q and (scores.device.type != "cpu" or vectorised_whole(whole)):
                n = first
                scores, rows, valid = (x[..., :n, :] for x in (scores, rows, valid))
                candidates = None if candidates is None else candidates[..., :n, :]
        w = smoothap_pair_weights(scores, rows, valid, candidates, self.tau, SIGMOID_CLAMP, vectorised=n < q)
        return w, divisor, n

    def _count(
        self, w: torch.Tensor, divisor: torch.Tensor, view: QueryView, eps: float, extras: bool = True
    ) -> Count:
        c_q = (w > eps).sum(-1).sum(-1).to(torch.float64) / divisor.to(torch.float64)
        batch = self._batch(c_q, view.compat)
        if not extras:
            return Count({"C_q": c_q}, batch, view.n_excluded)
        neg_w = torch.where(view.neg, w.sum(-2), 0.0)
        comp_q, comp_b = companions(neg_w)
        batch.update(comp_b)
        return Count({"C_q": c_q, **comp_q}, batch, view.n_excluded, weights=neg_w)

    @staticmethod
    def _batch(c_q: torch.Tensor, compat: bool) -> dict[str, torch.Tensor]:
        """``C^q``, ``C^0`` and ``C^B`` of a batch from the per-query counts."""
        c_0 = (c_q == 0).sum(-1).to(torch.float64)
        with_grad = c_q.shape[-1] - c_0
        c_b = c_q.sum(-1)
        # No query with a weight above eps: corrected mode has no C^q for the batch (NaN, left out of
        # the mean and counted as skipped); the published counter returns 0 and averages it in.
        empty = 0.0 if compat else torch.nan
        return {
            "C_q": torch.where(with_grad > 0, c_b / with_grad.clamp(min=1), empty),
            "C_0": c_0,
            "C_B": c_b,
        }

    def count(self, view: QueryView) -> Count:
        w, divisor = self.pair_weights(view)
        return self._count(w, divisor, view, self.eps)

    def blocks(self, direction: str, compat: bool) -> bool:
        """Row by row, but for the published t2i layout, whose anchors are read from the query's index."""
        return not (compat and direction == "t2i")

    def batch_of(self, values: dict[str, torch.Tensor], compat: bool) -> dict[str, torch.Tensor]:
        """:meth:`_batch` of the per-query counts and the companions' means (as :meth:`_count`)."""
        return {**self._batch(values["C_q"], compat),
                **nanmeans({k: v for k, v in values.items() if k != "C_q"})}

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        w, divisor = self.pair_weights(view)
        return {float(e): self._count(w, divisor, view, float(e), extras=False) for e in eps_values}

    def _per_query(self, view: QueryView, eps_values) -> tuple:
        """Everything of :meth:`count_sweep` that does not depend on the mode: ``(C_q, companions per query,
        their batch values)``; ``C_q`` is ``(E, ..., Q)``, one row for the counter's threshold and one for each of
        ``eps_values``."""
        q = view.scores.shape[-2]
        counts, w_sum, divisor, n = self._reduced(view, [self.eps, *eps_values])
        # (E, ..., Q), one row per threshold; as _count: (w > eps) over anchors and candidates, over the divisor
        c_q = _pad_queries(counts.to(torch.float64), q, 0.0) / divisor.to(torch.float64)
        neg_w = torch.where(view.neg[..., :n, :], w_sum, 0.0)
        comp_q = companion_values(neg_w)
        comp_q = {k: _pad_queries(v, q, torch.nan) for k, v in comp_q.items()}
        comp_b = nanmeans(comp_q)
        return c_q, comp_q, comp_b

    def _reduced(self, view: QueryView, thresholds) -> tuple:
        """``(counts, w_sum, divisor, n)``: the pair weights of the first ``n`` queries (:meth:`_weights`) counted
        above each threshold (``(E, ..., n)``) and summed over the anchors (``(..., n, K)``; one anchor: its row,
        the same values without a pass)."""
        w, divisor, n = self._weights(view)
        w_sum = w[..., 0, :] if w.shape[-2] == 1 else w.sum(-2)
        return torch.stack(counts_above_summed(w, w_sum, thresholds)), w_sum, divisor, n

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """The pair weights once for the count and every threshold; the thresholds' counts in one pass
        (:func:`~cocos.losses.kernels.counts_above_summed`). Equal to ``count`` (without its weights: the engine's
        entry point) and ``sweep``."""
        # the published t2i anchors differ from the corrected ones; otherwise equal views (both modes of a
        # ranking batch, which has no same-image pairs) share one computation, the modes differing only in
        # the batch value of an empty batch (_batch)
        odd = view.compat and view.direction == "t2i"
        eps_values = [float(e) for e in eps_values]
        c_q, comp_q, comp_b = per_view(
            view, ("smoothap", self.tau, self.eps, tuple(eps_values), odd, *view_key(view)),
            lambda: self._per_query(view, eps_values))
        # every threshold at once, each row as alone: (E, ...), one value per threshold
        batch = {k: v.unbind(0) for k, v in self._batch(c_q, view.compat).items()}
        main = Count({"C_q": c_q[0], **comp_q}, {**{k: v[0] for k, v in batch.items()}, **comp_b}, view.n_excluded)
        return main, {e: {k: v[j] for k, v in batch.items()} for j, e in enumerate(eps_values, 1)}


def _pad_queries(x: torch.Tensor, q: int, fill: float, dim: int = -1) -> torch.Tensor:
    """``x`` holding the first ``n`` of ``q`` queries along ``dim``, with the other queries set to ``fill``."""
    n = x.shape[dim]
    if n == q:
        return x
    shape = list(x.shape)
    shape[dim] = q
    out = x.new_full(shape, fill)
    out.narrow(dim, 0, n).copy_(x)
    return out


# -- the family's spec: what the paper says about it -------------------------------------------------------------

SMOOTHAP_ARTEFACT = Note(
    "SmoothAP t2i in compat mode reproduces the published counter: for caption query q it takes the "
    "rows k·q … k·q+k−1 of the image-by-image matrix (those < B) instead of the row of the caption's "
    "own image, so for q ≥ B/k the slice is empty and nearly every caption query counts as "
    "zero-gradient (the paper's Table 4 shows C^0 ≈ 637 of 640). The corrected counter uses the "
    "caption's own image. In compat mode a batch where no query has a weight above ε counts as "
    "C^q = 0, as published; the corrected mean leaves it out.",
    r"SmoothAP t2i in compat mode reproduces the published counter: for caption query $q$ it takes "
    r"the rows $kq \ldots kq+k-1$ of the image-by-image matrix (those $< B$) instead of the row of the "
    r"caption's own image, so for $q \geq B/k$ the slice is empty and nearly every caption query "
    r"counts as zero-gradient (the paper's Table 4 shows $C^{0} \approx 637$ of 640). The corrected "
    r"counter uses the caption's own image. In compat mode a batch where no query has a weight above "
    r"$\varepsilon$ counts as $C^{q} = 0$, as published; the corrected mean leaves it out.",
    when="compat",
)

SMOOTHAP = Objective(
    name="smoothap", label="SmoothAP", layout="ranking",
    direction_loss=smoothap_direction, defaults={"tau": 0.01}, combine="mean", reduce="mean",
    counter=SmoothAPCounter, stats=("C_q", "C_0"), main_stat="C_q", table="4", color="#d62728", marker="D",
    notes=(SMOOTHAP_ARTEFACT,), description="1 - smoothed average precision (ranking batches)",
)
