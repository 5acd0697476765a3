"""The triplet diagrams' data: where a model's triplets lie and the GOAL weights over the similarity square.

:func:`triplet_points`: the (positive, hardest negative) similarity of every query, from the same seeded pair
batches as the counting engine (:func:`cocos.data.samplers.pair_batches`). :func:`triplet_diagram` and
:func:`pair_curves`: the weights evaluated over the square (GOAL Figures 2 and 3) and the share of the triplets
in each triplet weight's active region. The report layer only draws that data
(:func:`cocos.report.diagram.draw_triplet_diagram`, :func:`cocos.report.diagram.draw_pair_weights`);
:func:`plot_triplet_diagram` and :func:`plot_pair_weights` compute and draw in one call.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from cocos.data.layout import DIRECTIONS, BatchLayout
from cocos.data.samplers import pair_batches
from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import CocosError
from cocos.losses.goal import PAIR_WEIGHTS, hardest_triplets, parse_weight, triplet_part, weight_grid, weight_params
from cocos.report.diagram import (
    ACTIVE_THRESHOLD,
    DEFAULT_EXTENT,
    DIRECTION_STYLE,
    FULL_EXTENT,
    DiagramResult,
    PairCurves,
    TripletDiagram,
    WeightPanel,
    draw_pair_weights,
    draw_triplet_diagram,
    file_slug,
    notation,
)


def triplet_points(emb, batch_size: int = 128, seed: int = 0, max_batches: int | None = None,
                   compat: bool = False, chunk: int = 32) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{direction: (sp, sn)}``: positive and hardest-negative similarity of every query.

    ``emb`` is an :class:`~cocos.counting.engine.EmbeddingSet` (normalised). Batches
    are the counting engine's seeded pair batches (``pair_batches(caption_image,
    batch_size, seed)``, last short batch dropped), the first ``max_batches`` of
    them; the image ids of a batch exclude same-image pairs unless ``compat``.
    Arrays are float64, batch-major then query order.
    """
    if max_batches is not None and max_batches < 1:
        raise CocosError(f"max_batches must be positive, got {max_batches}")
    batches = pair_batches(emb.caption_image, batch_size, seed)
    if max_batches is not None:
        batches = batches[:max_batches]
    cap_idx = np.stack([c for c, _ in batches])
    img_idx = np.stack([i for _, i in batches])
    device = emb.images.device
    out: dict[str, tuple[list, list]] = {d: ([], []) for d in DIRECTIONS}
    for start in range(0, len(cap_idx), chunk):
        c = torch.as_tensor(cap_idx[start : start + chunk], device=device)
        i = torch.as_tensor(img_idx[start : start + chunk], device=device)
        scores = emb.images[i] @ emb.captions[c].transpose(-1, -2)  # (nb, B, B)
        layout = BatchLayout.build(batch_size, batch_size, torch.arange(batch_size, device=device),
                                   image_ids=i)
        for d in DIRECTIONS:
            sp, sn, _ = hardest_triplets(layout.view(scores, d, compat))
            sp = sp.detach().to("cpu", torch.float64).numpy().reshape(-1)
            sn = sn.detach().to("cpu", torch.float64).numpy().reshape(-1)
            keep = ~(np.isnan(sp) | np.isnan(sn))
            out[d][0].append(sp[keep])
            out[d][1].append(sn[keep])
    return {d: (np.concatenate(sps), np.concatenate(sns)) for d, (sps, sns) in out.items()}


# -- the diagrams' data ------------------------------------------------------------------------


