"""A test oracle for the COCOS counters, written from the definitions file only.

Plain numpy, float64, Python loops over queries and candidates: slow, but every
line is one sentence of ``cocos-definitions.md``. It deliberately imports nothing
from ``cocos``.

One batch is given by

* ``S`` (``B x M``): ``S[i, c]`` is the similarity of image row ``i`` and caption ``c``;
* ``caption_image`` (``M``): the image row of each caption;
* ``image_ids`` (``B``, optional): the dataset id of each image row. A caption whose
  image row is *another* row holding the same dataset image as image row ``i`` is a
  *same-image pair* of ``i``: a negative in ``compat`` mode, excluded otherwise;
* ``compat``: reproduce the published counter's quirks.

A direction is read as queries x candidates: i2t, query = image row ``i``, candidate
= caption ``c``, score ``S[i, c]``; t2i, query = caption ``c``, candidate = image row
``i``, score ``S[i, c]``.

:func:`batch_stats` returns ``{"i2t": {stat: float}, "t2i": {stat: float}}`` with the
statistic names of ``cocos.counting.count_batch`` (``C_q, C_B, C_0`` for the triplet
losses and SmoothAP; ``C_qv-, W_qv-, W_qv+, W_low`` for NT-Xent) plus ``n_excluded``.
"""

from __future__ import annotations

import math

import numpy as np

SIGMOID_CLAMP = 50.0
LOSSES = ("triplet", "triplet_sh", "ntxent", "smoothap")


# ----------------------------------------------------------------------------- layout

def roles(caption_image, image_ids, compat: bool, n_images: int):
    """``(pos, neg)``, both ``B x M`` bool lists of lists: the role of caption ``c`` for image row ``i``.

    Positive: the caption belongs to the row. Negative: everything else, except a
    same-image pair outside compat mode (then it is neither: excluded).
    """
    n_captions = len(caption_image)
    pos = [[False] * n_captions for _ in range(n_images)]
    neg = [[False] * n_captions for _ in range(n_images)]
    for i in range(n_images):
        for c in range(n_captions):
            own_row = int(caption_image[c])
            if own_row == i:
                pos[i][c] = True
                continue
            same_image = image_ids is not None and image_ids[own_row] == image_ids[i]
            neg[i][c] = compat or not same_image
    return pos, neg


def queries(S, caption_image, image_ids, compat: bool, direction: str):
    """One entry per query: ``(scores, positives, negatives)`` over its candidates.

    ``scores`` is a list of floats (one per candidate), ``positives`` and
    ``negatives`` the candidate indices of each kind, in candidate order.
    """
    n_images, n_captions = S.shape
    pos, neg = roles(caption_image, image_ids, compat, n_images)
    out = []
    if direction == "i2t":
        for i in range(n_images):
            scores = [float(S[i, c]) for c in range(n_captions)]
            out.append((scores, [c for c in range(n_captions) if pos[i][c]],
                        [c for c in range(n_captions) if neg[i][c]]))
    elif direction == "t2i":
        for c in range(n_captions):
            scores = [float(S[i, c]) for i in range(n_images)]
            out.append((scores, [i for i in range(n_images) if pos[i][c]],
                        [i for i in range(n_images) if neg[i][c]]))
    else:
        raise ValueError(direction)
    return out


def n_excluded(caption_image, image_ids, compat: bool, n_images: int) -> int:
    """Number of (image row, caption) pairs excluded as same-image pairs (the same in both directions)."""
    pos, neg = roles(caption_image, image_ids, compat, n_images)
    return sum(1 for i in range(n_images) for c in range(len(caption_image))
               if not pos[i][c] and not neg[i][c])


def summarise(counts, compat_zero: bool = False) -> dict[str, float]:
    """``C^B`` (sum), ``C^0`` (queries with count 0), ``C^q = C^B / (Q - C^0)``.

    A batch without any query with a gradient has no ``C^q`` (NaN), unless
    ``compat_zero`` (SmoothAP compat aggregation), where it is 0.
    """
    c_b = float(sum(counts))
    c_0 = float(sum(1 for x in counts if x == 0))
    with_gradient = len(counts) - c_0
    if with_gradient > 0:
        c_q = c_b / with_gradient
    else:
        c_q = 0.0 if compat_zero else math.nan
    return {"C_q": c_q, "C_B": c_b, "C_0": c_0}


# ----------------------------------------------------------------------------- triplet

