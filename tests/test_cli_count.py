"""``cocos count``: numbers, JSON output and bad input (one line, exit code 2, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cocos.counting import EmbeddingSet, count_embeddings
from cocos.results import Results
from cocos_cli.main import app
from tests.test_report_tables import as_results, md_cell

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()


def _write(path, n=40, k=5, d=8, **extra):
    g = np.random.default_rng(0)
    images = g.normal(size=(n, d))
    captions = np.repeat(images, k, 0) + g.normal(size=(n * k, d))
    arrays = {"images": images, "captions": captions, **extra}
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return images, captions


def test_count_json_matches_the_library(tmp_path):
    images, captions = _write(tmp_path / "e.npz")
    out = tmp_path / "out.json"
    res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "--batch-size", "8", "--seed", "3",
                              "--json", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    run = count_embeddings(EmbeddingSet.from_arrays(images, captions), batch_size=8, seed=3)
    expected = run.stats()
    stats = as_results(data).stats
    assert stats["smoothap"]["t2i"]["C_0"] == pytest.approx(expected["smoothap"]["t2i"]["C_0"])
    assert stats["triplet"]["i2t"]["C_q"] == pytest.approx(expected["triplet"]["i2t"]["C_q"])
    assert data["counting"]["n_batches"] == {"pair": 25, "ranking": 5}
    assert data["source"]["kind"] == "count" and data["format"] == "cocos-results"
    assert "triplet_sh" in res.output and "W_qv-" in res.output


def test_count_one_loss_and_compat(tmp_path):
    _write(tmp_path / "e.npz")
    out = tmp_path / "o.json"
    res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "--loss", "smoothap", "--compat",
                              "--batch-size", "8", "--json", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert {r["loss"] for r in data["statistics"]} == {"smoothap"} and data["counting"]["compat"] is True


BAD = {
    "dims": lambda p: np.savez(p, images=np.ones((4, 3)), captions=np.ones((20, 2))),
    "multiple": lambda p: np.savez(p, images=np.eye(4), captions=np.ones((7, 4))),
    "nan": lambda p: np.savez(p, images=np.full((4, 4), np.nan), captions=np.ones((20, 4))),
    "zero": lambda p: np.savez(p, images=np.zeros((4, 4)), captions=np.ones((20, 4))),
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(b"not a zip at all"),
    "missing_name": lambda p: np.savez(p, imgs=np.eye(4), captions=np.ones((20, 4))),
    "pickle": lambda p: np.savez(p, images=np.array([{"a": 1}], dtype=object), captions=np.ones((5, 4))),
    "npy": lambda p: p.write_bytes(_npy_bytes()),
    "json": lambda p: p.write_text('{"images": [[1, 2]]}'),
    "strings": lambda p: np.savez(p, images=np.array([["a", "b"]]), captions=np.array([["c", "d"]])),
    "caption_image": lambda p: np.savez(p, images=np.eye(4), captions=np.ones((8, 4)), caption_image=-np.ones(8, int)),
}


def _npy_bytes():
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ones((4, 4)))
    return buffer.getvalue()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, case):
    path = tmp_path / "bad.npz"
    BAD[case](path)
    out = tmp_path / "out.json"
    out.write_text("previous result\n")
    res = runner.invoke(app, ["count", str(path), "--batch-size", "2", "--json", str(out), "--no-progress"])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "Traceback" not in res.output
    assert out.read_text() == "previous result\n"


def test_missing_file_and_batch_too_large_and_unknown_loss(tmp_path):
    res = runner.invoke(app, ["count", str(tmp_path / "nope.npz")])
    assert res.exit_code == 2 and "no such file" in res.output
    _write(tmp_path / "e.npz", n=6)
    res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "--batch-size", "64", "--no-progress"])
    assert res.exit_code == 2 and "larger than the data" in res.output
    res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "--loss", "hinge"])
    assert res.exit_code == 2 and "unknown loss 'hinge'" in res.output


def test_count_out_writes_the_same_folder_as_analyze_and_report_merges_two_seeds(tmp_path):
    from cocos.io import MARKER

    _write(tmp_path / "e.npz", n=48)
    folders = []
    for seed in (0, 1):  # the first as a report folder, the second as a results.json alone
        out = tmp_path / f"s{seed}"
        where = ["--out", str(out), "--per-query"] if seed == 0 else ["--json", str(out / "results.json")]
        out.mkdir() if seed else None
        res = runner.invoke(app, ["count", str(tmp_path / "e.npz"), "--seed", str(seed), *where,
                                  "--batch-size", "8", "--name", "toy", "--label", "my encoder", "--no-progress",
                                  "--loss", "triplet,ntxent,smoothap"])
        assert res.exit_code == 0, res.output
        folders.append(out)
    names = sorted(p.name for p in folders[0].iterdir() if p.name != MARKER)
    assert names == ["batches.csv", "counts.pdf", "counts.png", "eps_sweep.pdf", "eps_sweep.png", "explorer.json",
                     "index.html", "queries.csv", "results.json", "tables.md", "tables.tex", "triplet_diagram.pdf",
                     "triplet_diagram.png"]
    import pandas as pd

    batches = pd.read_csv(folders[0] / "batches.csv")
    data = json.loads((folders[0] / "results.json").read_text())
    part = batches[(batches["loss"] == "ntxent") & (batches.direction == "t2i") & (batches["mode"] == "corrected")
                   & (batches.stat == "C_qv-") & (batches.eps == 0.01)]
    assert as_results(data).stats["ntxent"]["t2i"]["C_qv-"]["mean"] == pytest.approx(part.value.mean(), rel=1e-9)
    assert data["data"]["name"] == "toy" and data["model"]["label"] == "my encoder"
    queries = pd.read_csv(folders[0] / "queries.csv")
    assert set(queries.item_kind) >= {"image", "caption"}
    rep = tmp_path / "R"
    res = runner.invoke(app, ["report", str(folders[0] / "results.json"), str(folders[1]), "--out", str(rep)])
    assert res.exit_code == 0, res.output
    md = (rep / "tables.md").read_text()
    assert "**Table 2" in md and "**Table 4" in md and "**Table 1" not in md  # no evaluation: no Table 1
    assert "mean ± sample std over 2 counting seeds (batch samplings of the same embeddings)" in md  # not training seeds
    one = [Results.read(f / "results.json").stats["triplet"]["i2t"]["C_q"]["mean"] for f in folders]
    cell = md_cell(md[md.index("**Table 2"):], "Triplet loss", "i2t C^q")
    assert cell.startswith(f"{np.mean(one):.2f} ± {np.std(one, ddof=1):.2f}")
    assert not (rep / "cocos_vs_rsum.png").exists()  # count results have no rsum: no placeholder figure
