"""One look for every cocos figure: seaborn's paper context, a colour and marker per loss, math labels.

Figures are drawn on a :class:`matplotlib.figure.Figure` with the Agg canvas (no
pyplot state) inside :func:`paper_style`, a ``matplotlib.rc_context`` holding
seaborn's ``paper`` context and ``ticks`` style, so nothing leaks into the user's
own plots. :func:`save` writes ``<stem>.png`` and ``<stem>.pdf`` atomically and
without time stamps (the same input gives the same bytes). A loss's colour,
marker and label come from its presentation in the results (:mod:`cocos.presentation`); statistics are
labelled in math (``$C^{q}$``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import matplotlib
import matplotlib.colors as mcolors
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cocos.io import atomic_path
from cocos.presentation import GREY, Presentation  # noqa: F401  (GREY: style.GREY for the figures)
from cocos.report.tables import STAT_HEADERS

DPI = 300  # PNGs at print resolution (the figures are drawn at their printed size)
# Print sizes: an LNCS text column is 12.2 cm wide; a figure* spans the same width in llncs.
COLUMN_IN = 12.2 / 2.54
WIDTHS_IN = {"column": COLUMN_IN, "page": COLUMN_IN}
# Font sizes in points at print size: 8 pt text, 7 pt ticks and legends (the issue's 7-9 pt band).
FONT_PT = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
           "legend.fontsize": 7, "legend.title_fontsize": 7, "figure.titlesize": 9}
SMALL_PT = 7  # the smallest text cocos draws
# Fixed metadata: no creation dates, so the same input gives the same bytes.
_META = {"png": {"Software": "cocos"}, "pdf": {"Creator": "cocos", "Producer": "cocos", "CreationDate": None}}
DIRECTION_DASHES = {"i2t": "-", "t2i": "--"}
# Lines at print size: none thinner than MIN_LINE_PT; faint lines (per-batch values under their rolling mean) are an
# opaque tint of their colour (overlapping lines do not darken) with FAINT_INK of ink (style.ink: 1 is black).
MIN_LINE_PT = 0.6
FAINT_LINE_PT = 0.75
FAINT_INK = 0.5


def rc() -> dict:
    """The rc parameters of cocos figures: seaborn's paper context and ticks style, at the print font sizes."""

    params = dict(sns.axes_style("ticks"))
    params.update(sns.plotting_context("paper"))
    params.update(FONT_PT)
    params.update({"axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False,
                   "savefig.dpi": DPI, "figure.dpi": 100, "axes.grid": True, "grid.linewidth": 0.4,
                   "grid.color": "#e6e6e6", "pdf.fonttype": 42, "lines.linewidth": 1.0, "lines.markersize": 4,
                   "axes.linewidth": 0.6, "xtick.major.width": 0.6, "ytick.major.width": 0.6,
                   "figure.constrained_layout.h_pad": 0.04, "figure.constrained_layout.w_pad": 0.04})
    return params


@contextlib.contextmanager
def paper_style() -> Iterator[None]:

    with matplotlib.rc_context(rc()):
        yield


def figure(height: float, width: str = "column"):
    """A new figure of the print ``width`` ("column" or "page": 12.2 cm in LNCS) and ``height`` inches
    (constrained layout, Agg canvas); call inside :func:`paper_style`."""

    fig = Figure(figsize=(WIDTHS_IN[width], height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def caption(fig, text: str | None) -> None:
    """A figure's title goes to its caption, not into the figure: it is kept as the files' metadata title."""
    fig.cocos_title = text


def save(fig, path_stem: str | os.PathLike) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` atomically; return both paths."""

    stem = Path(path_stem)
    paths = []
    title = getattr(fig, "cocos_title", None)
    for ext in ("png", "pdf"):
        path = stem.with_name(stem.name + "." + ext)
        meta = {**_META[ext], **({"Title": title} if title else {})}
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            fig.savefig(fh, format=ext, dpi=DPI, metadata=meta)
        paths.append(path)
        fig.set_layout_engine("none")  # the first save laid the figure out; the second keeps that layout
    return paths


def ink(color) -> float:
    """How much a colour stands out from white paper: its darkest channel's distance from white, times its alpha
    (0: invisible, 1: black)."""
    r, g, b, a = mcolors.to_rgba(color)
    return (1.0 - min(r, g, b)) * a


def faint(color) -> tuple[float, float, float]:
    """The colour of faint lines: an opaque lighter tint of ``color`` with :data:`FAINT_INK` of ink (the colour
    itself where it has less), visible at print size where an alpha of 0.3 was not."""
    rgb = mcolors.to_rgb(color)
    keep = min(1.0, FAINT_INK / max(ink(rgb), 1e-9))
    return tuple(1.0 - keep * (1.0 - c) for c in rgb)


def loss_style(loss: str, looks: Mapping[str, Presentation] | None = None) -> tuple[str, str, str, str]:
    """``(label, colour, marker, main statistic)`` of a loss from its presentation (grey ``o``/``C_q`` without)."""
    look = (looks or {}).get(loss) or Presentation(label=loss)
    return look.label, look.color, look.marker, look.main_stat


def stat_math(stat: str) -> str:
    """A statistic's symbol in math, as the LaTeX tables write it."""

    return STAT_HEADERS.get(stat, (stat, stat))[1]
