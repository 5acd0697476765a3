"""Paper-ready tables: a small table model, markdown and LaTeX renderers, and builders.

Everything here is a pure function from data to text (no file IO).

The model: a :class:`Table` has label columns (e.g. dataset / model / loss) and
value :class:`Column` s with an optional group (``"i2t"`` / ``"t2i"``) that
becomes the upper level of a two-level header. Every value is a :class:`Cell`
(mean ± std, a plain number or literal text) that may carry a footnote mark.

Builders for ONE ``results.json`` (one checkpoint; every counter ran on its
embeddings): :func:`cocos_tables` (the paper's Tables 2-4 plus the
threshold-free companions) and :func:`retrieval_table` (Table 1 for one row).
The multi-file tables (mean ± std over seeds) are in :mod:`cocos.report.merge`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

DIRECTIONS = ("i2t", "t2i")
# Training losses / counters in the paper's order.
LOSS_ORDER = ("triplet", "triplet_sh", "ntxent", "smoothap")
LOSS_NAMES = {"triplet": "Triplet loss", "triplet_sh": "Triplet loss SH", "ntxent": "NT-Xent",
              "smoothap": "SmoothAP"}
MODEL_NAMES = {"vsepp": "VSE++", "vsrn": "VSRN"}
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
}
# The statistics of the paper's table for each loss (Table 2, 3, 4).
PAPER_STATS = {
    "triplet": ("C_q", "C_B", "C_0"),
    "triplet_sh": ("C_q", "C_B", "C_0"),
    "ntxent": ("C_qv-", "W_qv-", "W_qv+", "W_low"),
    "smoothap": ("C_q", "C_0"),
}
COMPANION_STATS = ("N_eff", "N_invsimpson", "top1_share")
# The main per-query count of each loss (figures, COCOS vs rsum).
MAIN_STAT = {"triplet": "C_q", "triplet_sh": "C_q", "ntxent": "C_qv-", "smoothap": "C_q"}
RETRIEVAL_KEYS = (("i2t", "R@1", "i2t_R@1"), ("i2t", "R@5", "i2t_R@5"), ("i2t", "R@10", "i2t_R@10"),
                  ("i2t", "mAP@5", "mAP@5"), ("t2i", "R@1", "t2i_R@1"), ("t2i", "R@5", "t2i_R@5"),
                  ("t2i", "R@10", "t2i_R@10"), ("", "rsum", "rsum"))

SMOOTHAP_ARTEFACT = (
    "SmoothAP t2i in compat mode reproduces the published counter: for caption query q it takes the "
    "rows k·q … k·q+k−1 of the image-by-image matrix (those < B) instead of the row of the caption's "
    "own image, so for q ≥ B/k the slice is empty and nearly every caption query counts as "
    "zero-gradient (the paper's Table 4 shows C^0 ≈ 637 of 640). The corrected counter uses the "
    "caption's own image."
)
SMOOTHAP_ARTEFACT_TEX = (
    r"SmoothAP t2i in compat mode reproduces the published counter: for caption query $q$ it takes "
    r"the rows $kq \ldots kq+k-1$ of the image-by-image matrix (those $< B$) instead of the row of the "
    r"caption's own image, so for $q \geq B/k$ the slice is empty and nearly every caption query "
    r"counts as zero-gradient (the paper's Table 4 shows $C^{0} \approx 637$ of 640). The corrected "
    r"counter uses the caption's own image."
)
TRIPLET_COMPAT = (
    "Triplet t2i in compat mode groups the violations by negative image, as the published counter "
    "does (C^B is unchanged; C^q and C^0 are over images)."
)
TRIPLET_COMPAT_TEX = (
    r"Triplet t2i in compat mode groups the violations by negative image, as the published counter "
    r"does ($C^{\mathcal{B}}$ is unchanged; $C^{q}$ and $C^{0}$ are over images)."
)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Column:
    """A value column: ``name`` (plain header), optional ``group`` (upper header), LaTeX header."""

    name: str
    group: str = ""
    latex: str | None = None

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
    key: str = "table"  # LaTeX \label{tab:<key>}

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
    """Hands out footnote marks a, b, c, ... and collects their footnotes, in order."""

    def __init__(self) -> None:
        self.footnotes: list[Footnote] = []

    def add(self, text: str, latex: str | None = None) -> str:
        mark = _mark_name(sum(1 for f in self.footnotes if f.mark))
        self.footnotes.append(Footnote(text, mark, latex))
        return mark

    def note(self, text: str, latex: str | None = None) -> None:
        if all(f.text != text for f in self.footnotes):
            self.footnotes.append(Footnote(text, "", latex))


def _mark_name(i: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return letters[i] if i < 26 else letters[i // 26 - 1] + letters[i % 26]


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


def fmt_entry(entry: dict | None, digits: int = 2) -> str:
    """Format a ``{"mean", "std", ...}`` statistics entry."""
    if not entry:
        return "n/a"
    return fmt(entry.get("mean"), entry.get("std"), digits)


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "±": r"$\pm$", "≈": r"$\approx$", "≥": r"$\geq$", "≤": r"$\leq$", "·": r"$\cdot$",
    "…": r"\ldots{}", "−": "--", "—": "---", "–": "--", "<": r"\textless{}", ">": r"\textgreater{}",
    # Greek letters and math signs of the footnotes: pdflatex has no Unicode text glyphs for them
    "τ": r"$\tau$", "ε": r"$\varepsilon$", "α": r"$\alpha$", "λ": r"$\lambda$", "Σ": r"$\Sigma$",
    "²": r"$^2$", "×": r"$\times$", "⁻": r"$^-$", "⁺": r"$^+$",
}


def _check_latex_ascii(text: str) -> str:
    """Every character the escape leaves must be plain ASCII, or pdflatex stops."""
    bad = sorted({ch for ch in text if ord(ch) > 127})
    if bad:
        raise ValueError(f"no LaTeX form for {''.join(bad)!r}; add it to _LATEX_SPECIAL")
    return text


def latex_escape(text: str) -> str:
    """Escape plain text for LaTeX (``_ % & # $ { } ~ ^ \\``; ``±`` becomes ``$\\pm$``)."""
    return _check_latex_ascii("".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text)))


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