def triplet_hinges(scores, positives, negatives, margin):
    """``{(p, n): alpha + s_n - s_p}`` for every positive ``p`` and negative ``n`` of one query."""
    return {(p, n): margin + scores[n] - scores[p] for p in positives for n in negatives}


def triplet_violations(scores, positives, negatives, margin):
    """``{(p, n): 1 if alpha + s_n - s_p > 0 else 0}`` (strict)."""
    return {key: 1 if h > 0 else 0 for key, h in triplet_hinges(scores, positives, negatives, margin).items()}


def triplet_query_count(scores, positives, negatives, margin) -> int:
    """Triplet (all triplets): ``C^q(q) = sum_n v(q, n)``, summed over the query's positives."""
    return sum(triplet_violations(scores, positives, negatives, margin).values())


def triplet_sh_query_count(scores, positives, negatives, margin) -> int:
    """Triplet SH: 1 if the hardest negative violates the margin (for any positive), else 0."""
    if not negatives:
        return 0
    hardest = max(scores[n] for n in negatives)
    return 1 if any(margin + hardest - scores[p] > 0 for p in positives) else 0


def triplet_stats(S, caption_image, image_ids=None, compat=False, margin=0.2, hardest=False):
    S = np.asarray(S, dtype=np.float64)
    out = {}
    for direction in ("i2t", "t2i"):
        qs = queries(S, caption_image, image_ids, compat, direction)
        if hardest:
            counts = [triplet_sh_query_count(s, p, n, margin) for s, p, n in qs]
        elif compat and direction == "t2i":
            # Published counter: group the t2i violations by the *negative image*:
            # C(i) = #{caption j (negative of image i) : alpha + s(i, j) - s(img(j), j) > 0}.
            counts = [0] * S.shape[0]
            for s, p, n in qs:
                for (_, neg_image), v in triplet_violations(s, p, n, margin).items():
                    counts[neg_image] += v
        else:
            counts = [triplet_query_count(s, p, n, margin) for s, p, n in qs]
        out[direction] = summarise(counts)
    return out


# ----------------------------------------------------------------------------- NT-Xent

def ntxent_probabilities(scores, candidates, tau):
    """Softmax of ``s / tau`` over the query's candidates; 0 for anything else."""
    top = max(scores[v] / tau for v in candidates)  # shift for stability; cancels out
    e = {v: math.exp(scores[v] / tau - top) for v in candidates}
    total = sum(e.values())
    return [e[v] / total if v in e else 0.0 for v in range(len(scores))]


def ntxent_query(scores, positives, negatives, tau, eps):
    """``C^{qv-}``, ``W^{qv-}``, ``W^{qv+}``, ``W_low`` of one query.

    With several positives (image queries of a ranking batch) ``W^{qv+}`` is one
    minus their total probability (one positive in a pair batch, as the contract says).
    """
    p = ntxent_probabilities(scores, sorted(positives + negatives), tau)
    return {
        "C_qv-": float(sum(1 for n in negatives if p[n] > eps)),
        "W_qv-": sum(p[n] for n in negatives if p[n] > eps),
        "W_qv+": 1.0 - sum(p[a] for a in positives),
        "W_low": sum(p[n] for n in negatives if p[n] < eps),
    }


def ntxent_stats(S, caption_image, image_ids=None, compat=False, tau=0.1, eps=0.01):
    S = np.asarray(S, dtype=np.float64)
    out = {}
    for direction in ("i2t", "t2i"):
        rows = [ntxent_query(s, p, n, tau, eps) for s, p, n in queries(S, caption_image, image_ids, compat, direction)]
        out[direction] = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}  # mean over ALL queries
    return out


# ----------------------------------------------------------------------------- SmoothAP

def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def smoothap_row(scores, candidates, anchor, tau):
    """Weights ``w(a, b)`` of one anchor ``a`` over all candidates (0 where ``b`` is ``a`` or not a candidate).

    ``G(a, b) = sigmoid(clamp((s_b - s_a) / tau, -50, 50))``, ``R(a) = 1 + sum_b G(a, b)``,
    ``w(a, b) = G (1 - G) / R^2`` (``1 - G`` computed as ``sigmoid(-x)``).
    """
    g, one_minus_g = {}, {}
    for b in candidates:
        if b == anchor:
            continue
        x = min(max((scores[b] - scores[anchor]) / tau, -SIGMOID_CLAMP), SIGMOID_CLAMP)
        g[b], one_minus_g[b] = sigmoid(x), sigmoid(-x)
    rank = 1.0 + sum(g.values())
    return [g[b] * one_minus_g[b] / rank ** 2 if b in g else 0.0 for b in range(len(scores))]


