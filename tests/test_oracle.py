"""The counting engine against an independent oracle (``tests/oracle.py``), plus hand-worked weights.

Property tests draw random pair batches (``B = M``, caption ``j`` of image row ``j``,
dataset image ids with duplicates, so same-image pairs occur) and ranking batches
(``B`` images with ``k`` captions each), every loss, both modes and both directions,
and compare ``count_batch`` with the oracle statistic by statistic.

Two kinds of similarity matrices are drawn:

* *continuous*: entries uniform in ``[-0.4, 0.4]``; batches that come within 1e-9 of
  a threshold (a hinge at 0, a weight at ``eps``) are skipped, since the engine sees
  ``S`` only up to the rounding of the normalisation.
* *grid*: entries and margin are multiples of 1/8 and the embeddings realise ``S``
  exactly (see :func:`embed_exact`), so hinges that are exactly 0 occur often and
  must not count (the violation is strict).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from cocos.counting import count_batch
from cocos.data.layout import batch_similarity
from cocos.losses.ntxent import NTXentCounter
from cocos.losses.smoothap import SmoothAPCounter
from tests import oracle
from tests.helpers import embed_similarities

GAP = 1e-9  # skip batches that come this close to a threshold (absolute for hinges, relative for weights)
TOL = 1e-9


def four_squares(n: int) -> tuple[int, int, int, int]:
    """``(a, b, c, d)`` with ``a^2 + b^2 + c^2 + d^2 == n`` (Lagrange; brute force for small n)."""
    r = math.isqrt(n)
    for a in range(r + 1):
        for b in range(a + 1):
            for c in range(b + 1):
                d2 = n - a * a - b * b - c * c
                if d2 >= 0 and math.isqrt(d2) ** 2 == d2:
                    return a, b, c, math.isqrt(d2)
    raise AssertionError(n)


def embed_exact(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Embeddings with ``images @ captions.T == s`` *exactly* after normalisation, for ``s`` in multiples of 1/8.

    Images are one-hot; caption ``j`` is ``s[:, j]`` padded with four coordinates
    (multiples of 1/8, from a four-square decomposition of ``64 (1 - |s_j|^2)``) so
    that its squared norm is exactly 1 in floating point.
    """
    s = np.asarray(s, dtype=np.float64)
    b, m = s.shape
    assert np.array_equal(s * 8, np.round(s * 8)), "entries must be multiples of 1/8"
    images = np.zeros((b, b + 4 * m))
    images[:, :b] = np.eye(b)
    captions = np.zeros((m, b + 4 * m))
    captions[:, :b] = s.T
    for j in range(m):
        rest = 64 - int(round(64 * (s[:, j] ** 2).sum()))
        assert rest >= 0, "every column of s needs norm <= 1"
        captions[j, b + 4 * j:b + 4 * j + 4] = np.array(four_squares(rest)) / 8.0
    return images, captions


def assert_stats_equal(got: dict, want: dict, context: str = "") -> None:
    for direction, stats in want.items():
        for stat, value in stats.items():
            assert stat in got[direction], f"{direction} {stat} missing {context}"
            g = got[direction][stat]
            if math.isnan(value):
                assert math.isnan(g), f"{direction} {stat}: engine {g}, oracle NaN {context}"
            else:
                assert not math.isnan(g) and abs(g - value) <= TOL * max(1.0, abs(value)), (
                    f"{direction} {stat}: engine {g}, oracle {value} {context}")


# ----------------------------------------------------------------------------- strategies

