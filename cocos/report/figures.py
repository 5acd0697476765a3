"""Figures (PNG and PDF), written atomically and deterministically.

Uses matplotlib's object API with the Agg canvas (no pyplot, no display, no
global state). Each function writes ``<path_stem>.png`` and ``<path_stem>.pdf``
(through :func:`cocos.io.atomic_path`) and returns a :class:`FigureOutput`: the
paths, and the data read back from the drawn artists so a caller (or a test)
can check what was plotted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cocos.io import atomic_path
from cocos.objectives.spec import DEFAULT_EPS  # noqa: E402
from cocos.report.tables import DIRECTIONS, STAT_HEADERS

DPI = 150
# Fixed metadata: no creation dates, so the same input gives the same bytes.
_META = {"png": {"Software": "cocos"}, "pdf": {"Creator": "cocos", "Producer": "cocos", "CreationDate": None}}


def _spec(loss: str, labels: Mapping | None = None) -> tuple[str, str, str]:
    """``(label, colour, main statistic)`` of a loss from its spec (a grey ``C_q`` for losses outside the registry)."""
    from cocos.objectives import OBJECTIVES

    spec = OBJECTIVES.get(loss)
    if spec is None:
        return (labels or {}).get(loss, loss), "#7f7f7f", "C_q"
    return spec.label, spec.color, spec.main_stat


def _order(losses) -> list[str]:
    from cocos.objectives import order

    return order(losses)


@dataclass
class FigureOutput:
    paths: list[Path]
    data: dict = field(default_factory=dict)


def save_figure(fig: Figure, path_stem: str | os.PathLike) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` atomically; return both paths."""
    stem = Path(path_stem)
    FigureCanvasAgg(fig)
    paths = []
    for ext in ("png", "pdf"):
        path = stem.with_name(stem.name + "." + ext)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            fig.savefig(fh, format=ext, dpi=DPI, metadata=_META[ext])
        paths.append(path)
    return paths


def _stat_label(stat: str) -> str:
    return STAT_HEADERS.get(stat, (stat,))[0]


def _bins(values: np.ndarray) -> np.ndarray:
    if values.size == 0:
        return np.linspace(0, 1, 11)
    lo, hi = float(values.min()), float(values.max())
    if np.allclose(values, np.round(values)) and hi - lo <= 60:
        return np.arange(np.floor(lo) - 0.5, np.ceil(hi) + 1.5)
    if hi == lo:
        return np.linspace(lo - 0.5, hi + 0.5, 11)
    return np.linspace(lo, hi, 31)


def plot_count_distributions(per_query: Mapping, path_stem: str | os.PathLike, labels: Mapping | None = None,
                             title: str | None = None) -> FigureOutput:
    """Histograms of the main per-query count, a grid of losses (rows) × directions (columns).

    ``per_query[loss][direction][stat]`` is a 1-D array (one value per query, all
    batches); the count shown is ``C_q`` (``C_qv-`` for NT-Xent) and its mean over
    all queries is drawn as a dashed line (for ``C_q`` also, dotted, the mean over
    queries with a gradient, as in the tables). ``data[(loss, direction)]`` holds
    the bar heights, bin edges and the lines' positions read back from the axes.
    """
    losses = _order(per_query)
    fig = Figure(figsize=(4.2 * len(DIRECTIONS), 2.8 * max(1, len(losses))), layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10)
    axes = fig.subplots(max(1, len(losses)), len(DIRECTIONS), squeeze=False)
    data = {}
    for i, loss in enumerate(losses):
        name, color, stat = _spec(loss, labels)
        for j, d in enumerate(DIRECTIONS):
            ax = axes[i][j]
            raw = per_query.get(loss, {}).get(d, {}).get(stat)
            ax.set_title(f"{name}, {d}", fontsize=10)
            ax.set_xlabel(f"{_stat_label(stat)} per query")
            ax.set_ylabel("queries")
            if raw is None:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", transform=ax.transAxes)
                continue
            values = np.asarray(raw, dtype=np.float64).ravel()
            values = values[np.isfinite(values)]
            heights, edges, _ = ax.hist(values, bins=_bins(values), color=color)
            mean = float(values.mean()) if values.size else float("nan")
            line = ax.axvline(mean, color="black", linestyle="--", linewidth=1,
                              label=f"mean {mean:.2f} (all queries)")
            entry = {"heights": np.array([p.get_height() for p in ax.patches]), "edges": np.asarray(edges),
                     "mean": float(line.get_xdata()[0]), "stat": stat}
            if stat == "C_q" and (values > 0).any():
                # The tables' C^q averages over queries that have a gradient only.
                grad_mean = float(values[values > 0].mean())
                gline = ax.axvline(grad_mean, color="black", linestyle=":", linewidth=1,
                                   label=f"mean {grad_mean:.2f} (queries with a gradient)")
                entry["mean_with_gradient"] = float(gline.get_xdata()[0])
            ax.legend(fontsize=7, frameon=False)
            data[(loss, d)] = entry
    if not losses:
        axes[0][0].text(0.5, 0.5, "no per-query counts", ha="center", va="center")
    return FigureOutput(save_figure(fig, path_stem), data)


