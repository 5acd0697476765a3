"""Tables of one results.json: markdown that parses, LaTeX that is structurally valid, footnotes."""

from __future__ import annotations

import copy
import hashlib
import re

import pytest

from cocos.report.merge import cocos_tables as _cocos_tables
from cocos.report.merge import group_results
from cocos.report.merge import retrieval_table as _retrieval_table
from cocos.report.tables import (
    Cell,
    Column,
    Row,
    Table,
    fmt,
    latex_escape,
    to_latex,
    to_markdown,
)
from cocos.results import Results


def as_results(r) -> Results:
    return r if isinstance(r, Results) else Results.from_dict(copy.deepcopy(r))


def cocos_tables(r):
    """The COCOS tables of ONE result (a group of one, every counter it was counted with)."""
    groups, _ = group_results([as_results(r)])
    return _cocos_tables(groups, counters="all")


def retrieval_table(r):
    groups, _ = group_results([as_results(r)])
    return _retrieval_table(groups)

# --------------------------------------------------------------------------- fixtures

BASE_STATS = {
    "triplet": {"C_q": (6.79, 0.83), "C_B": (768.92, 96.87), "C_0": (14.78, 3.52)},
    "triplet_sh": {"C_q": (1.0, 0.0), "C_B": (98.74, 4.83), "C_0": (29.23, 4.81)},
    "ntxent": {"C_qv-": (9.88, 0.51), "W_qv-": (0.42, 0.02), "W_qv+": (0.56, 0.02), "W_low": (0.013, 0.004)},
    "smoothap": {"C_q": (1.27, 0.06), "C_0": (2.15, 1.51), "C_B": (160.0, 8.0)},
}
COMPANIONS = {"N_eff": (3.5, 0.4), "N_invsimpson": (2.9, 0.3), "top1_share": (0.61, 0.05)}
METRICS = {"i2t_R@1": 30.8, "i2t_R@5": 62.6, "i2t_R@10": 74.1, "mAP@5": 0.41, "t2i_R@1": 23.4,
           "t2i_R@5": 52.8, "t2i_R@10": 65.7, "i2t_Rprec": 0.3, "t2i_Rprec": 0.234}


def entry(mean, std, n=50, n_skipped=0):
    return {"mean": mean, "std": std, "n": n, "n_skipped": n_skipped}


