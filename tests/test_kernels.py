"""Every kernel of cocos.losses.kernels equals, bit for bit (``torch.equal``), the plain formula it replaces.

Random inputs of awkward sizes (empty, one element, odd lengths, widths on and off the kernels' block sizes),
float32 and float64, without NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from cocos.data.layout import QueryView, positive_index
from cocos.losses import kernels
from cocos.losses.counts import companion_rows
from cocos.losses.functional import SIGMOID_CLAMP, smoothap_sigmoid

DTYPES = (torch.float32, torch.float64)
SHAPES = ((0, 5), (3, 0), (1, 1), (3, 1), (1, 7), (5, 13), (2, 3, 64), (4, 130), (7, 129))
EPS = (0.0, 0.001, 0.01, 0.3, 0.05)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _weights(shape, dtype, seed):
    """Non-negative weights spread over several decades, with exact zeros and values at a threshold."""
    g = _gen(seed)
    w = torch.rand(shape, generator=g, dtype=torch.float64).pow(4).to(dtype)
    w[torch.rand(shape, generator=g) < 0.3] = 0.0
    if w.numel():
        w.view(-1)[0] = torch.tensor(0.01, dtype=dtype)  # exactly at a threshold: not above it
    return w


def _masks(q, k, seed, positives=1):
    """``pos`` with ``positives`` per row where possible, ``neg`` the rest minus a few excluded pairs."""
    g = _gen(seed)
    order = torch.rand(q, k, generator=g).argsort(-1)
    pos = torch.zeros(q, k, dtype=torch.bool)
    pos.scatter_(-1, order[:, :min(positives, k)], True)
    neg = ~pos & (torch.rand(q, k, generator=g) > 0.1)
    return pos, neg


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_vectorised_is_the_sigmoid_of_a_tail_free_tensor(dtype):
    for n in (0, 1, 3, 63, 64, 65, 127, 1000):
        x = torch.randn(n, generator=_gen(n), dtype=dtype) * 8
        size = max(64, -(-n // 64) * 64)
        whole = torch.zeros(size, dtype=dtype)
        whole[:n] = x  # the plain sigmoid of a tensor without a scalar tail (size < GRAIN: one thread)
        assert torch.equal(kernels.sigmoid_vectorised(x), torch.sigmoid(whole)[:n]), n
        if n and n % 64 == 0:
            assert torch.equal(kernels.sigmoid_vectorised(x), torch.sigmoid(x)), n
        assert torch.equal(kernels.sigmoid_vectorised(x.reshape(1, n)), kernels.sigmoid_vectorised(x).reshape(1, n))


def test_vectorised_whole_by_hand():
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert kernels.vectorised_whole(64) and kernels.vectorised_whole(kernels.GRAIN * 3)
        assert not kernels.vectorised_whole(80) and not kernels.vectorised_whole(1)
        torch.set_num_threads(2)
        assert kernels.vectorised_whole(kernels.GRAIN + 128)  # two parts of GRAIN / 2 + 64
        assert not kernels.vectorised_whole(kernels.GRAIN + 64)  # parts of GRAIN / 2 + 32: a tail each
    finally:
        torch.set_num_threads(torch_threads)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fill_outside_is_where(dtype):
    inf = torch.tensor(float("-inf"), dtype=dtype)
    for shape in SHAPES:
        g = _gen(len(shape))
        x = torch.randn(shape, generator=g, dtype=dtype)
        mask = torch.rand(shape, generator=g) > 0.4
        rows = torch.rand(shape[:-1] + (1,), generator=g) > 0.2
        every = torch.ones(shape[:-1] + (1,), dtype=torch.bool)
        assert torch.equal(kernels.fill_outside(x.clone(), float("-inf"), mask), torch.where(mask, x, inf))
        assert torch.equal(kernels.fill_outside(x.clone(), float("-inf"), rows, mask), torch.where(rows & mask, x, inf))
        assert torch.equal(kernels.fill_outside(x.clone(), float("-inf"), every, mask), torch.where(mask, x, inf))
        assert torch.equal(kernels.fill_outside(x.clone(), 0.0, every), x)
        leaf = x.clone().requires_grad_(True)
        out = kernels.fill_outside(leaf * 1.0, 0.0, mask)
        out.sum().backward()
        assert torch.equal(out.detach(), torch.where(mask, x, 0.0)) and torch.equal(leaf.grad, mask.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positives", [1, 3])
def test_smoothap_pair_weights_equal_the_formula(dtype, positives):
    tau = 0.05
    for q, k in ((1, 4), (3, 5), (4, 16), (5, 13), (2, 64)):
        pos, neg = _masks(q, k, q * k + positives, positives)
        scores = torch.rand(q, k, generator=_gen(k), dtype=dtype) * 0.4
        view = QueryView(scores, pos, neg, "i2t", 1)
        anchors, valid = positive_index(pos)
        g, one_minus_g, _ = smoothap_sigmoid(view, tau, anchors, valid, complement=True)
        rank = 1.0 + g.sum(-1, keepdim=True)
        expected = g * one_minus_g / (rank * rank)
        got = kernels.smoothap_pair_weights(scores, anchors, valid, view.candidates, tau, SIGMOID_CLAMP)
        assert torch.equal(got, expected), (q, k)
        if expected.numel() % 64 == 0:  # tail-free: the vectorised sigmoids give the same bits
            assert torch.equal(kernels.smoothap_pair_weights(scores, anchors, valid, view.candidates, tau,
                                                             SIGMOID_CLAMP, vectorised=True), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_counts_above_are_one_comparison_per_threshold(dtype):
    for seed, shape in enumerate(SHAPES):
        w = _weights(shape, dtype, seed)
        for e, count in zip(EPS, kernels.counts_above(w, EPS), strict=True):
            assert count.dtype == torch.int64
            assert torch.equal(count, (w > e).sum(-1)), (shape, e)
    assert kernels.counts_above(torch.ones(3, 4), []) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_counts_above_summed_are_one_comparison_per_threshold(dtype):
    for seed, shape in enumerate(((1, 1, 1), (2, 3, 5), (4, 1, 64), (3, 5, 128), (2, 2, 0), (0, 3, 4), (3, 7, 65))):
        w = _weights(shape, dtype, seed)
        for e, count in zip(EPS, kernels.counts_above_summed(w, w.sum(-2), EPS), strict=True):
            assert torch.equal(count, (w > e).sum((-2, -1))), (shape, e)


@pytest.mark.parametrize("dtype", DTYPES)
def test_thresholded_sums_are_the_masked_sums_per_threshold(dtype):
    for seed, shape in enumerate(SHAPES):
        p = _weights(shape, dtype, seed)
        mask = torch.rand(shape, generator=_gen(seed + 100)) > 0.3
        count, above, below = kernels.thresholded_sums_stacked(p, mask, EPS)
        for j, e in enumerate(EPS):
            hi, lo = mask & (p > e), mask & (p < e)
            assert torch.equal(count[j], hi.sum(-1)), (shape, e)
            assert torch.equal(above[j], torch.where(hi, p, 0.0).sum(-1)), (shape, e)
            assert torch.equal(below[j], torch.where(lo, p, 0.0).sum(-1)), (shape, e)
        listed = kernels.thresholded_sums(p, mask, EPS)
        assert all(torch.equal(a, count[j]) and torch.equal(b, above[j]) and torch.equal(c, below[j])
                   for j, (a, b, c) in enumerate(listed))


def test_binary_companion_rows_equal_the_companions_of_the_counts():
    for seed, shape in enumerate(((0, 4), (1, 1), (3, 1), (5, 13), (2, 3, 64), (9, 7))):
        hits = torch.rand(shape, generator=_gen(seed)) > 0.6
        if hits.numel():
            hits.view(-1, shape[-1])[0] = False  # a query without weight: NaN
        expected = companion_rows(hits.to(torch.int64))
        assert torch.equal(kernels.binary_companion_rows(hits).isnan(), expected.isnan())
        assert torch.equal(kernels.binary_companion_rows(hits).nan_to_num(), expected.nan_to_num()), shape
        counts = hits.sum(-1, dtype=torch.int32)
        assert torch.equal(kernels.binary_companion_rows(hits, counts).nan_to_num(), expected.nan_to_num())


@dataclass(frozen=True)
class _MemoView(QueryView):
    memo: dict | None = field(default=None, compare=False, repr=False)
    stack: kernels.RowStack | None = field(default=None, compare=False, repr=False)


def test_per_view_computes_once_per_memo_and_equals_the_computation():
    scores = torch.randn(3, 4, generator=_gen(0))
    pos, neg = _masks(3, 4, 0)
    calls = []

    def make():
        calls.append(1)
        return scores.exp()

    plain = QueryView(scores, pos, neg, "i2t", 1)
    assert torch.equal(kernels.per_view(plain, ("exp",), make), scores.exp())
    assert torch.equal(kernels.per_view(plain, ("exp",), make), scores.exp()) and len(calls) == 2  # no memo
    shared = _MemoView(scores, pos, neg, "i2t", 1, memo={})
    first = kernels.per_view(shared, ("exp",), make)
    assert kernels.per_view(shared, ("exp",), make) is first and len(calls) == 3
    assert torch.equal(first, scores.exp())


def test_per_query_of_stacked_rows_equals_each_views_own_computation():
    """Two modes of one view differing in two rows: the stacked rows (the corrected ones, then the changed
    compat ones) computed once give each view exactly its own per-row values."""
    g = _gen(1)
    q, k = 5, 6
    scores = torch.randn(q, k, generator=g)
    pos, neg = _masks(q, k, 1)
    compat_neg = neg.clone()
    changed = torch.tensor([1, 3])
    compat_neg[changed] = ~pos[changed]  # the compat view's masks differ in rows 1 and 3
    rows = QueryView(torch.cat([scores, scores[changed]])[:, None], torch.cat([pos, pos[changed]])[:, None],
                     torch.cat([neg, compat_neg[changed]])[:, None], "i2t", 1)

    def compute(v):
        return {"n": (v.neg & (v.scores > 0)).sum(-1), "w": torch.where(v.neg, v.scores, 0.0)}

    memo = {}
    for compat, mask in ((False, neg), (True, compat_neg)):
        stack = kernels.RowStack(rows, q, changed)
        view = _MemoView(scores[None], pos[None], mask[None], "i2t", 1, compat, memo=memo, stack=stack)
        got = kernels.per_query(view, ("test",), compute)
        expected = compute(QueryView(scores[None], pos[None], mask[None], "i2t", 1, compat))
        assert all(torch.equal(got[name], expected[name]) for name in expected), compat


def test_positives_equal_positive_index():
    for positives in (1, 2):
        pos, neg = _masks(4, 7, positives, positives)
        view = _MemoView(torch.zeros(4, 7), pos, neg, "i2t", 1, memo={})
        idx, valid = kernels.positives(view)
        expected = positive_index(pos)
        assert torch.equal(idx, expected[0]) and torch.equal(valid, expected[1])
