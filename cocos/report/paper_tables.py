"""The paper's tables for one result or many: Table 1 (retrieval) and the COCOS Tables 2-4.

Rows of a COCOS table are (group, counter) pairs. Which counters a group shows:
``counters="all"``, every counter it was counted with; ``"own"`` (``cocos report``),
its training loss's counter, and every counter for results without a training
loss. Each loss family's presentation (stored in the results) says which paper table
it belongs to and which statistics that table shows; families without a paper table
get a table of their own. Nothing here names a loss.

Cells over replicates
---------------------
A column never mixes kinds of spread, and every caption says which it shows:

* Table 1: mean ± sample std (ddof 1) over seeds; a single seed shows its value.
* COCOS tables: with one result per row the cell is its batch mean ± batch std; with
  several seeds, the mean over seeds of those means ± their sample std over seeds (rows
  with a single seed then show the mean alone).

Tests over seeds
----------------
Rows of a table are compared pairwise (:mod:`cocos.report.significance`): Table 1 on rsum, a COCOS table on
the main statistic of its families in each direction; paired t-tests where the rows' seeds match, Welch's
otherwise, Holm-adjusted within the table. The higher cell of a pair that holds is marked ``*``, the caption
names the test, a note lists the pairs; rows of fewer than 3 seeds are not tested, and a note says so.

LaTeX labels
------------
``tab:[PREFIX-]NAME-ROLE``: ROLE the table (``retrieval``, ``table2``, ...), NAME the report's folder name
(:func:`relabel`, from :func:`cocos.report.merge.write_report`) or, for one result, what it is
(:func:`label_name`), never a digest of the inputs: regenerating a report keeps its labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from cocos.presentation import Presentation, format_value, ranked
from cocos.report import significance
from cocos.report.groups import (
    Group,
    aggregate,
    dataset_name,
    loss_label,
    metric_frame,
    over_seeds,
    stat_frame,
)
from cocos.report.tables import (
    ALT_TOLERANCE,
    COMPANION_STATS,
    DIRECTIONS,
    STAT_HEADERS,
    Cell,
    Column,
    Footnote,
    Marks,
    Row,
    Table,
    differs,
    fmt_compact,
    latex_escape,
    latex_label,
    mode_name,
    slug,
)
from cocos.results import CHANCE_NOISE_SD

# --------------------------------------------------------------------------- tables

PARAM_SYMBOLS = {"margin": ("α", r"\alpha"), "tau": ("τ", r"\tau"), "eps": ("ε", r"\varepsilon"),
                 "lam": ("λ", r"\lambda"), "triplet_weight": ("T", "T"), "pair_weight": ("P", "P")}


def _describe(g: Group) -> str:
    """What a group is, as a phrase: model, training, data."""
    r = g.results[0]
    trained = f" trained with the {loss_label(g.loss, r)}" if g.loss else ""
    return f"{g.model}{trained} on {dataset_name(g.dataset)}"


def _spread_phrase(groups: Sequence[Group]) -> str:
    """How the ± of a table is meant, said once in its caption (a table never mixes kinds of spread)."""
    ns = sorted({g.n for g in groups})
    if ns == [1]:
        sizes = sorted({r.counting.batch_size for g in groups for r in g.results})
        where = "training-set " if all(r.source.kind == "analyze" for g in groups for r in g.results) else ""
        return f"mean ± std over the {where}batches" + (f" of {sizes[0]}" if len(sizes) == 1 else "")
    seeds = ", ".join(str(n) for n in ns if n > 1)
    single = " (rows of one seed: the mean alone)" if 1 in ns else ""
    if all(r.source.kind == "count" for g in groups for r in g.results):  # replicates of count are batch samplings
        return f"mean ± sample std over {seeds} counting seeds (batch samplings of the same embeddings){single}"
    return f"mean ± sample std over {seeds} training seeds{single}"


def _stat_columns(stats: Sequence[str]) -> tuple[Column, ...]:
    return tuple(Column(STAT_HEADERS.get(s, (s,))[0], d, STAT_HEADERS.get(s, (s, None))[1])
                 for d in DIRECTIONS for s in stats)


def _shown_params(g: Group) -> dict:
    """The hyper-parameters Table 1 shows: those that differ from the family's defaults, else the first one
    (the paper's α or τ); a family without recorded defaults shows them all."""
    r = g.results[0]
    params = r.training.params if r.training is not None else {}
    defaults = r.look(g.loss).params if g.loss is not None else {}
    if not defaults:
        return dict(params)
    changed = {k: v for k, v in params.items() if k in defaults and v != defaults[k]}
    if changed:
        return changed
    first = next(iter(defaults))
    return {first: params.get(first, defaults[first])}


def _params_text(params: dict) -> tuple[str, str]:
    plain, tex = [], []
    for k, v in params.items():
        sym, sym_tex = PARAM_SYMBOLS.get(k, (k, latex_escape(k)))
        plain.append(f"{sym}={format_value(v)}")
        tex.append(f"${sym_tex}={latex_escape(format_value(v))}$")
    return ", ".join(plain) or "-", ", ".join(tex) or "-"


# Table 1 as in the paper: #, loss, hyper-parameters, R@1/5/10 both ways, rsum, mAP@5 (i2t).
TABLE1_KEYS = (("i2t", "R@1", "i2t_R@1", 1), ("i2t", "R@5", "i2t_R@5", 1), ("i2t", "R@10", "i2t_R@10", 1),
               ("t2i", "R@1", "t2i_R@1", 1), ("t2i", "R@5", "t2i_R@5", 1), ("t2i", "R@10", "t2i_R@10", 1),
               ("", "rsum", "rsum", 1), ("", "mAP@5", "mAP@5", 1))
PERCENT = {"mAP@5": 100.0}  # results.json holds mAP@5 on a 0-1 scale; Table 1 shows it in percent like the recalls


TABLE1_LABELS = ("Dataset", "Model", "#", "Loss", "Param.")
# a label column with one value in every row goes to Table 1's title, in this order and phrasing
TABLE1_WHERE = (("Model", " of {}"), ("Loss", " trained with the {}"), ("Param.", " ({})"), ("Dataset", " on {}"))


def retrieval_table(groups: Sequence[Group]) -> Table | None:
    """Table 1 over the groups that were evaluated (None if none was): the paper's columns, one compact table.

    Label columns that are the same in every row (a loss over epochs) go to the caption. With seeds the LaTeX
    cells of the recalls and mAP@5 show the mean (their std is in markdown); rsum keeps its ± there too.
    """
    evaluated = [g for g in groups if all(r.evaluation is not None for r in g.results)]
    if not evaluated:
        return None
    seeds = any(g.n > 1 for g in evaluated)
    rows = [(_table1_labels(g, i), _metric_cells(g)) for i, g in enumerate(evaluated, start=1)]
    keep, fixed = _table1_label_columns([labels for labels, _ in rows])
    columns = tuple(Column(name, group, latex_std=not seeds or name == "rsum") for group, name, _, _ in TABLE1_KEYS)
    notes = [Footnote("Recalls and mAP@5 (image to text) in percent; rsum is the sum of the six recalls."
                      + (" In LaTeX only rsum shows its std (the others are in tables.md)." if seeds else ""))]
    rows, flag_notes = _flag_rows(evaluated, rows)
    table = Table(_table1_title(evaluated, fixed), tuple(TABLE1_LABELS[j] for j in keep), columns,
                  [Row(tuple(labels[j] for j in keep), cells) for labels, cells in rows], notes + flag_notes,
                  key="retrieval", stack=False)
    return _test_caption(_with_tests(table, [("rsum", "both", _rsum_entries(evaluated))]))


def _table1_title(groups: Sequence[Group], fixed: dict[str, str]) -> str:
    """Table 1's title: the split(s), the label values shared by every row (``fixed``), and the spread."""
    where = "".join(text.format(fixed[name]) for name, text in TABLE1_WHERE if name in fixed)
    split = "/".join(sorted({r.evaluation.split for g in groups for r in g.results}))
    return f"Table 1: Retrieval on the {split} split{where}, {_table1_spread(groups)}"


def _table1_labels(g: Group, number: int) -> tuple[str, ...]:
    """A Table 1 row's labels (:data:`TABLE1_LABELS`): dataset, model, row number, loss, shown parameters."""
    return (dataset_name(g.dataset), g.model, str(number), loss_label(g.loss, g.results[0]),
            _params_text(_shown_params(g))[0])


def _table1_label_columns(label_rows: Sequence[tuple[str, ...]]) -> tuple[list[int], dict[str, str]]:
    """``(kept, fixed)``: the indices of the label columns Table 1 shows (those that vary, the row number, and for a
    single row its loss and parameters) and ``{name: value}`` of the others (one value in every row)."""
    varies = {name for j, name in enumerate(TABLE1_LABELS) if len({labels[j] for labels in label_rows}) > 1}
    single = len(label_rows) == 1
    keep = [j for j, name in enumerate(TABLE1_LABELS)
            if name in varies or name == "#" or (single and name in ("Loss", "Param."))]
    fixed = {name: label_rows[0][j] for j, name in enumerate(TABLE1_LABELS) if j not in keep}
    return keep, fixed


def _table1_spread(groups: Sequence[Group]) -> str:
    """How Table 1's ± is meant: one run per row, or the sample std over the seeds of each row."""
    ns = sorted({g.n for g in groups})
    if ns[-1] <= 1:
        return "one run per row"
    return (f"mean ± sample std over {', '.join(str(n) for n in ns if n > 1)} seeds"
            + (" (rows of one seed: the value alone)" if 1 in ns else ""))


RSUM_COLUMN = [name for _, name, _, _ in TABLE1_KEYS].index("rsum")


def _flag_rows(groups: Sequence[Group], rows: list) -> tuple[list, list[Footnote]]:
    """Rows whose numbers would mislead a reader get a mark on their rsum and a note (definitions file,
    "Honest reports"): ``w`` a checkpoint that is a warm-up epoch (the model has been trained only with the
    warm-up loss, so its row is that loss's, not its own), ``c`` a test rsum within noise of chance."""
    warm = [any(r.warmup_selected for r in g.results) for g in groups]
    chance = [any(r.at_chance for r in g.results) for g in groups]
    marks = [("w" if w else "") + ("c" if c else "") for w, c in zip(warm, chance, strict=True)]
    out = [(labels, _mark_rsum(cells, mark)) for (labels, cells), mark in zip(rows, marks, strict=True)]
    notes = [note for note in (_warmup_note(groups, warm), _chance_note(groups, chance)) if note is not None]
    return out, notes


def _rsum_entries(groups: Sequence[Group]) -> list[significance.Entry]:
    """Table 1's rsum per row and seed, for the tests over seeds (rows named by their number, ``#2``)."""
    frame = metric_frame(groups, ["rsum"])
    seeds: dict[int, dict[int, float]] = {gi: {} for gi in range(len(groups))}
    for gi, ri, value in zip(frame["group"], frame["replicate"], frame["value"], strict=True):
        seeds[gi][groups[gi].results[ri].replicate] = value
    return [significance.Entry(gi, RSUM_COLUMN, gi, g.dataset, _row_name(g), f"#{gi + 1}", None, True, seeds[gi])
            for gi, g in enumerate(groups)]


def _row_name(g: Group, counter: str | None = None) -> str:
    """A row as significance.csv names it: model, training loss, and the counter where it is another loss's."""
    r = g.results[0]
    parts = [g.model, *([loss_label(g.loss, r)] if g.loss else [])]
    if counter is not None and counter != g.loss:
        parts.append(f"{r.look(counter).label} counter")
    return " / ".join(parts)


def _with_tests(table: Table, columns, what=None) -> Table:
    """The table with its rows compared pairwise over seeds (:mod:`cocos.report.significance`), ``columns`` being
    ``(metric, direction, entries)``: the higher cell of a pair that holds marked ``*``, notes that name the pairs
    that hold (and the rows left untested), and the comparisons kept for significance.csv."""
    comparisons = significance.adjust([c for metric, direction, entries in columns
                                       for c in significance.compare_column(table.key, metric, direction, entries)])
    if not comparisons:
        return table
    marked = significance.marked_rows(comparisons)
    rows = [Row(row.labels, tuple(replace(cell, mark=cell.mark + significance.MARK) if (i, j) in marked else cell
                                  for j, cell in enumerate(row.cells))) for i, row in enumerate(table.rows)]
    notes = [Footnote(plain, mark, tex) for mark, plain, tex in
             significance.notes(comparisons, what or (lambda c: (c.metric, c.metric)))]
    return replace(table, rows=rows, footnotes=[*table.footnotes, *notes], comparisons=comparisons)


def _test_caption(table: Table) -> Table:
    """The caption names the test where any pair of rows was tested."""
    return replace(table, title=table.title + significance.caption_clause(table.comparisons))


def _mark_rsum(cells: tuple[Cell, ...], mark: str) -> tuple[Cell, ...]:
    """The row's cells with ``mark`` on its rsum (unchanged for no mark)."""
    if not mark:
        return cells
    return tuple(replace(cell, mark=mark) if j == RSUM_COLUMN else cell for j, cell in enumerate(cells))


def _warmup_note(groups: Sequence[Group], warm: Sequence[bool]) -> Footnote | None:
    """The ``w`` note: which rows' checkpoints are warm-up epochs, and of which warm-up losses (None: no row)."""
    if not any(warm):
        return None
    rows = ", ".join(str(i) for i, w in enumerate(warm, start=1) if w)
    losses = sorted({r.training.warmup_loss for g, w in zip(groups, warm, strict=True) if w for r in g.results
                     if r.warmup_selected})
    return Footnote(f"Row {rows}: the selected checkpoint (best validation rsum) is a warm-up epoch: the "
                    f"model was trained only with the {', '.join(losses)} loss, so the row shows that "
                    "loss, not the model's own.", "w")


def _chance_note(groups: Sequence[Group], chance: Sequence[bool]) -> Footnote | None:
    """The ``c`` note: which rows' test rsum is within noise of chance, with the chance level (None: no row)."""
    if not any(chance):
        return None
    parts = []
    for i, (g, c) in enumerate(zip(groups, chance, strict=True), start=1):
        if c:
            mean, sd = next(r.chance for r in g.results if r.at_chance)
            parts.append(f"{i} (chance {mean:.1f} ± {sd:.1f})")
    return Footnote(f"Row {', '.join(parts)}: test rsum within noise of chance (below chance + "
                    f"{CHANCE_NOISE_SD:g} sd of a random ranking): the model retrieves no better than "
                    "chance, and its COCOS describe an untrained model.", "c")


def _metric_cells(g: Group) -> tuple[Cell, ...]:
    metrics = metric_frame([g], [key for _, _, key, _ in TABLE1_KEYS], PERCENT)
    cells = over_seeds(metrics, ["metric"]).set_index("metric")
    return tuple(Cell(_num(cells.loc[key, "mean"]), _num(cells.loc[key, "std"]), digits=digits)
                 for _, _, key, digits in TABLE1_KEYS)


@dataclass(frozen=True)
class TableSpec:
    """One COCOS table: its key, title, the counters in it and the statistics it shows."""

    key: str
    title: str
    counters: tuple[str, ...]
    stats: tuple[str, ...]


def table_specs(counters: Iterable[str], looks: dict[str, Presentation]) -> list[TableSpec]:
    """The COCOS tables for these counters, from their presentations: the paper's tables in order, then one per
    other family."""
    by_key: dict[str, list[str]] = {}
    for name in ranked(counters, looks):
        key = f"table{looks[name].table}" if looks[name].table else name
        by_key.setdefault(key, []).append(name)
    out = []
    for key, members in by_key.items():
        stats = list(dict.fromkeys(s for name in members for s in looks[name].stats))
        names = " and ".join(looks[n].label for n in members)
        number = f"Table {key[5:]}: " if key.startswith("table") else ""
        out.append(TableSpec(key, f"{number}COCOS w.r.t. query q, {names}", tuple(members), tuple(stats)))
    return out


def _notes_for(counters: Sequence[str], looks: dict[str, Presentation], compat_shown: bool, differs_in: set[str],
               marks: Marks) -> None:
    for name in counters:
        for note in looks[name].notes:
            if note.when == "always" or compat_shown or name in differs_in:
                marks.note(note.text, note.latex)


DAGGER = "†"


@dataclass
class _Rows:
    """What the COCOS tables of some groups share: the cells, the shown modes and how rows are labelled."""

    groups: Sequence[Group]
    cells: dict  # (group, counter, direction, stat, which) -> the aggregate's row
    modes: dict
    labels: dict
    single: bool
    one_context: bool
    extra_counter: bool
    seeds: dict = field(default_factory=dict)  # (group, counter, direction, stat) -> {seed: value}, main stats

    def row_labels(self, gi: int, c: str) -> tuple[str, ...]:
        if self.single:
            return (self.labels[c],)
        g = self.groups[gi]
        return (*(() if self.one_context else (dataset_name(g.dataset), g.model)), loss_label(g.loss, g.results[0]),
                *((self.labels[c],) if self.extra_counter else ()))

    def label_columns(self) -> tuple[str, ...]:
        """The names of :meth:`row_labels`."""
        if self.single:
            return ("Counter",)
        return (*(() if self.one_context else ("Dataset", "Model")), "Loss",
                *(("Counter",) if self.extra_counter else ()))

    def cell(self, gi, c, d, s, which):
        key = (gi, c, d, s, which)
        return self.cells.get(key)

    def shown_modes(self, gis) -> set:
        return set().union(*(self.modes.get(gi, set()) for gi in gis))

    def keep_std(self, gi: int, gis) -> bool:
        """A table never mixes spreads: with seeds in it, rows of one seed show the mean alone."""
        return self.groups[gi].n > 1 or not any(self.groups[i].n > 1 for i in gis)


def cocos_tables(groups: Sequence[Group], compat: bool | None = None, counters: str = "own") -> list[Table]:
    """The COCOS tables (and companions) of the groups: rows are (group, counter) pairs.

    A cell whose value in the other counting mode differs (by more than 0.005) is marked
    ``†``; one note per table says which mode is shown (markdown: and the other mode's values).
    """
    frame = stat_frame(groups, compat)
    if frame.empty:
        return []
    pairs = [(gi, c) for gi, g in enumerate(groups) for c in g.counters(counters)]
    looks = {c: groups[gi].results[0].look(c) for gi, c in pairs}
    lay = _rows_of(groups, frame, pairs, looks)
    label_columns = lay.label_columns()
    about = _about(lay, pairs)
    tables = [_paper_table(lay, spec, [(gi, c) for gi, c in pairs if c in spec.counters], looks, about, label_columns)
              for spec in table_specs([c for _, c in pairs], looks)]
    comp = [(gi, c) for gi, c in pairs if _has_companions(lay, gi, c)]
    if comp:
        tables.append(_companions_table(lay, comp, about, label_columns))
    return [_test_caption(_constant_labels_to_title(t)) for t in tables]


def _has_companions(lay: _Rows, gi: int, c: str) -> bool:
    """Whether counter ``c`` of group ``gi`` has any threshold-free companion statistic in the shown mode."""
    return any(lay.cell(gi, c, d, s, "shown") is not None for d in DIRECTIONS for s in COMPANION_STATS)


def _rows_of(groups: Sequence[Group], frame: pd.DataFrame, pairs, looks: dict) -> _Rows:
    """What the COCOS tables of the (group, counter) ``pairs`` share: the aggregated cells, each group's shown
    modes, and how rows are labelled (one group: by counter; one dataset and model: by loss, and by counter where
    a group shows a counter other than its loss)."""
    shown = frame[frame["which"] == "shown"]
    single = len(groups) == 1
    contexts = {(groups[gi].dataset, groups[gi].model) for gi, _ in pairs}
    modes = {gi: set(map(bool, v)) for gi, v in shown.groupby("group")["compat"]}
    return _Rows(groups, aggregate(frame, groups).to_dict("index"), modes,
                 {c: look.label for c, look in looks.items()}, single, not single and len(contexts) == 1,
                 not single and any(groups[gi].loss != c for gi, c in pairs), _seed_values(groups, shown, looks))


def _seed_values(groups: Sequence[Group], shown: pd.DataFrame, looks: dict) -> dict:
    """``{(group, counter, direction, stat): {seed: value}}`` of the main statistics, for the tests over seeds."""
    main = shown[shown["stat"].isin({look.main_stat for look in looks.values()})]
    out: dict = {}
    for gi, ri, c, d, s, v in zip(*(main[k] for k in ("group", "replicate", "counter", "direction", "stat", "mean")),
                                  strict=True):
        out.setdefault((gi, c, d, s), {})[groups[gi].results[ri].replicate] = v
    return out


def _about(lay: _Rows, pairs) -> str:
    """What a COCOS table's title says its rows share: the one group, or the one model and dataset ("" else)."""
    if lay.single:
        return f": {_describe(lay.groups[0])}"
    if lay.one_context:
        gi = pairs[0][0]
        return f": {lay.groups[gi].model} on {dataset_name(lay.groups[gi].dataset)}"
    return ""


def _constant_labels_to_title(table: Table) -> Table:
    """Label columns with one value in every row (a run's epochs: dataset, loss) go to the title, once."""
    if len(table.rows) < 2:
        return table
    same = [i for i in range(len(table.label_columns) - 1) if len({r.labels[i] for r in table.rows}) == 1]
    if not same:
        return table
    keep = [i for i in range(len(table.label_columns)) if i not in same]
    fixed = ", ".join(f"{table.label_columns[i].lower()} {table.rows[0].labels[i]}" for i in same)
    return replace(table, title=f"{table.title} ({fixed})", label_columns=tuple(table.label_columns[i] for i in keep),
                   rows=[Row(tuple(r.labels[i] for i in keep), r.cells) for r in table.rows])


def _paper_table(lay: _Rows, spec: TableSpec, chosen, looks, about: str, label_columns) -> Table:
    """One of the paper's COCOS tables (or a family's own) over the chosen (group, counter) rows."""
    gis = sorted({gi for gi, _ in chosen})
    marks = Marks()
    rows, differs_in, skipped, other_values = [], set(), [], []
    for gi, c in chosen:
        row = []
        for d in DIRECTIONS:
            for s in spec.stats:
                main, alt = lay.cell(gi, c, d, s, "shown"), lay.cell(gi, c, d, s, "other")
                mark = ""
                if main is not None and alt is not None and differs(dict(main), dict(alt)):
                    mark = DAGGER
                    differs_in.add(c)
                    other_values.append(_other_value(lay, gi, c, d, s, alt, gis))
                if s == "C_q" and main is not None and main["n_skipped"]:
                    skipped.append(f"{' / '.join(lay.row_labels(gi, c))} {d}: {int(main['n_skipped'])} of "
                                   f"{int(main['n_batches'])}")
                row.append(_cell(main, lay.keep_std(gi, gis), mark))
        rows.append(Row(lay.row_labels(gi, c), tuple(row)))
    _mode_note(lay.shown_modes(gis), other_values, marks)
    _notes_for(spec.counters, looks, True in lay.shown_modes(gis), differs_in, marks)
    if skipped:
        marks.note("Batches where no query has a gradient have no C^q and are left out of its mean: "
                   + "; ".join(skipped) + ".",
                   r"Batches where no query has a gradient have no $C^{q}$ and are left out of its mean: "
                   + latex_escape("; ".join(skipped)) + ".")
    _eps_note([c for _, c in chosen], lay.groups, gis, marks)
    table = Table(f"{spec.title}{about}; {_spread_phrase([lay.groups[i] for i in gis])}", label_columns,
                  _stat_columns(spec.stats), rows, marks.footnotes, key=spec.key)
    return _with_tests(table, _stat_entries(lay, spec, chosen, looks), _stat_name)


def _stat_entries(lay: _Rows, spec: TableSpec, chosen, looks: dict) -> list:
    """``(stat, direction, entries)`` of a COCOS table's tested columns: the main statistic of each of its families,
    both directions, over the rows that have it."""
    mains = [s for s in spec.stats if any(looks[c].main_stat == s for c in spec.counters)]
    short = _short_names([lay.row_labels(gi, c) for gi, c in chosen])
    out = []
    for d in DIRECTIONS:
        for s in mains:
            column = DIRECTIONS.index(d) * len(spec.stats) + spec.stats.index(s)
            entries = [significance.Entry(k, column, gi, lay.groups[gi].dataset, _row_name(lay.groups[gi], c),
                                          short[k], c, c == lay.groups[gi].loss, lay.seeds[(gi, c, d, s)])
                       for k, (gi, c) in enumerate(chosen) if (gi, c, d, s) in lay.seeds]
            out.append((s, d, entries))
    return out


def _short_names(label_rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Each row's name in the notes: its labels that differ between rows (and always the last), joined by ``/``,
    as the table shows them once :func:`_constant_labels_to_title` has moved the others to its title."""
    n = len(label_rows[0]) if label_rows else 0
    keep = [i for i in range(n) if i == n - 1 or len({labels[i] for labels in label_rows}) > 1]
    return [" / ".join(labels[i] for i in keep) for labels in label_rows]


def _stat_name(c: significance.Comparison) -> tuple[str, str]:
    """A tested statistic as the notes name it: ``i2t C^q`` (plain), ``i2t $C^{q}$`` (LaTeX)."""
    plain, tex = STAT_HEADERS.get(c.metric, (c.metric, latex_escape(c.metric)))
    return f"{c.direction} {plain}", f"{c.direction} {tex}"


def _cell(entry, keep_std: bool, mark: str = "") -> Cell:
    if entry is None:
        return Cell(None, None, mark=mark)
    return Cell(_num(entry["mean"]), _num(entry["std"]) if keep_std else None, mark=mark)


def _other_value(lay: _Rows, gi: int, c: str, d: str, s: str, alt, gis) -> tuple[str, str]:
    """A differing cell's value in the other mode, for the markdown note (plain, LaTeX)."""
    head_plain, head_tex = STAT_HEADERS.get(s, (s, latex_escape(s)))
    value = fmt_compact(_num(alt["mean"]), _num(alt["std"]) if lay.keep_std(gi, gis) else None)
    who = " / ".join(lay.row_labels(gi, c))
    return f"{who} {d} {head_plain} {value}", f"{latex_escape(who)} {d} {head_tex} {latex_escape(value)}"


def _companions_table(lay: _Rows, comp, about: str, label_columns) -> Table:
    gis = sorted({gi for gi, _ in comp})
    rows = [Row(lay.row_labels(gi, c), tuple(_cell(lay.cell(gi, c, d, s, "shown"), lay.keep_std(gi, gis))
                                            for d in DIRECTIONS for s in COMPANION_STATS)) for gi, c in comp]
    marks = Marks()
    _mode_note(lay.shown_modes(gis), [], marks)
    marks.note("Threshold-free companions (beyond the paper), from the normalised weights u of each query's "
               "negatives: N_eff = exp(H(u)), inverse Simpson 1/Σu², top-1 share max u; for the triplet losses "
               "the weights are the 0/1 violations.",
               r"Threshold-free companions (beyond the paper), from the normalised weights $u$ of each query's "
               r"negatives: $N_{\mathrm{eff}} = \exp H(u)$, inverse Simpson $1/\sum u^2$, top-1 share $\max u$; "
               r"for the triplet losses the weights are the 0/1 violations.")
    return Table(f"Companions: the effective number of contributing negatives{about}; "
                 f"{_spread_phrase([lay.groups[i] for i in gis])}", label_columns,
                 _stat_columns(COMPANION_STATS), rows, marks.footnotes, key="companions")


def _mode_note(modes: set, other_values: list[tuple[str, str]], marks: Marks) -> None:
    """One note per table: the counting mode shown and, where the other mode differs (†), its values."""
    if len(modes) <= 1:
        shown = next(iter(modes), False)
        head = f"Counting: {mode_name(shown)}."
        other = mode_name(not shown)
    else:
        head, other = "Counting: each result's own mode (mixed).", "the other mode"
    if not other_values:
        marks.note(head)
        return
    plain = f"{head} {DAGGER} differs in {other} counting: " + "; ".join(p for p, _ in other_values) + "."
    tex = (latex_escape(head) + r" $\dagger$ differs by more than " + f"{ALT_TOLERANCE:g} in " + latex_escape(other)
           + " counting (values in tables.md).")
    marks.note(plain, tex)


def _num(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def label_name(groups: Sequence[Group]) -> str:
    """The name in the LaTeX labels of tables of these groups, from what they are: one result, its dataset, model,
    loss, seed and (a checkpoint other than ``model_best``) the checkpoint's name, e.g. ``f30k-vsepp-triplet-s0``;
    several, ``report`` (a written report names its tables after its folder: :func:`relabel`)."""
    results = [r for g in groups for r in g.results]
    if len(results) != 1:
        return "report"
    r, g = results[0], groups[0]
    stem = Path(r.source.path).name.split(".")[0] if r.source.kind == "analyze" else ""
    parts = (g.dataset, g.model, g.loss, f"s{r.replicate}", "" if stem == "model_best" else stem)
    return "-".join(slug(p) for p in parts if p)


def relabel(tables: Sequence[Table], name: str, prefix: str | None = None) -> list[Table]:
    """The tables with LaTeX labels ``[PREFIX-]NAME-ROLE`` (:func:`cocos.report.tables.latex_label`)."""
    return [replace(t, label=latex_label(t.key, name, prefix)) for t in tables]


def _eps_note(counters: Sequence[str], groups: Sequence[Group], gis: Sequence[int], marks: Marks) -> None:
    own = [groups[i].results[0].own_eps() for i in gis]
    values = sorted({eps[c] for eps in own for c in counters if c in eps and not np.isnan(eps[c])})
    if values:
        marks.note(f"Threshold ε = {', '.join(f'{v:g}' for v in values)}.")


def build_tables(groups: Sequence[Group], compat: bool | None = None, counters: str = "own", *,
                 name: str | None = None, label_prefix: str | None = None) -> list[Table]:
    """Table 1 (when any group was evaluated) and the COCOS tables, labelled ``[label_prefix-]name-ROLE``
    (``name`` default: :func:`label_name`)."""
    t1 = retrieval_table(groups)
    tables = ([t1] if t1 is not None else []) + cocos_tables(groups, compat, counters)
    return relabel(tables, name or label_name(groups), label_prefix)
