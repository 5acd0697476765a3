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

from cocos.presentation import GREY, Presentation  # noqa: F401  (GREY: style.GREY for the figures)

DPI = 150
FONT_SCALE = 1.1
# Fixed metadata: no creation dates, so the same input gives the same bytes.
_META = {"png": {"Software": "cocos"}, "pdf": {"Creator": "cocos", "Producer": "cocos", "CreationDate": None}}
DIRECTION_DASHES = {"i2t": "-", "t2i": "--"}


def rc() -> dict:
    """The rc parameters of cocos figures: seaborn's paper context and ticks style."""
    import seaborn as sns

    params = dict(sns.axes_style("ticks"))
    params.update(sns.plotting_context("paper", font_scale=FONT_SCALE))
    params.update({"axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False,
                   "savefig.dpi": DPI, "figure.dpi": 100, "axes.grid": True, "grid.linewidth": 0.4,
                   "grid.color": "#e6e6e6", "pdf.fonttype": 42})
    return params


@contextlib.contextmanager
def paper_style() -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context(rc()):
        yield


def figure(width: float, height: float):
    """A new figure (constrained layout) on the Agg canvas; call inside :func:`paper_style`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def suptitle(fig, text: str) -> None:
    """The figure's title, wrapped to the figure's width (about 9 characters per inch): never cut off."""
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(text, max(20, int(9 * fig.get_figwidth())))))


def save(fig, path_stem: str | os.PathLike) -> list[Path]:
    """Write ``fig`` as ``<stem>.png`` and ``<stem>.pdf`` atomically; return both paths."""
    from cocos.io import atomic_path

    stem = Path(path_stem)
    paths = []
    for ext in ("png", "pdf"):
        path = stem.with_name(stem.name + "." + ext)
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            fig.savefig(fh, format=ext, dpi=DPI, metadata=_META[ext])
        paths.append(path)
        fig.set_layout_engine("none")  # the first save laid the figure out; the second keeps that layout
    return paths


def loss_style(loss: str, looks: Mapping[str, Presentation] | None = None) -> tuple[str, str, str, str]:
    """``(label, colour, marker, main statistic)`` of a loss from its presentation (grey ``o``/``C_q`` without)."""
    look = (looks or {}).get(loss) or Presentation(label=loss)
    return look.label, look.color, look.marker, look.main_stat


def stat_math(stat: str) -> str:
    """A statistic's symbol in math, as the LaTeX tables write it."""
    from cocos.report.tables import STAT_HEADERS

    return STAT_HEADERS.get(stat, (stat, stat))[1]
