"""``cocos report RESULTS...``: load many ``results.json``, group them, build the paper's tables.

Grouping uses only the metadata inside each file (never its name): dataset =
``data.name``, model = ``model.kind``, training loss = ``training.loss``; the
files of a group are seeds (``training.seed``) of one experiment.

Cells over seeds
----------------
* Table 1 (retrieval): mean ± population std (``numpy.std``) over seeds of each
  checkpoint's test metric; with a single seed the value alone (``n = 1``).
* Tables 2-4 (COCOS): each group shows the counter of its OWN training loss. A
  checkpoint's statistic is already a mean over training-set batches; the cell is
  the mean over seeds of those per-checkpoint means ± the population std over
  seeds of the same means. With a single seed the cell is that checkpoint's batch
  mean ± batch std, and a footnote says so.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cocos.errors import CocosError
from cocos.report.tables import (
    COMPANION_STATS,
    DIRECTIONS,
    LOSS_ORDER,
    MAIN_STAT,
    PAPER_STATS,
    RETRIEVAL_COLUMNS,
    RETRIEVAL_KEYS,
    SMOOTHAP_ARTEFACT,
    SMOOTHAP_ARTEFACT_TEX,
    STAT_HEADERS,
    TRIPLET_COMPAT,
    TRIPLET_COMPAT_TEX,
    Cell,
    Column,
    Footnote,
    Marks,
    Row,
    Table,
    differs,
    fmt,
    latex_escape,
    loss_name,
    mode_name,
    model_name,
)

# Keys every results file must have (dotted paths).
REQUIRED_KEYS = ("data.name", "data.fingerprint", "model.kind", "training.loss", "training.seed",
                 "counting.compat", "stats", "evaluation.metrics")
DATASET_NAMES = {"f30k": "Flickr30k", "f30k_precomp": "Flickr30k", "flickr30k": "Flickr30k",
                 "coco": "MS-COCO", "coco_precomp": "MS-COCO", "mscoco": "MS-COCO"}
SOURCE = "_source"
LABELS = ("Dataset", "Model", "Loss")  # key added by load_results: the file a result came from


# --------------------------------------------------------------------------- loading


def _has(tree, dotted: str) -> bool:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return False
        tree = tree[key]
    return True


def load_result(path: str | os.PathLike) -> dict:
    """One ``results.json`` as a dict (plus ``_source``); a bad file is one CocosError line naming it."""
    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such file")
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, not a results.json file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CocosError(f"{path}: cannot be read ({type(exc).__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise CocosError(f"{path}: invalid JSON ({exc.msg} at {where})") from None
    if not isinstance(data, dict):
        raise CocosError(f"{path}: not a cocos results file (top level is a {type(data).__name__}, "
                         "expected an object)")
    missing = [k for k in REQUIRED_KEYS if not _has(data, k)]
    if missing:
        raise CocosError(f"{path}: not a cocos results file (missing {', '.join(missing)})")
    if not isinstance(data["stats"], dict) or not isinstance(data["evaluation"]["metrics"], dict):
        raise CocosError(f"{path}: not a cocos results file ('stats', 'evaluation.metrics' must be objects)")
    if "alt_stats" in data and data["alt_stats"] is not None and not isinstance(data["alt_stats"], dict):
        raise CocosError(f"{path}: not a cocos results file ('alt_stats' must be an object)")
    return {**data, SOURCE: str(path)}


def load_results(paths: Iterable[str | os.PathLike]) -> list[dict]:
    paths = list(paths)
    if not paths:
        raise CocosError("no results files given")
    return [load_result(p) for p in paths]


# --------------------------------------------------------------------------- grouping


def dataset_name(name: str) -> str:
    return DATASET_NAMES.get(name, name)


def _dataset_rank(name: str) -> tuple[int, str]:
    shown = dataset_name(name)
    order = {"Flickr30k": 0, "MS-COCO": 1}
    return (order.get(shown, 2), name)


def _loss_rank(loss: str) -> tuple[int, str]:
    return (LOSS_ORDER.index(loss) if loss in LOSS_ORDER else len(LOSS_ORDER), loss)


@dataclass
class Group:
    """The results (seeds) of one experiment: dataset × model × training loss."""

    dataset: str
    model: str
    loss: str
    results: list[dict] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return [r["training"]["seed"] for r in self.results]

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def labels(self) -> tuple[str, str, str]:
        return (dataset_name(self.dataset), model_name(self.model), loss_name(self.loss))

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.model}/{self.loss}"

    def sort_key(self):
        return (_dataset_rank(self.dataset), self.model, _loss_rank(self.loss))


def _source(result: dict) -> str:
    return str(result.get(SOURCE, "?"))


def _counting_settings(result: dict) -> str:
    """What must be equal for two results to be replicates: counting batch size and counter parameters."""
    c = result["counting"]
    return f"batch {c.get('batch_size')}, params {json.dumps(c.get('params', {}), sort_keys=True)}"


def group_results(results: Sequence[dict]) -> tuple[list[Group], list[str]]:
    """Group by (data.name, model.kind, training.loss); seeds are replicates.

    Returns the groups (sorted dataset, model, loss in the paper's order) and
    warnings: a seed twice in one group, different data fingerprints under one
    dataset name, different counting modes across the files.
    """
    seen: dict[str, str] = {}
    for r in results:  # the same analysis twice would pose as two seeds
        sha = str(r.get("checkpoint", {}).get("sha256", ""))
        if sha and sha in seen:
            raise CocosError(f"{_source(r)}: analyses the same checkpoint as {seen[sha]}; give each once")
        seen[sha] = _source(r)
    by_key: dict[tuple[str, str, str], Group] = {}
    for r in results:
        key = (str(r["data"]["name"]), str(r["model"]["kind"]), str(r["training"]["loss"]))
        by_key.setdefault(key, Group(*key)).results.append(r)
    groups = sorted(by_key.values(), key=Group.sort_key)
    for g in groups:  # replicates must be counted alike, or their mean means nothing
        settings = {_counting_settings(r) for r in g.results}
        if len(settings) > 1:
            which = " vs ".join(sorted(settings))
            raise CocosError(f"{g.name}: results were counted with different settings ({which}); "
                             "analyse them alike (batch size, eps, margin/tau) before merging")
    warnings: list[str] = []
    for g in groups:
        g.results.sort(key=lambda r: (str(r["training"]["seed"]), _source(r)))
        counts = Counter(str(s) for s in g.seeds)
        for seed, n in sorted(counts.items()):
            if n > 1:
                files = ", ".join(_source(r) for r in g.results if str(r["training"]["seed"]) == seed)
                warnings.append(f"{g.name}: seed {seed} appears {n} times ({files}); "
                                "each file is used as a separate replicate")
    fingerprints: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for g in groups:
        for r in g.results:
            fingerprints[g.dataset][str(r["data"]["fingerprint"])].append(f"{g.model}/{g.loss}")
    for dataset, fps in fingerprints.items():
        if len(fps) > 1:
            parts = "; ".join(f"{fp} in {', '.join(sorted(set(who)))}" for fp, who in sorted(fps.items()))
            warnings.append(f"dataset '{dataset}': results carry different data fingerprints ({parts}); "
                            "they may not be counted on the same data")
    modes = {bool(r["counting"]["compat"]) for r in results}
    if len(modes) > 1:
        warnings.append("results were counted in different modes (compat and corrected); each file's own "
                        "mode is shown unless a mode is chosen")
    return groups, warnings


# --------------------------------------------------------------------------- aggregation


def seed_summary(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and population std over the non-missing values, and how many there were."""
    ok = np.array([float(v) for v in values if v is not None and not np.isnan(float(v))], dtype=np.float64)
    if ok.size == 0:
        return None, None, 0
    return float(ok.mean()), float(ok.std()), int(ok.size)


def select_stats(result: dict, compat: bool | None = None) -> tuple[dict, dict | None, bool]:
    """``(shown, other, shown_is_compat)``: the statistics of the requested mode and the other mode.

    ``compat=None`` shows the mode the file was counted in (``stats``).
    """
    own = bool(result["counting"]["compat"])
    alt = result.get("alt_stats") or None
    if compat is None or compat == own:
        return result["stats"], alt, own
    if alt is None:
        raise CocosError(f"{_source(result)}: has no {mode_name(compat)} statistics "
                         f"(counted {mode_name(own)} and no alt_stats)")
    return alt, result["stats"], compat


def _entry(stats: dict | None, loss: str, direction: str, stat: str) -> dict | None:
    try:
        entry = stats[loss][direction][stat]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    return entry if isinstance(entry, dict) else None


def group_stat(group: Group, loss: str, direction: str, stat: str, compat: bool | None = None,
               other: bool = False) -> dict | None:
    """``{"mean", "std", "n"}`` of one statistic for a group (see the module docstring).

    ``other=True`` aggregates the other counting mode instead (None if any file lacks it).
    """
    entries = []
    for r in group.results:
        shown, alt, _ = select_stats(r, compat)
        e = _entry(alt if other else shown, loss, direction, stat)
        if other and e is None:
            return None
        entries.append(e or {})
    if len(entries) == 1:
        e = entries[0]
        return {"mean": e.get("mean"), "std": e.get("std"), "n": 1 if e.get("mean") is not None else 0}
    mean, std, n = seed_summary([e.get("mean") for e in entries])
    return {"mean": mean, "std": std, "n": n}


def _modes(groups: Sequence[Group], compat: bool | None) -> set[bool]:
    return {select_stats(r, compat)[2] for g in groups for r in g.results}


def _mode_title(groups: Sequence[Group], compat: bool | None) -> str:
    modes = _modes(groups, compat)
    if len(modes) == 1:
        return f"{mode_name(modes.pop())} counting"
    return "mixed counting modes (each file's own)"


# --------------------------------------------------------------------------- tables


def _seed_notes(groups: Sequence[Group], marks: Marks) -> None:
    single = [g for g in groups if g.n == 1]
    if len(single) == len(groups):
        marks.note("One seed per row: each cell is that checkpoint's mean ± std over training-set batches.")
    else:
        marks.note("Cells: mean over seeds of each checkpoint's mean over training-set batches ± the "
                   "population std over seeds (n seeds as in Table 1).")
        if single:
            names = ", ".join(" / ".join(g.labels) for g in single)
            marks.note(f"Only one seed for {names}: mean ± std over training-set batches of that checkpoint.")


def retrieval_summary_table(groups: Sequence[Group]) -> Table:
    """Table 1: test retrieval, mean ± population std over seeds, and n = number of seeds."""
    rows = []
    for g in groups:
        cells = []
        for _, _, key in RETRIEVAL_KEYS:
            mean, std, n = seed_summary([r["evaluation"]["metrics"].get(key) for r in g.results])
            cells.append(Cell(mean, std if n > 1 else None))
        cells.append(Cell(text=str(g.n)))
        rows.append(Row(g.labels, tuple(cells)))
    notes = [Footnote("Mean ± population std over seeds (numpy.std); a single seed shows its value. "
                      "Recalls in percent, mAP@5 (i2t) on a 0-1 scale, rsum = sum of the six recalls; "
                      "n = number of seeds.")]
    return Table("Table 1: retrieval scores on the test split", LABELS,
                 (*RETRIEVAL_COLUMNS, Column("n", "", "$n$")), rows, notes, key="cocos-retrieval")


def _stat_columns(stats: Sequence[str]) -> tuple[Column, ...]:
    return tuple(Column(STAT_HEADERS.get(s, (s,))[0], d, STAT_HEADERS.get(s, (s, None))[1])
                 for d in DIRECTIONS for s in stats)


def _cocos_rows(groups: Sequence[Group], stats: Sequence[str], compat: bool | None,
                marks: Marks) -> list[Row]:
    rows = []
    for g in groups:
        cells = []
        shown = {select_stats(r, compat)[2] for r in g.results}
        other = mode_name(not next(iter(shown))) if len(shown) == 1 else "other mode"
        for d in DIRECTIONS:
            for s in stats:
                main = group_stat(g, g.loss, d, s, compat) or {}
                alt = group_stat(g, g.loss, d, s, compat, other=True)
                mark = ""
                if alt is not None and differs(main, alt):
                    head_plain, head_tex = STAT_HEADERS.get(s, (s, latex_escape(s)))
                    label = " / ".join(g.labels)
                    value = fmt(alt.get("mean"), alt.get("std"))
                    mark = marks.add(f"{label} {d} {head_plain}, {other}: {value}",
                                     f"{latex_escape(label)} {d} {head_tex}, {latex_escape(other)}: "
                                     f"{latex_escape(value)}")
                cells.append(Cell(main.get("mean"), main.get("std"), mark=mark))
        rows.append(Row(g.labels, tuple(cells)))
    return rows


def report_tables(groups: Sequence[Group], compat: bool | None = None) -> list[Table]:
    """Table 1 and the paper's Tables 2-4 (plus companions) over grouped results.

    Each COCOS row shows the counter of the group's own training loss: Table 2
    the groups trained with triplet / triplet_sh, Table 3 with ntxent, Table 4
    with smoothap. ``compat``: None shows each file's own mode, True / False one
    mode for all (from ``stats`` or ``alt_stats``).
    """
    groups = sorted(groups, key=Group.sort_key)
    tables = [retrieval_summary_table(groups)]
    specs = [
        (("triplet", "triplet_sh"), PAPER_STATS["triplet"], "Table 2: COCOS w.r.t. query q, Triplet loss and "
                                                            "Triplet loss SH", "cocos-triplet"),
        (("ntxent",), PAPER_STATS["ntxent"], "Table 3: COCOS w.r.t. query q, NT-Xent", "cocos-ntxent"),
        (("smoothap",), PAPER_STATS["smoothap"], "Table 4: COCOS w.r.t. query q, SmoothAP", "cocos-smoothap"),
    ]
    for losses, stats, title, key in specs:
        chosen = [g for g in groups if g.loss in losses]
        if not chosen:
            continue
        marks = Marks()
        rows = _cocos_rows(chosen, stats, compat, marks)
        modes = _modes(chosen, compat)
        t2i_alt = any(f.mark and " t2i " in f.text for f in marks.footnotes)
        if "smoothap" in losses and (True in modes or t2i_alt):
            marks.note(SMOOTHAP_ARTEFACT, SMOOTHAP_ARTEFACT_TEX)
        if "triplet" in losses and True in modes and any(g.loss == "triplet" for g in chosen):
            marks.note(TRIPLET_COMPAT, TRIPLET_COMPAT_TEX)
        if "ntxent" in losses:
            marks.note("Weights exclude the 1/τ factor of the gradient; W_low is the weight of the "
                       "negatives under ε (beyond the paper).")
        _seed_notes(chosen, marks)
        tables.append(Table(f"{title} (counter of each row's training loss); {_mode_title(chosen, compat)}",
                            LABELS, _stat_columns(stats), rows, marks.footnotes, key=key))
    comp_groups = [g for g in groups
                   if any(_entry(select_stats(r, compat)[0], g.loss, d, s) for r in g.results
                          for d in DIRECTIONS for s in COMPANION_STATS)]
    if comp_groups:
        rows = []
        for g in comp_groups:
            cells = [Cell((e := group_stat(g, g.loss, d, s, compat) or {}).get("mean"), e.get("std"))
                     for d in DIRECTIONS for s in COMPANION_STATS]
            rows.append(Row(g.labels, tuple(cells)))
        marks = Marks()
        marks.note("Threshold-free companions (beyond the paper) of each row's own training loss: effective "
                   "number of negatives exp(H(u)), inverse Simpson 1/Σu², top-1 share max u.")
        _seed_notes(comp_groups, marks)
        title = f"Companions: effective number of contributing negatives; {_mode_title(comp_groups, compat)}"
        tables.append(Table(title, LABELS, _stat_columns(COMPANION_STATS), rows, marks.footnotes,
                            key="cocos-companions"))
    return tables


def cocos_vs_rsum_rows(groups: Sequence[Group], direction: str = "i2t",
                       compat: bool | None = None) -> list[tuple[str, float, float]]:
    """``(label, rsum mean over seeds, main COCOS count of the group's own loss, mean over seeds)``."""
    rows = []
    for g in groups:
        rsum, _, n = seed_summary([r["evaluation"]["metrics"].get("rsum") for r in g.results])
        stat = group_stat(g, g.loss, direction, MAIN_STAT.get(g.loss, "C_q"), compat) or {}
        if n and stat.get("mean") is not None:
            rows.append((" ".join(g.labels), rsum, float(stat["mean"])))
    return rows


# -- a whole report: build once, write atomically ---------------------------------------------


@dataclass
class Report:
    """Loaded results grouped by (dataset, model, loss), their tables and warnings."""

    results: list[dict]
    groups: list[Group]
    warnings: list[str]
    tables: list
    compat: bool | None

    @property
    def sources(self) -> list[str]:
        return [r[SOURCE] for r in self.results]


def build_report(paths: Iterable[str | os.PathLike], compat: bool | None = None) -> Report:
    """Load, group (from the files' metadata) and tabulate ``results.json`` files."""
    loaded = load_results(paths)
    groups, warnings = group_results(loaded)
    return Report(loaded, groups, warnings, report_tables(groups, compat=compat), compat)


def render_report(report: Report) -> tuple[str, str]:
    """The contents of ``tables.md`` and ``tables.tex``."""
    from cocos.report.tables import to_latex, to_markdown

    md = ["# COCOS report", "", "Results files:", ""]
    md += [f"- `{s}`" for s in report.sources]
    if report.warnings:
        md += ["", "Warnings:", ""] + [f"- {w}" for w in report.warnings]
    md.append("")
    md += [to_markdown(t) for t in report.tables]
    tex = ["% Generated by `cocos report`; \\input{} it in a document that loads booktabs.",
           *(f"% {s}" for s in report.sources), ""]
    tex += [to_latex(t) for t in report.tables]
    return "\n".join(md), "\n".join(tex)


def write_report(
    report: Report, out: str | os.PathLike, readme: str | None = None, overwrite: bool = False
) -> list[Path]:
    """Write tables.md, tables.tex and cocos_vs_rsum.{png,pdf} (and README.md) as one atomic folder."""
    from cocos.io import atomic_dir
    from cocos.report.figures import plot_cocos_vs_rsum

    md, tex = render_report(report)
    out = Path(out)
    with atomic_dir(out, report.sources, overwrite) as tmp:
        (tmp / "tables.md").write_text(md, encoding="utf-8")
        (tmp / "tables.tex").write_text(tex, encoding="utf-8")
        plot_cocos_vs_rsum(cocos_vs_rsum_rows(report.groups, compat=report.compat), tmp / "cocos_vs_rsum")
        if readme is not None:
            (tmp / "README.md").write_text(readme, encoding="utf-8")
    return sorted(p for p in out.iterdir() if not p.name.startswith("."))
