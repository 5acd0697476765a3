"""Figures: PNG and PDF written atomically, deterministic, and plotting exactly the input data."""

from __future__ import annotations

import numpy as np
import pytest

from cocos.report.figures import plot_cocos_vs_rsum, plot_count_distributions, plot_eps_sweep
from cocos.results import builtin_presentations

LOOKS = builtin_presentations()

PNG = b"\x89PNG\r\n\x1a\n"


def check_files(paths, folder):
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    png, pdf = (p.read_bytes() for p in paths)
    assert png[:8] == PNG and len(png) > 1000
    assert pdf[:5] == b"%PDF-" and len(pdf) > 1000
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in paths)  # no temp files left


def per_query_fixture():
    g = np.random.default_rng(0)
    return {
        "triplet": {"i2t": {"C_q": g.integers(0, 12, 300).astype(float)},
                    "t2i": {"C_q": g.integers(0, 9, 280).astype(float)}},
        "ntxent": {"i2t": {"C_qv-": g.integers(0, 20, 300).astype(float), "W_qv-": g.random(300)},
                   "t2i": {"C_qv-": np.array([1.0, 2.0, 2.0, np.nan, 3.0])}},
        "smoothap": {"i2t": {"C_q": g.random(64) * 3}},
    }


def as_queries(per_query):
    """The per-query table (a row per query, a column per statistic) holding ``per_query[loss][direction][stat]``."""
    import pandas as pd

    return pd.concat([pd.DataFrame(stats).assign(loss=loss, direction=d) for loss, by_d in per_query.items()
                      for d, stats in by_d.items()], ignore_index=True)


def test_count_distributions_plot_the_input(tmp_path):
    pq = per_query_fixture()
    out = plot_count_distributions(as_queries(pq), tmp_path / "counts", looks=LOOKS)
    check_files(out.paths, tmp_path)
    assert set(out.data) == {("triplet", "i2t"), ("triplet", "t2i"), ("ntxent", "i2t"), ("ntxent", "t2i"),
                             ("smoothap", "i2t")}
    for (loss, d), got in out.data.items():
        stat = "C_qv-" if loss == "ntxent" else "C_q"
        assert got["stat"] == stat
        values = pq[loss][d][stat]
        values = values[np.isfinite(values)]
        expected, _ = np.histogram(values, bins=got["edges"])
        np.testing.assert_array_equal(got["heights"], expected)
        assert got["heights"].sum() == values.size
        assert got["mean"] == pytest.approx(values.mean())
    # integer counts get one bar per integer
    assert np.allclose(np.diff(out.data[("triplet", "i2t")]["edges"]), 1.0)
    tri = pq["triplet"]["i2t"]["C_q"]
    assert out.data[("triplet", "i2t")]["mean_with_gradient"] == pytest.approx(tri[tri > 0].mean())
    assert out.data[("ntxent", "t2i")]["mean"] == pytest.approx(2.0)  # NaN left out


def test_figures_are_deterministic(tmp_path):
    pq = per_query_fixture()
    a = plot_count_distributions(as_queries(pq), tmp_path / "a" / "counts").paths
    b = plot_count_distributions(as_queries(pq), tmp_path / "b" / "counts").paths
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes(), x.suffix


def sweep_fixture():
    """Rows of a statistics table's sweep view (one mode): loss, direction, eps, stat, mean (NaN: undefined)."""
    import pandas as pd

    rows = [("ntxent", "i2t", 0.001, "C_qv-", 40.0), ("ntxent", "i2t", 0.001, "W_qv-", 0.9),
            ("ntxent", "i2t", 0.01, "C_qv-", 9.88), ("ntxent", "i2t", 0.1, "C_qv-", 1.5),
            ("ntxent", "i2t", 0.005, "C_qv-", 15.0), ("ntxent", "t2i", 0.01, "C_qv-", 9.65),
            ("ntxent", "t2i", 0.1, "C_qv-", np.nan), ("smoothap", "i2t", 0.01, "C_q", 1.27),
            ("smoothap", "i2t", 0.001, "C_q", 3.0)]
    return pd.DataFrame(rows, columns=["loss", "direction", "eps", "stat", "mean"])


