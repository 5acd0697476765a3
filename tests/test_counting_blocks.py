"""Counting one big batch in blocks of queries (cocos.counting.blocks): a counter that says it may be blocked gives
its batch values from its per-query values exactly as its whole count does (Counter.batch_of), and a batch counted
in blocks, each block computing its own similarity rows and masks, equals the whole count bit for bit (float32 on the
CPU; a float32 sigmoid's weights to its rounding; float64 to its rounding) without ever holding a B x M matrix; a
counter that does not say so is counted whole."""

from __future__ import annotations

import pytest
import torch

import cocos.counting.blocks as blocks
from cocos.counting import COMPANIONS, count_queries, get_counter
from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.objectives import Objective, get_objective, names

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
@pytest.mark.parametrize(("loss", "k"), [(loss, k) for loss in PAPER for k in (1, 3)
                                         if not (k == 1 and loss == "smoothap")])  # SmoothAP: ranking batches
def test_a_batch_counted_in_blocks_equals_the_whole_count(loss, compat, k):
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


# Families whose real-valued statistics may differ from the whole count's at float32 rounding when counted in
# blocks (a float32 sigmoid's vectorised tail, cocos.losses.kernels.vectorised_whole): SmoothAP's companions; the
# counts (C_*) are compared bit for bit for every family. A family not named here with its own counter (SigLIP's
# sigmoid weights) is held to float32 rounding in its real values.
EXACT = {"triplet": (), "triplet_sh": (), "ntxent": (), "smoothap": COMPANIONS}


def blocked_families() -> list[str]:
    """Every registered family whose counter may be blocked in both directions in some counting mode."""
    return [n for n in names() if any(all(get_counter(n).blocks(d, c) for d in DIRECTIONS) for c in (False, True))]


def family_batch(loss: str, n_images: int = 30, d: int = 8):
    """A batch of the family's layout, ``n_images`` not a multiple of the block rows (a last block shorter than
    its product's window); pair batches with same-image rows."""
    ranking = get_objective(loss).layout == "ranking"
    images, captions = batch(n_images=n_images, k=3 if ranking else 1, d=d, seed=7)
    return images, captions, None if ranking else torch.arange(n_images) // 2


def assert_blocked_equals_whole(loss: str, images, captions, ids, compat: bool, **kw) -> None:
    whole = count_queries(images, captions, loss, compat=compat, image_ids=ids)
    got = blocks.count_batch_values(images, captions, loss, compat=compat, image_ids=ids, budget=3000, **kw)
    for d in DIRECTIONS:
        want = dict(whole[d].batch)
        close = EXACT.get(loss, [k for k in want if not k.startswith("C_")])
        assert_same(got[d], want, close)


@pytest.mark.parametrize("loss", blocked_families())
def test_every_blocked_counter_equals_the_whole_count_from_its_blocks_own_similarity_rows(loss, monkeypatch):
    images, captions, ids = family_batch(loss)
    products = []
    original = blocks.block_similarity
    monkeypatch.setattr(blocks, "block_similarity", lambda q, c: products.append((len(q), len(c))) or original(q, c))
    for compat in (False, True):
        if all(get_counter(loss).blocks(d, compat) for d in DIRECTIONS):
            assert_blocked_equals_whole(loss, images, captions, ids, compat)
    assert len(products) > 8 and {r for r, _ in products} == {blocks.ROW_ALIGN}  # every product: the same rows
    assert {k for _, k in products} == {len(captions), len(images)}  # each block against all candidates


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(30, 90, 8), (333, 333, 64)])
def test_a_block_s_similarity_rows_are_the_whole_product_s_bits(shape, threads):
    """What the equality above rests on, at one and two threads (MKL splits a product between its threads): a
    product of a multiple of ROW_ALIGN rows gives the bits of those rows of the whole product, at any offset."""
    n_images, n_captions, d = shape
    images, captions = batch(n_images=n_images, k=n_captions // n_images, d=d, seed=n_captions)
    images, captions = blocks.unit_rows(images, captions)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = images @ captions.T
        for rows in (4, 12, 28):
            for a in (5, n_images - rows):
                assert torch.equal(blocks.block_similarity(images[a:a + rows], captions), whole[a:a + rows])
            for a in (7, n_captions - rows):
                assert torch.equal(blocks.block_similarity(captions[a:a + rows], images), whole[:, a:a + rows].T)
    finally:
        torch.set_num_threads(before)


def test_a_float64_batch_in_blocks_equals_the_whole_count_to_float64_rounding():
    # MKL's dgemm may round a block of rows differently from the same rows of the whole product (1e-16)
    images, captions, ids = family_batch("ntxent")
    images, captions = images.double(), captions.double()
    for loss in ("triplet", "ntxent"):
        whole = count_queries(images, captions, loss, image_ids=ids)
        got = blocks.count_batch_values(images, captions, loss, image_ids=ids, budget=3000)
        for d in DIRECTIONS:
            for key, want in whole[d].batch.items():
                assert torch.allclose(got[d][key].double(), want.double(), rtol=1e-12, atol=0, equal_nan=True), key
                if key.startswith("C_"):
                    assert torch.equal(got[d][key], want) or bool(want.isnan()), key


@pytest.mark.parametrize("loss", blocked_families())
def test_blocks_never_hold_a_whole_batch_matrix(loss):
    """Every tensor a torch function or method returns while a big batch is counted in blocks (similarities, masks,
    the counter's temporaries; a TorchFunctionMode sees each call) is a few rows of the B x M matrix, never all of
    it; the whole count, for comparison, makes B x M tensors."""
    from torch.overrides import TorchFunctionMode

    class Largest(TorchFunctionMode):
        numel = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    images, captions, ids = family_batch(loss, n_images=32)
    with Largest():
        blocks.count_batch_values(images, captions, loss, image_ids=ids, budget=3000)
    pairs = len(images) * len(captions)
    assert 0 < Largest.numel < pairs // 2, (Largest.numel, pairs)  # rows x positives x candidates at most
    with Largest():
        count_queries(images, captions, loss, image_ids=ids)
    assert Largest.numel >= pairs
