"""The one-pass engine gives the statistics of the per-threshold loop it replaced, to 1e-12.

The reference is a frozen copy of that loop (``tests/reference_engine.py``): every
counter's ``count`` and ``sweep`` on views made anew per loss, mode and direction,
in chunks of 32 batches. Both run on the same small random sets (regular and
irregular captions per image, pair and ranking layouts, both modes, the eps sweep,
every registered family with GOAL variants and IMC, a generic family and a
whole-batch callable, per-query rows on and off, several chunk sizes), and the tidy
frames and summaries must agree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from cocos.counting.engine import DEFAULT_SWEEP, EmbeddingSet, count_embeddings
from cocos.data.layout import QueryView
from cocos.losses.counts import counts_above, thresholded_sums
from cocos.losses.functional import triplet_direction
from cocos.objectives import OBJECTIVES, Objective
from tests.reference_engine import reference_count_embeddings

MODES = ["corrected", "compat"]
# thresholds on both sides of the small sets' weights, so that rows with negatives on both sides of one occur
SWEEP = (*DEFAULT_SWEEP, 0.0, 0.03, 0.3)


def _world(n=24, k=5, d=6, noise=1.0, seed=0, dup=True, dtype=np.float32):
    g = np.random.default_rng(seed)
    images = g.normal(size=(n, d)).astype(dtype)
    if dup:  # two images with the same embedding: ties in the scores
        images[1] = images[0]
    captions = np.repeat(images, k, 0) + noise * g.normal(size=(n * k, d)).astype(dtype)
    return images, captions


def _sq_hinge(view, margin=0.1):  # a family without a closed-form counter: the generic autograd counter
    return torch.relu(triplet_direction(view, margin)) ** 2


SQ = Objective(name="sqhinge_eq", label="squared hinge", direction_loss=_sq_hinge, defaults={"margin": 0.1})


def whole_batch(images, captions, caption_image=None):  # a user's whole-batch callable
    s = torch.nn.functional.normalize(images, dim=-1) @ torch.nn.functional.normalize(captions, dim=-1).T
    return torch.logsumexp(s / 0.2, dim=-1).sum()


def _same(new, old, what: str) -> None:
    if old is None:
        assert new is None, what
        return
    pd.testing.assert_frame_equal(new.reset_index(drop=True), old.reset_index(drop=True), check_exact=True,
                                  obj=what)


def _compare(emb, losses, chunks=(32, 1, 3), **kw):
    """Both engines with the same chunks of batches (the chunk size moves float32 rounding, see engine.CHUNK)."""
    for chunk in chunks:
        old = reference_count_embeddings(emb, losses, chunk=chunk, **kw)
        new = count_embeddings(emb, losses, **({} if chunk == 32 else {"chunk": chunk}), **kw)
        _same(new.batches, old.batches, f"batches, chunk {chunk}")
        _same(new.queries, old.queries, f"queries, chunk {chunk}")
        _same(new.summary(), old.summary(), f"summary, chunk {chunk}")
        assert new.params == old.params and new.n_batches == old.n_batches
    return old


@pytest.mark.parametrize(("keep", "dtype"), [(True, np.float32), (False, np.float64)])
def test_every_paper_family_both_modes_and_the_sweep_equal_the_per_threshold_loop(keep, dtype):
    emb = EmbeddingSet.from_arrays(*_world(dtype=dtype))
    old = _compare(emb, None, batch_size=8, seed=3, modes=MODES, sweep_eps=SWEEP, keep_per_query=keep)
    b = old.batches
    assert set(b["mode"]) == set(MODES) and b["eps"].nunique() == len(SWEEP)
    # the sweep is not degenerate: NT-Xent and SmoothAP counts change with the threshold
    swept = b[(b.stat.isin(["C_qv-", "C_q"])) & b.loss.isin(["ntxent", "smoothap"])]
    assert swept.groupby(["loss", "direction", "mode"])["value"].nunique().min() > 1


def test_registered_families_goal_imc_generic_and_a_callable_on_irregular_captions():
    g = np.random.default_rng(1)
    images, _ = _world(n=20, seed=1)
    caption_image = np.sort(g.integers(0, 20, size=70))
    caption_image[:20] = np.arange(20)  # every image has a caption
    captions = images[caption_image] + 0.8 * g.normal(size=(70, images.shape[1]))  # float64, images float32
    emb = EmbeddingSet.from_arrays(images, captions, caption_image)
    assert emb.images.dtype == emb.captions.dtype == torch.float64
    losses = ["triplet", "triplet_sh", "ntxent", "imc", SQ, whole_batch]
    _compare(emb, losses, chunks=(32, 2), batch_size=8, seed=0, modes=MODES, sweep_eps=SWEEP)


@pytest.mark.parametrize("weights", [("con", "con"), ("nca", "sig_ms"), ("cir", "lin_ms"), ("nca", "lin")])
def test_goal_variants_equal_the_per_threshold_loop(weights):
    emb = EmbeddingSet.from_arrays(*_world(seed=2))
    params = {"goal": {"triplet_weight": weights[0], "pair_weight": weights[1]}}
    _compare(emb, ["goal"], chunks=(32, 2), batch_size=8, seed=1, modes=MODES, sweep_eps=SWEEP, params=params,
             eps=0.05)


def test_own_threshold_outside_the_sweep_and_no_sweep():
    emb = EmbeddingSet.from_arrays(*_world(seed=4))
    _compare(emb, ["ntxent", "smoothap"], chunks=(2,), batch_size=8, modes=MODES, sweep_eps=(0.02, 0.004),
             eps=0.007, params={"ntxent": {"tau": 0.05}})
    _compare(emb, ["ntxent", "smoothap"], chunks=(32,), batch_size=8, modes=["compat"])


def _assert_threshold_sums_are_direct(p, mask, eps):
    """``thresholded_sums`` equals one comparison per threshold, bit for bit."""
    for e, (count, above, below) in zip(eps, thresholded_sums(p, mask, eps), strict=True):
        hit = mask & (p > e)
        assert torch.equal(count, hit.sum(-1))
        assert torch.equal(above, torch.where(hit, p, 0.0).sum(-1))
        assert torch.equal(below, torch.where(mask & (p < e), p, 0.0).sum(-1))


def test_threshold_counts_and_sums_equal_one_comparison_per_threshold():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(3, 7, 40, generator=g) ** 4
    p[0, 0] = 0.5  # every entry on one side of most thresholds
    mask = torch.rand(3, 7, 40, generator=g) > 0.2
    mask[1, 2] = False  # a row without entries
    eps = [0.0, 1e-3, 0.01, 0.1, 0.5, 0.9]
    _assert_threshold_sums_are_direct(p, mask, eps)
    for e, count in zip(eps, counts_above(p, eps), strict=True):
        assert torch.equal(count, (p > e).sum(-1))


def test_ranking_batches_in_smaller_chunks_and_the_published_t2i_rows_give_the_same_bits():
    """25 ranking batches: the reference counts them in one chunk of 25, the engine 8 at a time
    (``engine.SMALL_CHUNK``), and the published SmoothAP t2i layout only on its first ceil(B / k) caption
    queries; where every chunk is tail-free both give the same bits (``vectorised_whole``)."""
    from cocos.counting.engine import SMALL_CHUNK, batches_per_chunk, make_plan
    from cocos.losses import smoothap

    emb = EmbeddingSet.from_arrays(*_world(n=200, seed=5, dup=False))
    plan = make_plan(emb, "ranking", 8, 0)
    assert plan.n_batches == 25 and batches_per_chunk(plan, 32, "cpu", True) == SMALL_CHUNK["ranking"]
    assert batches_per_chunk(plan, 32, "cpu", False) == 32  # a counter that is not chunk-invariant keeps the chunk
    seen = []
    weights = smoothap.SmoothAPCounter._weights

    def spy(self, view):
        out = weights(self, view)
        seen.append((view.compat, view.direction, out[2], view.scores.shape[-2]))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(smoothap.SmoothAPCounter, "_weights", spy)
        old = reference_count_embeddings(emb, ["smoothap", "ntxent"], batch_size=8, modes=MODES, sweep_eps=SWEEP)
        seen.clear()
        new = count_embeddings(emb, ["smoothap", "ntxent"], batch_size=8, modes=MODES, sweep_eps=SWEEP)
    assert (True, "t2i", 2, 40) in seen  # the published t2i layout: 2 of 40 caption queries computed
    _same(new.batches, old.batches, "batches")
    _same(new.queries, old.queries, "queries")


def test_vectorised_whole_follows_torchs_loop_split_and_sigmoid_vectorised_gives_the_whole_tensors_bits():
    """``vectorised_whole``: every thread's range of an elementwise loop is a multiple of the vector step (hand
    cases for one and two threads); ``sigmoid_vectorised`` of any part of a tail-free tensor equals the whole
    tensor's ``sigmoid`` there, bit for bit, while a plain ``sigmoid`` of a part with a scalar tail may not."""
    from cocos.losses.functional import GRAIN, sigmoid_vectorised, vectorised_whole

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert vectorised_whole(64) and vectorised_whole(GRAIN * 3) and not vectorised_whole(80)
        torch.set_num_threads(2)
        assert vectorised_whole(GRAIN + 64 * 2)  # two parts of (GRAIN + 128) / 2, a multiple of 64
        assert not vectorised_whole(GRAIN + 64)  # parts of GRAIN / 2 + 32: each thread's range has a tail
        assert vectorised_whole(GRAIN - 64)  # below GRAIN: one thread
        for t in (1, 2):
            torch.set_num_threads(t)
            x = torch.randn(2, GRAIN + 64 * 2, generator=torch.Generator().manual_seed(t)) * 8
            whole = torch.sigmoid(x)
            for a, b in ((0, 17), (5, 1000), (100, 33_001)):
                part = x[:, a:b]
                assert torch.equal(sigmoid_vectorised(part), whole[:, a:b]), (t, a, b)
    finally:
        torch.set_num_threads(threads)