@st.composite
def batches(draw, loss: str):
    """A random batch and loss parameters: ``dict`` with S, caption_image, image_ids, params, grid, ..."""
    # irregular: images with different numbers of captions (padded positives); SmoothAP needs k equal per image
    layout = draw(st.sampled_from(["pair", "pair", "ranking"] + (["irregular"] if loss != "smoothap" else [])))
    grid = draw(st.booleans())
    if layout == "irregular":
        ks = draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
        b, k, m = len(ks), max(ks), sum(ks)
        caption_image = np.repeat(np.arange(b), ks)
        image_ids = None
    elif layout == "pair":
        b = draw(st.integers(1, 6))
        k = 1
        m = b
        caption_image = np.arange(b)
        if draw(st.integers(0, 3)) == 0:
            image_ids = None
        else:  # ids from a random small range: duplicates (same-image pairs) are common
            top = draw(st.integers(0, b - 1))
            image_ids = draw(st.lists(st.integers(0, top), min_size=b, max_size=b))
    else:
        b = draw(st.integers(1, 5))
        k = draw(st.integers(1, 4))
        m = k * b
        caption_image = np.arange(m) // k
        image_ids = None
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if grid:
        s = rng.integers(-3, 4, size=(b, m)) / 8.0
        margin = draw(st.integers(0, 4)) / 8.0
    else:
        s = rng.uniform(-0.4, 0.4, size=(b, m))
        margin = draw(st.floats(0.0, 0.5))
    if loss == "ntxent":
        tau = draw(st.floats(0.02, 1.0))
    elif loss == "smoothap":
        tau = draw(st.floats(0.005, 0.1))
    else:
        tau = None
    eps = draw(st.floats(1e-4, 0.2))
    compat = draw(st.booleans())
    default_layout = layout == "ranking" and draw(st.booleans())  # let count_batch infer c // k
    return {
        "S": s, "caption_image": caption_image, "image_ids": image_ids, "grid": grid,
        "compat": compat, "margin": margin, "tau": tau, "eps": eps, "k": k,
        "pass_caption_image": not default_layout,
    }


def loss_params(loss: str, margin=None, tau=None, eps=None) -> dict:
    """Only the parameters the loss takes (margin for the triplet losses, tau and eps otherwise)."""
    if loss in ("triplet", "triplet_sh"):
        return {"margin": margin}
    return {"tau": tau, "eps": eps}


def run_both(loss: str, batch: dict):
    s = batch["S"]
    params = loss_params(loss, batch["margin"], batch["tau"], batch["eps"])
    gap = oracle.threshold_gap(s, batch["caption_image"], loss, batch["image_ids"], batch["compat"], **params)
    exact_triplet = batch["grid"] and loss in ("triplet", "triplet_sh")
    if not exact_triplet:  # exact dyadic hinges need no margin from 0: both sides compute them exactly
        assume(gap > GAP)
    if batch["grid"]:
        images, captions = embed_exact(s)
        scores, _ = batch_similarity(images, captions, batch["caption_image"])
        assert np.array_equal(scores.numpy(), s), "embed_exact must reproduce S exactly"
    else:
        images, captions = embed_similarities(s)
    got = count_batch(
        images, captions, loss, compat=batch["compat"],
        caption_image=batch["caption_image"] if batch["pass_caption_image"] else None,
        image_ids=batch["image_ids"], **params,
    )
    want = oracle.batch_stats(s, batch["caption_image"], loss, batch["image_ids"], batch["compat"], **params)
    return got, want


EXAMPLES = 200


@pytest.mark.parametrize("loss", oracle.LOSSES)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_engine_matches_oracle(loss, data):
    batch = data.draw(batches(loss))
    got, want = run_both(loss, batch)
    # shown by --hypothesis-show-statistics: how often the interesting cases occur
    event(f"k={batch['k']} compat={batch['compat']}")
    if batch["image_ids"] is not None and len(set(batch["image_ids"])) < len(batch["image_ids"]):
        event(f"same-image pairs ({'negatives, compat' if batch['compat'] else 'excluded'})")
    if any(math.isnan(v["C_q"]) for v in want.values() if "C_q" in v):
        event("a direction without C_q (NaN)")
    if any(v.get("C_B", v.get("C_qv-", 0)) > 0 for v in want.values()):
        event("some count > 0")
    if loss in ("triplet", "triplet_sh") and batch["grid"] and oracle.threshold_gap(
            batch["S"], batch["caption_image"], loss, batch["image_ids"], batch["compat"], margin=batch["margin"]) == 0:
        event("a hinge exactly 0")
    assert_stats_equal(got, want, context=f"(compat={batch['compat']}, k={batch['k']}, grid={batch['grid']})")


