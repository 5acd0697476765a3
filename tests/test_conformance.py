"""Conformance: every registered loss family (built-in and a plugin-style one) keeps the shared invariants.

For each family, on small pair and ranking batches, both directions, corrected and compat:

* the counter's weights live on the view's negatives only; in corrected mode every
  negative it weighs (above 1e-15) is one where the family's own direction loss has a
  non-zero autograd gradient (the counter counts where the loss pushes, nowhere else;
  the compat counters reproduce the published code's quirks, not the loss);
* the loss's gradient is zero on pairs that are neither positive nor negative
  (excluded same-image pairs, padding);
* in corrected mode a query the counter counts (``C_q > 0``) has a non-zero gradient on
  some negative;
* the family's statistics are in the batch record of both directions;
* the engine's tidy frame has the same columns for every family.
"""

from __future__ import annotations

import pytest
import torch

from cocos.counting import EmbeddingSet, count_embeddings
from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.losses.base import intra_similarities
from cocos.losses.functional import triplet_hinge
from cocos.objectives import OBJECTIVES, Objective, register, unregister


def _squared_hinge(view, margin=0.1):
    return triplet_hinge(view, margin).clamp(min=0).pow(2).sum()


PLUGIN = Objective(name="conformance_sqhinge", label="Squared hinge", direction_loss=_squared_hinge,
                   defaults={"margin": 0.1})


@pytest.fixture(scope="module")
def families():
    register(PLUGIN)
    yield list(OBJECTIVES)
    unregister(PLUGIN.name)


def _batch(layout: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    if layout == "ranking":
        b, k = 4, 3
        image_ids = None
    else:
        b, k = 6, 1
        image_ids = [0, 1, 2, 0, 3, 4]  # rows 0 and 3 hold the same image: excluded unless compat
    images = torch.randn(b, 6, dtype=torch.float64, generator=g)
    captions = images.repeat_interleave(k, 0) + 0.9 * torch.randn(b * k, 6, dtype=torch.float64, generator=g)
    caption_image = torch.arange(b * k) // k
    return images, captions, caption_image, image_ids


def _views(spec, compat: bool, seed: int):
    images, captions, caption_image, image_ids = _batch(spec.layout, seed)
    scores, layout = batch_similarity(images, captions, caption_image, image_ids)
    intra = intra_similarities(images, captions) if spec.needs_intra else {}
    return {d: layout.view(scores, d, compat, intra=intra.get(d)) for d in DIRECTIONS}


def _loss_gradient(spec, view):
    params = spec.params()
    scores = view.scores.detach().clone().requires_grad_(True)
    loss = spec.direction_loss(type(view)(**{**view.__dict__, "scores": scores}), **params)
    (grad,) = torch.autograd.grad(loss, scores, allow_unused=True)
    return torch.zeros_like(scores) if grad is None else grad


@pytest.mark.parametrize("compat", [False, True])
def test_every_family_counts_where_its_loss_pushes(families, compat):
    checked = 0
    for name in families:
        spec = OBJECTIVES[name]
        if spec.direction_loss is None:
            continue
        counter = spec.make_counter()
        for seed in range(3):
            for d, view in _views(spec, compat, seed).items():
                grad = _loss_gradient(spec, view)
                other = ~(view.pos | view.neg)
                assert float(grad[other].abs().sum()) == 0.0, f"{name} {d}: gradient off the candidates"
                count = counter.count(view)
                assert set(spec.stats) <= set(count.batch), f"{name} {d}: statistics missing"
                pushed = (grad.abs() > 0) & view.neg
                if count.weights is not None:
                    w = count.weights
                    assert float(w[~view.neg].abs().sum()) == 0.0, f"{name} {d}: weights off the negatives"
                    # SmoothAP clamps its sigmoid at +-50: autograd gives 0 there, the weight G(1-G) ~ 1e-22
                    if not compat:  # the published counters' quirks (compat) are not derived from the loss
                        assert not bool(((w > 1e-15) & ~pushed).any()), f"{name} {d}: weight, no push"
                    checked += 1
                c_q = count.per_query.get("C_q")
                if c_q is not None and not compat:
                    counted = torch.nan_to_num(c_q) > 0
                    assert not bool((counted & ~pushed.any(-1)).any()), f"{name} {d}: counted without a gradient"
    assert checked >= len(families)  # the invariants ran for (nearly) every family and direction


def test_every_family_gives_the_same_tidy_frame_columns(families):
    g = torch.Generator().manual_seed(0)
    images = torch.randn(12, 6, generator=g)
    captions = images.repeat_interleave(2, 0) + 0.8 * torch.randn(24, 6, generator=g)
    emb = EmbeddingSet.from_arrays(images.numpy(), captions.numpy())
    columns = None
    for name in families:
        frame = count_embeddings(emb, [name], batch_size=6, seed=0, modes=["corrected"]).to_frame()
        assert set(frame.loss) == {name}
        assert set(frame.direction) == set(DIRECTIONS)
        assert set(OBJECTIVES[name].stats) <= set(frame.stat)
        columns = list(frame.columns) if columns is None else columns
        assert list(frame.columns) == columns, name