def test_both_modes_of_a_chunk_with_same_image_pairs_count_one_stack_of_rows():
    """In a chunk with same-image pairs both modes' views of a direction share a stack of the corrected query rows
    and the compat rows whose masks differ; the counters compute that stack once (``per_query``), and every value
    of either mode equals counting its view from scratch (a plain view without a stack) and the reference loop.
    The views' masks, positives' indices and excluded pairs, made from the layout's parts, are the layout's."""
    from cocos.counting import engine
    from cocos.data.layout import positive_index
    from cocos.losses.counts import positives

    emb = EmbeddingSet.from_arrays(*_world(n=12, k=5, seed=6))  # 60 captions of 12 images: pairs of one image
    seen = []
    views = engine._views

    def spy(layout, *args, **kw):
        out = views(layout, *args, **kw)
        for v in out.values():
            if v.stack is not None:  # masks made from the layout's parts: the layout's masks, indices, exclusions
                seen.append(v)
                pos, neg = layout.masks(v.direction, v.compat)
                assert torch.equal(v.pos, pos.expand_as(v.pos)) and torch.equal(v.neg, neg.expand_as(v.neg))
                for u in (v, v.stack.view):
                    assert all(torch.equal(a, b) for a, b in zip(positives(u), positive_index(u.pos), strict=True))
                    assert torch.equal(u.excluded_pairs(), ~(u.pos | u.neg))
                assert torch.equal(v.n_excluded, engine._n_excluded(v.pos, v.neg))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_views", spy)
        new = count_embeddings(emb, ["triplet", "triplet_sh", "ntxent"], batch_size=8, modes=MODES, sweep_eps=SWEEP)
    assert {v.compat for v in seen} == {False, True} and {v.direction for v in seen} == {"i2t", "t2i"}
    assert all(0 < len(v.stack.changed) < v.scores.shape[0] * v.scores.shape[1] for v in seen)
    assert len({id(v.stack.view) for v in seen}) < len(seen) // 2  # a chunk's four views share one stack
    for v in seen:
        plain = QueryView(scores=v.scores, pos=v.pos, neg=v.neg, direction=v.direction, group_size=v.group_size,
                          compat=v.compat)
        for name in ("triplet", "triplet_sh", "ntxent"):
            counter = OBJECTIVES[name].make_counter()
            swept = SWEEP[1:] if counter.uses_eps else ()
            patched, at = counter.count_sweep(v, swept)
            scratch, at2 = counter.count_sweep(plain, swept)
            for key in scratch.per_query:
                assert torch.equal(patched.per_query[key].nan_to_num(-1), scratch.per_query[key].nan_to_num(-1))
            for e in at2:
                for key in at2[e]:
                    assert torch.equal(at[e][key].nan_to_num(-1), at2[e][key].nan_to_num(-1)), (name, e, key)
    old = reference_count_embeddings(emb, ["triplet", "triplet_sh", "ntxent"], batch_size=8, modes=MODES,
                                     sweep_eps=SWEEP)
    _same(new.batches, old.batches, "batches")
    _same(new.queries, old.queries, "queries")


