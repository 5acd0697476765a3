"""Retrieval metrics on a similarity matrix (spec: "Retrieval evaluation").

``sims`` is ``N x N*k`` (numpy or torch): row ``i`` is image ``i``, column ``c``
is caption ``c``, and caption ``c`` belongs to image ``c // k``.

Ranks are 0-based. Ties are resolved optimistically and deterministically: a
positive's rank counts only the candidates with a *strictly* higher score, so a
negative with exactly the positive's score does not push it down. For i2t
lists (mAP@5, R-precision) positives are placed before negatives with equal
score; the order among tied positives does not matter, as both are hits.

Recalls are percentages (0-100); mAP@5 and R-precision are on a 0-1 scale.
Median and mean rank follow VSE++ (``evaluation.py`` of fartashf/vsepp): from the
0-based rank of each query's best positive, ``medr = floor(median(ranks)) + 1``
and ``meanr = mean(ranks) + 1`` (1-based; ``medr`` is an integer-valued float).
"""

from __future__ import annotations

import numpy as np
import torch

from cocos.errors import CocosError

RECALL_KS = (1, 5, 10)
ROW_CHUNK = 256  # rows (or columns) handled at once when counting ranks


def _as_sims(sims, k: int) -> np.ndarray:
    """``sims`` as a numpy array, checked to be ``N x N*k`` and free of NaN."""
    if isinstance(sims, torch.Tensor):
        sims = sims.detach().cpu().numpy()
    sims = np.asarray(sims)
    if not np.issubdtype(sims.dtype, np.floating):
        sims = sims.astype(np.float64)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise CocosError(f"captions per image k must be a positive integer, got {k!r}")
    if sims.ndim != 2 or sims.shape[0] == 0 or sims.shape[1] != sims.shape[0] * k:
        raise CocosError(f"similarity matrix must be N x N*k with k={k}, got shape {sims.shape}")
    if np.isnan(sims).any():
        raise CocosError("similarity matrix contains NaN")
    return sims


def _i2t_positions(sims: np.ndarray, k: int) -> np.ndarray:
    """1-based positions of each image's ``k`` positives in its ranking, ``(N, k)`` ascending.

    The j-th best positive (0-based) sits at ``1 + j + #{negatives with a strictly
    higher score}``: positives first among equal scores.
    """
    n = sims.shape[0]
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, ROW_CHUNK):
        rows = np.arange(start, min(start + ROW_CHUNK, n))
        block = sims[rows]  # (b, N*k)
        cols = rows[:, None] * k + np.arange(k)  # (b, k)
        pos = -np.sort(-np.take_along_axis(block, cols, axis=1), axis=1)  # descending
        above_all = (block[:, None, :] > pos[:, :, None]).sum(axis=2)  # (b, k)
        above_pos = (pos[:, None, :] > pos[:, :, None]).sum(axis=2)  # positives above
        out[rows] = 1 + np.arange(k) + (above_all - above_pos)
    return out


def i2t_ranks(sims, k: int) -> np.ndarray:
    """Rank of each image query: best 0-based rank among its ``k`` captions, ``(N,)``.

    Equals the number of captions scoring strictly higher than its best positive.
    """
    sims = _as_sims(sims, k)
    return _i2t_positions(sims, k)[:, 0] - 1