def test_eps_sweep_lines_equal_the_input(tmp_path):
    out = plot_eps_sweep(sweep_fixture(), tmp_path / "sweep", looks=LOOKS)
    check_files(out.paths, tmp_path)
    x, y = out.data[("ntxent", "i2t")]
    np.testing.assert_allclose(x, [0.001, 0.005, 0.01, 0.1])
    np.testing.assert_allclose(y, [40.0, 15.0, 9.88, 1.5])
    x, y = out.data[("ntxent", "t2i")]  # a null mean is left out
    np.testing.assert_allclose(x, [0.01])
    np.testing.assert_allclose(y, [9.65])
    x, y = out.data[("smoothap", "i2t")]
    np.testing.assert_allclose(x, [0.001, 0.01])
    np.testing.assert_allclose(y, [3.0, 1.27])
    assert out.data["default_eps"] == 0.01
    assert ("smoothap", "t2i") not in out.data


def _rsum_rows(rows):
    import pandas as pd

    return pd.DataFrame([{"label": a, "loss": b, "direction": "i2t", "stat": "C_q", "rsum": c, "cocos": d}
                         for a, b, c, d in rows], columns=["label", "loss", "direction", "stat", "rsum", "cocos"])


def test_cocos_vs_rsum_points_equal_the_input(tmp_path):
    rows = _rsum_rows([("F30k VSE++ Triplet", "triplet", 309.4, 6.79), ("F30k VSE++ Triplet SH", "triplet_sh", 353.8, 1.0),
                       ("F30k VSE++ NT-Xent", "ntxent", 337.1, 9.88)])
    out = plot_cocos_vs_rsum(rows, tmp_path / "cocos_vs_rsum")
    check_files(out.paths, tmp_path)
    np.testing.assert_allclose(out.data["points"], [[6.79, 309.4], [1.0, 353.8], [9.88, 337.1]])
    assert out.data["labels"] == [f"{x} (i2t)" for x in rows.label]
    assert out.data["panels"] == ["C_q"]
    empty = plot_cocos_vs_rsum(_rsum_rows([]), tmp_path / "empty" / "x")
    assert empty.data["points"].shape == (0, 2)
    assert empty.paths[0].read_bytes()[:8] == PNG


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def boom(self, *args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError):
        plot_cocos_vs_rsum(_rsum_rows([("a", "triplet", 1.0, 2.0)]), tmp_path / "fig")
    assert list(tmp_path.iterdir()) == []


def test_cocos_vs_rsum_tells_an_ltd_model_from_a_plain_one_and_counts_from_zero(tmp_path):
    rows = _rsum_rows([("F30k VSE++ NT-Xent", "ntxent", 337.1, 27.2), ("F30k VSE++ + LTD NT-Xent", "ntxent", 338.0, 27.6)])
    rows["model"] = ["VSE++", "VSE++ + LTD"]
    out = plot_cocos_vs_rsum(rows, tmp_path / "fig", looks=LOOKS)
    assert out.data["legend"] == ["VSE++, NT-Xent", "VSE++ + LTD, NT-Xent"]
    from cocos.report import style

    captured = {}
    real = style.save
    style.save = lambda fig, stem: captured.setdefault("fig", fig) and real(fig, stem)
    try:
        plot_cocos_vs_rsum(rows, tmp_path / "again", looks=LOOKS)
    finally:
        style.save = real
    lo, hi = captured["fig"].axes[0].get_xlim()
    assert lo == 0 and hi > 27.6  # not auto-zoomed to 27.2-27.6


