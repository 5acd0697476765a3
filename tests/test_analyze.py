"""End to end on tiny synthetic data: train, analyze, check results.json against count_batch and invariants."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting import count_batch
from cocos.data.samplers import pair_batches, ranking_batches
from cocos.data.synth import make_synthetic
from cocos.embed import encode_checkpoint
from cocos.training.checkpoint import load_checkpoint, save_checkpoint
from cocos.training.trainer import TrainConfig, Trainer
from cocos_cli.main import app
from tests.helpers import empty_figures, figures_empty, one_error_line
from tests.test_report_tables import as_results

runner = CliRunner()
BATCH = 16
# the figure formats each test gets as empty files (their drawing is tested in tests/test_report_figures.py and
# tests/test_figure_print.py; about 2 s an analysis): every format but for the tests that read figures
EMPTY_FORMATS = {"test_same_command_twice_gives_identical_results": {"pdf"},  # compares the PNGs
                 "test_tables_parse_and_latex_is_structurally_sound": set()}  # reads PNGs and a PDF


@pytest.fixture(autouse=True)
def _figures(request, monkeypatch):
    empty_figures(monkeypatch, EMPTY_FORMATS.get(request.node.name, {"png", "pdf"}))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    data = make_synthetic(root / "syn", n_train=96, n_dev=32, n_test=32, feature_dim=16, seed=3)
    for loss in ("triplet_sh", "smoothap"):
        cfg = TrainConfig.of(data=str(data), out=str(root / loss), loss=loss, epochs=2, lr=2e-3, batch_size=BATCH,
                          embed_size=16, word_dim=8, device="cpu")
        Trainer(cfg, progress=False, log=lambda *a: None).fit()
    return root, data


def _analyze(root, loss, out, *extra):
    res = runner.invoke(app, ["analyze", str(root / loss / "model_best.pt"), "--out", str(out),
                              "--batch-size", str(BATCH), "--seed", "4", "--no-progress", *extra])
    assert res.exit_code == 0, res.output
    return json.loads((out / "results.json").read_text()), res.output


@pytest.fixture(scope="module")
def analyses(world, tmp_path_factory):
    """One analysis per model (shared by the tests of this module): folder, results.json and output. The SmoothAP
    one draws its PNGs (test_same_command_twice_gives_identical_results compares them)."""
    root, _ = world
    base = tmp_path_factory.mktemp("analyses")
    out = {}
    with figures_empty():
        results, output = _analyze(root, "triplet_sh", base / "triplet_sh", "--per-query", "--save-embeddings",
                                   str(base / "sh_emb.npz"))
    out["triplet_sh"] = (base / "triplet_sh", results, output)
    with figures_empty(EMPTY_FORMATS["test_same_command_twice_gives_identical_results"]):
        results, output = _analyze(root, "smoothap", base / "smoothap")
    out["smoothap"] = (base / "smoothap", results, output)
    return out


def test_results_match_count_batch_on_the_same_batches(world, analyses):
    root, data = world
    _, results, output = analyses["triplet_sh"]
    emb = encode_checkpoint(root / "triplet_sh" / "model_best.pt")
    images, captions = emb.images.numpy(), emb.captions.numpy()
    for loss in ("triplet", "triplet_sh", "ntxent"):
        per_batch = {d: {} for d in ("i2t", "t2i")}
        for cap, img in pair_batches(emb.caption_image, BATCH, 4):
            out = count_batch(images[img], captions[cap], loss, caption_image=np.arange(BATCH), image_ids=img)
            for d, stats in out.items():
                for stat, v in stats.items():
                    per_batch[d].setdefault(stat, []).append(v)
        for d in per_batch:
            for stat, values in per_batch[d].items():
                values = np.array(values)
                ok = values[~np.isnan(values)]
                entry = as_results(results).stats[loss][d][stat]
                assert entry["n"] == len(ok) and entry["n_skipped"] == len(values) - len(ok)
                if len(ok):
                    assert entry["mean"] == pytest.approx(ok.mean(), rel=1e-6, abs=1e-9), (loss, d, stat)
                    assert entry["std"] == pytest.approx(ok.std(), rel=1e-5, abs=1e-9), (loss, d, stat)
    smooth = [count_batch(images[img], captions[(img[:, None] * 5 + np.arange(5)).reshape(-1)], "smoothap")
              for img in ranking_batches(len(images), BATCH, 4)]
    assert as_results(results).stats["smoothap"]["t2i"]["C_0"]["mean"] == pytest.approx(
        np.mean([s["t2i"]["C_0"] for s in smooth]))
    assert results["counting"]["n_batches"] == {"pair": 480 // BATCH, "ranking": 96 // BATCH}
    assert "rsum" in output and "triplet_sh" in output


def test_invariants(analyses):
    _, results, _ = analyses["smoothap"]
    stats, alt = as_results(results).stats, as_results(results).alt_stats
    for d in ("i2t", "t2i"):
        sh = stats["triplet_sh"][d]
        if sh["C_q"]["mean"] is not None:
            assert sh["C_q"]["mean"] == 1.0 and sh["C_q"]["std"] == 0.0
        # C_B + C_0 = number of queries for Triplet SH (every query contributes 1 or is zero-gradient)
        assert sh["C_B"]["mean"] + sh["C_0"]["mean"] == pytest.approx(BATCH)
    # compat changes only the known statistics: SmoothAP i2t is identical except the aggregation of C^q
    # (a batch without a contributing query is 0 and averaged in, as published), SmoothAP t2i is not
    i2t, alt_i2t = stats["smoothap"]["i2t"], alt["smoothap"]["i2t"]
    assert {k: v for k, v in i2t.items() if k != "C_q"} == {k: v for k, v in alt_i2t.items() if k != "C_q"}
    assert alt_i2t["C_q"]["n_skipped"] == 0 and alt_i2t["C_q"]["n"] == i2t["C_q"]["n"] + i2t["C_q"]["n_skipped"]
    if i2t["C_q"]["n_skipped"] == 0:
        assert i2t["C_q"] == alt_i2t["C_q"]
    else:
        n, skipped = i2t["C_q"]["n"], i2t["C_q"]["n_skipped"]
        assert alt_i2t["C_q"]["mean"] == pytest.approx(i2t["C_q"]["mean"] * n / (n + skipped))
    assert alt["smoothap"]["t2i"]["C_0"]["mean"] > stats["smoothap"]["t2i"]["C_0"]["mean"]
    # Triplet SH i2t and t2i change only through same-image pairs
    same = stats["triplet_sh"]["i2t"]["n_excluded"]["mean"] == 0
    assert (stats["triplet_sh"] == alt["triplet_sh"]) == same


def test_same_command_twice_gives_identical_results(world, analyses, tmp_path):
    root, _ = world
    first = analyses["smoothap"][0]
    _analyze(root, "smoothap", tmp_path / "y")
    for name in ("results.json", "tables.md", "batches.csv", "counts.png"):
        assert (first / name).read_bytes() == (tmp_path / "y" / name).read_bytes(), name


def test_per_query_table_traces_queries_to_items(analyses):
    import pandas as pd

    folder, results, _ = analyses["triplet_sh"]
    q = pd.read_csv(folder / "queries.csv")
    sh = q[(q["loss"] == "triplet_sh") & (q["mode"] == "corrected")]
    t2i = sh[sh.direction == "t2i"]
    assert t2i["item"].is_unique and len(t2i) == results["counting"]["n_batches"]["pair"] * BATCH
    assert set(sh.C_q.unique()) <= {0.0, 1.0}
    b = pd.read_csv(folder / "batches.csv")
    means = b[(b["loss"] == "triplet_sh") & (b["mode"] == "corrected") & (b.stat == "C_B")].groupby("direction").value.mean()
    for d in ("i2t", "t2i"):  # C^B per batch is the sum of the per-query counts
        assert means[d] == pytest.approx(as_results(results).stats["triplet_sh"][d]["C_B"]["mean"])
        assert means[d] == pytest.approx(sh[sh.direction == d].groupby("batch").C_q.sum().mean())


def test_report_mixes_analyze_and_count_results_of_the_same_data(analyses, tmp_path):
    folder, results, _ = analyses["triplet_sh"]
    emb = folder.parent / "sh_emb.npz"
    (tmp_path / "c").mkdir()
    res = runner.invoke(app, ["count", str(emb), "--json", str(tmp_path / "c" / "results.json"), "--batch-size",
                              str(BATCH), "--seed", "4", "--name", results["data"]["name"], "--label", "frozen VSE++",
                              "--no-progress"])
    assert res.exit_code == 0, res.output
    counted, analyzed = as_results(json.loads((tmp_path / "c" / "results.json").read_text())), as_results(results)
    # the same embeddings, batches and counters: the same counts as analyze (the saved float32 embeddings are
    # normalised once more, so weights may differ in the last bits)
    for loss, stats in (("triplet", ("C_q", "C_B", "C_0")), ("smoothap", ("C_q", "C_0"))):
        for d in ("i2t", "t2i"):
            for stat in stats:
                assert counted.stats[loss][d][stat] == analyzed.stats[loss][d][stat], (loss, d, stat)
                assert counted.alt_stats[loss][d][stat] == analyzed.alt_stats[loss][d][stat], (loss, d, stat)
    res = runner.invoke(app, ["report", str(folder), str(analyses["smoothap"][0]), str(tmp_path / "c"),
                              "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "r" / "tables.md").read_text()
    table1 = md[md.index("**Table 1"):md.index("**Table 2")]
    assert "Triplet loss SH" in table1 and "frozen VSE++" not in table1  # count results have no evaluation
    table2 = md[md.index("**Table 2"):md.index("**Table 3")]
    header = table2.splitlines()[2]
    assert "| Counter |" in header  # rows of different counters than their training loss: a Counter column
    assert "frozen VSE++ | - | Triplet loss |" in table2 and "VSE++ | Triplet loss SH | Triplet loss SH |" in table2


def test_tables_parse_and_latex_is_structurally_sound(world, tmp_path):
    root, _ = world
    _analyze(root, "triplet_sh", tmp_path / "t", "--compat", "--loss", "triplet,smoothap")
    md = (tmp_path / "t" / "tables.md").read_text()
    tables = re.findall(r"((?:^\|.*\|\n)+)", md, flags=re.M)
    assert len(tables) >= 3
    for block in tables:
        rows = [r for r in block.strip().splitlines()]
        widths = {len(re.split(r"(?<!\\)\|", r)) for r in rows}
        assert len(widths) == 1, block
        assert re.match(r"^\|( ?:?-+:? ?\|)+$", rows[1]), rows[1]
    tex = (tmp_path / "t" / "tables.tex").read_text()
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == len(tables)
    assert tex.count("\\begin{table}") == tex.count("\\end{table}")
    for rule in ("\\toprule", "\\midrule", "\\bottomrule"):
        assert tex.count(rule) >= len(tables)
    assert "$\\pm$" in tex
    assert "compat" in md.lower()  # the tables say which counter they show
    for name in ("counts.png", "eps_sweep.png", "triplet_diagram.png", "counts.pdf"):
        assert (tmp_path / "t" / name).read_bytes()[:4] in (b"\x89PNG", b"%PDF")


def _one_line_exit_2(args, tmp_path, out):
    res = runner.invoke(app, ["analyze", *args, "--out", str(out), "--batch-size", str(BATCH), "--no-progress"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    return lines[0]


def test_bad_input(world, tmp_path):
    root, data = world
    out = tmp_path / "out"
    (tmp_path / "notckpt.pt").write_text("hello")
    assert "not a readable checkpoint" in _one_line_exit_2([str(tmp_path / "notckpt.pt")], tmp_path, out)
    raw = (root / "triplet_sh" / "model_best.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 3])
    assert "cut.pt" in _one_line_exit_2([str(tmp_path / "cut.pt")], tmp_path, out)
    # the checkpoint's data folder is gone and no --data
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    ckpt = load_checkpoint(root / "triplet_sh" / "model_best.pt")
    ckpt["data"]["path"] = str(tmp_path / "gone")
    save_checkpoint(tmp_path / "orphan.pt", ckpt)
    assert "--data" in _one_line_exit_2([str(tmp_path / "orphan.pt")], tmp_path, out)
    # ... with --data it works
    res = runner.invoke(app, ["analyze", str(tmp_path / "orphan.pt"), "--data", str(moved), "--out",
                              str(tmp_path / "ok"), "--batch-size", str(BATCH), "--no-progress", "--loss", "triplet_sh"])
    assert res.exit_code == 0, res.output
    # data whose dimensions do not fit the model
    wide = make_synthetic(tmp_path / "wide", n_train=32, n_dev=16, n_test=16, feature_dim=24, seed=1)
    assert "dimension 24" in _one_line_exit_2([str(root / "triplet_sh" / "model_best.pt"), "--data", str(wide)],
                                             tmp_path, out)


def test_an_embeddings_file_is_named_as_one_and_other_data_is_one_warning(world, analyses, tmp_path):
    root, data = world
    emb = analyses["triplet_sh"][0].parent / "sh_emb.npz"  # written by --save-embeddings
    line = _one_line_exit_2([str(emb)], tmp_path, tmp_path / "out")
    assert "this is an embeddings file" in line and f"cocos count {emb}" in line and "inline_container" not in line
    # a data folder with another fingerprint than the checkpoint's: accepted, with one warning line on stderr
    other = tmp_path / "other"
    shutil.copytree(data, other)
    with open(other / "train_caps.txt", "a") as fh:
        fh.write("")
    (other / "extra.txt").write_text("a file the fingerprint sees")
    res = runner.invoke(app, ["analyze", str(root / "triplet_sh" / "model_best.pt"), "--data", str(other), "--out",
                              str(tmp_path / "ok"), "--batch-size", str(BATCH), "--no-progress", "-l", "triplet_sh"])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "fingerprint" in warnings[0] and "differs from the checkpoint's" in warnings[0]
    # the checkpoint's own data folder (the shared analysis of the same checkpoint, without --data): no warning
    assert "rsum" in analyses["triplet_sh"][2] and "warning:" not in analyses["triplet_sh"][2]


def test_nan_embeddings_after_encoding_are_reported(world, tmp_path):
    root, _ = world
    ckpt = load_checkpoint(root / "triplet_sh" / "model_best.pt")
    ckpt["state_dict"] = {k: (torch.full_like(v, float("nan")) if "img_enc" in k or "fc" in k else v)
                          for k, v in ckpt["state_dict"].items()}
    save_checkpoint(tmp_path / "nan.pt", ckpt)
    line = _one_line_exit_2([str(tmp_path / "nan.pt")], tmp_path, tmp_path / "out")
    assert "NaN" in line and "train_ims.npy" in line


def test_existing_report_survives_a_failed_run(analyses, tmp_path):
    out = tmp_path / "keep"
    shutil.copytree(analyses["smoothap"][0], out)
    before = (out / "results.json").read_bytes()
    (tmp_path / "bad.pt").write_text("x")
    res = runner.invoke(app, ["analyze", str(tmp_path / "bad.pt"), "--out", str(out), "--no-progress"])
    assert res.exit_code == 2
    assert (out / "results.json").read_bytes() == before


def test_analyze_refuses_a_foreign_out_before_encoding_and_saves_embeddings_last(world, analyses, tmp_path):
    root, _ = world
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    res = runner.invoke(app, ["analyze", str(root / "triplet_sh" / "model_best.pt"), "--out", str(mine),
                              "--no-progress"])
    assert res.exit_code == 2 and "not written by cocos" in res.output
    assert (mine / "notes.txt").read_text() == "keep"
    emb = tmp_path / "emb.npz"
    res = runner.invoke(app, ["analyze", str(root / "triplet_sh" / "model_best.pt"), "--out", str(tmp_path / "o"),
                              "--batch-size", "100000", "--save-embeddings", str(emb), "--no-progress"])
    assert res.exit_code == 2 and "larger than the training split" in res.output
    assert not emb.exists() and not (tmp_path / "o").exists()
    # a run that succeeds writes them, in the cocos count format (the shared analysis ran with --save-embeddings)
    saved = analyses["triplet_sh"][0].parent / "sh_emb.npz"
    res = runner.invoke(app, ["count", str(saved), "--batch-size", str(BATCH), "--json", str(tmp_path / "c.json"),
                              "--seed", "0", "--no-progress", "--loss", "triplet_sh"])
    assert res.exit_code == 0, res.output


def test_defaults_batch_size_from_checkpoint_label_and_folder_of_a_last_checkpoint(world, analyses, tmp_path,
                                                                                    monkeypatch):
    """No --batch-size: the training batch size; last.pt gets its own folder; --label keeps it apart in reports."""
    root, _ = world
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["analyze", str(root / "triplet_sh" / "last.pt"), "--label", "last", "--seed", "4",
                              "--loss", "triplet_sh", "--no-progress"])
    assert res.exit_code == 0, res.output
    folder = tmp_path / "reports" / "triplet_sh_last"  # never the folder of model_best.pt
    results = json.loads((folder / "results.json").read_text())
    assert results["counting"]["batch_size"] == BATCH  # the model was trained at BATCH, not the paper's 128
    assert results["model"]["label"] == "VSE++ (last)"
    best = analyses["triplet_sh"][0]
    res = runner.invoke(app, ["report", str(best), str(folder), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output  # one run, two checkpoints, two rows (not two seeds)
    md = (tmp_path / "r" / "tables.md").read_text()
    assert "VSE++ (last)" in md and "sample std" not in md
    # without the label the two checkpoints of one seed are refused as replicates
    unlabelled = tmp_path / "u"
    res = runner.invoke(app, ["analyze", str(root / "triplet_sh" / "last.pt"), "--out", str(unlabelled), "--seed", "4",
                              "--batch-size", str(BATCH), "--loss", "triplet_sh", "--no-progress"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", str(best), str(unlabelled), "--out", str(tmp_path / "r2")])
    assert res.exit_code == 2 and "--label" in res.output and not (tmp_path / "r2").exists()


@pytest.mark.parametrize("flags, says", [(["--eps", "nan"], "--eps"), (["--eps", "-0.5"], "--eps"),
                                         (["--batch-size", "0"], "--batch-size"), (["--workers", "-1"], "--workers"),
                                         (["--crop-size", "0"], "--crop-size")])
def test_bad_counting_options_are_one_line_before_any_work(flags, says, tmp_path):
    ckpt = tmp_path / "model_best.pt"
    ckpt.write_bytes(b"not read: the options are checked first")
    res = runner.invoke(app, ["analyze", str(ckpt), "--out", str(tmp_path / "r"), *flags])
    assert says in one_error_line(res) and sorted(p.name for p in tmp_path.iterdir()) == ["model_best.pt"]
