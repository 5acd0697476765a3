"""The one table builder: Table 1 and the paper's Tables 2-4 for one result or many.

Results (:class:`~cocos.results.Results`, from ``cocos analyze`` or ``cocos
count``) are grouped by their metadata, never by file name: dataset =
``data.name``, model = ``model.label``, training loss = ``training.loss`` (none for
``cocos count``). The results of a group are replicates (seeds: the training seed
of a checkpoint, the counting seed of an embeddings file). One result is a group
of one, so ``cocos analyze``, ``cocos count`` and ``cocos report`` share this code.

Rows of a COCOS table are (group, counter) pairs. Which counters a group shows:
``counters="all"``, every counter it was counted with; ``"own"`` (``cocos report``),
its training loss's counter, and every counter for results without a training
loss. Each loss family's spec says which paper table it belongs to and which
statistics that table shows; families without a paper table get a table of
their own. Nothing here names a loss.

Cells over replicates
---------------------
A column never mixes kinds of spread, and every caption says which it shows:

* Table 1: mean ± sample std (ddof 1) over seeds; a single seed shows its value.
* COCOS tables: a result's statistic is already a mean over training-set batches.
  With one result per row the cell is its batch mean ± batch std; with several
  seeds, the mean over seeds of those means ± their sample std over seeds (rows with
  a single seed then show the mean alone).
* Results of the same seed and configuration are not replicates: they are refused
  (``cocos analyze --label`` keeps checkpoints of one run apart as separate rows).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cocos.errors import CocosError
from cocos.objectives.spec import format_value
from cocos.presentation import LAST, Presentation, ranked
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
    mode_name,
)
from cocos.results import Results, lookup

DATASET_NAMES = {"f30k": "Flickr30k", "f30k_precomp": "Flickr30k", "flickr30k": "Flickr30k",
                 "coco": "MS-COCO", "coco_precomp": "MS-COCO", "mscoco": "MS-COCO"}
NO_LOSS = "-"  # the training-loss label of a result without one (cocos count)


def dataset_name(name: str) -> str:
    return DATASET_NAMES.get(name, name)


def loss_label(name: str | None, results: Results) -> str:
    """A loss's label as the results file describes it ("-" for none)."""
    return NO_LOSS if name is None else results.look(name).label


def load_results(paths: Iterable[str | os.PathLike]) -> list[Results]:
    """``results.json`` files, and folders (every ``results.json`` below them, sorted)."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(p.rglob("results.json"))
            if not found:
                raise CocosError(f"{p}: a folder without any results.json")
            files += found
        else:
            files.append(p)
    if not files:
        raise CocosError("no results files given")
    return [Results.read(f) for f in files]


# --------------------------------------------------------------------------- grouping


@dataclass
class Group:
    """The replicates of one experiment: dataset × model × training loss."""

    dataset: str
    model: str
    loss: str | None
    results: list[Results] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def labels(self) -> tuple[str, str, str]:
        return (dataset_name(self.dataset), self.model, loss_label(self.loss, self.results[0]))

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.model}/{self.loss or NO_LOSS}"

    def counters(self, which: str = "own") -> list[str]:
        """The counters this group shows (see the module docstring), in the families' order."""
        counted = list(self.results[0].counting.losses)
        if which == "own" and self.loss is not None:
            return [self.loss] if self.loss in counted else []
        return ranked(counted, self.results[0].presentation)

    def sort_key(self):
        rank = self.results[0].look(self.loss).rank if self.loss is not None else LAST
        shown = dataset_name(self.dataset)
        return ({"Flickr30k": 0, "MS-COCO": 1}.get(shown, 2), self.dataset, _natural(self.model), rank,
                self.loss or "")


