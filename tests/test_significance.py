"""Significance over seeds (``cocos.report.significance``): the t distribution, the tests, Holm, and what a report
shows of them (marks, notes, caption, significance.csv)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cocos.report.merge import build_tables, group_results
from cocos.report.significance import (
    CSV_COLUMNS,
    PAIRED,
    UNTESTED,
    WELCH,
    betainc,
    holm,
    paired_t,
    t_two_sided,
    welch_t,
)
from cocos.report.tables import to_latex, to_markdown
from tests.test_report_tables import as_results, make_results, md_cell


def t_df2(t: float) -> float:
    """Two-sided p of Student's t with 2 degrees of freedom, in closed form: 1 - |t| / sqrt(2 + t²)."""
    return 1.0 - abs(t) / math.sqrt(2.0 + t * t)


def t_df4(t: float) -> float:
    """Two-sided p with 4 degrees of freedom, in closed form: 1 - x (3 - x²) / 2, x = |t| / sqrt(4 + t²)."""
    x = abs(t) / math.sqrt(4.0 + t * t)
    return 1.0 - x * (3.0 - x * x) / 2.0


# --------------------------------------------------------------------------- the t distribution, the tests, Holm


def test_incomplete_beta_against_closed_forms():
    for x in (0.0, 0.1, 0.37, 0.5, 0.93, 1.0):
        assert betainc(1.0, 1.0, x) == pytest.approx(x, abs=1e-14)
        assert betainc(3.0, 1.0, x) == pytest.approx(x ** 3, abs=1e-14)
        assert betainc(1.0, 2.5, x) == pytest.approx(1.0 - (1.0 - x) ** 2.5, abs=1e-14)
    for a in (0.5, 2.0, 7.3, 40.0):
        assert betainc(a, a, 0.5) == pytest.approx(0.5, abs=1e-13)  # symmetric


def test_t_tail_against_closed_forms_and_tables():
    for t in (0.0, 0.3, 1.0, 2.5, 12.0, -4.0, 300.0):
        assert t_two_sided(t, 1.0) == pytest.approx(1.0 - 2.0 / math.pi * math.atan(abs(t)), abs=1e-13)  # Cauchy
        assert t_two_sided(t, 2.0) == pytest.approx(t_df2(t), abs=1e-13)
        assert t_two_sided(t, 4.0) == pytest.approx(t_df4(t), abs=1e-13)
    # the 97.5% quantiles of t tables (4, 10 and 30 df) and of the normal distribution
    for t, df in ((2.776445, 4), (2.228139, 10), (2.042272, 30), (1.959964, 1e7)):
        assert t_two_sided(t, df) == pytest.approx(0.05, abs=2e-7)
    assert t_two_sided(math.inf, 3.0) == 0.0 and math.isnan(t_two_sided(math.nan, 3.0))


def test_t_tail_matches_scipy_at_real_degrees_of_freedom():
    stats = pytest.importorskip("scipy.stats")  # an independent implementation, where installed (not a dependency)
    rng = np.random.default_rng(0)
    for t, df in zip(rng.standard_cauchy(200) * 3, rng.uniform(0.5, 80, 200), strict=True):
        assert t_two_sided(t, df) == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-9, abs=1e-14)


def test_paired_and_welch_by_hand():
    a, b = [400.0, 402.0, 407.0], [440.0, 441.0, 443.0]
    d = np.array(b) - np.array(a)  # 40, 39, 36
    t = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    assert paired_t(b, a) == pytest.approx((t, 2.0, t_df2(t)))
    # equal variances and sizes: Welch-Satterthwaite df = 2 (n - 1) = 4
    a, b = [400.0, 402.0, 404.0], [440.0, 442.0, 444.0]
    t = (442.0 - 402.0) / math.sqrt(4.0 / 3 + 4.0 / 3)
    assert welch_t(b, a) == pytest.approx((t, 4.0, t_df4(t)))
    # unequal variances: df by the Welch-Satterthwaite formula
    va, vb = np.var([1.0, 2.0, 4.0], ddof=1) / 3, np.var([0.0, 0.5, 0.7, 3.0], ddof=1) / 4
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    assert welch_t([1.0, 2.0, 4.0], [0.0, 0.5, 0.7, 3.0])[1] == pytest.approx(df)
    # replicates that all agree: no difference p = 1, a difference p = 0
    assert paired_t([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])[2] == 1.0
    assert paired_t([2.0, 3.0, 4.0], [1.0, 2.0, 3.0]) == (math.inf, 2.0, 0.0)


