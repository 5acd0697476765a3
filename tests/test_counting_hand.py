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
