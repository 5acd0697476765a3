"""Figures (PNG and PDF) in one seaborn style (:mod:`cocos.report.style`), written atomically and deterministically.

Every function draws on its own :class:`~matplotlib.figure.Figure` (no pyplot
state), names the model, data and counting mode in its title when given, takes a
loss's colour, marker and label from its spec, and returns a :class:`FigureOutput`:
the paths, and the data read back from the drawn artists so that a caller (or a
test) can check what was plotted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.legend_handler import HandlerLine2D
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from cocos.defaults import DEFAULT_EPS
from cocos.presentation import ranked
from cocos.report import style
from cocos.report.tables import DIRECTIONS
from cocos.results import CHANCE_NOISE_SD

LOG_TAIL_RATIO = 50.0  # a log y axis when the tallest bar is this many times the smallest non-empty one


@dataclass
class FigureOutput:
    paths: list[Path]
    data: dict = field(default_factory=dict)


def _bins(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """Histogram edges and whether the values are discrete counts (one bar per integer)."""
    if values.size == 0:
        return np.linspace(0, 1, 11), False
    lo, hi = float(values.min()), float(values.max())
    for k in range(1, 11):  # counts, or means of k counts (SmoothAP i2t: k positives): a bar per value
        if np.allclose(values * k, np.round(values * k)) and (hi - lo) * k <= 80:
            step = 1.0 / k
            return np.arange(np.round(lo * k) / k - step / 2, np.round(hi * k) / k + step, step), True
    if hi == lo:
        return np.linspace(lo - 0.5, hi + 0.5, 11), False
    return np.linspace(lo, hi, 31), False


def plot_count_distributions(queries, path_stem: str | os.PathLike, looks: Mapping | None = None,
                             title: str | None = None) -> FigureOutput:
    """How many candidates contribute per query: a grid of losses (rows) × directions (columns).

    ``queries``: the per-query table of one counting mode (``CountRun.to_frame("query")``: a row per query with its
    ``loss``, ``direction`` and a column per statistic); the count shown is each loss's main statistic (``C_q``;
    ``C_qv-`` for NT-Xent). Discrete counts are bars at integers (Triplet SH shows its 0/1 shares),
    the y axis is the share of queries, logarithmic where a long tail would be
    invisible. The mean over all queries is a dashed line, for ``C_q`` also the mean
    over queries with a gradient (dotted; the tables' ``C^q``); the legend sits below
    the panels. ``data[(loss, direction)]`` holds the bar heights (numbers of queries),
    bin edges, whether y is logarithmic and the lines' positions, read back from the axes.
    """

    losses = ranked(dict.fromkeys(queries["loss"]), looks or {})
    data: dict = {}
    with style.paper_style():
        fig = style.figure(1.45 * max(1, len(losses)) + 0.45)
        axes = fig.subplots(max(1, len(losses)), len(DIRECTIONS), squeeze=False)
        for i, loss in enumerate(losses):
            name, color, _, stat = style.loss_style(loss, looks)
            for j, d in enumerate(DIRECTIONS):
                ax = axes[i][j]
                ax.set_title(f"{name}, {d}")
                rows = (queries["loss"] == loss) & (queries["direction"] == d)
                if stat not in queries or not rows.any():
                    ax.text(0.5, 0.5, "not counted", ha="center", va="center", transform=ax.transAxes)
                    ax.set_axis_off()
                    continue
                values = queries.loc[rows, stat].to_numpy(dtype=np.float64)
                data[(loss, d)] = _count_histogram(ax, values[np.isfinite(values)], stat, color, first=j == 0)
        if not losses:
            axes[0][0].text(0.5, 0.5, "no per-query counts", ha="center", va="center")

        handles = [Line2D([], [], color="black", linestyle="--", linewidth=1, label="mean over all queries"),
                   Line2D([], [], color="black", linestyle=":", linewidth=1,
                          label=r"mean over queries with a gradient ($C^{q}$ of the tables)")]
        fig.legend(handles=handles, loc="outside lower center", ncols=1)
        if title:
            style.caption(fig, title)
        paths = style.save(fig, path_stem)
    return FigureOutput(paths, data)


def _count_histogram(ax, values: np.ndarray, stat: str, color: str, first: bool) -> dict:
    """One panel of :func:`plot_count_distributions`: the share of queries per value of ``stat`` (log y for a long
    tail), the mean (dashed) and for ``C_q`` the mean over queries with a gradient (dotted); the y label on the
    ``first`` column (and on every log axis). Returns the panel's entry of ``data``, read back from the axes."""
    edges, discrete = _bins(values)
    sns.histplot(x=values, bins=edges, stat="proportion", ax=ax, color=color, alpha=0.85,
                 edgecolor="white", linewidth=0.4)
    total = max(values.size, 1)
    heights = np.rint(np.array([p.get_height() for p in ax.patches]) * total)  # queries per bar
    nonzero = heights[heights > 0]
    log = bool(nonzero.size and nonzero.max() / nonzero.min() > LOG_TAIL_RATIO)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())  # under a decade matplotlib labels minor ticks too (2×10⁻¹)
        if nonzero.max() / nonzero.min() < 100:  # two decades or less: 1-2-5 ticks, else one label or none
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(_share_formatter())
    ax.set_xlabel(f"{style.stat_math(stat)} per query")
    ax.set_ylabel(("share of queries" + (" (log)" if log else "")) if first or log else "")
    if discrete and edges.size <= 12:
        ax.set_xticks(np.arange(edges[0] + 0.5, edges[-1]))
    mean = float(values.mean()) if values.size else float("nan")
    line = ax.axvline(mean, color="black", linestyle="--", linewidth=1)
    entry = {"heights": heights, "edges": np.asarray(edges), "mean": float(line.get_xdata()[0]),
             "stat": stat, "log": log, "discrete": discrete}
    if stat == "C_q" and (values > 0).any():
        gline = ax.axvline(float(values[values > 0].mean()), color="black", linestyle=":", linewidth=1)
        entry["mean_with_gradient"] = float(gline.get_xdata()[0])
    return entry


