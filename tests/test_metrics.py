import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cocos.errors import CocosError
from cocos.training.metrics import (
    evaluate_embeddings,
    evaluate_sims,
    i2t_ranks,
    map_at_5,
    mean_rank,
    median_rank,
    r_precision,
    recall_at,
    t2i_ranks,
)

# 3 images x k=2 captions: captions 0,1 -> image 0; 2,3 -> image 1; 4,5 -> image 2.
SIMS = np.array([
    #  c0    c1    c2    c3    c4    c5
    [0.90, 0.10, 0.50, 0.80, 0.30, 0.20],  # img 0
    [0.70, 0.60, 0.40, 0.65, 0.10, 0.00],  # img 1
    [0.30, 0.20, 0.90, 0.80, 0.10, 0.05],  # img 2
])
# i2t, ranking of each row (positives in brackets), 1-based positions of the positives:
#   img 0: [c0] c3 c2 c4 c5 [c1]  -> positions 1, 6 -> rank 0
#   img 1: c0 [c3] c1 [c2] c4 c5  -> positions 2, 4 -> rank 1
#   img 2: c2 c3 c0 c1 [c4] [c5]  -> positions 5, 6 -> rank 4
# t2i, each column against its image's score (strictly higher images counted):
#   c0: 0.9 vs (0.7, 0.3)  -> 0      c1: 0.1 vs (0.6, 0.2) -> 2
#   c2: 0.4 vs (0.5, 0.9)  -> 2      c3: 0.65 vs (0.8, 0.8) -> 2
#   c4: 0.1 vs (0.3, 0.1)  -> 1 (the tie with img 1 does not count)
#   c5: 0.05 vs (0.2, 0.0) -> 1
I2T_RANKS = [0, 1, 4]
T2I_RANKS = [0, 2, 2, 2, 1, 1]
# AP@5 with the "hits" normaliser (mean of precision@j over the hits in the top 5):
#   img 0: hit at 1 -> 1/1 = 1;  img 1: hits at 2, 4 -> (1/2 + 2/4) / 2 = 0.5;
#   img 2: hit at 5 -> 1/5 = 0.2.   mAP@5 = (1 + 0.5 + 0.2) / 3 = 1.7 / 3
# with the min(k, 5) = 2 normaliser: (1/2 + 1/2 + 0.2/2) / 3 = 1.1 / 3
MAP5_HITS, MAP5_MINK = 1.7 / 3, 1.1 / 3
# R-precision i2t (r = 2): top-2 of img 0 = c0 c3 -> 1/2; img 1 = c0 c3 -> 1/2; img 2 -> 0.
# t2i (r = 1): only c0 is ranked first -> 1/6.
RPREC = (1.0 / 3, 1.0 / 6)
# Median / mean rank (VSE++: medr = floor(median(0-based ranks)) + 1, meanr = mean + 1):
#   i2t ranks [0, 1, 4]: median 1 -> medr 2; mean 5/3 -> meanr 8/3.
#   t2i ranks [0, 2, 2, 2, 1, 1] (sorted 0 1 1 2 2 2): median (1 + 2) / 2 = 1.5,
#   floor -> 1, medr 2; mean 8/6 -> meanr 1 + 4/3 = 7/3.
RANKS = {"i2t_medr": 2.0, "i2t_meanr": 8 / 3, "t2i_medr": 2.0, "t2i_meanr": 7 / 3}
EXPECTED = {
    "i2t_R@1": 100 / 3, "i2t_R@5": 100.0, "i2t_R@10": 100.0,
    "t2i_R@1": 100 / 6, "t2i_R@5": 100.0, "t2i_R@10": 100.0,
    "rsum": 450.0, "mAP@5": MAP5_HITS, "i2t_Rprec": RPREC[0], "t2i_Rprec": RPREC[1],
    **RANKS,
}


def test_hand_made_ranks():
    assert i2t_ranks(SIMS, 2).tolist() == I2T_RANKS
    assert t2i_ranks(SIMS, 2).tolist() == T2I_RANKS


