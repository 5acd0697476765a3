"""SmoothAP (Brown et al. 2020) on ranking batches: every image with all its k captions."""

from __future__ import annotations

from cocos.data.layout import QueryView
from cocos.errors import check_params
from cocos.losses.base import ContrastiveLoss
from cocos.losses.functional import smoothap_direction


class SmoothAPLoss(ContrastiveLoss):
    """Sum over both directions of the mean ``1 - AP_q`` with the sigmoid rank at temperature tau."""

    name = "smoothap"
    batch_layout = "ranking"

    def __init__(self, tau: float = 0.01, compat: bool = False) -> None:
        super().__init__(compat)
        check_params(tau=tau)
        self.tau = float(tau)

    def params(self) -> dict:
        return {"tau": self.tau}

    def direction_loss(self, view: QueryView):
        return smoothap_direction(view, self.tau)
