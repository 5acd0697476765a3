"""Terms and reducers: hand values of the reducers; a family given only by its terms is counted in closed form and
agrees with the generic autograd counter; the built-in Triplet counts are the count of their terms; named loss
parts add up to the loss; an Objective's presentation is the record the pipelines write."""

from __future__ import annotations

import pytest
import torch

from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.losses.functional import triplet_direction, triplet_sh_terms, triplet_terms
from cocos.losses.generic import GenericCounter
from cocos.losses.reducers import AvgNonZeroReducer, CountAboveReducer, SumReducer, TermsCounter
from cocos.losses.spec import Note
from cocos.objectives import OBJECTIVES, Objective, get_objective, names
from cocos.presentation import Presentation, TableNote

TERMS = torch.tensor([[0.0, 0.5, 0.0, 2.0],
                      [0.0, 0.0, 0.0, 0.0],
                      [1.5, 0.25, 0.0, 0.01]], dtype=torch.float64)


def test_reducers_by_hand():
    from cocos.data.layout import QueryView

    view = QueryView(torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool), torch.ones(3, 4, dtype=torch.bool),
                     "i2t", 1)
    assert float(SumReducer()(TERMS)) == 4.26
    assert SumReducer().per_query(TERMS, view).tolist() == [2.5, 0.0, 1.76]
    mean = AvgNonZeroReducer()
    assert float(mean(TERMS)) == pytest.approx(4.26 / 5, abs=0, rel=1e-15) and mean.n_passed == 5
    assert mean.per_query(TERMS, view).tolist() == [1.25, 0.0, 1.76 / 3]
    assert int(CountAboveReducer()(TERMS)) == 5 and int(CountAboveReducer(0.01)(TERMS)) == 4
    assert CountAboveReducer(0.3).per_query(TERMS, view).tolist() == [2, 0, 1]
    stacked = TERMS[:, None, :].expand(3, 2, 4)  # (Q, A, K): two positives per query, the same terms
    assert CountAboveReducer().per_query(stacked, view).tolist() == [4, 0, 6]


def negatives_above(view, beta=0.3):
    """A plugin's terms: ``max(0, s(q, n) - beta)`` on each negative (gradient weight: 1 where positive)."""
    return torch.where(view.neg, (view.scores - beta).clamp(min=0), 0.0)


def pair_margin(view, margin=0.15):
    """A plugin's triplet-like terms ``(Q, A, K)``: ``max(0, margin + s(q, n) - s(q, p))``."""
    return triplet_terms(view, margin)


BY_TERMS = Objective(name="by_terms", label="By terms", direction_loss=None, terms=negatives_above,
                     defaults={"beta": 0.3})
TRIPLET_LIKE = Objective(name="pair_margin", label="Pair margin", direction_loss=None, terms=pair_margin,
                         defaults={"margin": 0.15})


def _views(seed: int, b: int = 7, compat: bool = False):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(b, 5, dtype=torch.float64, generator=g)
    captions = images + 0.8 * torch.randn(b, 5, dtype=torch.float64, generator=g)
    image_ids = list(range(b - 1)) + [0]  # the last row repeats image 0: a same-image pair
    scores, layout = batch_similarity(images, captions, None, image_ids)
    return [layout.view(scores, d, compat) for d in DIRECTIONS]


@pytest.mark.parametrize("spec", [BY_TERMS, TRIPLET_LIKE], ids=lambda s: s.name)
def test_a_family_given_by_terms_is_counted_in_closed_form_as_the_generic_counter_counts_it(spec):
    counter = spec.make_counter()
    assert isinstance(counter, TermsCounter) and not spec.uses_eps and "eps" not in counter.params()
    generic = GenericCounter(spec)
    compared = 0
    for seed in range(6):
        for compat in (False, True):
            for view in _views(seed, compat=compat):
                closed, auto = counter.count(view), generic.count(view)
                for stat in ("C_q", "C_B", "C_0"):
                    a, b = closed.batch[stat], auto.batch[stat]
                    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), stat
                assert torch.equal(closed.per_query["C_q"], auto.per_query["C_q"])
                compared += int(closed.batch["C_B"]) > 0
    assert compared > 6  # the batches had something to count


