"""NT-Xent: cross-entropy over each query's candidates at temperature tau, mean of both directions."""

from __future__ import annotations

from cocos.data.layout import QueryView
from cocos.errors import check_params
from cocos.losses.base import ContrastiveLoss
from cocos.losses.functional import ntxent_direction


class NTXentLoss(ContrastiveLoss):
    name = "ntxent"
    combine = "mean"

    def __init__(self, tau: float = 0.1, compat: bool = False) -> None:
        super().__init__(compat)
        check_params(tau=tau)
        self.tau = float(tau)

    def params(self) -> dict:
        return {"tau": self.tau}

    def direction_loss(self, view: QueryView):
        return ntxent_direction(view, self.tau)
