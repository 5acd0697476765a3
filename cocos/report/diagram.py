"""Triplet-weight diagrams (GOAL paper, Figure 2) with where a checkpoint's triplets lie.

A *triplet diagram* is the heat map of a triplet weight ``T`` (or a gradient scalar
``T·P±``) over the positive similarity ``Sp`` (x axis) and the hardest-negative
similarity ``Sn`` (y axis). :func:`cocos.pipelines.triplets.triplet_points` forms the same seeded pair
batches as the counting engine and collects ``(s+, hardest s−)`` of every query in
both directions; :func:`plot_triplet_diagram` overlays them as density contours
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import CocosError
from cocos.losses.goal import PAIR_WEIGHTS, parse_weight, triplet_part, weight_grid, weight_params
from cocos.report import style

ACTIVE_THRESHOLD = 0.5
DEFAULT_EXTENT = (0.0, 1.0)
FULL_EXTENT = (-1.0, 1.0)
DENSITY_LEVELS = (0.5, 0.9)  # contours enclosing these shares of the points
DIRECTION_STYLE = {"i2t": ("#d62728", "solid"), "t2i": ("#ff9896", "dashed")}
MAX_PANELS_PER_ROW = 2  # two panels across the 12.2 cm column


def _as_point_dict(points) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if points is None:
        return {}
    if isinstance(points, dict):
        items = points.items()
    else:
        items = [("points", points)]
    out = {}
    for key, (sp, sn) in items:
        sp, sn = np.asarray(sp, dtype=np.float64).reshape(-1), np.asarray(sn, dtype=np.float64).reshape(-1)
        if sp.shape != sn.shape:
            raise CocosError(f"points '{key}': {sp.size} positive but {sn.size} negative similarities")
        out[str(key)] = (sp, sn)
    return out


def active_share(weight: str, sp, sn, **params) -> float | None:
    """Share of the triplets ``(sp, sn)`` where the triplet weight of ``weight`` is ``> 1/2``.

    For ``T_con`` that is ``T = 1`` (margin violated). ``None`` for a pair weight alone
    or no points.
    """
    sp, sn = np.asarray(sp, dtype=np.float64), np.asarray(sn, dtype=np.float64)
    if sp.size == 0:
        return None
    t = triplet_part(weight, torch.from_numpy(sp), torch.from_numpy(sn), **params)
    if t is None:
        return None
    return float((t > ACTIVE_THRESHOLD).double().mean())


# -- drawing helpers ------------------------------------------------------------------------


def _gaussian_kernel(sigma: float) -> np.ndarray:
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


def _bar_label(spec) -> str:
    if spec.triplet is None:
        return "pair weight"
    return "triplet weight" if spec.pair is None else "gradient scalar"


def paper_notation(name: str) -> str:
    """A weight in the GOAL paper's notation, as matplotlib math (``T_cir*P_sig-ms+`` -> T_cir · P+_sig-ms)."""
    spec = parse_weight(name)

    def sub(code: str) -> str:
        return r"\mathrm{" + code.split("_", 1)[1].replace("-", r"}\text{-}\mathrm{") + "}"

    parts = []
    if spec.triplet is not None:
        parts.append(f"T_{{{sub(spec.triplet)}}}")
    if spec.pair is not None:
        parts.append(f"P^{{{'+' if spec.sign == '+' else '-'}}}_{{{sub(spec.pair)}}}")
    return "$" + r" \cdot ".join(parts) + "$"


PARAM_MATH = {"margin": r"\alpha", "tau": r"\tau", "alpha": r"\alpha", "beta": r"\beta", "lam": r"\lambda",
              "m_pos": r"m^{+}", "m_neg": r"m^{-}"}


def _label(name: str, params: dict) -> str:
    used = weight_params(name, **params)
    shown = {k: v for k, v in used.items() if k in PARAM_MATH}
    args = [f"${PARAM_MATH[k]}={v:g}$" if isinstance(v, float) else f"${PARAM_MATH[k]}={v}$" for k, v in shown.items()]
    args += ["offset"] if used.get("offset") else []
    lines = [", ".join(args[i:i + 3]) for i in range(0, len(args), 3)]  # three per line: fits a 6 cm panel
    return "\n".join([paper_notation(name), *lines])


# -- the diagram -------------------------------------------------------------------------------