# ----------------------------------------------------------------------------- the oracle itself, by hand

def test_oracle_triplet_by_hand():
    # pair batch B = 3, margin 0.2 (the same matrix as tests/test_counting_hand.py, worked again):
    s = np.array([[0.60, 0.50, 0.10], [0.30, 0.40, 0.35], [0.10, 0.29, 0.50]])
    out = oracle.batch_stats(s, [0, 1, 2], "triplet")
    # i2t per query [1, 2, 0], t2i per query [0, 2, 1]
    assert out["i2t"] == {"C_q": 1.5, "C_B": 3.0, "C_0": 1.0, "n_excluded": 0.0}
    assert out["t2i"] == {"C_q": 1.5, "C_B": 3.0, "C_0": 1.0, "n_excluded": 0.0}
    # compat t2i by negative image: [1, 1, 1]
    assert oracle.batch_stats(s, [0, 1, 2], "triplet", compat=True)["t2i"]["C_0"] == 0.0
    # SH: i2t [1, 1, 0]
    assert oracle.batch_stats(s, [0, 1, 2], "triplet_sh")["i2t"]["C_B"] == 2.0


# ----------------------------------------------------------------------------- exact zero hinge

# Pair batch B = 2 with a hinge that is exactly 0 in float64 (margin 0.25, s_p = 0.5, s_n = 0.25):
#   i2t  image 0: 0.25 + 0.25 - 0.5 = 0     (not a violation: strict)
#        image 1: 0.25 + 0.0  - 0.5 = -0.25
#   t2i  caption 0: 0.25 + 0.0  - 0.5 = -0.25
#        caption 1: 0.25 + 0.25 - 0.5 = 0   (not a violation)
S_ZERO = np.array([[0.5, 0.25],
                   [0.0, 0.5]])


@pytest.mark.parametrize("loss", ["triplet", "triplet_sh"])
@pytest.mark.parametrize("compat", [False, True])
def test_hinge_exactly_zero_is_not_a_violation(loss, compat):
    images, captions = embed_exact(S_ZERO)
    scores, _ = batch_similarity(images, captions)
    assert np.array_equal(scores.numpy(), S_ZERO)
    out = count_batch(images, captions, loss, compat=compat, margin=0.25)
    for d in ("i2t", "t2i"):
        assert out[d]["C_B"] == 0 and out[d]["C_0"] == 2 and math.isnan(out[d]["C_q"]), (d, out[d])
    assert_stats_equal(out, oracle.batch_stats(S_ZERO, [0, 1], loss, compat=compat, margin=0.25))
    # a larger margin (0.375, exact) makes both zero hinges positive: 0.125 each
    out = count_batch(images, captions, loss, compat=compat, margin=0.375)
    assert out["i2t"]["C_B"] == 1 and out["t2i"]["C_B"] == 1


# ----------------------------------------------------------------------------- SmoothAP weights by hand

# Ranking batch: 2 images x k=2 captions (captions 0, 1 -> image 0; 2, 3 -> image 1), tau = 0.1.
S_AP = np.array([
    #  c0    c1    c2     c3
    [0.30, 0.10, 0.20, -0.10],  # image 0
    [0.00, 0.25, 0.35, 0.15],  # image 1
])
TAU_AP = 0.1


def g_of(x: float) -> tuple[float, float]:
    """``G = sigmoid(x)`` and ``1 - G = sigmoid(-x)``, written out with math.exp."""
    return 1.0 / (1.0 + math.exp(-x)), 1.0 / (1.0 + math.exp(x))


def weights_from_exponents(xs: list) -> list:
    """``w(a, b) = G (1 - G) / R^2``, ``R = 1 + sum_b G``; ``xs[b]`` is ``(s_b - s_a) / tau`` or None for ``b = a``."""
    gs = [None if x is None else g_of(x) for x in xs]
    rank = 1.0 + sum(g for g, _ in (v for v in gs if v is not None))
    return [0.0 if v is None else v[0] * v[1] / rank ** 2 for v in gs]


