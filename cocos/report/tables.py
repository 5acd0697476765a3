"""Paper-ready tables: a small table model, markdown and LaTeX renderers, and builders.

Everything here is a pure function from data to text (no file IO).

The model: a :class:`Table` has label columns (e.g. dataset / model / loss) and
value :class:`Column` s with an optional group (``"i2t"`` / ``"t2i"``) that
becomes the upper level of a two-level header. Every value is a :class:`Cell`
(mean ± std, a plain number or literal text) that may carry a footnote mark.

The tables themselves (Table 1 and the paper's Tables 2-4, for one result or
many) are built in :mod:`cocos.report.paper_tables`; which loss goes in which table and
with which statistics comes from the presentations stored in the results.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

DIRECTIONS = ("i2t", "t2i")
# The header of every generated tables.tex: how to \input many of them (docs/definitions.md, "Tables in a paper").
MANY_TABLES = (
    "Each table is a float: \\input of many tables.tex in a row stops pdflatex ('Too many unprocessed floats').",
    "Put \\clearpage between groups of a few \\input (it prints the waiting floats), or \\input each file",
    "in the section that discusses it; no package beyond booktabs and amsmath is needed.",
)

# Where the alternative counting mode differs by more than this, the cell gets a footnote.
ALT_TOLERANCE = 0.005

# Statistic -> (markdown / plain header, LaTeX header).
STAT_HEADERS = {
    "C_q": ("C^q", r"$C^{q}$"),
    "C_B": ("C^B", r"$C^{\mathcal{B}}$"),
    "C_0": ("C^0", r"$C^{0}$"),
    "C_qv-": ("C^qv-", r"$C^{qv^-}$"),
    "W_qv-": ("W^qv-", r"$W^{qv^-}$"),
    "W_qv+": ("W^qv+", r"$W^{qv^+}$"),
    "W_low": ("W_low", r"$W_{\mathrm{low}}$"),
    "N_eff": ("N_eff", r"$N_{\mathrm{eff}}$"),
    "N_invsimpson": ("inv. Simpson", r"inv.\ Simpson"),
    "top1_share": ("top-1 share", r"top-1 share"),
    "T": ("T", r"$T$"),
    "P_pos": ("P+", r"$P^{+}$"),
    "P_neg": ("P-", r"$P^{-}$"),
    "C_intra": ("C^intra", r"$C^{\mathrm{intra}}$"),
}
COMPANION_STATS = ("N_eff", "N_invsimpson", "top1_share")
# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Column:
    """A value column: ``name`` (plain header), optional ``group`` (upper header), LaTeX header."""

    name: str
    group: str = ""
    latex: str | None = None
    latex_std: bool = True  # LaTeX shows the cells' ± (False: the mean alone, to keep a table compact)

    @property
    def flat(self) -> str:
        return f"{self.group} {self.name}" if self.group else self.name

    @property
    def latex_name(self) -> str:
        return self.latex if self.latex is not None else latex_escape(self.name)


@dataclass(frozen=True)
class Cell:
    """``mean ± std`` (std may be None: just the value), or literal ``text``; plus a footnote mark."""

    mean: float | None = None
    std: float | None = None
    text: str | None = None
    mark: str = ""
    digits: int = 2

    @property
    def plain(self) -> str:
        """Markdown and terminal: the same decimals as LaTeX (which writes the std compactly, ``30.8±.7``)."""
        return self.text if self.text is not None else fmt(self.mean, self.std, self.digits)


@dataclass(frozen=True)
class Row:
    labels: tuple[str, ...]
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class Footnote:
    """``text`` below the table; ``mark`` ties it to marked cells ("" for a general note)."""

    text: str
    mark: str = ""
    latex: str | None = None  # LaTeX version of text (already escaped); default: escape(text)


@dataclass
class Table:
    title: str
    label_columns: tuple[str, ...]
    columns: tuple[Column, ...]
    rows: list[Row] = field(default_factory=list)
    footnotes: list[Footnote] = field(default_factory=list)
    key: str = "table"  # what the table is (its role: retrieval, table2, companions, a family's name)
    stack: bool = True  # too wide for the width: stack the column groups as panels (False: set it smaller)
    label: str = ""  # LaTeX \label{tab:<label>} (:func:`latex_label`; "" means the key)
    comparisons: list = field(default_factory=list)  # its rows' tests over seeds (cocos.report.significance)

    def __post_init__(self) -> None:
        self.label_columns = tuple(self.label_columns)
        self.columns = tuple(self.columns)
        for row in self.rows:
            if len(row.labels) != len(self.label_columns) or len(row.cells) != len(self.columns):
                raise ValueError(f"row {row.labels} does not match the columns of '{self.title}'")

    def cell(self, row_labels: Sequence[str], column: str) -> Cell:
        """The cell of the row with these labels in the column whose flat name is ``column``."""
        names = [c.flat for c in self.columns]
        for row in self.rows:
            if tuple(row.labels) == tuple(row_labels):
                return row.cells[names.index(column)]
        raise KeyError(tuple(row_labels))


class Marks:
    """Collects a table's notes, in order, each once."""

    def __init__(self) -> None:
        self.footnotes: list[Footnote] = []

    def note(self, text: str, latex: str | None = None) -> None:
        if all(f.text != text for f in self.footnotes):
            self.footnotes.append(Footnote(text, "", latex))