def t2i_ranks(sims, k: int) -> np.ndarray:
    """Rank of each caption query (``N*k`` of them): images scoring strictly higher
    than the caption's own image ``c // k``."""
    sims = _as_sims(sims, k)
    n_caps = sims.shape[1]
    out = np.empty(n_caps, dtype=np.int64)
    for start in range(0, n_caps, ROW_CHUNK):
        cols = np.arange(start, min(start + ROW_CHUNK, n_caps))
        block = sims[:, cols]  # (N, b)
        pos = block[cols // k, np.arange(len(cols))]
        out[cols] = (block > pos[None, :]).sum(axis=0)
    return out


def recall_at(ranks, K: int) -> float:
    """R@K: 100 x the share of queries whose 0-based rank is < K."""
    ranks = np.asarray(ranks)
    if ranks.size == 0:
        raise CocosError("no queries to compute recall on")
    return float(100.0 * np.mean(ranks < K))


def median_rank(ranks) -> float:
    """VSE++'s ``medr`` from 0-based ranks: ``floor(median(ranks)) + 1``."""
    ranks = np.asarray(ranks)
    if ranks.size == 0:
        raise CocosError("no queries to compute the median rank on")
    return float(np.floor(np.median(ranks)) + 1)


def mean_rank(ranks) -> float:
    """VSE++'s ``meanr`` from 0-based ranks: ``mean(ranks) + 1``."""
    ranks = np.asarray(ranks)
    if ranks.size == 0:
        raise CocosError("no queries to compute the mean rank on")
    return float(ranks.mean() + 1)


def map_at_5(sims, k: int, normalizer: str = "hits") -> float:
    """i2t mAP@5 on a 0-1 scale: mean over image queries of AP@5.

    AP@5 of a query = (1/Z) * sum, over its positives at positions j <= 5, of
    precision@j. The normaliser ``Z``:

    - ``"hits"`` (default): the number of positives inside the top 5, and
      AP@5 = 0 when there is none. This is what the COCOS paper's reference code
      computes (``average_precision`` in Bleeker's evaluation utils, the mean of
      precision@j over the hits) and what its Table 1 reports (0.41-0.73).
    - ``"min_k"``: ``min(k, 5)``, the textbook AP@K, which also penalises
      positives missing from the top 5 (always <= the ``"hits"`` value).
    """
    return _map_at_5(_i2t_positions(_as_sims(sims, k), k), k, normalizer)


def _map_at_5(pos: np.ndarray, k: int, normalizer: str = "hits") -> float:
    """mAP@5 from the ``(N, k)`` ascending 1-based positions of each image's positives."""
    hits = pos <= 5
    precision = np.arange(1, k + 1)[None, :] / pos  # the j-th positive is hit number j+1
    total = np.where(hits, precision, 0.0).sum(axis=1)
    if normalizer == "hits":
        n_hits = hits.sum(axis=1)
        ap = np.divide(total, n_hits, out=np.zeros_like(total), where=n_hits > 0)
    elif normalizer == "min_k":
        ap = total / min(k, 5)
    else:
        raise CocosError(f"unknown mAP@5 normalizer '{normalizer}' (choose from hits, min_k)")
    return float(ap.mean())


def r_precision(sims, k: int) -> tuple[float, float]:
    """R-precision (LTD) in both directions, ``(i2t, t2i)``, on a 0-1 scale.

    Per query, the share of its ``r`` positives inside the top ``r``, with ``r``
    the number of positives: i2t ``r = k``, t2i ``r = 1`` (so t2i equals R@1/100).
    """
    sims = _as_sims(sims, k)
    i2t = float(np.mean((_i2t_positions(sims, k) <= k).sum(axis=1) / k))
    t2i = float(np.mean(t2i_ranks(sims, k) < 1))
    return i2t, t2i


def evaluate_sims(sims, k: int) -> dict[str, float]:
    """All retrieval metrics of one similarity matrix, as python floats.

    Keys: ``i2t_R@1, i2t_R@5, i2t_R@10, t2i_R@1, t2i_R@5, t2i_R@10`` (percent),
    ``rsum`` (their sum, at most 600), ``mAP@5`` (i2t, 0-1, ``"hits"``
    normaliser, see :func:`map_at_5`), ``i2t_Rprec, t2i_Rprec`` (0-1),
    ``i2t_medr, i2t_meanr, t2i_medr, t2i_meanr`` (1-based, VSE++'s definition, see
    :func:`median_rank` and :func:`mean_rank`).
    """
    sims = _as_sims(sims, k)
    pos = _i2t_positions(sims, k)
    ranks = {"i2t": pos[:, 0] - 1, "t2i": t2i_ranks(sims, k)}
    out = {f"{d}_R@{K}": recall_at(ranks[d], K) for d in ("i2t", "t2i") for K in RECALL_KS}
    out["rsum"] = float(sum(out[f"{d}_R@{K}"] for d in ("i2t", "t2i") for K in RECALL_KS))
    out["mAP@5"] = _map_at_5(pos, k)
    out["i2t_Rprec"] = float(np.mean((pos <= k).sum(axis=1) / k))
    out["t2i_Rprec"] = float(np.mean(ranks["t2i"] < 1))
    for d in ("i2t", "t2i"):
        out[f"{d}_medr"] = median_rank(ranks[d])
        out[f"{d}_meanr"] = mean_rank(ranks[d])
    return out


def similarity_matrix(img_emb, cap_emb, chunk: int = 1024) -> np.ndarray:
    """``img_emb @ cap_emb.T`` as a float32 numpy array, filled ``chunk`` images at a time.

    The only large allocation is the result itself (5000 x 25000 floats = 500 MB).
    Embeddings are expected L2-normalised, so entries are cosine similarities.
    """
    img = torch.as_tensor(img_emb).detach().float()
    cap = torch.as_tensor(cap_emb).detach().float().to(img.device)
    if img.dim() != 2 or cap.dim() != 2 or img.shape[1] != cap.shape[1]:
        raise CocosError(f"embeddings must be (N, d) and (M, d), got {tuple(img.shape)} "
                         f"and {tuple(cap.shape)}")
    sims = np.empty((img.shape[0], cap.shape[0]), dtype=np.float32)
    cap_t = cap.t()
    for start in range(0, img.shape[0], chunk):
        sims[start:start + chunk] = (img[start:start + chunk] @ cap_t).cpu().numpy()
    return sims


def evaluate_embeddings(img_emb, cap_emb, k: int, fold5: bool | None = None) -> dict[str, float]:
    """Metrics of :func:`evaluate_sims` for embeddings ``img_emb (N, d)``, ``cap_emb (N*k, d)``.

    Unprefixed keys are computed on the full set (COCO 5K). With ``fold5``
    (default: on exactly when ``N == 5000``, the COCO test split) the set is also
    cut into 5 consecutive folds of ``N/5`` images with their captions (1000 for
    COCO, as VSE++'s ``fold5``); each fold is evaluated on its own diagonal block
    of ``sims`` and the mean over the folds is reported under ``1k_``-prefixed
    keys (e.g. ``1k_rsum``, ``1k_i2t_medr``: the mean of the folds' median ranks, as
    VSE++ averages its fold results). ``N`` must then be divisible by 5.
    """
    sims = _as_sims(similarity_matrix(img_emb, cap_emb), k)
    n = sims.shape[0]
    out = evaluate_sims(sims, k)
    if fold5 is None:
        fold5 = n == 5000
    if fold5:
        if n % 5:
            raise CocosError(f"5-fold evaluation needs a number of images divisible by 5, got {n}")
        size = n // 5
        folds = [evaluate_sims(sims[f * size:(f + 1) * size,
                                    f * size * k:(f + 1) * size * k], k) for f in range(5)]
        for key in list(out):
            out[f"1k_{key}"] = float(np.mean([fold[key] for fold in folds]))
    return out
