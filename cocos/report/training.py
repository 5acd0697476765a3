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
               looks: Mapping | None = None, loss: str | None = None, history=None) -> list[Path]:
    """The CSVs and their figures (``training.png``, ``cocos_track.png``) into ``folder``; ``title`` names the run,
    ``history`` (a checkpoint's ``history``) gives the training figure its dev rsum per epoch."""
    write_log_csvs(logs, folder)
    return plot_logs(logs, folder, title, looks, loss, history=history)


def run_history(folder: str | os.PathLike) -> list | None:
    """The ``history`` (one ``{"epoch", "loss", "lr", "rsum", ...}`` per epoch) of the newest checkpoint in a
    ``cocos train`` folder (``last.pt``, else ``model_best.pt``), read cheaply and unverified (it is only drawn);
    ``None`` where there is none."""
    from cocos.training.checkpoint import peek

    for name in ("last.pt", "model_best.pt"):
        history = peek(Path(folder) / name).get("history")
        if isinstance(history, list) and history:
            return history
    return None


def plot_run(folder: str | os.PathLike, looks: Mapping | None = None) -> list[Path]:
    """``cocos train``'s figures of its own logs (and its checkpoint's dev rsum), into the checkpoint folder;
    returns the PNGs."""
    return [p for p in plot_logs(read_logs(folder), folder, Path(folder).name, looks, history=run_history(folder))
            if p.suffix == ".png"]


def plot_logs(logs: TrainingLogs, folder: str | os.PathLike, title: str | None = None,
              looks: Mapping | None = None, loss: str | None = None, history=None) -> list[Path]:
    """``training.png`` and ``cocos_track.png`` (with their PDFs) of the logs there are; ``title`` names the run,
    ``loss`` its training loss (its curve is drawn in that loss's colour), ``history`` its dev rsum per epoch."""
    folder, paths = Path(folder), []
    if logs.steps is not None and len(logs.steps):
        paths += plot_training(logs.steps, folder / "training",
                               title=f"{title}: training curves" if title else None,
                               color=style.loss_style(loss, looks)[1] if loss else None, history=history)
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


SMOOTH_SHARE = 30  # a rolling mean over 1/30 of a line's points ...
SMOOTH_MIN_WINDOW = 3  # ... where that is at least 3 (90 points); fewer points are drawn as they are
VALUES_PT, MEAN_PT = 1.2, 1.6  # a line of values drawn as they are; a rolling mean over faint values


def smooth_window(n_points: int) -> int:
    """The rolling mean's window of a line of ``n_points`` per-batch values; 1: drawn as they are."""
    window = n_points // SMOOTH_SHARE
    return window if window >= SMOOTH_MIN_WINDOW else 1