def test_hand_made_recall_map_rprec():
    assert recall_at(I2T_RANKS, 1) == pytest.approx(100 / 3)
    assert recall_at(I2T_RANKS, 4) == pytest.approx(200 / 3)  # rank 4 is not < 4
    assert recall_at(T2I_RANKS, 2) == pytest.approx(50.0)
    assert map_at_5(SIMS, 2) == pytest.approx(MAP5_HITS)
    assert map_at_5(SIMS, 2, normalizer="min_k") == pytest.approx(MAP5_MINK)
    assert r_precision(SIMS, 2) == pytest.approx(RPREC)


def test_hand_made_evaluate_sims():
    out = evaluate_sims(SIMS, 2)
    assert set(out) == set(EXPECTED)
    assert all(type(v) is float for v in out.values())
    for key, value in EXPECTED.items():
        assert out[key] == pytest.approx(value), key


def test_hand_made_median_and_mean_rank():
    assert median_rank(I2T_RANKS) == 2.0 and mean_rank(I2T_RANKS) == pytest.approx(8 / 3)
    assert median_rank(T2I_RANKS) == 2.0 and mean_rank(T2I_RANKS) == pytest.approx(7 / 3)
    # the floor matters for an even count with a half-integer median: median 2.5 -> 3, not 3.5
    assert median_rank([0, 2, 3, 9]) == 3.0 and mean_rank([0, 2, 3, 9]) == 4.5
    # an odd count: median of [3, 0, 7] is 3 -> medr 4
    assert median_rank([3, 0, 7]) == 4.0
    out = evaluate_sims(SIMS, 2)
    for key, value in RANKS.items():
        assert type(out[key]) is float
        assert out[key] == pytest.approx(value, rel=1e-15), key
    with pytest.raises(CocosError, match="median"):
        median_rank([])
    with pytest.raises(CocosError, match="mean"):
        mean_rank([])


def vsepp_i2t(sims, k):
    """VSE++'s ``evaluation.i2t`` loop (fartashf/vsepp), on a precomputed N x N*k matrix."""
    npts = sims.shape[0]
    ranks = np.zeros(npts)
    for index in range(npts):
        inds = np.argsort(sims[index])[::-1]
        rank = 1e20
        for i in range(k * index, k * index + k):
            tmp = np.where(inds == i)[0][0]
            if tmp < rank:
                rank = tmp
        ranks[index] = rank
    r1, r5, r10 = (100.0 * len(np.where(ranks < K)[0]) / len(ranks) for K in (1, 5, 10))
    medr = np.floor(np.median(ranks)) + 1
    meanr = ranks.mean() + 1
    return r1, r5, r10, medr, meanr


def vsepp_t2i(sims, k):
    """VSE++'s ``evaluation.t2i`` loop: caption ``k*index + i`` ranks the images."""
    npts = sims.shape[0]
    ranks = np.zeros(k * npts)
    for index in range(npts):
        for i in range(k):
            inds = np.argsort(sims[:, k * index + i])[::-1]
            ranks[k * index + i] = np.where(inds == index)[0][0]
    r1, r5, r10 = (100.0 * len(np.where(ranks < K)[0]) / len(ranks) for K in (1, 5, 10))
    medr = np.floor(np.median(ranks)) + 1
    meanr = ranks.mean() + 1
    return r1, r5, r10, medr, meanr


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), k=st.integers(1, 5), seed=st.integers(0, 2**32 - 1),
       float32=st.booleans())
def test_matches_vsepp_loops_without_ties(n, k, seed, float32):
    rng = np.random.default_rng(seed)
    # a permutation of distinct values: no ties, so argsort's order is unambiguous
    sims = (rng.permutation(n * n * k).reshape(n, n * k) / (n * n * k)).astype(
        np.float32 if float32 else np.float64)
    out = evaluate_sims(sims, k)
    for d, ref in (("i2t", vsepp_i2t(sims, k)), ("t2i", vsepp_t2i(sims, k))):
        r1, r5, r10, medr, meanr = ref
        assert out[f"{d}_R@1"] == pytest.approx(r1, rel=1e-12)
        assert out[f"{d}_R@5"] == pytest.approx(r5, rel=1e-12)
        assert out[f"{d}_R@10"] == pytest.approx(r10, rel=1e-12)
        assert out[f"{d}_medr"] == medr, d
        assert out[f"{d}_meanr"] == pytest.approx(meanr, rel=1e-12), d