# --------------------------------------------------------------------------- formatting


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    """``"6.79 ± 0.83"``; ``"6.79"`` without std; ``"n/a"`` for a missing mean."""
    if _missing(mean):
        return "n/a"
    if _missing(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def mode_name(compat: bool) -> str:
    return "compat (published counter)" if compat else "corrected"


def differs(a: dict | None, b: dict | None, tol: float = ALT_TOLERANCE) -> bool:
    """Whether two ``{"mean", "std"}`` entries differ by more than ``tol`` in mean or std."""
    if not a or not b:
        return False
    for key in ("mean", "std"):
        x, y = a.get(key), b.get(key)
        if _missing(x) != _missing(y):
            return True
        if not _missing(x) and abs(float(x) - float(y)) > tol + 1e-9:
            return True
    return False


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "±": r"$\pm$", "†": r"$\dagger$", "≈": r"$\approx$", "≥": r"$\geq$", "≤": r"$\leq$", "·": r"$\cdot$",
    "…": r"\ldots{}", "−": "--", "—": "---", "–": "--", "<": r"\textless{}", ">": r"\textgreater{}",
    # Greek letters and math signs of the footnotes: pdflatex has no Unicode text glyphs for them
    "τ": r"$\tau$", "ε": r"$\varepsilon$", "α": r"$\alpha$", "λ": r"$\lambda$", "Σ": r"$\Sigma$",
    "η": r"$\eta$", "β": r"$\beta$", "∞": r"$\infty$",
    "²": r"$^2$", "×": r"$\times$", "⁻": r"$^-$", "⁺": r"$^+$",
}


def _check_latex_ascii(text: str) -> str:
    """Every character the escape leaves must be plain ASCII, or pdflatex stops."""
    bad = sorted({ch for ch in text if ord(ch) > 127})
    if bad:
        raise ValueError(f"no LaTeX form for {''.join(bad)!r}; add it to _LATEX_SPECIAL")
    return text


def _ascii(ch: str) -> str:
    """A character without a LaTeX form: its ASCII base letter (é -> e), else '?'."""

    base = "".join(c for c in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(c))
    return base if base.isascii() and base else "?"


def latex_escape(text: str) -> str:
    """Escape plain text for LaTeX (``_ % & # $ { } ~ ^ \\``; ``±`` becomes ``$\\pm$``).

    Other non-ASCII characters (a user's ``--label``) become their ASCII base letter, so the
    tables always compile with plain pdflatex.
    """
    return _check_latex_ascii("".join(_LATEX_SPECIAL.get(ch, ch if ch.isascii() else _ascii(ch))
                                      for ch in str(text)))


def _md_escape(text: str) -> str:
    return str(text).replace("|", r"\|").replace("\n", " ")


# --------------------------------------------------------------------------- renderers


def _md_cell(cell: Cell) -> str:
    text = _md_escape(cell.plain)
    return f"{text}<sup>{cell.mark}</sup>" if cell.mark else text


