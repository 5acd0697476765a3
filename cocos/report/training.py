"""What happened during training: the step log (losses, LTD's λ) and COCOS tracked on the training batches.

``cocos train`` writes ``train_log.csv`` (one row per step: ``step, epoch, loss,
L_con`` and, with LTD, ``L_rec, L_rec/eta, lambda``) and, with ``--track-cocos N``,
``cocos_track.csv`` (tidy: ``step, epoch, loss, direction, stat, value``) into the
checkpoint folder. ``cocos analyze`` copies both into its report folder, cut at the
analysed checkpoint's epoch, and plots them; ``cocos report`` plots those of all its
inputs together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from cocos.errors import CocosError
from cocos.presentation import Presentation
from cocos.report import style
from cocos.report.figures import FigureOutput
from cocos.training.logs import (
    LTD_COLUMNS,
    PER_QUERY,
    TRACK_COLUMNS,
    TRACK_LOG,
    TRACK_META,
    TrainingLogs,
    read_logs,
    write_log_csvs,
)

# tracked statistics drawn, in this order (the threshold-free companions and W_low stay in the CSV)
TRACK_STATS = ("C_q", "C_B", "C_0", "C_qv-", "W_qv-", "W_qv+", "rsum")
LOG_AXIS_RATIO = 50.0  # a log y axis when a panel's values span this factor


def write_logs(logs: TrainingLogs, folder: str | os.PathLike, title: str | None = None,
               looks: Mapping | None = None, loss: str | None = None) -> list[Path]:
    """The CSVs and their figures (``training.png``, ``cocos_track.png``) into ``folder``; ``title`` names the run."""
    write_log_csvs(logs, folder)
    return plot_logs(logs, folder, title, looks, loss)


def plot_run(folder: str | os.PathLike, looks: Mapping | None = None) -> list[Path]:
    """``cocos train``'s figures of its own logs, into the checkpoint folder; returns the PNGs."""
    return [p for p in plot_logs(read_logs(folder), folder, Path(folder).name, looks) if p.suffix == ".png"]


def plot_logs(logs: TrainingLogs, folder: str | os.PathLike, title: str | None = None,
              looks: Mapping | None = None, loss: str | None = None) -> list[Path]:
    """``training.png`` and ``cocos_track.png`` (with their PDFs) of the logs there are; ``title`` names the run,
    ``loss`` its training loss (its curve is drawn in that loss's colour)."""
    folder, paths = Path(folder), []
    if logs.steps is not None and len(logs.steps):
        paths += plot_training(logs.steps, folder / "training",
                               title=f"{title}: training curves" if title else None,
                               color=style.loss_style(loss, looks)[1] if loss else None)
    if logs.track is not None and len(logs.track):
        paths += plot_track(logs.track, folder / "cocos_track",
                            title=f"{title}: COCOS of the training batches" if title else None, looks=looks).paths
    return paths


def is_track_folder(path: str | os.PathLike) -> bool:
    """A :class:`cocos.track.Tracker`'s folder: ``cocos_track.csv`` and ``cocos_track.json``, and no
    ``results.json`` below it (a folder of results is read as results)."""
    path = Path(path)
    return (path.is_dir() and (path / TRACK_META).is_file() and (path / TRACK_LOG).is_file()
            and next(path.rglob("results.json"), None) is None)


def read_track_folder(path: str | os.PathLike) -> tuple[pd.DataFrame, dict[str, Presentation]]:
    """A Tracker folder's track (every counter; :func:`cocos.training.logs.read_logs` checks it) and how each
    counter is shown (``presentation`` of its ``cocos_track.json``, as ``results.json`` stores it)."""
    import json

    path = Path(path)
    try:
        meta = json.loads((path / TRACK_META).read_text(encoding="utf-8"))
        looks = {str(n): Presentation.from_dict(d) for n, d in dict(meta["presentation"]).items()}
    except CocosError as exc:
        raise CocosError(f"{path / TRACK_META}: {exc}") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CocosError(f"{path / TRACK_META}: not a cocos track record ({exc.__class__.__name__})") from None
    track = read_logs(path).track
    return (track if track is not None else pd.DataFrame(columns=list(TRACK_COLUMNS))), looks


