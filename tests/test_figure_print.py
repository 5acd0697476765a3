"""Every figure kind is drawn at its print size (the 12.2 cm LNCS column) with 7-9 pt text, none of it cut off."""

from __future__ import annotations

import json
import re
import zlib

import numpy as np
import pandas as pd
import pytest

from cocos.pipelines.count import count_file
from cocos.pipelines.folder import write_results_folder
from cocos.pipelines.triplets import plot_pair_weights, plot_triplet_diagram
from cocos.report import style
from cocos.report import training as T
from cocos.report.figures import plot_cocos_vs_rsum
from cocos.report.merge import build_report, write_report
from cocos.results import builtin_presentations
from tests.test_llncs import FAMILIES, _analyzed

PRINT_PT = 12.2 / 2.54 * 72


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure kind cocos draws: {file stem: (Figure, PDF bytes)}.

    The PNGs, which no test here reads, are laid out at their resolution as :func:`cocos.report.style.save` has
    them (the PDF keeps the PNG's layout) but not rasterised: an empty file."""
    from matplotlib.figure import Figure

    root = tmp_path_factory.mktemp("figures")
    figures = {}
    real_save, real_savefig = style.save, Figure.savefig

    def capture(fig, stem):
        paths = real_save(fig, stem)
        figures[str(stem)] = (fig, paths[1].read_bytes())
        return paths

    def savefig(fig, fname, *args, format=None, dpi=None, **kwargs):
        if format != "png":
            return real_savefig(fig, fname, *args, format=format, dpi=dpi, **kwargs)
        shown = fig.dpi
        fig.dpi = dpi  # as savefig draws it
        try:
            fig.draw_without_rendering()  # the constrained layout, as drawing runs it
        finally:
            fig.dpi = shown
        fname.write(b"")

    mp = pytest.MonkeyPatch()
    mp.setattr(style, "save", capture)
    mp.setattr(Figure, "savefig", savefig)
    try:
        g = np.random.default_rng(0)
        images = g.normal(size=(32, 8))
        np.savez(root / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(160, 8)))
        counted = count_file(root / "e.npz", FAMILIES, batch_size=8, name="toy", label="CLIP ViT-B/32")
        # counts, eps sweep, GOAL/IMC distributions, triplet diagram
        write_results_folder(counted.results, counted.run, root / "folder", embeddings=counted.embeddings)
        base = counted.results.to_dict()
        files = []
        for name, d in [*((loss, _analyzed(base, loss, 0)) for loss in FAMILIES),
                        ("ltd", _analyzed(base, "ntxent", 0, ltd=True)),
                        *((f"ep{e}", _analyzed(base, "triplet_sh", 0, epoch=e)) for e in (1, 2, 3))]:
            (root / name).mkdir()
            (root / name / "results.json").write_text(json.dumps(d))
            files.append(root / name / "results.json")
        write_report(build_report(files[:7]), root / "summary")  # cocos_vs_rsum
        write_report(build_report(files[7:], label="epoch"), root / "epochs")  # cocos_by_epoch
        steps = pd.DataFrame({"step": np.arange(100), "epoch": np.arange(100) // 50, "L_con": np.linspace(9, 1, 100),
                              "lambda": np.linspace(0, 1, 100), "L_rec/eta": np.linspace(2, 0.8, 100)})
        history = pd.DataFrame({"label": "VSE++ + LTD, NT-Xent", "epoch": [0, 1], "rsum": [250.0, 310.5]})
        T.plot_training(steps.assign(label="VSE++ + LTD, NT-Xent"), root / "training", history=history)
        # SmoothAP at a quarter of the others' steps per epoch: the figure's note says so
        track = pd.DataFrame([(s, s // 50 + 1, loss, d, stat, 10.0 / (1 + s)) for loss in ("triplet", "ntxent", "smoothap")
                              for s in range(0, 100, 10) for d in ("i2t", "t2i") for stat in ("C_q", "C_B")],
                             columns=["step", "epoch", "loss", "direction", "stat", "value"])
        track.loc[track["loss"] == "smoothap", "step"] //= 4
        T.plot_track(track, root / "track", looks=builtin_presentations())
        coincident = pd.DataFrame([{"label": m, "model": m, "loss": "triplet_sh", "direction": d, "stat": "C_q",
                                    "rsum": r, "cocos": 1.0} for m, r in (("VSE++", 453.3), ("VSE∞", 408.4))
                                   for d in ("i2t", "t2i")])
        plot_cocos_vs_rsum(coincident, root / "coincident", looks=builtin_presentations())
        plot_triplet_diagram(["T_cir*P_sig-ms+", "T_cir*P_sig-ms-"], params={"tau": 10.0},
                             points={"i2t": (g.uniform(0, 1, 99), g.uniform(0, 1, 99))}, path_stem=root / "goal")
        plot_pair_weights(path_stem=root / "pairs")
    finally:
        mp.undo()
    return figures


def test_every_kind_is_drawn(drawn):
    kinds = {s.rsplit("/", 1)[-1] for s in drawn}
    assert {"counts", "eps_sweep", "goal_distributions", "triplet_diagram", "cocos_vs_rsum", "cocos_by_epoch",
            "training", "track", "goal", "pairs", "coincident"} <= kinds


def test_pdfs_are_print_width_with_7_to_9_pt_text(drawn):
    for stem, (_, raw) in drawn.items():
        box = [float(x) for x in re.search(rb"/MediaBox \[\s*([\d. ]+)\]", raw).group(1).split()]
        assert box[2] - box[0] == pytest.approx(PRINT_PT, abs=0.5), stem
        sizes = set()
        for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", raw, flags=re.S):
            try:
                text = zlib.decompress(stream)
            except zlib.error:
                continue
            sizes |= {float(x) for x in re.findall(rb"/F\d+ ([\d.]+) Tf", text)}
        assert sizes, stem
        # 7-9 pt; mathtext sets sub- and superscripts (C^q's q) at 0.7 of their base (0.49 when nested, C^{qv^-})
        scripts = {round(base * f, 2) for base in (7.0, 8.0, 9.0) for f in (0.7, 0.49)}
        assert all(7 <= s <= 9 or round(s, 2) in scripts for s in sizes), (stem, sorted(sizes))
        assert max(sizes) >= 7


def test_no_text_is_cut_off_and_every_label_is_7_to_9_pt(drawn):
    from matplotlib.text import Text

    for stem, (fig, _) in drawn.items():
        fig.set_dpi(style.DPI)  # measured as saved
        fig.draw_without_rendering()  # every text placed (tick labels included) as drawing places it, no pixels
        renderer = fig.canvas.get_renderer()
        frame = fig.bbox
        assert not fig.get_suptitle(), stem  # titles go to captions
        ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for tick in axis.get_major_ticks()
                 + axis.get_minor_ticks() for t in (tick.label1, tick.label2)}
        drawn_ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for tick in axis._update_ticks()
                       for t in (tick.label1, tick.label2)}
        hidden_axes = {id(t) for ax in fig.axes if not ax.get_visible() for t in ax.findobj(Text)}
        for t in fig.findobj(Text):
            hidden = id(t) in hidden_axes
            if hidden or not t.get_visible() or not t.get_text().strip() or (id(t) in ticks and id(t) not in drawn_ticks):
                continue
            assert 7 <= t.get_fontsize() <= 9, (stem, t.get_text(), t.get_fontsize())
            box = t.get_window_extent(renderer)
            slack = 2 * style.DPI / 72  # 2 pt: a text box's own padding
            assert box.x0 >= frame.x0 - slack and box.x1 <= frame.x1 + slack, (stem, t.get_text())
            assert box.y0 >= frame.y0 - slack and box.y1 <= frame.y1 + slack, (stem, t.get_text())


