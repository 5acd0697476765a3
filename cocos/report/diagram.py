"""Triplet-weight diagrams (GOAL paper, Figure 2) with where a checkpoint's triplets lie.

A *triplet diagram* is the heat map of a triplet weight ``T`` (or a gradient scalar
``T·P±``) over the positive similarity ``Sp`` (x axis) and the hardest-negative
similarity ``Sn`` (y axis). :func:`cocos.pipelines.triplets.triplet_points` forms the same seeded pair
batches as the counting engine and collects ``(s+, hardest s−)`` of every query in
both directions; :func:`cocos.pipelines.triplets.triplet_diagram` evaluates the weights over the square
and the share of triplets where each is active. This module only draws that data:
:func:`draw_triplet_diagram` overlays the triplets as density contours
(a 2-D histogram smoothed with a fixed Gaussian kernel, contours at the levels
that enclose 50% and 90% of the points: deterministic, no random KDE bandwidth)
and reports the share of triplets in the *active region*: where the triplet weight
``T > 1/2`` (for ``T_con``: the triplets that violate the margin and get a gradient;
for ``T·P±`` the region is that of its ``T``, the pair weight only scales).

Range: the paper's Figure 2 draws the similarity square where the diagram is
informative; cosine similarities of a trained model's hardest triplets lie in
``[0, 1]``. ``extent=None`` picks ``[0, 1]²`` when every point lies there, else the
full ``[−1, 1]²``, so no point is ever cut off silently.

Figures are drawn with the Agg canvas (no pyplot state), written as PNG and PDF
through a temporary file and ``os.replace``, without time stamps: the same
inputs give the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
from matplotlib import patheffects
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from cocos.report import style

ACTIVE_THRESHOLD = 0.5  # a triplet is in the active region where its triplet weight T exceeds this
DEFAULT_EXTENT = (0.0, 1.0)
FULL_EXTENT = (-1.0, 1.0)
DENSITY_LEVELS = (0.5, 0.9)  # contours enclosing these shares of the points
# i2t in the loss's colour (this red without one), solid; t2i near-black (white beside a dark loss colour), dashed;
# each contour on a thin halo of the opposite lightness, so that it shows on any part of the viridis map
DIRECTION_STYLE = {"i2t": ("#d62728", "solid"), "t2i": ("#1a1a1a", "dashed")}
CONTOUR_PT, HALO_PT = 1.2, 1.0  # the density contours' width; the halo's on either side
MAX_PANELS_PER_ROW = 2  # two panels across the 12.2 cm column
WEIGHT_LEVELS = (0.1, 0.3, 0.5, 0.7, 0.9)  # contour levels of a continuous weight, as shares of its maximum (or 1)

# -- the data a diagram draws ---------------------------------------------------------------


@dataclass(frozen=True)
class WeightPanel:
    """One heat map: weight ``name`` (parsed as ``triplet``, ``pair``, ``sign``) evaluated over the square.

    ``values[i, j]`` is the weight at ``(Sp = grid[j], Sn = grid[i])``; ``params`` are the parameters the weight
    uses (shown under the panel); ``boundary`` the margin of ``T_con`` drawn alone (its exact boundary
    ``Sn = Sp − margin`` is drawn as a line), else ``None``; ``active[key]`` the share of the triplets ``key``
    where the panel's triplet weight exceeds :data:`ACTIVE_THRESHOLD` (``None``: no triplet weight or no points).
    """

    name: str
    triplet: str | None
    pair: str | None
    sign: str | None
    values: np.ndarray
    params: dict
    boundary: float | None
    active: dict[str, float | None]


@dataclass(frozen=True)
class TripletDiagram:
    """What :func:`draw_triplet_diagram` draws: the panels over ``grid`` (both axes) on ``extent²``, and the
    triplets ``points[key] = (sp, sn)`` with their count and the share of them outside the square."""

    grid: np.ndarray
    extent: tuple[float, float]
    panels: list[WeightPanel]
    points: dict[str, tuple[np.ndarray, np.ndarray]]
    n_points: dict[str, int]
    outside: dict[str, float]


@dataclass
class DiagramResult:
    """What :func:`draw_triplet_diagram` drew: the grid data of each panel and the point summary.

    ``values[name][i, j]`` is the weight at ``(sp[j], sn[i])`` (rows: ``Sn``, as drawn
    with the origin at the bottom left).
    """

    paths: list[Path]
    sp: np.ndarray
    sn: np.ndarray
    values: dict[str, np.ndarray]
    extent: tuple[float, float]
    active: dict[str, dict[str, float | None]] = field(default_factory=dict)  # name -> points key -> share
    n_points: dict[str, int] = field(default_factory=dict)
    outside: dict[str, float] = field(default_factory=dict)  # points key -> share outside the square


@dataclass
class PairCurves:
    """Pair-weight curves: ``positive[name]`` is ``P+`` over ``s``, ``negative[name]`` is ``P−`` over ``s``."""

    paths: list[Path]
    s: np.ndarray
    positive: dict[str, np.ndarray]
    negative: dict[str, np.ndarray]


# -- notation -----------------------------------------------------------------------------------


def _math_code(code: str) -> str:
    """A weight's code as upright math: ``P_sig-ms`` -> ``\\mathrm{sig}\\text{-}\\mathrm{ms}``."""
    return r"\mathrm{" + code.split("_", 1)[1].replace("-", r"}\text{-}\mathrm{") + "}"