def to_markdown(table: Table) -> str:
    """A GitHub pipe table under a bold title; the two-level header flattened (``i2t C^q``).

    Footnotes follow as a list after a blank line (so they are not parsed as rows).
    """
    header = [*table.label_columns, *(c.flat for c in table.columns)]
    align = [":--"] * len(table.label_columns) + ["--:"] * len(table.columns)
    lines = [f"**{_md_escape(table.title)}**", ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("| " + " | ".join(align) + " |")
    for row in table.rows:
        cells = [_md_escape(x) for x in row.labels] + [_md_cell(c) for c in row.cells]
        lines.append("| " + " | ".join(cells) + " |")
    if table.footnotes:
        lines.append("")
        for note in table.footnotes:
            prefix = f"<sup>{note.mark}</sup> " if note.mark else ""
            lines.append(f"- {prefix}{_md_escape(note.text)}")
    return "\n".join(lines) + "\n"


def fmt_compact(mean: float | None, std: float | None = None, digits: int = 2) -> str:
    """The paper's compact ``30.8±.7`` (plain text): no spaces, the std without its leading zero."""
    if _missing(mean):
        return "n/a"
    text = f"{mean:.{digits}f}"
    if _missing(std):
        return text
    spread = f"{std:.{digits}f}"
    if spread.startswith("0.") and digits > 0:
        spread = spread[1:]
    return f"{text}±{spread}"


def _latex_cell(cell: Cell) -> str:
    if cell.text is not None:
        text = latex_escape(cell.text)
    else:
        text = fmt_compact(cell.mean, cell.std, cell.digits).replace("±", r"$\pm$")
    return text + (f"\\textsuperscript{{{latex_escape(cell.mark)}}}" if cell.mark else "")


def _groups(columns: Sequence[Column]) -> list[tuple[str, int, int]]:
    """Consecutive runs ``(group, first, last)`` (0-based column indices) of equal groups."""
    runs: list[tuple[str, int, int]] = []
    for i, col in enumerate(columns):
        if runs and runs[-1][0] == col.group:
            runs[-1] = (col.group, runs[-1][1], i)
        else:
            runs.append((col.group, i, i))
    return runs


# Page geometry (LNCS, the format of ECIR): the text is one column of 12.2 cm = 347 pt, and a ``table*`` in
# ``llncs`` spans that same width; ``page`` sets ``table*`` (for two-column documents) at the LNCS width, so
# that every table cocos writes compiles in an ``llncs`` paper.
WIDTHS_PT = {"column": 347.0, "page": 347.0}
_FONTS = ((r"\footnotesize", 8.0), (r"\scriptsize", 7.0))  # LNCS (10 pt) sizes; never smaller than 7 pt
_TABCOLSEP_PT = 3.0
# Widths in em of Computer Modern Roman glyphs (digits and most lower-case letters are half an em).
_EM = {**dict.fromkeys("0123456789abcdeghknopqsuvxyz?#$", 0.5), **dict.fromkeys("fjrt", 0.38),
       **dict.fromkeys("il.,:;'!", 0.28), **dict.fromkeys("mw", 0.8), **dict.fromkeys("()[]", 0.39),
       **dict.fromkeys("+=x", 0.78), " ": 0.33, "-": 0.33, "/": 0.5, "@": 0.78, "%": 0.83}


_CALIBRATION = 1.15  # measured tabulars in llncs are 1.08-1.15 times the sum of these glyph widths


def _visible(tex: str) -> str:
    """Roughly what a LaTeX cell prints: commands and braces dropped, math symbols as one character."""
    tex = re.sub(r"\\textsuperscript\{[^}]*\}", "i", tex)
    tex = re.sub(r"\\(pm|mathcal|mathrm|ldots|cdot|tau|varepsilon|alpha|mid|lambda|beta|eta)\b", "x", tex)
    tex = re.sub(r"\\[a-zA-Z]+", "", tex)
    return re.sub(r"[{}$^_\\]", "", tex)


def _width_em(tex: str) -> float:
    return sum(_EM.get(ch, 0.75 if ch.isupper() else 0.55) for ch in _visible(tex))


def _estimate_pt(rows: Sequence[Sequence[str]], size: float = 8.0, colsep: float = _TABCOLSEP_PT) -> float:
    """Width of a tabular with these cell texts (per column the widest cell) at font ``size`` pt."""
    return sum(max(_width_em(r[i]) for r in rows) * size * _CALIBRATION + 2 * colsep for i in range(len(rows[0])))


def _panels(table: Table) -> list[list[int]]:
    """Column indices of each stacked panel: one per run of a group (i2t, t2i, and the ungrouped columns)."""
    return [list(range(first, last + 1)) for _, first, last in _groups(table.columns)]


def to_latex(table: Table, collapse_labels: bool = True, width: str = "column") -> str:
    """A booktabs ``table`` float ready to ``\\input`` (needs only ``booktabs`` and ``amsmath``).

    The table is set in ``\\footnotesize`` with a narrow ``\\tabcolsep`` and compact
    numbers (``30.8±.7``) so that it fits ``width``: one LNCS column (12.2 cm, ``table``)
    or a page (``"page"``: ``table*`` for two-column documents). When the column groups
    (i2t / t2i) side by side would still be too wide, they are stacked as panels, one
    under the other, each with its own header. With ``collapse_labels`` a leading label
    equal to the row above is left blank. Notes follow the tabular in ``\\scriptsize``.
    """
    if width not in WIDTHS_PT:
        raise ValueError(f"unknown width '{width}' (use {', '.join(WIDTHS_PT)})")
    label_rows = _label_rows(table, collapse_labels)
    cells = _latex_cells(table)
    heads = [latex_escape(x) for x in table.label_columns]
    value_heads = [c.latex_name for c in table.columns]
    wide_rows = [heads + value_heads] + [lab + val for lab, val in zip(label_rows, cells, strict=True)]
    stacked, font, colsep = _layout(table, wide_rows, heads, value_heads, label_rows, cells, WIDTHS_PT[width])
    env = "table*" if width == "page" else "table"
    caption = _sentence(re.sub(r"^Table \d+:\s*", "", table.title))  # LaTeX numbers the table itself
    out = [rf"\begin{{{env}}}[t]", r"\centering", font, rf"\setlength{{\tabcolsep}}{{{colsep:g}pt}}",
           rf"\caption{{{latex_escape(caption).replace('query q,', 'query $q$,')}}}",
           rf"\label{{tab:{_latex_key(table.label or table.key)}}}"]
    tabular = _stacked_tabular if stacked else _side_by_side_tabular
    out += tabular(table, heads, value_heads, label_rows, cells)
    out += [r"\bottomrule", r"\end{tabular}"]
    out += _latex_notes(table.footnotes)
    out.append(rf"\end{{{env}}}")
    return _check_latex_ascii("\n".join(out) + "\n")


def _latex_cells(table: Table) -> list[list[str]]:
    """The LaTeX value cells of each row (a column without ``latex_std`` shows the mean alone)."""
    return [[_latex_cell(c if col.latex_std else Cell(c.mean, None, c.text, c.mark, c.digits))
             for c, col in zip(row.cells, table.columns, strict=True)] for row in table.rows]


def _side_by_side_tabular(table: Table, heads, value_heads, label_rows, cells) -> list[str]:
    """The tabular's opening, header and rows with every column in one row (column groups side by side, under a
    group header)."""
    n_labels = len(table.label_columns)
    runs = _groups(table.columns)
    out = [rf"\begin{{tabular}}{{{'l' * n_labels + 'r' * len(table.columns)}}}", r"\toprule"]
    if any(g for g, _, _ in runs):
        out += _group_header(runs, n_labels)
    out += [" & ".join(heads + value_heads) + r" \\", r"\midrule"]
    return out + [" & ".join(lab + val) + r" \\" for lab, val in zip(label_rows, cells, strict=True)]


def _stacked_tabular(table: Table, heads, value_heads, label_rows, cells) -> list[str]:
    """The tabular's opening and its column groups stacked as panels, one under the other, each with its group's
    name and its own header (shorter panels padded with empty cells)."""
    n_labels = len(table.label_columns)
    panels = _panels(table)
    n_values = max(len(p) for p in panels)
    out = [rf"\begin{{tabular}}{{{'l' * n_labels + 'r' * n_values}}}", r"\toprule"]
    for k, panel in enumerate(panels):
        group = table.columns[panel[0]].group
        pad = [""] * (n_values - len(panel))
        if k:
            out.append(r"\midrule")
        if group:
            out.append(rf"\multicolumn{{{n_labels + n_values}}}{{l}}{{\emph{{{latex_escape(group)}}}}} \\")
        out.append(" & ".join(heads + [value_heads[i] for i in panel] + pad) + r" \\")
        out.append(rf"\cmidrule(lr){{{n_labels + 1}-{n_labels + len(panel)}}}")
        out += [" & ".join(lab + [val[i] for i in panel] + pad) + r" \\"
                for lab, val in zip(label_rows, cells, strict=True)]
    return out


def _label_rows(table: Table, collapse: bool) -> list[list[str]]:
    """The escaped row labels; with ``collapse`` a leading label equal to the row above is left blank."""
    out, previous = [], ()
    for row in table.rows:
        labels = list(row.labels)
        if collapse:
            for i in range(len(labels) - 1):  # never blank the last label
                if tuple(row.labels[: i + 1]) != tuple(previous[: i + 1]):
                    break
                labels[i] = ""
        previous = tuple(row.labels)
        out.append([latex_escape(x) for x in labels])
    return out


def _group_header(runs, n_labels: int) -> list[str]:
    """The upper header of side-by-side column groups (i2t / t2i) with their rules."""
    head, rules = [""] * n_labels, []
    for group, first, last in runs:
        span = last - first + 1
        if group:
            head.append(rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(group)}}}")
            rules.append(rf"\cmidrule(lr){{{n_labels + first + 1}-{n_labels + last + 1}}}")
        else:
            head.extend([""] * span)
    return [" & ".join(head) + r" \\", " ".join(rules)]