def plot_query_distributions(queries, stats, path_stem: str | os.PathLike, title: str | None = None,
                             color: str = style.GREY) -> FigureOutput:
    """Histograms of per-query statistics (e.g. GOAL's ``T``, ``P+``, ``P−``): statistics (columns) × directions (rows).

    ``queries``: rows of the tidy per-query frame of one loss and mode. ``data[(stat, direction)]``
    holds the bar heights (numbers of queries) and bin edges read back from the axes.
    """

    data: dict = {}
    with style.paper_style():
        fig = style.figure(1.6 * len(DIRECTIONS) + 0.1)
        axes = fig.subplots(len(DIRECTIONS), len(stats), squeeze=False)
        for i, d in enumerate(DIRECTIONS):
            part = queries[queries["direction"] == d]
            for j, stat in enumerate(stats):
                ax = axes[i][j]
                values = part[stat].to_numpy(dtype=np.float64) if stat in part else np.array([])
                values = values[np.isfinite(values)]
                ax.set_title(f"{style.stat_math(stat)}, {d}")
                if not values.size:
                    ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
                    ax.set_axis_off()
                    continue
                edges, _ = _bins(values)
                sns.histplot(x=values, bins=edges, stat="proportion", ax=ax, color=color, alpha=0.85,
                             edgecolor="white", linewidth=0.4)
                ax.yaxis.set_major_formatter(_share_formatter())
                ax.set_xlabel(f"{style.stat_math(stat)} per query")
                ax.set_ylabel("share of queries" if j == 0 else "")
                data[(stat, d)] = {"heights": np.rint(np.array([p.get_height() for p in ax.patches]) * values.size),
                                   "edges": np.asarray(edges)}
        if title:
            style.caption(fig, title)
        paths = style.save(fig, path_stem)
    return FigureOutput(paths, data)


def _share_formatter():

    def share(value, _pos):
        return f"{100 * value:.3g}%"

    return FuncFormatter(share)