def _latex_cell(cell: Cell) -> str:
    if cell.text is not None:
        text = latex_escape(cell.text)
    elif _missing(cell.mean):
        text = "n/a"
    elif _missing(cell.std):
        text = f"{cell.mean:.{cell.digits}f}"
    else:
        text = f"{cell.mean:.{cell.digits}f} $\\pm$ {cell.std:.{cell.digits}f}"
    return text + (f"\\textsuperscript{{{cell.mark}}}" if cell.mark else "")


def _groups(columns: Sequence[Column]) -> list[tuple[str, int, int]]:
    """Consecutive runs ``(group, first, last)`` (0-based column indices) of equal groups."""
    runs: list[tuple[str, int, int]] = []
    for i, col in enumerate(columns):
        if runs and runs[-1][0] == col.group:
            runs[-1] = (col.group, runs[-1][1], i)
        else:
            runs.append((col.group, i, i))
    return runs


def to_latex(table: Table, collapse_labels: bool = True) -> str:
    """A booktabs ``table`` float ready to ``\\input`` (needs ``\\usepackage{booktabs}``).

    Groups of columns (i2t / t2i) get a ``\\multicolumn`` header with a ``\\cmidrule``;
    with ``collapse_labels`` a leading label equal to the row above is left blank.
    Footnotes follow the tabular in ``\\footnotesize``, marks as ``\\textsuperscript``.
    """
    n_labels = len(table.label_columns)
    spec = "l" * n_labels + "r" * len(table.columns)
    caption = re.sub(r"^Table \d+:\s*", "", table.title)  # LaTeX numbers the table itself
    out = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption)}}}",
           rf"\label{{tab:{_latex_key(table.key)}}}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule"]
    runs = _groups(table.columns)
    if any(g for g, _, _ in runs):
        cells = [""] * n_labels
        rules = []
        for group, first, last in runs:
            span = last - first + 1
            if group:
                cells.append(rf"\multicolumn{{{span}}}{{c}}{{{latex_escape(group)}}}")
                rules.append(rf"\cmidrule(lr){{{n_labels + first + 1}-{n_labels + last + 1}}}")
            else:
                cells.extend([""] * span)
        out.append(" & ".join(cells) + r" \\")
        out.append(" ".join(rules))
    out.append(" & ".join([*(latex_escape(x) for x in table.label_columns),
                           *(c.latex_name for c in table.columns)]) + r" \\")
    out.append(r"\midrule")
    previous: tuple[str, ...] = ()
    for row in table.rows:
        labels = list(row.labels)
        if collapse_labels:
            for i in range(len(labels) - 1):  # never blank the last label
                if tuple(row.labels[: i + 1]) == tuple(previous[: i + 1]):
                    labels[i] = ""
                else:
                    break
        previous = tuple(row.labels)
        cells = [latex_escape(x) for x in labels] + [_latex_cell(c) for c in row.cells]
        out.append(" & ".join(cells) + r" \\")
    out.append(r"\bottomrule")
    out.append(r"\end{tabular}")
    if table.footnotes:
        out.append(r"\par\smallskip")
        out.append(r"{\footnotesize\raggedright")
        for note in table.footnotes:
            text = note.latex if note.latex is not None else latex_escape(note.text)
            mark = rf"\textsuperscript{{{note.mark}}}\," if note.mark else ""
            out.append(f"{mark}{text}\\par")
        out.append("}")
    out.append(r"\end{table}")
    return _check_latex_ascii("\n".join(out) + "\n")