def _natural(text: str) -> tuple:
    """Sort key that puts "epoch 2" before "epoch 10"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _counting_settings(r: Results, losses=None) -> str:
    """Batch size and counter parameters (of ``losses``, default all counted ones): equal for replicates."""
    c = r.counting
    params = c.params if losses is None else {k: v for k, v in c.params.items() if k in losses}
    return f"batch {c.batch_size}, params {json.dumps(params, sort_keys=True)}"


def group_results(results: Sequence[Results]) -> tuple[list[Group], list[str]]:
    """Group by (dataset, model label, training loss); returns the sorted groups and warnings."""
    seen: dict[tuple, str] = {}
    for r in results:  # the same analysis twice would pose as two replicates
        key = (r.source.sha256, r.model.label, r.counting.seed, _counting_settings(r),
               tuple(r.counting.losses), r.counting.compat)
        if r.source.sha256 and key in seen:
            raise CocosError(f"{r.where}: counts the same {'checkpoint' if r.source.kind == 'analyze' else 'file'} "
                             f"in the same way as {seen[key]}; give each once")
        seen[key] = r.where
    by_key: dict[tuple, Group] = {}
    for r in results:
        loss = r.training.loss if r.training is not None else None
        key = (r.data.name, r.model.label, loss)
        by_key.setdefault(key, Group(*key)).results.append(r)
    groups = sorted(by_key.values(), key=Group.sort_key)
    warnings: list[str] = []
    for g in groups:
        shared = set.intersection(*(set(r.counting.losses) for r in g.results))
        settings = {_counting_settings(r, shared) for r in g.results}
        if len(settings) > 1:
            which = " vs ".join(sorted(settings))
            raise CocosError(f"{g.name}: results were counted with different settings ({which}); "
                             "count them alike (batch size, eps, margin/tau) before merging")
        g.results.sort(key=lambda r: (r.replicate, r.where))
        for seed, n in sorted(Tally(r.replicate for r in g.results).items()):
            if n > 1:  # the same seed and configuration twice is one experiment, not two replicates
                files = " and ".join(r.where for r in g.results if r.replicate == seed)
                raise CocosError(f"{g.name}: {files} have the same seed ({seed}) and configuration, so they are not "
                                 "replicates; keep them apart with a label (cocos analyze CKPT --label last, "
                                 "cocos count EMB --label 'tau 0.05')")
    fingerprints: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for g in groups:
        for r in g.results:
            if r.source.kind == "analyze":  # a count result's fingerprint is its embeddings file, not the data
                fingerprints[g.dataset][r.data.fingerprint].append(f"{g.model}/{g.loss or NO_LOSS}")
    for dataset, fps in fingerprints.items():
        if len(fps) > 1:
            parts = "; ".join(f"{fp[:12]} in {', '.join(sorted(set(who)))}" for fp, who in sorted(fps.items()))
            warnings.append(f"dataset '{dataset}': results carry different data fingerprints ({parts}); "
                            "they may not be counted on the same data")
    if len({r.counting.compat for r in results}) > 1:
        warnings.append("results were counted in different modes (compat and corrected); each file's own "
                        "mode is shown unless a mode is chosen")
    return groups, warnings


# --------------------------------------------------------------------------- statistics as a long table


def select_stats(r: Results, compat: bool | None = None) -> tuple[dict, dict | None, bool]:
    """``(shown, other, shown_is_compat)``; ``compat=None`` shows the mode the file was counted in."""
    own = bool(r.counting.compat)
    if compat is None or compat == own:
        return r.stats, r.alt_stats, own
    if r.alt_stats is None:
        raise CocosError(f"{r.where}: has no {mode_name(compat)} statistics (counted {mode_name(own)} only)")
    return r.alt_stats, r.stats, compat


def stat_frame(groups: Sequence[Group], compat: bool | None = None) -> pd.DataFrame:
    """One row per (group, replicate, counter, direction, stat, which) with mean, std, n, n_skipped.

    ``which`` is ``"shown"`` (the selected mode) or ``"other"`` (the other mode).
    """
    rows = []
    for gi, g in enumerate(groups):
        for ri, r in enumerate(g.results):
            shown, other, is_compat = select_stats(r, compat)
            for which, tree in (("shown", shown), ("other", other)):
                for loss, by_dir in (tree or {}).items():
                    for d, stats in by_dir.items():
                        for stat, e in stats.items():
                            rows.append({"group": gi, "replicate": ri, "counter": loss, "direction": d,
                                         "stat": stat, "which": which, "compat": is_compat != (which == "other"),
                                         "mean": np.nan if e.get("mean") is None else float(e["mean"]),
                                         "std": np.nan if e.get("std") is None else float(e["std"]),
                                         "n": int(e.get("n", 0)), "n_skipped": int(e.get("n_skipped", 0))})
    return pd.DataFrame(rows, columns=["group", "replicate", "counter", "direction", "stat", "which", "compat",
                                       "mean", "std", "n", "n_skipped"])


def aggregate(frame: pd.DataFrame, groups: Sequence[Group]) -> pd.DataFrame:
    """Cells per (group, counter, direction, stat, which).

    One replicate keeps its batch mean ± batch std (``spread="batches"``); several give
    the mean over replicates ± the *sample* std (ddof 1) over replicates (``spread="seeds"``).
    A statistic missing in one replicate has no honest value (NaN).
    """
    keys = ["group", "counter", "direction", "stat", "which"]
    g = frame.groupby(keys, sort=False)
    seeds = g["mean"].agg(lambda v: tuple(_nan(x) for x in over_seeds(v)))  # the one aggregation over replicates
    out = pd.DataFrame({
        "replicates": g["mean"].size(),
        "seed_mean": seeds.map(lambda t: t[0]),
        "seed_std": seeds.map(lambda t: t[1]),
        "first_mean": g["mean"].first(),
        "first_std": g["std"].first(),
        "n_skipped": g["n_skipped"].sum(),
        "n_batches": g["n"].sum() + g["n_skipped"].sum(),
    }).reset_index()
    size = out["group"].map(lambda i: groups[i].n)
    single = size == 1
    out["mean"] = np.where(single, out["first_mean"], out["seed_mean"])
    out["std"] = np.where(single, out["first_std"], out["seed_std"])
    out["spread"] = np.where(single, "batches", "seeds")
    out.loc[out["replicates"] < size, ["mean", "std"]] = np.nan
    return out.set_index(keys)


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


def retrieval_table(groups: Sequence[Group]) -> Table | None:
    """Table 1 over the groups that were evaluated (None if none was): the paper's columns, one compact table.

    Label columns that are the same in every row (a loss over epochs) go to the caption. With seeds the LaTeX
    cells of the recalls and mAP@5 show the mean (their std is in markdown); rsum keeps its ± there too.
    """
    evaluated = [g for g in groups if all(r.evaluation is not None for r in g.results)]
    if not evaluated:
        return None
    seeds = any(g.n > 1 for g in evaluated)
    names = ("Dataset", "Model", "#", "Loss", "Param.")
    rows = [((dataset_name(g.dataset), g.model, str(i), loss_label(g.loss, g.results[0]),
              _params_text(_shown_params(g))[0]), _metric_cells(g)) for i, g in enumerate(evaluated, start=1)]
    varies = {name for j, name in enumerate(names) if len({labels[j] for labels, _ in rows}) > 1}
    keep = [j for j, name in enumerate(names) if name in varies or name == "#" or
            (len(rows) == 1 and name in ("Loss", "Param."))]
    fixed = {name: rows[0][0][j] for j, name in enumerate(names) if j not in keep}
    where = "".join(text.format(fixed[name]) for name, text in (
        ("Model", " of {}"), ("Loss", " trained with the {}"), ("Param.", " ({})"), ("Dataset", " on {}"))
        if name in fixed)
    split = "/".join(sorted({r.evaluation.split for g in evaluated for r in g.results}))
    ns = sorted({g.n for g in evaluated})
    spread = "one run per row" if not seeds else (
        f"mean ± sample std over {', '.join(str(n) for n in ns if n > 1)} seeds"
        + (" (rows of one seed: the value alone)" if 1 in ns else ""))
    title = f"Table 1: Retrieval on the {split} split{where}, {spread}"
    columns = tuple(Column(name, group, latex_std=not seeds or name == "rsum") for group, name, _, _ in TABLE1_KEYS)
    notes = [Footnote("Recalls and mAP@5 (image to text) in percent; rsum is the sum of the six recalls."
                      + (" In LaTeX only rsum shows its std (the others are in tables.md)." if seeds else ""))]
    return Table(title, tuple(names[j] for j in keep), columns,
                 [Row(tuple(labels[j] for j in keep), cells) for labels, cells in rows], notes, key="retrieval",
                 stack=False)


def _metric_cells(g: Group) -> tuple[Cell, ...]:
    return tuple(Cell(*over_seeds([PERCENT.get(key, 1.0) * r.evaluation.metrics.get(key, np.nan) for r in g.results]),
                      digits=digits) for _, _, key, digits in TABLE1_KEYS)


def over_seeds(values) -> tuple[float | None, float | None]:
    """The one aggregation over replicates: mean and sample std (ddof 1) of the values that are not NaN (mean None
    without any, std None with fewer than two)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return (float(v.mean()) if v.size else None), (float(v.std(ddof=1)) if v.size > 1 else None)


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
    cells: pd.DataFrame
    modes: dict
    labels: dict
    single: bool
    one_context: bool
    extra_counter: bool

    def row_labels(self, gi: int, c: str) -> tuple[str, ...]:
        if self.single:
            return (self.labels[c],)
        g = self.groups[gi]
        return (*(() if self.one_context else (dataset_name(g.dataset), g.model)), loss_label(g.loss, g.results[0]),
                *((self.labels[c],) if self.extra_counter else ()))

    def cell(self, gi, c, d, s, which):
        key = (gi, c, d, s, which)
        return self.cells.loc[key] if key in self.cells.index else None

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
    shown = frame[frame["which"] == "shown"]
    pairs = [(gi, c) for gi, g in enumerate(groups) for c in g.counters(counters)]
    looks = {c: groups[gi].results[0].look(c) for gi, c in pairs}
    single = len(groups) == 1
    contexts = {(groups[gi].dataset, groups[gi].model) for gi, _ in pairs}
    lay = _Rows(groups, aggregate(frame, groups), {gi: set(map(bool, v)) for gi, v in shown.groupby("group")["compat"]},
                {c: look.label for c, look in looks.items()}, single, not single and len(contexts) == 1,
                not single and any(groups[gi].loss != c for gi, c in pairs))
    label_columns = ("Counter",) if single else (*(() if lay.one_context else ("Dataset", "Model")), "Loss",
                                                  *(("Counter",) if lay.extra_counter else ()))
    about = f": {_describe(groups[0])}" if single else ""
    if lay.one_context:
        dataset, model = next(iter(contexts))
        about = f": {model} on {dataset_name(dataset)}"
    tables = [_paper_table(lay, spec, [(gi, c) for gi, c in pairs if c in spec.counters], looks, about, label_columns)
              for spec in table_specs([c for _, c in pairs], looks)]
    comp = [(gi, c) for gi, c in pairs if any(lay.cell(gi, c, d, s, "shown") is not None
                                               for d in DIRECTIONS for s in COMPANION_STATS)]
    if comp:
        tables.append(_companions_table(lay, comp, about, label_columns))
    return [_constant_labels_to_title(t) for t in tables]


