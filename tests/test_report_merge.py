"""``cocos report``: loading, grouping by metadata, mean ± std over seeds, the CLI."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from cocos.errors import CocosError
from cocos.io import MARKER
from cocos.report.merge import build_tables as report_tables
from cocos.report.merge import cocos_vs_rsum_rows, load_results, shown_compat, stat_frame
from cocos.report.merge import group_results as _group_results
from cocos.report.tables import to_latex, to_markdown
from cocos.results import Results
from cocos_cli.main import app
from tests.test_report_tables import as_results, check_latex, make_results, md_cell, parse_markdown


def group_results(results):
    return _group_results([as_results(r) for r in results])


def load_result(path):
    return Results.read(path)

runner = CliRunner()


def write(path, results):
    path.write_text(json.dumps(results, indent=2, sort_keys=True))
    return path


def tables_by_number(tables):
    return {t.title.split(":")[0]: t for t in tables}


# --------------------------------------------------------------------------- loading


def test_load_results_keeps_content_and_source(tmp_path):
    r = make_results(seed=4)
    (loaded,) = load_results([write(tmp_path / "r.json", r)])
    assert loaded.path == str(tmp_path / "r.json")
    assert loaded.stats == r["stats"] and loaded.training.seed == 4 and loaded.source.sha256 == r["checkpoint"]["sha256"]
    # written in the current format and read back: the same record
    loaded.write(tmp_path / "v2.json")
    again = Results.read(tmp_path / "v2.json")
    assert again.to_dict() == loaded.to_dict() and again.format_version == 4


V2 = as_results(make_results()).to_dict()
BAD = {
    "missing": (None, "no such file"),
    "invalid_json": ('{"data": {', "invalid JSON"),
    "empty": ("", "invalid JSON"),
    "list": ("[1, 2]", "not a cocos results file"),
    "old_no_training": (json.dumps({k: v for k, v in make_results().items() if k != "training"}),
                        "an old format with missing parts"),
    "no_fingerprint": (json.dumps({**V2, "data": {"name": "f30k"}}), "missing data.path"),
    "stats_not_object": (json.dumps({**V2, "format_version": 3, "stats": [1]}), "'stats' must be an object"),
    "wrong_type": (json.dumps({**V2, "counting": {**V2["counting"], "batch_size": "128"}}),
                   "counting.batch_size must be an integer, got str"),
    "future": (json.dumps({**V2, "format_version": 99}), "format version 99 is not supported"),
    "other_format": (json.dumps({**V2, "format": "something"}), "not a cocos results file"),
    "bad_stat": (json.dumps({**V2, "format_version": 3, "stats": {"triplet": {"i2t": {"C_q": {"mean": "x"}}}}}),
                 "must be a number"),
    "v3_bad_sweep": (json.dumps({**V2, "format_version": 3, "sweep": {"triplet": {"i2t": {"0.01": {"C_q": 1}}}}}),
                     "sweep.triplet.i2t.0.01 must map statistics"),
    "v4_statistics_not_list": (json.dumps({**V2, "statistics": {}}), "'statistics' must be a list of records"),
    "v4_record_missing": (json.dumps({**V2, "statistics": [{"loss": "triplet"}]}),
                          "statistics[0] has no direction, mode, eps, stat, mean, std, n, n_skipped"),
    "v4_bad_mode": (json.dumps({**V2, "statistics": [{**V2["statistics"][0], "mode": "shown"}]}),
                    "statistics[0].mode must be one of corrected, compat"),
    "v4_bad_eps": (json.dumps({**V2, "statistics": [V2["statistics"][0], {**V2["statistics"][1], "eps": "0.01"}]}),
                   "statistics[1].eps must be a number or null"),
    "v4_repeated": (json.dumps({**V2, "statistics": [V2["statistics"][0], V2["statistics"][0]]}),
                    "statistics[1] repeats statistics[0]"),
    "v4_bad_count": (json.dumps({**V2, "statistics": [{**V2["statistics"][0], "n": -1}]}),
                     "statistics[0].n must be a count"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_results_file_is_one_cocos_error_line_naming_the_file(tmp_path, case):
    text, expected = BAD[case]
    path = tmp_path / f"{case}.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(CocosError) as info:
        load_results([write(tmp_path / "good.json", make_results()), path])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path)) and expected in message, message


def test_folder_and_no_paths(tmp_path):
    with pytest.raises(CocosError, match="folder"):
        load_result(tmp_path)
    with pytest.raises(CocosError, match="no results files"):
        load_results([])
    with pytest.raises(CocosError, match="without any results.json"):
        load_results([tmp_path])
    write(tmp_path / "x" / "results.json", make_results("triplet", 0)) if (tmp_path / "x").mkdir() is None else None
    (tmp_path / "y").mkdir()
    write(tmp_path / "y" / "results.json", make_results("triplet", 1))
    assert [r.training.seed for r in load_results([tmp_path])] == [0, 1]  # folders are searched, sorted


# --------------------------------------------------------------------------- grouping


def test_grouping_comes_from_metadata_not_file_names(tmp_path):
    # names suggest vsrn/smoothap and vsepp/triplet, contents say the opposite
    a = write(tmp_path / "vsrn_smoothap_seed0.json", make_results("triplet", 0, model="vsepp"))
    b = write(tmp_path / "vsrn_smoothap_seed1.json", make_results("triplet", 1, model="vsepp"))
    c = write(tmp_path / "vsepp_triplet_seed0.json", make_results("smoothap", 0, model="vsrn"))
    groups, warnings = group_results(load_results([a, b, c]))
    assert warnings == []
    assert [(g.dataset, g.model, g.loss, [r.replicate for r in g.results]) for g in groups] == [
        ("f30k", "VSE++", "triplet", [0, 1]), ("f30k", "VSRN", "smoothap", [0])]
    assert [r.path for r in groups[0].results] == [str(a), str(b)]


def test_rows_sorted_dataset_model_then_paper_loss_order():
    results = [make_results(loss, 0, dataset=ds, model=m)
               for ds in ("coco", "f30k") for m in ("vsrn", "vsepp")
               for loss in ("smoothap", "ntxent", "triplet_sh", "triplet")]
    groups, _ = group_results(results)
    assert [(g.dataset, g.model, g.loss) for g in groups][:5] == [
        ("f30k", "VSE++", "triplet"), ("f30k", "VSE++", "triplet_sh"), ("f30k", "VSE++", "ntxent"),
        ("f30k", "VSE++", "smoothap"), ("f30k", "VSRN", "triplet")]
    assert groups[8].dataset == "coco"
    t1 = report_tables(groups)[0]
    assert [row.labels for row in t1.rows][:2] == [("Flickr30k", "VSE++", "1", "Triplet loss", "α=0.2"),
                                                   ("Flickr30k", "VSE++", "2", "Triplet loss SH", "α=0.2")]
    assert t1.rows[-1].labels == ("MS-COCO", "VSRN", "16", "SmoothAP", "τ=0.01")


def test_warnings_for_duplicate_seed_and_fingerprints():
    results = [make_results("triplet", 1, checkpoint="a.pt"), make_results("triplet", 1, checkpoint="b.pt"),
               make_results("ntxent", 0)]
    with pytest.raises(CocosError, match=r"same seed \(1\) and configuration.*--label last"):
        group_results(results)  # e.g. model_best.pt and last.pt of one run: not two seeds
    labelled = as_results(results[1])
    labelled.model.label = "VSE++ (last)"
    groups, warnings = group_results([results[0], labelled, results[2]])
    assert [g.model for g in groups] == ["VSE++", "VSE++", "VSE++ (last)"] and warnings == []
    results = [make_results("triplet", 0, fingerprint="aaa"), make_results("ntxent", 0, fingerprint="bbb"),
               make_results("ntxent", 0, dataset="coco", fingerprint="ccc")]
    _, warnings = group_results(results)
    assert len(warnings) == 1 and "dataset 'f30k'" in warnings[0] and "aaa" in warnings[0] and "bbb" in warnings[0]
    _, warnings = group_results([make_results("triplet", 0), make_results("triplet", 1, compat=True)])
    assert len(warnings) == 1 and "different modes" in warnings[0]


# --------------------------------------------------------------------------- tables over seeds


def test_retrieval_mean_and_sample_std_over_seeds():
    groups, _ = group_results([make_results("triplet", 0, rsum=300.0), make_results("triplet", 1, rsum=310.0),
                               make_results("ntxent", 0, rsum=333.333)])
    t1 = report_tables(groups)[0]
    md = to_markdown(t1)
    header, rows, _ = parse_markdown(md)
    assert header[-2:] == ["rsum", "mAP@5"]
    assert md_cell(md, "Triplet loss", "rsum") == "305.0 ± 7.1"  # sample std (ddof 1): sqrt(50)
    assert md_cell(md, "Triplet loss", "i2t R@1") == "30.8 ± 0.0"
    assert md_cell(md, "NT-Xent", "rsum") == "333.3"  # one seed: the value alone
    assert "mean ± sample std over 2 seeds (rows of one seed: the value alone)" in t1.title
    tex = to_latex(t1)
    check_latex(tex)
    assert r"305.0$\pm$7.1" in tex and r"333.3 &" in tex  # the paper's compact style in LaTeX


def test_three_seeds_sample_std():
    groups, _ = group_results([make_results("triplet", s, rsum=v) for s, v in enumerate((300.0, 306.0, 312.0))])
    md = to_markdown(report_tables(groups)[0])
    assert md_cell(md, "Triplet loss", "rsum") == "306.0 ± 6.0"  # ddof 1; the population std would be 4.90


def test_cocos_cells_mean_over_seeds_of_each_checkpoints_mean_and_one_kind_of_spread_per_column():
    results = [make_results("triplet", 0, stats={("triplet", "i2t", "C_q"): (6.0, 0.9)}),
               make_results("triplet", 1, stats={("triplet", "i2t", "C_q"): (7.0, 0.1)}),
               make_results("triplet_sh", 0, stats={("triplet_sh", "t2i", "C_B"): (98.224, 4.661)})]
    groups, _ = group_results(results)
    t2 = tables_by_number(report_tables(groups))["Table 2"]
    md = to_markdown(t2)
    assert md_cell(md, "Triplet loss", "i2t C^q") == "6.50 ± 0.71"  # sample std over the 2 seeds' means
    assert md_cell(md, "Triplet loss", "t2i C^q") == "6.79 ± 0.00"
    # one seed in a table with seeds: the mean alone (its batch std is another kind of spread)
    assert md_cell(md, "Triplet loss SH", "t2i C^B") == "98.22"
    assert "mean ± sample std over 2 training seeds (rows of one seed: the mean alone)" in t2.title
    check_latex(to_latex(t2))


def test_each_group_shows_the_counter_of_its_own_training_loss():
    results = [make_results("smoothap", 0, stats={("smoothap", "i2t", "C_q"): (1.27, 0.06),
                                                  ("triplet", "i2t", "C_q"): (42.0, 1.0)}),
               make_results("ntxent", 0, stats={("ntxent", "i2t", "C_qv-"): (9.88, 0.51),
                                                ("smoothap", "i2t", "C_q"): (55.0, 1.0)})]
    groups, _ = group_results(results)
    tables = tables_by_number(report_tables(groups))
    assert set(tables) == {"Table 1", "Table 3", "Table 4", "Companions"}  # no triplet-trained group
    t4 = to_markdown(tables["Table 4"])
    header, rows, _ = parse_markdown(t4)
    assert header[0] == "Loss" and [r[0] for r in rows] == ["SmoothAP"]  # one dataset and model: in the caption
    assert ": VSE++ on Flickr30k;" in tables["Table 4"].title
    assert md_cell(t4, "SmoothAP", "i2t C^q") == "1.27 ± 0.06"
    t3 = to_markdown(tables["Table 3"])
    assert [r[0] for r in parse_markdown(t3)[1]] == ["NT-Xent"]
    assert md_cell(t3, "NT-Xent", "i2t C^qv-") == "9.88 ± 0.51"
    assert check_latex("\n".join(to_latex(t) for t in tables.values())) == 4


def test_merged_footnotes_for_alt_values_and_mode_choice():
    # counted corrected, the compat value differs for SmoothAP t2i C^0
    results = [make_results("smoothap", s, alt={("smoothap", "t2i", "C_0"): (v, 18.0)})
               for s, v in enumerate((636.0, 638.0))]
    groups, _ = group_results(results)
    t4 = tables_by_number(report_tables(groups))["Table 4"]
    note = t4.footnotes[0].text
    # two seeds: the other mode's value carries the same kind of spread as the cells (sample std over seeds)
    assert note == "Counting: corrected. † differs in compat (published counter) counting: SmoothAP t2i C^0 637.00±1.41."
    assert any("C^0 ≈ 637 of 640" in f.text for f in t4.footnotes)
    # the same files shown in compat mode: the corrected value in the footnote
    t4c = tables_by_number(report_tables(groups, compat=True))["Table 4"]
    assert t4c.footnotes[0].text.startswith("Counting: compat (published counter). †")
    assert md_cell(to_markdown(t4c), "SmoothAP", "t2i C^0") == "637.00 ± 1.41<sup>†</sup>"
    assert "differs in corrected counting: SmoothAP t2i C^0 2.15±.00." in t4c.footnotes[0].text
    # no difference, corrected: no mark and no artefact note
    groups, _ = group_results([make_results("smoothap", 0)])
    t4 = tables_by_number(report_tables(groups))["Table 4"]
    assert t4.footnotes[0].text == "Counting: corrected."
    assert not any("published counter" in f.text for f in t4.footnotes)


def test_a_mode_not_counted_is_a_clear_error():
    r = make_results()
    r["alt_stats"] = None
    r = as_results(r)
    assert r.alt_stats is None and r.modes() == {"corrected"}
    assert shown_compat(r, None) is False and shown_compat(r, False) is False
    with pytest.raises(CocosError, match="no compat"):
        shown_compat(r, True)
    groups, _ = _group_results([r])
    frame = stat_frame(groups)
    assert set(frame["which"]) == {"shown"} and not frame["compat"].any()


def test_cocos_vs_rsum_rows():
    results = [make_results("triplet", 0, rsum=300.0, stats={("triplet", "i2t", "C_q"): (6.0, 1.0)}),
               make_results("triplet", 1, rsum=310.0, stats={("triplet", "i2t", "C_q"): (8.0, 1.0)}),
               make_results("ntxent", 0, rsum=340.0, stats={("ntxent", "i2t", "C_qv-"): (9.88, 0.5)})]
    groups, _ = group_results(results)
    rows = cocos_vs_rsum_rows(groups)
    i2t = rows[rows.direction == "i2t"]
    assert list(zip(i2t.label, i2t.rsum, i2t.cocos, i2t.stat, strict=True)) == [
        ("Flickr30k VSE++ Triplet loss", 305.0, 7.0, "C_q"), ("Flickr30k VSE++ NT-Xent", 340.0, 9.88, "C_qv-")]


# --------------------------------------------------------------------------- CLI


def test_cli_report_writes_tables_and_figure(tmp_path):
    a = write(tmp_path / "a.json", make_results("triplet", 0, rsum=300.0, dataset="my_data"))
    b = write(tmp_path / "b.json", make_results("triplet", 1, rsum=310.0, dataset="my_data"))
    out = tmp_path / "reports" / "summary"
    res = runner.invoke(app, ["report", str(a), str(b), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == ["cocos_vs_rsum.pdf", "cocos_vs_rsum.png",
                                                     "index.html", "tables.md", "tables.tex"]
    assert "305.0 ± 7.1" in res.stdout and str(out / "tables.md") in res.stdout
    md = (out / "tables.md").read_text()
    assert md_cell(md[md.index("**Table 1"):], "Triplet loss", "rsum") == "305.0 ± 7.1"
    assert "**Table 2" in md and "**Table 3" not in md
    tex = (out / "tables.tex").read_text()
    assert check_latex(tex) == 3  # Table 1, Table 2, companions
    assert r"my\_data" in tex
    assert (out / "cocos_vs_rsum.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.parent.iterdir() if p.name != "summary"]  # no temporary siblings


def test_cli_report_bad_file_exit_2_one_line_nothing_written(tmp_path):
    a = write(tmp_path / "a.json", make_results("triplet", 0))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tmp_path / "reports" / "summary"
    res = runner.invoke(app, ["report", str(a), str(bad), "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "bad.json" in lines[0], res.output
    assert not out.exists()
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").iterdir())
    # an existing report is left untouched
    out.mkdir(parents=True)
    (out / "tables.md").write_text("old\n")
    res = runner.invoke(app, ["report", str(tmp_path / "missing.json"), "--out", str(out)])
    assert res.exit_code == 2 and "no such file" in res.output
    assert (out / "tables.md").read_text() == "old\n"
    assert [p.name for p in out.parent.iterdir()] == ["summary"]


def test_cli_report_counting_mode_option(tmp_path):
    a = write(tmp_path / "a.json", make_results("smoothap", 0, alt={("smoothap", "t2i", "C_0"): (636.72, 18.72)}))
    out = tmp_path / "o"
    res = runner.invoke(app, ["report", str(a), "--out", str(out), "--counting", "compat"])
    assert res.exit_code == 0, res.output
    md = (out / "tables.md").read_text()
    assert md_cell(md[md.index("**Table 4"):], "SmoothAP", "t2i C^0") == "636.72 ± 18.72<sup>†</sup>"
    res = runner.invoke(app, ["report", str(a), "--out", str(out), "--counting", "both"])
    assert res.exit_code == 2 and "unknown counting mode" in res.output


def test_cli_report_failure_while_writing_leaves_no_partial_folder(tmp_path, monkeypatch):
    import cocos.report.merge as merge

    def boom(rows, path_stem, **kwargs):
        raise CocosError("cannot draw the figure")

    monkeypatch.setattr(merge, "plot_cocos_vs_rsum", boom)  # where the report calls it
    a = write(tmp_path / "a.json", make_results("triplet", 0))
    out = tmp_path / "reports" / "summary"
    res = runner.invoke(app, ["report", str(a), "--out", str(out)])
    assert res.exit_code == 2 and "cannot draw the figure" in res.output
    assert not out.exists() and not (tmp_path / "reports").exists()  # the parent it made is gone again too
    out.mkdir(parents=True)
    (out / "tables.md").write_text("old\n")
    res = runner.invoke(app, ["report", str(a), "--out", str(out)])
    assert res.exit_code == 2
    assert [p.name for p in out.iterdir()] == ["tables.md"] and (out / "tables.md").read_text() == "old\n"
    assert [p.name for p in out.parent.iterdir()] == ["summary"]


def test_the_same_analysis_twice_and_unlike_counting_are_refused(tmp_path):
    a = make_results("triplet", seed=0)
    with pytest.raises(CocosError, match="same checkpoint"):
        group_results([a, copy.deepcopy(a)])
    b = make_results("triplet", seed=1)
    b["counting"] = {**b["counting"], "batch_size": 64}
    with pytest.raises(CocosError, match="different settings"):
        group_results([a, b])


def test_report_never_replaces_what_cocos_did_not_write(tmp_path):
    a = write(tmp_path / "a.json", make_results("triplet", 0))
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter.tex").write_text("mine\n")
    res = runner.invoke(app, ["report", str(a), "--out", str(mine)])
    assert res.exit_code == 2 and "not written by cocos" in res.output
    assert (mine / "chapter.tex").read_text() == "mine\n"
    # the output folder may not contain an input
    inside = tmp_path / "runs"
    inside.mkdir()
    b = write(inside / "b.json", make_results("ntxent", 0))
    res = runner.invoke(app, ["report", str(b), "--out", str(inside), "--overwrite"])
    assert res.exit_code == 2 and "would replace the input" in res.output and b.exists()
    # a report is replaced only with --overwrite; the user's own folder never, not even with --overwrite
    out = tmp_path / "rep"
    assert runner.invoke(app, ["report", str(a), "--out", str(out)]).exit_code == 0
    res = runner.invoke(app, ["report", str(a), "--out", str(out)])
    assert res.exit_code == 2 and "--overwrite" in res.output
    assert runner.invoke(app, ["report", str(a), "--out", str(out), "--overwrite"]).exit_code == 0
    res = runner.invoke(app, ["report", str(a), "--out", str(mine), "--overwrite"])
    assert res.exit_code == 2 and "not written by cocos" in res.output
    assert sorted(p.name for p in mine.iterdir()) == ["chapter.tex"]


def test_count_results_of_one_file_with_other_labels_or_parameters_are_not_duplicates(tmp_path):
    import numpy as np

    g = np.random.default_rng(0)
    images = g.normal(size=(40, 6))
    np.savez(tmp_path / "e.npz", images=images, captions=np.repeat(images, 5, 0) + g.normal(size=(200, 6)))
    base = ["count", str(tmp_path / "e.npz"), "--batch-size", "8", "--no-progress", "--loss", "ntxent"]
    assert runner.invoke(app, [*base, "--json", str(tmp_path / "a.json")]).exit_code == 0
    res = runner.invoke(app, [*base, "-p", "tau=0.05", "--label", "Modèle τ 0.05", "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["report", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    tex = (tmp_path / "r" / "tables.tex").read_text()
    assert tex.isascii() and "Modele $\\tau$ 0.05" in tex  # a user's non-ASCII label still compiles
    # the same file counted the same way twice is refused, with a hint that works for count results too
    assert runner.invoke(app, [*base, "--json", str(tmp_path / "c.json")]).exit_code == 0
    res = runner.invoke(app, ["report", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--out", str(tmp_path / "r2")])
    assert res.exit_code == 2 and "in the same way" in res.output


@pytest.mark.parametrize("patch, message", [
    (lambda d: d["statistics"][0].update(n="abc"), "statistics[0].n must be a count"),
    (lambda d: d["counting"]["params"].update(ntxent=3), "counting.params.ntxent"),
    (lambda d: d["counting"]["params"].update(ntxent={"eps": "x"}), "counting.params.ntxent.eps must be a number"),
    (lambda d: d["counting"].update(losses=[1, 2]), "counting.losses must be names"),
    (lambda d: d["evaluation"]["metrics"].update(rsum="high"), "evaluation.metrics must hold numbers"),
])
def test_nested_values_of_a_results_file_are_checked_in_one_line(tmp_path, patch, message):
    data = copy.deepcopy(V2)
    patch(data)
    path = write(tmp_path / "bad.json", data)
    with pytest.raises(CocosError) as err:
        load_result(path)
    text = str(err.value)
    assert message in text and "\n" not in text and text.count("not a cocos results file") == 1


def test_label_columns_the_same_in_every_row_go_to_the_title_once():
    # one run's checkpoints (--label epoch): dataset and training loss are constant, only the model label varies
    results = [as_results(make_results("triplet_sh", 0, model="vsepp", checkpoint=f"runs/sh/epoch_{e}.pt"))
               for e in (1, 2)]
    for e, r in zip((1, 2), results, strict=True):
        r.model.label = f"VSE++ (epoch {e})"
    groups, _ = _group_results(results)
    t2 = next(t for t in report_tables(groups, counters="all") if t.title.startswith("Table 2"))
    assert t2.label_columns == ("Model", "Counter")
    assert t2.title.endswith("(dataset Flickr30k, loss Triplet loss SH)")
    assert [r.labels for r in t2.rows][:2] == [("VSE++ (epoch 1)", "Triplet loss"), ("VSE++ (epoch 1)", "Triplet loss SH")]