def test_holm_step_down():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, math.nan, 0.2]) == pytest.approx([0.5, math.nan, 0.4], nan_ok=True)
    assert holm([0.04, 0.01]) == pytest.approx([0.04, 0.02]) and holm([0.9, 0.8]) == [1.0, 1.0]


# --------------------------------------------------------------------------- a report's tables


TRIPLET_RSUM, SH_RSUM = [400.0, 402.0, 407.0], [440.0, 425.0, 450.0]
TRIPLET_CQ, SH_CQ = [6.0, 7.0, 8.5], [1.0, 1.05, 1.0]


def _grid(triplet_seeds=(0, 1, 2), sh_seeds=(0, 1, 2)):
    """Triplet and Triplet SH models of VSE++ on f30k: per seed an rsum and an i2t C^q of the model's own loss."""
    results = [make_results("triplet", s, rsum=TRIPLET_RSUM[i], stats={("triplet", "i2t", "C_q"): (TRIPLET_CQ[i], 1)})
               for i, s in enumerate(triplet_seeds)]
    results += [make_results("triplet_sh", s, rsum=SH_RSUM[i], stats={("triplet_sh", "i2t", "C_q"): (SH_CQ[i], 0)})
                for i, s in enumerate(sh_seeds)]
    groups, _ = group_results([as_results(r) for r in results])
    return {t.key: t for t in build_tables(groups)}


def test_paired_t_over_matching_seeds_by_hand_marked_and_named():
    tables = _grid()
    (rsum,) = tables["retrieval"].comparisons
    d = np.array(SH_RSUM) - np.array(TRIPLET_RSUM)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    assert (rsum.test, rsum.n_a, rsum.n_b, rsum.df) == (PAIRED, 3, 3, 2.0)
    assert rsum.statistic == pytest.approx(-t) and rsum.p == pytest.approx(t_df2(t))  # a = Triplet (row 1)
    assert rsum.p_adjusted == rsum.p < 0.05 and rsum.holds  # one comparison: Holm leaves it
    md = to_markdown(tables["retrieval"])
    assert md_cell(md, "Triplet loss SH", "rsum").endswith("<sup>*</sup>")
    assert not md_cell(md, "Triplet loss", "rsum").endswith("</sup>")
    assert "paired t-test" in tables["retrieval"].title and "Holm" in tables["retrieval"].title
    assert f"rsum: #2 > #1 (p = {t_df2(t):.3f})" in md and 0.01 < t_df2(t) < 0.05

    # Table 2: C^q of each model's own loss, both directions, one Holm family
    i2t, t2i = tables["table2"].comparisons
    d = np.array(TRIPLET_CQ) - np.array(SH_CQ)
    t = d.mean() / (d.std(ddof=1) / math.sqrt(3))
    assert (i2t.metric, i2t.direction, i2t.a, i2t.b) == ("C_q", "i2t", "VSE++ / Triplet loss", "VSE++ / Triplet loss SH")
    assert i2t.statistic == pytest.approx(t) and i2t.p == pytest.approx(t_df2(t))
    assert t2i.p == 0.0 and t2i.statistic == math.inf  # every seed's t2i C^q is the same: 6.79 against 1.00
    assert i2t.p_adjusted == pytest.approx(min(1.0, 1 * i2t.p)) and t2i.p_adjusted == 0.0  # Holm: 2 x 0, 1 x p
    tex = to_latex(tables["table2"])
    assert tex.count(r"\textsuperscript{*}") == 3  # the two Triplet cells and the note
    assert r"i2t $C^{q}$: Triplet loss $>$ Triplet loss SH" in tex