def test_cocos_vs_rsum_shows_every_panels_points_on_the_shared_rsum_axis(tmp_path, monkeypatch):
    """The best model in the second panel (NT-Xent above the triplet losses) is not cut off by the first panel's
    limits (the chance band used to fix the shared axis on the first panel before the second was drawn)."""
    import pandas as pd

    from cocos.report import style
    from cocos.report.figures import plot_cocos_vs_rsum

    monkeypatch.setattr(style, "save", lambda fig, stem: [])
    rows = pd.DataFrame([
        {"label": "sh", "model": "m", "loss": "triplet_sh", "direction": "i2t", "stat": "C_q", "rsum": 351.5,
         "cocos": 1.0, "chance": 16.0, "chance_sd": 4.0},
        {"label": "tr", "model": "m", "loss": "triplet", "direction": "i2t", "stat": "C_q", "rsum": 342.3,
         "cocos": 22.3, "chance": 16.0, "chance_sd": 4.0},
        {"label": "nt", "model": "m", "loss": "ntxent", "direction": "i2t", "stat": "C_qv-", "rsum": 385.6,
         "cocos": 16.1, "chance": 16.0, "chance_sd": 4.0}])
    out = plot_cocos_vs_rsum(rows, tmp_path / "f")
    low, high = out.data["ylim"]
    assert all(low <= y <= high for _, y in out.data["points"]), (out.data["ylim"], out.data["points"])
    assert low <= 16.0 and high >= 16.0 + 3 * 4.0  # chance and its band are shown too


def test_cocos_vs_rsum_sets_coincident_markers_side_by_side(tmp_path, monkeypatch):
    """Issue 40: VSE++ and VSE∞ with Triplet SH both count C^q = 1 in both directions: i2t and t2i of each model
    were one marker. Markers at one point are set side by side on the page (their data unchanged), their count
    written above them, and the legend says so; a point of its own is not moved."""
    import pandas as pd

    from cocos.report import style

    figures = []
    monkeypatch.setattr(style, "save", lambda fig, stem: figures.append(fig) or [])
    rows = pd.DataFrame([{"label": m, "model": m, "loss": "triplet_sh", "direction": d, "stat": "C_q", "rsum": r,
                          "cocos": c} for m, r, c in (("VSE++", 453.3, 1.0), ("VSE∞", 408.4, 1.0), ("X", 420.0, 6.0))
                         for d in ("i2t", "t2i")])
    rows.loc[5, "cocos"] = 7.0  # X's t2i: a point of its own
    out = plot_cocos_vs_rsum(rows, tmp_path / "f", looks=LOOKS)
    np.testing.assert_allclose(out.data["points"], rows[["cocos", "rsum"]].to_numpy())  # the data as given
    assert out.data["coincident"] == [["VSE++ (i2t)", "VSE++ (t2i)"], ["VSE∞ (i2t)", "VSE∞ (t2i)"]]
    assert out.data["offsets"][:4] == [-3.5, 3.5, -3.5, 3.5] and out.data["offsets"][4:] == [0.0, 0.0]
    (ax,) = figures[0].axes
    fig = figures[0]
    fig.set_dpi(style.DPI)
    fig.draw_without_rendering()
    markers = [ln for ln in ax.get_lines() if ln.get_marker() not in (None, "None", "")][:len(rows)]
    page = [ln.get_transform().transform(np.column_stack(ln.get_data()))[0] for ln in markers]
    gap_pt = (page[1][0] - page[0][0]) * 72 / style.DPI
    assert gap_pt >= 5.0 and page[1][1] == pytest.approx(page[0][1])  # apart by more than a marker, level
    notes = [t.get_text() for t in ax.texts if t.get_gid() == "coincident"]
    assert notes == ["1.00", "1.00"]
    assert any("side by side" in t.get_text() for t in fig.legends[0].get_texts())
    alone = plot_cocos_vs_rsum(rows.iloc[4:], tmp_path / "g", looks=LOOKS)
    assert alone.data["coincident"] == [] and set(alone.data["offsets"]) == {0.0}
    assert not any("side by side" in t.get_text() for t in figures[-1].legends[0].get_texts())