# --------------------------------------------------------------------------- figures


def _smooth(values: pd.Series, n_points: int) -> pd.Series:
    """A centred rolling mean over about 2 % of the points (noisy per-batch values; raw values drawn faintly)."""
    window = max(1, n_points // 50)
    return values.rolling(window, center=True, min_periods=1).mean()


def _colours(frame: pd.DataFrame, key: str, looks: Mapping | None) -> dict:
    """A colour per series: its loss's colour where that is unique, seaborn's palette otherwise."""

    series = list(dict.fromkeys(frame[key]))
    by_loss = {s: style.loss_style(frame.loc[frame[key] == s, "loss"].iloc[0], looks)[1] for s in series}
    if len(set(by_loss.values())) == len(series):
        return by_loss
    return dict(zip(series, sns.color_palette("colorblind", len(series)), strict=True))


def _log_axis(ax, values: np.ndarray) -> None:
    """A log y axis for values spanning decades; symlog (linear below 1) when some are 0, so zeros stay visible."""
    finite = values[np.isfinite(values)]
    positive = finite[finite > 0]
    if positive.size and positive.max() / positive.min() >= LOG_AXIS_RATIO:
        if (finite <= 0).any():
            ax.set_yscale("symlog", linthresh=1.0)
            ax.set_ylim(bottom=0)
        else:
            ax.set_yscale("log")


def _common_model(names: list[str]) -> tuple[str, list[str]]:
    """``("VSE++", ["Triplet loss", "NT-Xent"])`` for ``["VSE++, Triplet loss", "VSE++, NT-Xent"]``: the model
    that every series name starts with (``MODEL, LOSS``), and the names without it; ``("", names)`` otherwise."""
    heads = {n.rpartition(", ")[0] for n in names}
    if len(names) < 2 or len(heads) != 1 or "" in heads:
        return "", names
    head = heads.pop()
    return head, [n[len(head) + 2:] for n in names]


def plot_track(track: pd.DataFrame, path_stem: str | os.PathLike, title: str | None = None,
               series: str = "label", x: str = "step", markers: bool = False, looks: Mapping | None = None):
    """COCOS over training: one panel per statistic, a colour per series, i2t solid and t2i dashed.

    ``track`` is tidy (``x``, loss, direction, stat, value), e.g. ``cocos_track.csv``; a
    ``label`` column (the run) names the series, else the counter's label. Over steps,
    thin lines are the per-batch values and thick lines their rolling mean; with
    ``markers`` (a few checkpoints, ``x="epoch"``) the values are joined as they are.
    A ``rsum`` statistic gets its own panel (direction ``both``). Returns a
    :class:`~cocos.report.figures.FigureOutput` with the ``panels`` and ``series`` drawn.
    """


    track = track[track["stat"].isin(TRACK_STATS)].copy()
    if series not in track:
        track[series] = [style.loss_style(x, looks)[0] for x in track["loss"]]
    stats = [s for s in TRACK_STATS if s in set(track["stat"])]
    colours = _colours(track, series, looks) if len(track) else {}
    with style.paper_style():
        cols = min(3, max(1, len(stats)))
        rows = max(1, -(-len(stats) // cols))
        fig = style.figure(1.7 * rows + 0.5)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
        for ax, stat in zip(axes, stats, strict=False):
            _track_panel(ax, track[track["stat"] == stat], stat, series, x, markers, colours)
        for ax in axes[len(stats):]:
            ax.set_visible(False)
        if not stats:
            axes[0].set_visible(True)
            axes[0].text(0.5, 0.5, "nothing tracked", ha="center", va="center", transform=axes[0].transAxes)
        model = _track_legend(fig, colours)
        caption = title or "COCOS of the training batches during training"
        style.caption(fig, f"{caption}: {model}" if model else caption)
        return FigureOutput(style.save(fig, path_stem), {"panels": stats, "series": list(colours)})


def _track_panel(ax, part: pd.DataFrame, stat: str, series: str, x: str, markers: bool, colours: dict) -> None:
    """One statistic of :func:`plot_track`: a line per (series, direction), as markers joined (``markers``) or as
    faint per-batch values under their rolling mean; a log axis where the values span decades."""
    for (name, direction), line in part.groupby([series, "direction"], sort=False):
        line = line.sort_values(x)
        kw = {"color": colours[name], "linestyle": style.DIRECTION_DASHES.get(direction, "-")}
        if markers:
            ax.plot(line[x], line["value"], linewidth=1.4, marker="o", markersize=4, **kw)
        else:
            ax.plot(line[x], line["value"], linewidth=0.5, alpha=0.3, **kw)
            ax.plot(line[x], _smooth(line["value"], len(line)), linewidth=1.6, **kw)
    _log_axis(ax, part["value"].to_numpy(dtype=float))
    ax.set_title("test rsum" if stat == "rsum" else style.stat_math(stat))
    ax.set_xlabel("training step" if x == "step" else x)
    ax.tick_params(labelbottom=True)  # shared x, but every panel keeps its numbers
    if x == "epoch":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _track_legend(fig, colours: dict) -> str:
    """The legend of :func:`plot_track` below the panels: a colour per series, then i2t and t2i. Runs of one model
    ("VSE++ (ResNet-18, fine-tuned), Triplet loss", ...) name the model once, as the legend's title, and the losses
    in it (which otherwise run off both edges of the figure); returns that model ("" for none)."""
    handles = [Line2D([], [], color=c, linewidth=1.6) for c in colours.values()]
    handles += [Line2D([], [], color="0.3", linestyle=style.DIRECTION_DASHES[d]) for d in ("i2t", "t2i")]
    model, names = _common_model([str(n) for n in colours])
    labels = [*names, "i2t", "t2i"]
    ncols = max(1, min(4, len(labels), 110 // (max(len(n) for n in labels) + 6)))
    fig.legend(handles, labels, loc="outside lower center", ncols=ncols, title=model or None)
    return model


def _training_panels(steps: pd.DataFrame) -> list[tuple[str, str]]:
    """``(column, title)`` of each panel of :func:`plot_training`: the loss per query where the log has it (a
    summed loss of a short final batch is no drop), else as logged; with LTD also λ and L_rec/η."""
    per_query = PER_QUERY in steps and steps[PER_QUERY].notna().all()
    panels = [(PER_QUERY, r"$\mathcal{L}_{con}$ per query") if per_query else
              ("L_con", r"contrastive loss $\mathcal{L}_{con}$")]
    if all(c in steps for c in LTD_COLUMNS) and steps["lambda"].notna().any():
        panels += [("lambda", r"multiplier $\lambda$"), ("L_rec/eta", r"$\mathcal{L}_{rec}/\eta$")]
    return panels


def plot_training(steps: pd.DataFrame, path_stem: str | os.PathLike, title: str | None = None,
                  series: str = "label", color: str | None = None) -> list[Path]:
    """Per-step training curves: ``L_con`` per query (``L_con/query``; ``L_con`` as logged for logs of earlier
    versions) and, with LTD, ``λ`` and ``L_rec/η`` (the bound at 1), per series."""

    steps = steps.copy()
    if series not in steps:
        steps[series] = "run"
    panels = _training_panels(steps)
    names = list(dict.fromkeys(steps[series]))
    legend = len(names) > 1 or names != ["run"]  # a report names its runs; one run's own folder needs no legend

    colours = dict(zip(names, [color] if color and len(names) == 1 else sns.color_palette("colorblind", len(names)),
                       strict=True))
    with style.paper_style():
        fig = style.figure(2.0 + (0.4 if legend else 0.0))
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (column, label) in zip(axes, panels, strict=True):
            _training_panel(ax, steps, column, series, colours)
            ax.set_title(label)
            ax.set_xlabel("training step")
        if legend:
            fig.legend([Line2D([], [], color=colours[n], linewidth=1.6) for n in names], names,
                       loc="outside lower center", ncols=min(3, len(names)))
        style.caption(fig, title or "Training curves")
        return style.save(fig, path_stem)


def _training_panel(ax, steps: pd.DataFrame, column: str, series: str, colours: dict) -> None:
    """One column of the step log over steps: per series its faint per-step values under their rolling mean; the
    loss on a log axis where it spans decades (a warm-up epoch's summed violations can dwarf the rest), and
    ``L_rec/η`` with its bound at 1."""
    for name, part in steps.groupby(series, sort=False):
        part = part.sort_values("step")
        if part[column].notna().any():
            ax.plot(part["step"], part[column], color=colours[name], linewidth=0.4, alpha=0.3)
            ax.plot(part["step"], _smooth(part[column], len(part)), color=colours[name], linewidth=1.6)
    if column in ("L_con", PER_QUERY):
        _log_axis(ax, steps[column].to_numpy(dtype=float))
    if column == "L_rec/eta":
        ax.axhline(1.0, color=style.GREY, linestyle=":", linewidth=1)
        ax.text(0.99, 1.0, r"bound $\eta$", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                color=style.GREY, fontsize=style.SMALL_PT)


RUN_MARKERS = ("o", "^", "s", "D", "v")


def plot_by_epoch(rows: pd.DataFrame, path_stem: str | os.PathLike, title: str | None = None,
                  looks: Mapping | None = None):
    """``cocos report --label epoch``: every counter's main statistic against epoch (one panel per counter, in its
    colour), i2t solid and t2i dashed, and the test rsum in the last panel; runs differ by marker.

    ``rows``: :func:`cocos.report.merge.epoch_rows` (label, loss = counter or ``rsum``, epoch, direction, stat,
    value). Returns a :class:`~cocos.report.figures.FigureOutput` whose ``panels`` are the counters (and ``rsum``)
    and whose ``lines[(run, counter, direction)]`` are the ``(epoch, value)`` arrays drawn.
    """


    panels = [c for c in dict.fromkeys(rows["loss"]) if c != "rsum"] + (["rsum"] if "rsum" in set(rows["loss"]) else [])
    runs = list(dict.fromkeys(rows["label"]))
    lines: dict = {}
    with style.paper_style():
        cols = min(3, len(panels))
        nrows = -(-len(panels) // cols)
        fig = style.figure(1.45 * nrows + 0.35)
        axes = fig.subplots(nrows, cols, squeeze=False).ravel()
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        for ax, counter in zip(axes, panels, strict=False):
            part = rows[rows["loss"] == counter]
            rsum = counter == "rsum"
            name, color, _, stat = ("test rsum", "0.2", "", "") if rsum else style.loss_style(counter, looks)
            for (run, d), line in part.groupby(["label", "direction"], sort=False):
                line = line.sort_values("epoch")
                ax.plot(line["epoch"], line["value"], color=color, linestyle=style.DIRECTION_DASHES.get(d, "-"),
                        marker=RUN_MARKERS[runs.index(run) % len(RUN_MARKERS)], markersize=3)
                lines[(run, counter, d)] = (line["epoch"].to_numpy(), line["value"].to_numpy())
            ax.set_title(name if rsum else f"{name}: {style.stat_math(stat)}")
            ax.set_xlabel("epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        handles = [Line2D([], [], color="0.3", linestyle=style.DIRECTION_DASHES[d]) for d in ("i2t", "t2i")]
        names = ["i2t", "t2i"]
        if len(runs) > 1:
            handles += [Line2D([], [], color="0.3", marker=RUN_MARKERS[i % len(RUN_MARKERS)], linestyle="")
                        for i in range(len(runs))]
            names += runs
        fig.legend(handles, names, loc="outside lower center", ncols=min(4, len(names)))
        style.caption(fig, title)
        return FigureOutput(style.save(fig, path_stem), {"panels": panels, "lines": lines})