def notation(triplet: str | None, pair: str | None, sign: str | None) -> str:
    """A parsed weight in the GOAL paper's notation, as matplotlib math (``T_cir``, ``P_sig-ms``, ``+`` ->
    T_cir · P+_sig-ms)."""
    parts = []
    if triplet is not None:
        parts.append(f"T_{{{_math_code(triplet)}}}")
    if pair is not None:
        parts.append(f"P^{{{'+' if sign == '+' else '-'}}}_{{{_math_code(pair)}}}")
    return "$" + r" \cdot ".join(parts) + "$"


def pair_notation(pair: str) -> str:
    """A pair weight without its sign in the paper's notation: ``P_sig-ms`` -> ``$P_{sig-ms}$``."""
    return notation(None, pair, "+").replace("^{+}", "")


PARAM_MATH = {"margin": r"\alpha", "tau": r"\tau", "alpha": r"\alpha", "beta": r"\beta", "lam": r"\lambda",
              "m_pos": r"m^{+}", "m_neg": r"m^{-}"}


def _label(panel: WeightPanel) -> str:
    """A panel's title: the weight's notation, then the parameters it uses, three per line (fits a 6 cm panel)."""
    used = panel.params
    shown = {k: v for k, v in used.items() if k in PARAM_MATH}
    args = [f"${PARAM_MATH[k]}={v:g}$" if isinstance(v, float) else f"${PARAM_MATH[k]}={v}$" for k, v in shown.items()]
    args += ["offset"] if used.get("offset") else []
    lines = [", ".join(args[i:i + 3]) for i in range(0, len(args), 3)]
    return "\n".join([notation(panel.triplet, panel.pair, panel.sign), *lines])


def _bar_label(panel: WeightPanel) -> str:
    """The colour bar's name: a pair weight, a triplet weight, or their product (a gradient scalar)."""
    if panel.triplet is None:
        return "pair weight"
    return "triplet weight" if panel.pair is None else "gradient scalar"


def file_slug(name: str) -> str:
    """A file-name-safe form of a weight name: ``T_nca*P_sig-`` -> ``T_nca_x_P_sig_neg``."""
    out = str(name).replace("\u2212", "-")
    if out.endswith("+"):
        out = out[:-1] + "_pos"
    elif out.endswith("-"):
        out = out[:-1] + "_neg"
    return out.replace("*", "_x_").replace(",", "_")


# -- point densities ---------------------------------------------------------------------------


