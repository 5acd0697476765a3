"""A whole report: load, group and tabulate results, then write tables.md, tables.tex and the figures atomically.

The grouping and the one aggregation over replicates are in :mod:`cocos.report.groups`,
the tables in :mod:`cocos.report.paper_tables`; this module puts them together for
``cocos report`` (and the demo), with the figures of COCOS vs rsum, over training and over epochs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cocos.errors import CocosError
from cocos.io import atomic_dir
from cocos.presentation import Presentation, ranked
from cocos.report.figures import plot_cocos_vs_rsum
from cocos.report.groups import (  # noqa: F401  (the report's public names, in one place)
    Group,
    dataset_name,
    group_results,
    load_results,
    loss_label,
    metric_frame,
    over_seeds,
    shown_compat,
    stat_frame,
)
from cocos.report.html import report_index
from cocos.report.paper_tables import build_tables, cocos_tables, relabel, retrieval_table  # noqa: F401
from cocos.report.significance import to_frame as significance_frame
from cocos.report.tables import (
    DIRECTIONS,
    MANY_TABLES,
    mode_name,
    to_latex,
    to_markdown,
)
from cocos.report.training import is_track_folder, plot_by_epoch, plot_track, plot_training, read_track_folder
from cocos.results import Results
from cocos.training.logs import read_logs


def main_stat_seeds(groups: Sequence[Group], counters: dict, compat: bool | None = None) -> dict:
    """``{(group, counter, direction): (mean, std)}`` over seeds (:func:`over_seeds`, the shown mode) of the main
    statistic of each counter in ``counters`` (group index -> names), and of the test rsum (counter ``"rsum"``,
    direction ``"both"``); only defined values."""
    frame = stat_frame(groups, compat)
    main = {(gi, c): groups[gi].results[0].look(c).main_stat for gi, names in counters.items() for c in names}
    keep = [w == "shown" and main.get((gi, c)) == s
            for gi, c, s, w in zip(frame["group"], frame["counter"], frame["stat"], frame["which"], strict=True)]
    metrics = metric_frame(groups, ["rsum"]).assign(counter="rsum", direction="both")
    cells = pd.concat([over_seeds(frame[np.array(keep, dtype=bool)], ["group", "counter", "direction"], "mean"),
                       over_seeds(metrics[metrics["group"].isin(list(counters))], ["group", "counter", "direction"])])
    return {(g, c, d): (m, sd) for g, c, d, m, sd in zip(*(cells[k] for k in ("group", "counter", "direction", "mean",
                                                                             "std")), strict=True) if not np.isnan(m)}


def cocos_vs_rsum_rows(groups: Sequence[Group], compat: bool | None = None) -> pd.DataFrame:
    """Tidy rows per group with a training loss and an evaluation, both directions: the main count of the
    group's own loss and the test rsum, means over seeds with their sample std over seeds (NaN for one seed)."""
    own = {gi: [g.loss] for gi, g in enumerate(groups)
           if g.loss is not None and all(r.evaluation is not None for r in g.results)}
    cells = main_stat_seeds(groups, own, compat)
    rows = [{"label": " ".join(groups[gi].labels), "model": groups[gi].model, "loss": loss, "direction": d,
             "stat": groups[gi].results[0].look(loss).main_stat, "rsum": cells.get((gi, "rsum", "both"), NONE)[0],
             "cocos": cells[(gi, loss, d)][0], "rsum_std": cells.get((gi, "rsum", "both"), NONE)[1],
             "cocos_std": cells[(gi, loss, d)][1], "n": groups[gi].n, **_honesty(groups[gi])}
            for gi, (loss,) in own.items() for d in DIRECTIONS if (gi, loss, d) in cells]
    return pd.DataFrame(rows, columns=["label", "model", "loss", "direction", "stat", "rsum", "cocos", "rsum_std",
                                       "cocos_std", "n", "chance", "chance_sd", "warmup"])


def _honesty(group: Group) -> dict:
    """The chance rsum of the group's test split with its standard deviation (NaN where unknown) and whether a
    replicate's checkpoint is a warm-up epoch (definitions file, "Honest reports")."""
    chance = next((r.chance for r in group.results if r.chance is not None), None)
    return {"chance": chance[0] if chance else np.nan, "chance_sd": chance[1] if chance else np.nan,
            "warmup": any(r.warmup_selected for r in group.results)}


