"""Latent target decoding (LTD, Bleeker et al. 2023), added to any contrastive loss.

A decoder ``h(z) = W3 σ(W2 σ(W1 z))`` (ReLU, hidden width 1024) maps the caption
embedding ``z`` to a frozen sentence-encoder target ``y`` of the same caption
(all-MiniLM-L6-v2, 384-d, :mod:`cocos.data.targets`). Reconstruction loss
``L_rec = mean(1 - cos(h(z), y))``. Two ways to add it to the contrastive loss
``L_con`` (``docs/definitions.md``, section 11):

* ``constraint`` (the paper's method): ``L = L_con + λ (L_rec/η - 1)``, ``η = 0.2``.
  The multiplier ``λ`` starts at 1 and is updated by gradient *ascent* on ``L``
  (``∂L/∂λ = L_rec/η - 1``) with SGD (lr 5e-3, momentum 0.9, dampening 0.9), then
  clamped to ``[0, 100]``: it grows while ``L_rec > η`` and decays to 0 once the
  constraint holds.
* ``dual`` (the paper's weaker baseline): ``L = L_con + β L_rec`` with a fixed ``β``
  (default 1).

Deviation from the published code, recorded: the authors clamp only the value of λ
that enters the loss (a straight-through clamp) and let the raw multiplier drift
below 0, so after a long stretch with the constraint met it takes as long again
before λ reacts to a new violation. cocos clamps the multiplier itself (projected
gradient ascent); while λ is inside ``(0, 100)`` both are the same.
"""

from __future__ import annotations

import torch
from torch import nn

from cocos.losses.ltd_config import BETA, ETA, MODES, LTDConfig  # noqa: F401  (re-exported)

HIDDEN = 1024
LAMBDA_INIT = 1.0
LAMBDA_RANGE = (0.0, 100.0)
LAMBDA_SGD = {"lr": 5e-3, "momentum": 0.9, "dampening": 0.9}


def reconstruction_loss(reconstructions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``L_rec = mean(1 - cos(h(z), y))`` over the captions of the batch."""
    return (1 - nn.functional.cosine_similarity(reconstructions, targets.to(reconstructions.dtype), dim=-1,
                                                eps=1e-8)).mean()


class TargetDecoder(nn.Module):
    """``h(z) = W3 σ(W2 σ(W1 z))`` with ReLU ``σ``; Xavier-uniform weights as the published code."""

    def __init__(self, embed_size: int, target_dim: int, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.hparams = {"embed_size": int(embed_size), "target_dim": int(target_dim), "hidden": int(hidden)}
        self.net = nn.Sequential(nn.Linear(embed_size, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, target_dim))
        for layer in self.net[::2]:
            nn.init.xavier_uniform_(layer.weight)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


class LagrangeMultiplier(nn.Module):
    """``λ``, trained by projected gradient ascent: SGD on ``-∂L/∂λ``, then clamped to ``[0, 100]``."""

    def __init__(self, init: float = LAMBDA_INIT) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.tensor(float(init)))
        self.optimizer = torch.optim.SGD([self.value], maximize=True, **LAMBDA_SGD)

    def step(self) -> None:
        """One ascent step on the gradient that ``backward`` left in ``value``, then the clamp."""
        self.optimizer.step()
        with torch.no_grad():
            self.value.clamp_(*LAMBDA_RANGE)
        self.optimizer.zero_grad(set_to_none=True)

    def __float__(self) -> float:
        return float(self.value.detach())


class LatentTargetDecoding(nn.Module):
    """The LTD term of one training step: ``(term, log)`` from the caption embeddings and their targets.

    ``term`` is added to the contrastive loss (``λ (L_rec/η - 1)`` or ``β L_rec``); ``log``
    holds ``L_rec``, ``L_rec/eta`` and ``lambda`` (the value used in this step) as floats.
    Call :meth:`step` after ``backward`` to update ``λ`` (a no-op in dual mode).
    """

    def __init__(self, cfg: LTDConfig, embed_size: int, target_dim: int, hidden: int = HIDDEN) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.decoder = TargetDecoder(embed_size, target_dim, hidden)
        self.multiplier = LagrangeMultiplier() if cfg.mode == "constraint" else None

    def forward(self, captions: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
        l_rec = reconstruction_loss(self.decoder(captions), targets)
        ratio = l_rec / self.cfg.eta
        if self.multiplier is None:
            term, lam = self.cfg.beta * l_rec, self.cfg.beta
        else:
            term, lam = self.multiplier.value * (ratio - 1), float(self.multiplier)
        return term, {"L_rec": float(l_rec.detach()), "L_rec/eta": float(ratio.detach()), "lambda": lam}

    def step(self) -> None:
        if self.multiplier is not None:
            self.multiplier.step()

    # -- checkpoints: plain types and tensors only -----------------------------------------

    def state(self, full: bool) -> dict:
        state = {"mode": self.cfg.mode, "eta": self.cfg.eta, "beta": self.cfg.beta, "targets": self.cfg.targets,
                 "hparams": dict(self.decoder.hparams),
                 "decoder": {k: v.detach().cpu() for k, v in self.decoder.state_dict().items()}}
        if self.multiplier is not None:
            state["lambda"] = float(self.multiplier)
            if full:
                state["lambda_optimizer"] = self.multiplier.optimizer.state_dict()
        return state

    def load(self, state: dict) -> None:
        self.decoder.load_state_dict(state["decoder"])
        if self.multiplier is not None:
            with torch.no_grad():
                self.multiplier.value.fill_(float(state["lambda"]))
            if "lambda_optimizer" in state:
                self.multiplier.optimizer.load_state_dict(state["lambda_optimizer"])