def plot_eps_sweep(sweep: Mapping, path_stem: str | os.PathLike, labels: Mapping | None = None,
                   title: str | None = None) -> FigureOutput:
    """Count vs ε (log x), one line per loss × direction; the default ε = 0.01 marked.

    ``sweep[loss][direction][eps][stat] = {"mean", "std", "n", "n_skipped"}`` (the
    results.json shape, eps as strings). ``data[(loss, direction)] = (eps, mean count)``
    read back from the drawn line.
    """
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    data = {}
    for loss in _order(sweep):
        name, color, stat = _spec(loss, labels)
        for d, style in zip(DIRECTIONS, ("-", "--"), strict=False):
            points = sweep[loss].get(d) or {}
            xy = sorted((float(eps), (entry.get(stat) or {}).get("mean")) for eps, entry in points.items())
            xy = [(x, y) for x, y in xy if y is not None]
            if not xy:
                continue
            x, y = (np.array(v, dtype=np.float64) for v in zip(*xy, strict=True))
            (line,) = ax.plot(x, y, style, marker="o", markersize=3, color=color,
                              label=f"{name} {d} ({_stat_label(stat)})")
            data[(loss, d)] = (np.asarray(line.get_xdata(), dtype=np.float64),
                               np.asarray(line.get_ydata(), dtype=np.float64))
    ax.axvline(DEFAULT_EPS, color="black", linestyle=":", linewidth=1, label=f"default ε = {DEFAULT_EPS}")
    ax.set_xscale("log")
    ax.set_xlabel("threshold ε")
    ax.set_ylabel("contributing candidates per query")
    ax.set_title(title or "COCOS vs threshold ε")
    ax.legend(fontsize=8, frameon=False)
    data["default_eps"] = DEFAULT_EPS
    return FigureOutput(save_figure(fig, path_stem), data)


def plot_cocos_vs_rsum(rows, path_stem: str | os.PathLike, direction: str = "i2t") -> FigureOutput:
    """Scatter of each model's COCOS (main count of its own loss) against its rsum, a colour per loss.

    ``rows``: the tidy frame of :func:`cocos.report.merge.cocos_vs_rsum_rows` (label, loss, direction,
    stat, rsum, cocos). ``data["points"]`` is the ``(n, 2)`` array ``(cocos, rsum)`` read back from the
    scatter, ``data["labels"]`` the annotations.
    """
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.add_subplot()
    rows = rows[rows["direction"] == direction] if len(rows) else rows
    points, labels = [], []
    for _, r in rows.iterrows():
        name, color, stat = _spec(r["loss"])
        coll = ax.scatter([r["cocos"]], [r["rsum"]], color=color, zorder=3)
        points.append(np.asarray(coll.get_offsets(), dtype=np.float64)[0])
        ax.annotate(r["label"], (float(r["cocos"]), float(r["rsum"])), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
        labels.append(r["label"])
    if not len(rows):
        ax.text(0.5, 0.5, "no results with both rsum and COCOS", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(f"COCOS ({direction}, main count of the training loss)")
    ax.set_ylabel("rsum (test)")
    ax.set_title("COCOS at the selected checkpoint vs retrieval")
    ax.grid(True, linewidth=0.3)
    data = {"points": np.array(points).reshape(-1, 2), "labels": labels}
    return FigureOutput(save_figure(fig, path_stem), data)
