"""A whole report: load, group and tabulate results, then write tables.md, tables.tex and the figures atomically.

The grouping and the one aggregation over replicates are in :mod:`cocos.report.groups`,
the tables in :mod:`cocos.report.paper_tables`; this module puts them together for
``cocos report`` (and the demo), with the figures of COCOS vs rsum, over training and over epochs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cocos.errors import CocosError
from cocos.presentation import Presentation, ranked
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
from cocos.report.paper_tables import build_tables, cocos_tables, retrieval_table  # noqa: F401
from cocos.report.tables import (
    DIRECTIONS,
    mode_name,
)
from cocos.results import Results

RSUM = ("", "rsum")  # (counter, direction) of the test rsum among the cells of main_stat_seeds (no loss is named "")


def main_stat_seeds(groups: Sequence[Group], counters: dict, compat: bool | None = None) -> pd.DataFrame:
    """Per (group, counter, direction): the main statistic of each counter in ``counters`` (group index -> counters),
    over seeds (:func:`over_seeds` of the replicates' batch means, the shown mode); and the test rsum (at ``RSUM``)."""
    frame = stat_frame(groups, compat)
    frame = frame[frame["which"] == "shown"]
    wanted = {(gi, c, groups[gi].results[0].look(c).main_stat) for gi, cs in counters.items() for c in cs}
    frame = frame[np.array([k in wanted for k in zip(frame["group"], frame["counter"], frame["stat"], strict=True)],
                           dtype=bool)]
    cells = over_seeds(frame, ["group", "counter", "direction"], "mean")
    metrics = metric_frame(groups, ["rsum"])
    rsum = over_seeds(metrics[metrics["group"].isin(list(counters))], ["group"]).assign(counter=RSUM[0],
                                                                                          direction=RSUM[1])
    return pd.concat([cells, rsum], ignore_index=True).set_index(["group", "counter", "direction"])


def _seed_cell(cells: pd.DataFrame, key: tuple) -> tuple[float, float]:
    return tuple(cells.loc[key, ["mean", "std"]]) if key in cells.index else (np.nan, np.nan)


def cocos_vs_rsum_rows(groups: Sequence[Group], compat: bool | None = None) -> pd.DataFrame:
    """Tidy rows per group with a training loss and an evaluation, both directions: the main count of the
    group's own loss and the test rsum, means over seeds with their sample std over seeds (NaN for one seed)."""
    own = {gi: [g.loss] for gi, g in enumerate(groups)
           if g.loss is not None and all(r.evaluation is not None for r in g.results)}
    cells = main_stat_seeds(groups, own, compat)
    rows = []
    for gi in own:
        g = groups[gi]
        rsum, rsum_std = _seed_cell(cells, (gi, *RSUM))
        for d in DIRECTIONS:
            cocos, cocos_std = _seed_cell(cells, (gi, g.loss, d))
            if not np.isnan(cocos):
                rows.append({"label": " ".join(g.labels), "model": g.model, "loss": g.loss, "direction": d,
                             "stat": g.results[0].look(g.loss).main_stat, "rsum": rsum, "cocos": cocos,
                             "rsum_std": rsum_std, "cocos_std": cocos_std, "n": g.n})
    return pd.DataFrame(rows, columns=["label", "model", "loss", "direction", "stat", "rsum", "cocos", "rsum_std",
                                       "cocos_std", "n"])


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
    modes = {shown_compat(r, report.compat) for r in report.results}
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
    counters = {gi: ranked(g.results[0].counting.losses, g.results[0].presentation)
                for gi, g in enumerate(groups) if g.results[0].source.epoch is not None}
    cells = main_stat_seeds(groups, counters, compat)
    rows = []
    for gi, names in counters.items():
        r0 = groups[gi].results[0]
        label = _run_label(r0)
        for counter in names:
            for d in DIRECTIONS:
                value = _seed_cell(cells, (gi, counter, d))[0]
                if not np.isnan(value):
                    rows.append((label, counter, r0.source.epoch, d, r0.look(counter).main_stat, value))
        rsum = _seed_cell(cells, (gi, *RSUM))[0]
        if not np.isnan(rsum):
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