def _constant_labels_to_title(table: Table) -> Table:
    """Label columns with one value in every row (a run's epochs: dataset, loss) go to the title, once."""
    if len(table.rows) < 2:
        return table
    same = [i for i in range(len(table.label_columns) - 1) if len({r.labels[i] for r in table.rows}) == 1]
    if not same:
        return table
    keep = [i for i in range(len(table.label_columns)) if i not in same]
    fixed = ", ".join(f"{table.label_columns[i].lower()} {table.rows[0].labels[i]}" for i in same)
    return Table(f"{table.title} ({fixed})", tuple(table.label_columns[i] for i in keep), table.columns,
                 [Row(tuple(r.labels[i] for i in keep), r.cells) for r in table.rows], table.footnotes,
                 key=table.key, stack=table.stack)


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
    return Table(f"{spec.title}{about}; {_spread_phrase([lay.groups[i] for i in gis])}", label_columns,
                 _stat_columns(spec.stats), rows, marks.footnotes, key=spec.key)


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


def label_prefix(groups: Sequence[Group], *options) -> str:
    """What makes LaTeX labels unique: a readable part (one result: its dataset, model, loss and seed) and a digest
    of the results and the options that shaped the tables, so the tables of every report can go into one paper
    without a multiply defined label."""
    results = [r for g in groups for r in g.results]
    what = sorted(f"{r.source.sha256}/{r.model.label}/{r.replicate}/{r.counting.compat}" for r in results)
    digest = hashlib.sha256("\n".join([*what, *map(str, options)]).encode()).hexdigest()[:6]
    if len(results) > 1:
        return f"report-{digest}"
    r, g = results[0], groups[0]
    return "-".join(str(p) for p in (g.dataset, g.model, g.loss, f"s{r.replicate}", digest) if p is not None)