def test_smoothap_pair_weights_by_hand():
    images, captions = embed_similarities(S_AP)
    scores, layout = batch_similarity(images, captions)
    counter = SmoothAPCounter(tau=TAU_AP, eps=0.01)

    # i2t: x = (s_b - s_a) / 0.1 for each positive anchor a, in candidate order.
    # image 0, anchor c0 (0.30): c1 (0.10-0.30)/0.1 = -2, c2 -1, c3 -4
    # image 0, anchor c1 (0.10): c0 +2, c2 +1, c3 -2
    # image 1, anchor c2 (0.35): c0 -3.5, c1 -1, c3 -2
    # image 1, anchor c3 (0.15): c0 -1.5, c1 +1, c2 +2
    expected = np.array([
        [weights_from_exponents([None, -2.0, -1.0, -4.0]),
         weights_from_exponents([2.0, None, 1.0, -2.0])],
        [weights_from_exponents([-3.5, -1.0, None, -2.0]),
         weights_from_exponents([-1.5, 1.0, 2.0, None])],
    ])
    w, divisor = counter.pair_weights(layout.view(scores, "i2t", compat=False))
    assert tuple(w.shape) == (2, 2, 4)
    np.testing.assert_allclose(w.numpy(), expected, rtol=0, atol=1e-12)
    assert divisor.tolist() == [2, 2]
    # spot check of one entry with the numbers spelled out: image 0, anchor c0, b = c2 (x = -1)
    g = [1 / (1 + math.exp(2.0)), 1 / (1 + math.exp(1.0)), 1 / (1 + math.exp(4.0))]  # b = c1, c2, c3
    r = 1 + sum(g)
    assert w[0, 0, 2].item() == pytest.approx(g[1] * (1 - g[1]) / (r * r), rel=1e-12, abs=0)

    # t2i: caption query, one anchor (its image), one other candidate: R = 1 + G.
    # c0: anchor image 0 (0.30), image 1 (0.00): x = -3     c1: anchor image 0 (0.10), image 1 (0.25): x = 1.5
    # c2: anchor image 1 (0.35), image 0 (0.20): x = -1.5   c3: anchor image 1 (0.15), image 0 (-0.10): x = -2.5
    expected_t2i = np.array([
        [[0.0] + weights_from_exponents([None, -3.0])[1:]],
        [[0.0] + weights_from_exponents([None, 1.5])[1:]],
        [weights_from_exponents([-1.5, None])],
        [weights_from_exponents([-2.5, None])],
    ])
    w, divisor = counter.pair_weights(layout.view(scores, "t2i", compat=False))
    assert tuple(w.shape) == (4, 1, 2)
    np.testing.assert_allclose(w.numpy(), expected_t2i, rtol=0, atol=1e-12)
    assert divisor.tolist() == [1, 1, 1, 1]
    g, one_minus_g = g_of(1.5)
    assert w[1, 0, 1].item() == pytest.approx(g * one_minus_g / (1 + g) ** 2, rel=1e-12, abs=0)

    # compat t2i (published counter): caption q uses image rows 2q, 2q+1 (those < 2), divided by 1.
    # q = 0: rows 0 and 1 of column c0 (0.30, 0.00): anchor 0 x = -3, anchor 1 x = +3; q >= 1: nothing.
    w, divisor = counter.pair_weights(layout.view(scores, "t2i", compat=True))
    assert tuple(w.shape) == (4, 2, 2)
    np.testing.assert_allclose(w[0].numpy(), [weights_from_exponents([None, -3.0]),
                                              weights_from_exponents([3.0, None])], rtol=0, atol=1e-12)
    assert float(w[1:].abs().sum()) == 0.0
    assert divisor.tolist() == [1, 1, 1, 1]

    # the oracle gives the same rows
    rows = oracle.smoothap_weights(S_AP, [0, 0, 1, 1], tau=TAU_AP, direction="i2t")
    np.testing.assert_allclose(np.array([r for r, _ in rows]), expected, rtol=0, atol=1e-15)
    rows = oracle.smoothap_weights(S_AP, [0, 0, 1, 1], compat=True, tau=TAU_AP, direction="t2i")
    assert [len(r) for r, _ in rows] == [2, 0, 0, 0] and [d for _, d in rows] == [1, 1, 1, 1]