NONE = (np.nan, np.nan)


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
    tracks: list = field(default_factory=list)  # (folder, track, looks) of each Tracker folder (cocos.track)
    label_prefix: str | None = None  # --label-prefix: the LaTeX labels' first part (cocos.report.tables.latex_label)

    @property
    def sources(self) -> list[str]:
        return [r.where for r in self.results] + [str(folder) for folder, _, _ in self.tracks]

    @property
    def looks(self) -> dict[str, Presentation]:
        """Every loss's presentation, as the results files (then the track folders) describe it (the first file
        that does wins)."""
        out: dict[str, Presentation] = {}
        for r in self.results:
            for name, look in r.presentation.items():
                out.setdefault(name, look)
        for _, _, looks in self.tracks:
            for name, look in looks.items():
                out.setdefault(name, look)
        return out


LABELS = ("epoch",)  # cocos report --label: what tells results of one run apart


def label_by_epoch(results: Sequence[Results]) -> None:
    """Show each checkpoint's epoch in its model label (``VSE++ (epoch 5)``), so one run's epochs form rows."""
    for r in results:
        if r.source.kind == "analyze" and r.source.epoch is not None:
            r.model.label = f"{r.model.label} (epoch {r.source.epoch})"


def build_report(paths: Iterable[str | os.PathLike], compat: bool | None = None, counters: str = "own",
                 label: str | None = None, label_prefix: str | None = None) -> Report:
    """Load (files or folders), group (from the files' metadata) and tabulate results.

    ``label="epoch"`` keeps the checkpoints of one run apart by their epoch (``cocos train --save-every``).
    ``label_prefix`` starts every LaTeX label (``[PREFIX-]NAME-ROLE``, NAME the report folder's name).
    A folder of :class:`cocos.track.Tracker` (``cocos_track.csv`` with its ``cocos_track.json``, no
    ``results.json``) adds its track to the figure of COCOS during training, every counter of it.
    """
    if label is not None and label not in LABELS:
        raise CocosError(f"unknown --label '{label}' (choose from {', '.join(LABELS)})")
    paths = [Path(p) for p in paths]
    folders = [p for p in paths if is_track_folder(p)]
    rest = [p for p in paths if p not in folders]
    loaded = load_results(rest) if rest or not folders else []
    if label == "epoch":
        label_by_epoch(loaded)
    groups, warnings = group_results(loaded)
    tables = build_tables(groups, compat, counters, label_prefix=label_prefix) if groups else []  # tracks: no table
    return Report(loaded, groups, warnings, tables, compat, label,
                  [(p, *read_track_folder(p)) for p in folders], label_prefix)


def report_title(report: Report) -> str:
    """What a report's figure shows: models, data and the counting mode."""
    models = ", ".join(dict.fromkeys(g.model for g in report.groups))
    data = ", ".join(dict.fromkeys(dataset_name(g.dataset) for g in report.groups))
    modes = {shown_compat(r, report.compat) for r in report.results}
    mode = mode_name(next(iter(modes))) if len(modes) == 1 else "mixed modes"
    return f"COCOS vs retrieval: {models} on {data} ({mode} counting)"


def render_report(report: Report, latex_width: str = "column", name: str | None = None) -> tuple[str, str]:
    """The contents of ``tables.md`` and ``tables.tex`` (LaTeX set to fit ``latex_width``: column or page), the
    LaTeX labels ``[PREFIX-]NAME-ROLE`` after the report's ``name`` (its folder's; default ``report``)."""

    md = ["# COCOS report", "", "Results files:", ""]
    md += [f"- `{r.where}`" for r in report.results] or ["(none)"]
    if report.tracks:
        md += ["", "COCOS tracked during training (`cocos_track.csv`, in the figure `cocos_track.png`):", ""]
        md += [f"- `{folder}`" + ("" if len(track) else " (no counted step yet)") for folder, track, _ in report.tracks]
    if report.warnings:
        md += ["", "Warnings:", ""] + [f"- {w}" for w in report.warnings]
    md.append("")
    md += [to_markdown(t) for t in report.tables]
    fit = "one LNCS column (12.2 cm)" if latex_width == "column" else "a page (table*, at the 12.2 cm LNCS text width)"
    tex = [f"% Generated by `cocos report`; needs only booktabs and amsmath; set to fit {fit}.",
           *(f"% {line}" for line in MANY_TABLES), *(f"% {s}" for s in report.sources), ""]
    tables = relabel(report.tables, name, report.label_prefix) if name else report.tables
    tex += [to_latex(t, width=latex_width) for t in tables]
    return "\n".join(md), "\n".join(tex)