def test_matches_vsepp_loops_on_gaussian_scores():
    rng = np.random.default_rng(7)
    for n, k in ((1, 1), (2, 5), (9, 5), (40, 5), (31, 3)):
        sims = rng.normal(size=(n, n * k))
        assert len(np.unique(sims)) == sims.size  # continuous draws: no ties
        out = evaluate_sims(sims, k)
        for d, (_, _, _, medr, meanr) in (("i2t", vsepp_i2t(sims, k)), ("t2i", vsepp_t2i(sims, k))):
            assert out[f"{d}_medr"] == medr and out[f"{d}_meanr"] == pytest.approx(meanr, rel=1e-12)


def test_torch_input_matches_numpy():
    assert evaluate_sims(torch.tensor(SIMS, dtype=torch.float64), 2) == evaluate_sims(SIMS, 2)


def test_ties_are_optimistic():
    # 2 images x k=2. img 0: positive c0 ties with negative c2 -> rank 0;
    # positions: c0 -> 1 (positives first among equals), c1 -> 3 (c2 is strictly above it).
    # img 1: every score equal -> positives at 1, 2.
    sims = np.array([[0.5, 0.2, 0.5, 0.1],
                     [0.3, 0.3, 0.3, 0.3]])
    assert i2t_ranks(sims, 2).tolist() == [0, 0]
    # t2i: c0 0.5 vs 0.3; c1 0.2 vs 0.3 -> 1; c2 0.3 vs 0.5 -> 1; c3 0.3 vs 0.1 -> 0
    assert t2i_ranks(sims, 2).tolist() == [0, 1, 1, 0]
    # AP@5: img 0 (1/1 + 2/3) / 2 = 5/6, img 1 (1 + 1) / 2 = 1
    assert map_at_5(sims, 2) == pytest.approx((5 / 6 + 1) / 2)
    # R-precision i2t: img 0 has 1 of 2 in its top 2, img 1 has both
    assert r_precision(sims, 2) == pytest.approx((0.75, 0.5))


def test_invalid_input_raises():
    with pytest.raises(CocosError, match="N x N\\*k"):
        evaluate_sims(np.zeros((3, 5)), 2)
    with pytest.raises(CocosError, match="NaN"):
        evaluate_sims(np.full((2, 4), np.nan), 2)
    with pytest.raises(CocosError, match="normalizer"):
        map_at_5(SIMS, 2, normalizer="bogus")


def brute_force(sims, k):
    """Loop-by-loop reference: sort each ranking by (-score, negative-after-positive)."""
    n = sims.shape[0]
    i2t, aps, rprec = [], [], []
    for i in range(n):
        is_pos = np.arange(n * k) // k == i
        order = np.lexsort((~is_pos, -sims[i]))  # last key is primary
        hits = np.flatnonzero(is_pos[order]) + 1  # 1-based positions
        i2t.append(hits[0] - 1)
        top5 = hits[hits <= 5]
        aps.append(np.mean(np.arange(1, len(top5) + 1) / top5) if len(top5) else 0.0)
        rprec.append(np.sum(hits <= k) / k)
    t2i = [int(np.sum(sims[:, c] > sims[c // k, c])) for c in range(n * k)]
    return np.array(i2t), np.array(t2i), float(np.mean(aps)), float(np.mean(rprec))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 7), k=st.integers(1, 4), levels=st.integers(2, 6),
       seed=st.integers(0, 2**32 - 1))
def test_matches_brute_force_with_many_ties(n, k, levels, seed):
    sims = np.random.default_rng(seed).integers(0, levels, (n, n * k)).astype(float)
    i2t, t2i, map5, rprec = brute_force(sims, k)
    assert i2t_ranks(sims, k).tolist() == i2t.tolist()
    assert t2i_ranks(sims, k).tolist() == t2i.tolist()
    assert map_at_5(sims, k) == pytest.approx(map5)
    assert r_precision(sims, k)[0] == pytest.approx(rprec)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 15), k=st.integers(1, 5), seed=st.integers(0, 2**32 - 1),
       ties=st.booleans())