@dataclass
class DiagramResult:
    """What :func:`plot_triplet_diagram` drew: the grid data of each panel and the point summary.

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


def common_extent(point_sets) -> tuple[float, float]:
    """One square for the diagrams of several models: ``[0, 1]`` if every triplet of all of them lies there."""
    merged: dict = {}
    for i, pts in enumerate(point_sets):
        for key, value in _as_point_dict(pts).items():
            merged[f"{i}/{key}"] = value
    return _choose_extent(None, merged)


def _choose_extent(extent, pts: dict) -> tuple[float, float]:
    if extent is not None:
        lo, hi = float(extent[0]), float(extent[1])
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise CocosError(f"extent must be two numbers lo < hi, got {extent}")
        return lo, hi
    lo, hi = DEFAULT_EXTENT
    for sp, sn in pts.values():
        if sp.size and (min(sp.min(), sn.min()) < lo or max(sp.max(), sn.max()) > hi):
            return FULL_EXTENT
    return DEFAULT_EXTENT


def plot_triplet_diagram(
    weight: str | Sequence[str],
    *,
    params: dict | None = None,
    points=None,
    path_stem: str | os.PathLike,
    extent: tuple[float, float] | None = None,
    resolution: int = 301,
    title: str | None = None,
    color: str = DIRECTION_STYLE["i2t"][0],
    points_label: str = "triplets",
) -> DiagramResult:
    """Heat map(s) of weight(s) over ``(Sp, Sn)``, one panel per name, written as PNG and PDF.

    ``weight``: a name (``"T_nca"``, ``"T_cir*P_sig-"``, ...) or a list of names
    (side-by-side panels, as the paper's Figure 2). ``params``: ``margin``, ``tau``,
    ``offset``, ``alpha``, ... (each weight takes what it uses). ``points``:
    ``{direction: (sp, sn)}`` (e.g. :func:`cocos.pipelines.triplets.triplet_points`) or one ``(sp, sn)`` pair,
    drawn as density contours in ``color`` (the model's loss colour; i2t solid, t2i dashed), named ``points_label``
    in the legend ("training triplets" for a model's own training data). Panels of a triplet weight ``T`` show the
    share of triplets where it is active. Writes ``path_stem.png`` and ``path_stem.pdf`` (``title`` is their
    metadata title: a figure's title belongs in its caption).
    """
    names = [weight] if isinstance(weight, str) else list(weight)
    if not names:
        raise CocosError("no weight to draw")
    specs = [parse_weight(n) for n in names]
    names = [s.name for s in specs]
    params = {k: v for k, v in (params or {}).items() if v is not None}
    if resolution < 2:
        raise CocosError(f"resolution must be at least 2, got {resolution}")
    pts = _as_point_dict(points)
    lo, hi = _choose_extent(extent, pts)
    grid = np.linspace(lo, hi, resolution)
    g = torch.from_numpy(grid)
    values = {n: weight_grid(n, g[None, :], g[:, None], **params).numpy().copy() for n in names}

    result = DiagramResult(paths=[], sp=grid, sn=grid.copy(), values=values, extent=(lo, hi))
    for key, (sp, sn) in pts.items():
        result.n_points[key] = int(sp.size)
        inside = (sp >= lo) & (sp <= hi) & (sn >= lo) & (sn <= hi)
        result.outside[key] = float(1 - inside.mean()) if sp.size else 0.0
    for n in names:
        result.active[n] = {key: active_share(n, sp, sn, **params) for key, (sp, sn) in pts.items()}



    with style.paper_style():
        ncols = min(MAX_PANELS_PER_ROW, len(names))
        nrows = -(-len(names) // ncols)
        fig = style.figure(2.3 * nrows + (0.6 if pts else 0.1))
        fig.get_layout_engine().set(rect=(0, 0, 0.97, 1))  # the layout misjudges the last colour bar's labels
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax in axes[len(names):]:
            ax.set_axis_off()
        for ax, name, spec in zip(axes, names, specs, strict=False):
            v = values[name]
            vmin, vmax = float(min(v.min(), 0.0)), float(max(v.max(), 1.0))
            im = ax.imshow(v, origin="lower", extent=(lo, hi, lo, hi), cmap="viridis", vmin=vmin, vmax=vmax,
                           aspect="auto", interpolation="bilinear")
            ax.set_box_aspect(1)  # square panels that the layout engine can place (aspect="equal" it cannot)
            binary = bool(np.isin(v, (0.0, 1.0)).all())
            if spec.triplet == "T_con" and spec.pair is None:  # the exact boundary: Sn = Sp - margin
                m = float(weight_params("T_con", **params).get("margin", DEFAULT_MARGIN))
                ax.plot([lo, hi], [lo - m, hi - m], color="white", linewidth=1.0)
            else:
                scale = 1.0 if v.max() <= 1.0 else float(v.max())
                levels = [lv * scale for lv in ((0.5,) if binary else (0.1, 0.3, 0.5, 0.7, 0.9))]
                levels = [lv for lv in levels if v.min() < lv < v.max()]
                if levels:
                    cs = ax.contour(grid, grid, v, levels=levels, colors="white", linewidths=0.6, alpha=0.8)
                    if not binary:
                        ax.clabel(cs, fontsize=style.SMALL_PT, fmt="%.2g")
            ax.plot([lo, hi], [lo, hi], color="0.85", linewidth=0.6, linestyle=":")
            _draw_points(ax, pts, (lo, hi), color, result.active[name] if spec.pair is None else {})
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_xlabel(r"$S_p$ (positive similarity)")
            ax.set_ylabel(r"$S_n$ (hardest negative)")
            ax.set_title(_label(name, params))
            ax.grid(False)
            bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            bar.set_label(_bar_label(spec), labelpad=1)
            bar.ax.yaxis.set_label_position("left")  # between panel and bar: the layout keeps it inside the figure
        if pts:
            held = " / ".join(f"{q:.0%}" for q in DENSITY_LEVELS)
            handles = [Line2D([], [], color=color,
                              linestyle=DIRECTION_STYLE.get(k, ("C0", "solid"))[1],
                              label=f"{k} {points_label} (contours hold {held})")
                       for k, (sp, _) in pts.items() if sp.size >= 2]
            if any(spec.pair is None for spec in specs):
                handles.append(Patch(facecolor="none", edgecolor="none",
                                     label=f"% active: share of triplets where T > {ACTIVE_THRESHOLD:g}"))
            fig.legend(handles=handles, loc="outside lower center", ncols=1 if ncols < 3 else min(3, len(handles)),
                       fontsize=style.SMALL_PT)
        style.caption(fig, title)
        result.paths = style.save(fig, Path(path_stem))
    return result


def _draw_points(ax, pts: dict, extent, color: str, active: dict) -> None:
    """Density contours of each direction's triplets (i2t solid, t2i dashed) and, on a T panel, the share of them
    in its active region (a T·P panel's region is that of its T: said once)."""

    for i, (key, (sp, sn)) in enumerate(pts.items()):
        if sp.size < 2:
            continue
        centres, dens, dlevels = density_grid(sp, sn, extent)
        if dlevels:
            ax.contour(centres, centres, dens, levels=dlevels, colors=[color],
                       linestyles=DIRECTION_STYLE.get(key, (None, "solid"))[1], linewidths=1.2)
        share = active.get(key)
        if share is not None:
            ax.text(0.03, 0.97 - 0.09 * i, f"{key}: {100 * share:.1f}% active", transform=ax.transAxes,
                    ha="left", va="top", fontsize=style.SMALL_PT, color="black",
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.8, "linewidth": 0})


@dataclass
class PairCurves:
    """Pair-weight curves: ``positive[name]`` is ``P+`` over ``s``, ``negative[name]`` is ``P−`` over ``s``."""

    paths: list[Path]
    s: np.ndarray
    positive: dict[str, np.ndarray]
    negative: dict[str, np.ndarray]


def plot_pair_weights(
    names: str | Sequence[str] = tuple(PAIR_WEIGHTS),
    *,
    params: dict | None = None,
    path_stem: str | os.PathLike,
    extent: tuple[float, float] = DEFAULT_EXTENT,
    resolution: int = 401,
) -> PairCurves:
    """Curves of pair weights (paper Figure 3): ``P+`` over ``Sp`` (left), ``P−`` over ``Sn`` (right).

    The multi-similarity forms are drawn with fixed relative terms ``m_pos``/``m_neg``
    (default 0.1 as in Figure 3).
    """
    names = [names] if isinstance(names, str) else list(names)
    canon = []
    for n in names:
        spec = parse_weight(f"{n.rstrip('+-')}+")
        if spec.triplet is not None:
            raise CocosError(f"'{n}' is not a pair weight (choose from {', '.join(PAIR_WEIGHTS)})")
        canon.append(spec.pair)
    params = {k: v for k, v in (params or {}).items() if v is not None}
    lo, hi = _choose_extent(extent, {})
    s = np.linspace(lo, hi, resolution)
    st = torch.from_numpy(s)
    positive = {n: weight_grid(f"{n}+", st, st, **params).numpy().copy() for n in canon}
    negative = {n: weight_grid(f"{n}-", st, st, **params).numpy().copy() for n in canon}

    with style.paper_style():
        fig = style.figure(2.2)
        axes = fig.subplots(1, 2)
        for ax, curves, xlabel, title in ((axes[0], positive, r"$S_p$", r"$P_+$ (positive pairs)"),
                                          (axes[1], negative, r"$S_n$", r"$P_-$ (negative pairs)")):
            for i, (n, y) in enumerate(curves.items()):
                ax.plot(s, y, color=f"C{i}", label=_pair_name(n), linewidth=1.4)
            ax.set_xlim(lo, hi)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("pair weight")
            ax.set_title(title)
            ax.legend(fontsize=style.SMALL_PT)
        paths = style.save(fig, Path(path_stem))
    return PairCurves(paths=paths, s=s, positive=positive, negative=negative)


def _pair_name(pair: str) -> str:
    """A pair weight without its sign in the paper's notation: ``P_sig-ms`` -> ``$P_{sig-ms}$``."""
    return paper_notation(f"{pair}+").replace("^{+}", "")


def file_slug(name: str) -> str:
    """A file-name-safe form of a weight name: ``T_nca*P_sig-`` -> ``T_nca_x_P_sig_neg``."""
    out = str(name).replace("\u2212", "-")
    if out.endswith("+"):
        out = out[:-1] + "_pos"
    elif out.endswith("-"):
        out = out[:-1] + "_neg"
    return out.replace("*", "_x_").replace(",", "_")


__all__ = [
    "ACTIVE_THRESHOLD", "DiagramResult", "PairCurves", "active_share", "density_grid", "file_slug",
    "plot_pair_weights", "plot_triplet_diagram",
]