def plot_eps_sweep(sweep, path_stem: str | os.PathLike, looks: Mapping | None = None,
                   title: str | None = None, eps: float = DEFAULT_EPS) -> FigureOutput:
    """Count vs threshold ε (log x), one panel per loss (each with its own y scale), i2t solid, t2i dashed.

    ``sweep``: rows (``loss``, ``direction``, ``eps``, ``stat``, ``mean``) of the statistics table
    (:meth:`cocos.results.Results.sweep_frame`); each loss shows its main statistic. The threshold the run counted
    with (``eps``) is marked. ``data[(loss, direction)] = (eps, mean count)`` read back from the drawn line.
    """
    losses = ranked(dict.fromkeys(sweep["loss"]), looks or {})
    data: dict = {}
    with style.paper_style():
        n = max(1, len(losses))
        fig = style.figure(1.9 * -(-n // 2) + 0.1)
        axes = fig.subplots(-(-n // 2), min(n, 2), squeeze=False).ravel()
        for ax in axes[len(losses):]:
            ax.set_visible(False)
        for ax, loss in zip(axes, losses, strict=False):
            name, color, marker, stat = style.loss_style(loss, looks)
            for d in DIRECTIONS:
                points = sweep[(sweep["loss"] == loss) & (sweep["direction"] == d) & (sweep["stat"] == stat)]
                points = points[points["mean"].notna()].sort_values("eps", kind="stable")
                if not len(points):
                    continue
                x, y = (points[col].to_numpy(dtype=np.float64) for col in ("eps", "mean"))
                (line,) = ax.plot(x, y, style.DIRECTION_DASHES[d], marker=marker, markersize=4, color=color,
                                  label=d)
                data[(loss, d)] = (np.asarray(line.get_xdata(), dtype=np.float64),
                                   np.asarray(line.get_ydata(), dtype=np.float64))
            ax.axvline(eps, color="0.4", linestyle=":", linewidth=1)
            ax.set_xscale("log")
            ax.set_xlabel(r"threshold $\varepsilon$")
            ax.set_ylabel(f"{style.stat_math(stat)} (mean over batches)")
            ax.set_title(name)
        if not losses:
            axes[0].text(0.5, 0.5, "no counter with a threshold", ha="center", va="center",
                         transform=axes[0].transAxes)
        if title:
            style.caption(fig, title)

        handles = [Line2D([], [], color="0.3", linestyle=style.DIRECTION_DASHES[d]) for d in DIRECTIONS]
        handles.append(Line2D([], [], color="0.4", linestyle=":"))
        fig.legend(handles, [*DIRECTIONS, f"counted at ε = {eps:g}"], loc="outside lower center", ncols=3)
        data["default_eps"] = eps
        paths = style.save(fig, path_stem)
    return FigureOutput(paths, data)


def plot_cocos_vs_rsum(rows, path_stem: str | os.PathLike, title: str | None = None,
                       looks: Mapping | None = None) -> FigureOutput:
    """Each model's COCOS (the main count of its own training loss) against its rsum.

    One panel per statistic family (triplet-style ``C^q``; NT-Xent ``C^{qv-}``), both
    directions (i2t filled, t2i open markers), a colour per loss and a marker per model (an LTD
    model and a plain one of the same loss look different), one legend entry per model and loss,
    and error bars over seeds in both axes where there are seeds (sample std). The count axis
    starts at 0 (counts are compared with none at all). ``rows``: the tidy frame of
    :func:`cocos.report.merge.cocos_vs_rsum_rows` (label, model, loss, direction, stat, rsum, cocos,
    and optionally rsum_std, cocos_std, n). ``data["points"]`` is the ``(n, 2)`` array ``(cocos,
    rsum)`` read back from the markers in row order, ``data["labels"]`` their labels, ``data["panels"]``
    the statistics, ``data["legend"]`` the legend's entries.

    Honest reports (definitions file, "Chance"): where ``rows`` has ``chance`` and ``chance_sd`` (the chance rsum
    of the test split), chance is a dashed line and the band up to ``CHANCE_NOISE_SD`` standard deviations above
    it is shaded ("within noise of chance"), and the rsum axis always shows the line, so that models at chance are
    not spread over an axis of noise; the caption says how many are in the band. A model whose checkpoint is a
    warm-up epoch (``warmup``) is named so in the legend. ``data["chance"]`` holds ``(chance, top of the band)``
    of each panel, read back from the drawn line and band (None without chance); ``data["ylim"]`` the rsum axis's
    limits, which the panels share.
    """

    stats = list(dict.fromkeys(rows["stat"]))
    models = list(dict.fromkeys(rows["model"] if "model" in rows else ["model"] * len(rows)))
    points, labels, legend, chance, drawn = [], [], {}, [], []
    with style.paper_style():
        fig = style.figure(2.6 + 0.12 * len(set(zip(rows["loss"], rows.get("model", rows["loss"]), strict=True))))
        axes = fig.subplots(1, max(1, len(stats)), squeeze=False, sharey=True)[0]
        for ax, stat in zip(axes, stats, strict=False):
            part = rows[rows["stat"] == stat]
            for _, r in part.iterrows():
                container, (entry, handle) = _rsum_point(ax, r, models, looks)
                xs, ys = container.lines[0].get_data()
                points.append((float(xs[0]), float(ys[0])))
                drawn.append((ax, container))
                labels.append(f"{r['label']} ({r['direction']})")
                legend.setdefault(entry, handle)
            spread = part["cocos_std"].fillna(0) if "cocos_std" in part else 0
            right = float(np.nanmax(part["cocos"] + spread)) if len(part) else 1.0
            ax.set_xlim(0, 1.15 * right if right > 0 else 1.0)
            ax.set_xlabel(f"{style.stat_math(stat)} of the training loss")
            ax.set_ylabel("rsum (test)")
            chance.append(_chance_band(ax, part))
        offsets, groups = _dodge(fig, drawn, points)
        _rsum_legend(fig, legend, any(c is not None for c in chance), bool(groups))
        style.caption(fig, (title or "COCOS at the selected checkpoint vs retrieval") + _chance_caption(rows)
                      + (f"; {DODGE_NOTE}" if groups else ""))
        ylim = tuple(float(y) for y in axes[0].get_ylim())
        paths = style.save(fig, path_stem)
    return FigureOutput(paths, {"points": np.array(points, dtype=np.float64).reshape(-1, 2), "labels": labels,
                                "panels": stats, "legend": list(legend), "chance": chance, "ylim": ylim,
                                "offsets": offsets, "coincident": [[labels[i] for i in g] for g in groups]})


def _rsum_point(ax, r, models: list, looks: Mapping | None):
    """One row of :func:`plot_cocos_vs_rsum` drawn (:func:`_errorbar`): its container, and its legend entry and
    handle (a colour per loss, a marker per model)."""
    name, color, _, _ = style.loss_style(r["loss"], looks)
    model = r.get("model", "model")
    marker = MODEL_MARKERS[models.index(model) % len(MODEL_MARKERS)]
    container = _errorbar(ax, r, color, marker, filled=r["direction"] == "i2t")
    warm = " (warm-up epoch)" if bool(r.get("warmup", False)) else ""
    entry = (f"{model}, {name}" if len(models) > 1 else name) + warm
    return container, (entry, Line2D([], [], color=color, marker=marker, linestyle="", markersize=5))


def _rsum_legend(fig, legend: dict, chance: bool, dodged: bool) -> None:
    """The legend of :func:`plot_cocos_vs_rsum`: a marker per model and loss, i2t filled and t2i open, the chance
    line where there is one, and what markers side by side mean where some are."""
    handles = list(legend.values()) + [
        Line2D([], [], color="0.3", marker="o", linestyle="", markersize=5),
        Line2D([], [], color="0.3", marker="o", markerfacecolor="none", linestyle="", markersize=5)]
    names = [*legend, "i2t (filled)", "t2i (open)"]
    if chance:
        handles.append(Line2D([], [], color=style.GREY, linestyle="--", linewidth=1))
        names.append(f"chance; shaded: within noise of chance (+{CHANCE_NOISE_SD:g} sd)")
    pair = {}
    if dodged:  # two markers side by side
        handles.append(Line2D([], [], color="0.3", marker="o", linestyle="", markersize=4))
        names.append(DODGE_NOTE)
        pair = {handles[-1]: HandlerLine2D(numpoints=2)}
    fig.legend(handles, names, loc="outside lower center", ncols=2, handler_map=pair)


DODGE_PT = 7.0  # markers (5 pt) at one point are set this far apart on the page, side by side
COINCIDE = 0.02  # markers closer than this share of both axes' spans would hide one another
DODGE_NOTE = "markers side by side: one point (its count above)"


def _clusters(points: list, indices: list[int], near: tuple[float, float]) -> list[list[int]]:
    """The groups (of two or more, in order) of ``points[indices]`` within ``near`` (x, y) of a group's first."""
    clusters: list[list[int]] = []
    for i in indices:
        home = next((c for c in clusters if abs(points[i][0] - points[c[0]][0]) <= near[0]
                     and abs(points[i][1] - points[c[0]][1]) <= near[1]), None)
        if home is None:
            clusters.append([i])
        else:
            home.append(i)
    return [c for c in clusters if len(c) > 1]


def _dodge(fig, drawn: list, points: list) -> tuple[list[float], list[list[int]]]:
    """Markers that would hide one another (closer than :data:`COINCIDE` of both spans of their panel: models with
    the same count and rsum, or i2t and t2i of one) set side by side, :data:`DODGE_PT` apart on the page, in the
    order drawn (i2t, filled, left of t2i), the count they share written above them (``gid`` ``coincident``); their
    data, and the points read back, stay as they are. Returns each
    point's shift in points (0: not moved) and the groups of points (indices) moved."""
    from matplotlib.transforms import ScaledTranslation

    offsets: list[float] = [0.0] * len(drawn)
    groups: list[list[int]] = []
    for ax in dict.fromkeys(a for a, _ in drawn):
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        near = COINCIDE * abs(x1 - x0), COINCIDE * abs(y1 - y0)
        for cluster in _clusters(points, [i for i, (a, _) in enumerate(drawn) if a is ax], near):
            groups.append(cluster)
            x, y = points[cluster[0]]
            ax.annotate(f"{x:.2f}", (x, y), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                        fontsize=style.SMALL_PT, color="0.3", gid="coincident")
            for k, i in enumerate(cluster):
                offsets[i] = (k - (len(cluster) - 1) / 2) * DODGE_PT
                shift = ScaledTranslation(offsets[i] / 72, 0, fig.dpi_scale_trans)
                for artist in drawn[i][1].get_children():
                    artist.set_transform(artist.get_transform() + shift)
    return offsets, groups


def _chance_band(ax, part) -> tuple[float, float] | None:
    """The chance rsum (dashed) and the band of noise above it (shaded) on one panel, the y axis widened to show
    them (the band takes part in autoscaling); returns ``(chance, top of the band)`` as drawn, None where ``part``
    has no chance."""
    if "chance" not in part or not part["chance"].notna().any():
        return None
    chance = float(part["chance"].dropna().max())  # one test split per report; the largest where they differ
    top = chance + CHANCE_NOISE_SD * float(part.loc[part["chance"] == chance, "chance_sd"].max())
    line = ax.axhline(chance, color=style.GREY, linestyle="--", linewidth=1, zorder=1)
    band = ax.axhspan(chance, top, color=style.GREY, alpha=0.15, linewidth=0, zorder=0)
    # no set_ylim here: the panels share their y axis, and fixing it on one panel would cut the points another
    # panel draws later; the band is data, so autoscaling over every panel shows it with all the points
    if hasattr(band, "get_height"):  # matplotlib >= 3.9: a Rectangle
        drawn_top = band.get_y() + band.get_height()
    else:  # a Polygon
        drawn_top = np.max(np.asarray(band.get_xy())[:, 1])
    return float(line.get_ydata()[0]), float(drawn_top)


def _chance_caption(rows) -> str:
    """``: 2 of 4 models within noise of chance; 1 at a warm-up epoch`` (empty when none is)."""
    if not len(rows):
        return ""
    models = rows.drop_duplicates("label")
    parts = []
    if "chance" in models and models["chance"].notna().any():
        top = models["chance"] + CHANCE_NOISE_SD * models["chance_sd"]
        near = int((models["rsum"] < top).sum())
        if near:
            parts.append(f"{near} of {len(models)} models within noise of chance")
    if "warmup" in models and models["warmup"].fillna(False).astype(bool).any():
        parts.append(f"{int(models['warmup'].fillna(False).astype(bool).sum())} at a warm-up epoch")
    return (": " + "; ".join(parts)) if parts else ""


MODEL_MARKERS = ("o", "^", "s", "D", "v", "P", "X")


def _errorbar(ax, r, color: str, marker: str, filled: bool):
    """One (COCOS, rsum) point with its error bars over seeds; returns its ``ErrorbarContainer`` (the marker is
    ``lines[0]``)."""
    xerr = r.get("cocos_std") if np.isfinite(r.get("cocos_std", np.nan)) else None
    yerr = r.get("rsum_std") if np.isfinite(r.get("rsum_std", np.nan)) else None
    return ax.errorbar([r["cocos"]], [r["rsum"]], xerr=xerr, yerr=yerr, fmt=marker, color=color, markersize=5,
                       markerfacecolor=color if filled else "none", markeredgewidth=1.0, elinewidth=0.8,
                       capsize=2, zorder=3 if filled else 4)