def test_a_family_given_by_terms_trains_with_the_sum_of_its_terms():
    view = _views(1)[0]
    assert float(BY_TERMS.direction_loss(view, beta=0.3)) == float(negatives_above(view).sum())
    loss = BY_TERMS.loss()
    g = torch.Generator().manual_seed(2)
    images, captions = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    expected = sum(float(negatives_above(v).sum()) for v in loss.views(images, captions))
    assert float(loss(images, captions)) == pytest.approx(expected, rel=1e-6)


def test_the_triplet_counts_are_the_counts_of_their_terms_above_zero():
    """Pair and ranking batches (several positives per image query): C_q of Triplet is the number of its terms
    above 0; Triplet SH's is 0 or 1, the count of its per-(query, negative) terms."""
    g = torch.Generator().manual_seed(3)
    for k in (1, 3):
        images = torch.randn(6, 5, dtype=torch.float64, generator=g)
        captions = images.repeat_interleave(k, 0) + 0.9 * torch.randn(6 * k, 5, dtype=torch.float64, generator=g)
        scores, layout = batch_similarity(images, captions, torch.arange(6 * k) // k)
        for d in DIRECTIONS:
            view = layout.view(scores, d, False)
            c_q = get_objective("triplet").make_counter(margin=0.2).count(view).per_query["C_q"]
            assert torch.equal(c_q, CountAboveReducer().per_query(triplet_terms(view, 0.2), view).to(torch.float64))
            sh = get_objective("triplet_sh").make_counter(margin=0.2).count(view).per_query["C_q"]
            hardest_violates = triplet_direction_per_query(view, 0.2) > 0
            assert torch.equal(sh, hardest_violates.to(torch.float64))
            if k == 1:  # one positive: the SH terms sum to the SH loss
                assert float(triplet_sh_terms(view, 0.2).sum()) == pytest.approx(
                    float(triplet_direction(view, 0.2, hardest=True)), rel=1e-12)


def triplet_direction_per_query(view, margin):
    """Per query, the largest ``alpha + s(q, n) - s(q, p)`` over negatives and positives, computed plainly."""
    out = []
    for q in range(view.scores.shape[-2]):
        s, pos, neg = view.scores[q], view.pos[q], view.neg[q]
        out.append(max(margin + float(s[n]) - float(s[p]) for p in pos.nonzero().flatten()
                       for n in neg.nonzero().flatten()))
    return torch.tensor(out)


def test_named_terms_add_up_to_the_loss():
    g = torch.Generator().manual_seed(4)
    images, captions = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    for name in ("triplet", "ntxent", "imc"):
        loss = get_objective(name).loss()
        parts = loss.named_terms(images, captions)
        assert set(parts) == ({"L_con", "L_intra"} if name == "imc" else {"L_con"})
        assert float(sum(parts.values())) == pytest.approx(float(loss(images, captions)), rel=1e-6, abs=1e-7)
        if name != "imc":
            assert torch.equal(parts["L_con"], loss(images, captions))
    imc = get_objective("imc").loss(lam=0.0).named_terms(images, captions)
    assert float(imc["L_intra"]) == 0.0
    assert float(imc["L_con"]) == float(get_objective("triplet_sh").loss()(images, captions))


def test_an_objectives_presentation_is_the_record_built_from_its_fields():
    assert Note is TableNote
    for rank, name in enumerate(names()):
        spec = OBJECTIVES[name]
        look = spec.presentation(rank)
        assert look == Presentation(label=spec.label, stats=tuple(spec.stats), main_stat=spec.main_stat,
                                    table=spec.table, color=spec.color, marker=spec.marker,
                                    params=dict(spec.defaults), notes=tuple(spec.notes), rank=rank)
        assert Presentation.from_dict(look.to_dict()) == look
    assert OBJECTIVES["smoothap"].presentation().notes[0].when == "compat"
    assert BY_TERMS.presentation().to_dict() == {
        "label": "By terms", "stats": ["C_q", "C_B", "C_0"], "main_stat": "C_q", "table": None, "color": "#7f7f7f",
        "marker": "o", "params": {"beta": 0.3}, "rank": 10_000, "notes": []}