def test_label_epoch_plots_every_counter_and_rsum_against_epoch(tmp_path):
    from cocos.report.merge import epoch_rows

    g = np.random.default_rng(3)
    images = g.normal(size=(24, 6))
    np.savez(tmp_path / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(120, 6)))
    base = count_file(tmp_path / "e.npz", FAMILIES[:4], batch_size=8).results.to_dict()
    files, rsums = [], []
    for e in (1, 2, 4):
        d = _analyzed(base, "triplet_sh", 0, epoch=e)
        rsums.append(d["evaluation"]["metrics"]["rsum"])
        for r in d["statistics"]:  # a count that changes with the epoch (at the counter's own threshold)
            if (r["loss"], r["direction"], r["stat"], r["eps"]) == ("ntxent", "i2t", "C_qv-", 0.01):
                r["mean"] = 10.0 + e
        (tmp_path / f"ep{e}").mkdir()
        (tmp_path / f"ep{e}" / "results.json").write_text(json.dumps(d))
        files.append(tmp_path / f"ep{e}" / "results.json")
    report = build_report(files, label="epoch")
    rows = epoch_rows(report.groups)
    out = T.plot_by_epoch(rows, tmp_path / "by_epoch", looks=report.looks)
    assert out.data["panels"] == ["triplet", "triplet_sh", "ntxent", "smoothap", "rsum"]  # all counters, not only SH
    x, y = out.data["lines"][("VSE++, Triplet loss SH", "ntxent", "i2t")]
    assert list(x) == [1, 2, 4] and list(y) == [11.0, 12.0, 14.0]
    _, rsum = out.data["lines"][("VSE++, Triplet loss SH", "rsum", "both")]
    assert list(rsum) == rsums and rsums[2] - rsums[0] == 3  # the test rsum of each epoch's results
