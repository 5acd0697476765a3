"""Triplet-weight diagrams: the points, the heat-map data, the files, and ``cocos diagram``."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting.engine import EmbeddingSet
from cocos.data.samplers import pair_batches
from cocos.errors import CocosError
from cocos.pipelines.triplets import active_share, plot_pair_weights, plot_triplet_diagram, triplet_points
from cocos.report.diagram import density_grid, file_slug
from cocos_cli.main import app

runner = CliRunner()


def _emb(n=12, k=2, d=4, seed=0):
    g = np.random.default_rng(seed)
    images = g.normal(size=(n, d))
    captions = np.repeat(images, k, 0) + 0.8 * g.normal(size=(n * k, d))
    return EmbeddingSet.from_arrays(images, captions)


def _loop_points(emb, batch_size, seed, compat):
    """Per batch, per query: the positive and the hardest negative, written out with plain loops."""
    img = emb.images.numpy().astype(np.float64)
    cap = emb.captions.numpy().astype(np.float64)
    out = {"i2t": ([], []), "t2i": ([], [])}
    for c_idx, i_idx in pair_batches(emb.caption_image, batch_size, seed):
        s = img[i_idx] @ cap[c_idx].T
        for q in range(batch_size):
            # i2t: image row q, positive caption q; t2i: caption q, positive image row q
            for d, row in (("i2t", s[q, :]), ("t2i", s[:, q])):
                negs = [row[j] for j in range(batch_size) if j != q and (compat or i_idx[j] != i_idx[q])]
                if negs:
                    out[d][0].append(row[q])
                    out[d][1].append(max(negs))
    return {d: (np.array(a), np.array(b)) for d, (a, b) in out.items()}


@pytest.mark.parametrize("compat", [False, True])
def test_triplet_points_equal_a_per_batch_loop(compat):
    emb = _emb()
    got = triplet_points(emb, batch_size=6, seed=3, compat=compat, chunk=2)
    want = _loop_points(emb, 6, 3, compat)
    for d in ("i2t", "t2i"):
        assert got[d][0].shape == want[d][0].shape
        np.testing.assert_allclose(got[d][0], want[d][0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(got[d][1], want[d][1], rtol=0, atol=1e-6)
    # 24 captions / 6 = 4 batches of 6 queries per direction; with k = 2 same-image pairs do occur
    n = sum(len(got[d][0]) for d in got)
    assert n == 48 if compat else n <= 48


def test_triplet_points_max_batches_takes_the_first_batches():
    emb = _emb()
    full = triplet_points(emb, batch_size=6, seed=1, compat=True)
    two = triplet_points(emb, batch_size=6, seed=1, compat=True, max_batches=2)
    assert len(two["i2t"][0]) == 12
    np.testing.assert_array_equal(two["t2i"][1], full["t2i"][1][:12])
    with pytest.raises(CocosError):
        triplet_points(emb, batch_size=6, max_batches=0)


def test_active_share_by_hand():
    # T_con, margin 0.2: (0.9, 0.1) no; (0.5, 0.6) yes; (0.5, 0.25) no (-0.05); (0.3, 0.2) yes (+0.1)
    sp, sn = [0.9, 0.5, 0.5, 0.3], [0.1, 0.6, 0.25, 0.2]
    assert active_share("T_con", sp, sn) == 0.5
    assert active_share("T_con*P_sig-", sp, sn) == 0.5  # the region of its T; P only scales
    assert active_share("T_con", sp, sn, margin=0.45) == 0.75
    # T_nca > 1/2 exactly when Sn > Sp
    assert active_share("T_nca", sp, sn) == 0.25
    assert active_share("P_sig-", sp, sn) is None


def test_heat_map_data_equals_the_formula_and_files_are_written(tmp_path):
    res = plot_triplet_diagram(["T_nca", "T_con", "T_cir*P_lin-"], params={"tau": 4.0, "margin": 0.3},
                               path_stem=tmp_path / "d", resolution=41)
    assert [p.name for p in res.paths] == ["d.png", "d.pdf"]
    assert res.paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and res.paths[1].read_bytes()[:5] == b"%PDF-"
    assert res.extent == (0.0, 1.0)
    sp, sn = np.meshgrid(res.sp, res.sn)  # values[i, j] at (sp[j], sn[i])
    np.testing.assert_allclose(res.values["T_nca"], 1 / (1 + np.exp(4 * (sp - sn))), rtol=1e-12)
    np.testing.assert_array_equal(res.values["T_con"], (0.3 + sn - sp > 0).astype(float))
    cir = 1 / (1 + np.exp(4 * (sp * (2 - sp) - sn**2))) * sn
    np.testing.assert_allclose(res.values["T_cir*P_lin-"], cir, rtol=1e-12)
    # orientation: bottom right (Sp = 1, Sn = 0) is an easy triplet, top left a hard one
    assert res.values["T_con"][0, -1] == 0.0 and res.values["T_con"][-1, 0] == 1.0
    assert not list(tmp_path.glob("*.tmp"))


def test_diagram_with_points_extent_and_determinism(tmp_path):
    pts = {"i2t": ([0.9, 0.5, 0.5, 0.3], [0.1, 0.6, 0.25, 0.2]), "t2i": ([0.7, -0.5], [0.1, 0.2])}
    a = plot_triplet_diagram("T_con", points=pts, path_stem=tmp_path / "a")
    assert a.extent == (-1.0, 1.0)  # a point below 0: the full square
    assert a.active["T_con"] == {"i2t": 0.5, "t2i": 0.5}
    assert a.n_points == {"i2t": 4, "t2i": 2} and a.outside == {"i2t": 0.0, "t2i": 0.0}
    b = plot_triplet_diagram("T_con", points=pts, path_stem=tmp_path / "b")
    for pa, pb in zip(a.paths, b.paths, strict=True):
        assert pa.read_bytes() == pb.read_bytes()
    c = plot_triplet_diagram("T_con", points=pts, path_stem=tmp_path / "c", extent=(0, 1), resolution=11)
    assert c.outside["t2i"] == 0.5 and c.active["T_con"]["t2i"] == 0.5  # shares use every point


def test_density_levels_enclose_the_requested_mass():
    g = np.random.default_rng(0)
    sp, sn = 0.6 + 0.05 * g.normal(size=2000), 0.3 + 0.05 * g.normal(size=2000)
    centres, dens, levels = density_grid(sp, sn, (0.0, 1.0))
    assert len(levels) == 2 and levels[0] < levels[1]
    mass = dens.sum()
    assert (dens[dens >= levels[1]].sum() / mass) == pytest.approx(0.5, abs=0.03)
    assert (dens[dens >= levels[0]].sum() / mass) == pytest.approx(0.9, abs=0.03)
    i, j = np.unravel_index(dens.argmax(), dens.shape)  # peak near (0.6, 0.3): rows are Sn
    assert abs(centres[j] - 0.6) < 0.05 and abs(centres[i] - 0.3) < 0.05


def test_pair_weight_curves(tmp_path):
    res = plot_pair_weights(["P_lin", "P_sig", "P_sig-ms"], path_stem=tmp_path / "p", resolution=21)
    assert all(p.exists() for p in res.paths)
    s = res.s
    np.testing.assert_allclose(res.positive["P_lin"], 1 - s, rtol=1e-12)
    np.testing.assert_allclose(res.negative["P_sig"], 1 / (1 + np.exp(-10 * (s - 0.5))), rtol=1e-12)
    np.testing.assert_allclose(res.negative["P_sig-ms"], 1 / (0.1 + np.exp(-10 * (s - 0.5))), rtol=1e-12)
    with pytest.raises(CocosError):
        plot_pair_weights("T_con", path_stem=tmp_path / "x")


def test_file_slug():
    assert file_slug("T_nca*P_sig-") == "T_nca_x_P_sig_neg"
    assert file_slug("T_cir*P_sig-ms+") == "T_cir_x_P_sig-ms_pos"


# -- the command ---------------------------------------------------------------------------------------


def _one_error_line(res):
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "Traceback" not in res.output
    return lines[0]


def test_cli_bad_input_one_line_exit_2(tmp_path):
    line = _one_error_line(runner.invoke(app, ["diagram", "--weight", "T_foo", "--out", str(tmp_path / "x")]))
    assert "T_foo" in line and "T_con" in line and "T_cir" in line
    line = _one_error_line(runner.invoke(app, ["diagram", "--weight", "T_con,P_sig", "--out", str(tmp_path / "x")]))
    assert "P_sig+" in line
    line = _one_error_line(runner.invoke(app, ["diagram", "--checkpoint", str(tmp_path / "nope.pt"),
                                               "--out", str(tmp_path / "x")]))
    assert "nope.pt" in line
    _one_error_line(runner.invoke(app, ["diagram", "--data", str(tmp_path), "--out", str(tmp_path / "x")]))
    _one_error_line(runner.invoke(app, ["diagram", "--extent", "1,0", "--out", str(tmp_path / "x")]))
    _one_error_line(runner.invoke(app, ["diagram", "--pair-weight", "P_foo", "--out", str(tmp_path / "x")]))
    assert not list(tmp_path.iterdir())


def test_cli_without_checkpoint_writes_the_files(tmp_path):
    res = runner.invoke(app, ["diagram", "--weight", "T_nca", "--pair-weight", "P_sig", "--tau", "5",
                              "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["d.pdf", "d.png", "d_pair.pdf", "d_pair.png"]
    assert str(tmp_path / "d.png") in res.output


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from cocos.data.synth import make_synthetic
    from cocos.training.trainer import TrainConfig, Trainer

    # one thread: a tiny GRU's backward is much slower with several threads on a busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("ckpt")
        data = make_synthetic(root / "data", n_train=60, n_dev=20, n_test=20, feature_dim=16)
        cfg = TrainConfig.of(data=str(data), out=str(root / "run"), epochs=1, embed_size=16, word_dim=8,
                          batch_size=16, device="cpu")
        trainer = Trainer(cfg, progress=False, log=lambda *a: None)
        trainer.fit()
        yield trainer.best_path
    finally:
        torch.set_num_threads(threads)


def test_cli_with_checkpoint_reports_the_active_share(tmp_path, tiny_checkpoint):
    from cocos.embed import encode_checkpoint

    res = runner.invoke(app, ["diagram", "--weight", "T_con,T_nca", "--checkpoint", str(tiny_checkpoint),
                              "--batch-size", "16", "--seed", "2", "--device", "cpu", "--no-progress",
                              "--out", str(tmp_path / "d")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "d.png").exists() and (tmp_path / "d.pdf").exists()
    encoded = encode_checkpoint(tiny_checkpoint, device="cpu")
    emb = getattr(encoded, "embeddings", encoded)
    pts = triplet_points(emb, batch_size=16, seed=2)
    n = len(pts["i2t"][0]) + len(pts["t2i"][0])
    assert f"{n} triplets" in res.output
    for name in ("T_con", "T_nca"):
        line = next(ln for ln in res.output.splitlines() if ln.startswith(f"{name}:"))
        printed = [float(x) for x in re.findall(r"(\d+\.\d)%", line)]
        want = [100 * active_share(name, *pts[d]) for d in ("i2t", "t2i")]
        assert printed == [pytest.approx(w, abs=0.051) for w in want]
        assert not math.isnan(sum(printed))



def test_cli_never_writes_into_the_data_folder_it_reads(tmp_path, tiny_checkpoint):
    data = tiny_checkpoint.parent.parent / "data"
    before = sorted(p.name for p in data.iterdir())
    res = runner.invoke(app, ["diagram", "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--no-progress",
                              "--out", str(data / "figure")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "would overwrite the input" in lines[0], res.output
    assert sorted(p.name for p in data.iterdir()) == before


def test_one_spelling_of_weight_names_and_the_papers_notation_in_output():
    from cocos.pipelines.triplets import paper_notation
    from cocos_cli.diagram import weight_names

    # cocos train's spelling (sig_ms) and the code's (P_sig-ms) give the same panels
    assert weight_names("con", "sig_ms") == weight_names("T_con", "P_sig-ms") == ["T_con*P_sig-ms+", "T_con*P_sig-ms-"]
    assert weight_names("nca,cir", None) == ["T_nca", "T_cir"]
    with pytest.raises(CocosError, match=r"unknown pair weight 'sigms' \(choose from con, lin, sig, lin_ms, sig_ms\)"):
        weight_names("con", "sigms")
    assert paper_notation("T_con") == r"$T_{\mathrm{con}}$"
    assert paper_notation("T_cir*P_sig-ms-") == r"$T_{\mathrm{cir}} \cdot P^{-}_{\mathrm{sig}\text{-}\mathrm{ms}}$"