def write_significance(report: Report, folder: Path) -> None:
    """``significance.csv``: every pairwise comparison of the report's tables, one row each, where any pair was
    tested (rows of 3 seeds or more; else no file, the tables' notes say why)."""
    comparisons = [c for t in report.tables for c in t.comparisons]
    frame = significance_frame(comparisons)
    if any(c.tested for c in comparisons):
        frame.to_csv(folder / "significance.csv", index=False, float_format="%.10g")


def write_report(report: Report, out: str | os.PathLike, readme: str | None = None,
                 overwrite: bool = False, latex_width: str = "column", by: str | None = "report") -> list[Path]:
    """Write tables.md, tables.tex and cocos_vs_rsum.{png,pdf} (and README.md) as one atomic folder, a cocos report
    written ``by`` a command: an existing report is replaced only with ``overwrite`` (the demo's and a sweep's own
    without it), any other folder is refused (:func:`cocos.io.check_output_dir`)."""

    md, tex = render_report(report, latex_width, name=Path(out).name)  # labels after the folder's name
    out = Path(out)
    with atomic_dir(out, report.sources, overwrite, kind="report", by=by) as tmp:
        (tmp / "tables.md").write_text(md, encoding="utf-8")
        (tmp / "tables.tex").write_text(tex, encoding="utf-8")
        write_significance(report, tmp)
        rows = cocos_vs_rsum_rows(report.groups, compat=report.compat)
        if len(rows):  # count results have no rsum: no figure
            plot_cocos_vs_rsum(rows, tmp / "cocos_vs_rsum", title=report_title(report), looks=report.looks)
        _training_figures(report, tmp)
        if readme is not None:
            (tmp / "README.md").write_text(readme, encoding="utf-8")
        page = report_index(report, tmp, out, report_title(report) if report.groups else "")  # last: lists the files
        (tmp / "index.html").write_text(page, encoding="utf-8")
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
    counters = {gi: ranked(g.results[0].counting.losses, g.results[0].presentation)
                for gi, g in enumerate(groups) if g.results[0].source.epoch is not None}
    cells = main_stat_seeds(groups, counters, compat)
    rows = [(_run_label(groups[gi].results[0]), c, groups[gi].results[0].source.epoch, d,
             "rsum" if c == "rsum" else groups[gi].results[0].look(c).main_stat, cells[(gi, c, d)][0])
            for gi, names in counters.items() for c in [*names, "rsum"] for d in (*DIRECTIONS, "both")
            if (gi, c, d) in cells]
    return pd.DataFrame(rows, columns=["label", "loss", "epoch", "direction", "stat", "value"])


def _training_figures(report: Report, folder: Path) -> None:

    track, steps = training_logs(report.results)
    title = "COCOS of each model's training loss on its training batches"
    if report.tracks:  # every counter of each tracked run, named "FOLDER, COUNTER"
        title = "COCOS on the training batches"
        tracked = [frame.assign(label=[f"{where.name}, {(looks.get(x) or Presentation(x)).label}"
                                       for x in frame["loss"]]) for where, frame, looks in report.tracks]
        track = pd.concat([t for t in [track, *tracked] if t is not None], ignore_index=True)
    if track is not None and len(track):
        plot_track(track, folder / "cocos_track", title=title, looks=report.looks)
    if steps is not None and len(steps):
        plot_training(steps, folder / "ltd", title="LTD during training")
    if report.label == "epoch":
        rows = epoch_rows(report.groups, report.compat)
        if len(rows):
            plot_by_epoch(rows, folder / "cocos_by_epoch", looks=report.looks,
                          title="COCOS of every counter at the saved checkpoints, and test rsum")