def test_recall_monotone_and_rsum_bounded(n, k, seed, ties):
    rng = np.random.default_rng(seed)
    sims = rng.integers(0, 3, (n, n * k)).astype(float) if ties else rng.normal(size=(n, n * k))
    for ranks in (i2t_ranks(sims, k), t2i_ranks(sims, k)):
        recalls = [recall_at(ranks, K) for K in range(1, 2 * n * k + 2)]
        assert all(a <= b for a, b in zip(recalls, recalls[1:], strict=False))
        assert 0.0 <= recalls[0] and recalls[-1] == 100.0
    out = evaluate_sims(sims, k)
    assert 0.0 <= out["rsum"] <= 600.0
    assert 0.0 <= out["mAP@5"] <= 1.0 and map_at_5(sims, k, "min_k") <= out["mAP@5"] + 1e-12


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 12), k=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_permuting_images_with_their_captions_changes_nothing(n, k, seed):
    rng = np.random.default_rng(seed)
    sims = rng.integers(0, 4, (n, n * k)).astype(float)  # integer scores: plenty of ties
    perm = rng.permutation(n)
    within = rng.permutation(k)  # also shuffle captions inside each block
    cols = (perm[:, None] * k + within[None, :]).ravel()
    permuted = sims[perm][:, cols]
    assert evaluate_sims(permuted, k) == pytest.approx(evaluate_sims(sims, k), rel=1e-12)
    # the per-query ranks move with the queries
    assert i2t_ranks(permuted, k).tolist() == i2t_ranks(sims, k)[perm].tolist()
    assert t2i_ranks(permuted, k).tolist() == t2i_ranks(sims, k)[cols].tolist()


def embeddings(n, k, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)
    cap = torch.nn.functional.normalize(
        img.repeat_interleave(k, 0) + 0.8 * torch.randn(n * k, d, generator=g), dim=1)
    return img, cap


def test_evaluate_embeddings_full_set_only_by_default():
    img, cap = embeddings(10, 2)
    out = evaluate_embeddings(img, cap, 2)
    assert set(out) == set(EXPECTED)
    assert out == pytest.approx(evaluate_sims((img @ cap.T).numpy(), 2))
    assert set(evaluate_embeddings(img, cap, 2, fold5=False)) == set(EXPECTED)


def test_fold5_on_tiny_matrix_uses_diagonal_blocks():
    n, k = 10, 2
    img, cap = embeddings(n, k, seed=3)
    out = evaluate_embeddings(img.numpy(), cap.numpy(), k, fold5=True)
    assert set(out) == set(EXPECTED) | {f"1k_{key}" for key in EXPECTED}
    sims = (img @ cap.T).numpy()
    folds = [evaluate_sims(sims[2 * f:2 * f + 2, 4 * f:4 * f + 4], k) for f in range(5)]
    for key in EXPECTED:
        assert out[f"1k_{key}"] == pytest.approx(np.mean([fold[key] for fold in folds])), key
        assert out[key] == pytest.approx(evaluate_sims(sims, k)[key]), key
    # a fold is easier than the full set (fewer candidates), so here it differs
    assert out["1k_rsum"] > out["rsum"]


def test_fold5_needs_divisible_n():
    img, cap = embeddings(6, 1)
    with pytest.raises(CocosError, match="divisible by 5"):
        evaluate_embeddings(img, cap, 1, fold5=True)


def test_fold5_automatic_for_5000_images():
    img, cap = embeddings(5000, 1, d=8, seed=1)
    out = evaluate_embeddings(img, cap, 1)
    assert set(out) == set(EXPECTED) | {f"1k_{key}" for key in EXPECTED}
    # a fold's candidates are a subset of the full set's, so no rank can get worse
    for key in ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10"):
        assert out[f"1k_{key}"] >= out[key], key
    assert out["1k_rsum"] > out["rsum"]