def _eps_note(counters: Sequence[str], groups: Sequence[Group], gis: Sequence[int], marks: Marks) -> None:
    values = sorted({lookup(g.results[0].counting.params, c, "eps") for c in counters
                     for g in (groups[i] for i in gis)} - {None})
    if values:
        marks.note(f"Threshold ε = {', '.join(f'{v:g}' for v in values)}.")


def build_tables(groups: Sequence[Group], compat: bool | None = None, counters: str = "own") -> list[Table]:
    """Table 1 (when any group was evaluated) and the COCOS tables."""
    t1 = retrieval_table(groups)
    tables = ([t1] if t1 is not None else []) + cocos_tables(groups, compat, counters)
    prefix = label_prefix(groups, compat, counters)
    for t in tables:
        t.key = f"{prefix}-{t.key}"
    return tables


def replicate_means(g: Group, counter: str, direction: str, stat: str, compat: bool | None = None) -> list[float]:
    """The batch mean of one statistic in each replicate of a group that has it."""
    out = []
    for r in g.results:
        entry = lookup(select_stats(r, compat)[0], counter, direction, stat)
        if entry is not None and entry.get("mean") is not None:
            out.append(float(entry["mean"]))
    return out


def cocos_vs_rsum_rows(groups: Sequence[Group], compat: bool | None = None) -> pd.DataFrame:
    """Tidy rows per group with a training loss and an evaluation, both directions: the main count of the
    group's own loss and the test rsum, means over seeds with their sample std over seeds (NaN for one seed)."""
    rows = []
    for g in groups:
        if g.loss is None or any(r.evaluation is None for r in g.results):
            continue
        stat = g.results[0].look(g.loss).main_stat
        rsum, rsum_std = over_seeds([r.evaluation.metrics.get("rsum", np.nan) for r in g.results])
        for d in DIRECTIONS:
            cocos, cocos_std = over_seeds(replicate_means(g, g.loss, d, stat, compat))
            if cocos is not None:
                rows.append({"label": " ".join(g.labels), "model": g.model, "loss": g.loss, "direction": d,
                             "stat": stat, "rsum": _nan(rsum), "cocos": cocos, "rsum_std": _nan(rsum_std),
                             "cocos_std": _nan(cocos_std), "n": g.n})
    return pd.DataFrame(rows, columns=["label", "model", "loss", "direction", "stat", "rsum", "cocos", "rsum_std",
                                       "cocos_std", "n"])


