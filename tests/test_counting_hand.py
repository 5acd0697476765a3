"""Hand-worked small cases for every statistic of the definitions file."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cocos.counting import count_batch, count_queries
from tests.helpers import embed_similarities

# Pair batch, B = 3, caption j belongs to image j, margin 0.2.
# Values are chosen away from the hinge boundary (no violation is exactly 0).
S3 = np.array([
    [0.60, 0.50, 0.10],
    [0.30, 0.40, 0.35],
    [0.10, 0.29, 0.50],
])
# i2t (rows): image 0: 0.2+0.50-0.60=0.10 yes, 0.2+0.10-0.60 no        -> 1
#             image 1: 0.2+0.30-0.40=0.10 yes, 0.2+0.35-0.40=0.15 yes  -> 2
#             image 2: 0.2+0.10-0.50 no, 0.2+0.29-0.50=-0.01 no         -> 0
# t2i (columns): caption 0: 0.2+0.30-0.60 no, 0.2+0.10-0.60 no          -> 0
#                caption 1: 0.2+0.50-0.40=0.30 yes, 0.2+0.29-0.40=0.09 yes -> 2
#                caption 2: 0.2+0.10-0.50 no, 0.2+0.35-0.50=0.05 yes     -> 1
# compat t2i, grouped by negative image i over captions j != i:
#   image 0: j=1 yes (0.30), j=2 no -> 1; image 1: j=0 no, j=2 yes -> 1;
#   image 2: j=0 no, j=1 yes (0.09) -> 1


def _pair(s):
    return embed_similarities(s)


def test_triplet_hand():
    images, captions = _pair(S3)
    out = count_batch(images, captions, "triplet")
    assert out["i2t"]["C_B"] == 3 and out["i2t"]["C_0"] == 1 and out["i2t"]["C_q"] == 1.5
    assert out["t2i"]["C_B"] == 3 and out["t2i"]["C_0"] == 1 and out["t2i"]["C_q"] == 1.5
    per_query = count_queries(images, captions, "triplet")
    assert per_query["i2t"].per_query["C_q"].tolist() == [1, 2, 0]
    assert per_query["t2i"].per_query["C_q"].tolist() == [0, 2, 1]


def test_triplet_compat_groups_t2i_by_negative_image():
    images, captions = _pair(S3)
    out = count_batch(images, captions, "triplet", compat=True)
    assert out["t2i"]["C_B"] == 3  # unchanged
    assert out["t2i"]["C_0"] == 0 and out["t2i"]["C_q"] == 1.0
    assert count_queries(images, captions, "triplet", compat=True)["t2i"].per_query["C_q"].tolist() == [1, 1, 1]
    # i2t is not affected by compat
    assert out["i2t"] == count_batch(images, captions, "triplet")["i2t"]


def test_triplet_sh_hand():
    images, captions = _pair(S3)
    for compat in (False, True):
        out = count_batch(images, captions, "triplet_sh", compat=compat)
        # i2t [1, 1, 0]; t2i [0, 1, 1]
        assert (out["i2t"]["C_B"], out["i2t"]["C_0"], out["i2t"]["C_q"]) == (2, 1, 1)
        assert (out["t2i"]["C_B"], out["t2i"]["C_0"], out["t2i"]["C_q"]) == (2, 1, 1)


def test_triplet_margin_is_a_parameter():
    images, captions = _pair(S3)
    # margin 0.12: image 1 keeps 0.12+0.35-0.40=0.07 and 0.12+0.30-0.40=0.02, image 0 keeps 0.02
    out = count_batch(images, captions, "triplet", margin=0.12)
    assert out["i2t"]["C_B"] == 3
    # margin 0.05: only image 1 with 0.05+0.35-0.40 = 0 -> not strictly positive -> nothing
    out = count_batch(images, captions, "triplet", margin=0.04)
    assert out["i2t"]["C_B"] == 0 and math.isnan(out["i2t"]["C_q"]) and out["i2t"]["C_0"] == 3


def test_triplet_companions():
    images, captions = _pair(S3)
    out = count_batch(images, captions, "triplet")["i2t"]
    # queries with a gradient have 1 and 2 equal-weight negatives: N_eff = 1 and 2, top1 = 1 and 1/2
    assert out["N_eff"] == pytest.approx(1.5)
    assert out["N_invsimpson"] == pytest.approx(1.5)
    assert out["top1_share"] == pytest.approx(0.75)


S_NT = np.array([
    [0.5, 0.3, 0.0],
    [0.0, 0.5, 0.0],
    [0.0, 0.0, 0.5],
])


def test_ntxent_hand():
    images, captions = _pair(S_NT)
    out = count_batch(images, captions, "ntxent", tau=0.1, eps=0.01)["i2t"]
    # row 0: logits 5, 3, 0; Z = e^5 + e^3 + 1
    z0 = math.exp(5) + math.exp(3) + 1
    p_pos0, p_a, p_b = math.exp(5) / z0, math.exp(3) / z0, 1 / z0  # 0.8756, 0.1185, 0.0059
    # rows 1 and 2: logits 0, 5, 0: both negatives at 1 / (e^5 + 2) = 0.0066 < eps
    z1 = math.exp(5) + 2
    assert out["C_qv-"] == pytest.approx(1 / 3)
    assert out["W_qv-"] == pytest.approx(p_a / 3)
    assert out["W_low"] == pytest.approx((p_b + 2 / z1 + 2 / z1) / 3)
    assert out["W_qv+"] == pytest.approx(((1 - p_pos0) + 2 * (1 - math.exp(5) / z1)) / 3)
    # companions of row 0: u = (p_a, p_b) / (p_a + p_b)
    u = np.array([p_a, p_b]) / (p_a + p_b)
    row0 = count_queries(images, captions, "ntxent")["i2t"].per_query
    assert float(row0["N_eff"][0]) == pytest.approx(math.exp(-(u * np.log(u)).sum()))
    assert float(row0["top1_share"][0]) == pytest.approx(u.max())


def test_ntxent_threshold_moves_weight_between_counted_and_low():
    images, captions = _pair(S_NT)
    out = count_batch(images, captions, "ntxent", eps=0.2)["i2t"]
    assert out["C_qv-"] == 0 and out["W_qv-"] == 0
    assert out["W_low"] == pytest.approx(out["W_qv+"])


def _smoothap_plain(scores, positives, tau, eps):
    """Per-anchor counts by the formula, scalar Python (for the hand case)."""
    counts = []
    for a in positives:
        g = {b: 1 / (1 + math.exp(-max(-50, min(50, (scores[b] - scores[a]) / tau))))
             for b in range(len(scores)) if b != a}
        r = 1 + sum(g.values())
        counts.append(sum(1 for b, gb in g.items() if gb * (1 - gb) / r**2 > eps))
    return counts


def test_smoothap_hand_i2t():
    # B = 2 images, k = 2 captions each (captions 0,1 -> image 0; 2,3 -> image 1)
    s = np.array([
        [0.50, 0.40, 0.45, 0.00],
        [0.00, 0.10, 0.60, 0.58],
    ])
    images, captions = embed_similarities(s)
    # image 0, tau 0.1: anchor 0 (0.50): G = sig(-1), sig(-0.5), sig(-5) = .2689, .3775, .0067,
    #   R = 1.6532, w = .0719, .0860, .0024 -> 2 above eps=0.01
    #   anchor 1 (0.40): G = sig(1), sig(0.5), sig(-4) = .7311, .6225, .0180, R = 2.3715,
    #   w = .0350, .0418, .0031 -> 2 above eps. C^q(image 0) = (2 + 2) / 2 = 2
    assert _smoothap_plain(s[0], [0, 1], 0.1, 0.01) == [2, 2]
    per_query = count_queries(images, captions, "smoothap", tau=0.1, eps=0.01)["i2t"].per_query["C_q"]
    assert per_query[0].item() == 2.0
    expected_1 = sum(_smoothap_plain(s[1], [2, 3], 0.1, 0.01)) / 2
    assert per_query[1].item() == expected_1


def test_smoothap_tau_default_saturates_far_candidates():
    # with tau = 0.01 a candidate 0.1 below the anchor has G = sig(-10): w ~ 4.5e-5 -> not counted
    s = np.array([[0.5, 0.4, 0.0, 0.0], [0.0, 0.0, 0.5, 0.49]])
    images, captions = embed_similarities(s)
    out = count_batch(images, captions, "smoothap")["i2t"]
    # image 0: anchor 0.5 vs 0.4: G=sig(-10); anchor 0.4 vs 0.5: G = sig(10): both w tiny; vs 0.0 tiny
    # image 1: anchors 0.5 and 0.49 are 1 tau apart: G = sig(-1) -> w = .1966 / (1+.2689)^2 = .122 > eps
    #   anchor 0.49 vs 0.5: G = sig(1) = .7311, R = 1.7311, w = .1966 / 2.9967 = .0656 > eps
    assert out["C_0"] == 1
    assert out["C_q"] == 1.0


def test_smoothap_compat_t2i_uses_the_wrong_rows():
    # B = 2, k = 2: caption queries 0..3. Compat: query q takes image rows 2q, 2q+1 (< B):
    # q = 0 -> rows 0, 1 (divided by 1); q >= 1 -> nothing, so C^q = 0 for queries 1, 2, 3.
    s = np.array([
        [0.50, 0.49, 0.10, 0.12],
        [0.48, 0.47, 0.11, 0.10],
    ])
    images, captions = embed_similarities(s)
    fixed = count_queries(images, captions, "smoothap", tau=0.01)["t2i"].per_query["C_q"].tolist()
    compat = count_queries(images, captions, "smoothap", tau=0.01, compat=True)["t2i"].per_query["C_q"].tolist()
    # corrected: caption 0 (scores .50 vs .48, 2 tau apart): anchor image 0, G(0,1) = sig(-2) = .1192,
    #   R = 1.1192, w = .1050 / 1.2526 = .0838 > eps -> 1; caption 1 likewise (.49 vs .47) -> 1;
    #   caption 2 (.10 vs .11, image 1 is the positive): G = sig(-1) -> w = .1966/1.6097 = .122 -> 1;
    #   caption 3 (.12 vs .10, positive image 1 ranks lower): G = sig(2) = .8808, R = 1.8808,
    #   w = .1050 / 3.5374 = .0297 -> 1
    assert fixed == [1.0, 1.0, 1.0, 1.0]
    # compat: caption 0 counts both rows of its matrix: row 0 (anchor .50): 1; row 1 (anchor .48): 1
    assert compat == [2.0, 0.0, 0.0, 0.0]
    out = count_batch(images, captions, "smoothap", compat=True)
    assert out["t2i"]["C_0"] == 3 and out["t2i"]["C_q"] == 2.0
    assert out["i2t"] == count_batch(images, captions, "smoothap")["i2t"]


def test_same_image_pairs_are_negatives_only_in_compat():
    # pair batch of 3 rows where rows 0 and 1 hold the same dataset image (id 7)
    s = np.array([
        [0.60, 0.55, 0.10],
        [0.55, 0.60, 0.10],
        [0.10, 0.10, 0.60],
    ])
    images, captions = embed_similarities(s)
    ids = [7, 7, 9]
    fixed = count_batch(images, captions, "triplet", image_ids=ids)
    compat = count_batch(images, captions, "triplet", image_ids=ids, compat=True)
    # compat: image 0's other copy (caption 1, 0.55) violates 0.2 + 0.55 - 0.60 > 0; same for image 1
    assert compat["i2t"]["C_B"] == 2 and compat["i2t"]["n_excluded"] == 0
    assert fixed["i2t"]["C_B"] == 0 and fixed["i2t"]["n_excluded"] == 2
    assert fixed["t2i"]["n_excluded"] == 2
    # NT-Xent: the excluded pair leaves the softmax, so row 0's weights are over {0.60, 0.10}
    nt = count_queries(images, captions, "ntxent", image_ids=ids)["i2t"].per_query
    p_neg = math.exp(1.0) / (math.exp(6.0) + math.exp(1.0))
    assert float(nt["W_qv+"][0]) == pytest.approx(p_neg)


@pytest.mark.parametrize("loss", ["triplet", "triplet_sh", "ntxent", "smoothap"])
def test_float32_and_float64_agree(loss):
    g = np.random.default_rng(3)
    images = g.normal(size=(16, 8))
    captions = np.repeat(images, 5 if loss == "smoothap" else 1, 0) + 0.8 * g.normal(
        size=(16 * (5 if loss == "smoothap" else 1), 8))
    a = count_batch(images, captions, loss)
    b = count_batch(torch.tensor(images, dtype=torch.float32), torch.tensor(captions, dtype=torch.float32), loss)
    for d in a:
        for k in a[d]:
            assert a[d][k] == pytest.approx(b[d][k], rel=1e-4, abs=1e-6, nan_ok=True), (d, k)


def test_smoothap_companions_weigh_negatives_only():
    """The companions (N_eff, inverse Simpson, top-1 share) of a SmoothAP query use its weights on negatives: a
    query's other positives, which carry SmoothAP weight too, are not negatives (definitions file §7)."""
    from cocos.data.layout import BatchLayout
    from cocos.losses.counts import companions
    from cocos.losses.smoothap import SmoothAPCounter

    rng = np.random.default_rng(5)
    s = torch.as_tensor(rng.uniform(-0.3, 0.3, size=(3, 9)))  # 3 images x 3 captions each (ranking batch)
    view = BatchLayout.build(3, 9).view(s, "i2t", False)
    counter = SmoothAPCounter(tau=0.05)
    got = counter.count(view).per_query
    w, _ = counter.pair_weights(view)
    for q in range(3):
        negatives = [c for c in range(9) if c // 3 != q]
        on_neg = torch.stack([w[q, :, c].sum() for c in negatives])  # summed over the query's positives (anchors)
        assert float(w[q][:, [c for c in range(9) if c // 3 == q]].abs().sum()) > 0  # positives do carry weight
        want, _ = companions(on_neg[None])
        for stat in ("N_eff", "N_invsimpson", "top1_share"):
            assert float(got[stat][q]) == pytest.approx(float(want[stat][0]), rel=1e-12), stat


# -- ties at the threshold ---------------------------------------------------------------------------------------
# The definitions file counts strictly: a triplet violates when alpha + s(q,n) - s(q,p) > 0 (one exactly on the
# margin is not counted), NT-Xent counts p(q,n) > eps and W_low sums p(q,n) < eps (a weight exactly at eps is in
# neither), SmoothAP counts w(a,b) > eps, GOAL T·P- > eps, the generic counter |dL/dS| > eps * max, IMC's band is
# open at both ends. The batches below put weights exactly on those boundaries: the scores are exact (dyadic unit
# vectors, so every score and every hinge is exact in float64), and eps is a weight the library computed, taken
# as a float. count_batch and the engine behind `cocos count` (count_embeddings: its own threshold and the eps
# sweep, both modes) must both give the strict count, and the count with `>=` must differ (the tie matters).

# Pair batch, B = 6, caption j belongs to image j; multiples of 1/8, so that the hinges at margin 1/4 are exact and
# several sit exactly on 0 (i2t: rows 1, 4 and 5 have no violation but a tie, which is their hardest negative; row 0
# has hinges 1/4 and 1/8, half of it)
S_TIE = np.array([
    [0.500, 0.250, 0.375, 0.000, -0.125, 0.500],
    [0.250, 0.500, 0.125, 0.250, 0.000, 0.000],
    [0.000, 0.125, 0.750, 0.500, 0.250, 0.625],
    [-0.125, 0.000, 0.250, 0.625, 0.500, 0.250],
    [0.125, 0.250, 0.000, 0.125, 0.500, 0.125],
    [0.000, 0.000, 0.125, 0.000, 0.250, 0.500],
])
MARGIN = 0.25
# SmoothAP ranking batch: B = 4 images with k = 2 captions each (captions 2i, 2i + 1 belong to image i)
S_RANK = np.array([
    [0.500, 0.375, 0.250, 0.500, 0.125, 0.000, 0.250, -0.125],
    [0.250, 0.125, 0.500, 0.375, 0.250, 0.250, 0.000, 0.125],
    [0.000, 0.250, 0.125, 0.250, 0.500, 0.375, 0.250, 0.000],
    [0.125, 0.000, 0.250, 0.125, 0.375, 0.250, 0.500, 0.500],
])
MODES = ("corrected", "compat")


def _dyadic(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact unit vectors with ``images @ captions.T == s``: image ``i`` is ``e_i``, caption ``j`` is ``(s[:, j],
    1/8, ..., 1/8)`` with as many eighths in its own block of axes as its norm needs (``s`` in eighths)."""
    b, m = s.shape
    images = np.zeros((b, b + 64 * m))
    images[:, :b] = np.eye(b)
    captions = np.zeros((m, b + 64 * m))
    captions[:, :b] = s.T
    for j in range(m):
        rest = 64 * (1 - (s[:, j] ** 2).sum())  # 1 - |s_j|^2 in 64ths: whole eighths squared
        assert rest == round(rest) and rest >= 0
        captions[j, b + 64 * j: b + 64 * j + int(rest)] = 0.125
    assert ((images * images).sum(1) == 1).all() and ((captions * captions).sum(1) == 1).all()
    assert (images @ captions.T == s).all()
    return images, captions


def _engine(images, captions, loss, eps, sweep, batch_size, **params):
    """``{(mode, eps, direction): {stat: value}}`` of the engine's one batch, at its own eps and the sweep's (eps
    ``None`` for a counter without one)."""
    from cocos.counting.engine import EmbeddingSet, count_embeddings
    from cocos.data.samplers import pair_batches, ranking_batches

    # the set in the order whose seeded batch (seed 0) is ``images``, ``captions`` as given: the engine then scores
    # the rows count_batch scores, in the same order (a permuted row sums its softmax in another order: an ulp)
    b, k = len(images), len(captions) // len(images)
    if k == 1:
        order = pair_batches(np.arange(b), batch_size, 0)[0][0]
        cap_order = order
    else:
        order = ranking_batches(b, batch_size, 0)[0]
        cap_order = (order[:, None] * k + np.arange(k)).reshape(-1)
    stored_images, stored_captions = np.empty_like(images), np.empty_like(captions)
    stored_images[order], stored_captions[cap_order] = images, captions
    emb = EmbeddingSet.from_arrays(stored_images, stored_captions)
    name = loss if isinstance(loss, str) else getattr(loss, "name", None) or loss.__name__
    run = count_embeddings(emb, [loss], batch_size=batch_size, modes=list(MODES), eps=eps, sweep_eps=sweep,
                           params={name: params} if params else None, keep_per_query=False)
    frame = run.to_frame()
    assert set(frame["batch"]) == {0}  # the whole set is one batch (the engine permutes its rows)
    out: dict = {}
    for row in frame.itertuples():
        out.setdefault((row.mode, None if math.isnan(row.eps) else row.eps, row.direction), {})[row.stat] = row.value
    return out


def _check_engine(images, captions, loss, ties, batch_size, stats, **params):
    """The engine at each tie, as its own threshold and in the sweep, equals count_batch there (both modes,
    both directions). ``ties`` empty: a counter without a threshold (its ties are in the scores)."""
    runs = [_engine(images, captions, loss, ties[0] if ties else None, ties[1:] or None, batch_size, **params)]
    if ties:  # every tie in the sweep too, at another threshold of its own
        runs.append(_engine(images, captions, loss, 0.5 if 0.5 not in ties else 0.125, ties, batch_size, **params))
    for eps in ties or [None]:
        for mode in MODES:
            want = count_batch(images, captions, loss, compat=mode == "compat", eps=eps, **params)
            for d in ("i2t", "t2i"):
                for run in runs:
                    got = run[(mode, eps, d)]
                    for stat in stats:
                        assert got[stat] == pytest.approx(want[d][stat], rel=1e-12, abs=1e-15, nan_ok=True), (
                            loss, eps, mode, d, stat)


def _strict_and_loose(w: torch.Tensor, eps: float, dims=(-1,)) -> tuple[torch.Tensor, torch.Tensor]:
    return (w > eps).sum(dims), (w >= eps).sum(dims)


def test_triplet_ties_on_the_margin_are_not_violations():
    images, captions = _dyadic(S_TIE)
    s = S_TIE
    for direction, rows in (("i2t", s), ("t2i", s.T)):
        hinge = MARGIN + rows - np.diag(rows)[:, None]  # exact: eighths
        off = ~np.eye(6, dtype=bool)
        strict, loose = ((hinge > 0) & off).sum(1), ((hinge >= 0) & off).sum(1)
        hardest = np.where(off, hinge, -np.inf).max(1)
        if direction == "i2t":
            assert strict.tolist() == [2, 0, 1, 1, 0, 0] and loose.tolist() == [3, 2, 2, 1, 1, 1]
        assert (strict != loose).any() and ((hardest > 0) != (hardest >= 0)).any()
        for compat in (False, True):
            out = count_batch(images, captions, "triplet", margin=MARGIN, compat=compat)[direction]
            assert out["C_B"] == strict.sum()
            if not (compat and direction == "t2i"):  # compat t2i regroups by negative image (C_B unchanged)
                assert out["C_0"] == (strict == 0).sum() and out["C_q"] == strict.sum() / (strict > 0).sum()
            sh = count_batch(images, captions, "triplet_sh", margin=MARGIN, compat=compat)[direction]
            assert sh["C_B"] == (hardest > 0).sum() and sh["C_0"] == (hardest <= 0).sum()
            imc = count_batch(images, captions, "imc", margin=MARGIN, compat=compat)[direction]
            assert imc["C_B"] == sh["C_B"] and imc["C_0"] == sh["C_0"]
    for loss in ("triplet", "triplet_sh", "imc"):
        _check_engine(images, captions, loss, [], 6, ("C_q", "C_B", "C_0"),
                      margin=MARGIN)


def test_imc_band_is_open_at_both_ends():
    """IMC's in-band intra-modal pairs: ``mu_down < 1 - s < mu_up`` strictly, with both ends at a caption pair."""
    images, captions = _dyadic(S_TIE)
    delta = 1 - captions @ captions.T  # exact: eighths of eighths
    off = ~np.eye(6, dtype=bool)
    values = np.unique(delta[off])
    lo, hi = float(values[1]), float(values[-2])  # ties at both ends, pairs outside too
    strict = (off & (delta > lo) & (delta < hi)).sum(1)
    assert (strict != (off & (delta >= lo) & (delta <= hi)).sum(1)).any()
    params = {"margin": MARGIN, "mu_down": lo, "mu_up": hi}
    per_query = count_queries(images, captions, "imc", **params)["t2i"].per_query["C_intra"]
    assert per_query.tolist() == strict.tolist()
    _check_engine(images, captions, "imc", [], 6, ("C_intra", "C_q", "C_B", "C_0"), **params)


def test_ntxent_weights_at_eps_are_neither_counted_nor_low():
    images, captions = _dyadic(S_TIE)
    tau = 0.25
    counts = count_queries(images, captions, "ntxent", tau=tau)
    p = counts["i2t"].weights  # p(q, n) on the negatives, 0 elsewhere
    neg = ~torch.eye(6, dtype=torch.bool)
    ties = sorted({float(p[q].max()) for q in (0, 1, 4)} | {float(p[2, 3])})  # row 1: two negatives at its max
    for eps in ties:
        above, loose = _strict_and_loose(torch.where(neg, p, -1.0), eps)
        assert (above != loose).any()
        out = count_batch(images, captions, "ntxent", tau=tau, eps=eps)["i2t"]
        assert out["C_qv-"] == pytest.approx(float(above.double().mean()), abs=1e-15)
        assert out["W_qv-"] == pytest.approx(float(torch.where(neg & (p > eps), p, 0).sum(-1).mean()), rel=1e-14)
        assert out["W_low"] == pytest.approx(float(torch.where(neg & (p < eps), p, 0).sum(-1).mean()), rel=1e-14)
        # the tied weight is in neither sum: W_qv- + W_low falls short of W_qv+ by exactly it
        tied = float(torch.where(neg & (p == eps), p, 0).sum(-1).mean())
        assert tied > 0 and out["W_qv-"] + out["W_low"] + tied == pytest.approx(out["W_qv+"], rel=1e-12)
    _check_engine(images, captions, "ntxent", ties, 6, ("C_qv-", "W_qv-", "W_low", "W_qv+"), tau=tau)


def test_smoothap_pair_weights_at_eps_are_not_counted():
    from cocos.data.layout import batch_similarity
    from cocos.losses.smoothap import SmoothAPCounter

    images, captions = _dyadic(S_RANK)
    tau = 0.25
    scores, layout = batch_similarity(images, captions)
    w, divisor = SmoothAPCounter(tau=tau).pair_weights(layout.view(scores, "i2t"))  # (Q, A, K)
    ties = sorted({float(w[0, 0].max()), float(w[1, 1, 5]), float(w[3].amax())})
    for eps in ties:
        above, loose = _strict_and_loose(w, eps, (-1, -2))
        assert (above != loose).any()
        c_q = above.double() / divisor
        out = count_batch(images, captions, "smoothap", tau=tau, eps=eps)["i2t"]
        assert out["C_B"] == pytest.approx(float(c_q.sum()), abs=1e-15) and out["C_0"] == (c_q == 0).sum()
    _check_engine(images, captions, "smoothap", ties, 4, ("C_q", "C_B", "C_0"), tau=tau)


def test_goal_designed_weights_at_eps_are_not_counted():
    from cocos.data.layout import batch_similarity
    from cocos.losses.goal import GoalCounter

    images, captions = _dyadic(S_TIE)
    params = {"margin": MARGIN, "triplet_weight": "nca", "pair_weight": "lin"}
    scores, layout = batch_similarity(images, captions)
    weight = GoalCounter(**params)._weights(layout.view(scores, "i2t"))[-1][..., 0]  # (Q,): the hardest's T·P-
    ties = sorted({float(weight[q]) for q in (0, 2)})
    for eps in ties:
        above, loose = (weight > eps), (weight >= eps)
        assert (above != loose).any()
        out = count_batch(images, captions, "goal", eps=eps, **params)["i2t"]
        assert out["C_B"] == above.sum() and out["C_0"] == (~above).sum()
    _check_engine(images, captions, "goal", ties, 6, ("C_q", "C_B", "C_0"), **params)


def _half_squared_hinge(view, margin=MARGIN):
    """A family without a closed-form counter: ``dL/dS[q, n]`` on a negative is its hinge ``relu(h)``, exact."""
    from cocos.losses.functional import triplet_hinge

    return 0.5 * (torch.relu(triplet_hinge(view, margin)) ** 2).sum()


def test_generic_gradients_at_the_relative_threshold_are_not_counted():
    from cocos.objectives import Objective

    spec = Objective(name="half_sq_hinge_tie", label="half squared hinge", direction_loss=_half_squared_hinge,
                     defaults={"margin": MARGIN})
    images, captions = _dyadic(S_TIE)
    g = count_queries(images, captions, spec)["i2t"].weights  # |dL/dS| on the negatives: the hinges, exact
    hinge = np.maximum(MARGIN + S_TIE - np.diag(S_TIE)[:, None], 0) * ~np.eye(6, dtype=bool)
    assert (g.numpy() == hinge).all()
    ties = [0.5, 1.0]  # eps * max is exact: row 0's hinge 1/8 is half its largest; at 1 every largest one ties
    top = g.amax(-1, keepdim=True)
    for eps in ties:
        above, loose = ((g > eps * top) & (g > 0)).sum(-1), ((g >= eps * top) & (g > 0)).sum(-1)
        assert (above != loose).any()
        out = count_batch(images, captions, spec, eps=eps)["i2t"]
        assert out["C_B"] == above.sum() and out["C_0"] == (above == 0).sum()
    assert above.sum() == 0  # eps = 1: nothing passes
    _check_engine(images, captions, spec, ties, 6, ("C_q", "C_B", "C_0"))


def _whole_batch_tie(images, captions, caption_image=None):
    s = torch.nn.functional.normalize(images, dim=-1) @ torch.nn.functional.normalize(captions, dim=-1).T
    return torch.logsumexp(s / 0.5, dim=-1).sum()


def test_whole_batch_callable_at_relative_eps_one_counts_nothing():
    """eps = 1 relative: every query's largest gradient sits exactly on the threshold (1 * max == max)."""
    images, captions = _dyadic(S_TIE)
    for d, out in count_batch(images, captions, _whole_batch_tie, eps=1.0).items():
        assert out["C_B"] == 0 and out["C_0"] == 6 and math.isnan(out["C_q"]), d
    assert count_batch(images, captions, _whole_batch_tie, eps=0.5)["i2t"]["C_B"] > 0
    _check_engine(images, captions, _whole_batch_tie, [1.0], 6, ("C_q", "C_B", "C_0"))


@pytest.mark.parametrize("negative", [False, True])
def test_threshold_helpers_are_strict_on_ties(negative):
    """The engine's thresholding helpers (``cocos.losses.counts``) equal their definitions where entries sit exactly
    on a threshold: ``counts_above`` and ``counts_above_summed`` count ``w > e``; ``thresholded_sums_stacked`` gives
    ``(mask & (p > e)).sum``, the sum of those entries and the sum of the masked entries ``< e``, bit for bit.
    Forty rows, only two with masked entries above the top threshold (the helper then sums those rows alone),
    rows whose largest or smallest masked entry is the threshold; ``negative`` adds a threshold below 0 (the
    helper's general path)."""
    from cocos.losses.counts import counts_above, counts_above_summed, thresholded_sums_stacked

    g = np.random.default_rng(11)
    p = torch.as_tensor(g.integers(1, 16, size=(40, 8)) / 32.0)  # eighths of a quarter: many exact ties
    mask = torch.as_tensor(g.random((40, 8)) < 0.8)
    mask[:, 0] = True
    p[:, 0] = 0.5  # every row's largest masked entry is 1/2 ...
    p[:2, 1], mask[:2, 1] = 0.75, True  # ... but two rows', which have entries above it
    p[2, :], mask[2, :] = 0.5, True  # a row of ties at 1/2: its smallest and largest masked entry
    p[3, :] = torch.where(mask[3], torch.maximum(p[3], torch.tensor(0.25)), p[3])  # a row whose smallest is 1/4
    thresholds = [0.5, 0.25, 0.125, 0.0] + ([-1.0] if negative else [])
    count, above, below = thresholded_sums_stacked(p, mask, thresholds)
    for j, e in enumerate(thresholds):
        hit, low = mask & (p > e), mask & (p < e)
        assert torch.equal(count[j], hit.sum(-1)), e
        assert torch.equal(above[j], torch.where(hit, p, 0.0).sum(-1)), e
        assert torch.equal(below[j], torch.where(low, p, 0.0).sum(-1)), e
    assert not torch.equal(count[0], (mask & (p >= 0.5)).sum(-1))  # the ties matter
    w = torch.where(mask, p, 0.0).reshape(5, 8, 8)  # (..., A, K) for the summed form
    for got in (counts_above(w, thresholds), counts_above_summed(w, w.sum(-2), thresholds)):
        for j, e in enumerate(thresholds):
            want = (w > e).sum(-1) if got[j].shape == w.shape[:-1] else (w > e).sum((-1, -2))
            assert torch.equal(got[j], want), e