def test_welch_where_the_seeds_differ_by_hand():
    tables = _grid(sh_seeds=(3, 4, 5))
    (rsum,) = tables["retrieval"].comparisons
    a, b = np.array(TRIPLET_RSUM), np.array(SH_RSUM)
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    assert rsum.test == WELCH and rsum.statistic == pytest.approx(t) and rsum.df == pytest.approx(df)
    stats = pytest.importorskip("scipy.stats")
    assert rsum.p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert "Welch's t-test" in tables["retrieval"].title


def test_fewer_than_three_seeds_are_not_tested_and_say_so():
    tables = _grid(triplet_seeds=(0, 1), sh_seeds=(0, 1))
    for t in (tables["retrieval"], tables["table2"]):
        assert t.comparisons and all(c.test == UNTESTED and math.isnan(c.p) and not c.holds for c in t.comparisons)
        md = to_markdown(t)
        assert "Not tested for significance: 2 seeds per row (a t-test over seeds needs 3 or more)." in md
        assert "<sup>*</sup>" not in md and "t-test," not in t.title  # no mark, no test in the caption
    # one row with three seeds, one with two: that row is named
    tables = _grid(triplet_seeds=(0, 1, 2), sh_seeds=(0, 1))
    assert "Not tested (fewer than 3 seeds): #2." in to_markdown(tables["retrieval"])


def test_rows_of_other_datasets_are_not_compared_and_one_group_has_no_test():
    results = [make_results(loss, s, dataset=ds, rsum=400.0 + s + (loss == "triplet_sh"))
               for ds in ("f30k", "coco") for loss in ("triplet", "triplet_sh") for s in (0, 1, 2)]
    groups, _ = group_results([as_results(r) for r in results])
    (t1,) = [t for t in build_tables(groups) if t.key == "retrieval"]
    assert sorted((c.dataset, c.a, c.b) for c in t1.comparisons) == [
        ("coco", "VSE++ / Triplet loss", "VSE++ / Triplet loss SH"),
        ("f30k", "VSE++ / Triplet loss", "VSE++ / Triplet loss SH")]
    groups, _ = group_results([as_results(make_results("triplet", s)) for s in (0, 1, 2)])
    assert all(not t.comparisons for t in build_tables(groups))


def test_cli_report_writes_significance_csv_and_the_label_prefix(tmp_path):
    from cocos_cli.main import app

    paths = []
    for loss, rsums in (("triplet", TRIPLET_RSUM), ("triplet_sh", SH_RSUM)):
        for seed, rsum in enumerate(rsums):
            paths.append(tmp_path / f"{loss}-{seed}.json")
            paths[-1].write_text(json.dumps(make_results(loss, seed, rsum=rsum)))
    out = tmp_path / "reports" / "grid"
    res = CliRunner().invoke(app, ["report", *map(str, paths), "--out", str(out), "--label-prefix", "Exp 1"])
    assert res.exit_code == 0, res.output
    frame = pd.read_csv(out / "significance.csv")
    assert list(frame.columns) == CSV_COLUMNS
    assert list(zip(frame["table"], frame["metric"], frame["direction"], frame["test"], strict=True)) == [
        ("retrieval", "rsum", "both", PAIRED), ("table2", "C_q", "i2t", PAIRED), ("table2", "C_q", "t2i", PAIRED)]
    assert frame["holds"].all() and frame["p"].iloc[0] == pytest.approx(frame["p_adjusted"].iloc[0])
    labels = (out / "tables.tex").read_text()
    assert r"\label{tab:exp-1-grid-retrieval}" in labels and r"\label{tab:exp-1-grid-table2}" in labels