def _latex_key(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9:.\-]+", "-", key).strip("-") or "table"


# --------------------------------------------------------------------------- one results.json


def is_compat(results: dict) -> bool:
    return bool(results.get("counting", {}).get("compat", False))


def mode_name(compat: bool) -> str:
    return "compat (published counter)" if compat else "corrected"


def loss_name(loss: str) -> str:
    return LOSS_NAMES.get(loss, loss)


def model_name(kind: str) -> str:
    return MODEL_NAMES.get(kind, kind)


def order_losses(losses: Iterable[str]) -> list[str]:
    losses = list(dict.fromkeys(losses))
    return [x for x in LOSS_ORDER if x in losses] + sorted(x for x in losses if x not in LOSS_ORDER)


def _get(tree: dict | None, *keys):
    for k in keys:
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


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


def _describe(results: dict) -> str:
    ckpt = results.get("checkpoint", {}) or {}
    name = PurePath(str(ckpt.get("path", "?"))).name
    epoch = f", epoch {ckpt['epoch']}" if ckpt.get("epoch") is not None else ""
    tr = results.get("training", {}) or {}
    counting = results.get("counting", {}) or {}
    return (f"checkpoint {name}{epoch}: {model_name(_get(results, 'model', 'kind') or '?')} trained with "
            f"{loss_name(tr.get('loss', '?'))} (seed {tr.get('seed', '?')}) on "
            f"{_get(results, 'data', 'name') or '?'}; {mode_name(is_compat(results))} counting, "
            f"batch size {counting.get('batch_size', '?')}")


def _slug(results: dict) -> str:
    parts = [_get(results, "data", "name"), _get(results, "model", "kind"),
             _get(results, "training", "loss"), _get(results, "training", "seed")]
    return "-".join(str(p) for p in parts if p is not None)


def alt_note(loss: str, direction: str, stat: str, alt: dict, alt_compat: bool) -> tuple[str, str]:
    """Footnote text (plain, LaTeX) giving the other counting mode's value of a cell."""
    plain = f"{loss_name(loss)} {direction} {STAT_HEADERS.get(stat, (stat,))[0]}, " \
            f"{mode_name(alt_compat)}: {fmt_entry(alt)}"
    head = STAT_HEADERS.get(stat, (stat, latex_escape(stat)))[1]
    tex = (f"{latex_escape(loss_name(loss))} {direction} {head}, {latex_escape(mode_name(alt_compat))}: "
           f"{latex_escape(fmt_entry(alt))}")
    return plain, tex


