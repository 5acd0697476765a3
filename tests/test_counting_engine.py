"""The stacked dataset engine equals count_batch on the same seeded batches; aggregation; eps sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cocos.counting import count_batch
from cocos.counting.aggregate import summarise
from cocos.counting.engine import EmbeddingSet, count_embeddings
from cocos.data.samplers import pair_batches, ranking_batches
from cocos.errors import CocosError


def _world(n=60, k=5, d=12, noise=0.9, seed=0):
    g = np.random.default_rng(seed)
    images = g.normal(size=(n, d))
    captions = np.repeat(images, k, 0) + noise * g.normal(size=(n * k, d))
    return images, captions


@pytest.mark.parametrize("compat", [False, True])
def test_engine_matches_count_batch_on_the_same_batches(compat):
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, batch_size=16, seed=5, compat=compat, chunk=3)
    # pair batches: rebuild them with the public sampler
    for b, (cap, img) in enumerate(pair_batches(emb.caption_image, 16, 5)):
        for loss in ("triplet", "triplet_sh", "ntxent"):
            ref = count_batch(images[img], captions[cap], loss, compat=compat,
                              caption_image=np.arange(16), image_ids=img)
            for d, stats in ref.items():
                for stat, value in stats.items():
                    got = run.batch_stats[loss][d][stat][b]
                    assert got == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), (loss, d, stat)
    for b, img in enumerate(ranking_batches(len(images), 16, 5)):
        cap = (img[:, None] * 5 + np.arange(5)).reshape(-1)
        ref = count_batch(images[img], captions[cap], "smoothap", compat=compat)
        for d, stats in ref.items():
            for stat, value in stats.items():
                got = run.batch_stats["smoothap"][d][stat][b]
                assert got == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), (d, stat)
    assert run.n_batches == {"pair": 300 // 16, "ranking": 60 // 16}


def test_summary_is_mean_and_population_std_with_skipped_batches():
    values = np.array([1.0, 2.0, np.nan, 4.0])
    s = summarise(values)
    assert s["mean"] == pytest.approx(7 / 3)
    assert s["std"] == pytest.approx(np.std([1.0, 2.0, 4.0]))  # ddof = 0
    assert (s["n"], s["n_skipped"]) == (3, 1)
    assert summarise(np.array([np.nan]))["mean"] is None


def test_same_seed_same_numbers_other_seed_other_batches():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    a = count_embeddings(emb, ["ntxent"], batch_size=16, seed=1).summary()
    b = count_embeddings(emb, ["ntxent"], batch_size=16, seed=1).summary()
    c = count_embeddings(emb, ["ntxent"], batch_size=16, seed=2).summary()
    assert a == b
    assert a != c


def test_eps_sweep_at_the_default_matches_the_main_count():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, ["ntxent", "smoothap", "triplet"], batch_size=16, sweep_eps=[0.001, 0.01, 0.1])
    assert "triplet" not in run.sweep  # no threshold to sweep
    for loss, stat in (("ntxent", "C_qv-"), ("smoothap", "C_q")):
        for d in ("i2t", "t2i"):
            main = run.batch_stats[loss][d][stat]
            np.testing.assert_array_equal(run.sweep[loss][d]["0.01"][stat], main)
            lo = run.sweep[loss][d]["0.001"][stat]
            hi = run.sweep[loss][d]["0.1"][stat]
            if loss == "ntxent":  # C_qv- is a plain mean over all queries: monotone per batch
                assert (lo >= main).all() and (main >= hi).all()


def test_per_query_values_are_kept_for_every_query():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, ["triplet_sh", "smoothap"], batch_size=16)
    assert run.per_query["triplet_sh"]["i2t"]["C_q"].shape == (18 * 16,)
    assert run.per_query["smoothap"]["t2i"]["C_q"].shape == (3 * 16 * 5,)


@pytest.mark.parametrize("make, message", [
    (lambda i, c: (i[:, :5], c), "dimension"),
    (lambda i, c: (i, c[:-1]), "not a multiple"),
    (lambda i, c: (np.where(np.arange(i.size).reshape(i.shape) == 7, np.nan, i), c), "NaN"),
    (lambda i, c: (i, np.where(np.arange(c.shape[0])[:, None] == 3, 0.0, c)), "zero vector"),
])
def test_bad_embeddings_raise_one_clear_error(make, message):
    images, captions = make(*_world())
    with pytest.raises(CocosError, match=message) as err:
        EmbeddingSet.from_arrays(images, captions)
    assert "\n" not in str(err.value)


def test_batch_larger_than_the_data():
    images, captions = _world(n=10)
    emb = EmbeddingSet.from_arrays(images, captions)
    with pytest.raises(CocosError, match="larger than the data"):
        count_embeddings(emb, ["smoothap"], batch_size=11)


def test_irregular_captions_work_for_pair_batches_but_not_ranking():
    images, captions = _world(n=10, k=2)
    caption_image = np.r_[np.arange(10), np.zeros(10, dtype=int)]  # image 0 has 11 captions
    emb = EmbeddingSet.from_arrays(images, captions, caption_image)
    run = count_embeddings(emb, ["triplet"], batch_size=4)
    assert not math.isnan(run.summary()["triplet"]["i2t"]["C_B"]["mean"])
    with pytest.raises(CocosError, match="same number of captions"):
        count_embeddings(emb, ["smoothap"], batch_size=4)
