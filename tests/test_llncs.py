"""Every table kind the commands write compiles in a real LNCS paper (``llncs``), all at once: no overfull box,
no multiply defined label. Needs pdflatex and ``llncs.cls`` (Debian: texlive-latex-base texlive-latex-recommended
texlive-publishers; ``.ci/run`` installs them)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from cocos.pipelines.count import count_file
from cocos.report.merge import build_report, build_tables, group_results, render_report
from cocos.report.tables import to_latex
from cocos.results import Results

FAMILIES = ["triplet", "triplet_sh", "ntxent", "smoothap", "goal", "imc"]
METRICS = {"i2t_R@1": 30.8, "i2t_R@5": 62.6, "i2t_R@10": 74.1, "mAP@5": 0.41, "t2i_R@1": 23.4,
           "t2i_R@5": 52.8, "t2i_R@10": 65.7, "i2t_Rprec": 0.3, "t2i_Rprec": 0.234, "rsum": 309.4}


def have_llncs() -> str | None:
    if shutil.which("pdflatex") is None or shutil.which("kpsewhich") is None:
        return "pdflatex"
    found = subprocess.run(["kpsewhich", "llncs.cls"], capture_output=True, text=True).stdout.strip()
    return None if found else "llncs.cls"


def compile_llncs(folder, body: str) -> str:
    """Compile ``body`` in ``\\documentclass{llncs}`` with booktabs and amsmath; return the log."""
    missing = have_llncs()
    if missing:
        pytest.skip(f"{missing} missing: apt-get install texlive-latex-base texlive-latex-recommended "
                    "texlive-publishers")
    (folder / "t.tex").write_text(body)
    (folder / "doc.tex").write_text("\\documentclass{llncs}\\usepackage{booktabs}\\usepackage{amsmath}"
                                    "\\usepackage{graphicx}\\begin{document}\\input{t.tex}\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=folder,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    return (folder / "doc.log").read_text(errors="replace")


def assert_clean(log: str) -> None:
    overfull = re.findall(r"Overfull \\hbox \(([\d.]+pt) too wide\)[^\n]*", log)
    assert not overfull, overfull
    assert "multiply defined" not in log and "multiply-defined" not in log


def _analyzed(counted: dict, loss: str, seed: int, epoch: int = 7, ltd: bool = False, kind: str = "vsepp") -> dict:
    d = copy.deepcopy(counted)
    d["source"] = {"kind": "analyze", "path": f"checkpoints/{loss}_{seed}/epoch_{epoch}.pt",
                   "sha256": f"{loss}/{seed}/{epoch}/{ltd}/{kind}", "epoch": epoch}
    d["data"].update(name="f30k_precomp", split_counted="train")
    d["model"] = {"label": {"vsepp": "VSE++", "vsrn": "VSRN"}[kind] + (" + LTD" if ltd else ""), "kind": kind,
                  "hparams": {}}
    d["training"] = {"loss": loss, "params": {"margin": 0.25} if loss == "triplet" else {}, "seed": seed,
                     "ltd": {"mode": "constraint", "eta": 0.1, "beta": 1.0} if ltd else None}
    rsum = METRICS["rsum"] + seed + epoch + 10 * FAMILIES.index(loss)  # losses apart: the tests over seeds hold
    d["evaluation"] = {"split": "test", "metrics": {**METRICS, "rsum": rsum}}
    return d


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """results.json files of every kind: each family (two seeds, three for some: tested over seeds), LTD, VSRN, one
    run's epochs, two counting seeds."""
    root = tmp_path_factory.mktemp("kinds")
    counted = []
    for seed in (0, 1):
        g = np.random.default_rng(seed)
        images = g.normal(size=(32, 8))
        np.savez(root / f"e{seed}.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(160, 8)))
        counted.append(count_file(root / f"e{seed}.npz", FAMILIES, batch_size=8, seed=seed, name="toy",
                                  label="CLIP ViT-B/32").results.to_dict())

    def write(name, d):
        path = root / name / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps(d))
        return path

    out = {f"{loss}-{seed}": write(f"{loss}-{seed}", _analyzed(counted[0], loss, seed))
           for loss in FAMILIES for seed in (0, 1)}
    out |= {f"{loss}-2": write(f"{loss}-2", _analyzed(counted[0], loss, 2)) for loss in FAMILIES[:3]}
    out["ltd"] = write("ltd", _analyzed(counted[0], "ntxent", 0, ltd=True))
    out["vsrn"] = write("vsrn", _analyzed(counted[0], "goal", 0, kind="vsrn"))
    out |= {f"epoch-{e}": write(f"epoch-{e}", _analyzed(counted[0], "triplet_sh", 0, epoch=e)) for e in (1, 2, 3, 10)}
    out["count-0"], out["count-1"] = write("count-0", counted[0]), write("count-1", counted[1])
    return out


def every_tables_tex(files: dict, width: str) -> list[str]:
    """What the commands write as tables.tex: each results folder (analyze/count), and the reports."""
    def single(path):
        groups, _ = group_results([Results.read(path)])
        return "\n".join(to_latex(t, width=width) for t in build_tables(groups, counters="all"))

    def report(name, keys, **kw):  # as written to a folder of that name
        return render_report(build_report([files[k] for k in keys], **kw), width, name=name)[1]

    trained = [k for k in files if not k.startswith(("count", "epoch"))]
    epochs = [k for k in files if k.startswith("epoch")]
    return [*(single(files[k]) for k in files),
            report("summary", [f"{loss}-0" for loss in FAMILIES] + ["ltd"]),  # one seed each: not tested
            report("trained", trained),  # two and three seeds (compared, marked *), LTD and VSRN rows
            report("trained-all", trained, counters="all"),
            report("three-seeds", [f"{loss}-{seed}" for loss in FAMILIES[:3] for seed in (0, 1, 2)]),
            report("epochs", epochs, label="epoch"), report("epochs-all", epochs, label="epoch", counters="all"),
            report("count", ["count-0", "count-1"]), report("count-0", ["count-0"])]


@pytest.mark.parametrize("width", ["column", "page"])
def test_every_tables_tex_compiles_together_in_llncs(files, width, tmp_path):
    texts = every_tables_tex(files, width)
    body = "\n\\clearpage\n".join(texts)  # one paper: a page break now and then so floats never pile up
    labels = re.findall(r"\\label\{([^}]*)\}", body)
    assert len(labels) == len(set(labels)) > 60  # unique per result (dataset, model, loss, seed, checkpoint), report
    assert body.count(r"\textsuperscript{*}") > 10 and "paired t-test" in body  # differences that hold, marked
    assert "Not tested for significance: 1 seed per row" in body and "Not tested (fewer than 3 seeds)" in body
    if width == "page":
        assert body.count(r"\begin{table*}") == len(labels)
    assert "\\resizebox" not in body and body.isascii()
    assert_clean(compile_llncs(tmp_path, body))
