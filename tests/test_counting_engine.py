"""The stacked dataset engine equals count_batch on the same seeded batches; aggregation; eps sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cocos.counting import EmbeddingSet, count_batch, count_embeddings, count_queries
from cocos.counting.engine import summarise
from cocos.data.samplers import pair_batches, ranking_batches
from cocos.errors import CocosError


def _world(n=60, k=5, d=12, noise=0.9, seed=0):
    g = np.random.default_rng(seed)
    images = g.normal(size=(n, d))
    captions = np.repeat(images, k, 0) + noise * g.normal(size=(n * k, d))
    return images, captions


def _batch_value(run, loss, d, mode, stat, b):
    f = run.to_frame()
    row = f[(f.loss == loss) & (f.direction == d) & (f["mode"] == mode) & (f.stat == stat) & (f.batch == b)]
    own = row[row.eps.isna() | (row.eps == run.params[loss].get("eps", -1))]
    assert len(own) == 1, (loss, d, mode, stat, b, len(own))
    return float(own.value.iloc[0])


def test_engine_matches_count_batch_on_the_same_batches_in_both_modes():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, batch_size=16, seed=5, modes=["corrected", "compat"], chunk=3)
    assert set(run.to_frame().columns) == {"loss", "direction", "mode", "eps", "batch", "stat", "value"}
    for compat, mode in ((False, "corrected"), (True, "compat")):
        # pair batches: rebuild them with the public sampler
        for b, (cap, img) in enumerate(pair_batches(emb.caption_image, 16, 5)):
            for loss in ("triplet", "triplet_sh", "ntxent"):
                ref = count_batch(images[img], captions[cap], loss, compat=compat,
                                  caption_image=np.arange(16), image_ids=img)
                for d, stats in ref.items():
                    for stat, value in stats.items():
                        got = _batch_value(run, loss, d, mode, stat, b)
                        assert got == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), (loss, d, stat)
        for b, img in enumerate(ranking_batches(len(images), 16, 5)):
            cap = (img[:, None] * 5 + np.arange(5)).reshape(-1)
            ref = count_batch(images[img], captions[cap], "smoothap", compat=compat)
            for d, stats in ref.items():
                for stat, value in stats.items():
                    got = _batch_value(run, "smoothap", d, mode, stat, b)
                    assert got == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), (d, stat)
    assert run.n_batches == {"pair": 300 // 16, "ranking": 60 // 16}


def test_summary_is_a_groupby_of_the_tidy_frame():
    images, captions = _world()
    run = count_embeddings(EmbeddingSet.from_arrays(images, captions), ["triplet", "ntxent"], batch_size=16)
    f = run.to_frame()
    s = run.summary().set_index(["loss", "direction", "mode", "stat"])
    for (loss, d, stat), part in f.groupby(["loss", "direction", "stat"]):
        values = part.value.to_numpy()
        ok = values[~np.isnan(values)]
        row = s.loc[(loss, d, "corrected", stat)]
        assert row["mean"] == pytest.approx(ok.mean()) and row["std"] == pytest.approx(np.std(ok))  # ddof 0
        assert (row["n"], row["n_skipped"]) == (len(ok), len(values) - len(ok))
    nested = run.stats("corrected")
    assert nested["ntxent"]["i2t"]["C_qv-"]["mean"] == pytest.approx(s.loc[("ntxent", "i2t", "corrected", "C_qv-")]["mean"])


def test_summary_is_mean_and_population_std_with_skipped_batches():
    frame = pd.DataFrame({"loss": "x", "direction": "i2t", "mode": "corrected", "eps": np.nan, "batch": range(4),
                          "stat": "C_q", "value": [1.0, 2.0, np.nan, 4.0]})
    s = summarise(frame).iloc[0]
    assert s["mean"] == pytest.approx(7 / 3)
    assert s["std"] == pytest.approx(np.std([1.0, 2.0, 4.0]))  # ddof = 0
    assert (s["n"], s["n_skipped"]) == (3, 1)


def test_same_seed_same_numbers_other_seed_other_batches():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    a = count_embeddings(emb, ["ntxent"], batch_size=16, seed=1).summary()
    b = count_embeddings(emb, ["ntxent"], batch_size=16, seed=1).summary()
    c = count_embeddings(emb, ["ntxent"], batch_size=16, seed=2).summary()
    pd.testing.assert_frame_equal(a, b)
    assert not a["mean"].equals(c["mean"])


def test_eps_sweep_at_the_default_matches_the_main_count():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, ["ntxent", "smoothap", "triplet"], batch_size=16, sweep_eps=[0.001, 0.01, 0.1])
    f = run.to_frame()
    assert f[f.loss == "triplet"].eps.isna().all()  # no threshold to sweep
    sweep = run.sweep()
    assert "triplet" not in sweep and list(sweep["ntxent"]["i2t"]) == ["0.001", "0.01", "0.1"]
    for loss, stat in (("ntxent", "C_qv-"), ("smoothap", "C_q")):
        for d in ("i2t", "t2i"):
            main = run.stats()[loss][d][stat]
            assert sweep[loss][d]["0.01"][stat] == main
            per_batch = {e: f[(f.loss == loss) & (f.direction == d) & (f.stat == stat) & (f.eps == e)]
                         .sort_values("batch").value.to_numpy() for e in (0.001, 0.01, 0.1)}
            if loss == "ntxent":  # C_qv- is a plain mean over all queries: monotone per batch
                assert (per_batch[0.001] >= per_batch[0.01]).all() and (per_batch[0.01] >= per_batch[0.1]).all()


def test_per_query_rows_carry_the_item_of_each_query():
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, ["triplet", "triplet_sh", "smoothap"], batch_size=16, seed=2,
                           modes=["corrected", "compat"])
    q = run.to_frame("query")
    plan = run.plans["pair"]
    for loss in ("triplet", "triplet_sh"):
        t2i = q[(q.loss == loss) & (q.direction == "t2i") & (q["mode"] == "corrected")]
        assert len(t2i) == 18 * 16 and t2i.item.is_unique  # every caption at most once per pass
        assert (t2i.item_kind == "caption").all()
        np.testing.assert_array_equal(t2i.sort_values(["batch", "query"]).item.to_numpy(), plan.captions.reshape(-1))
        i2t = q[(q.loss == loss) & (q.direction == "i2t") & (q["mode"] == "corrected")]
        np.testing.assert_array_equal(i2t.sort_values(["batch", "query"]).item.to_numpy(), plan.images.reshape(-1))
    # the compat regrouping of Triplet t2i is per negative image, and says so
    grouped = q[(q.loss == "triplet") & (q.direction == "t2i") & (q["mode"] == "compat")]
    assert (grouped.item_kind == "image").all()
    np.testing.assert_array_equal(grouped.sort_values(["batch", "query"]).item.to_numpy(), plan.images.reshape(-1))
    smooth = q[(q.loss == "smoothap") & (q.direction == "t2i") & (q["mode"] == "corrected")]
    assert len(smooth) == 3 * 16 * 5 and smooth.item.is_unique
    np.testing.assert_array_equal(smooth.sort_values(["batch", "query"]).item.to_numpy(),
                                  run.plans["ranking"].captions.reshape(-1))
    # per-query values agree with count_queries on the same batch
    cap, img = plan.captions[4], plan.images[4]
    ref = count_queries(images[img], captions[cap], "triplet", caption_image=np.arange(16), image_ids=img)
    got = q[(q.loss == "triplet") & (q.direction == "i2t") & (q["mode"] == "corrected") & (q.batch == 4)]
    np.testing.assert_array_equal(got.sort_values("query").C_q.to_numpy(), ref["i2t"].per_query["C_q"].numpy())


def test_smoothap_compat_averages_batches_without_a_contributing_query_as_zero():
    # two clusters far apart: with tau tiny and a high eps nothing contributes in some batches
    g = np.random.default_rng(1)
    images = g.normal(size=(32, 8))
    captions = np.repeat(images, 5, 0) + 0.01 * g.normal(size=(160, 8))
    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, ["smoothap"], batch_size=8, params={"smoothap": {"tau": 0.001}}, eps=0.2,
                           modes=["corrected", "compat"])
    corrected, compat = run.stats("corrected")["smoothap"]["i2t"]["C_q"], run.stats("compat")["smoothap"]["i2t"]["C_q"]
    assert corrected["n_skipped"] > 0 and compat["n_skipped"] == 0
    assert compat["n"] == corrected["n"] + corrected["n_skipped"]
    if corrected["n"]:
        assert compat["mean"] == pytest.approx(corrected["mean"] * corrected["n"] / compat["n"])
    else:
        assert corrected["mean"] is None and compat["mean"] == 0.0


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
    assert run.stats()["triplet"]["i2t"]["C_B"]["mean"] is not None
    with pytest.raises(CocosError, match="same number of captions"):
        count_embeddings(emb, ["smoothap"], batch_size=4)


def test_a_nan_outside_the_statistics_that_may_be_undefined_is_an_error():
    from cocos.counting.engine import _check_defined

    frame = pd.DataFrame({"loss": ["triplet", "triplet", "goal", "goal"], "direction": ["i2t", "t2i", "i2t", "i2t"],
                          "mode": ["corrected"] * 4, "eps": [np.nan] * 4, "batch": [0, 3, 1, 2],
                          "stat": ["C_q", "C_B", "W", "C_B"], "value": [np.nan, 2.0, np.nan, 1.0]})
    _check_defined(frame, {"goal": ("W",)})  # C_q may be undefined; goal declares W
    with pytest.raises(CocosError, match="goal i2t W is not a number in batch 1"):
        _check_defined(frame, {})
    frame.loc[1, "value"] = np.nan
    with pytest.raises(CocosError, match="triplet t2i C_B is not a number in batch 3"):
        _check_defined(frame, {"goal": ("W",)})