def _nan(x: float | None) -> float:
    return np.nan if x is None else x


# -- a whole report: build once, write atomically ---------------------------------------------


@dataclass
class Report:
    """Loaded results grouped by (dataset, model, loss), their tables and warnings."""

    results: list[Results]
    groups: list[Group]
    warnings: list[str]
    tables: list
    compat: bool | None
    label: str | None = None

    @property
    def sources(self) -> list[str]:
        return [r.where for r in self.results]

    @property
    def looks(self) -> dict[str, Presentation]:
        """Every loss's presentation, as the results files describe it (the first file that does wins)."""
        out: dict[str, Presentation] = {}
        for r in self.results:
            for name, look in r.presentation.items():
                out.setdefault(name, look)
        return out


LABELS = ("epoch",)  # cocos report --label: what tells results of one run apart


def label_by_epoch(results: Sequence[Results]) -> None:
    """Show each checkpoint's epoch in its model label (``VSE++ (epoch 5)``), so one run's epochs form rows."""
    for r in results:
        if r.source.kind == "analyze" and r.source.epoch is not None:
            r.model.label = f"{r.model.label} (epoch {r.source.epoch})"


def build_report(paths: Iterable[str | os.PathLike], compat: bool | None = None, counters: str = "own",
                 label: str | None = None) -> Report:
    """Load (files or folders), group (from the files' metadata) and tabulate results.

    ``label="epoch"`` keeps the checkpoints of one run apart by their epoch (``cocos train --save-every``).
    """
    if label is not None and label not in LABELS:
        raise CocosError(f"unknown --label '{label}' (choose from {', '.join(LABELS)})")
    loaded = load_results(paths)
    if label == "epoch":
        label_by_epoch(loaded)
    groups, warnings = group_results(loaded)
    return Report(loaded, groups, warnings, build_tables(groups, compat, counters), compat, label)