def as_point_dict(points) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Triplets as ``{key: (sp, sn)}`` of flat float64 arrays: from such a dict, one ``(sp, sn)`` pair (key
    ``"points"``) or ``None`` (no points)."""
    if points is None:
        return {}
    items = points.items() if isinstance(points, dict) else [("points", points)]
    out = {}
    for key, (sp, sn) in items:
        sp, sn = np.asarray(sp, dtype=np.float64).reshape(-1), np.asarray(sn, dtype=np.float64).reshape(-1)
        if sp.shape != sn.shape:
            raise CocosError(f"points '{key}': {sp.size} positive but {sn.size} negative similarities")
        out[str(key)] = (sp, sn)
    return out


def choose_extent(extent, pts: dict) -> tuple[float, float]:
    """The square a diagram draws: ``extent`` (checked: two finite numbers lo < hi) or, for ``None``,
    :data:`~cocos.report.diagram.DEFAULT_EXTENT` when every point lies in it, else the full ``[−1, 1]``."""
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


def common_extent(point_sets) -> tuple[float, float]:
    """One square for the diagrams of several models: ``[0, 1]`` if every triplet of all of them lies there."""
    merged: dict = {}
    for i, pts in enumerate(point_sets):
        for key, value in as_point_dict(pts).items():
            merged[f"{i}/{key}"] = value
    return choose_extent(None, merged)


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


def paper_notation(name: str) -> str:
    """A weight in the GOAL paper's notation, as matplotlib math (``T_cir*P_sig-ms+`` -> T_cir · P+_sig-ms)."""
    spec = parse_weight(name)
    return notation(spec.triplet, spec.pair, spec.sign)


def _boundary(spec, params: dict) -> float | None:
    """The margin of ``T_con`` drawn alone (its exact boundary is a line), else ``None``."""
    if spec.triplet == "T_con" and spec.pair is None:
        return float(weight_params("T_con", **params).get("margin", DEFAULT_MARGIN))
    return None


def _panel(name: str, g: torch.Tensor, pts: dict, params: dict) -> WeightPanel:
    """Weight ``name`` over the square ``g × g`` (rows ``Sn``) and its active share of each set of triplets."""
    spec = parse_weight(name)
    return WeightPanel(name=spec.name, triplet=spec.triplet, pair=spec.pair, sign=spec.sign,
                       values=weight_grid(spec.name, g[None, :], g[:, None], **params).numpy().copy(),
                       params=weight_params(spec.name, **params), boundary=_boundary(spec, params),
                       active={key: active_share(spec.name, sp, sn, **params) for key, (sp, sn) in pts.items()})


def _outside(sp: np.ndarray, sn: np.ndarray, lo: float, hi: float) -> float:
    """Share of the triplets outside the square ``[lo, hi]²`` (0 for none)."""
    inside = (sp >= lo) & (sp <= hi) & (sn >= lo) & (sn <= hi)
    return float(1 - inside.mean()) if sp.size else 0.0