def make_results(loss="triplet", seed=0, *, rsum=None, dataset="f30k", model="vsepp", fingerprint="fp0",
                 compat=False, losses=("triplet", "triplet_sh", "ntxent", "smoothap"), stats=None,
                 alt=None, metrics=None, checkpoint="runs/f30k/model_best.pt"):
    """A valid results.json dict from a few numbers.

    ``stats`` / ``alt``: ``{(loss, direction, stat): (mean, std)}`` overrides of the
    shown mode / the other mode (``alt_stats`` equals ``stats`` otherwise).
    """
    shown = {}
    for name in losses:
        shown[name] = {}
        for d in ("i2t", "t2i"):
            values = {**BASE_STATS[name], **COMPANIONS}
            shown[name][d] = {s: entry(*v) for s, v in values.items()}
    for (name, d, s), v in (stats or {}).items():
        shown[name][d][s] = entry(*v)
    other = copy.deepcopy(shown)
    for (name, d, s), v in (alt or {}).items():
        other[name][d][s] = entry(*v)
    m = dict(METRICS if metrics is None else metrics)
    if rsum is not None:
        m["rsum"] = rsum
    m.setdefault("rsum", sum(m[f"{d}_R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)))
    return {
        "cocos_version": "0.1.0",
        "checkpoint": {"path": checkpoint, "epoch": 7,
                       "sha256": hashlib.sha256(f"{dataset}/{model}/{loss}/{seed}/{checkpoint}".encode()).hexdigest()},
        "data": {"path": f"/data/{dataset}", "name": dataset, "fingerprint": fingerprint, "k": 5,
                 "split_counted": "train", "n_images": 1000, "n_captions": 5000},
        "model": {"kind": model, "hparams": {"embed_size": 64}},
        "training": {"loss": loss, "params": {"margin": 0.2}, "seed": seed},
        "counting": {"compat": compat, "seed": 0, "batch_size": 128, "n_batches": {"pair": 40, "ranking": 8},
                     "losses": list(losses), "params": {"ntxent": {"tau": 0.1, "eps": 0.01}}},
        "stats": shown,
        "alt_stats": other,
        "sweep": {},
        "evaluation": {"split": "test", "metrics": m},
    }


# --------------------------------------------------------------------------- structural checkers


def split_md_row(line: str) -> list[str]:
    assert line.startswith("|") and line.endswith("|"), line
    cells = re.split(r"(?<!\\)\|", line[1:-1])
    return [c.strip() for c in cells]


def parse_markdown(md: str) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, lines after) of the first pipe table in ``md``; asserts it is well formed."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    header = split_md_row(lines[start])
    sep = split_md_row(lines[start + 1])
    assert all(re.fullmatch(r":?-{2,}:?", c) for c in sep), lines[start + 1]
    rows = [split_md_row(line) for line in lines[start + 2:end]]
    assert len(sep) == len(header)
    for row in rows:
        assert len(row) == len(header), (row, header)
    return header, rows, lines[end:]


def md_cell(md: str, row_label: str, column: str) -> str:
    header, rows, _ = parse_markdown(md)
    row = next(r for r in rows if row_label in r)
    return row[header.index(column)]


def _strip_math(text: str) -> str:
    return re.sub(r"\$[^$]*\$", "", text)


def check_latex(tex: str) -> int:
    """Assert the structure of every table float in ``tex``; return how many there are."""
    stack = []
    for kind, name in re.findall(r"\\(begin|end)\{([^}]*)\}", tex):
        if kind == "begin":
            stack.append(name)
        else:
            assert stack and stack[-1] == name, f"unbalanced \\end{{{name}}}"
            stack.pop()
    assert not stack, f"unclosed {stack}"
    tables = re.findall(r"\\begin\{table\}.*?\\end\{table\}", tex, flags=re.S)
    assert tables
    for t in tables:
        assert t.count(r"\toprule") == 1 and t.count(r"\midrule") >= 1 and t.count(r"\bottomrule") == 1
        assert t.count(r"\caption{") == 1 and t.count(r"\label{tab:") == 1
        m = re.search(r"\\begin\{tabular\}\{([lrc]+)\}(.*?)\\end\{tabular\}", t, flags=re.S)
        assert m, "no tabular with a column spec"
        n_cols = len(m.group(1))
        body = re.sub(r"\\(toprule|midrule|bottomrule)", "", m.group(2))
        body = re.sub(r"\\cmidrule\(lr\)\{\d+-\d+\}", "", body)
        rows = [r.strip() for r in body.split(r"\\") if r.strip()]
        assert len(rows) >= 2
        for row in rows:
            cells = re.split(r"(?<!\\)&", row)
            width = 0
            for c in cells:
                mc = re.match(r"\s*\\multicolumn\{(\d+)\}", c)
                width += int(mc.group(1)) if mc else 1
            assert width == n_cols, (row, n_cols)
            assert "_" not in _strip_math(row).replace(r"\_", ""), f"unescaped underscore in {row}"
        for rule in re.findall(r"\\cmidrule\(lr\)\{(\d+)-(\d+)\}", t):
            assert 1 <= int(rule[0]) <= int(rule[1]) <= n_cols
    return len(tables)


# --------------------------------------------------------------------------- tests


def test_fmt():
    assert fmt(6.789, 0.834) == "6.79 ± 0.83"
    assert fmt(636.7249, 18.7151) == "636.72 ± 18.72"
    assert fmt(None, 1.0) == "n/a"
    assert fmt(float("nan"), 1.0) == "n/a"
    assert fmt(305.0, None) == "305.00"
    assert fmt(0.5, 0.25, digits=1) == "0.5 ± 0.2"


def test_markdown_tables_parse_and_hold_the_hand_numbers():
    r = make_results(stats={("triplet", "i2t", "C_q"): (6.789, 0.834), ("triplet", "t2i", "C_B"): (774.671, 98.049),
                            ("ntxent", "t2i", "W_qv+"): (0.5612, 0.0213),
                            ("smoothap", "i2t", "C_0"): (2.1549, 1.5051)})
    tables = {t.title.split(":")[0]: t for t in cocos_tables(r)}
    assert set(tables) == {"Table 2", "Table 3", "Table 4", "Companions"}
    md2 = to_markdown(tables["Table 2"])
    header, rows, _ = parse_markdown(md2)
    assert header == ["Counter", "i2t C^q", "i2t C^B", "i2t C^0", "t2i C^q", "t2i C^B", "t2i C^0"]
    assert [row[0] for row in rows] == ["Triplet loss", "Triplet loss SH"]
    assert md_cell(md2, "Triplet loss", "i2t C^q") == "6.79 ± 0.83"
    assert md_cell(md2, "Triplet loss", "t2i C^B") == "774.67 ± 98.05"
    assert md_cell(md2, "Triplet loss SH", "i2t C^B") == "98.74 ± 4.83"
    md3 = to_markdown(tables["Table 3"])
    assert md_cell(md3, "NT-Xent", "t2i W^qv+") == "0.56 ± 0.02"
    assert md_cell(md3, "NT-Xent", "i2t C^qv-") == "9.88 ± 0.51"
    assert "i2t W_low" in parse_markdown(md3)[0]
    md4 = to_markdown(tables["Table 4"])
    assert parse_markdown(md4)[0] == ["Counter", "i2t C^q", "i2t C^0", "t2i C^q", "t2i C^0"]
    assert md_cell(md4, "SmoothAP", "i2t C^0") == "2.15 ± 1.51"
    mdc = to_markdown(tables["Companions"])
    assert md_cell(mdc, "NT-Xent", "t2i top-1 share") == "0.61 ± 0.05"


def test_null_values_show_na():
    r = make_results(losses=("triplet_sh",), stats={("triplet_sh", "i2t", "C_q"): (None, None)})
    md = to_markdown(cocos_tables(r)[0])
    assert md_cell(md, "Triplet loss SH", "i2t C^q") == "n/a"
    assert md_cell(md, "Triplet loss SH", "t2i C^q") == "1.00 ± 0.00"


def test_only_tables_of_present_losses_and_captions_name_model_data_and_spread():
    r = make_results(loss="smoothap", losses=("smoothap",), checkpoint="runs/x/model_best.pt")
    tables = cocos_tables(r)
    assert [t.title.split(":")[0] for t in tables] == ["Table 4", "Companions"]
    for t in tables:
        assert ": VSE++ trained with the SmoothAP on Flickr30k" in t.title
        assert "mean ± std over the training-set batches of 128" in t.title
        assert t.footnotes[0].text == "Counting: corrected."  # one note says the mode
    r = make_results(losses=("ntxent",), compat=True)
    t3 = cocos_tables(r)[0]
    assert t3.title.startswith("Table 3") and t3.footnotes[0].text == "Counting: compat (published counter)."
    r["stats"]["ntxent"] = {d: {s: v for s, v in x.items() if s in ("C_qv-", "W_qv-", "W_qv+", "W_low")}
                            for d, x in r["stats"]["ntxent"].items()}
    assert [t.title.split(":")[0] for t in cocos_tables(r)] == ["Table 3"]


def _mode_note(table):
    return table.footnotes[0]


def test_one_mode_note_and_a_dagger_exactly_where_the_other_mode_differs():
    same = make_results()
    for t in cocos_tables(same):
        assert "†" not in _mode_note(t).text and not any(c.mark for row in t.rows for c in row.cells)
        assert "†" not in to_markdown(t) and r"\dagger" not in to_latex(t)
    # differences at or under the tolerance do not count
    small = make_results(alt={("smoothap", "t2i", "C_0"): (2.154, 1.51), ("triplet", "t2i", "C_q"): (6.79, 0.834)})
    assert not any("†" in _mode_note(t).text for t in cocos_tables(small))
    # corrected shown, the compat value goes to the one note of the table
    r = make_results(alt={("smoothap", "t2i", "C_0"): (636.72, 18.72), ("triplet", "t2i", "C_q"): (6.11, 0.75)})
    tables = {t.title.split(":")[0]: t for t in cocos_tables(r)}
    t4, t2 = tables["Table 4"], tables["Table 2"]
    note = _mode_note(t4).text
    assert note == "Counting: corrected. † differs in compat (published counter) counting: SmoothAP t2i C^0 636.72±18.72."
    cell = t4.cell(("SmoothAP",), "t2i C^0")
    assert cell.mark == "†" and cell.mean == 2.15
    assert t4.cell(("SmoothAP",), "t2i C^q").mark == ""
    md = to_markdown(t4)
    assert md_cell(md, "SmoothAP", "t2i C^0") == "2.15 ± 1.51<sup>†</sup>"
    assert "published counter: for caption query q" in md  # the artefact note accompanies the compat value
    assert "Triplet loss t2i C^q 6.11±.75" in _mode_note(t2).text
    assert t2.cell(("Triplet loss",), "t2i C^q").mark == "†"
    assert "†" not in _mode_note(tables["Table 3"]).text
    tex = to_latex(t4)
    assert r"2.15$\pm$1.51\textsuperscript{$\dagger$}" in tex
    # LaTeX: a short note (the values are in markdown)
    assert r"$\dagger$ differs by more than 0.005 in compat (published counter) counting (values in tables.md)." in tex
    assert "636.72" not in tex


def test_compat_shown_gets_corrected_values_in_the_note_and_always_the_smoothap_note():
    r = make_results(compat=True, stats={("smoothap", "t2i", "C_0"): (636.72, 18.72)},
                     alt={("smoothap", "t2i", "C_0"): (2.15, 1.51)})
    t4 = next(t for t in cocos_tables(r) if t.title.startswith("Table 4"))
    assert _mode_note(t4).text.endswith("† differs in corrected counting: SmoothAP t2i C^0 2.15±1.51.")
    assert any("published counter" in f.text for f in t4.footnotes[1:])
    # compat shown, no difference: no mark, but the artefact note is still there
    t4 = next(t for t in cocos_tables(make_results(compat=True)) if t.title.startswith("Table 4"))
    assert "†" not in _mode_note(t4).text
    assert any("C^0 ≈ 637 of 640" in f.text for f in t4.footnotes)
    # corrected shown, no difference: no SmoothAP note
    t4 = next(t for t in cocos_tables(make_results()) if t.title.startswith("Table 4"))
    assert not any("published counter" in f.text for f in t4.footnotes)


def test_latex_is_structurally_valid():
    r = make_results(dataset="f30k_precomp", compat=True, checkpoint="runs/a_b/model_best.pt",
                     alt={("smoothap", "t2i", "C_0"): (1.5, 1.2), ("triplet", "t2i", "C_0"): (1.14, 1.22)})
    tables = cocos_tables(r) + [retrieval_table(r)]
    tex = "\n".join(to_latex(t) for t in tables)
    assert check_latex(tex) == 5
    assert r"$\pm$" in tex and "±" not in tex
    assert "Flickr30k" in tex and r"\label{tab:f30k\_precomp" not in tex  # the paper name; keys are plain
    for name in (r"$C^{q}$", r"$C^{\mathcal{B}}$", r"$C^{0}$", r"$C^{qv^-}$", r"$W^{qv^-}$", r"$W^{qv^+}$"):
        assert name in tex
    assert r"\multicolumn{2}{c}{i2t}" in tex  # Table 4 fits side by side
    # side by side at 8 or 7 pt (the panels are stacked only where even 7 pt does not fit)
    assert r"\emph{i2t}" not in tex and r"\multicolumn{4}{c}{i2t}" in tex  # all side by side (8 or 7 pt)


def test_latex_checker_catches_broken_rows():
    t = Table("T", ("a",), (Column("x", "i2t"), Column("y", "t2i")), [Row(("r",), (Cell(1.0, 0.5), Cell(2.0)))])
    good = to_latex(t)
    check_latex(good)
    with pytest.raises(AssertionError):
        check_latex(good.replace(r"1.00$\pm$.50", r"1.00 & .50"))
    with pytest.raises(AssertionError):
        check_latex(good.replace(r"\end{tabular}", ""))


def test_latex_escape_and_collapsed_labels():
    assert latex_escape("a_b 5% x&y #1") == r"a\_b 5\% x\&y \#1"
    t = Table("Table 9: x_y", ("Dataset", "Loss"), (Column("v"),),
              [Row(("d_1", "p"), (Cell(1.0),)), Row(("d_1", "q"), (Cell(text="a&b"),))])
    tex = to_latex(t)
    check_latex(tex)
    assert r"\caption{X\_y.}" in tex  # LaTeX numbers the table itself; captions are sentences
    assert r"d\_1 & p & 1.00 \\" in tex and r" & q & a\&b \\" in tex
    md = to_markdown(t)
    _, rows, _ = parse_markdown(md)
    assert rows == [["d_1", "p", "1.00"], ["d_1", "q", "a&b"]]


def test_markdown_escapes_pipes_and_puts_footnotes_after_a_blank_line():
    t = cocos_tables(make_results(alt={("smoothap", "t2i", "C_0"): (9.0, 1.0)}))
    md = to_markdown(next(x for x in t if x.title.startswith("Table 4")))
    _, _, after = parse_markdown(md)
    assert after[0] == "" and after[1].startswith("- Counting: corrected. † differs in compat")
    t = Table("x", ("a|b",), (Column("c|d"),), [Row(("e|f",), (Cell(text="g"),))])
    header, rows, _ = parse_markdown(to_markdown(t))
    assert len(header) == 2 and rows == [[r"e\|f", "g"]]


def test_retrieval_table_one_checkpoint():
    r = make_results(loss="ntxent", seed=3, model="vsrn", metrics={**METRICS, "rsum": 301.234})
    t = retrieval_table(r)
    md = to_markdown(t)
    header, rows, _ = parse_markdown(md)
    assert header == ["#", "Loss", "Param.", "i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5",
                      "t2i R@10", "rsum", "mAP@5"]  # the paper's Table 1
    # the loss's own hyper-parameter from its spec (the fixture's margin is not NT-Xent's): its default τ
    # markdown and LaTeX with the same decimals; mAP@5 in percent like the recalls
    assert rows == [["1", "NT-Xent", "τ=0.1", "30.8", "62.6", "74.1", "23.4", "52.8", "65.7", "301.2", "41.0"]]
    assert "of VSRN on Flickr30k, one run per row" in t.title
    tex = to_latex(t)
    check_latex(tex)
    assert r" &  &  & \multicolumn{3}{c}{i2t} & \multicolumn{3}{c}{t2i} &  &  \\" in tex
    assert r"1 & NT-Xent & $\tau$=0.1 & 30.8 & 62.6 & 74.1 & 23.4 & 52.8 & 65.7 & 301.2 & 41.0 \\" in tex


def test_latex_is_ascii_and_compiles_with_pdflatex_when_available(tmp_path):
    import shutil
    import subprocess

    assert latex_escape("1/τ, ε = 0.01, 1/Σu², k·q … k·q+k−1") == (
        r"1/$\tau$, $\varepsilon$ = 0.01, 1/$\Sigma$u$^2$, k$\cdot$q \ldots{} k$\cdot$q+k--1")
    results = make_results("smoothap", 0, alt={("smoothap", "t2i", "C_0"): (636.72, 18.72)})
    body = "\n".join(to_latex(t) for t in [retrieval_table(results), *cocos_tables(results)])
    assert body.isascii()
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed; the ASCII check above still ran")
    (tmp_path / "t.tex").write_text(body)
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\\usepackage{booktabs}\\usepackage[landscape]{geometry}"
                                     "\\begin{document}\\input{t.tex}\\end{document}\n")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:]
    assert (tmp_path / "doc.pdf").stat().st_size > 1000


