"""GOAL (Xuan & Chen): training with *designed gradients*, one loss family with 15 variants.

The GOAL paper trains with a gradient it designs rather than derives: for every
(anchor, positive, hardest in-batch negative) triplet the positive's similarity gets
``−T·P+`` and the negative's ``+T·P−`` (its Eq. 3), with a triplet weight ``T``
(``con``, ``nca``, ``cir``) and a pair weight ``P`` (``con``, ``lin``, ``sig``,
``lin_ms``, ``sig_ms``); the maths is in :mod:`cocos.losses.goal`.

As a training objective (``get_loss("goal", triplet_weight="cir", pair_weight="sig_ms",
tau=10.0)``) each direction is a custom :class:`torch.autograd.Function`: its
**forward returns the direction's Triplet SH value** (summed hinge on the hardest
negative, margin ``margin``; a number worth logging that falls as the model learns)
and its **backward is the designed gradient** on the similarity scores, from where
autograd carries it to the embeddings and the model. The two directions are summed,
so ``con × con`` is exactly the gradient of the summed Triplet SH loss.

Its counter counts, per query, the negatives whose designed weight ``T·P−`` exceeds
``eps`` (the hardest negative, or none), and records the per-query triplet weight
``T`` and pair weights ``P+``, ``P−`` (means over a query's positives).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import CocosError, check_params
from cocos.losses.counts import DEFAULT_EPS, Count, Counter, batch_counts, companions, nanmean
from cocos.losses.functional import triplet_direction
from cocos.losses.goal import triplet_weights
from cocos.objectives.spec import Objective

TRIPLET = {"con": "T_con", "nca": "T_nca", "cir": "T_cir"}
PAIR = {"con": "P_con", "lin": "P_lin", "sig": "P_sig", "lin_ms": "P_lin-ms", "sig_ms": "P_sig-ms"}
DEFAULTS = {"triplet_weight": "con", "pair_weight": "con", "margin": DEFAULT_MARGIN, "tau": 10.0, "alpha": 2.0,
            "beta": 10.0, "lam": 0.5, "offset": False}


def check(params: dict) -> None:
    """Weight names and ranges, one CocosError line naming the allowed values."""
    if params["triplet_weight"] not in TRIPLET:
        raise CocosError(f"unknown triplet weight '{params['triplet_weight']}' (choose from {', '.join(TRIPLET)})")
    if params["pair_weight"] not in PAIR:
        raise CocosError(f"unknown pair weight '{params['pair_weight']}' (choose from {', '.join(PAIR)})")
    for name in ("alpha", "beta"):
        if params[name] <= 0:
            raise CocosError(f"{name} must be positive, got {params[name]:g}")


def _weights(params: dict) -> tuple[str, str, dict]:
    rest = {k: v for k, v in params.items() if k not in ("triplet_weight", "pair_weight")}
    return TRIPLET[params["triplet_weight"]], PAIR[params["pair_weight"]], rest


class DesignedGradient(torch.autograd.Function):
    """Forward: a value to log; backward: a given gradient for ``scores`` (times the upstream gradient)."""

    @staticmethod
    def forward(ctx, scores, grad, value):  # noqa: ARG004
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        return upstream * grad, None, None


def goal_direction(view: QueryView, **params) -> torch.Tensor:
    """One direction of the GOAL objective: Triplet SH value forward, ``−T·P+`` / ``+T·P−`` backward."""
    from cocos.losses.goal import direction_score_gradient

    t_name, p_name, rest = _weights({**DEFAULTS, **params})
    detached = replace(view, scores=view.scores.detach())
    with torch.no_grad():
        grad = direction_score_gradient(detached, t_name, p_name, **rest)
        value = triplet_direction(detached, rest["margin"], hardest=True)
    return DesignedGradient.apply(view.scores, grad, value)


class GoalCounter(Counter):
    """Per query: the negatives whose designed weight ``T·P−`` exceeds ``eps``; ``T``, ``P+``, ``P−`` recorded."""

    uses_eps = True

    def __init__(self, eps: float = DEFAULT_EPS, **params) -> None:
        check_params(eps=eps)
        self.eps = float(eps)
        self.loss_params = {**DEFAULTS, **params}
        check(self.loss_params)

    def params(self) -> dict:
        return {**self.loss_params, "eps": self.eps}

    def _weights(self, view: QueryView):
        t_name, p_name, rest = _weights(self.loss_params)
        t, tw, p_pos, p_neg = triplet_weights(view, t_name, p_name, **rest)
        neg_weight = torch.where(t.valid, tw * p_neg, 0.0)  # (..., Q, A): the hardest negative's weight
        return t, tw, p_pos, p_neg, neg_weight

    def _count(self, view: QueryView, parts, eps: float, extras: bool = True) -> Count:
        t, tw, p_pos, p_neg, neg_weight = parts
        c_q = (neg_weight > eps).any(-1).to(torch.float64)  # one hardest negative per query: 0 or 1
        batch = batch_counts(c_q)
        if not extras:
            return Count({"C_q": c_q}, batch, view.n_excluded)
        valid = t.valid.to(torch.float64)
        n = valid.sum(-1)

        def per_query(x):
            mean = (torch.where(t.valid, x.to(torch.float64), 0.0)).sum(-1) / n.clamp(min=1)
            return torch.where(n > 0, mean, torch.nan)

        stats = {"T": per_query(tw), "P_pos": per_query(p_pos), "P_neg": per_query(p_neg)}
        for k, v in stats.items():
            batch[k] = nanmean(v)
        weights = torch.zeros_like(view.scores, dtype=torch.float64)
        weights.scatter_add_(-1, t.n_index, neg_weight.to(torch.float64))
        weights = torch.where(view.neg, weights, 0.0)
        comp_q, comp_b = companions(weights)
        batch.update(comp_b)
        return Count({"C_q": c_q, **stats, **comp_q}, batch, view.n_excluded, weights=weights)

    def count(self, view: QueryView) -> Count:
        return self._count(view, self._weights(view), self.eps)

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        parts = self._weights(view)
        return {float(e): self._count(view, parts, float(e), extras=False) for e in eps_values}

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """The designed weights once for the count and every threshold (equal to ``count`` and ``sweep``)."""
        parts = self._weights(view)
        main = self._count(view, parts, self.eps)
        return main, {float(e): self._count(view, parts, float(e), extras=False).batch for e in eps_values}


def diagram_weights(params: dict) -> list[str]:
    """The diagram of a GOAL model: its own triplet weight and the two gradient scalars T*P+ and T*P-."""
    t, p = TRIPLET[params["triplet_weight"]], PAIR[params["pair_weight"]]
    return [t, f"{t}*{p}+", f"{t}*{p}-"]


GOAL = Objective(
    name="goal", label="GOAL", layout="pair", direction_loss=goal_direction, defaults=DEFAULTS, combine="sum",
    counter=GoalCounter, stats=("C_q", "C_0", "T", "P_neg"), main_stat="C_q", table=None, color="#9467bd",
    marker="v", undefined_ok=("T", "P_pos", "P_neg"), check=check, distributions=("T", "P_pos", "P_neg"),
    diagram=diagram_weights,
    description="designed gradients T x P on the hardest triplets (Xuan & Chen); triplet_weight con|nca|cir, "
                "pair_weight con|lin|sig|lin_ms|sig_ms",
)
