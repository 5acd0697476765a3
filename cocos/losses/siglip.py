"""SigLIP's sigmoid loss and its COCOS (definitions file, section "SigLIP"; Zhai et al., ICCV 2023).

The loss of a pair batch of ``B`` images, as open_clip's ``SigLipLoss`` computes it: logits
``z(i, j) = t·s(i, j) + b``, labels ``y(i, j) = +1`` for a positive pair and ``−1`` for a negative one, and
``L = −(1/B) Σ_{i,j} log σ(y(i, j)·z(i, j))`` (``B`` the batch's image count). Every pair's term is independent:
no softmax couples the negatives of a query. Read by rows (i2t) or by columns (t2i) it is the same sum, so each
direction's loss is the whole ``L`` and the two are averaged (``combine="mean"``): the loss and its gradient are
SigLIP's. A same-image pair outside compat mode is neither positive nor negative and adds no term (open_clip's
batches hold distinct images, where the two agree).

``t`` and ``b`` are learned with the model (:class:`~cocos.losses.base.LearnedParameters`): ``t`` through its
logarithm ``logit_scale`` (clamped to ``[0, log 100]`` after each optimiser step, as open_clip clamps it; not in
the forward pass), ``b`` as ``logit_bias``; a model holding parameters of those names (a SigLIP folder) learns its
own, any other model learns the loss's. Defaults as SigLIP initialises them: ``t = 10``, ``b = −10``.

The counter (:class:`SigLIPCounter`): ``∂L/∂s(i, j) = −(t/B)·y(i, j)·σ(−y(i, j)·z(i, j))``, so a negative's weight
is ``σ(z(q, n))`` and a positive's ``1 − σ(z(q, p))`` (the factor ``t/B`` left out, as NT-Xent's weights leave out
``1/τ``). Per query ``q`` of each direction (the same ``B × B`` matrix read by rows and by columns):

- ``C^{qv−}(q) = #{n negative : σ(z(q, n)) > ε}``, ``W^{qv−}(q)`` their summed weight,
- ``W^{qv+}(q) = Σ_{p positive} (1 − σ(z(q, p)))`` (one positive in a pair batch: ``1 − σ(z(q, q))``; the sum over
  a ranking batch's ``k`` positives is beyond the definitions file), computed as ``σ(−z)``,
- ``W_low(q)``: the weight of the negatives under ``ε`` (beyond the paper, as NT-Xent's),

and per batch the mean of each over all queries; ``ε = 0.01``. Unlike NT-Xent's, the negatives' weights do not
sum to ``W^{qv+}``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cocos.data.layout import QueryView
from cocos.defaults import MAX_LOGIT_SCALE
from cocos.errors import CocosError, check_params
from cocos.losses.counts import DEFAULT_EPS
from cocos.losses.kernels import positives
from cocos.losses.ntxent import NTXentCounter
from cocos.losses.spec import Learned, Note, Objective

DEFAULT_T = 10.0  # SigLIP's initial scale t = exp(logit_scale)
DEFAULT_B = -10.0  # its initial bias


def siglip_logits(view: QueryView, t=DEFAULT_T, b=DEFAULT_B) -> torch.Tensor:
    """``z = t·s + b`` of every pair of the view (``t``, ``b`` numbers or learned scalars)."""
    return view.scores * t + b


def siglip_direction(view: QueryView, t=DEFAULT_T, b=DEFAULT_B) -> torch.Tensor:
    """SigLIP's loss read in one direction: ``−(1/B) Σ log σ(y·z)`` over the view's positive (``y = 1``) and
    negative (``y = −1``) pairs, ``B`` the images (the queries of i2t, the candidates of t2i)."""
    z = siglip_logits(view, t, b)
    terms = torch.where(view.pos, -F.logsigmoid(z), torch.where(view.neg, -F.logsigmoid(-z), 0.0))
    n_images = view.scores.shape[-2] if view.direction == "i2t" else view.scores.shape[-1]
    return terms.sum() / n_images


class SigLIPCounter(NTXentCounter):
    """SigLIP's COCOS in closed form (module docstring): NT-Xent's statistics, each pair's weight ``σ(z)``."""

    def __init__(self, t: float = DEFAULT_T, b: float = DEFAULT_B, eps: float = DEFAULT_EPS) -> None:
        check_siglip({"t": t, "b": b})
        check_params(eps=eps)
        self.t, self.b, self.eps = float(t), float(b), float(eps)

    def params(self) -> dict:
        return {"t": self.t, "b": self.b, "eps": self.eps}

    def key(self) -> tuple:
        return ("siglip", self.t, self.b)

    def probabilities(self, view: QueryView) -> torch.Tensor:
        """``σ(z)`` of every pair: a negative's weight (positives and excluded pairs are read through the masks)."""
        return torch.sigmoid(siglip_logits(view, self.t, self.b))

    def positive_weight(self, p: torch.Tensor, view: QueryView) -> torch.Tensor:
        """``W^{qv+}``: ``Σ (1 − σ(z))`` over the query's positives, as ``σ(−z)`` (exact where ``σ(z)`` rounds
        to 1)."""
        idx, valid = positives(view)
        z = view.scores.gather(-1, idx) * self.t + self.b
        return torch.where(valid, torch.sigmoid(-z), 0.0).sum(-1).to(torch.float64)


def check_siglip(params: dict) -> None:
    """``t`` finite and positive, ``b`` finite."""
    check_params(b=params.get("b"), t=params.get("t"))
    if params.get("t") is not None and float(params["t"]) <= 0:
        raise CocosError(f"t must be positive, got {params['t']}")


SIGLIP_WEIGHTS = Note(
    "Weights are σ(t·s + b) of each negative and 1 − σ(t·s + b) of the positive, the gradient's factor t/B left "
    "out; unlike NT-Xent's they do not sum to one. W_low is the weight of the negatives under ε (beyond the paper).",
    r"Weights are $\sigma(t s + b)$ of each negative and $1 - \sigma(t s + b)$ of the positive, the gradient's "
    r"factor $t/B$ left out; unlike NT-Xent's they do not sum to one. $W_{\mathrm{low}}$ is the weight of the "
    r"negatives under $\varepsilon$ (beyond the paper).",
)

# t through its logarithm, clamped as open_clip clamps the logit scale; b as it is
SIGLIP_LEARNED = {"t": Learned("logit_scale", log=True, clamp=(0.0, MAX_LOGIT_SCALE)), "b": Learned("logit_bias")}

SIGLIP = Objective(
    name="siglip", label="SigLIP", layout="pair", direction_loss=siglip_direction,
    defaults={"t": DEFAULT_T, "b": DEFAULT_B}, combine="mean", reduce="mean", counter=SigLIPCounter,
    stats=("C_qv-", "W_qv-", "W_qv+", "W_low"), main_stat="C_qv-", table=None, color="#17becf", marker="v",
    notes=(SIGLIP_WEIGHTS,), check=check_siglip, learned=SIGLIP_LEARNED,
    description="sigmoid loss on every pair, logits t*s + b (SigLIP; t and b learned)",
)