def _lncs_compile(tmp_path, body: str) -> str:
    """Compile ``body`` in a real LNCS paper (``llncs``, booktabs and amsmath only); return the log."""
    from tests.test_llncs import compile_llncs

    return compile_llncs(tmp_path, body)


def _report_tables_two_seeds():
    from cocos.report.merge import build_tables

    results = []
    for loss in ("triplet", "triplet_sh", "ntxent", "smoothap"):
        for seed in (0, 1):
            r = make_results(loss, seed, rsum=400.0 + 7 * seed, stats={("triplet", "i2t", "C_B"): (1000.66 + seed, 124.2)},
                             alt={("smoothap", "t2i", "C_0"): (637.5, 0.5), ("triplet", "t2i", "C_q"): (2.89, 0.01)})
            results.append(as_results(r))
    groups, _ = group_results(results)
    return build_tables(groups)


def test_every_table_fits_one_lncs_column_without_an_overfull_box(tmp_path):
    """One result (all counters, compat values in the notes) and a two-seed report over four losses."""
    single = make_results("triplet_sh", 0, stats={("triplet", "i2t", "C_B"): (1000.66, 124.23)},
                          alt={("smoothap", "t2i", "C_0"): (637.5, 0.5), ("triplet", "t2i", "C_q"): (2.89, 0.01),
                               ("ntxent", "i2t", "W_qv-"): (0.34, 0.01)})
    from cocos.report.merge import build_tables

    two_datasets = [as_results(make_results(loss, seed, dataset=ds, rsum=400.0 + seed))
                    for ds in ("f30k", "coco") for loss in ("triplet", "triplet_sh") for seed in (0, 1)]
    tables = [retrieval_table(single), *cocos_tables(single), *_report_tables_two_seeds(),
              *build_tables(group_results(two_datasets)[0])]
    body = "\n".join(to_latex(t) for t in tables)
    assert body.isascii() and check_latex(body) == len(tables)
    log = _lncs_compile(tmp_path, body)
    overfull = [line for line in log.splitlines() if line.startswith("Overfull \\hbox")]
    assert not overfull, overfull


