"""Significance over seeds: pairwise t-tests between the rows of a report's tables, Holm-adjusted per table.

``cocos report`` compares the rows of each table pairwise (definitions in ``docs/analysis.md``, "Significance
over seeds"): Table 1 on the test rsum, each COCOS table on the main statistic of its loss families (``C_q``,
``C_qv-``, ...) in each direction. Two rows are compared when they come from different groups of the same
dataset and show the same counter, or each its own training loss (losses and models, never across datasets).

* **Test**: a two-sided *paired* t-test on the per-seed differences when both rows have the same seeds (the
  replicates of a grid: seed ``s`` of one loss against seed ``s`` of the other), *Welch's* t-test otherwise
  (unequal variances, Welch-Satterthwaite degrees of freedom). Each row needs at least :data:`MIN_SEEDS` seeds;
  with fewer the pair is not tested and the table's notes say so.
* **Correction**: Holm's step-down adjustment over every tested comparison of one table (all its metrics and
  directions); a difference *holds* at adjusted ``p <`` :data:`ALPHA`. The higher cell of a pair that holds
  gets the mark ``*``; a note names the pairs and the caption names the test.

scipy is not a dependency: the Student t tail is the regularized incomplete beta function
``p = I_{ν/(ν+t²)}(ν/2, 1/2)``, evaluated by its continued fraction (Lentz's method), as in Numerical Recipes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from cocos.report.tables import latex_escape

ALPHA = 0.05
MIN_SEEDS = 3
MARK = "*"
PAIRED, WELCH, UNTESTED = "paired t", "Welch t", "untested (fewer than 3 seeds)"
CSV_COLUMNS = ["table", "dataset", "metric", "direction", "a", "b", "n_a", "n_b", "mean_a", "mean_b", "test",
               "statistic", "df", "p", "p_adjusted", "holds"]


# --------------------------------------------------------------------------- the t distribution


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for aa in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                   -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (a, b > 0, 0 <= x <= 1)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``df`` degrees of freedom (any real df > 0)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return min(1.0, betainc(df / 2.0, 0.5, df / (df + t * t)))


def _statistic(diff: float, se: float, df: float) -> tuple[float, float, float]:
    """``(t, df, p)`` of ``diff / se``; a zero standard error gives t = 0, p = 1 for no difference and t = ±inf,
    p = 0 for a difference (every replicate says the same)."""
    if se == 0.0:
        return (0.0, df, 1.0) if diff == 0.0 else (math.copysign(math.inf, diff), df, 0.0)
    t = diff / se
    return t, df, t_two_sided(t, df)


def paired_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(t, df, p)`` of the two-sided paired t-test of ``a - b`` (same seeds, in the same order)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = d.size
    return _statistic(float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n), n - 1.0)


def welch_t(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(t, df, p)`` of Welch's two-sided t-test (unequal variances, Welch-Satterthwaite df)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se2 = va + vb
    df = se2 * se2 / (va * va / (a.size - 1) + vb * vb / (b.size - 1)) if se2 > 0 else a.size + b.size - 2.0
    return _statistic(float(a.mean() - b.mean()), math.sqrt(se2), float(df))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN entries are left out of the family and stay NaN)."""
    tested = sorted((x, i) for i, x in enumerate(p) if not math.isnan(x))
    out = [math.nan] * len(p)
    running, m = 0.0, len(tested)
    for rank, (x, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * x))
        out[i] = running
    return out


# --------------------------------------------------------------------------- comparisons of a table's rows


@dataclass(frozen=True)
class Entry:
    """One row's values in one column of a table: which row, what it is, and its value per seed."""

    row: int
    column: int
    group: int
    dataset: str
    name: str  # significance.csv: model / loss [counter]
    short: str  # the table's notes: the row as the table names it
    counter: str | None  # None: rsum
    own: bool  # the counter is the group's training loss (or rsum)
    seeds: Mapping[int, float]


@dataclass(frozen=True)
class Comparison:
    """One pairwise test; ``a``/``b`` are rows of one table (``rows``, ``column`` locate their cells)."""

    table: str
    dataset: str
    metric: str
    direction: str
    a: str
    b: str
    short_a: str
    short_b: str
    rows: tuple[int, int]
    column: int
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    test: str
    statistic: float = math.nan
    df: float = math.nan
    p: float = math.nan
    p_adjusted: float = math.nan
    holds: bool = False

    @property
    def tested(self) -> bool:
        return self.test != UNTESTED


def _comparable(x: Entry, y: Entry) -> bool:
    """Rows of different groups on the same dataset, with the same counter or each with its own loss."""
    return x.group != y.group and x.dataset == y.dataset and (x.counter == y.counter or (x.own and y.own))


def _finite(seeds: Mapping[int, float]) -> dict[int, float]:
    return {s: float(v) for s, v in seeds.items() if v is not None and not math.isnan(float(v))}