def _gaussian_kernel(sigma: float) -> np.ndarray:
    """A normalised 1-D Gaussian kernel of standard deviation ``sigma`` bins, cut at 3 sigma."""
    r = max(1, int(np.ceil(3 * sigma)))
    x = np.arange(-r, r + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def density_grid(sp, sn, extent: tuple[float, float], bins: int = 80, sigma: float = 1.5):
    """Smoothed 2-D histogram of the points over ``extent²``: ``(centres, density[sn, sp], levels)``.

    ``levels`` are the density values whose super-level sets enclose the shares
    :data:`DENSITY_LEVELS` of the (smoothed) mass, ascending; deterministic.
    """
    lo, hi = extent
    edges = np.linspace(lo, hi, bins + 1)
    hist, _, _ = np.histogram2d(np.asarray(sn), np.asarray(sp), bins=[edges, edges])
    k = _gaussian_kernel(sigma)
    pad = len(k) // 2
    h = np.pad(hist, pad)
    h = np.apply_along_axis(lambda r: np.convolve(r, k, mode="valid"), 0, h)
    h = np.apply_along_axis(lambda r: np.convolve(r, k, mode="valid"), 1, h)
    centres = (edges[:-1] + edges[1:]) / 2
    total = h.sum()
    if total <= 0:
        return centres, h, []
    flat = np.sort(h.reshape(-1))[::-1]
    cum = np.cumsum(flat) / total
    levels = sorted({float(flat[min(np.searchsorted(cum, q), len(flat) - 1)]) for q in DENSITY_LEVELS})
    levels = [lv for lv in levels if lv > 0]
    return centres, h, levels


# -- the diagram -------------------------------------------------------------------------------


def _luminance(color) -> float:
    r, g, b = mcolors.to_rgb(color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def direction_colours(color: str) -> dict[str, str]:
    """The contour colour of each direction's triplets: i2t in ``color`` (the loss's), t2i near-black, or white
    where ``color`` is itself dark: two colours (and two line styles) a reader tells apart."""
    return {"i2t": color, "t2i": "white" if _luminance(color) < 0.2 else DIRECTION_STYLE["t2i"][0]}


def _direction_style(key: str, color: str) -> dict:
    """Colour, line style and halo (``path_effects``) of one direction's density contours and legend line."""
    line = direction_colours(color).get(key, color)
    halo = "white" if _luminance(line) < 0.6 else "0.1"
    return {"color": line, "linestyle": DIRECTION_STYLE.get(key, (None, "solid"))[1],
            "path_effects": [patheffects.withStroke(linewidth=CONTOUR_PT + 2 * HALO_PT, foreground=halo, alpha=0.8),
                             patheffects.Normal()]}


def draw_triplet_diagram(
    diagram: TripletDiagram,
    *,
    path_stem: str | os.PathLike,
    title: str | None = None,
    color: str = DIRECTION_STYLE["i2t"][0],
    points_label: str = "triplets",
) -> DiagramResult:
    """Draw the heat maps of ``diagram`` (one panel each, two per row) with its triplets as density contours (i2t
    solid in ``color``, t2i dashed in near-black: :func:`direction_colours`), named ``points_label`` in the legend;
    write ``path_stem.png`` and ``path_stem.pdf`` (``title`` is their metadata title: a figure's title belongs in
    its caption)."""
    panels = diagram.panels
    result = DiagramResult(paths=[], sp=diagram.grid, sn=diagram.grid.copy(),
                           values={p.name: p.values for p in panels}, extent=diagram.extent,
                           active={p.name: p.active for p in panels}, n_points=dict(diagram.n_points),
                           outside=dict(diagram.outside))
    with style.paper_style():
        ncols = min(MAX_PANELS_PER_ROW, len(panels))
        nrows = -(-len(panels) // ncols)
        fig = style.figure(2.3 * nrows + (0.6 if diagram.points else 0.1))
        fig.get_layout_engine().set(rect=(0, 0, 0.97, 1))  # the layout misjudges the last colour bar's labels
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax in axes[len(panels):]:
            ax.set_axis_off()
        for ax, panel in zip(axes, panels, strict=False):
            _draw_panel(fig, ax, panel, diagram, color)
        if diagram.points:
            _legend(fig, diagram, color, points_label, ncols)
        style.caption(fig, title)
        result.paths = style.save(fig, Path(path_stem))
    return result


def _draw_panel(fig, ax, panel: WeightPanel, diagram: TripletDiagram, color: str) -> None:
    """One weight's heat map on ``ax``: its boundary or contours, the diagonal, the triplets, labels, colour bar."""
    lo, hi = diagram.extent
    v = panel.values
    vmin, vmax = float(min(v.min(), 0.0)), float(max(v.max(), 1.0))
    im = ax.imshow(v, origin="lower", extent=(lo, hi, lo, hi), cmap="viridis", vmin=vmin, vmax=vmax,
                   aspect="auto", interpolation="bilinear")
    ax.set_box_aspect(1)  # square panels that the layout engine can place (aspect="equal" it cannot)
    if panel.boundary is not None:  # the exact boundary: Sn = Sp - margin
        ax.plot([lo, hi], [lo - panel.boundary, hi - panel.boundary], color="white", linewidth=1.0)
    else:
        _weight_contours(ax, diagram.grid, v)
    ax.plot([lo, hi], [lo, hi], color="0.85", linewidth=0.6, linestyle=":")
    _draw_points(ax, diagram.points, (lo, hi), color, panel.active if panel.pair is None else {})
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(r"$S_p$ (positive similarity)")
    ax.set_ylabel(r"$S_n$ (hardest negative)")
    ax.set_title(_label(panel))
    ax.grid(False)
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    bar.set_label(_bar_label(panel), labelpad=1)
    bar.ax.yaxis.set_label_position("left")  # between panel and bar: the layout keeps it inside the figure


def _weight_contours(ax, grid: np.ndarray, v: np.ndarray) -> None:
    """White contours of a weight: its 1/2 level if it only takes 0 and 1, else :data:`WEIGHT_LEVELS` (labelled),
    both as shares of its maximum when that exceeds 1; levels outside the weight's range are left out."""
    binary = bool(np.isin(v, (0.0, 1.0)).all())
    scale = 1.0 if v.max() <= 1.0 else float(v.max())
    levels = [lv * scale for lv in ((0.5,) if binary else WEIGHT_LEVELS)]
    levels = [lv for lv in levels if v.min() < lv < v.max()]
    if not levels:
        return
    cs = ax.contour(grid, grid, v, levels=levels, colors="white", linewidths=0.6, alpha=0.8)
    if not binary:
        ax.clabel(cs, fontsize=style.SMALL_PT, fmt="%.2g")


def _legend(fig, diagram: TripletDiagram, color: str, points_label: str, ncols: int) -> None:
    """The figure's legend: one line per direction with at least two triplets and, if a panel shows a
    triplet weight's active share, what that share means."""
    held = " / ".join(f"{q:.0%}" for q in DENSITY_LEVELS)
    handles = [Line2D([], [], linewidth=CONTOUR_PT, label=f"{k} {points_label} (contours hold {held})",
                      **_direction_style(k, color))
               for k, (sp, _) in diagram.points.items() if sp.size >= 2]
    if any(p.pair is None for p in diagram.panels):
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"% active: share of triplets where T > {ACTIVE_THRESHOLD:g}"))
    fig.legend(handles=handles, loc="outside lower center", ncols=1 if ncols < 3 else min(3, len(handles)),
               fontsize=style.SMALL_PT)


def _draw_points(ax, pts: dict, extent, color: str, active: dict) -> None:
    """Density contours of each direction's triplets (i2t solid in ``color``, t2i dashed near-black: see
    :func:`direction_colours`; ``gid`` ``triplets i2t``/``triplets t2i``) and, on a T panel, the share of them in its
    active region (a T·P panel's region is that of its T: said once)."""

    for i, (key, (sp, sn)) in enumerate(pts.items()):
        if sp.size < 2:
            continue
        centres, dens, dlevels = density_grid(sp, sn, extent)
        if dlevels:
            look = _direction_style(key, color)
            cs = ax.contour(centres, centres, dens, levels=dlevels, colors=[look["color"]],
                            linestyles=look["linestyle"], linewidths=CONTOUR_PT)
            cs.set(path_effects=look["path_effects"], gid=f"triplets {key}")
        share = active.get(key)
        if share is not None:
            ax.text(0.03, 0.97 - 0.09 * i, f"{key}: {100 * share:.1f}% active", transform=ax.transAxes,
                    ha="left", va="top", fontsize=style.SMALL_PT, color="black",
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.8, "linewidth": 0})