def _stat_columns(stats: Sequence[str]) -> tuple[Column, ...]:
    return tuple(Column(STAT_HEADERS.get(s, (s,))[0], d, STAT_HEADERS.get(s, (s, None))[1])
                 for d in DIRECTIONS for s in stats)


def _stat_cells(results: dict, loss: str, stats: Sequence[str], marks: Marks) -> tuple[Cell, ...]:
    cells = []
    compat = is_compat(results)
    for d in DIRECTIONS:
        for s in stats:
            entry = _get(results, "stats", loss, d, s)
            alt = _get(results, "alt_stats", loss, d, s)
            mark = ""
            if differs(entry, alt):
                mark = marks.add(*alt_note(loss, d, s, alt, not compat))
            entry = entry or {}
            cells.append(Cell(entry.get("mean"), entry.get("std"), mark=mark))
    return tuple(cells)


def _skipped_note(results: dict, losses: Sequence[str], marks: Marks) -> None:
    parts = []
    for loss in losses:
        for d in DIRECTIONS:
            entry = _get(results, "stats", loss, d, MAIN_STAT.get(loss, "C_q")) or {}
            if entry.get("n_skipped"):
                total = entry.get("n_skipped", 0) + entry.get("n", 0)
                parts.append(f"{loss_name(loss)} {d}: {entry['n_skipped']} of {total}")
    if parts:
        marks.note("Batches where no query has a gradient have no C^q and are left out of its mean: "
                   + "; ".join(parts) + ".")


def _mode_notes(results: dict, loss_group: Sequence[str], marks: Marks) -> None:
    compat = is_compat(results)
    if "smoothap" in loss_group:
        t2i_alt = any(f.mark and f.text.startswith("SmoothAP t2i") for f in marks.footnotes)
        if compat or t2i_alt:
            marks.note(SMOOTHAP_ARTEFACT, SMOOTHAP_ARTEFACT_TEX)
    if "triplet" in loss_group and compat:
        marks.note(TRIPLET_COMPAT, TRIPLET_COMPAT_TEX)


def cocos_tables(results: dict) -> list[Table]:
    """Tables 2-4 (and the companions) of one checkpoint, for the counters present in ``results``.

    Rows are the counters run on this checkpoint's embeddings. A cell whose value in
    the other counting mode (``alt_stats``) differs by more than 0.005 is marked and
    a footnote gives the other value.
    """
    stats = results.get("stats", {}) or {}
    present = order_losses(stats)
    desc = _describe(results)
    slug = _slug(results)
    tables = []

    trip = [x for x in ("triplet", "triplet_sh") if x in present]
    if trip:
        marks = Marks()
        rows = [Row((loss_name(x),), _stat_cells(results, x, PAPER_STATS[x], marks)) for x in trip]
        _mode_notes(results, trip, marks)
        _skipped_note(results, trip, marks)
        tables.append(Table(f"Table 2: COCOS w.r.t. query q, Triplet loss and Triplet loss SH — {desc}",
                            ("Counter",), _stat_columns(PAPER_STATS["triplet"]), rows, marks.footnotes,
                            key=f"{slug}-cocos-triplet"))
    if "ntxent" in present:
        marks = Marks()
        rows = [Row((loss_name("ntxent"),), _stat_cells(results, "ntxent", PAPER_STATS["ntxent"], marks))]
        eps = _get(results, "counting", "params", "ntxent", "eps")
        marks.note(f"Weights exclude the 1/τ factor of the gradient; ε = {eps if eps is not None else 0.01}; "
                   "W_low is the weight of the negatives under ε (beyond the paper).")
        tables.append(Table(f"Table 3: COCOS w.r.t. query q, NT-Xent — {desc}", ("Counter",),
                            _stat_columns(PAPER_STATS["ntxent"]), rows, marks.footnotes,
                            key=f"{slug}-cocos-ntxent"))
    if "smoothap" in present:
        marks = Marks()
        rows = [Row((loss_name("smoothap"),),
                    _stat_cells(results, "smoothap", PAPER_STATS["smoothap"], marks))]
        _mode_notes(results, ["smoothap"], marks)
        _skipped_note(results, ["smoothap"], marks)
        tables.append(Table(f"Table 4: COCOS w.r.t. query q, SmoothAP — {desc}", ("Counter",),
                            _stat_columns(PAPER_STATS["smoothap"]), rows, marks.footnotes,
                            key=f"{slug}-cocos-smoothap"))
    comp = [x for x in present if any(_get(stats, x, d, s) for d in DIRECTIONS for s in COMPANION_STATS)]
    if comp:
        rows = [Row((loss_name(x),), tuple(Cell((_get(stats, x, d, s) or {}).get("mean"),
                                                (_get(stats, x, d, s) or {}).get("std"))
                                           for d in DIRECTIONS for s in COMPANION_STATS)) for x in comp]
        notes = [Footnote("Threshold-free companions (beyond the paper), from the normalised weights u of "
                          "each query's negatives: N_eff = exp(H(u)), inverse Simpson 1/Σu², top-1 share "
                          "max u; for the triplet losses the weights are the 0/1 violations.",
                          latex=r"Threshold-free companions (beyond the paper), from the normalised weights "
                                r"$u$ of each query's negatives: $N_{\mathrm{eff}} = \exp H(u)$, inverse "
                                r"Simpson $1/\sum u^2$, top-1 share $\max u$; for the triplet losses the "
                                r"weights are the 0/1 violations.")]
        tables.append(Table(f"Companions: effective number of contributing negatives — {desc}", ("Counter",),
                            _stat_columns(COMPANION_STATS), rows, notes, key=f"{slug}-companions"))
    return tables


