"""One spec per loss family: a family registered in one place flows through every part of cocos."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting import EmbeddingSet, count_batch, count_embeddings
from cocos.errors import CocosError
from cocos.losses.functional import triplet_direction
from cocos.objectives import OBJECTIVES, Note, Objective, get_loss, get_objective, register, unregister
from cocos.pipelines.count import count_file
from cocos.pipelines.folder import write_results_folder
from cocos.report.merge import build_tables, group_results
from cocos.report.tables import to_latex, to_markdown
from cocos_cli.main import app

runner = CliRunner()


def _world(n=48, k=5, d=10, noise=0.9, seed=0):
    g = np.random.default_rng(seed)
    images = g.normal(size=(n, d))
    captions = np.repeat(images, k, 0) + noise * g.normal(size=(n * k, d))
    return images, captions


def squared_hinge(view, margin=0.1):
    """A throwaway loss: squared hinge over all negatives (no closed-form counter: counted generically)."""
    from cocos.losses.functional import triplet_hinge

    return triplet_hinge(view, margin).clamp(min=0).pow(2).sum()


THROWAWAY = Objective(name="sqhinge", label="Squared hinge", direction_loss=squared_hinge,
                      defaults={"margin": 0.1}, color="#9467bd",
                      notes=(Note("The squared hinge is a test family."),))


@pytest.fixture
def registered():
    register(THROWAWAY)
    yield THROWAWAY
    unregister(THROWAWAY.name)


def test_a_family_registered_once_flows_through_losses_counting_engine_tables_and_figures(registered, tmp_path):
    images, captions = _world()
    # the training loss
    loss = get_loss("sqhinge", margin=0.3)
    assert loss.params() == {"margin": 0.3} and loss.batch_layout == "pair"
    value = loss(torch.tensor(images[:8]), torch.tensor(captions[:40:5]))
    assert value.item() > 0
    # one batch: the generic counter counts the negatives with a positive hinge (the squared hinge's gradient)
    out = count_batch(images[:8], captions[:40:5], "sqhinge", margin=0.3, eps=0.0)
    ref = count_batch(images[:8], captions[:40:5], "triplet", margin=0.3)
    for d in ("i2t", "t2i"):
        assert out[d]["C_B"] == ref[d]["C_B"] and out[d]["C_0"] == ref[d]["C_0"]
    # the engine, its tidy frame and results
    np.savez(tmp_path / "e.npz", images=images, captions=captions)
    counted = count_file(tmp_path / "e.npz", ["triplet", "sqhinge"], batch_size=8, name="toy", label="enc")
    assert set(counted.run.to_frame().loss) == {"triplet", "sqhinge"}
    entry = counted.results.stats["sqhinge"]["i2t"]["C_q"]
    assert entry["n"] + entry["n_skipped"] == 240 // 8
    # the tables: a table of its own, with its label and its note
    groups, _ = group_results([counted.results])
    tables = build_tables(groups, counters="all")
    titles = [t.title for t in tables]
    assert any("COCOS w.r.t. query q, Squared hinge" in t for t in titles)
    own = next(t for t in tables if "Squared hinge" in t.title)
    assert [r.labels for r in own.rows] == [("Squared hinge",)]
    assert any("test family" in f.text for f in own.footnotes)
    assert "Squared hinge" in to_markdown(own) and "Squared hinge" in to_latex(own)
    # the figures: the count distribution has a panel in the family's colour
    folder = tmp_path / "out"
    write_results_folder(counted.results, counted.run, folder)
    queries = counted.run.to_frame("query")
    assert "sqhinge" in set(queries["loss"])
    from cocos.report.figures import plot_count_distributions

    fig = plot_count_distributions(queries[queries["mode"] == "corrected"], tmp_path / "fig")
    assert ("sqhinge", "i2t") in fig.data
    assert json.loads((folder / "results.json").read_text())["counting"]["losses"] == ["triplet", "sqhinge"]
    # the CLI knows it
    res = runner.invoke(app, ["losses"])
    assert "sqhinge" in res.output and "generic (autograd)" in res.output
    res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "-l", "sqhinge", "-p", "margin=0.25",
                              "--batch-size", "8", "--no-progress", "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r.json").read_text())["counting"]["params"]["sqhinge"]["margin"] == 0.25


def test_an_unregistered_name_is_refused_everywhere_with_one_line():
    for call in (lambda: get_loss("sqhinge"), lambda: count_batch(np.eye(3), np.eye(3), "sqhinge"),
                 lambda: get_objective("sqhinge")):
        with pytest.raises(CocosError, match="unknown loss 'sqhinge'") as err:
            call()
        assert "\n" not in str(err.value)


def test_spec_rejects_inconsistent_definitions():
    with pytest.raises(CocosError, match="main statistic"):
        Objective(name="x", label="X", direction_loss=squared_hinge, stats=("C_q",), main_stat="C_qv-")
    with pytest.raises(CocosError, match="layout"):
        Objective(name="x", label="X", direction_loss=squared_hinge, layout="triples")
    with pytest.raises(CocosError, match="registered already"):
        register(Objective(name="triplet", label="Mine", direction_loss=squared_hinge))
    with pytest.raises(CocosError, match="takes no parameter tau"):
        get_loss("triplet", tau=0.1)


def test_a_custom_triplet_under_another_name_gives_the_closed_form_exactly():
    """A spec with the Triplet maths and no counter is counted by autograd and equals the closed form."""
    images, captions = _world()
    emb = EmbeddingSet.from_arrays(images, captions)
    mine = Objective(name="my_triplet", label="My triplet", direction_loss=partial(triplet_direction, hardest=False),
                     defaults={"margin": 0.2})
    assert mine.counter is None
    run = count_embeddings(emb, [mine, "triplet"], batch_size=16, seed=3, modes=["corrected"])
    f = run.to_frame()
    for d in ("i2t", "t2i"):
        for stat in ("C_q", "C_B", "C_0"):
            a = f[(f.loss == "my_triplet") & (f.direction == d) & (f.stat == stat)].sort_values("batch").value
            b = f[(f.loss == "triplet") & (f.direction == d) & (f.stat == stat)].sort_values("batch").value
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())
        assert run.stats()["my_triplet"][d]["C_q"] == run.stats()["triplet"][d]["C_q"]


def test_a_whole_batch_callable_counts_the_whole_gradient_rows_for_i2t_columns_for_t2i():
    """``fn(images, captions, caption_image)``: dL/dS mixes both directions; the count is, by hand, v_i2t OR v_t2i."""
    images, captions = _world(n=40)
    triplet = get_loss("triplet")

    def my_loss(im, ca, caption_image=None):
        return triplet(im, ca, caption_image)

    emb = EmbeddingSet.from_arrays(images, captions)
    run = count_embeddings(emb, [my_loss], batch_size=8, seed=1, eps=0.0)
    assert run.losses == ["my_loss"]
    q = run.to_frame("query")
    plan = run.plans["pair"]
    for b in range(plan.n_batches):
        im = torch.nn.functional.normalize(torch.tensor(images[plan.images[b]]), dim=-1)
        ca = torch.nn.functional.normalize(torch.tensor(captions[plan.captions[b]]), dim=-1)
        s = (im @ ca.T).numpy()
        ids = plan.images[b]
        neg = ids[:, None] != ids[None, :]  # same-image pairs are excluded (corrected mode)
        v_i2t = (0.2 + s - np.diag(s)[:, None] > 0) & neg  # query image row i, negative caption c
        v_t2i = (0.2 + s - np.diag(s)[None, :] > 0) & neg  # query caption c, negative image row i
        either = v_i2t | v_t2i
        got = q[(q.direction == "i2t") & (q.batch == b)].sort_values("query").C_q.to_numpy()
        np.testing.assert_array_equal(got, either.sum(1))
        got = q[(q.direction == "t2i") & (q.batch == b)].sort_values("query").C_q.to_numpy()
        np.testing.assert_array_equal(got, either.sum(0))


def test_callables_and_specs_are_accepted_by_count_batch():
    images, captions = _world(n=8)
    mine = Objective(name="my_sh", label="SH", direction_loss=partial(triplet_direction, hardest=True),
                     defaults={"margin": 0.2})
    a = count_batch(images, captions[::5], mine, eps=0.0)
    b = count_batch(images, captions[::5], "triplet_sh")
    for d in ("i2t", "t2i"):
        assert a[d]["C_B"] == b[d]["C_B"] and a[d]["C_0"] == b[d]["C_0"]
    assert "my_sh" not in OBJECTIVES  # counting a spec does not register it


def test_a_loss_that_is_not_finite_or_takes_a_registered_name_is_refused():
    images, captions = _world(n=16)
    emb = EmbeddingSet.from_arrays(images, captions)

    def broken(im, ca, caption_image=None):
        return torch.sqrt(im @ ca.T - 2).sum()  # NaN everywhere

    with pytest.raises(CocosError, match="not finite") as err:
        count_embeddings(emb, [broken], batch_size=8)
    assert "\n" not in str(err.value)

    def triplet(im, ca, caption_image=None):
        return get_loss("triplet")(im, ca, caption_image)

    with pytest.raises(CocosError, match="name of a registered loss"):
        count_embeddings(emb, [triplet], batch_size=8)


def test_compat_triplet_t2i_rows_are_per_negative_image_with_matching_companions():
    images, captions = _world(n=32)
    run = count_embeddings(EmbeddingSet.from_arrays(images, captions), ["triplet"], batch_size=8,
                           modes=["compat"])
    q = run.to_frame("query")
    t2i = q[q.direction == "t2i"]
    assert (t2i.item_kind == "image").all()
    has = t2i.C_q > 0  # for 0/1 violations the effective number is the count itself
    np.testing.assert_allclose(t2i.N_eff[has], t2i.C_q[has], rtol=1e-12)
    assert t2i.N_eff[~has].isna().all()
