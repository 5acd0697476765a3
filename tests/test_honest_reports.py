"""Results that must not mislead a reader (issue 28, item 12): chance and warm-up flags, the README's numbers, the
demo's resume, inputs checked before the heavy imports, an inherited ignored SIGINT."""

from __future__ import annotations

import copy
import json
import math
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cocos.results import CHANCE_NOISE_SD, Results, chance_rsum

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "reports" / "example"
NAMES = {"Triplet loss": "triplet", "Triplet loss SH": "triplet_sh", "NT-Xent": "ntxent", "SmoothAP": "smoothap"}


# -- chance ---------------------------------------------------------------------------------------------------------


def test_chance_rsum_by_hand():
    # 2 images, 1 caption each: every recall at K >= 2 is certain, R@1 is 1/2 in both directions
    mean, sd = chance_rsum(2, 2)
    assert mean == pytest.approx(100 * (0.5 + 1 + 1) * 2)
    # X = 3 with p 1/2, else 2: variance 1/4 per query; sd bound 100 (sqrt(.25/2) + sqrt(.25/2))
    assert sd == pytest.approx(100 * 2 * math.sqrt(0.25 / 2))
    # N = 100, k = 5: t2i exactly 1 + 5 + 10; i2t 1 + (1 - C(495,5)/C(500,5)) + (1 - C(495,10)/C(500,10)) in percent
    i2t = sum(1 - math.comb(495, K) / math.comb(500, K) for K in (1, 5, 10))
    assert chance_rsum(100, 500)[0] == pytest.approx(100 * i2t + 16)
    assert abs(chance_rsum(100, 500)[0] - 2 * 16 / 100 * 100) < 1  # the small-K/N approximation


def _example(loss: str = "triplet_sh") -> dict:
    return json.loads((EXAMPLE / loss / "results.json").read_text())


def _flagged(d: dict, *, epoch=None, warmup=0, rsum=None, n=None) -> Results:
    d = copy.deepcopy(d)
    if epoch is not None:
        d["source"]["epoch"] = epoch
    d["training"].update(warmup_epochs=warmup, warmup_loss="triplet" if warmup else None)
    if rsum is not None:
        d["evaluation"]["metrics"]["rsum"] = rsum
    if n is not None:
        d["evaluation"].update(n_images=n, n_captions=5 * n)
    return Results.from_dict(d)


def test_warm_up_and_chance_are_flagged_in_table_1_and_only_then():
    from cocos.report.groups import group_results
    from cocos.report.paper_tables import retrieval_table

    chance, sd = chance_rsum(100, 500)
    cases = {  # (flags expected, results)
        "": _flagged(_example(), epoch=8, warmup=1, n=100),  # epoch 8 of a run with 1 warm-up epoch, rsum 453
        "w": _flagged(_example(), epoch=1, warmup=1, n=100),
        "c": _flagged(_example(), epoch=8, warmup=1, n=100, rsum=chance + CHANCE_NOISE_SD * sd - 0.01),
        "wc": _flagged(_example(), epoch=1, warmup=1, n=100, rsum=33.0),
    }
    above = _flagged(_example(), epoch=8, n=100, rsum=chance + CHANCE_NOISE_SD * sd + 0.01)
    assert not above.at_chance and not above.honesty_notes()
    assert not _flagged(_example(), epoch=8, rsum=33.0).at_chance  # split size not recorded: unknown, not flagged
    for mark, results in cases.items():
        groups, _ = group_results([results])
        table = retrieval_table(groups)
        rsum = table.rows[0].cells[[c.name for c in table.columns].index("rsum")]
        assert rsum.mark == mark, (mark, rsum)
        notes = {f.mark: f.text for f in table.footnotes if f.mark}
        assert set(notes) == set(mark)
        if "w" in mark:
            assert "warm-up epoch" in notes["w"] and "triplet" in notes["w"]
        if "c" in mark:
            assert f"chance {chance:.1f}" in notes["c"]
        assert len(results.honesty_notes()) == len(mark)


