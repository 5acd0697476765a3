"""Triplet loss over all triplets, and Triplet SH (hardest negative, VSE++ max violation)."""

from __future__ import annotations

from cocos.data.layout import QueryView
from cocos.errors import check_params
from cocos.losses.base import ContrastiveLoss
from cocos.losses.functional import triplet_direction


class TripletLoss(ContrastiveLoss):
    """Sum over queries and both directions of ``max(alpha + s- - s+, 0)`` over all negatives."""

    name = "triplet"
    hardest = False

    def __init__(self, margin: float = 0.2, compat: bool = False) -> None:
        super().__init__(compat)
        check_params(margin=margin)
        self.margin = float(margin)

    def params(self) -> dict:
        return {"margin": self.margin}

    def direction_loss(self, view: QueryView):
        return triplet_direction(view, self.margin, hardest=self.hardest)


class TripletSHLoss(TripletLoss):
    """Triplet loss with only the hardest in-batch negative per query (VSE++)."""

    name = "triplet_sh"
    hardest = True
