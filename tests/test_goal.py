"""GOAL gradient components: weights at hand-computed points, hardest triplets, and the gradient objective.

The central check (definitions file): ``T_con × P_con`` equals the autograd gradient of
the summed Triplet SH loss, with the same positive/negative masks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cocos.data.layout import DIRECTIONS, BatchLayout
from cocos.errors import CocosError
from cocos.losses.goal import (
    PAIR_WEIGHTS,
    TRIPLET_WEIGHTS,
    goal_gradient,
    hardest_triplets,
    ms_relative_terms,
    p_con,
    p_lin,
    p_lin_ms,
    p_sig,
    p_sig_ms,
    parse_weight,
    t_cir,
    t_con,
    t_nca,
    weight_grid,
    weight_params,
)
from cocos.objectives import get_loss


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def f(x):
    return float(x)


# -- triplet weights ---------------------------------------------------------------------------


def test_t_nca_hand_points():
    assert f(t_nca(0.5, 0.5)) == 0.5
    assert f(t_nca(0.75, 0.5)) == pytest.approx(1 / (1 + math.exp(2.5)), rel=1e-12)  # tau 10 * 0.25
    assert f(t_nca(0.5, 0.75, tau=4)) == pytest.approx(1 / (1 + math.exp(-1.0)), rel=1e-12)
    # only the difference matters: equal-weight lines are straight (paper Fig. 2)
    assert f(t_nca(0.9, 0.6)) == pytest.approx(f(t_nca(0.4, 0.1)), rel=1e-12)


def test_t_con_is_strict_at_the_boundary():
    # dyadic numbers: 0.25 + 0.5 - 0.75 is exactly 0
    assert f(t_con(0.75, 0.5, margin=0.25)) == 0.0
    assert f(t_con(0.75, 0.5 + 2**-20, margin=0.25)) == 1.0
    assert f(t_con(0.75, 0.5 - 2**-20, margin=0.25)) == 0.0
    assert f(t_con(0.5, 0.5)) == 1.0  # default margin 0.2
    assert f(t_con(0.9, 0.5)) == 0.0


def test_t_cir_hand_points_and_offset():
    assert f(t_cir(0.0, 0.0)) == 0.5  # exp(0)
    assert f(t_cir(1.0, 0.0)) == pytest.approx(1 / (1 + math.exp(10)), rel=1e-12)  # Sp(2-Sp) = 1
    # 0.5 * 1.5 - 0.25 = 0.5
    assert f(t_cir(0.5, 0.5)) == pytest.approx(1 / (1 + math.exp(5)), rel=1e-12)
    # 0.5 * 1.5 - 0.0625 = 0.6875
    assert f(t_cir(0.5, 0.25, tau=2)) == pytest.approx(1 / (1 + math.exp(1.375)), rel=1e-12)
    # the authors' code: 0.5 subtracted inside the bracket that tau multiplies
    assert f(t_cir(0.5, 0.5, offset=True)) == 0.5
    assert f(t_cir(1.0, 0.0, offset=True)) == pytest.approx(1 / (1 + math.exp(5)), rel=1e-12)
    assert f(t_cir(0.0, 0.0, offset=True)) == pytest.approx(1 / (1 + math.exp(-5)), rel=1e-12)


def test_t_cir_equal_weight_lines_are_circles_around_1_0():
    theta = torch.linspace(0.1, 1.4, 7, dtype=torch.float64)
    for r in (0.3, 0.7):
        w = t_cir(1 - r * torch.cos(theta), r * torch.sin(theta))
        assert torch.allclose(w, w[0].expand_as(w), rtol=1e-12)
        # (Sp-1)^2 + Sn^2 = r^2  <=>  Sp(2-Sp) - Sn^2 = 1 - r^2
        assert f(w[0]) == pytest.approx(1 / (1 + math.exp(10 * (1 - r * r))), rel=1e-12)


def test_weights_broadcast_over_any_shape():
    sp = torch.linspace(0, 1, 5, dtype=torch.float64)
    sn = torch.linspace(-1, 1, 3, dtype=torch.float64)
    for fn in TRIPLET_WEIGHTS.values():
        assert fn(sp[None, :], sn[:, None]).shape == (3, 5)
    for fn in PAIR_WEIGHTS.values():
        pp, pn = fn(sp[None, :], sn[:, None])
        assert torch.broadcast_shapes(pp.shape, pn.shape) == (3, 5)
    w = t_nca(sp[None, :], sn[:, None])
    assert f(w[2, 0]) == pytest.approx(1 / (1 + math.exp(10 * (0 - 1))), rel=1e-12)


# -- pair weights ---------------------------------------------------------------------------------


def test_pair_weights_hand_points():
    pp, pn = p_sig(0.5, 0.5)  # lambda = 0.5: both 1/2
    assert (f(pp), f(pn)) == (0.5, 0.5)
    pp, pn = p_sig(0.0, 1.0)  # alpha 2, beta 10
    assert f(pp) == pytest.approx(sig(1.0), rel=1e-12) and f(pn) == pytest.approx(sig(5.0), rel=1e-12)
    pp, pn = p_lin(0.25, 0.375)
    assert (f(pp), f(pn)) == (0.75, 0.375)
    pp, pn = p_con(0.3, 0.9)
    assert (f(pp), f(pn)) == (1.0, 1.0)


def test_multi_similarity_terms_by_hand():
    # anchor: selected positive 0.6, hardest negative 0.5; other positives 0.55, 0.8; other negatives 0.47, 0.2
    sp, sn = 0.6, 0.5
    pos, neg = [0.55, 0.8], [0.47, 0.2]
    # P mined: R+ < max(0.5, 0.47) + 0.1 = 0.6 -> {0.55}; N mined: R- > min(0.6, 0.55, 0.8) - 0.1 = 0.45 -> {0.47}
    # Eq. 12-13: the mean over the mined set only (one member each here)
    m_pos, m_neg = ms_relative_terms(sp, sn, pos, neg, kind="sig")
    assert f(m_pos) == pytest.approx(math.exp(2 * 0.05), rel=1e-12)
    assert f(m_neg) == pytest.approx(math.exp(-10 * 0.03), rel=1e-12)
    pp, pn = p_sig_ms(sp, sn, pos, neg)
    assert f(pp) == pytest.approx(1 / (math.exp(2 * 0.05) + math.exp(2 * 0.1)), rel=1e-12)
    assert f(pn) == pytest.approx(1 / (math.exp(-10 * 0.03) + 1.0), rel=1e-12)
    pp, pn = p_lin_ms(sp, sn, pos, neg)
    assert f(pp) == pytest.approx((1 - 0.05) * 0.4, rel=1e-12)  # m+ = 0.6 - 0.55
    assert f(pn) == pytest.approx((1 + 0.03) * 0.5, rel=1e-12)  # m- = 0.5 - 0.47


def test_multi_similarity_follows_the_papers_mean_in_the_issues_example():
    # Sp 0.75, Sn 0.7, one other positive at 0, one mined negative at 0.68 (beta 10, lambda 0.5)
    m_pos, m_neg = ms_relative_terms(0.75, 0.7, [0.0], [0.68], kind="sig")
    assert f(m_neg) == pytest.approx(math.exp(-0.2), rel=1e-12) and round(f(m_neg), 3) == 0.819
    _, pn = p_sig_ms(0.75, 0.7, [0.0], [0.68])
    assert f(pn) == pytest.approx(1 / (math.exp(-0.2) + math.exp(-2.0)), rel=1e-12) and round(f(pn), 3) == 1.048
    assert f(m_pos) == pytest.approx(math.exp(2 * 0.75), rel=1e-12)  # 0 < max(0.7, 0.68) + 0.1: mined


def test_an_empty_mined_set_gives_the_neutral_term_not_the_authors_explosion():
    # nothing mined (the other negative is far below Sp - eps): m- = 1 (sig) / 0 (lin), P- = P_sig / P_lin;
    # the authors' code returns m- = 0, P- = exp(beta (Sn - lambda)) = 148.4 at Sn = 1
    m_pos, m_neg = ms_relative_terms(0.9, 1.0, [0.95], [-0.5], kind="sig")
    assert f(m_neg) == 1.0
    _, pn = p_sig_ms(0.9, 1.0, [0.95], [-0.5])
    assert f(pn) == pytest.approx(f(p_sig(0.9, 1.0)[1]), rel=1e-12) and f(pn) < 1.01
    assert f(ms_relative_terms(0.9, 1.0, [0.95], [-0.5], kind="lin")[1]) == 0.0
    # rows without any entry (a batch with no other positive or negative) do not raise
    m_pos, m_neg = ms_relative_terms(0.9, 1.0, torch.zeros(0), torch.zeros(0), kind="sig")
    assert f(m_pos) == 1.0 and f(m_neg) == 1.0


def test_multi_similarity_reduces_to_the_plain_forms_without_other_mined_pairs():
    sp = torch.tensor([0.3, 0.7], dtype=torch.float64)
    sn = torch.tensor([0.6, 0.2], dtype=torch.float64)
    rows = torch.zeros(2, 4, dtype=torch.float64)
    none = torch.zeros(2, 4, dtype=torch.bool)
    for ms, plain in ((p_sig_ms, p_sig), (p_lin_ms, p_lin)):
        got = ms(sp, sn, rows, rows, pos_mask=none, neg_mask=none)
        want = plain(sp, sn)
        assert torch.allclose(got[0], want[0], rtol=1e-12) and torch.allclose(got[1], want[1], rtol=1e-12)
    # fixed relative terms (paper Figure 3 uses 0.1)
    pp, pn = p_sig_ms(0.5, 0.5)
    assert f(pp) == pytest.approx(1 / 1.1) and f(pn) == pytest.approx(1 / 1.1)
    pp, pn = p_lin_ms(0.5, 0.5, m_pos=0.2, m_neg=0.4)
    assert f(pp) == pytest.approx(0.8 * 0.5) and f(pn) == pytest.approx(1.4 * 0.5)


# -- names ---------------------------------------------------------------------------------------------


def test_weight_names_and_grid():
    sp = torch.linspace(0, 1, 11, dtype=torch.float64)[None, :]
    sn = torch.linspace(0, 1, 7, dtype=torch.float64)[:, None]
    got = weight_grid("T_nca*P_sig-", sp, sn, tau=5, beta=4)
    want = 1 / (1 + torch.exp(5 * (sp - sn))) / (1 + torch.exp(-4 * (sn - 0.5)))
    assert torch.allclose(got, want, rtol=1e-12)
    got = weight_grid("t_cir*p_lin+", sp, sn)  # case-insensitive
    assert torch.allclose(got, t_cir(sp, sn) * (1 - sp).expand(7, 11), rtol=1e-12)
    assert torch.equal(weight_grid("P_lin\u2212", sp, sn), sn.expand(7, 11))
    assert parse_weight("T_con*P_sig-ms-").pair == "P_sig-ms"
    assert weight_params("T_con", tau=3) == {"margin": 0.2}
    assert weight_params("T_cir", tau=3) == {"tau": 3, "offset": False}


@pytest.mark.parametrize("name", ["T_foo", "T_con*", "T_con*P_sig", "P_sig", "P_x+", "T_con*T_nca", ""])
def test_unknown_weight_names_raise_with_the_choices(name):
    with pytest.raises(CocosError) as err:
        parse_weight(name)
    msg = str(err.value)
    assert "\n" not in msg and (("T_con" in msg and "P_sig" in msg) or "P_sig+" in msg)


def test_unknown_parameter_raises():
    with pytest.raises(CocosError, match="unknown weight parameter"):
        weight_grid("T_con", 0.5, 0.5, tua=3)


# -- hardest triplets -------------------------------------------------------------------------------------


def _brute_triplets(s, caption_image, image_ids, direction, compat):
    """Per query, per positive: (sp, sn, n*) with positives/negatives written out from the definitions."""
    b, m = s.shape
    ids = image_ids if image_ids is not None else list(range(b))
    out = []
    n_queries = b if direction == "i2t" else m
    for q in range(n_queries):
        rows = []
        if direction == "i2t":
            cands = [(c, s[q, c], caption_image[c] == q, ids[caption_image[c]] == ids[q]) for c in range(m)]
        else:
            cands = [(i, s[i, q], caption_image[q] == i, ids[i] == ids[caption_image[q]]) for i in range(b)]
        negs = [(v, c) for c, v, pos, same in cands if not pos and (compat or not same)]
        best = None
        for v, c in negs:  # first index among ties
            if best is None or v > best[0]:
                best = (v, c)
        for _c, v, pos, _same in cands:
            if pos:
                rows.append((v, best[0], best[1]) if best else (math.nan, math.nan, -1))
        out.append(rows)
    return out


@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize("layout_kind", ["pair", "ranking"])
def test_hardest_triplets_match_a_brute_force_loop(compat, layout_kind):
    g = torch.Generator().manual_seed(3)
    for trial in range(6):
        if layout_kind == "pair":
            b = 7
            m = b
            caption_image = list(range(b))
            image_ids = torch.randint(0, 4, (b,), generator=g).tolist()
        else:
            b, k = 4, 3
            m = b * k
            caption_image = [c // k for c in range(m)]
            image_ids = None
        s = torch.rand(b, m, generator=g, dtype=torch.float64) * 2 - 1
        layout = BatchLayout.build(b, m, torch.tensor(caption_image), image_ids=image_ids)
        for d in DIRECTIONS:
            sp, sn, n_star = hardest_triplets(layout.view(s, d, compat))
            want = _brute_triplets(s.numpy(), caption_image, image_ids, d, compat)
            for q, rows in enumerate(want):
                for a, (wsp, wsn, wn) in enumerate(rows):
                    assert int(n_star[q, a]) == wn, (trial, d, q, a)
                    if wn < 0:
                        assert math.isnan(sp[q, a]) and math.isnan(sn[q, a])
                    else:
                        assert (float(sp[q, a]), float(sn[q, a])) == (wsp, wsn), (trial, d, q, a)
                assert not (n_star[q, len(rows):] >= 0).any()  # padding beyond the query's positives


def test_hardest_triplets_query_without_negatives():
    # two rows of one image: outside compat caption 0 has no negative image at all
    s = torch.tensor([[0.9, 0.3], [0.4, 0.8]], dtype=torch.float64)
    layout = BatchLayout.build(2, 2, torch.arange(2), image_ids=[5, 5])
    sp, sn, n = hardest_triplets(layout.view(s, "t2i", compat=False))
    assert n.tolist() == [[-1], [-1]] and torch.isnan(sp).all()
    sp, sn, n = hardest_triplets(layout.view(s, "t2i", compat=True))
    assert n.tolist() == [[1], [0]] and sp.tolist() == [[0.9], [0.8]] and sn.tolist() == [[0.4], [0.3]]


# -- the gradient objective ------------------------------------------------------------------------------------


def test_gradient_by_hand_two_pairs():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([[0.8, 0.6], [0.6, 0.8]], dtype=torch.float64)
    # S = [[.8, .6], [.6, .8]]: all four triplets have Sp = .8, Sn = .6
    gx, gy = goal_gradient(x, y, "T_con", "P_con", margin=0.3)
    # dl/dS = [[-2, 2], [2, -2]] (each entry is a positive or negative in one i2t and one t2i triplet)
    assert torch.allclose(gx, torch.tensor([[-0.4, 0.4], [0.4, -0.4]], dtype=torch.float64), atol=1e-15)
    assert torch.allclose(gy, torch.tensor([[-2.0, 2.0], [2.0, -2.0]], dtype=torch.float64), atol=1e-15)
    # margin 0.1 < Sp - Sn: no triplet violates, no gradient at all
    gx, gy = goal_gradient(x, y, "T_con", "P_con", margin=0.1)
    assert not gx.any() and not gy.any()


def _random_batch(seed, b, d, layout_kind, n_ids):
    g = torch.Generator().manual_seed(seed)
    if layout_kind == "pair":
        m, caption_image = b, torch.arange(b)
        image_ids = torch.randint(0, n_ids, (b,), generator=g)
    else:
        k = 2
        m, caption_image, image_ids = b * k, torch.arange(b * k) // k, None
    images = torch.randn(b, d, generator=g, dtype=torch.float64)
    captions = torch.randn(m, d, generator=g, dtype=torch.float64)
    return images, captions, caption_image, image_ids


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), b=st.integers(2, 7), d=st.integers(2, 6),
       layout_kind=st.sampled_from(["pair", "ranking"]), n_ids=st.integers(1, 4),
       compat=st.booleans(), margin=st.sampled_from([0.0, 0.2, 0.5, 1.0]))
def test_t_con_p_con_equals_autograd_of_triplet_sh(seed, b, d, layout_kind, n_ids, compat, margin):
    images, captions, caption_image, image_ids = _random_batch(seed, b, d, layout_kind, n_ids)
    loss = get_loss("triplet_sh", margin=margin, compat=compat)
    # normalised leaves; S = I C^T without renormalisation, then the loss's own direction terms
    x = torch.nn.functional.normalize(images, dim=-1).requires_grad_()
    y = torch.nn.functional.normalize(captions, dim=-1).requires_grad_()
    layout = BatchLayout.build(b, y.shape[0], caption_image, image_ids)
    s = x @ y.T
    total = sum(loss.direction_loss(layout.view(s, dd, compat)) for dd in DIRECTIONS)
    if total.requires_grad:
        want_x, want_y = torch.autograd.grad(total, (x, y), allow_unused=True)
    else:
        want_x = want_y = None
    want_x = torch.zeros_like(x) if want_x is None else want_x
    want_y = torch.zeros_like(y) if want_y is None else want_y
    got_x, got_y = goal_gradient(x.detach(), y.detach(), "T_con", "P_con", caption_image, image_ids,
                                 compat=compat, margin=margin)
    assert torch.allclose(got_x, want_x, rtol=0, atol=1e-12)
    assert torch.allclose(got_y, want_y, rtol=0, atol=1e-12)

    # with the normalisation Jacobian: the gradient of the loss module itself on raw embeddings
    raw_x, raw_y = images.clone().requires_grad_(), captions.clone().requires_grad_()
    total = loss(raw_x, raw_y, caption_image, image_ids)
    if total.requires_grad:
        jx, jy = torch.autograd.grad(total, (raw_x, raw_y), allow_unused=True)
    else:
        jx = jy = None
    jx = torch.zeros_like(raw_x) if jx is None else jx
    jy = torch.zeros_like(raw_y) if jy is None else jy
    got_x, got_y = goal_gradient(images, captions, "T_con", "P_con", caption_image, image_ids,
                                 compat=compat, margin=margin, jacobian=True)
    assert torch.allclose(got_x, jx, rtol=0, atol=1e-12)
    assert torch.allclose(got_y, jy, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tau", [1.0, 10.0])
def test_t_nca_p_con_equals_autograd_of_hard_negative_nca(tau):
    """Paper Eq. 6-7: the hard-negative NCA loss has scalars -tau T_nca (positive) and +tau T_nca (negative)."""
    for seed in range(5):
        images, captions, caption_image, image_ids = _random_batch(seed, 6, 4, "pair", 3)
        x = torch.nn.functional.normalize(images, dim=-1).requires_grad_()
        y = torch.nn.functional.normalize(captions, dim=-1).requires_grad_()
        s = x @ y.T
        ids = image_ids.tolist()
        total = 0
        for q in range(6):  # i2t: row q; t2i: column q; hardest negative picked by a plain loop
            # pair batch: in both directions the negatives of q are the rows/captions of other images
            negs = [c for c in range(6) if c != q and ids[c] != ids[q]]
            if not negs:
                continue
            for vals in (s[q], s[:, q]):
                n = max(negs, key=lambda c, vals=vals: float(vals[c].detach()))
                total = total - torch.log(torch.exp(tau * vals[q]) / (torch.exp(tau * vals[q]) + torch.exp(tau * vals[n])))
        want_x, want_y = torch.autograd.grad(total, (x, y))
        got_x, got_y = goal_gradient(x.detach(), y.detach(), "T_nca", "P_con", caption_image, image_ids, tau=tau)
        assert torch.allclose(tau * got_x, want_x, rtol=0, atol=1e-12)
        assert torch.allclose(tau * got_y, want_y, rtol=0, atol=1e-12)


def _brute_eq3(x, y, t_fn, p_fn, ids, ms=False, **params):
    """Eq. 3 written out per triplet, accumulating vectors (pair batch, caption j belongs to row j)."""
    b = x.shape[0]
    gx, gy = np.zeros_like(x), np.zeros_like(y)
    s = x @ y.T
    for direction in ("i2t", "t2i"):
        for q in range(b):
            row = s[q] if direction == "i2t" else s[:, q]
            negs = [c for c in range(b) if c != q and ids[c] != ids[q]]
            if not negs:
                continue
            n = max(negs, key=lambda c, row=row: row[c])
            sp, sn = row[q], row[n]
            kw = {"margin": params["margin"]} if t_fn is t_con else {"tau": params["tau"]}
            t = float(t_fn(sp, sn, **kw))
            if ms:
                others = [row[c] for c in negs if c != n]
                mined = [r for r in others if r > sp - 0.1]  # no other positives in a pair batch
                m_neg = sum(math.exp(-10 * (sn - r)) for r in mined) / len(mined) if mined else 1.0
                pp, pn = 1 / (1 + math.exp(2 * (sp - 0.5))), 1 / (m_neg + math.exp(-10 * (sn - 0.5)))
            else:
                pp, pn = (float(v) for v in p_fn(sp, sn))
            if direction == "i2t":  # anchor x_q, positive y_q, negative y_n
                gx[q] += t * (pn * y[n] - pp * y[q])
                gy[q] += -t * pp * x[q]
                gy[n] += t * pn * x[q]
            else:  # anchor y_q, positive x_q, negative x_n
                gy[q] += t * (pn * x[n] - pp * x[q])
                gx[q] += -t * pp * y[q]
                gx[n] += t * pn * y[q]
    return gx, gy


@pytest.mark.parametrize("t_name,p_name", [("T_nca", "P_sig"), ("T_cir", "P_lin"), ("T_con", "P_sig-ms")])
def test_general_weights_match_eq3_written_out(t_name, p_name):
    for seed in range(4):
        images, captions, caption_image, image_ids = _random_batch(100 + seed, 6, 5, "pair", 4)
        x = torch.nn.functional.normalize(images, dim=-1)
        y = torch.nn.functional.normalize(captions, dim=-1)
        got_x, got_y = goal_gradient(images, captions, t_name, p_name, caption_image, image_ids, tau=7.0,
                                     margin=0.5)
        want_x, want_y = _brute_eq3(x.numpy(), y.numpy(), TRIPLET_WEIGHTS[t_name], PAIR_WEIGHTS[p_name],
                                    image_ids.tolist(), ms=p_name == "P_sig-ms", tau=7.0, margin=0.5)
        assert np.allclose(got_x.numpy(), want_x, rtol=0, atol=1e-12)
        assert np.allclose(got_y.numpy(), want_y, rtol=0, atol=1e-12)
