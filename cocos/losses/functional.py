"""The maths shared by the training losses and the COCOS counters.

Every function takes a :class:`~cocos.data.layout.QueryView` (one direction of a
batch: ``scores[..., q, v]`` with positive/negative masks from
:class:`~cocos.data.layout.BatchLayout`) so that a loss and its counter see the
same positives, negatives and excluded pairs. Leading batch dimensions are
allowed everywhere: many batches are handled in one tensor operation.

The functions read as the definitions file writes the formulas; where speed needs it they call a kernel of
:mod:`cocos.losses.kernels` (bit for bit the formula it replaces), named for what it computes.
"""

from __future__ import annotations

import torch

from cocos.data.layout import QueryView, positive_index
from cocos.defaults import DEFAULT_MARGIN, DEFAULT_TAU_NTXENT, DEFAULT_TAU_SMOOTHAP
from cocos.losses import kernels
from cocos.losses.kernels import GRAIN, VECTOR_ALIGN, sigmoid_vectorised, vectorised_whole  # noqa: F401 (re-exported)

SIGMOID_CLAMP = 50.0  # SmoothAP: the sigmoid's exponent is clamped to [-50, 50]


def triplet_hinge(view: QueryView, margin: float, positives: tuple | None = None) -> torch.Tensor:
    """``alpha + s(q,n) - s(q,p)`` for every (query, positive, negative): ``(..., Q, A, K)``.

    Entries that are not a (valid positive, negative) pair are ``-inf``, so that
    ``relu`` gives 0 there and ``max`` over negatives picks the hardest real one.
    ``positives``: :func:`positive_index` of ``view.pos``, where already known.
    """
    idx, valid = kernels.positives(view) if positives is None else positives
    s_pos = torch.gather(view.scores, -1, idx)  # (..., Q, A)
    hinge = margin + view.scores[..., None, :] - s_pos[..., :, None]
    return kernels.fill_outside(hinge, float("-inf"), valid[..., :, None], view.neg[..., None, :])


def triplet_terms(view: QueryView, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """The Triplet loss's terms ``max(0, alpha + s(q,n) - s(q,p))``, one per (query, positive, negative):
    ``(..., Q, A, K)``, 0 off the (valid positive, negative) pairs. A term's gradient weight on ``s(q,n)`` is
    its indicator ``v(q,n)`` (definitions file, "Triplet"): the loss is their sum, ``C_q`` their number above 0."""
    return triplet_hinge(view, margin).clamp(min=0)


def triplet_sh_terms(view: QueryView, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """Triplet SH's terms per (query, negative), ``(..., Q, K)``: on each query's (first) hardest negative
    ``max(0, alpha + max_n s(q,n) - s(q,p))`` at its weakest positive ``p``, 0 on every other candidate.

    With one positive they sum to the loss (VSE++ max violation) and a term's gradient weight is its indicator;
    with several, the query counts 1 where the hardest negative violates for any positive (equivalently for the
    weakest: the hinge falls as ``s(q,p)`` rises), as the definitions file counts Triplet SH."""
    idx, valid = kernels.positives(view)
    s_pos = torch.gather(view.scores, -1, idx)  # (..., Q, A)
    weakest = torch.where(valid, s_pos, float("inf")).amin(-1, keepdim=True)
    hinge = kernels.fill_outside(margin + view.scores - weakest, float("-inf"), view.neg)
    largest, hardest = hinge.max(-1, keepdim=True)  # the first hardest negative
    return torch.zeros_like(hinge).scatter_(-1, hardest, largest.clamp(min=0))


def triplet_direction(view: QueryView, margin: float = DEFAULT_MARGIN, hardest: bool = False) -> torch.Tensor:
    """Triplet loss of one direction, summed over queries (VSE++ ``ContrastiveLoss``).

    ``hardest=False``: all triplets (paper Eq. 3), the sum of :func:`triplet_terms`; ``hardest=True``: only the
    hardest negative per (query, positive), VSE++ "max violation" (paper Eq. 1-2).
    """
    if hardest:
        return triplet_hinge(view, margin).amax(-1).clamp(min=0).sum()
    return triplet_terms(view, margin).sum()


def ntxent_log_probs(view: QueryView, tau: float) -> torch.Tensor:
    """Log-softmax over each query's candidates of ``s / tau``; excluded pairs get weight 0."""
    logits = view.scores / tau
    if view.excludes_any():  # most batches exclude nothing
        logits = kernels.fill_outside(logits, float("-inf"), view.candidates)
    return torch.log_softmax(logits, dim=-1)


def ntxent_direction(view: QueryView, tau: float = DEFAULT_TAU_NTXENT) -> torch.Tensor:
    """NT-Xent of one direction: mean over queries of ``-log p(q, p)`` (mean over positives)."""
    logp = ntxent_log_probs(view, tau)
    pos = view.pos.to(logp.dtype)
    per_query = -(logp.masked_fill(~view.pos, 0.0) * pos).sum(-1) / pos.sum(-1).clamp(min=1)
    return per_query.mean()


def smoothap_sigmoid(
    view: QueryView,
    tau: float,
    anchors: torch.Tensor | None = None,
    anchor_valid: torch.Tensor | None = None,
    complement: bool = False,
):
    """``G(a, b) = sigmoid((s_b - s_a) / tau)``: the probability that ``b`` ranks above anchor ``a``.

    With ``complement=True`` also returns ``1 - G`` computed as ``sigmoid(-x)`` (exact
    where ``1 - G`` would round to 0 in float32).

    Anchors default to the query's positives. Returns ``(G, anchor_valid)`` with
    ``G`` of shape ``(..., Q, A, K)``; ``G(a, a) = 0``, and ``G = 0`` for excluded
    candidates and padding anchors. The exponent is clamped to ``[-50, 50]``.
    """
    if anchors is None:
        anchors, anchor_valid = positive_index(view.pos)
    s_a = torch.gather(view.scores, -1, anchors)  # (..., Q, A)
    x = ((view.scores[..., None, :] - s_a[..., :, None]) / tau).clamp(-SIGMOID_CLAMP, SIGMOID_CLAMP)
    g = torch.sigmoid(x).scatter(-1, anchors[..., None], 0.0)  # G(a, a) = 0
    g = g * view.candidates[..., None, :] * anchor_valid[..., None]
    if complement:
        return g, torch.sigmoid(-x), anchor_valid
    return g, anchor_valid


def smoothap_direction(view: QueryView, tau: float = DEFAULT_TAU_SMOOTHAP) -> torch.Tensor:
    """SmoothAP loss of one direction: mean over queries of ``1 - AP_q`` (paper Eq. 8).

    ``AP_q = 1/|P| sum_a (1 + sum_{b in P} G(a,b)) / (1 + sum_b G(a,b))``.
    """
    g, valid = smoothap_sigmoid(view, tau)
    pos_b = view.pos[..., None, :].expand_as(g)
    rank_all = 1.0 + g.sum(-1)
    rank_pos = 1.0 + (g * pos_b).sum(-1)
    n_pos = valid.sum(-1).clamp(min=1)
    ap = ((rank_pos / rank_all) * valid).sum(-1) / n_pos
    return (1.0 - ap).mean()