def test_smoothap_counts_by_hand():
    # The i2t weights above, rounded (rows = anchors, columns = c0..c3):
    #   image 0, anchor c0: 0, 0.0531, 0.0994, 0.0089    anchor c1: 0.0141, 0, 0.0264, 0.0141
    #   image 1, anchor c2: 0.0142, 0.0979, 0, 0.0523    anchor c3: 0.0191, 0.0252, 0.0134, 0
    # eps = 0.05: image 0 has 2 + 0 weights above -> C^q = 2 / |P| = 1; image 1: 2 + 0 -> 1.
    # So C^B = 2, C^0 = 0, C^q = 1.
    images, captions = embed_similarities(S_AP)
    out = count_batch(images, captions, "smoothap", tau=TAU_AP, eps=0.05)["i2t"]
    assert (out["C_B"], out["C_0"], out["C_q"]) == (2.0, 0.0, 1.0)
    assert oracle.batch_stats(S_AP, [0, 0, 1, 1], "smoothap", tau=TAU_AP, eps=0.05)["i2t"]["C_B"] == 2.0
    # eps = 0.02 adds c2 (0.0264) for anchor c1, and c1 (0.0252) for anchor c3:
    # image 0: (2 + 1) / 2 = 1.5, image 1: (2 + 1) / 2 = 1.5
    out = count_batch(images, captions, "smoothap", tau=TAU_AP, eps=0.02)["i2t"]
    assert (out["C_B"], out["C_0"], out["C_q"]) == (3.0, 0.0, 1.5)


# ----------------------------------------------------------------------------- NT-Xent probabilities by hand

# Pair batch B = 3, image rows 0 and 2 hold the same dataset image (id 7), tau = 0.5.
S_NT = np.array([
    #  c0    c1     c2
    [0.30, 0.10, 0.20],   # image row 0 (id 7)
    [0.00, 0.40, -0.10],  # image row 1 (id 3)
    [0.25, 0.05, 0.35],   # image row 2 (id 7)
])
IDS_NT = [7, 3, 7]
TAU_NT = 0.5


def softmax_by_hand(exponents: dict, n: int) -> list:
    """``exp(x_v) / sum exp(x)`` over the listed candidates ``{v: s_v / tau}``; 0 for the others."""
    e = {v: math.exp(x) for v, x in exponents.items()}
    total = sum(e.values())
    return [e[v] / total if v in e else 0.0 for v in range(n)]