def test_page_width_tables_are_table_star_and_fit_a_page(tmp_path):
    tables = _report_tables_two_seeds()
    body = "\n".join(to_latex(t, width="page") for t in tables)
    assert body.count(r"\begin{table*}") == len(tables)
    log = _lncs_compile(tmp_path, body)  # llncs: a table* spans the same 12.2 cm
    assert "Overfull \\hbox" not in log


def test_committed_example_tables_compile_together_in_llncs(tmp_path):
    from pathlib import Path

    from tests.test_llncs import assert_clean, compile_llncs

    root = Path(__file__).resolve().parents[1] / "reports" / "example"
    files = sorted(root.rglob("tables.tex"))
    assert len(files) == 5  # four analyses and the summary
    body = "\n\\clearpage\n".join(f.read_text() for f in files)
    assert body.isascii() and "\\resizebox" not in body
    check_latex(body)
    assert_clean(compile_llncs(tmp_path, body))  # no overfull box, no multiply defined label


# --------------------------------------------------------------------------- LaTeX labels: what a table is


def _labels(tex: str) -> list[str]:
    return re.findall(r"\\label\{([^}]*)\}", tex)


def test_report_labels_follow_its_name_and_role_so_regenerating_keeps_them(tmp_path):
    """The same report from copies of its results in two places, as two folders ``summary``: the same labels; two
    reports of different names: no label in common; a prefix starts every label."""
    import json
    from pathlib import Path

    from cocos.report.merge import build_report, render_report

    def results_in(folder):
        folder.mkdir(parents=True)
        paths = []
        for loss in ("triplet", "triplet_sh", "ntxent"):
            paths.append(folder / f"{loss}.json")
            paths[-1].write_text(json.dumps(make_results(loss, 0, rsum=400.0)))
        return paths

    def labels(paths, out, **kw):
        return _labels(render_report(build_report(paths, **kw), name=Path(out).name)[1])

    first, again = results_in(tmp_path / "a"), results_in(tmp_path / "b")
    summary = labels(first, tmp_path / "a" / "summary")
    assert summary == labels(again, tmp_path / "b" / "summary") == [
        "tab:summary-retrieval", "tab:summary-table2", "tab:summary-table3", "tab:summary-companions"]
    assert not set(summary) & set(labels(first, tmp_path / "coco"))
    prefixed = labels(first, tmp_path / "a" / "summary", label_prefix="ECIR 2022")
    assert prefixed == [label.replace("tab:", "tab:ecir-2022-") for label in summary]


