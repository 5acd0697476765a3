"""One results model: the statistics as records (format 4), read from the nested trees of formats 1-3, one
aggregation over seeds, and reports that stay byte-identical to those the nested format gave."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cocos.counting import EmbeddingSet, count_embeddings
from cocos.errors import CocosError
from cocos.pipelines.analyze import run_counts
from cocos.pipelines.folder import folder_tables
from cocos.report.figures import plot_eps_sweep
from cocos.report.groups import over_seeds
from cocos.report.merge import build_report, cocos_vs_rsum_rows, epoch_rows, render_report
from cocos.results import FORMAT_VERSION, STAT_COLUMNS, Results, record_order, records, records_from_trees
from tests.test_fuzz_readers import _expect, json_values

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "reports" / "example"
# the example as the nested-statistics code (format 3) wrote it, with the tables today's code renders of it
V3 = ROOT / "tests" / "fixtures" / "results_v3"
LOSSES = ("triplet", "triplet_sh", "ntxent", "smoothap")


def v3(loss: str) -> dict:
    """A results.json of format 3 (the committed example as the nested-statistics code wrote it)."""
    data = json.loads((V3 / loss / "results.json").read_text())
    assert data["format_version"] == 3 and "statistics" not in data
    return data


def as_v4(data: dict, path: Path) -> Path:
    """``data`` read (any version) and written in the current format."""
    Results.from_dict(copy.deepcopy(data)).write(path)
    return path


def entry(mean, std=0.0, n=4, skipped=0):
    return {"mean": mean, "std": std, "n": n, "n_skipped": skipped}


# --------------------------------------------------------------------------- formats 1-3 as records


def test_nested_trees_become_records_by_hand():
    stats = {"ntxent": {"i2t": {"C_qv-": entry(9.0, 1.0), "W_qv-": entry(0.5)}},
             "triplet": {"i2t": {"C_q": entry(None, 0.3, n=0, skipped=4)}}}
    alt = {"ntxent": {"i2t": {"C_qv-": entry(8.0)}}}
    sweep = {"ntxent": {"i2t": {"0.1": {"C_qv-": entry(2.0)}, "0.01": {"C_qv-": entry(9.000001)}}}}
    params = {"ntxent": {"tau": 0.1, "eps": 0.01}, "triplet": {"margin": 0.2}}
    got = records_from_trees(stats, alt, sweep, compat=True, params=params)
    key = [(r["loss"], r["direction"], r["mode"], r["eps"], r["stat"]) for r in got]
    assert key == [("ntxent", "i2t", "compat", 0.01, "C_qv-"),  # stats are the file's own mode (compat here)
                   ("ntxent", "i2t", "compat", 0.01, "W_qv-"),
                   ("ntxent", "i2t", "compat", 0.1, "C_qv-"),  # the sweep, at its thresholds
                   ("ntxent", "i2t", "corrected", 0.01, "C_qv-"),  # alt_stats: the other mode
                   ("triplet", "i2t", "compat", None, "C_q")]  # no threshold: eps null
    assert got[0]["mean"] == 9.0  # the sweep's entry at the own threshold repeats stats: stats is kept
    assert got[-1] == {"loss": "triplet", "direction": "i2t", "mode": "compat", "eps": None, "stat": "C_q",
                       "mean": None, "std": None, "n": 0, "n_skipped": 4}  # no batch entered: no std either
    assert records_from_trees(stats, None, {}, compat=False, params=params)[0]["mode"] == "corrected"


@pytest.mark.parametrize("loss", LOSSES)
def test_a_format_3_file_reads_into_records_whose_views_are_its_trees(loss, tmp_path):
    data = v3(loss)
    r = Results.from_dict(copy.deepcopy(data))
    assert r.format_version == FORMAT_VERSION == 4
    assert r.statistics == sorted(r.statistics, key=record_order)
    assert r.stats == data["stats"] and r.alt_stats == data["alt_stats"] and r.sweep == data["sweep"]
    written = json.loads(as_v4(data, tmp_path / "v4.json").read_text())
    assert {"stats", "alt_stats", "sweep"}.isdisjoint(written) and written["format_version"] == 4
    assert all(list(rec) == sorted(STAT_COLUMNS) for rec in written["statistics"])  # keys sorted in the file
    again = Results.read(tmp_path / "v4.json")
    assert again.statistics == r.statistics and again.stats == data["stats"] and again.sweep == data["sweep"]


def test_views_of_hand_written_records():
    def rec(loss, d, mode, eps, stat, mean):
        return {"loss": loss, "direction": d, "mode": mode, "eps": eps, "stat": stat, "mean": mean, "std": 0.5,
                "n": 3, "n_skipped": 0}

    data = v3("ntxent")
    data.update(format_version=4, statistics=[
        rec("ntxent", "i2t", "corrected", 0.1, "C_qv-", 1.0), rec("ntxent", "i2t", "corrected", 0.01, "C_qv-", 5.0),
        rec("ntxent", "i2t", "corrected", 0.001, "C_qv-", 9.0), rec("ntxent", "i2t", "compat", 0.01, "C_qv-", 4.0),
        rec("ntxent", "i2t", "corrected", 0.01, "W_low", 0.2), rec("triplet", "t2i", "corrected", None, "C_q", 7.0)])
    for key in ("stats", "alt_stats", "sweep"):
        data.pop(key)
    data["counting"]["params"] = {"ntxent": {"eps": 0.01, "tau": 0.1}, "triplet": {"margin": 0.2}}
    r = Results.from_dict(data)
    main = r.main()
    assert sorted(zip(main["loss"], main["stat"], main["mean"], strict=True)) == [
        ("ntxent", "C_qv-", 5.0), ("ntxent", "W_low", 0.2), ("triplet", "C_q", 7.0)]
    assert r.main("compat")["mean"].tolist() == [4.0]
    sweep = r.sweep_frame()
    assert sweep["eps"].tolist() == [0.001, 0.01, 0.1] and sweep["mean"].tolist() == [9.0, 5.0, 1.0]  # W_low: not swept
    assert r.stats == {"ntxent": {"i2t": {"C_qv-": entry(5.0, 0.5, 3), "W_low": entry(0.2, 0.5, 3)}},
                       "triplet": {"t2i": {"C_q": entry(7.0, 0.5, 3)}}}
    assert r.alt_stats == {"ntxent": {"i2t": {"C_qv-": entry(4.0, 0.5, 3)}}}
    assert list(r.sweep["ntxent"]["i2t"]) == ["0.001", "0.01", "0.1"]


# --------------------------------------------------------------------------- the writer: the engine's summary


def test_records_are_the_summary_of_every_batch_both_modes_and_the_sweep():
    g = np.random.default_rng(1)
    images = g.normal(size=(24, 6))
    emb = EmbeddingSet.from_arrays(images, np.repeat(images, 3, 0) + g.normal(size=(72, 6)))
    sweep = (0.005, 0.01, 0.1)
    run = run_counts(emb, ["triplet", "ntxent"], batch_size=6, seed=2, compat=False, params={}, eps=None,
                     sweep_eps=sweep, progress=False, keep_per_query=False)
    got = records(run.summary())
    assert got == sorted(got, key=record_order)
    b = run.batches
    assert len(got) == len(b.groupby(["loss", "direction", "mode", "eps", "stat"], dropna=False))
    for r in got:  # each record against numpy over the batch rows (an independent computation)
        rows = b[(b["loss"] == r["loss"]) & (b["direction"] == r["direction"]) & (b["mode"] == r["mode"])
                 & (b["stat"] == r["stat"]) & (b["eps"].isna() if r["eps"] is None else b["eps"] == r["eps"])]
        v = rows["value"].to_numpy()
        ok = v[~np.isnan(v)]
        assert (r["n"], r["n_skipped"]) == (ok.size, v.size - ok.size)
        assert r["mean"] == pytest.approx(ok.mean(), rel=1e-12) and r["std"] == pytest.approx(ok.std(), abs=1e-12)
    assert {r["eps"] for r in got if r["loss"] == "triplet"} == {None}  # no threshold
    swept = {(r["mode"], r["eps"]) for r in got if r["loss"] == "ntxent" and r["stat"] == "C_qv-"}
    assert swept == {(m, e) for m in ("corrected", "compat") for e in sweep}  # the sweep in both modes


# --------------------------------------------------------------------------- the one aggregation over seeds


def test_over_seeds_by_hand():
    frame = pd.DataFrame({"k": ["a", "a", "a", "b", "c", "c"], "value": [1.0, 3.0, np.nan, 5.0, np.nan, np.nan]})
    got = over_seeds(frame, ["k"]).set_index("k")
    assert got.loc["a", "mean"] == 2.0 and got.loc["a", "std"] == pytest.approx(math.sqrt(2.0))  # ddof 1, NaN out
    assert got.loc["b", "mean"] == 5.0 and np.isnan(got.loc["b", "std"])  # one value: no spread
    assert np.isnan(got.loc["c", "mean"]) and got["replicates"].tolist() == [3, 1, 2]
    assert list(over_seeds(frame.iloc[:0], ["k"]).columns) == ["k", "mean", "std", "replicates"]


# --------------------------------------------------------------------------- reports stay byte-identical


@pytest.mark.parametrize("loss", LOSSES)
def test_folder_tables_of_a_format_3_file_and_its_format_4_copy_equal_the_committed_ones(loss, tmp_path):
    """The tables of the format-3 file, as today's code renders them (tests/fixtures/results_v3), from the file and
    from its format-4 copy."""
    data = v3(loss)
    old = folder_tables(Results.from_dict(copy.deepcopy(data)))
    new = folder_tables(Results.read(as_v4(data, tmp_path / "results.json")))
    assert old == new == ((V3 / loss / "tables.md").read_text(), (V3 / loss / "tables.tex").read_text())


def _replicates(tmp_path: Path, v4: bool) -> list[Path]:
    """The format-3 example, two more seeds of triplet and smoothap (scaled values, one statistic missing in a
    replicate) and two epochs of triplet_sh: in format 3, or each converted to format 4."""
    files = []
    for loss in LOSSES:
        base = v3(loss)
        variants = [(0, 1.0, None)] + ([(1, 1.07, None), (2, 0.95, None)] if loss in ("triplet", "smoothap") else [])
        variants += [(0, 0.9, 3)] if loss == "triplet_sh" else []
        for seed, f, epoch in variants:
            d = copy.deepcopy(base)
            d["training"]["seed"] = seed
            if epoch is not None:  # an earlier checkpoint of the run: its own row
                d["source"]["epoch"] = epoch
                d["model"]["label"] += " (early)"
            d["source"]["sha256"] = hashlib.sha256(f"{loss}{seed}{epoch}".encode()).hexdigest()
            for tree in (d["stats"], d["alt_stats"]):
                for e in (e for by_d in tree.values() for by_s in by_d.values() for e in by_s.values()):
                    e["mean"] = None if e["mean"] is None else e["mean"] * f
            if seed == 2:
                del d["stats"]["smoothap"]["t2i"]["C_B"]
            d["evaluation"]["metrics"] = {k: v * f for k, v in d["evaluation"]["metrics"].items()}
            path = tmp_path / f"{loss}_{seed}_{epoch}.json"
            if v4:
                as_v4(d, path)
            else:
                path.write_text(json.dumps(d))
            files.append(path)
    return files


@pytest.mark.parametrize("options", [{}, {"counters": "all", "compat": True}, {"label": "epoch"}])
def test_a_report_over_seeds_renders_the_same_from_format_3_and_format_4(tmp_path, options):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    old = build_report(_replicates(tmp_path / "a", v4=False), **options)
    new = build_report(_replicates(tmp_path / "b", v4=True), **options)
    strip = str(tmp_path)
    for width in ("column", "page"):
        a, b = ([text.replace(f"{strip}/a", "").replace(f"{strip}/b", "") for text in render_report(rep, width)]
                for rep in (old, new))
        assert a == b
    assert "mean ± sample std over 3 training seeds" in a[0]  # the cells aggregate seeds
    pd.testing.assert_frame_equal(cocos_vs_rsum_rows(old.groups, old.compat), cocos_vs_rsum_rows(new.groups, new.compat))
    pd.testing.assert_frame_equal(epoch_rows(old.groups, old.compat), epoch_rows(new.groups, new.compat))


def test_the_eps_sweep_figure_draws_the_format_3_sweep(tmp_path, monkeypatch):
    import cocos.report.style as style

    monkeypatch.setattr(style, "save", lambda fig, stem: [])  # the drawn data, not the files
    data = v3("smoothap")
    r = Results.read(as_v4(data, tmp_path / "results.json"))
    out = plot_eps_sweep(r.sweep_frame(), tmp_path / "sweep", looks=r.presentation)
    for loss, stat in (("ntxent", "C_qv-"), ("smoothap", "C_q")):
        for d in ("i2t", "t2i"):
            points = sorted((float(e), s[stat]["mean"]) for e, s in data["sweep"][loss][d].items())
            x, y = out.data[(loss, d)]
            assert x.tolist() == [p[0] for p in points] and y.tolist() == [p[1] for p in points]
    assert {k for k in out.data if isinstance(k, tuple)} == {(x, d) for x in ("ntxent", "smoothap")
                                                             for d in ("i2t", "t2i")}


def test_count_on_the_records_matches_the_library(tmp_path):
    """The terminal summary reads the table: every counter's main statistics at its own threshold."""
    from cocos.pipelines.folder import summary_lines

    g = np.random.default_rng(0)
    images = g.normal(size=(12, 4))
    run = count_embeddings(EmbeddingSet.from_arrays(images, np.repeat(images, 2, 0)), ["triplet", "ntxent"],
                           batch_size=4, modes=["corrected", "compat"])
    data = v3("triplet")
    data.update(format_version=4, statistics=records(run.summary()))
    data["counting"].update(losses=["triplet", "ntxent"], params=run.params)
    lines = summary_lines(Results.from_dict(data))[1:]
    stats = run.stats()
    assert lines[0].split()[:3] == ["triplet", "i2t", "C_q"] and lines[1].split()[0] == "ntxent"
    assert f"C_q {stats['triplet']['i2t']['C_q']['mean']:.2f}" in lines[0]
    assert f"C_qv- {stats['ntxent']['t2i']['C_qv-']['mean']:.2f}" in lines[1]


