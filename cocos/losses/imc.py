"""IMC (Chen et al.): Triplet SH plus intra-modal constraints, one loss family.

``L = L_MH + λ (IMC(images) + IMC(captions))`` (definitions file, "IMC"): ``L_MH`` is the
Triplet SH loss of both directions; for the embeddings ``V`` of one modality in the
batch, with intra-modal similarity ``S_V = V Vᵀ`` off the diagonal and cosine distance
``δ = 1 − S_V``, the pairs in the band ``μ_down < δ < μ_up`` contribute their
similarity: ``IMC(V) = Σ_{n≠m, in band} S_V[n, m] / B`` (``B`` the number of rows of
``V``), pushing near-duplicates of one modality apart. Every off-diagonal pair counts,
as in the contract (same-image captions too; identical image rows have ``δ = 0`` and
never lie in the band).

Each direction carries one modality's term: i2t the images' (its queries), t2i the
captions'; the views get the queries' intra-modal similarities (``QueryView.intra``).
The counter reports the cross-modal count (as Triplet SH: the count of
:func:`~cocos.losses.functional.triplet_sh_terms` above 0) and, per query, the number
of in-band intra-modal negatives ``C_intra``. The loss's named parts (:func:`imc_parts`) are
``L_con`` (Triplet SH) and ``L_intra`` (the intra-modal terms).
"""

from __future__ import annotations

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import CocosError, check_params
from cocos.losses.counts import Count, Counter, nanmean
from cocos.losses.functional import triplet_direction
from cocos.losses.spec import Objective
from cocos.losses.triplet import TripletSHCounter

DEFAULTS = {"margin": DEFAULT_MARGIN, "lam": 1.0, "mu_down": 0.05, "mu_up": 0.5}


def check(params: dict) -> None:
    if params["lam"] < 0:
        raise CocosError(f"lam must be >= 0, got {params['lam']:g}")
    if not 0 <= params["mu_down"] < params["mu_up"]:
        raise CocosError(f"IMC needs 0 <= mu_down < mu_up, got mu_down {params['mu_down']:g}, "
                         f"mu_up {params['mu_up']:g}")


def in_band(intra: torch.Tensor, mu_down: float, mu_up: float) -> torch.Tensor:
    """``(..., Q, Q)`` bool: off-diagonal pairs whose cosine distance ``1 − s`` lies strictly in the band."""
    q = intra.shape[-1]
    off = ~torch.eye(q, dtype=torch.bool, device=intra.device)
    delta = 1.0 - intra.detach()
    return off & (delta > mu_down) & (delta < mu_up)


def imc_term(intra: torch.Tensor, mu_down: float, mu_up: float) -> torch.Tensor:
    """``IMC(V) = Σ_{n≠m, in band} S_V[n, m] / B`` of one modality (summed over leading batches)."""
    band = in_band(intra, mu_down, mu_up)
    return (intra * band).sum() / intra.shape[-1]


def imc_parts(view: QueryView, margin: float = DEFAULT_MARGIN, lam: float = 1.0, mu_down: float = 0.05,
              mu_up: float = 0.5) -> dict[str, torch.Tensor]:
    """The direction loss's two parts: ``L_con``, Triplet SH of the direction, and ``L_intra``, λ times the
    intra-modal term of its queries' modality."""
    if view.intra is None:
        raise CocosError("the IMC loss needs the intra-modal similarities of the batch (QueryView.intra)")
    return {"L_con": triplet_direction(view, margin, hardest=True),
            "L_intra": lam * imc_term(view.intra, mu_down, mu_up)}


def imc_direction(view: QueryView, margin: float = DEFAULT_MARGIN, lam: float = 1.0, mu_down: float = 0.05,
                  mu_up: float = 0.5) -> torch.Tensor:
    """Triplet SH of the direction plus λ times the intra-modal term of its queries' modality (the sum of
    :func:`imc_parts`)."""
    parts = imc_parts(view, margin, lam, mu_down, mu_up)
    return parts["L_con"] + parts["L_intra"]


class IMCCounter(Counter):
    """Triplet SH's cross-modal count, and per query the in-band intra-modal negatives ``C_intra``."""

    needs_intra = True
    autograd = False

    def __init__(self, margin: float = DEFAULT_MARGIN, lam: float = 1.0, mu_down: float = 0.05,
                 mu_up: float = 0.5) -> None:
        check_params(margin=margin)
        self.loss_params = {"margin": float(margin), "lam": float(lam), "mu_down": float(mu_down),
                            "mu_up": float(mu_up)}
        check(self.loss_params)
        self.cross = TripletSHCounter(margin)

    def params(self) -> dict:
        return dict(self.loss_params)

    def count(self, view: QueryView) -> Count:
        if view.intra is None:
            raise CocosError("the IMC counter needs the intra-modal similarities of the batch (QueryView.intra)")
        out = self.cross.count(view)
        c_intra = in_band(view.intra, self.loss_params["mu_down"], self.loss_params["mu_up"]).sum(-1)
        c_intra = c_intra.to(torch.float64)
        out.per_query["C_intra"] = c_intra
        out.batch["C_intra"] = nanmean(c_intra)
        return out


IMC = Objective(
    name="imc", label="IMC", layout="pair", direction_loss=imc_direction, defaults=DEFAULTS, combine="sum",
    parts=imc_parts, counter=IMCCounter, stats=("C_q", "C_B", "C_0", "C_intra"), main_stat="C_q", table=None,
    color="#8c564b", marker="P", check=check, needs_intra=True, distributions=("C_intra",),
    description="Triplet SH plus lam x in-band intra-modal similarities (Chen et al.)",
)