def test_labels_of_one_result_name_what_it_is_and_take_the_commands_prefix():
    from cocos.report.merge import build_tables

    def labels(r, prefix=None):
        groups, _ = group_results([as_results(r)])
        return [to_latex(t).split(r"\label{")[1].split("}")[0]
                for t in build_tables(groups, counters="all", label_prefix=prefix)]

    vsepp = labels(make_results("triplet_sh", 3))
    assert vsepp[:2] == ["tab:f30k-vsepp-triplet-sh-s3-retrieval", "tab:f30k-vsepp-triplet-sh-s3-table2"]
    assert vsepp == labels(make_results("triplet_sh", 3, checkpoint="elsewhere/run/model_best.pt"))  # same table
    assert not set(vsepp) & set(labels(make_results("triplet_sh", 3, model="vse_infty")))  # VSE∞: vseinf
    assert labels(make_results("triplet_sh", 3, checkpoint="run/epoch_005.pt"))[0] == (
        "tab:f30k-vsepp-triplet-sh-s3-epoch-005-retrieval")  # a checkpoint other than model_best is named
    # cocos analyze/count --label-prefix
    assert labels(make_results("triplet_sh", 3), "paper") == [x.replace("tab:", "tab:paper-") for x in vsepp]


def test_analyze_and_count_take_a_label_prefix():
    from typer.testing import CliRunner

    from cocos_cli.main import app

    for command in ("analyze", "count", "report"):
        res = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
        assert res.exit_code == 0 and "--label-prefix" in res.output, res.output
