"""COCOS for the Triplet loss (all triplets) and Triplet SH (hardest negative).

Violation ``v(q, n) = 1{alpha + s(q,n) - s(q,p) > 0}`` (strict), from the same
hinge the training loss uses (:func:`cocos.losses.functional.triplet_hinge`).
With several positives per query, each (query, positive) pair is an anchor of the
loss and its triplets are summed; in a pair batch there is one positive.
"""

from __future__ import annotations

from functools import partial

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import check_params
from cocos.losses.counts import (
    COMPANIONS,
    Count,
    Counter,
    batch_counts,
    companion_values,
    companions,
    nanmeans,
    per_query,
    per_view,
    positives,
    view_key,
)
from cocos.losses.functional import triplet_direction, triplet_hinge
from cocos.losses.spec import Note, Objective


class TripletCounter(Counter):
    """Per query ``C^q(q) = sum_n v(q, n)`` (summed over positives); ``C^B``, ``C^0``, ``C^q`` per batch.

    ``compat`` t2i reproduces the published counter: violations are grouped by the
    *negative image* instead of the caption query, ``C(i) = #{j : v(j, i)}``;
    ``C^B`` is unchanged, ``C^0`` and ``C^q`` are computed over the ``C(i)``.
    """

    hardest = False
    chunk_invariant = True
    autograd = False

    def __init__(self, margin: float = DEFAULT_MARGIN) -> None:
        check_params(margin=margin)
        self.margin = float(margin)

    def params(self) -> dict:
        return {"margin": self.margin}

    def violations(self, view: QueryView) -> torch.Tensor:
        """``(..., Q, K)``: number of (positive, negative) triplets of each query that violate."""
        return per_query(view, ("violations", self.margin, self.hardest), lambda v: {"v": self._violations(v)})["v"]

    def _hinge(self, view: QueryView) -> torch.Tensor:
        """``(..., Q, A, K)``, once per view for Triplet and Triplet SH at the same margin."""
        return per_view(view, ("triplet_hinge", self.margin, *view_key(view)),
                        lambda: triplet_hinge(view, self.margin, positives(view)))

    def _hits(self, view: QueryView) -> torch.Tensor:
        """``(..., Q, K)`` bool, one positive per query: the violations, once per view (and row stack)."""
        return per_query(view, ("triplet_hits", self.margin), lambda v: {"hit": self._hinge(v)[..., 0, :] > 0})["hit"]

    def _violations(self, view: QueryView) -> torch.Tensor:
        hinge = self._hinge(view)
        if self.hardest:  # the first hardest negative of each (query, positive), where it violates
            first = hinge.argmax(-1, keepdim=True)
            hit = torch.gather(hinge, -1, first) > 0
            if hinge.shape[-2] == 1:  # one positive (pair batches): the one-hot row is the count
                v = torch.zeros(hinge.shape[:-2] + hinge.shape[-1:], dtype=torch.int64, device=hinge.device)
                return v.scatter_(-1, first[..., 0, :], hit[..., 0, :].to(torch.int64))
            return torch.zeros_like(hinge, dtype=torch.bool).scatter_(-1, first, hit).sum(-2)
        if hinge.shape[-2] == 1:  # one positive: the 0/1 violations (as weights; the counts use the booleans)
            return self._hits(view).to(torch.float64)
        return (hinge > 0).sum(-2)

    def _per_query(self, view: QueryView) -> dict[str, torch.Tensor]:
        """``C^q`` of each query and the companions of its violations (row by row)."""
        hinge = self._hinge(view)
        if self.hardest and hinge.shape[-2] == 1:
            # one positive: the violations are one-hot (the first hardest negative, where it violates), so the
            # query counts where its largest hinge is positive, and the companions of a row with a single 1 are
            # exactly 1 (u = 1 there and 0 elsewhere: H = -(0 + (-0)...) = -0, exp(-0) = 1, sum u^2 = 1, max u
            # = 1), NaN for a row without
            hit = hinge[..., 0, :].amax(-1) > 0
            ones = torch.where(hit, 1.0, torch.nan).to(torch.float64)
            return {"C_q": hit.to(torch.int64), **dict.fromkeys(COMPANIONS, ones)}
        if hinge.shape[-2] == 1:  # one positive: the violations are 0/1, counted from the booleans
            hit = self._hits(view)
            n = hit.sum(-1, dtype=torch.int32)
            return {"C_q": n.to(torch.int64), **companion_values(hit, binary=True, counts=n)}
        v = self.violations(view)
        counts = v.sum(-1)
        if self.hardest:  # 1 if the hardest negative violates for any positive (0 or 1 per query)
            counts = (counts > 0).to(counts.dtype)
        return {"C_q": counts, **companion_values(v)}

    def count(self, view: QueryView) -> Count:
        return self._count(view, keep_weights=True)

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """:meth:`count` without the weights (the engine's entry point; the counter has no threshold)."""
        if eps_values:
            return super().count_sweep(view, eps_values)
        return self._count(view, keep_weights=False), {}

    def _count(self, view: QueryView, keep_weights: bool) -> Count:
        if view.compat and not self.hardest and view.direction == "t2i":
            # by negative image: image i's entry collects the caption queries it violates for
            if positives(view)[0].shape[-1] == 1:  # one positive: the violations are 0/1, kept as booleans
                hit = self._hits(view)
                n = hit.sum(-2, dtype=torch.int32)
                grouped = n.to(torch.int64)
                comp_q, comp_b = companions(hit.transpose(-1, -2), binary=True, counts=n)
            else:
                v = self.violations(view)
                grouped = v.sum(-2)
                comp_q, comp_b = companions(v.transpose(-1, -2))
            item_kind = "image"
        else:
            q = per_query(view, ("triplet_queries", self.margin, self.hardest), self._per_query)
            grouped, item_kind = q["C_q"], None
            comp_q = {k: q[k] for k in COMPANIONS}
            comp_b = nanmeans(comp_q)
        v = self.violations(view) if keep_weights else None  # the violations as weights, if asked (not by the engine)
        batch = batch_counts(grouped)
        batch.update(comp_b)
        return Count(
            per_query={"C_q": grouped.to(torch.float64), **comp_q},
            batch=batch,
            n_excluded=view.n_excluded,
            weights=v,
            item_kind=item_kind,
        )