def test_cocos_vs_rsum_draws_chance_and_its_noise(tmp_path, monkeypatch):
    from cocos.report import style
    from cocos.report.figures import plot_cocos_vs_rsum
    from cocos.report.groups import group_results
    from cocos.report.merge import cocos_vs_rsum_rows

    monkeypatch.setattr(style, "save", lambda fig, stem: [])  # what is drawn is read back; no files needed

    at_chance = _flagged(_example(), epoch=1, warmup=1, n=200, rsum=17.0)
    groups, _ = group_results([at_chance, _flagged(_example("triplet"), n=200)])
    rows = cocos_vs_rsum_rows(groups)
    out = plot_cocos_vs_rsum(rows, tmp_path / "f", looks=at_chance.presentation)
    chance, sd = chance_rsum(200, 1000)
    assert out.data["chance"] == [pytest.approx((chance, chance + CHANCE_NOISE_SD * sd))]
    assert any("(warm-up epoch)" in name for name in out.data["legend"])
    bare = plot_cocos_vs_rsum(rows.drop(columns=["chance", "chance_sd", "warmup"]), tmp_path / "g")
    assert bare.data["chance"] == [None]


# -- the README's numbers are the committed example's ------------------------------------------------------------


def test_readme_demo_table_is_the_committed_example():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## What the demo shows", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (Triplet loss SH|Triplet loss|NT-Xent|SmoothAP) \| (.+)$", section, re.M)
    assert sorted(name for name, _ in rows) == sorted(NAMES)
    for name, rest in rows:
        cells = [c.strip().strip("*") for c in rest.split("|")]
        d = _example(NAMES[name])
        metrics = d["evaluation"]["metrics"]
        assert [float(c) for c in cells[:3]] == [round(metrics[k], 1) for k in ("i2t_R@1", "t2i_R@1", "rsum")], name
        stat, value = re.match(r"(\S+) = ([\d.]+) ±", cells[3]).groups()
        loss = NAMES[name]
        main = Results.from_dict(d).main()
        shown = main[(main["loss"] == loss) & (main["direction"] == "i2t") & (main["stat"] == stat.replace("^", "_"))]
        assert float(value) == round(float(shown["mean"].iloc[0]), 2), name
    perf = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    example = " / ".join(f"{_example(NAMES[n])['evaluation']['metrics']['rsum']:.1f}" for n in NAMES)
    assert example in perf  # the Performance section names the example's rsums where it compares with them


# -- the demo resumes an interrupted model ------------------------------------------------------------------------