def smoothap_anchors(positives, query_index, n_candidates, k, compat, direction):
    """``(anchor rows, divisor)`` of one query.

    Corrected: the query's positives, divisor ``|P_q|``. Compat t2i (published
    counter): rows ``k q .. k q + k - 1`` of the image-by-image matrix that are ``< B``,
    divisor 1.
    """
    if compat and direction == "t2i":
        return [a for a in range(k * query_index, k * query_index + k) if a < n_candidates], 1
    return list(positives), len(positives)


def smoothap_weights(S, caption_image, image_ids=None, compat=False, tau=0.01, direction="i2t"):
    """Per query: ``(rows, divisor)`` with ``rows`` the weight rows ``w(a, .)`` of its anchors, in anchor order."""
    S = np.asarray(S, dtype=np.float64)
    k = max(1, S.shape[1] // S.shape[0])
    out = []
    for q, (scores, positives, negatives) in enumerate(queries(S, caption_image, image_ids, compat, direction)):
        candidates = sorted(positives + negatives)
        anchors, divisor = smoothap_anchors(positives, q, len(scores), k, compat, direction)
        out.append(([smoothap_row(scores, candidates, a, tau) for a in anchors], divisor))
    return out


def smoothap_stats(S, caption_image, image_ids=None, compat=False, tau=0.01, eps=0.01):
    out = {}
    for direction in ("i2t", "t2i"):
        counts = []
        for rows, divisor in smoothap_weights(S, caption_image, image_ids, compat, tau, direction):
            above = sum(1 for row in rows for w in row if w > eps)  # w(a, a) = 0 never counts
            counts.append(above / divisor if rows else 0.0)
        out[direction] = summarise(counts, compat_zero=compat)
    return out


# ----------------------------------------------------------------------------- entry points

def batch_stats(S, caption_image, loss, image_ids=None, compat=False, margin=0.2, tau=None, eps=0.01):
    """Every per-batch statistic of ``loss`` for one batch, both directions, plus ``n_excluded``."""
    S = np.asarray(S, dtype=np.float64)
    caption_image = [int(c) for c in caption_image]
    if image_ids is not None:
        image_ids = [int(i) for i in image_ids]
    if loss == "triplet":
        out = triplet_stats(S, caption_image, image_ids, compat, margin, hardest=False)
    elif loss == "triplet_sh":
        out = triplet_stats(S, caption_image, image_ids, compat, margin, hardest=True)
    elif loss == "ntxent":
        out = ntxent_stats(S, caption_image, image_ids, compat, 0.1 if tau is None else tau, eps)
    elif loss == "smoothap":
        out = smoothap_stats(S, caption_image, image_ids, compat, 0.01 if tau is None else tau, eps)
    else:
        raise ValueError(f"unknown loss {loss!r}")
    excluded = float(n_excluded(caption_image, image_ids, compat, S.shape[0]))
    for stats in out.values():
        stats["n_excluded"] = excluded
    return out


def threshold_gap(S, caption_image, loss, image_ids=None, compat=False, margin=0.2, tau=None, eps=0.01):
    """How close the batch comes to a threshold, for ``assume`` in property tests.

    Triplet losses: the smallest ``|hinge|`` over all (query, positive, negative) of
    both directions (0 when some triplet sits exactly on the margin). NT-Xent and
    SmoothAP: the smallest ``|w - eps| / eps`` over all weights. ``inf`` when there
    is nothing to compare.
    """
    S = np.asarray(S, dtype=np.float64)
    caption_image = [int(c) for c in caption_image]
    gaps = [math.inf]
    for direction in ("i2t", "t2i"):
        qs = queries(S, caption_image, image_ids, compat, direction)
        if loss in ("triplet", "triplet_sh"):
            for s, p, n in qs:
                gaps.extend(abs(h) for h in triplet_hinges(s, p, n, margin).values())
        elif loss == "ntxent":
            for s, p, n in qs:
                prob = ntxent_probabilities(s, sorted(p + n), 0.1 if tau is None else tau)
                gaps.extend(abs(prob[v] - eps) / eps for v in n)
        elif loss == "smoothap":
            for rows, _ in smoothap_weights(S, caption_image, image_ids, compat,
                                            0.01 if tau is None else tau, direction):
                gaps.extend(abs(w - eps) / eps for row in rows for w in row)
        else:
            raise ValueError(f"unknown loss {loss!r}")
    return min(gaps)
