"""The helpers Table 1 and the grouping were split into, by hand."""

from __future__ import annotations

from types import SimpleNamespace

from cocos.report import paper_tables as PT
from cocos.report.tables import Cell, Column, Row, Table, to_latex


def _groups(*ns):
    return [SimpleNamespace(n=n) for n in ns]


def test_table1_spread():
    assert PT._table1_spread(_groups(1, 1)) == "one run per row"
    assert PT._table1_spread(_groups(3, 1, 5)) == "mean ± sample std over 3, 5 seeds (rows of one seed: the value alone)"
    assert PT._table1_spread(_groups(2)) == "mean ± sample std over 2 seeds"


def test_table1_label_columns():
    rows = [("Flickr30k", "VSE++", "1", "Triplet", "α=0.2"), ("Flickr30k", "VSE++", "2", "NT-Xent", "τ=0.1")]
    keep, fixed = PT._table1_label_columns(rows)
    assert keep == [2, 3, 4] and fixed == {"Dataset": "Flickr30k", "Model": "VSE++"}
    keep, fixed = PT._table1_label_columns(rows[:1])  # one row keeps its loss and parameters
    assert keep == [2, 3, 4] and fixed == {"Dataset": "Flickr30k", "Model": "VSE++"}
    keep, fixed = PT._table1_label_columns([rows[0], ("MS-COCO", *rows[0][1:3], "Triplet", "α=0.2")])
    assert keep == [0, 2] and fixed == {"Model": "VSE++", "Loss": "Triplet", "Param.": "α=0.2"}


def test_mark_rsum_marks_only_the_rsum_cell():
    cells = tuple(Cell(float(i), None) for i in range(len(PT.TABLE1_KEYS)))
    assert PT._mark_rsum(cells, "") is cells
    marked = PT._mark_rsum(cells, "wc")
    assert [c.mark for c in marked] == ["wc" if j == PT.RSUM_COLUMN else "" for j in range(len(cells))]


def test_stacked_and_side_by_side_latex_by_hand():
    cols = (Column("R@1", "i2t"), Column("R@1", "t2i"))
    table = Table("T", ("Loss",), cols, [Row(("a",), (Cell(1.0, None), Cell(2.0, None)))], [], key="k")
    tex = to_latex(table)
    assert r" & \multicolumn{1}{c}{i2t} & \multicolumn{1}{c}{t2i} \\" in tex
    assert "a & 1.00 & 2.00 \\\\" in tex
    from cocos.report.tables import _stacked_tabular

    stacked = _stacked_tabular(table, ["Loss"], ["R@1", "R@1"], [["a"]], [["1.00", "2.00"]])
    assert stacked == [r"\begin{tabular}{lr}", r"\toprule", r"\multicolumn{2}{l}{\emph{i2t}} \\", r"Loss & R@1 \\",
                       r"\cmidrule(lr){2-2}", r"a & 1.00 \\", r"\midrule", r"\multicolumn{2}{l}{\emph{t2i}} \\",
                       r"Loss & R@1 \\", r"\cmidrule(lr){2-2}", r"a & 2.00 \\"]