def test_count_rows_by_hand():
    from cocos.pipelines.count import count_rows

    rows = [("t2i", "n_excluded", 2.0, 0.5, 0), ("i2t", "zeta", 1.0, np.nan, 0), ("i2t", "C_q", 3.25, 1.0, 2),
            ("t2i", "zeta", np.nan, np.nan, 4), ("i2t", "n_excluded", 1.0, 0.0, 0), ("t2i", "C_q", 2.0, 0.0, 0)]
    frame = pd.DataFrame(rows, columns=["direction", "stat", "mean", "std", "n_skipped"])
    assert count_rows(frame) == [("C_q", "3.25 ± 1.00 (2 skipped)", "2.00 ± 0.00"),  # the paper's first
                                 ("n_excluded", "1.00 ± 0.00", "2.00 ± 0.50"),
                                 ("zeta", "1.00", "n/a (4 skipped)")]  # then others by name


FUZZ_FIELDS = st.sampled_from([*STAT_COLUMNS, None])  # None: the whole list


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values, field=FUZZ_FIELDS, index=st.integers(0, 400))
def test_fuzzed_records_are_read_or_refused_in_one_line(value, field, index):
    data = Results.from_dict(v3("ntxent")).to_dict()
    if field is None:
        data["statistics"] = value
    else:
        data["statistics"][index % len(data["statistics"])][field] = value
    results = _expect(lambda: Results.from_dict(data))
    if results is not None:  # accepted: its tables can be built
        folder_tables(results)


def test_names_with_line_breaks_stay_on_one_line_in_errors():
    data = v3("ntxent")
    data["stats"]["bad\nname"] = None  # version 3
    with pytest.raises(CocosError) as info:
        Results.from_dict(data)
    assert "\n" not in str(info.value) and "'bad\\nname' must be an object" in str(info.value)
    data = Results.from_dict(v3("ntxent")).to_dict()  # version 4: a repeated record of such a loss
    data["statistics"] = [{**data["statistics"][0], "loss": "bad\nname"}] * 2
    with pytest.raises(CocosError) as info:
        Results.from_dict(data)
    assert "\n" not in str(info.value) and "repeats statistics[0]: 'bad\\nname', i2t" in str(info.value)


def test_the_committed_example_is_in_the_current_format():
    """reports/example is regenerated whenever the results format moves on (its format-3 predecessor is kept as a
    fixture for the readers of old files)."""
    for loss in LOSSES:
        data = json.loads((EXAMPLE / loss / "results.json").read_text())
        assert data["format_version"] == FORMAT_VERSION, loss
        assert (EXAMPLE / loss / "index.html").is_file(), loss
    assert (EXAMPLE / "summary" / "index.html").is_file()