class TripletSHCounter(TripletCounter):
    """Per query ``C^q(q) = 1`` if the hardest negative violates the margin, else 0.

    With several positives (image queries of a ranking batch) the query counts 1 if
    the hardest negative violates for any of them, as the definitions file says.
    """

    hardest = True


# -- the family's spec: what the paper says about it -------------------------------------------------------------

TRIPLET_COMPAT = Note(
    "Triplet t2i in compat mode groups the violations by negative image, as the published counter "
    "does (C^B is unchanged; C^q and C^0 are over images).",
    r"Triplet t2i in compat mode groups the violations by negative image, as the published counter "
    r"does ($C^{\mathcal{B}}$ is unchanged; $C^{q}$ and $C^{0}$ are over images).",
    when="compat",
)

TRIPLET = Objective(
    name="triplet", label="Triplet loss", layout="pair",
    direction_loss=partial(triplet_direction, hardest=False), defaults={"margin": DEFAULT_MARGIN}, combine="sum",
    counter=TripletCounter, stats=("C_q", "C_B", "C_0"), main_stat="C_q", table="2", color="#1f77b4", marker="o",
    notes=(TRIPLET_COMPAT,), description="hinge over all negatives (paper Eq. 3)",
)
TRIPLET_SH = Objective(
    name="triplet_sh", label="Triplet loss SH", layout="pair",
    direction_loss=partial(triplet_direction, hardest=True), defaults={"margin": DEFAULT_MARGIN}, combine="sum",
    counter=TripletSHCounter, stats=("C_q", "C_B", "C_0"), main_stat="C_q", table="2", color="#ff7f0e", marker="s",
    description="hinge on the hardest negative only (VSE++ max violation)", warmup_loss="triplet",
)