def _latex_notes(notes) -> list[str]:
    if not notes:
        return []
    out = [r"\par\smallskip", r"{\scriptsize\raggedright"]
    for note in notes:
        text = note.latex if note.latex is not None else latex_escape(note.text)
        mark = rf"\textsuperscript{{{latex_escape(note.mark)}}}\," if note.mark else ""
        out.append(f"{mark}{text}\\par")
    return out + ["}"]


def _layout(table: Table, wide_rows, heads, value_heads, label_rows, cells,
            width_pt: float) -> tuple[bool, str, float]:
    """``(stacked, font, tabcolsep)``: the largest font (8 pt, else 7 pt) at which the table fits side by side, else
    its column groups stacked as panels (where the table allows it), else narrower column gaps."""
    budget = 0.97 * width_pt  # 3% for the estimate's error
    panel_width = max(len(p) for p in _panels(table))
    narrow = [heads + value_heads[:panel_width]] + [lab + val[:panel_width]
                                                    for lab, val in zip(label_rows, cells, strict=True)]
    options = [(False, rows) for rows in [wide_rows]]
    if table.stack and any(c.group for c in table.columns):
        options.append((True, narrow))
    for colsep in (_TABCOLSEP_PT, 1.5):
        for stacked, rows in options:
            for font, size in _FONTS:
                if _estimate_pt(rows, size, colsep) <= budget:
                    return stacked, font, colsep
    return options[-1][0], _FONTS[-1][0], 1.5


def _sentence(text: str) -> str:
    """A caption as a sentence: upper-case first letter, a full stop at the end."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


_SLUG_WORDS = {"+": "p", "∞": "inf"}  # VSE++ -> vsepp, VSE∞ -> vseinf: names that differ stay apart


def slug(text: str) -> str:
    """A name as a LaTeX label part: ASCII lower-case letters, digits and dots, words joined by ``-``
    (``VSE++ + LTD`` -> ``vsepp-ltd``)."""
    text = "".join(_SLUG_WORDS.get(ch, ch) for ch in str(text).replace(" + ", " "))
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-.")


def latex_label(role: str, name: str, prefix: str | None = None) -> str:
    """A table's LaTeX label (without ``tab:``) from what it is: ``[PREFIX-]NAME-ROLE``, e.g. ``summary-table2``
    for Table 2 of the report folder ``summary``. Regenerating a report keeps every label; two reports of
    different names never share one (the same name twice needs a prefix)."""
    return "-".join(part for part in (slug(prefix or ""), slug(name), slug(role)) if part) or "table"


def _latex_key(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9:.\-]+", "-", key).strip("-") or "table"