def test_counting_leaves_no_reference_cycle_behind():
    """A chunk's views and memo are freed when the chunk is done, without the cyclic garbage collector (a cycle
    through the memo kept every chunk's tensors alive until a collection: the peak memory grew with the set)."""
    import gc
    import weakref

    from cocos.counting import engine

    emb = EmbeddingSet.from_arrays(*_world(n=40, seed=7))
    refs = []
    views = engine._views

    def spy(*args, **kw):
        out = views(*args, **kw)
        refs.extend(weakref.ref(v) for v in out.values())
        refs.extend(weakref.ref(v.scores) for v in out.values())
        return out

    gc.collect()
    gc.disable()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "_views", spy)
            count_embeddings(emb, None, batch_size=8, modes=MODES, sweep_eps=SWEEP, keep_per_query=False)
        assert refs and all(r() is None for r in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("partial_rows", [2, 20])
def test_threshold_sums_by_gathered_rows_and_by_whole_rows_equal_one_comparison_per_threshold(partial_rows):
    """Thresholds where few rows have entries on both sides are summed on the gathered rows, those where most
    do on every row at once: both equal the direct comparison, bit for bit."""
    g = torch.Generator().manual_seed(partial_rows)
    p = torch.full((24, 16), 0.5)
    p[:partial_rows] = torch.rand(partial_rows, 16, generator=g)  # these rows straddle every threshold below
    mask = torch.rand(24, 16, generator=g) > 0.1
    eps = [0.2, 0.5, 0.7]
    _assert_threshold_sums_are_direct(p, mask, eps)


def test_counts_above_by_blocks_equal_one_comparison_per_threshold():
    """Rows whose width is a multiple of ``BLOCK`` are first looked at block by block (only blocks whose largest
    entry passes are compared); sparse and dense entries, a NaN (the plain comparison then) and a row of zeros."""
    from cocos.losses.counts import BLOCK

    g = torch.Generator().manual_seed(3)
    w = torch.rand(4, 6, 3 * BLOCK, generator=g) ** 12  # most entries tiny, a few above the thresholds
    w[0, 0] = 0.0
    w[1, 2, :BLOCK] = 0.5  # a block where every entry passes
    w[2] = 0.0  # blocks with one entry just above the smallest threshold, or none
    w[2, :, 5] = torch.tensor([1.5e-3, 1e-3, 0.0, 3e-3, 0.3, 0.06])
    eps = [0.05, 1e-3, 0.2, 0.05]
    for x in (w, torch.where(w > 0.9, torch.nan, w), w.double()):
        for e, count in zip(eps, counts_above(x, eps), strict=True):
            assert torch.equal(count, (x > e).sum(-1))


def test_threshold_sums_of_negative_and_infinite_entries_equal_one_comparison_per_threshold():
    """Entries below zero and an infinite one (outside the mask, where ``p * mask`` would be NaN): the sums
    compare directly, as ``where`` does, and equal it bit for bit."""
    g = torch.Generator().manual_seed(5)
    p = torch.randn(6, 32, generator=g)
    mask = torch.rand(6, 32, generator=g) > 0.3
    eps = [0.0, 0.1, 0.5, 2.0]
    for x in (p, torch.where(~mask & (torch.arange(32) == 3), torch.inf, p), p.abs() - 0.2):
        _assert_threshold_sums_are_direct(x, mask, eps)


def test_nanmean_and_stacked_companions_equal_their_formulas_bit_for_bit():
    from cocos.losses.counts import COMPANIONS, companion_values, nanmean

    g = torch.Generator().manual_seed(6)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(5, 9, 300, generator=g, dtype=dtype) * 1e3
        x[torch.rand(x.shape, generator=g) < 0.3] = torch.nan
        x[1, 2] = torch.nan
        ok = ~torch.isnan(x)
        want = torch.where(ok, x, 0.0).sum(-1) / ok.sum(-1)
        assert torch.equal(torch.isnan(nanmean(x)), torch.isnan(want))
        assert torch.equal(nanmean(x).nan_to_num(7.0), want.nan_to_num(7.0))
    w = torch.rand(3, 10, 50, generator=g) ** 3
    w[0, :4] = 0.0  # queries without weight: NaN
    got = companion_values(w)
    for r in range(3):
        for q in range(10):
            row = w[r, q][None].double()
            if float(row.sum()) == 0:
                assert all(bool(torch.isnan(got[k][r, q])) for k in COMPANIONS)
                continue
            u = w[r, q][None] / w[r, q].sum()
            h = -(u.clamp(min=torch.finfo(u.dtype).tiny).log() * u).sum(-1)
            want = {"N_eff": torch.exp(h), "N_invsimpson": 1.0 / (u * u).sum(-1), "top1_share": u.amax(-1)}
            for k in COMPANIONS:
                assert float(got[k][r, q]) == float(want[k].double()), (k, r, q)


def test_triplet_sh_counts_and_companions_from_the_largest_hinge_equal_those_of_its_one_hot_violations():
    from cocos.losses.counts import COMPANIONS, companion_values
    from cocos.losses.triplet import TripletSHCounter

    g = torch.Generator().manual_seed(7)
    scores = torch.randn(4, 8, 8, generator=g) * 0.3
    pos = torch.eye(8, dtype=torch.bool).expand(4, 8, 8)
    neg = ~pos & (torch.rand(4, 8, 8, generator=g) > 0.1)
    neg[0, 0] = False  # a query without negatives
    scores[1, 2], neg[1, 2] = 0.0, False  # a query whose largest hinge is 0 exactly: no violation
    scores[1, 2, 2], scores[1, 2, 5], neg[1, 2, 5] = 0.5, 0.25, True
    view = QueryView(scores=scores, pos=pos, neg=neg, direction="i2t", group_size=1)
    counter = TripletSHCounter(margin=0.25)
    got = counter._per_query(view)
    v = counter.violations(view)  # the one-hot rows of the first hardest negative, where it violates
    assert int(v.sum()) > 0 and int((v.sum(-1) == 0).sum()) > 0  # both kinds of query occur
    assert torch.equal(got["C_q"], v.sum(-1))
    want = companion_values(v)
    for k in COMPANIONS:
        assert torch.equal(got[k].nan_to_num(-1.0), want[k].nan_to_num(-1.0)), k


@pytest.mark.parametrize("empty_rows", [0.1, 0.8])
def test_companions_of_binary_weights_per_query_equal_the_elementwise_ones_bit_for_bit(empty_rows):
    """0/1 weights (the triplet violations): ``u log u`` and ``u^2`` once per query, spread by the weights, equal
    the elementwise computation bit for bit; rows without weight are NaN (some rows gathered, or most)."""
    from cocos.losses.counts import COMPANIONS, companion_values

    g = torch.Generator().manual_seed(8)
    for k in (7, 128, 131):
        v = (torch.rand(6, 33, k, generator=g) < torch.rand(6, 33, 1, generator=g)).to(torch.float64)
        v[torch.rand(6, 33, generator=g) < empty_rows] = 0.0
        v[0, 0, :] = 0.0
        v[0, 1, :] = 0.0
        v[0, 1, 3] = 1.0  # one violation: u = 1
        slow = companion_values(v)
        for fast in (companion_values(v, binary=True), companion_values(v > 0, binary=True),
                     companion_values(v.transpose(-1, -2) > 0, binary=True)):
            want = slow if fast["N_eff"].shape == slow["N_eff"].shape else companion_values(v.transpose(-1, -2))
            for key in COMPANIONS:
                assert torch.equal(fast[key].nan_to_num(-1.0), want[key].nan_to_num(-1.0)), (k, key)
        assert torch.equal(torch.isnan(companion_values(v > 0, binary=True)["N_eff"]), v.sum(-1) == 0)


def test_mode_rows_are_the_rows_whose_masks_differ_between_the_modes():
    from cocos.data.layout import BatchLayout

    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 12, (5, 10), generator=g)  # repeated images within batches
    ids[0] = torch.arange(10)  # a batch without
    for layout in (BatchLayout.build(10, 10, torch.arange(10), image_ids=ids),
                   BatchLayout.build(10, 20, torch.arange(20) // 2, image_ids=ids)):
        for d in ("i2t", "t2i"):
            (p1, n1), (p2, n2) = layout.masks(d, False), layout.masks(d, True)
            want = ((p1 != p2) | (n1 != n2)).any(-1)
            assert want.any() and not want.all()
            assert torch.equal(layout.mode_rows(d), want)
            assert p1 is p2  # one positives tensor for both modes


@pytest.mark.parametrize("empty_rows", [0.1, 0.8])
def test_companions_and_threshold_sums_from_given_sums_and_maxima_equal_their_own(empty_rows):
    """NT-Xent hands its weights' row sums and maxima to both: the largest share from them (largest / total) and
    the sums and counts equal what each computes itself, bit for bit."""
    from cocos.losses.counts import COMPANIONS, companion_rows, companion_values, thresholded_sums_stacked

    g = torch.Generator().manual_seed(10)
    p = torch.rand(4, 9, 128, generator=g) ** 6
    mask = torch.rand(4, 9, 128, generator=g) > 0.2
    mask[torch.rand(4, 9, generator=g) < empty_rows] = False
    w = torch.where(mask, p, 0.0)
    total, largest = w.sum(-1), w.amax(-1)
    given = dict(zip(COMPANIONS, companion_rows(w, total=total, largest=largest).unbind(0), strict=True))
    own = companion_values(w)
    for key in COMPANIONS:
        assert torch.equal(given[key].nan_to_num(-1.0), own[key].nan_to_num(-1.0)), key
    eps = [0.001, 0.01, 0.1, 0.5, 0.7, 0.9]  # some with few rows on both sides: those rows alone are summed
    for a, b in zip(thresholded_sums_stacked(p, mask, eps, masked=w, masked_sum=total, masked_max=largest),
                    thresholded_sums_stacked(p, mask, eps), strict=True):
        assert torch.equal(a, b)


def test_counts_above_from_the_column_sums_equal_one_comparison_per_threshold():
    """SmoothAP's counts over anchors and candidates compare only the columns whose sum over the anchors passes;
    a NaN makes it compare everything."""
    from cocos.losses.counts import counts_above_summed

    g = torch.Generator().manual_seed(11)
    w = torch.rand(3, 7, 5, 40, generator=g) ** 14  # sparse: few entries above the thresholds
    w[0, 0, :, 3] = torch.tensor([0.0, 0.0011, 0.0, 0.0, 0.0])  # one entry just above, alone in its column
    w[1, 2] = 0.0
    eps = [0.01, 0.001, 0.2, 0.01]
    for x in (w, w[..., :1, :], torch.where(w > 0.9, torch.nan, w), w.double()):
        x_sum = x.sum(-2)
        for e, count in zip(eps, counts_above_summed(x, x_sum, eps), strict=True):
            assert torch.equal(count, (x > e).sum((-1, -2))), e


def test_pair_layouts_of_every_chunk_share_the_positives_computed_once():
    """The positives do not depend on the batches' images: every chunk's layout (``with_image_ids``) shares the
    base layout's indices, which equal those of the chunk's own masks; the same-image pairs are the chunk's."""
    from cocos.counting import engine
    from cocos.data.layout import BatchLayout, positive_index

    base = BatchLayout.build(6, 6, torch.arange(6))
    ids = [torch.tensor([[0, 1, 2, 3, 4, 5], [7, 7, 1, 2, 3, 4]]), torch.tensor([[9, 8, 9, 8, 1, 2]])]
    layouts = [base.with_image_ids(i) for i in ids]
    for d in ("i2t", "t2i"):
        for layout in layouts:
            assert layout.positive_index(d) is base.positive_index(d)
            want = positive_index(layout.masks(d)[0])
            assert all(torch.equal(a.expand_as(b), b) for a, b in zip(layout.positive_index(d), want, strict=True))
    assert [int(x.same_image().sum()) for x in layouts] == [2, 4]

    seen = []
    views = engine._views

    def spy(layout, *args, **kw):
        seen.append(layout)
        return views(layout, *args, **kw)

    emb = EmbeddingSet.from_arrays(*_world(n=12, k=5, seed=6))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "_views", spy)
        count_embeddings(emb, ["triplet"], batch_size=8, chunk=2, modes=MODES)
    assert len(seen) > 2 and len({id(x.positive_index("i2t")[0]) for x in seen}) == 1


def test_any_along_is_any():
    from cocos.data.layout import any_along

    g = torch.Generator().manual_seed(12)
    masks = [torch.rand(2, 5, 7, generator=g) > 0.9, (torch.rand(2, 7, 5, generator=g) > 0.95).transpose(-1, -2),
             torch.zeros(3, 4, dtype=torch.bool), torch.zeros(0, 3, dtype=torch.bool), torch.zeros(3, 0, dtype=torch.bool)]
    for m in masks:
        assert bool(any_along(m)) == bool(m.any())
        for dim in (-1, -2):
            assert torch.equal(any_along(m, dim), m.any(dim)), (m.shape, dim)


def test_counts_above_without_entries_or_passing_ones_and_with_a_nan_at_any_width():
    from cocos.losses.counts import counts_above_summed

    eps = [0.1, 0.01]
    for w in (torch.zeros(2, 3, 64), torch.zeros(2, 3, 40), torch.zeros(0, 3, 64), torch.zeros(2, 0, 64)):
        for count in counts_above(w, eps):
            assert torch.equal(count, torch.zeros(w.shape[:-1], dtype=torch.int64))
    for w in (torch.zeros(0, 5, 64), torch.rand(3, 5, 40)):
        for e, count in zip(eps, counts_above_summed(w, w.sum(-2), eps), strict=True):
            assert torch.equal(count, (w > e).sum((-1, -2)))
    x = torch.rand(3, 4, 40, generator=torch.Generator().manual_seed(13))  # a width that is not a multiple of 64
    x[1, 2, 7] = torch.nan  # hides nothing: the other entries of its row still count
    for e, count in zip(eps, counts_above(x, eps), strict=True):
        assert torch.equal(count, (x > e).sum(-1))
