"""Each training loss against its definition: values from plain formulas, gradients in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cocos.data.layout import batch_similarity
from cocos.errors import CocosError
from cocos.objectives import get_loss
from tests.helpers import embed_similarities


def _rand(b, k, d, seed):
    g = np.random.default_rng(seed)
    images = g.normal(size=(b, d))
    return images, np.repeat(images, k, 0) + 0.8 * g.normal(size=(b * k, d))


def _plain_sims(images, captions):
    i = images / np.linalg.norm(images, axis=1, keepdims=True)
    c = captions / np.linalg.norm(captions, axis=1, keepdims=True)
    return i @ c.T


def plain_triplet(s, margin, hardest):
    """VSE++ ContrastiveLoss on a pair batch, written with Python loops."""
    b = s.shape[0]
    total = 0.0
    for q in range(b):
        for direction in ("i2t", "t2i"):
            row = s[q] if direction == "i2t" else s[:, q]
            hinges = [max(0.0, margin + row[n] - row[q]) for n in range(b) if n != q]
            total += max(hinges) if hardest else sum(hinges)
    return total


def plain_ntxent(s, tau):
    b = s.shape[0]
    out = []
    for m in (s, s.T):
        out.append(np.mean([-(m[q, q] / tau - math.log(sum(math.exp(v / tau) for v in m[q]))) for q in range(b)]))
    return (out[0] + out[1]) / 2


def plain_smoothap(s, k, tau):
    """Paper Eq. 8 with the sigmoid rank, the MEAN of both directions (as the published loss), scalar Python."""
    b, m = s.shape

    def sig(x):
        return 1 / (1 + math.exp(-max(-50, min(50, x / tau))))

    def ap(scores, positives):
        vals = []
        for a in positives:
            r_pos = 1 + sum(sig(scores[j] - scores[a]) for j in positives if j != a)
            r_all = 1 + sum(sig(scores[j] - scores[a]) for j in range(len(scores)) if j != a)
            vals.append(r_pos / r_all)
        return sum(vals) / len(vals)

    i2t = np.mean([1 - ap(s[i], list(range(k * i, k * i + k))) for i in range(b)])
    t2i = np.mean([1 - ap(s[:, c], [c // k]) for c in range(m)])
    return (i2t + t2i) / 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_values_match_plain_formulas(seed):
    images, captions = _rand(6, 1, 5, seed)
    s = _plain_sims(images, captions)
    it, ct = torch.tensor(images), torch.tensor(captions)
    assert get_loss("triplet")(it, ct).item() == pytest.approx(plain_triplet(s, 0.2, False))
    assert get_loss("triplet_sh")(it, ct).item() == pytest.approx(plain_triplet(s, 0.2, True))
    assert get_loss("ntxent", tau=0.1)(it, ct).item() == pytest.approx(plain_ntxent(s, 0.1))
    images, captions = _rand(4, 3, 5, seed)
    s = _plain_sims(images, captions)
    loss = get_loss("smoothap", tau=0.05)(torch.tensor(images), torch.tensor(captions))
    assert loss.item() == pytest.approx(plain_smoothap(s, 3, 0.05))


def test_triplet_gradient_on_the_similarity_matrix_by_hand():
    # S from test_counting_hand: i2t violations (0,1), (1,0), (1,2); t2i (caption 1: images 0, 2), (caption 2: image 1)
    s = np.array([[0.60, 0.50, 0.10], [0.30, 0.40, 0.35], [0.10, 0.29, 0.50]])
    scores = torch.tensor(s, requires_grad=True)
    _, layout = batch_similarity(*embed_similarities(s))
    loss = sum(get_loss("triplet").direction_loss(layout.view(scores, d)) for d in ("i2t", "t2i"))
    loss.backward()
    expected = np.array([
        # diagonal: -(i2t violations of the row) - (t2i violations of the column)
        [-1 - 0, 1 + 1, 0],
        [1, -2 - 2, 1 + 1],
        [0, 0 + 1, -0 - 1],
    ], dtype=float)
    np.testing.assert_array_equal(scores.grad.numpy(), expected)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 8), st.integers(0, 10_000), st.floats(0.05, 1.0))
def test_ntxent_gradient_is_softmax_minus_target(b, seed, tau):
    images, captions = _rand(b, 1, 4, seed)
    scores, layout = batch_similarity(images, captions)
    scores = scores.clone().requires_grad_(True)
    get_loss("ntxent", tau=tau).direction_loss(layout.view(scores, "i2t")).backward()
    p = torch.softmax(scores.detach() / tau, dim=1)
    expected = (p - torch.eye(b, dtype=p.dtype)) / (tau * b)
    torch.testing.assert_close(scores.grad, expected)


@settings(max_examples=10, deadline=None)
@given(st.integers(2, 4), st.integers(1, 3), st.integers(0, 10_000))
def test_smoothap_gradient_matches_finite_differences(b, k, seed):
    images, captions = _rand(b, k, 4, seed)
    s0 = _plain_sims(images, captions)
    scores, layout = batch_similarity(images, captions)
    scores = scores.clone().requires_grad_(True)
    fn = get_loss("smoothap", tau=0.1)
    fn.objective.combine_directions(*(fn.direction_loss(layout.view(scores, d)) for d in ("i2t", "t2i"))).backward()
    h = 1e-6
    for i in range(b):
        for j in range(b * k):
            plus, minus = s0.copy(), s0.copy()
            plus[i, j] += h
            minus[i, j] -= h
            numeric = (plain_smoothap(plus, k, 0.1) - plain_smoothap(minus, k, 0.1)) / (2 * h)
            assert scores.grad[i, j].item() == pytest.approx(numeric, abs=1e-5)


def test_smoothap_loss_is_the_mean_of_the_two_directions_as_published():
    """The published SmoothAP loss averages the directions (it matters with gradient clipping at 2)."""
    images, captions = _rand(4, 3, 5, 7)
    scores, layout = batch_similarity(images, captions)
    fn = get_loss("smoothap", tau=0.05)
    i2t, t2i = (fn.direction_loss(layout.view(scores, d)).item() for d in ("i2t", "t2i"))
    assert fn(torch.tensor(images), torch.tensor(captions)).item() == pytest.approx((i2t + t2i) / 2)
    assert fn(torch.tensor(images), torch.tensor(captions)).item() != pytest.approx(i2t + t2i)


def test_same_image_pairs_leave_the_loss_unless_compat():
    s = np.array([[0.60, 0.55, 0.10], [0.55, 0.60, 0.10], [0.10, 0.10, 0.60]])
    images, captions = (torch.tensor(a) for a in embed_similarities(s))
    ids = torch.tensor([7, 7, 9])
    # corrected: no negative violates (0.2 + 0.10 - 0.60 < 0); compat: the copy 0.55 does, 4 times
    assert get_loss("triplet")(images, captions, image_ids=ids).item() == 0
    compat = get_loss("triplet", compat=True)(images, captions, image_ids=ids).item()
    assert compat == pytest.approx(4 * (0.2 + 0.55 - 0.60))


def test_unknown_loss_and_parameter():
    with pytest.raises(CocosError, match="unknown loss 'hinge'"):
        get_loss("hinge")
    with pytest.raises(CocosError, match="takes no parameter tau"):
        get_loss("triplet", tau=0.1)
