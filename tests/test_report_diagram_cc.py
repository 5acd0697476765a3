"""The triplet diagram split into data (cocos.pipelines.triplets) and drawing (cocos.report.diagram)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import cocos.report as report_pkg
from cocos.pipelines import triplets as P
from cocos.report import diagram as D
from cocos_cli.diagram import _point_summary


def test_the_report_layer_imports_no_weight_maths():
    """No module of cocos/report imports cocos.losses (format_value aside) nor, at import time, a pipeline."""
    allowed = {("cocos/report/paper_tables.py", "cocos.losses.spec")}
    for path in sorted(Path(report_pkg.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, ast.ImportFrom | ast.Import)]
        modules = [n.module for n in top if isinstance(n, ast.ImportFrom)] + [a.name for n in top
                                                                              if isinstance(n, ast.Import)
                                                                              for a in n.names]
        rel = f"cocos/report/{path.name}"
        for m in modules:
            assert not m.startswith("cocos.pipelines"), (rel, m)
            assert not m.startswith("cocos.losses") or (rel, m) in allowed, (rel, m)


def test_the_report_draws_data_it_is_given(tmp_path):
    """A hand-made panel (no GOAL weight: a ramp) is drawn as given; the result reports the data, not a recomputation."""
    grid = np.linspace(0.0, 1.0, 5)
    ramp = np.add.outer(grid, grid) / 2  # values[i, j] = (sn_i + sp_j) / 2
    panel = D.WeightPanel(name="T_nca", triplet="T_nca", pair=None, sign=None, values=ramp, params={"tau": 3.0},
                          boundary=None, active={"i2t": 0.25})
    pts = {"i2t": (np.array([0.2, 0.4, 0.6]), np.array([0.1, 0.3, 0.5]))}
    diagram = D.TripletDiagram(grid=grid, extent=(0.0, 1.0), panels=[panel], points=pts, n_points={"i2t": 3},
                               outside={"i2t": 0.0})
    res = D.draw_triplet_diagram(diagram, path_stem=tmp_path / "d")
    assert res.values["T_nca"] is ramp and res.active == {"T_nca": {"i2t": 0.25}}
    assert res.n_points == {"i2t": 3} and res.sp is grid and res.sn is not grid
    assert [p.name for p in res.paths] == ["d.png", "d.pdf"] and all(p.stat().st_size > 0 for p in res.paths)


def test_computing_then_drawing_equals_the_one_call(tmp_path):
    pts = {"i2t": ([0.9, 0.5, 0.5, 0.3, 0.7], [0.1, 0.6, 0.25, 0.2, 0.4]), "t2i": ([0.7, 0.2], [0.1, 0.2])}
    names = ["T_con", "T_nca*P_sig-"]
    one = P.plot_triplet_diagram(names, params={"tau": 4.0}, points=pts, path_stem=tmp_path / "a", resolution=21)
    data = P.triplet_diagram(names, params={"tau": 4.0}, points=pts, resolution=21)
    two = D.draw_triplet_diagram(data, path_stem=tmp_path / "b")
    for pa, pb in zip(one.paths, two.paths, strict=True):
        assert pa.read_bytes() == pb.read_bytes()
    # the data by hand: T_con's boundary is its default margin 0.2; the T*P panel has no boundary line
    assert [p.boundary for p in data.panels] == [0.2, None]
    assert (data.panels[1].triplet, data.panels[1].pair, data.panels[1].sign) == ("T_nca", "P_sig", "-")
    # T_con active (margin 0.2 violated): (0.5, 0.6), (0.3, 0.2), (0.7, 0.4)? 0.4 - 0.7 + 0.2 = -0.1 no -> 2 of 5
    assert data.panels[0].active == {"i2t": 0.4, "t2i": 0.5}


def test_pair_curves_then_drawing(tmp_path):
    curves = P.pair_curves("P_lin", resolution=5)
    np.testing.assert_allclose(curves.positive["P_lin"], [1.0, 0.75, 0.5, 0.25, 0.0])
    assert curves.paths == []
    drawn = D.draw_pair_weights(curves, path_stem=tmp_path / "p")
    assert drawn is curves and [p.name for p in curves.paths] == ["p.png", "p.pdf"]


def test_notation_of_parsed_weights():
    assert D.notation("T_cir", "P_sig-ms", "-") == r"$T_{\mathrm{cir}} \cdot P^{-}_{\mathrm{sig}\text{-}\mathrm{ms}}$"
    assert D.pair_notation("P_lin-ms") == r"$P_{\mathrm{lin}\text{-}\mathrm{ms}}$"


def test_default_stem_and_pair():
    assert P.diagram_stem(["T_nca", "T_con"], False) == Path("reports/diagram_T_nca_T_con")
    paired = ["T_con*P_sig-ms+", "T_con*P_sig-ms-", "T_nca*P_sig-ms+", "T_nca*P_sig-ms-"]
    assert P.pair_of(paired) == "P_sig-ms"
    assert P.diagram_stem(paired, True) == Path("reports/diagram_T_con_T_nca_x_P_sig-ms")


def test_point_summary_one_line_per_triplet_weight_from_its_first_panel():
    names = ["T_con*P_sig+", "T_nca", "T_con*P_sig-"]
    result = SimpleNamespace(active={"T_con*P_sig+": {"i2t": 0.5, "t2i": None}, "T_nca": {"i2t": 0.125, "t2i": 1.0},
                                     "T_con*P_sig-": {"i2t": 0.9, "t2i": 0.9}},
                             outside={"i2t": 0.0, "t2i": 0.25})
    points = {"i2t": (np.zeros(4), np.zeros(4)), "t2i": (np.zeros(2), np.zeros(2))}
    assert _point_summary(names, points, result, "batches of 2, seed 0") == [
        "6 triplets (i2t 4, t2i 2) from batches of 2, seed 0",
        "T_con: share of triplets in the active region (T > 0.5): i2t 50.0%",
        "T_nca: share of triplets in the active region (T > 0.5): i2t 12.5%, t2i 100.0%",
        "note: 25.0% of t2i triplets lie outside the drawn square",
    ]


def test_i2t_and_t2i_triplets_are_told_apart_by_colour_and_line_style(tmp_path, monkeypatch):
    """Issue 40: the two directions' density contours had one colour; i2t is now the loss's colour (solid), t2i
    near-black (dashed), in the panels and in the legend."""
    import matplotlib.colors as mcolors

    from cocos.report import style

    figures = []
    monkeypatch.setattr(style, "save", lambda fig, stem: figures.append(fig) or [])
    g = np.random.default_rng(0)
    pts = {d: (0.6 + 0.05 * g.normal(size=200), 0.4 + 0.05 * g.normal(size=200)) for d in ("i2t", "t2i")}
    D.draw_triplet_diagram(P.triplet_diagram("T_con", points=pts, resolution=11), path_stem=tmp_path / "d",
                           color="#ff7f0e")
    (ax,) = [a for a in figures[0].axes if a.get_title()]
    drawn = {c.get_gid(): c for c in ax.collections if str(c.get_gid()).startswith("triplets")}
    i2t, t2i = drawn["triplets i2t"], drawn["triplets t2i"]
    colour = {k: mcolors.to_hex(c.get_edgecolor()[0]) for k, c in (("i2t", i2t), ("t2i", t2i))}
    assert colour == {"i2t": "#ff7f0e", "t2i": "#1a1a1a"}
    assert i2t.get_linestyle() != t2i.get_linestyle()
    legend = {t.get_text().split()[0]: h for t, h in zip(figures[0].legends[0].get_texts(),
                                                          figures[0].legends[0].legend_handles, strict=True)}
    assert {k: mcolors.to_hex(legend[k].get_color()) for k in ("i2t", "t2i")} == colour
    assert legend["i2t"].get_linestyle() == "-" and legend["t2i"].get_linestyle() == "--"
    assert D.direction_colours("#101030")["t2i"] == "white"  # beside a dark loss colour
