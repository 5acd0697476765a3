"""Counting one big batch in blocks of queries (cocos.counting.blocks): a counter that says it may be blocked gives
its batch values from its per-query values exactly as its whole count does (Counter.batch_of), and a batch counted
in blocks equals the whole count bit for bit; a counter that does not say so is counted whole."""

from __future__ import annotations

import pytest
import torch

import cocos.counting.blocks as blocks
from cocos.counting import COMPANIONS, count_queries, get_counter
from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.objectives import Objective

PAPER = ("triplet", "triplet_sh", "ntxent", "smoothap")


def batch(n_images=12, k=3, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_images, d, generator=g), torch.randn(n_images * k, d, generator=g)


def assert_same(got: dict, want: dict, close=()) -> None:
    """Equal bit for bit (NaN where NaN), but ``close`` to float32 rounding (SmoothAP's companions: its float32
    sigmoid rounds an element of the vectorised loop's tail differently in a block)."""
    assert set(got) == set(want)
    for key in want:
        a, b = got[key].to(torch.float64), want[key].to(torch.float64)
        if key in close:
            assert torch.allclose(a, b, rtol=1e-6, atol=0, equal_nan=True), key
        else:
            assert torch.equal(a, b) or (torch.isnan(a).all() and torch.isnan(b).all()), key


@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize("loss", PAPER)
def test_batch_of_the_per_query_values_is_the_count_s_batch(loss, compat):
    images, captions = batch()
    counter = get_counter(loss)
    scores, layout = batch_similarity(images, captions)
    for direction in DIRECTIONS:
        if not counter.blocks(direction, compat):
            continue
        count = counter.count(layout.view(scores, direction, compat))
        assert_same(counter.batch_of(count.per_query, compat), count.batch)


def test_which_counters_say_they_may_be_blocked():
    said = {(loss, d, compat): get_counter(loss).blocks(d, compat)
            for loss in PAPER for d in DIRECTIONS for compat in (False, True)}
    assert all(v for (loss, d, compat), v in said.items() if not compat)
    # the published t2i layouts read more than the query's own row: Triplet groups by negative image, SmoothAP
    # takes its anchors from the query's index
    assert {key for key, v in said.items() if not v} == {("triplet", "t2i", True), ("smoothap", "t2i", True)}
    plugin = Objective(name="plug", label="Plug", layout="pair", direction_loss=lambda view: view.scores.sum())
    assert not get_counter(plugin).blocks("i2t", False)  # a counter that does not say is counted whole
    # a family of hinge terms may read more than its query's row (here each candidate's column maximum): its
    # TermsCounter is not blocked, else a big batch's count would change with the block size
    column = Objective(name="colmax", label="Column max", layout="pair", direction_loss=None, terms=lambda view, margin=0.2: (
        margin + view.scores - view.scores.amax(-2, keepdim=True)).clamp(min=0)[..., None, :],
        defaults={"margin": 0.2})
    assert not any(get_counter(column).blocks(d, c) for d in DIRECTIONS for c in (False, True))
    images, captions = batch(n_images=24, k=1)
    whole = count_queries(images, captions, column)
    got = blocks.count_batch_values(images, captions, column, budget=3000)
    for d in DIRECTIONS:
        assert_same(got[d], dict(whole[d].batch))


@pytest.mark.parametrize("compat", [False, True])
@pytest.mark.parametrize("loss", PAPER)
@pytest.mark.parametrize("k", [1, 3])
def test_a_batch_counted_in_blocks_equals_the_whole_count(loss, compat, k):
    if k == 1 and loss == "smoothap":
        pytest.skip("SmoothAP counts ranking batches")
    images, captions = batch(k=k, seed=k)
    ids = torch.arange(len(images)) // 2 if k == 1 else None  # same-image rows in a pair batch
    whole = count_queries(images, captions, loss, compat=compat, image_ids=ids)
    got = blocks.count_batch_values(images, captions, loss, compat=compat, image_ids=ids, budget=3000)
    close = COMPANIONS if loss == "smoothap" else ()  # the counts themselves: bit for bit
    for d in DIRECTIONS:
        assert_same(got[d], dict(whole[d].batch), close)


def test_blocks_are_many_and_every_block_sees_all_candidates(monkeypatch):
    images, captions = batch(n_images=24, k=3)
    shapes: dict[str, list] = {}
    original = blocks.QueryView
    monkeypatch.setattr(blocks, "QueryView", lambda **kw: shapes.setdefault(kw["direction"], []).append(
        tuple(kw["scores"].shape)) or original(**kw))
    blocks.count_batch_values(images, captions, "ntxent", budget=3000)
    assert len(shapes["i2t"]) > 3 and all(k == 72 for _, k in shapes["i2t"]) and sum(q for q, _ in shapes["i2t"]) == 24
    assert len(shapes["t2i"]) > 3 and all(k == 24 for _, k in shapes["t2i"]) and sum(q for q, _ in shapes["t2i"]) == 72
    shapes.clear()
    blocks.count_batch_values(images, captions, "ntxent")  # within the default budget: whole, no block views
    assert shapes == {}
