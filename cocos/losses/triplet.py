"""COCOS for the Triplet loss (all triplets) and Triplet SH (hardest negative).

Violation ``v(q, n) = 1{alpha + s(q,n) - s(q,p) > 0}`` (strict): a term of
:func:`cocos.losses.functional.triplet_terms` (the training loss is their sum) above 0. Both counters are
:class:`~cocos.losses.reducers.TermsCounter` of the family's terms; Triplet adds the published t2i grouping.
With several positives per query, each (query, positive) pair is an anchor of the
loss and its triplets are summed; in a pair batch there is one positive.
"""

from __future__ import annotations

from functools import partial

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import check_params
from cocos.losses.functional import triplet_direction, triplet_sh_terms, triplet_terms
from cocos.losses.reducers import TermsCounter, by_candidate
from cocos.losses.spec import Note, Objective


class TripletCounter(TermsCounter):
    """Per query ``C^q(q) = sum_n v(q, n)`` (summed over positives); ``C^B``, ``C^0``, ``C^q`` per batch: the
    count of :func:`~cocos.losses.functional.triplet_terms` above 0 (:class:`~cocos.losses.reducers.TermsCounter`).

    ``compat`` t2i reproduces the published counter: violations are grouped by the
    *negative image* instead of the caption query, ``C(i) = #{j : v(j, i)}``;
    ``C^B`` is unchanged, ``C^0`` and ``C^q`` are computed over the ``C(i)``.
    """

    hardest = False
    chunk_invariant = True
    row_wise = True

    def __init__(self, margin: float = DEFAULT_MARGIN) -> None:
        check_params(margin=margin)
        self.margin = float(margin)
        super().__init__(triplet_sh_terms if self.hardest else triplet_terms, margin=self.margin)

    def violations(self, view: QueryView):
        """``(..., Q, K)``: number of (positive, negative) triplets of each query that violate (Triplet SH: 1 on
        a query's hardest negative where it violates)."""
        return self.weights(view)

    def blocks(self, direction: str, compat: bool) -> bool:
        """Row by row (a query's hinge terms are on its row), but for the published t2i grouping: its counts are
        per negative image, over every query."""
        return not (compat and not self.hardest and direction == "t2i")

    def _grouped(self, view: QueryView) -> tuple:
        if view.compat and not self.hardest and view.direction == "t2i":  # by negative image
            return *by_candidate(self, view), "image"
        return super()._grouped(view)


class TripletSHCounter(TripletCounter):
    """Per query ``C^q(q) = 1`` if the hardest negative violates the margin, else 0: the count of
    :func:`~cocos.losses.functional.triplet_sh_terms` above 0.

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
    terms=triplet_terms, counter=TripletCounter, stats=("C_q", "C_B", "C_0"), main_stat="C_q", table="2",
    color="#1f77b4", marker="o",
    notes=(TRIPLET_COMPAT,), description="hinge over all negatives (paper Eq. 3)",
)
TRIPLET_SH = Objective(
    name="triplet_sh", label="Triplet loss SH", layout="pair",
    direction_loss=partial(triplet_direction, hardest=True), defaults={"margin": DEFAULT_MARGIN}, combine="sum",
    terms=triplet_sh_terms, counter=TripletSHCounter, stats=("C_q", "C_B", "C_0"), main_stat="C_q", table="2",
    color="#ff7f0e", marker="s",
    description="hinge on the hardest negative only (VSE++ max violation)", warmup_loss="triplet",
)
