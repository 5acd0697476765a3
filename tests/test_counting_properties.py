"""Property tests: invariants of the counters, checked on random batches (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cocos.counting import count_batch, count_generic, count_queries
from cocos.data.layout import batch_similarity
from cocos.objectives import get_loss

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def pair_batch(draw, max_b=12):
    b = draw(st.integers(2, max_b))
    d = draw(st.integers(2, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    noise = draw(st.floats(0.1, 2.0))
    g = np.random.default_rng(seed)
    images = g.normal(size=(b, d))
    captions = images + noise * g.normal(size=(b, d))
    ids = g.integers(0, max(2, b - 2), size=b) if draw(st.booleans()) else None
    return images, captions, ids


@st.composite
def ranking_batch(draw):
    b = draw(st.integers(2, 8))
    k = draw(st.integers(1, 5))
    d = draw(st.integers(2, 8))
    g = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    images = g.normal(size=(b, d))
    captions = np.repeat(images, k, 0) + draw(st.floats(0.05, 1.5)) * g.normal(size=(b * k, d))
    return images, captions


@SETTINGS
@given(pair_batch(), st.booleans())
def test_triplet_sh_counts_are_zero_or_one(batch, compat):
    images, captions, ids = batch
    out = count_queries(images, captions, "triplet_sh", image_ids=ids, compat=compat)
    for d in ("i2t", "t2i"):
        c = out[d].per_query["C_q"]
        assert set(c.tolist()) <= {0.0, 1.0}
        stats = out[d].batch
        if stats["C_B"] > 0:
            assert stats["C_q"].item() == 1.0


@SETTINGS
@given(pair_batch(), st.sampled_from(["triplet", "triplet_sh"]), st.booleans())
def test_batch_counts_follow_from_per_query(batch, loss, compat):
    images, captions, ids = batch
    out = count_queries(images, captions, loss, image_ids=ids, compat=compat)
    for d in ("i2t", "t2i"):
        c = out[d].per_query["C_q"]
        stats = out[d].batch
        assert stats["C_B"].item() == c.sum().item()
        assert stats["C_0"].item() == (c == 0).sum().item()
        with_grad = len(c) - stats["C_0"].item()
        if with_grad:
            assert stats["C_q"].item() == pytest.approx(c.sum().item() / with_grad)
        else:
            assert math.isnan(stats["C_q"].item())


@SETTINGS
@given(pair_batch(), st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_counts_fall_as_the_margin_falls(batch, m1, m2):
    images, captions, ids = batch
    lo, hi = sorted((m1, m2))
    for loss in ("triplet", "triplet_sh"):
        a = count_queries(images, captions, loss, image_ids=ids, margin=lo)
        b = count_queries(images, captions, loss, image_ids=ids, margin=hi)
        for d in ("i2t", "t2i"):
            assert (a[d].per_query["C_q"] <= b[d].per_query["C_q"]).all()


@SETTINGS
@given(ranking_batch(), st.floats(1e-4, 0.2), st.floats(1e-4, 0.2))
def test_counts_fall_as_eps_rises(batch, e1, e2):
    images, captions = batch
    lo, hi = sorted((e1, e2))
    for loss in ("ntxent", "smoothap"):
        stat = "C_qv-" if loss == "ntxent" else "C_q"
        a = count_queries(images, captions, loss, eps=lo)
        b = count_queries(images, captions, loss, eps=hi)
        for d in ("i2t", "t2i"):
            assert (a[d].per_query[stat] >= b[d].per_query[stat]).all()


@SETTINGS
@given(pair_batch(), st.sampled_from(["triplet", "triplet_sh", "ntxent"]), st.booleans())
def test_permuting_a_pair_batch_changes_nothing(batch, loss, compat):
    images, captions, ids = batch
    perm = np.random.default_rng(len(images)).permutation(len(images))
    a = count_batch(images, captions, loss, image_ids=ids, compat=compat)
    b = count_batch(images[perm], captions[perm], loss,
                    image_ids=None if ids is None else ids[perm], compat=compat)
    for d in a:
        for k in a[d]:
            assert a[d][k] == pytest.approx(b[d][k], rel=1e-9, abs=1e-12, nan_ok=True), (d, k)


@SETTINGS
@given(ranking_batch())
def test_permuting_a_ranking_batch_changes_nothing(batch):
    images, captions = batch
    b = len(images)
    k = len(captions) // b
    perm = np.random.default_rng(b).permutation(b)
    cap_perm = (perm[:, None] * k + np.arange(k)).reshape(-1)
    a = count_batch(images, captions, "smoothap")
    p = count_batch(images[perm], captions[cap_perm], "smoothap")
    for d in a:
        for key in a[d]:
            assert a[d][key] == pytest.approx(p[d][key], rel=1e-9, abs=1e-12, nan_ok=True)


@SETTINGS
@given(pair_batch())
def test_ntxent_weights_add_up(batch):
    images, captions, ids = batch
    out = count_queries(images, captions, "ntxent", image_ids=ids)
    for d in ("i2t", "t2i"):
        q = out[d].per_query
        # negatives' weights sum to 1 - p(q, p); the threshold splits them into counted and low
        assert torch.allclose(q["W_qv-"] + q["W_low"], q["W_qv+"], atol=1e-9)


@SETTINGS
@given(ranking_batch())
def test_smoothap_compat_zeroes_late_caption_queries(batch):
    images, captions = batch
    b, k = len(images), len(captions) // len(images)
    c = count_queries(images, captions, "smoothap", compat=True)["t2i"].per_query["C_q"]
    first_empty = -(-b // k)  # ceil(B / k): from here on the slice of rows is empty
    assert (c[first_empty:] == 0).all()


@SETTINGS
@given(pair_batch(), st.booleans())
def test_generic_autograd_counter_agrees_with_closed_forms(batch, compat):
    images, captions, ids = batch
    scores, layout = batch_similarity(images, captions, image_ids=ids)
    tau, eps = 0.1, 0.01
    for d in ("i2t", "t2i"):
        view = layout.view(scores, d, compat)
        for loss in ("triplet", "triplet_sh"):
            closed = count_queries(images, captions, loss, image_ids=ids, compat=compat)[d]
            if loss == "triplet" and compat and d == "t2i":
                continue  # compat regroups by negative image; the gradient is per caption query
            generic = count_generic(view, get_loss(loss).direction_loss, eps=0.5)
            assert torch.equal(generic.per_query["C_q"], closed.per_query["C_q"])
        # NT-Xent: the summed loss times tau has dL/dS[q, n] = p(q, n): absolute threshold eps
        q = view.scores.shape[-2]
        ntx = get_loss("ntxent", tau=tau)
        generic = count_generic(view, lambda v, f=ntx, n=q: f.direction_loss(v) * n * f.tau, eps=eps,
                                relative=False)
        closed = count_queries(images, captions, "ntxent", image_ids=ids, compat=compat, eps=eps)[d]
        assert torch.equal(generic.per_query["C_q"], closed.per_query["C_qv-"])


@SETTINGS
@given(pair_batch(), st.sampled_from(["triplet", "triplet_sh", "ntxent"]))
def test_zero_count_means_zero_loss_gradient(batch, loss):
    """Where the counter says a query has no gradient, the training loss's gradient is zero."""
    images, captions, ids = batch
    images_t = torch.tensor(images, requires_grad=True)
    fn = get_loss(loss)
    fn(images_t, torch.tensor(captions), image_ids=ids).backward()
    if loss == "ntxent":
        return  # NT-Xent always has a gradient; nothing to compare
    scores, layout = batch_similarity(images, captions, image_ids=ids)
    view = layout.view(scores, "i2t")
    g = torch.zeros_like(view.scores).requires_grad_(True)
    from dataclasses import replace
    fn.direction_loss(replace(view, scores=view.scores + g)).backward()
    counts = count_queries(images, captions, loss, image_ids=ids)["i2t"].per_query["C_q"]
    zero_rows = counts == 0
    assert (g.grad[zero_rows] == 0).all()
    assert (g.grad[~zero_rows].abs().sum(-1) > 0).all()


@SETTINGS
@given(ranking_batch(), st.booleans())
def test_triplet_sh_is_zero_or_one_with_several_positives(batch, compat):
    images, captions = batch
    out = count_queries(images, captions, "triplet_sh", compat=compat)
    all_triplets = count_queries(images, captions, "triplet", compat=compat)
    for d in ("i2t", "t2i"):
        c = out[d].per_query["C_q"]
        assert set(c.tolist()) <= {0.0, 1.0}
        # a query has a Triplet SH gradient exactly when some triplet violates
        if not (compat and d == "t2i"):
            assert torch.equal(c > 0, all_triplets[d].per_query["C_q"] > 0)


@SETTINGS
@given(pair_batch())
def test_compat_keeps_triplet_t2i_c_b(batch):
    images, captions, _ = batch
    fixed = count_batch(images, captions, "triplet")["t2i"]
    compat = count_batch(images, captions, "triplet", compat=True)["t2i"]
    assert fixed["C_B"] == compat["C_B"]  # the same violations, grouped differently