def triplet_diagram(weight: str | Sequence[str], *, params: dict | None = None, points=None,
                    extent: tuple[float, float] | None = None, resolution: int = 301) -> TripletDiagram:
    """The data of a triplet diagram: weight(s) over ``resolution²`` points of the square, with the triplets.

    ``weight``: a name (``"T_nca"``, ``"T_cir*P_sig-"``, ...) or a list of names (one panel each, as the
    paper's Figure 2). ``params``: ``margin``, ``tau``, ``offset``, ``alpha``, ... (each weight takes what it
    uses; ``None`` values are left out). ``points``: ``{direction: (sp, sn)}`` (:func:`triplet_points`) or one
    ``(sp, sn)`` pair. ``extent``: the square's side (``None``: :func:`choose_extent`).
    """
    names = [weight] if isinstance(weight, str) else list(weight)
    if not names:
        raise CocosError("no weight to draw")
    names = [parse_weight(n).name for n in names]
    params = {k: v for k, v in (params or {}).items() if v is not None}
    if resolution < 2:
        raise CocosError(f"resolution must be at least 2, got {resolution}")
    pts = as_point_dict(points)
    lo, hi = choose_extent(extent, pts)
    grid = np.linspace(lo, hi, resolution)
    g = torch.from_numpy(grid)
    return TripletDiagram(grid=grid, extent=(lo, hi), panels=[_panel(n, g, pts, params) for n in names],
                          points=pts, n_points={key: int(sp.size) for key, (sp, _) in pts.items()},
                          outside={key: _outside(sp, sn, lo, hi) for key, (sp, sn) in pts.items()})


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

    :func:`triplet_diagram` (the data: ``weight``, ``params``, ``points``, ``extent``, ``resolution``) drawn by
    :func:`cocos.report.diagram.draw_triplet_diagram`: the triplets as density contours in ``color`` (the model's
    loss colour; i2t solid, t2i dashed), named ``points_label`` in the legend ("training triplets" for a model's
    own training data). Panels of a triplet weight ``T`` show the share of triplets where it is active. Writes
    ``path_stem.png`` and ``path_stem.pdf`` (``title`` is their metadata title).
    """
    diagram = triplet_diagram(weight, params=params, points=points, extent=extent, resolution=resolution)
    return draw_triplet_diagram(diagram, path_stem=path_stem, title=title, color=color, points_label=points_label)


def pair_curves(names: str | Sequence[str] = tuple(PAIR_WEIGHTS), *, params: dict | None = None,
                extent: tuple[float, float] = DEFAULT_EXTENT, resolution: int = 401) -> PairCurves:
    """Pair weights (paper Figure 3) at ``resolution`` points of ``extent``: ``P+`` and ``P−`` of each name.

    The multi-similarity forms use fixed relative terms ``m_pos``/``m_neg`` (default 0.1 as in Figure 3).
    """
    names = [names] if isinstance(names, str) else list(names)
    canon = []
    for n in names:
        spec = parse_weight(f"{n.rstrip('+-')}+")
        if spec.triplet is not None:
            raise CocosError(f"'{n}' is not a pair weight (choose from {', '.join(PAIR_WEIGHTS)})")
        canon.append(spec.pair)
    params = {k: v for k, v in (params or {}).items() if v is not None}
    lo, hi = choose_extent(extent, {})
    s = np.linspace(lo, hi, resolution)
    st = torch.from_numpy(s)
    positive = {n: weight_grid(f"{n}+", st, st, **params).numpy().copy() for n in canon}
    negative = {n: weight_grid(f"{n}-", st, st, **params).numpy().copy() for n in canon}
    return PairCurves(paths=[], s=s, positive=positive, negative=negative)


def plot_pair_weights(
    names: str | Sequence[str] = tuple(PAIR_WEIGHTS),
    *,
    params: dict | None = None,
    path_stem: str | os.PathLike,
    extent: tuple[float, float] = DEFAULT_EXTENT,
    resolution: int = 401,
) -> PairCurves:
    """Curves of pair weights (paper Figure 3): :func:`pair_curves` drawn by
    :func:`cocos.report.diagram.draw_pair_weights`, ``P+`` over ``Sp`` (left), ``P−`` over ``Sn`` (right)."""
    curves = pair_curves(names, params=params, extent=extent, resolution=resolution)
    return draw_pair_weights(curves, path_stem=path_stem)


def checkpoint_triplet_points(checkpoint, data=None, *, device: str = "auto", progress: bool = False,
                              batch_size: int = 128, seed: int = 0, max_batches: int | None = None,
                              compat: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`triplet_points` of a checkpoint's training split (``data``: its data folder, default the recorded
    one), encoded on ``device``."""
    from cocos.embed import encode_checkpoint

    encoded = encode_checkpoint(checkpoint, data, "train", device=device, progress=progress)
    emb = getattr(encoded, "embeddings", encoded)
    return triplet_points(emb, batch_size=batch_size, seed=seed, max_batches=max_batches, compat=compat)


def pair_of(names: Sequence[str]) -> str:
    """The pair weight (without its sign) of panels ``T*P+``/``T*P-``: ``T_con*P_sig-ms+`` -> ``P_sig-ms``."""
    return names[0].split("*")[1][:-1]


def diagram_stem(names: Sequence[str], paired: bool) -> Path:
    """The default path stem of a diagram: ``reports/diagram_<weights>`` (with a pair weight, each triplet weight
    once and ``_x_<pair>``)."""
    triplets = dict.fromkeys(n.split("*")[0] if paired else n for n in names)
    stem = "_".join(file_slug(n) for n in triplets)
    if paired:
        stem += f"_x_{file_slug(pair_of(names))}"
    return Path("reports") / f"diagram_{stem}"
