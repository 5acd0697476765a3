"""The maths shared by the training losses and the COCOS counters.

Every function takes a :class:`~cocos.data.layout.QueryView` (one direction of a
batch: ``scores[..., q, v]`` with positive/negative masks from
:class:`~cocos.data.layout.BatchLayout`) so that a loss and its counter see the
same positives, negatives and excluded pairs. Leading batch dimensions are
allowed everywhere: many batches are handled in one tensor operation.
"""

from __future__ import annotations

import torch

from cocos.data.layout import QueryView, positive_index
from cocos.defaults import DEFAULT_MARGIN, DEFAULT_TAU_NTXENT, DEFAULT_TAU_SMOOTHAP

SIGMOID_CLAMP = 50.0  # SmoothAP: the sigmoid's exponent is clamped to [-50, 50]
VECTOR_ALIGN = 64  # elements: a multiple of every CPU vector loop's step (2 x 16 float32 lanes with AVX-512)
GRAIN = 32768  # torch's internal GRAIN_SIZE: elementwise loops of fewer elements run on one thread


def vectorised_whole(numel: int) -> bool:
    """Whether torch computes every element of a contiguous ``numel``-element CPU tensor in the vectorised body
    of its elementwise loop (no scalar tail).

    torch's float32 ``sigmoid`` rounds some elements differently in the body (SIMD) and in the scalar tail of a
    loop, and each thread's range ``[t * ceil(n / parts), ...)`` has its own tail (``parts``: the threads used,
    ``min(threads, ceil(n / GRAIN))``, 1 below ``GRAIN``). Where every part is a multiple of
    :data:`VECTOR_ALIGN`, every element takes the body, and the same element of a differently sized tensor that
    is also tail-free gets the same bits. (``exp``, ``log_softmax``, sums over the last axis and the basic
    arithmetic give the same bits either way; measured.)"""
    threads = torch.get_num_threads()
    parts = 1 if numel < GRAIN or threads == 1 else min(threads, -(-numel // GRAIN))
    return numel % VECTOR_ALIGN == 0 and (-(-numel // parts)) % VECTOR_ALIGN == 0


def sigmoid_vectorised(x: torch.Tensor) -> torch.Tensor:
    """``torch.sigmoid(x)`` with every element computed in the vectorised body of the loop (see
    :func:`vectorised_whole`): ``x`` is padded to a tail-free size. On CPU equal bit for bit to the elements of
    any tail-free tensor's ``sigmoid``; elsewhere plain ``sigmoid``."""
    if x.device.type != "cpu":
        return torch.sigmoid(x)
    n = x.numel()
    size = -(-max(n, 1) // VECTOR_ALIGN) * VECTOR_ALIGN
    while not vectorised_whole(size):
        size += VECTOR_ALIGN
    flat = x.new_zeros(size)
    flat[:n] = x.reshape(-1)
    return flat.sigmoid_()[:n].view(x.shape)


def triplet_hinge(view: QueryView, margin: float, positives: tuple | None = None) -> torch.Tensor:
    """``alpha + s(q,n) - s(q,p)`` for every (query, positive, negative): ``(..., Q, A, K)``.

    Entries that are not a (valid positive, negative) pair are ``-inf``, so that
    ``relu`` gives 0 there and ``max`` over negatives picks the hardest real one.
    ``positives``: :func:`positive_index` of ``view.pos``, where already known.
    """
    idx, valid = positive_index(view.pos) if positives is None else positives
    s_pos = torch.gather(view.scores, -1, idx)  # (..., Q, A)
    hinge = margin + view.scores[..., None, :] - s_pos[..., :, None]
    # every positive valid (pair batches, and every caption query): the negatives alone
    mask = view.neg[..., None, :] if bool(valid.all()) else valid[..., :, None] & view.neg[..., None, :]
    fill = hinge.new_full((), float("-inf"))
    if hinge.requires_grad:  # training
        return torch.where(mask, hinge, fill)
    return torch.where(mask, hinge, fill, out=hinge)  # in place: hinge is a new tensor


def triplet_direction(view: QueryView, margin: float = DEFAULT_MARGIN, hardest: bool = False) -> torch.Tensor:
    """Triplet loss of one direction, summed over queries (VSE++ ``ContrastiveLoss``).

    ``hardest=False``: all triplets (paper Eq. 3); ``hardest=True``: only the hardest
    negative per (query, positive), VSE++ "max violation" (paper Eq. 1-2).
    """
    hinge = triplet_hinge(view, margin)
    if hardest:
        hinge = hinge.amax(-1)
    return hinge.clamp(min=0).sum()


def ntxent_log_probs(view: QueryView, tau: float) -> torch.Tensor:
    """Log-softmax over each query's candidates of ``s / tau``; excluded pairs get weight 0."""
    logits = view.scores / tau
    if view.excludes_any():  # most batches exclude nothing
        logits.masked_fill_(view.excluded_pairs(), float("-inf"))  # in place: logits is a new tensor
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
    candidates = view.candidates
    if not bool(candidates.all()):
        g = g * candidates[..., None, :]
    if not bool(anchor_valid.all()):
        g = g * anchor_valid[..., None]
    if complement:
        return g, torch.sigmoid(-x), anchor_valid
    return g, anchor_valid


def smoothap_pair_weights(
    scores: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    candidates: torch.Tensor | None,
    tau: float,
    vectorised: bool = False,
) -> torch.Tensor:
    """The SmoothAP counter's pair weights ``w(a, b) = G (1 - G) / R(a)^2`` (``(..., Q, A, K)``), no gradient.

    The same operations as :func:`smoothap_sigmoid` followed by ``g * (1 - g) / (rank * rank)``, in place
    (two full-size tensors instead of six), so bit for bit the same values; ``candidates`` ``None``: every pair
    is a candidate. ``vectorised``: both sigmoids by
    :func:`sigmoid_vectorised` (for a part of a tensor whose whole would be tail-free, see
    :func:`vectorised_whole`)."""
    s_a = torch.gather(scores, -1, anchors)  # (..., Q, A)
    x = scores[..., None, :] - s_a[..., :, None]
    x.div_(tau).clamp_(-SIGMOID_CLAMP, SIGMOID_CLAMP)
    g = sigmoid_vectorised(x) if vectorised else torch.sigmoid(x)
    g.scatter_(-1, anchors[..., None], 0.0)  # G(a, a) = 0
    if candidates is not None and not bool(candidates.all()):
        g.mul_(candidates[..., None, :])
    if not bool(anchor_valid.all()):
        g.mul_(anchor_valid[..., None])
    one_minus_g = sigmoid_vectorised(x.neg_()) if vectorised else x.neg_().sigmoid_()  # sigmoid(-x)
    rank = 1.0 + g.sum(-1, keepdim=True)
    return g.mul_(one_minus_g).div_(rank * rank)


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

