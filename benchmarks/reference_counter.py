"""A plain implementation in the *shape* of the published COCOS counter.

Full ``M x M`` difference matrices and a Python loop over queries, as the
published notebooks do; written from the definitions file so that
``bench_counting.py`` can compare the engine against it (time, memory, outputs).
Default mode = corrected definition; ``compat=True`` reproduces the published
quirks (t2i triplet grouped by negative image, SmoothAP t2i row indexing).
"""

from __future__ import annotations

import torch


def _triplet(s, pos_idx, margin, hardest):
    """s: (Q, K) rows of one direction; pos_idx[q] the positive candidate of query q."""
    counts = []
    for q in range(s.shape[0]):
        p = pos_idx[q]
        v = (margin + s[q] - s[q, p] > 0)
        v[p] = False
        if hardest:
            neg = s[q].clone()
            neg[p] = -float("inf")
            counts.append(int(v[int(neg.argmax())]))
        else:
            counts.append(int(v.sum()))
    return torch.tensor(counts, dtype=torch.float64)


def _summ(c):
    c_b, c_0 = float(c.sum()), float((c == 0).sum())
    return {"C_q": c_b / (len(c) - c_0) if len(c) > c_0 else float("nan"), "C_B": c_b, "C_0": c_0}


def triplet(images, captions, margin=0.2, hardest=False, compat=False):
    s = images @ captions.T  # (B, B) pair batch
    b = s.shape[0]
    out = {"i2t": _summ(_triplet(s, list(range(b)), margin, hardest))}
    if compat and not hardest:
        per_image = []
        for i in range(b):
            per_image.append(sum(1 for j in range(b) if j != i and margin + s[i, j] - s[j, j] > 0))
        out["t2i"] = _summ(torch.tensor(per_image, dtype=torch.float64))
    else:
        out["t2i"] = _summ(_triplet(s.T.contiguous(), list(range(b)), margin, hardest))
    return out


def ntxent(images, captions, tau=0.1, eps=0.01):
    s = images @ captions.T
    out = {}
    for d, m in (("i2t", s), ("t2i", s.T)):
        rows = {"C_qv-": [], "W_qv-": [], "W_qv+": [], "W_low": []}
        for q in range(m.shape[0]):
            p = torch.softmax(m[q] / tau, 0)
            neg = torch.ones_like(p, dtype=torch.bool)
            neg[q] = False
            rows["C_qv-"].append(float(((p > eps) & neg).sum()))
            rows["W_qv-"].append(float(p[(p > eps) & neg].sum()))
            rows["W_low"].append(float(p[(p < eps) & neg].sum()))
            rows["W_qv+"].append(float(1 - p[q]))
        out[d] = {k: sum(v) / len(v) for k, v in rows.items()}
    return out


def _smoothap_query(scores, rows, tau, eps, divisor):
    """Full K x K matrices for one query: D[a, b] = s_b - s_a, then the selected rows."""
    k = scores.shape[0]
    d = scores[None, :] - scores[:, None]
    g = torch.sigmoid((d / tau).clamp(-50, 50))
    g = g * (1 - torch.eye(k, dtype=g.dtype))
    r = 1 + g.sum(1)
    w = g * (1 - g) / (r[:, None] ** 2)
    return float((w[rows] > eps).sum()) / divisor


def smoothap(images, captions, tau=0.01, eps=0.01, compat=False):
    s = images @ captions.T  # (B, kB)
    b, m = s.shape
    k = m // b
    out = {}
    c = [_smoothap_query(s[i], list(range(k * i, k * i + k)), tau, eps, k) for i in range(b)]
    out["i2t"] = _summ(torch.tensor(c, dtype=torch.float64))
    c = []
    for q in range(m):
        if compat:
            rows = [r for r in range(k * q, k * q + k) if r < b]
            c.append(_smoothap_query(s[:, q], rows, tau, eps, 1) if rows else 0.0)
        else:
            c.append(_smoothap_query(s[:, q], [q // k], tau, eps, 1))
    out["t2i"] = _summ(torch.tensor(c, dtype=torch.float64))
    return out