def report_title(report: Report) -> str:
    """What a report's figure shows: models, data and the counting mode."""
    models = ", ".join(dict.fromkeys(g.model for g in report.groups))
    data = ", ".join(dict.fromkeys(dataset_name(g.dataset) for g in report.groups))
    modes = {select_stats(r, report.compat)[2] for r in report.results}
    mode = mode_name(next(iter(modes))) if len(modes) == 1 else "mixed modes"
    return f"COCOS vs retrieval: {models} on {data} ({mode} counting)"


def render_report(report: Report, latex_width: str = "column") -> tuple[str, str]:
    """The contents of ``tables.md`` and ``tables.tex`` (LaTeX set to fit ``latex_width``: column or page)."""
    from cocos.report.tables import to_latex, to_markdown

    md = ["# COCOS report", "", "Results files:", ""]
    md += [f"- `{s}`" for s in report.sources]
    if report.warnings:
        md += ["", "Warnings:", ""] + [f"- {w}" for w in report.warnings]
    md.append("")
    md += [to_markdown(t) for t in report.tables]
    fit = "one LNCS column (12.2 cm)" if latex_width == "column" else "a page (table*, at the 12.2 cm LNCS text width)"
    tex = [f"% Generated by `cocos report`; needs only booktabs and amsmath; set to fit {fit}.",
           *(f"% {s}" for s in report.sources), ""]
    tex += [to_latex(t, width=latex_width) for t in report.tables]
    return "\n".join(md), "\n".join(tex)


def write_report(report: Report, out: str | os.PathLike, readme: str | None = None,
                 overwrite: bool = False, latex_width: str = "column") -> list[Path]:
    """Write tables.md, tables.tex and cocos_vs_rsum.{png,pdf} (and README.md) as one atomic folder."""
    from cocos.io import atomic_dir
    from cocos.report.figures import plot_cocos_vs_rsum

    md, tex = render_report(report, latex_width)
    out = Path(out)
    with atomic_dir(out, report.sources, overwrite) as tmp:
        (tmp / "tables.md").write_text(md, encoding="utf-8")
        (tmp / "tables.tex").write_text(tex, encoding="utf-8")
        rows = cocos_vs_rsum_rows(report.groups, compat=report.compat)
        if len(rows):  # count results have no rsum: no figure
            plot_cocos_vs_rsum(rows, tmp / "cocos_vs_rsum", title=report_title(report), looks=report.looks)
        _training_figures(report, tmp)
        if readme is not None:
            (tmp / "README.md").write_text(readme, encoding="utf-8")
    return sorted(p for p in out.iterdir() if not p.name.startswith("."))