def _values(ax, x: pd.Series, y: pd.Series, color, **kw) -> int:
    """Noisy per-batch values: as they are (a line of :data:`VALUES_PT`) when there are too few to smooth, else
    faint (``style.faint``, :data:`~cocos.report.style.FAINT_LINE_PT`: visible at print size) under their centred
    rolling mean. The lines' ``gid`` says which is which (``values``, ``per-batch``, ``rolling mean``); returns
    the window (1: no rolling mean)."""
    window = smooth_window(len(y))
    if window == 1:
        ax.plot(x, y, color=color, linewidth=VALUES_PT, gid="values", **kw)
        return 1
    ax.plot(x, y, color=style.faint(color), linewidth=style.FAINT_LINE_PT, gid="per-batch", **kw)
    ax.plot(x, y.rolling(window, center=True, min_periods=1).mean(), color=color, linewidth=MEAN_PT,
            gid="rolling mean", **kw)
    return window


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
    ``label`` column (the run) names the series, else the counter's label. Over steps, a
    line of many per-batch values is drawn faint (visible at print size) under its rolling
    mean, a line of few as it is; with ``markers`` (a few checkpoints, ``x="epoch"``) the
    values are joined as they are. A ``rsum`` statistic gets its own panel (direction ``both``).
    Series that take far fewer steps per epoch (SmoothAP's ranking batches) end far to the left
    of the others on a step axis: a note under the legend (and in the caption) says so. Returns a
    :class:`~cocos.report.figures.FigureOutput` with the ``panels`` and ``series`` drawn, and
    ``note`` where there is one.
    """

    track = track[track["stat"].isin(TRACK_STATS)].copy()
    if series not in track:
        track[series] = [style.loss_style(x, looks)[0] for x in track["loss"]]
    stats = [s for s in TRACK_STATS if s in set(track["stat"])]
    colours = _colours(track, series, looks) if len(track) else {}
    model, names = _common_model([str(n) for n in colours])
    note = _pace_note(track, series, x, dict(zip(colours, names, strict=True)))
    with style.paper_style():
        cols = min(3, max(1, len(stats)))
        rows = max(1, -(-len(stats) // cols))
        fig = style.figure(1.7 * rows + 0.5 + 0.12 * len(note.splitlines()))
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
        windows = [_track_panel(ax, track[track["stat"] == stat], stat, series, x, markers, colours)
                   for ax, stat in zip(axes, stats, strict=False)]
        for ax in axes[len(stats):]:
            ax.set_visible(False)
        if not stats:
            axes[0].set_visible(True)
            axes[0].text(0.5, 0.5, "nothing tracked", ha="center", va="center", transform=axes[0].transAxes)
        _track_legend(fig, colours, model, names, note)
        style.caption(fig, _track_caption(title, model, max(windows, default=1) > 1, note))
        data = {"panels": stats, "series": list(colours)}
        return FigureOutput(style.save(fig, path_stem), {**data, "note": note} if note else data)


def _track_caption(title: str | None, model: str, smoothed: bool, note: str) -> str:
    """The caption of :func:`plot_track`: the title, the model its series share, what faint and bold lines are
    (where a rolling mean is drawn), the note on series of another pace."""
    caption = title or "COCOS of the training batches during training"
    caption = f"{caption}: {model}" if model else caption
    caption += "; faint: per-batch values, bold: their rolling mean" if smoothed else ""
    return f"{caption}. {' '.join(note.splitlines())}" if note else caption


PACE_RATIO = 1.5  # series whose steps per epoch differ by this factor are noted


def _steps_per_epoch(part: pd.DataFrame) -> float | None:
    """A series' steps per epoch, from the first tracked step of its first and last epoch (``None``: one epoch)."""
    first = part.groupby("epoch")["step"].min()
    if len(first) < 2:
        return None
    return float(first.iloc[-1] - first.iloc[0]) / float(first.index[-1] - first.index[0])


def _pace_note(track: pd.DataFrame, series: str, x: str, names: dict) -> str:
    """Over steps, where some series take far fewer steps per epoch than others (SmoothAP's ranking batches hold
    more captions, so an epoch has fewer of them): which, how many, and where their tracked batches end; wrapped
    to the figure's width. Empty where the series keep one pace (or it cannot be told: one epoch)."""
    import textwrap

    if x != "step" or not len(track):
        return ""
    pace = {n: p for n, part in track.groupby(series, sort=False) if (p := _steps_per_epoch(part)) is not None}
    if len(pace) < 2 or max(pace.values()) < PACE_RATIO * min(pace.values()):
        return ""
    top = max(pace.values())
    fewer = [n for n, p in pace.items() if p * PACE_RATIO <= top]
    others = sorted(p for n, p in pace.items() if n not in fewer)
    span = f"{others[0]:.0f}" if round(others[0]) == round(others[-1]) else f"{others[0]:.0f}-{others[-1]:.0f}"
    parts = []
    for n in fewer:
        part = track[track[series] == n]
        parts.append(f"{names.get(n, n)}: fewer steps per epoch (≈{pace[n]:.0f}; the others ≈{span}), so its "
                     f"{part['step'].nunique()} tracked batches end at step {int(part['step'].max())} "
                     f"(epoch {int(part['epoch'].max())}).")
    return "\n".join(textwrap.wrap(" ".join(parts), 80))


def _track_panel(ax, part: pd.DataFrame, stat: str, series: str, x: str, markers: bool, colours: dict) -> int:
    """One statistic of :func:`plot_track`: a line per (series, direction), as markers joined (``markers``) or as
    per-batch values (:func:`_values`); a log axis where the values span decades. Returns the widest rolling
    mean's window (1: none)."""
    window = 1
    for (name, direction), line in part.groupby([series, "direction"], sort=False):
        line = line.sort_values(x)
        dashes = style.DIRECTION_DASHES.get(direction, "-")
        if markers:
            ax.plot(line[x], line["value"], linewidth=1.4, marker="o", markersize=4, color=colours[name],
                    linestyle=dashes)
        else:
            window = max(window, _values(ax, line[x], line["value"], colours[name], linestyle=dashes))
    _log_axis(ax, part["value"].to_numpy(dtype=float))
    ax.set_title("test rsum" if stat == "rsum" else style.stat_math(stat))
    ax.set_xlabel("training step" if x == "step" else x)
    ax.tick_params(labelbottom=True)  # shared x, but every panel keeps its numbers
    if x == "epoch":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return window


def _track_legend(fig, colours: dict, model: str, names: list[str], note: str = "") -> None:
    """The legend of :func:`plot_track` below the panels: a colour per series, then i2t and t2i. Runs of one model
    ("VSE++ (ResNet-18, fine-tuned), Triplet loss", ...) name the model once, as the legend's title, and the losses
    in it ``names`` (which otherwise run off both edges of the figure); a ``note`` (:func:`_pace_note`) goes under
    the title."""
    handles = [Line2D([], [], color=c, linewidth=MEAN_PT) for c in colours.values()]
    handles += [Line2D([], [], color="0.3", linestyle=style.DIRECTION_DASHES[d]) for d in ("i2t", "t2i")]
    labels = [*names, "i2t", "t2i"]
    ncols = max(1, min(4, len(labels), 110 // (max(len(n) for n in labels) + 6)))
    heading = "\n".join(t for t in (model, note) if t)
    legend = fig.legend(handles, labels, loc="outside lower center", ncols=ncols, title=heading or None)
    legend.get_title().set_multialignment("center")


def _training_panels(steps: pd.DataFrame, dev: pd.DataFrame | None = None) -> list[tuple[str, str]]:
    """``(column, title)`` of each panel of :func:`plot_training`: the loss per query where the log has it (a
    summed loss of a short final batch is no drop), else as logged; with LTD also λ and L_rec/η; with a history,
    the dev rsum per epoch."""
    per_query = PER_QUERY in steps and steps[PER_QUERY].notna().all()
    panels = [(PER_QUERY, r"$\mathcal{L}_{con}$ per query") if per_query else
              ("L_con", r"contrastive loss $\mathcal{L}_{con}$")]
    if all(c in steps for c in LTD_COLUMNS) and steps["lambda"].notna().any():
        panels += [("lambda", r"multiplier $\lambda$"), ("L_rec/eta", r"$\mathcal{L}_{rec}/\eta$")]
    if dev is not None:
        panels.append((DEV_RSUM, "dev rsum, per epoch"))
    return panels


DEV_RSUM = "dev rsum"


def dev_rsum(history, steps: pd.DataFrame, series: str = "label") -> pd.DataFrame | None:
    """The dev rsum of each epoch of ``history``, placed at the epoch's last step in ``steps``: a frame
    (``series``, epoch, step, rsum), ``None`` where there is none.

    ``history`` is a checkpoint's ``history`` (a list of ``{"epoch", "rsum", ...}``, one per epoch) or a frame of
    such rows, with a ``series`` column where ``steps`` holds several runs; epochs the step log lacks (after the
    analysed checkpoint's) are left out."""
    if history is None or series not in steps:
        return None
    frame = history.copy() if isinstance(history, pd.DataFrame) else pd.DataFrame(list(history))
    if not {"epoch", "rsum"} <= set(frame) or frame.empty:
        return None
    if series not in frame:
        runs = list(dict.fromkeys(steps[series]))
        if len(runs) != 1:
            return None  # whose epochs? not guessed
        frame[series] = runs[0]
    frame["rsum"] = pd.to_numeric(frame["rsum"], errors="coerce")
    ends = steps.groupby([series, "epoch"], sort=False)["step"].max().rename("step").reset_index()
    frame = frame[[series, "epoch", "rsum"]].dropna().merge(ends, on=[series, "epoch"], how="inner")
    return frame.sort_values([series, "step"], kind="stable").reset_index(drop=True) if len(frame) else None


def plot_training(steps: pd.DataFrame, path_stem: str | os.PathLike, title: str | None = None,
                  series: str = "label", color: str | None = None, history=None) -> list[Path]:
    """Per-step training curves: ``L_con`` per query (``L_con/query``; ``L_con`` as logged for logs of earlier
    versions) and, with LTD, ``λ`` and ``L_rec/η`` (the bound at 1), per series; with ``history`` (a checkpoint's,
    :func:`dev_rsum`) the dev rsum of each epoch at its last step, the checkpoint selection's criterion."""

    steps = steps.copy()
    if series not in steps:
        steps[series] = "run"
    dev = dev_rsum(history, steps, series)
    panels = _training_panels(steps, dev)
    names = list(dict.fromkeys(steps[series]))
    legend = len(names) > 1 or names != ["run"]  # a report names its runs; one run's own folder needs no legend

    colours = dict(zip(names, [color] if color and len(names) == 1 else sns.color_palette("colorblind", len(names)),
                       strict=True))
    with style.paper_style():
        cols = 2 if len(panels) == 4 else min(3, len(panels))
        rows = -(-len(panels) // cols)
        fig = style.figure(2.0 * rows - 0.3 * (rows - 1) + (0.4 if legend else 0.0))
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        windows = []
        for ax, (column, label) in zip(axes, panels, strict=False):
            if column == DEV_RSUM:
                _dev_panel(ax, dev, series, colours, axes[0].get_xlim())
            else:
                windows.append(_training_panel(ax, steps, column, series, colours))
            ax.set_title(label)
            ax.set_xlabel("training step")
        if legend:
            fig.legend([Line2D([], [], color=colours[n], linewidth=MEAN_PT) for n in names], names,
                       loc="outside lower center", ncols=min(3, len(names)))
        caption = title or "Training curves"
        if max(windows, default=1) > 1:
            caption += "; faint: per-step values, bold: their rolling mean"
        style.caption(fig, caption)
        return style.save(fig, path_stem)


def _dev_panel(ax, dev: pd.DataFrame, series: str, colours: dict, steps: tuple[float, float]) -> None:
    """The dev rsum of each epoch (markers joined, ``gid`` ``dev rsum``) at the epoch's last step, per series, over
    the ``steps`` the step panels show."""
    for name, part in dev.groupby(series, sort=False):
        ax.plot(part["step"], part["rsum"], color=colours[name], linewidth=VALUES_PT, marker="o", markersize=3,
                gid=DEV_RSUM)
    ax.set_xlim(steps)


def _training_panel(ax, steps: pd.DataFrame, column: str, series: str, colours: dict) -> int:
    """One column of the step log over steps: per series its per-step values (:func:`_values`); the loss on a log
    axis where it spans decades (a warm-up epoch's summed violations can dwarf the rest), and ``L_rec/η`` with
    its bound at 1. Returns the widest rolling mean's window (1: none)."""
    window = 1
    for name, part in steps.groupby(series, sort=False):
        part = part.sort_values("step")
        if part[column].notna().any():
            window = max(window, _values(ax, part["step"], part[column], colours[name]))
    if column in ("L_con", PER_QUERY):
        _log_axis(ax, steps[column].to_numpy(dtype=float))
    if column == "L_rec/eta":
        ax.axhline(1.0, color=style.GREY, linestyle=":", linewidth=1)
        ax.text(0.99, 1.0, r"bound $\eta$", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                color=style.GREY, fontsize=style.SMALL_PT)
    return window


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