def test_ntxent_probabilities_by_hand():
    images, captions = embed_similarities(S_NT)
    scores, layout = batch_similarity(images, captions, [0, 1, 2], IDS_NT)
    counter = NTXentCounter(tau=TAU_NT, eps=0.01)

    # corrected: a same-image pair leaves the softmax (probability 0, the rest renormalised).
    # i2t, s / tau:  row 0: c0 0.6, c1 0.2, (c2 is image row 2 = same image: excluded)
    #                row 1: c0 0.0, c1 0.8, c2 -0.2
    #                row 2: (c0 excluded), c1 0.1, c2 0.7
    i2t = [softmax_by_hand({0: 0.6, 1: 0.2}, 3),
           softmax_by_hand({0: 0.0, 1: 0.8, 2: -0.2}, 3),
           softmax_by_hand({1: 0.1, 2: 0.7}, 3)]
    p = counter.probabilities(layout.view(scores, "i2t", compat=False))
    np.testing.assert_allclose(p.numpy(), i2t, rtol=0, atol=1e-12)
    assert p[0, 2].item() == 0.0 and p[2, 0].item() == 0.0
    assert p[0, 0].item() == pytest.approx(math.exp(0.6) / (math.exp(0.6) + math.exp(0.2)), rel=1e-12)
    # t2i, columns:  caption 0: img0 0.6, img1 0.0, (img2 excluded)
    #                caption 1: img0 0.2, img1 0.8, img2 0.1
    #                caption 2: (img0 excluded), img1 -0.2, img2 0.7
    t2i = [softmax_by_hand({0: 0.6, 1: 0.0}, 3),
           softmax_by_hand({0: 0.2, 1: 0.8, 2: 0.1}, 3),
           softmax_by_hand({1: -0.2, 2: 0.7}, 3)]
    p = counter.probabilities(layout.view(scores, "t2i", compat=False))
    np.testing.assert_allclose(p.numpy(), t2i, rtol=0, atol=1e-12)

    # compat: the same-image pairs are ordinary negatives and stay in the softmax
    i2t_compat = [softmax_by_hand({0: 0.6, 1: 0.2, 2: 0.4}, 3),
                  softmax_by_hand({0: 0.0, 1: 0.8, 2: -0.2}, 3),
                  softmax_by_hand({0: 0.5, 1: 0.1, 2: 0.7}, 3)]
    p = counter.probabilities(layout.view(scores, "i2t", compat=True))
    np.testing.assert_allclose(p.numpy(), i2t_compat, rtol=0, atol=1e-12)
    t2i_compat = [softmax_by_hand({0: 0.6, 1: 0.0, 2: 0.5}, 3),
                  softmax_by_hand({0: 0.2, 1: 0.8, 2: 0.1}, 3),
                  softmax_by_hand({0: 0.4, 1: -0.2, 2: 0.7}, 3)]
    p = counter.probabilities(layout.view(scores, "t2i", compat=True))
    np.testing.assert_allclose(p.numpy(), t2i_compat, rtol=0, atol=1e-12)

    # the batch statistics follow: W_qv+ = 1 - p(positive), means over all queries, n_excluded = 2
    for compat, probs in ((False, (i2t, t2i)), (True, (i2t_compat, t2i_compat))):
        out = count_batch(images, captions, "ntxent", compat=compat, caption_image=[0, 1, 2],
                          image_ids=IDS_NT, tau=TAU_NT, eps=0.01)
        for d, rows in zip(("i2t", "t2i"), probs, strict=True):
            assert out[d]["W_qv+"] == pytest.approx(np.mean([1 - rows[q][q] for q in range(3)]), rel=1e-12)
            assert out[d]["n_excluded"] == (0.0 if compat else 2.0)
        assert_stats_equal(out, oracle.batch_stats(S_NT, [0, 1, 2], "ntxent", IDS_NT, compat, tau=TAU_NT, eps=0.01))


def test_ntxent_probabilities_ranking_batch_by_hand():
    # 2 images x 2 captions, no same-image pairs: i2t rows are plain softmaxes over 4 captions.
    images, captions = embed_similarities(S_AP)
    scores, layout = batch_similarity(images, captions)
    p = NTXentCounter(tau=0.25, eps=0.01).probabilities(layout.view(scores, "i2t"))
    expected = [softmax_by_hand({0: 1.2, 1: 0.4, 2: 0.8, 3: -0.4}, 4),
                softmax_by_hand({0: 0.0, 1: 1.0, 2: 1.4, 3: 0.6}, 4)]
    np.testing.assert_allclose(p.numpy(), expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- SmoothAP compat aggregation

def test_smoothap_batch_without_gradient_compat_zero_corrected_nan():
    # tau large relative to the score gaps keeps every G near 1/2 and R large: all weights < eps = 0.2.
    images, captions = embed_similarities(S_AP)
    for compat, expect in ((False, math.nan), (True, 0.0)):
        out = count_batch(images, captions, "smoothap", compat=compat, tau=0.1, eps=0.2)
        want = oracle.batch_stats(S_AP, [0, 0, 1, 1], "smoothap", compat=compat, tau=0.1, eps=0.2)
        for d in ("i2t", "t2i"):
            assert want[d]["C_B"] == 0.0
            assert (math.isnan(out[d]["C_q"]) if math.isnan(expect) else out[d]["C_q"] == expect)
        assert_stats_equal(out, want)