# -- training: COCOS over steps and epochs, LTD's multiplier ------------------------------------


def _run_label(r: Results) -> str:
    """A run's name in the training figures: model (without an epoch label) and training loss."""
    model = re.sub(r" \(epoch \d+\)$", "", r.model.label)
    return f"{model}, {loss_label(r.training.loss, r)}" if r.training is not None else model


def training_logs(results: Sequence[Results]):
    """``(track, steps)``: each run's COCOS track (its own loss's counter) and step log, one per run folder.

    Results next to a ``cocos_track.csv``/``train_log.csv`` (written by ``cocos analyze``) count; of
    several checkpoints of one run the latest epoch's copy is used. Either frame is ``None`` if absent.
    """
    from cocos.training.logs import read_logs

    latest: dict[str, Results] = {}
    for r in results:
        if r.source.kind == "analyze" and r.path is not None and r.training is not None:
            run = str(Path(r.source.path).resolve().parent)
            if run not in latest or (r.source.epoch or 0) > (latest[run].source.epoch or 0):
                latest[run] = r
    tracks, steps = [], []
    for r in latest.values():
        logs = read_logs(Path(r.path).parent)
        label = _run_label(r)
        if logs.track is not None:
            own = logs.track[logs.track["loss"] == r.training.loss]
            tracks.append(own.assign(label=label))
        if logs.has_ltd:
            steps.append(logs.steps.assign(label=label))
    return (pd.concat(tracks, ignore_index=True) if tracks else None,
            pd.concat(steps, ignore_index=True) if steps else None)


def epoch_rows(groups: Sequence[Group], compat: bool | None = None) -> pd.DataFrame:
    """Tidy rows (label, loss, epoch, direction, stat, value) of each checkpoint: the main statistic of every counter
    it was counted with (the paper's and its training loss's own; ``loss`` names the counter) and its test rsum
    (``loss`` and ``stat`` ``rsum``, direction ``both``), means over seeds."""
    rows = []
    for g in groups:
        r0 = g.results[0]
        if r0.source.epoch is None:
            continue
        label = _run_label(r0)
        for counter in ranked(r0.counting.losses, r0.presentation):
            stat = r0.look(counter).main_stat
            for d in DIRECTIONS:
                value, _ = over_seeds(replicate_means(g, counter, d, stat, compat))
                if value is not None:
                    rows.append((label, counter, r0.source.epoch, d, stat, value))
        rsum, _ = over_seeds([r.evaluation.metrics.get("rsum", np.nan) for r in g.results if r.evaluation is not None])
        if rsum is not None:
            rows.append((label, "rsum", r0.source.epoch, "both", "rsum", rsum))
    return pd.DataFrame(rows, columns=["label", "loss", "epoch", "direction", "stat", "value"])


def _training_figures(report: Report, folder: Path) -> None:
    from cocos.report.training import plot_by_epoch, plot_track, plot_training

    track, steps = training_logs(report.results)
    if track is not None and len(track):
        plot_track(track, folder / "cocos_track", title="COCOS of each model's training loss on its training batches",
                   looks=report.looks)
    if steps is not None and len(steps):
        plot_training(steps, folder / "ltd", title="LTD during training")
    if report.label == "epoch":
        rows = epoch_rows(report.groups, report.compat)
        if len(rows):
            plot_by_epoch(rows, folder / "cocos_by_epoch", looks=report.looks,
                          title="COCOS of every counter at the saved checkpoints, and test rsum")