RETRIEVAL_COLUMNS = tuple(Column(name, group) for group, name, _ in RETRIEVAL_KEYS)


def retrieval_table(results: dict) -> Table:
    """Table 1 for one checkpoint: R@1/5/10 and mAP@5 (i2t), R@1/5/10 (t2i), rsum on the test split."""
    metrics = _get(results, "evaluation", "metrics") or {}
    split = _get(results, "evaluation", "split") or "test"
    cells = tuple(Cell(metrics.get(key)) for _, _, key in RETRIEVAL_KEYS)
    labels = (str(_get(results, "data", "name")), model_name(str(_get(results, "model", "kind"))),
              loss_name(str(_get(results, "training", "loss"))))
    ckpt = PurePath(str(_get(results, "checkpoint", "path") or "?")).name
    notes = [Footnote("Recalls in percent; mAP@5 (i2t) on a 0-1 scale; rsum = sum of the six recalls.")]
    return Table(f"Table 1: retrieval on the {split} split — checkpoint {ckpt} "
                 f"(seed {_get(results, 'training', 'seed')})", ("Dataset", "Model", "Loss"),
                 RETRIEVAL_COLUMNS, [Row(labels, cells)], notes, key=f"{_slug(results)}-retrieval")


# --------------------------------------------------------------------------- cocos count (terminal)

# Order in which `cocos count` shows statistics: the paper's first, then the companions.
STAT_ORDER = ("C_q", "C_B", "C_0", "C_qv-", "W_qv-", "W_qv+", "W_low",
              "N_eff", "N_invsimpson", "top1_share", "n_excluded")


def count_rows(stats_by_direction: dict) -> list[tuple[str, ...]]:
    """Rows ``(statistic, i2t, t2i)`` of one loss in a run summary: ``mean ± std`` over batches."""
    directions = list(stats_by_direction)
    first = stats_by_direction[directions[0]]
    stats = [s for s in STAT_ORDER if s in first] + sorted(s for s in first if s not in STAT_ORDER)
    rows = []
    for stat in stats:
        cells = []
        for d in directions:
            entry = stats_by_direction[d][stat]
            skipped = f" ({entry['n_skipped']} skipped)" if entry["n_skipped"] else ""
            cells.append(fmt_entry(entry) + skipped)
        rows.append((stat, *cells))
    return rows