def draw_pair_weights(curves: PairCurves, *, path_stem: str | os.PathLike) -> PairCurves:
    """Draw pair-weight curves (paper Figure 3): ``P+`` over ``Sp`` (left), ``P−`` over ``Sn`` (right); write
    ``path_stem.png`` and ``.pdf`` and return ``curves`` with their paths."""
    lo, hi = float(curves.s[0]), float(curves.s[-1])
    with style.paper_style():
        fig = style.figure(2.2)
        axes = fig.subplots(1, 2)
        for ax, lines, xlabel, title in ((axes[0], curves.positive, r"$S_p$", r"$P_+$ (positive pairs)"),
                                         (axes[1], curves.negative, r"$S_n$", r"$P_-$ (negative pairs)")):
            for i, (n, y) in enumerate(lines.items()):
                ax.plot(curves.s, y, color=f"C{i}", label=pair_notation(n), linewidth=1.4)
            ax.set_xlim(lo, hi)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("pair weight")
            ax.set_title(title)
            ax.legend(fontsize=style.SMALL_PT)
        curves.paths = style.save(fig, Path(path_stem))
    return curves


__all__ = [  # the computing entry points (plot_triplet_diagram, ...) are cocos.pipelines.triplets'
    "ACTIVE_THRESHOLD", "DiagramResult", "PairCurves", "TripletDiagram", "WeightPanel", "density_grid",
    "draw_pair_weights", "draw_triplet_diagram", "file_slug", "notation", "pair_notation",
]