def test_demo_resumes_an_interrupted_model(tmp_path, monkeypatch):
    import cocos.pipelines.demo as demo

    cfg = demo.DemoConfig(epochs=3, checkpoints=str(tmp_path / "ck"), data=str(tmp_path / "d"))
    train = demo._train_config(cfg, "triplet_sh")
    folder = Path(train.out)
    folder.mkdir(parents=True)
    saved = {"data": {"fingerprint": "abc"}, "train": train.flat(), "epoch": 2}  # the record a checkpoint holds
    monkeypatch.setattr(demo, "load_checkpoint", lambda path: copy.deepcopy(saved))
    assert demo._run_state(train, "abc") == "none"  # no last.pt
    (folder / "last.pt").write_bytes(b"x")
    assert demo._run_state(train, "abc") == "interrupted"
    assert demo._run_state(train, "other data") == "none"
    assert demo._run_state(demo._train_config(demo.DemoConfig(epochs=3, lr=1e-4, checkpoints=cfg.checkpoints),
                                              "triplet_sh"), "abc") == "none"  # other settings: start over
    saved["epoch"] = 3
    assert demo._run_state(train, "abc") == "none"  # finished but no model_best.pt: trained again
    (folder / "model_best.pt").write_bytes(b"x")
    assert demo._run_state(train, "abc") == "done" and demo._reusable(train, "abc")

    made = []

    class Trainer:  # records how the demo starts each model, then stops the demo
        def __init__(self, cfg, **kw):
            made.append(kw)

        def fit(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(demo, "Trainer", Trainer)
    monkeypatch.setattr(demo, "_run_state", lambda *a: "interrupted")
    monkeypatch.setattr(demo, "make_synthetic", lambda *a, **k: None)
    monkeypatch.setattr(demo, "data_fingerprint", lambda *a: "abc")
    with pytest.raises(KeyboardInterrupt):
        demo._run(cfg, {"triplet_sh": demo.parse_run("triplet_sh")}, tmp_path / "rep", [], Path(cfg.data), False,
                  False, lambda s: None)
    assert made == [{"resume": True, "overwrite": False, "progress": False, "log": made[0]["log"], "by": "demo"}]


# -- inputs before the heavy imports -----------------------------------------------------------------------------


def test_missing_inputs_are_refused_before_torch_pandas_or_matplotlib_load(tmp_path):
    code = f"""
import sys
from typer.testing import CliRunner
from cocos_cli.main import app
folder = {str(tmp_path)!r}
cases = [["analyze", "nosuch.pt"], ["analyze", folder], ["count", "nosuch.npz"], ["report", "nosuch.json"],
         ["import", "nosuch.tar", "--vocab", "v", "--data", "d", "--out", "o.pt"],
         ["demo", "--data", folder + "/f.txt"]]
open(folder + "/f.txt", "w").close()
for args in cases:
    res = CliRunner().invoke(app, args)
    heavy = [m for m in ("torch", "pandas", "matplotlib") if m in sys.modules]
    print(res.exit_code, heavy, res.output.strip().splitlines())
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and len(lines) == 6, run.stdout + run.stderr
    for line in lines:
        assert line.startswith("2 [] ['error: "), line  # exit 2, one error line, nothing heavy imported
    assert "no such checkpoint" in lines[0] and "is a folder" in lines[1] and "no such file" in lines[2]
    assert "f.txt: exists and is not a folder" in lines[5]


# -- an inherited ignored SIGINT stays ignored -------------------------------------------------------------------


@pytest.mark.parametrize("start", [signal.SIG_IGN, signal.default_int_handler])
def test_a_command_keeps_an_ignored_sigint_and_restores_what_it_found(start):
    from cocos_cli.common import _interrupt_handling, _on_sigint

    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, start)
        with _interrupt_handling():
            inside = signal.getsignal(signal.SIGINT)
        assert inside is (signal.SIG_IGN if start is signal.SIG_IGN else _on_sigint)
        assert signal.getsignal(signal.SIGINT) is start
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_console_script_leaves_an_ignored_sigint_ignored():
    code = ("import os, signal, sys, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)  # as nohup ... & starts it\n"
            "from cocos_cli.common import install_late_interrupt\ninstall_late_interrupt()\n"
            "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)\nprint('alive')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "alive", (run.returncode, run.stderr)


def test_the_step_log_has_the_loss_per_query_so_a_short_final_batch_is_no_drop(tmp_path):
    """``L_con/query``: a summed family's loss over the number of queries of a direction (pair batches: the batch's
    rows), a family that averages unchanged; a 3-row final batch then sits with the full ones."""
    from cocos.data.synth import make_synthetic
    from cocos.objectives import get_objective
    from cocos.training.trainer import TrainConfig, Trainer

    assert get_objective("triplet").per_query(30.0, 10, 10) == 3.0
    assert get_objective("ntxent").per_query(1.5, 10, 10) == 1.5 and get_objective("smoothap").reduce == "mean"
    data = make_synthetic(tmp_path / "d", n_train=5, n_dev=4, n_test=4, feature_dim=8, seed=0)  # 25 captions
    for loss, per_row in (("triplet", True), ("ntxent", False)):
        trainer = Trainer(TrainConfig.of(data=str(data), out=str(tmp_path / loss), loss=loss, epochs=1, batch_size=11,
                                      embed_size=8, word_dim=8, device="cpu"), progress=False, log=lambda *a: None)
        trainer.train_epoch(1)
        rows = [(r["L_con"], r["L_con/query"]) for r in trainer.step_log]
        sizes = [11, 11, 3]
        assert len(rows) == 3
        for (total, per_query), b in zip(rows, sizes, strict=True):
            assert per_query == pytest.approx(total / b if per_row else total, rel=1e-12)