def pair_test(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[str, float, float, float]:
    """``(test, t, df, p)`` of two rows' per-seed values: paired when their seeds are the same, Welch's otherwise,
    untested (NaNs) when either has fewer than :data:`MIN_SEEDS`."""
    if len(a) < MIN_SEEDS or len(b) < MIN_SEEDS:
        return UNTESTED, math.nan, math.nan, math.nan
    if set(a) == set(b):
        seeds = sorted(a)
        return (PAIRED, *paired_t([a[s] for s in seeds], [b[s] for s in seeds]))
    return (WELCH, *welch_t(list(a.values()), list(b.values())))


def compare_column(table: str, metric: str, direction: str, entries: Sequence[Entry]) -> list[Comparison]:
    """Every comparable pair of ``entries`` (one column of one table), in row order; not yet adjusted."""
    out = []
    for i, x in enumerate(entries):
        for y in entries[i + 1:]:
            if not _comparable(x, y):
                continue
            a, b = _finite(x.seeds), _finite(y.seeds)
            test, t, df, p = pair_test(a, b)
            mean = [float(np.mean(list(v.values()))) if v else math.nan for v in (a, b)]
            out.append(Comparison(table, x.dataset, metric, direction, x.name, y.name, x.short, y.short,
                                  (x.row, y.row), x.column, len(a), len(b), mean[0], mean[1], test, t, df, p))
    return out


def adjust(comparisons: Sequence[Comparison], alpha: float = ALPHA) -> list[Comparison]:
    """The comparisons of one table with Holm-adjusted p-values and whether each holds (adjusted p < alpha)."""
    adjusted = holm([c.p for c in comparisons])
    return [replace(c, p_adjusted=q, holds=bool(q < alpha)) for c, q in zip(comparisons, adjusted, strict=True)]


def to_frame(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """``significance.csv``: one row per comparison (:data:`CSV_COLUMNS`)."""
    return pd.DataFrame([{k: getattr(c, k) for k in CSV_COLUMNS} for c in comparisons], columns=CSV_COLUMNS)


# --------------------------------------------------------------------------- what a table shows of them


def p_text(p: float, latex: bool = False) -> str:
    """``p = 0.003``, ``p < 0.001`` (LaTeX: in math)."""
    text = "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
    return f"${text}$" if latex else text


TESTS = {PAIRED: ("paired t-test", "paired t-tests on the per-seed differences"),
         WELCH: ("Welch's t-test", "Welch's t-tests (the rows' seeds differ)")}


def tests_phrase(comparisons: Sequence[Comparison], long: bool = False) -> str:
    """The tests a table used: paired, Welch's, or both (``long``: as its note says it)."""
    used = sorted({c.test for c in comparisons if c.tested})
    if len(used) == 1:
        return TESTS[used[0]][long]
    if long:
        return "paired t-tests on the per-seed differences where the rows' seeds match, Welch's t-tests otherwise"
    return "paired t-test, Welch's where seeds differ"


def caption_clause(comparisons: Sequence[Comparison]) -> str:
    """What a table's caption adds when any pair of its rows was tested (else "")."""
    if not any(c.tested for c in comparisons):
        return ""
    return f"; {MARK} a difference that holds over seeds ({tests_phrase(comparisons)}, Holm p < {ALPHA:g})"


def marked_rows(comparisons: Sequence[Comparison]) -> set[tuple[int, int]]:
    """``(row, column)`` of the higher cell of every pair that holds."""
    return {(c.rows[0] if c.mean_a > c.mean_b else c.rows[1], c.column) for c in comparisons if c.holds}


def _held(comparisons: Sequence[Comparison], what) -> tuple[list[str], list[str]]:
    """The pairs that hold, per metric: ``rsum: #2 > #1 (p < 0.001), #3 > #1 (p = 0.012)`` (plain, LaTeX)."""
    by_metric: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for c in comparisons:
        if c.holds:
            hi, lo = (c.short_a, c.short_b) if c.mean_a > c.mean_b else (c.short_b, c.short_a)
            by_metric.setdefault(what(c), []).append(
                (f"{hi} > {lo} ({p_text(c.p_adjusted)})",
                 f"{latex_escape(hi)} $>$ {latex_escape(lo)} ({p_text(c.p_adjusted, latex=True)})"))
    plain = [f"{name}: " + ", ".join(p for p, _ in pairs) for (name, _), pairs in by_metric.items()]
    tex = [f"{name}: " + ", ".join(t for _, t in pairs) for (_, name), pairs in by_metric.items()]
    return plain, tex


def notes(comparisons: Sequence[Comparison], what) -> list[tuple[str, str, str]]:
    """``(mark, plain, latex)`` notes of one table: the pairs that hold (with the test and the correction), and the
    rows left untested. ``what(comparison)`` names its metric as the table does, ``(plain, latex)``."""
    out = []
    tested = [c for c in comparisons if c.tested]
    if tested:
        how = (f"{tests_phrase(tested, long=True)}, two-sided, Holm-adjusted within this table; every p-value in "
               "significance.csv")
        plain, tex = _held(tested, what)
        if plain:
            out.append((MARK, f"Holds at adjusted p < {ALPHA:g} ({how}): " + "; ".join(plain) + ".",
                        f"Holds at adjusted $p < {ALPHA:g}$ ({latex_escape(how)}): " + "; ".join(tex) + "."))
        else:
            text = f"No difference between rows holds at adjusted p < {ALPHA:g} ({how})."
            out.append(("", text, latex_escape(text)))
    untested = [c for c in comparisons if not c.tested]
    if untested:
        text = _untested_text(untested, bool(tested))
        out.append(("", text, latex_escape(text)))
    return out


def _untested_text(untested: Sequence[Comparison], some_tested: bool) -> str:
    """The note on the pairs left untested: how many seeds the rows have where every row of them has too few, else
    which rows have too few."""
    seeds = {s: n for c in untested for s, n in ((c.short_a, c.n_a), (c.short_b, c.n_b))}
    few = {s: n for s, n in seeds.items() if n < MIN_SEEDS}
    if not some_tested and len(few) == len(seeds):
        counts = sorted(set(few.values()))
        return (f"Not tested for significance: {' or '.join(map(str, counts))} seed{'s' if counts != [1] else ''} "
                f"per row (a t-test over seeds needs {MIN_SEEDS} or more).")
    return f"Not tested (fewer than {MIN_SEEDS} seeds): {', '.join(few)}."
