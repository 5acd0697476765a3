"""``index.html`` of a report folder: one static page that opens from the file system.

Nothing is fetched: the CSS and the few lines of JavaScript (sortable tables, a self-check) are inline, figures and
thumbnails are the folder's own files by relative path, and links go to files that exist when the page is written
(the folder's files, the analysed folders of a merged report). Pure functions returning strings (but for
:func:`report_index`, which lists the folder it is written into and checks the link targets); every text from data
is escaped with :func:`html.escape`.

The self-check (run on load) sets ``data-selfcheck`` on ``<body>``: ``ok``, or ``fail: ...`` naming an image that
did not load, a sortable table without rows or a script error. Opened with ``#selftest-sort`` the page clicks the
last header of its first sortable table once (what a test reads back).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from html import escape, unescape
from pathlib import Path
from urllib.parse import quote

from cocos.report.groups import loss_label
from cocos.report.tables import Cell, Table, _groups, fmt
from cocos.results import Results

CSS = """
:root { --ink: #1d2430; --dim: #5b6473; --line: #d7dce3; --soft: #f4f6f9; --pos: #e7f5ea; --bad: #b3261e;
        --warn: #9a5b00; --ok: #1b6e3a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink); margin: 0;
       background: #fff; }
header.top { background: var(--soft); border-bottom: 1px solid var(--line); padding: 14px 24px; }
header.top h1 { font-size: 20px; margin: 0 0 4px; }
header.top p { margin: 0; color: var(--dim); }
nav.toc { margin-top: 8px; } nav.toc a { margin-right: 14px; }
main { max-width: 1160px; padding: 8px 24px 40px; }
section { margin-top: 22px; } h2 { font-size: 17px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
a { color: #1a5fb4; }
dl.record { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0; }
dl.record dt { font-weight: 600; color: var(--dim); } dl.record dd { margin: 0; overflow-wrap: anywhere; }
.caution { color: var(--warn); }
table { border-collapse: collapse; margin: 6px 0 4px; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 4px 0; caption-side: top; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
thead th { background: var(--soft); }
table.sortable thead tr:last-child th { cursor: pointer; user-select: none; }
table.sortable thead tr:last-child th::after { content: " \\2195"; color: #9aa3b0; font-size: 11px; }
th[aria-sort="ascending"]::after { content: " \\2191" !important; color: var(--ink) !important; }
th[aria-sort="descending"]::after { content: " \\2193" !important; color: var(--ink) !important; }
ul.notes { margin: 2px 0 14px; padding-left: 18px; color: var(--dim); font-size: 12.5px; }
.figures { display: flex; flex-wrap: wrap; gap: 18px; }
figure { margin: 0; flex: 0 1 540px; max-width: 100%; }
figure img { width: 100%; height: auto; border: 1px solid var(--line); }
th.group { text-align: center; border-bottom: 2px solid var(--line); }
figcaption { color: var(--dim); font-size: 12.5px; }
ul.files { columns: 3; font-size: 13px; }
.explain { color: var(--dim); font-size: 13px; max-width: 900px; }
.queries { display: grid; grid-template-columns: 1fr; gap: 14px; }
article.query { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
article.query header { display: grid; grid-template-columns: minmax(160px, 340px) 1fr; gap: 16px;
                        align-items: start; margin-bottom: 6px; }
.picked { color: var(--dim); font-size: 12.5px; }
.qtext { font-size: 15px; font-weight: 600; }
.dim { color: var(--dim); }
img.thumb { width: 96px; height: auto; image-rendering: auto; border: 1px solid var(--line); display: block; }
table.cands td.text { max-width: 460px; }
table.cands td:first-child, .above, .fneg { white-space: nowrap; }
tr.positive td { background: var(--pos); }
.yes { color: var(--ok); font-weight: 700; } .no { color: #9aa3b0; }
.above { color: var(--bad); font-weight: 700; }
.fneg { background: #fff0d6; color: var(--warn); border-radius: 3px; padding: 0 4px; font-size: 12px; }
table.counts td, table.counts th { padding: 2px 6px; }
"""

# in <head>, before any other script: every script error of the page is recorded
EARLY_JS = """
window.cocosProblems = [];
window.addEventListener('error', function (e) {
  window.cocosProblems.push('script error: ' + e.message);
  if (document.body) { document.body.setAttribute('data-selfcheck', 'fail: ' + window.cocosProblems.join('; ')); }
});
"""

JS = """
(function () {
  var problems = window.cocosProblems;
  function mark() {
    document.body.setAttribute('data-selfcheck', problems.length ? 'fail: ' + problems.join('; ') : 'ok');
  }
  function key(cell) {
    var v = cell ? cell.getAttribute('data-sort') : '';
    if (v === null) { v = cell.textContent; }
    var n = parseFloat(v);
    return isNaN(n) ? {n: null, t: (v || '').trim().toLowerCase()} : {n: n, t: ''};
  }
  function compare(a, b) {
    if (a.n !== null && b.n !== null) { return a.n - b.n; }
    if (a.n !== null) { return -1; }
    if (b.n !== null) { return 1; }
    return a.t < b.t ? -1 : (a.t > b.t ? 1 : 0);
  }
  function sortBy(th) {
    var table = th.closest('table'), body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var up = th.getAttribute('aria-sort') !== 'ascending';
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var c = compare(key(r.cells[col]), key(s.cells[col]));
      return up ? c : -c;
    });
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', up ? 'ascending' : 'descending');
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll('table.sortable thead tr:last-child th').forEach(function (th) {
    th.tabIndex = 0;
    th.addEventListener('click', function () { sortBy(th); });
    th.addEventListener('keydown', function (e) { if (e.key === 'Enter') { sortBy(th); } });
  });
  window.addEventListener('load', function () {
    document.querySelectorAll('img').forEach(function (img) {
      if (!img.complete || !img.naturalWidth) { problems.push('image not loaded: ' + img.getAttribute('src')); }
    });
    document.querySelectorAll('table.sortable').forEach(function (t) {
      if (!t.tBodies.length || !t.tBodies[0].rows.length) { problems.push('empty table: ' + (t.id || '?')); }
    });
    if (location.hash === '#selftest-sort') {
      var heads = document.querySelectorAll('table.sortable thead tr:last-child');
      if (heads.length) { heads[0].lastElementChild.click(); }
    }
    mark();
  });
})();
"""


def _e(text) -> str:
    return escape(str(text), quote=True)


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> str:
    """A whole page: ``sections`` are ``(id, heading, inner html)``; empty ones are left out."""
    shown = [(sid, head, body) for sid, head, body in sections if body]
    toc = " ".join(f'<a href="#{_e(sid)}">{_e(head)}</a>' for sid, head, _ in shown)
    parts = [f'<section id="{_e(sid)}"><h2>{_e(head)}</h2>\n{body}\n</section>' for sid, head, body in shown]
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n<script>{EARLY_JS}</script>\n</head>\n<body>\n"
            f"<header class=\"top\"><h1>{_e(title)}</h1><p>{_e(subtitle)}</p><nav class=\"toc\">{toc}</nav></header>\n"
            "<main>\n" + "\n".join(parts) + "\n</main>\n"
            f"<script>{JS}</script>\n</body>\n</html>\n")


# -- tables -----------------------------------------------------------------------------------


def _sort_value(cell: Cell) -> str:
    if cell.text is not None:
        return cell.text
    if cell.mean is None or (isinstance(cell.mean, float) and math.isnan(cell.mean)):
        return ""
    return repr(float(cell.mean))


def table_html(table: Table, index: int = 0) -> str:
    """One :class:`~cocos.report.tables.Table` as a sortable HTML table: the group header above the column names,
    cells as in ``tables.md`` (the same ``mean ± std``), footnotes below."""
    runs = _groups(table.columns)
    n_labels = len(table.label_columns)
    head = []
    if any(group for group, _, _ in runs):
        cells = [f'<th colspan="{n_labels}"></th>'] if n_labels else []
        cells += [f'<th colspan="{last - first + 1}" class="group">{_e(group)}</th>' for group, first, last in runs]
        head.append("<tr>" + "".join(cells) + "</tr>")
    names = [f"<th>{_e(name)}</th>" for name in table.label_columns]
    names += [f'<th class="num">{_e(c.name)}</th>' for c in table.columns]
    head.append("<tr>" + "".join(names) + "</tr>")
    rows = []
    for row in table.rows:
        cells = [f"<td>{_e(label)}</td>" for label in row.labels]
        cells += [f'<td class="num" data-sort="{_e(_sort_value(c))}">{_e(c.plain)}'
                  + (f"<sup>{_e(c.mark)}</sup>" if c.mark else "") + "</td>" for c in row.cells]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    notes = "".join(f"<li>{f'<sup>{_e(n.mark)}</sup> ' if n.mark else ''}{_e(n.text)}</li>" for n in table.footnotes)
    return (f'<table class="sortable" id="table-{index}"><caption>{_e(table.title)}</caption>'
            f"<thead>{''.join(head)}</thead><tbody>{''.join(rows)}</tbody></table>"
            + (f'<ul class="notes">{notes}</ul>' if notes else ""))


def tables_html(tables: Sequence[Table]) -> str:
    return "\n".join(table_html(t, i) for i, t in enumerate(tables))


def figures_html(names: Iterable[str]) -> str:
    """Each PNG by its relative path, with its file name as the caption."""
    shown = [f'<figure><a href="{_e(n)}"><img src="{_e(n)}" alt="{_e(n)}"></a><figcaption>{_e(n)}</figcaption>'
             "</figure>" for n in names]
    return f'<div class="figures">{"".join(shown)}</div>' if shown else ""


def links_html(links: Sequence[tuple[str, str | None, str]]) -> str:
    """A list of ``(text, href or None, detail)``: a link where the target is known, else the text alone."""
    items = []
    for text, href, detail in links:
        head = f'<a href="{_e(href)}">{_e(text)}</a>' if href else _e(text)
        items.append(f"<li>{head}{f' <span class=dim>{_e(detail)}</span>' if detail else ''}</li>")
    return f"<ul>{''.join(items)}</ul>" if items else ""


def files_html(names: Iterable[str]) -> str:
    items = "".join(f'<li><a href="{_e(n)}">{_e(n)}</a></li>' for n in names)
    return f'<ul class="files">{items}</ul>' if items else ""


# -- the run's record -------------------------------------------------------------------------


def _params(params: dict) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in params.items())


def record_items(results: Results, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """``(term, value)`` pairs of what ``results.json`` records: model, source, data, training, counting,
    evaluation (``extra``: more pairs, after the data)."""
    src, data, c = results.source, results.data, results.counting
    items = [("Model", f"{results.model.label}" + (f" ({results.model.kind})" if results.model.kind else ""))]
    what = f"checkpoint {src.path}" + (f" (epoch {src.epoch})" if src.epoch is not None else "") \
        if src.kind == "analyze" else f"embeddings {src.path}"
    items.append(("Source", f"{what}; sha256 {src.sha256[:16]}"))
    items.append(("Data", f"{data.name}: {data.n_images} images, {data.n_captions} captions"
                          + (f", {data.k} per image" if data.k else "")
                          + (f", split {data.split_counted}" if data.split_counted else "")))
    items.append(("Data path", f"{data.path} (fingerprint {data.fingerprint[:16]})"))
    items += list(extra)
    if results.training is not None:
        items += _training_items(results)
    mode = "compat (published counter)" if c.compat else "corrected"
    batches = ", ".join(f"{n} {kind} batches" for kind, n in c.n_batches.items())
    items.append(("Counting", f"{mode} shown; batch size {c.batch_size}, seed {c.seed}, {batches}"))
    for name in c.losses:
        items.append((f"Counter {results.look(name).label}", _params(c.params.get(name, {})) or "no parameters"))
    if c.eps_sweep:
        items.append(("ε sweep", ", ".join(f"{e:g}" for e in c.eps_sweep)))
    if results.evaluation is not None:
        items.append(("Evaluation", _evaluation_text(results)))
    items.append(("cocos", results.cocos_version))
    return items


def _training_items(results: Results) -> list[tuple[str, str]]:
    t = results.training
    text = f"{results.look(t.loss).label} ({_params(t.params) or 'default parameters'}), seed {t.seed}"
    items = [("Training", text)]
    if t.ltd:
        items.append(("LTD", _params(t.ltd)))
    if t.warmup_epochs:
        items.append(("Warm-up", f"{t.warmup_epochs} epochs of {t.warmup_loss}"))
    return items


def _evaluation_text(results: Results) -> str:
    e = results.evaluation
    m = e.metrics
    parts = [f"{e.split} ({e.n_images} images, {e.n_captions} captions): rsum {m.get('rsum', float('nan')):.1f}"]
    for d in ("i2t", "t2i"):
        recalls = "/".join(f"{m[f'{d}_R@{k}']:.1f}" for k in (1, 5, 10) if f"{d}_R@{k}" in m)
        if recalls:
            parts.append(f"{d} R@1/5/10 {recalls}")
    if "mAP@5" in m:
        parts.append(f"mAP@5 {m['mAP@5']:.3f}")
    return "; ".join(parts)


def record_html(items: Sequence[tuple[str, str]], cautions: Sequence[str] = ()) -> str:
    rows = "".join(f"<dt>{_e(term)}</dt><dd>{_e(value)}</dd>" for term, value in items)
    rows += "".join(f'<dt class="caution">Caution</dt><dd class="caution">{_e(note)}</dd>' for note in cautions)
    return f'<dl class="record">{rows}</dl>'


# -- the query explorer -----------------------------------------------------------------------


def _weight(value: float, threshold: float) -> str:
    if threshold == 0 and float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"


def _item_html(record: dict, thumbs: set) -> str:
    """A query's or candidate's content: the caption text, the image thumbnail, or the dataset row; a candidate's
    place in the batch (two rows of a pair batch may hold one image)."""
    kind, item = record["item_kind"], record["item"]
    place = ""
    if "column" in record:
        place = f" · batch {'column' if kind == 'caption' else 'row'} {record['column']}"
    if kind == "caption":
        label = f'<span class="dim">caption {item} (image {record["image"]}){place}</span>'
        return (f"{_e(record['text'])}<br>{label}" if record.get("text") is not None else label)
    name = f"thumbs/image_{item}.png"
    if name in thumbs:
        return (f'<img class="thumb" src="{_e(name)}" alt="image {item}">'
                f'<span class="dim">image {item}{place}</span>')
    described = f' “{_e(record["image_text"])}”' if record.get("image_text") else ""
    return f'{described}<br><span class="dim">image {item}{place}</span>' if described else \
        f'<span class="dim">image {item}{place}</span>'


def _counts_table(counts: list, meta: dict) -> str:
    rows = []
    for c in counts:
        spec = meta["losses"][c["loss"]]
        table = _e(fmt(c["table"])) if c["table"] is not None else (
            '<span title="the counting run has no per-query value of this count here (compat Triplet t2i: one '
            'per negative image)">n/a</span>')
        rows.append(f"<tr><td>{_e(spec['label'])}</td><td>{_e(c['stat'])}</td><td class=num>{table}</td>"
                    f"<td class=num>{_e(fmt(c['recount']))}</td><td class=num>{c['marked']}</td></tr>")
    return ('<table class="counts"><thead><tr><th>loss</th><th>statistic</th><th class=num>counting run</th>'
            "<th class=num>recounted here</th><th class=num>contributing negatives</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _candidates_table(query: dict, cands: list, weights: dict, losses: list, meta: dict, thumbs: set) -> str:
    head = "".join(f'<th class="num" title="{_e(meta["losses"][n]["rule"])}">{_e(meta["losses"][n]["label"])}</th>'
                   for n in losses)
    rows = []
    for c in cands:
        cells = [f"<td>{_e(c['role'])} {c['rank']}</td>", f'<td class="text">{_item_html(c, thumbs)}</td>',
                 f'<td class="num" data-sort="{c["similarity"]:.6f}">{c["similarity"]:.3f}</td>']
        for n in losses:
            w = weights.get((n, c["column"]))
            if w is None or c["role"] == "positive":
                cells.append('<td class="num" data-sort="">—</td>')
                continue
            sign = '<span class="yes">✓</span>' if w["contributes"] else '<span class="no">·</span>'
            cells.append(f'<td class="num" data-sort="{w["weight"]!r}">{sign} '
                         f'{_e(_weight(w["weight"], meta["losses"][n]["threshold"]))}</td>')
        flags = []
        if c["above_positive"]:
            flags.append('<span class="above" title="scores above the weakest positive">▲ above positive</span>')
        if c["likely_false_negative"]:
            flags.append(f'<span class="fneg" title="Jaccard {c["jaccard"]:.2f}">likely false negative</span>')
        cells.append(f"<td>{' '.join(flags)}</td>")
        rows.append(f'<tr class="{_e(c["role"])}">{"".join(cells)}</tr>')
    return (f'<table class="cands sortable" id="cands-{query["query"]}"><thead><tr><th>role</th><th>candidate</th>'
            f'<th class="num">similarity</th>{head}<th>flags</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _picked_text(picked: list, meta: dict) -> str:
    return "; ".join(f"{p['which']} {meta['losses'][p['loss']]['stat']} of {meta['losses'][p['loss']]['label']} "
                     f"({fmt(p['value'])})" for p in picked)


def explorer_html(records: dict, thumbs: Iterable[str] = ()) -> str:
    """The query explorer: per direction, each picked query with its counts and its candidates (positives, then
    the nearest negatives) with each loss's weight and contribution mark."""
    if not records.get("queries"):
        return ""
    meta, thumbs = records["meta"], set(thumbs)
    by_query: dict = {}
    for key in ("candidates", "counts"):
        for r in records[key]:
            by_query.setdefault((key, r["query"]), []).append(r)
    weights = {(w["query"], w["loss"], w["column"]): w for w in records["weights"]}
    parts = [_explorer_intro(meta)]
    for direction, title in (("i2t", "Image queries (i2t): captions as candidates"),
                             ("t2i", "Caption queries (t2i): images as candidates")):
        queries = [q for q in records["queries"] if q["direction"] == direction]
        if not queries:
            continue
        parts.append(f"<h3>{_e(title)}</h3><div class=\"queries\">")
        for q in queries:
            counts = by_query.get(("counts", q["query"]), [])
            losses = [c["loss"] for c in counts]
            own = {(n, col): w for (qid, n, col), w in weights.items() if qid == q["query"]}
            parts.append(
                f'<article class="query" id="query-{q["query"]}"><header><div>{_item_html(q, thumbs)}</div>'
                f'<div><div class="picked">{_e(_picked_text(q["picked"], meta))}</div>'
                f'<div class="dim">{_e(q["layout"])} batch {q["batch"]}, query {q["position"]}</div>'
                f"{_counts_table(counts, meta)}</div></header>"
                f"{_candidates_table(q, by_query.get(('candidates', q['query']), []), own, losses, meta, thumbs)}"
                "</article>")
        parts.append("</div>")
    return "\n".join(parts)


def _explorer_intro(meta: dict) -> str:
    rules = "".join(f"<li>{_e(spec['label'])}: {_e(spec['rule'])}</li>" for spec in meta["losses"].values())
    fneg = (f"<li>Likely false negative: {_e(meta['false_negative_rule'])}.</li>" if meta.get("false_negative_rule")
            else "<li>No caption texts: items are shown as dataset rows, and false negatives are not flagged.</li>")
    return (f'<p class="explain">Training queries in the batch they were counted in ({_e(meta["mode"])} counting). '
            f"From a sample of {meta['sample_size']} (batch, query) positions per batch layout and direction "
            f"(seed {meta['seed']}), for each loss the queries with the most, the median and the fewest "
            f"contributing candidates; each with its positives and its {meta['top']} nearest negatives. "
            "Each query's count comes from the counting run (its per-query values, <code>queries.csv</code> with "
            "<code>--per-query</code>) and is recounted here from the counter's per-pair weights on the same "
            "batch; ✓ marks a contributing negative, with its weight; the contributing negatives are those of the "
            "whole batch, not only the ones shown.</p>"
            f'<ul class="explain">{rules}<li>▲ above positive: {_e(meta["above_rule"])}.</li>{fneg}</ul>')


# -- the two pages ----------------------------------------------------------------------------


def folder_page(results: Results, tables: Sequence[Table], figures: Sequence[str], files: Sequence[str], *,
                explorer: dict | None = None, thumbs: Iterable[str] = (), extra: Sequence[tuple[str, str]] = (),
                links: Sequence[tuple[str, str | None, str]] = ()) -> str:
    """``index.html`` of an analysis or count folder."""
    trained = f" trained with {loss_label(results.training.loss, results)}" if results.training is not None else ""
    title = f"COCOS of {results.model.label}{trained} on {results.data.name}"
    subtitle = ("checkpoint analysis" if results.source.kind == "analyze" else "counted embeddings") + \
        f" · {'compat' if results.counting.compat else 'corrected'} counting shown · cocos {results.cocos_version}"
    return page(title, subtitle, [
        ("run", "Run", record_html(record_items(results, extra), results.honesty_notes())),
        ("tables", "Tables", tables_html(tables)),
        ("figures", "Figures", figures_html(figures)),
        ("explorer", "Query explorer", explorer_html(explorer or {}, thumbs)),
        ("links", "Related pages", links_html(links)),
        ("files", "Files", files_html(files)),
    ])


def report_page(title: str, subtitle: str, sources: Sequence[tuple[str, str | None, str]], tables: Sequence[Table],
                figures: Sequence[str], files: Sequence[str], warnings: Sequence[str] = ()) -> str:
    """``index.html`` of a merged report: the analysed folders (linked where their page is known), the tables,
    the figures, the warnings and the folder's files."""
    notes = "".join(f'<li class="caution">{_e(w)}</li>' for w in warnings)
    return page(title, subtitle, [
        ("sources", "Analyses", links_html(sources)),
        ("warnings", "Warnings", f"<ul>{notes}</ul>" if notes else ""),
        ("tables", "Tables", tables_html(tables)),
        ("figures", "Figures", figures_html(figures)),
        ("files", "Files", files_html(files)),
    ])


# -- a merged report's page, from its folder ----------------------------------------------------


def href(target: str | os.PathLike, base: str | os.PathLike) -> str:
    """The relative link from folder ``base`` to ``target`` (URL-quoted, ``/`` separators)."""
    rel = os.path.relpath(os.path.abspath(target), os.path.abspath(base))
    return quote(Path(rel).as_posix())


def source_links(report, out: str | os.PathLike) -> list[tuple[str, str | None, str]]:
    """Each analysed folder of a merged report (``report``: a :class:`cocos.report.merge.Report`) as ``(text, href,
    detail)``: its ``index.html`` where it exists, else its ``results.json``; a tracked run's ``cocos_track.csv``;
    no link where neither exists. Links are relative to the report folder ``out`` (where it ends up)."""
    links = []
    for r in report.results:
        trained = f", trained with {loss_label(r.training.loss, r)}" if r.training is not None else ""
        text = f"{r.model.label} on {r.data.name}{trained}"
        where = Path(r.where)
        target = next((p for p in (where.parent / "index.html", where) if p.is_file()), None)
        link = href(target, out) if target else None
        links.append((text, link, link or r.where))
    for folder, _, _ in report.tracks:
        target = next((p for p in (Path(folder) / "index.html", Path(folder) / "cocos_track.csv") if p.is_file()),
                      None)
        links.append((f"COCOS tracked during training: {Path(folder).name}", href(target, out) if target else None,
                      str(folder)))
    return links


def report_index(report, folder: Path, out: str | os.PathLike, subtitle: str = "") -> str:
    """``index.html`` of the merged report being written in ``folder`` (its PNGs and files as they are now) that
    ends up at ``out``."""
    figures = sorted(p.name for p in folder.glob("*.png"))
    files = sorted([p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")] + ["index.html"])
    return report_page(report.label and f"COCOS report (by {report.label})" or "COCOS report", subtitle,
                       source_links(report, out), report.tables, figures, files, report.warnings)


def _page_title(index: Path) -> str:
    """The ``<title>`` of a page cocos wrote (its folder's name where there is none)."""
    text = index.read_text(encoding="utf-8", errors="replace")
    start, end = text.find("<title>"), text.find("</title>")
    return unescape(text[start + 7:end]) if 0 <= start < end else index.parent.name


def collection_page(folder: Path, title: str, subtitle: str = "") -> str:
    """``index.html`` of a folder of reports (a demo's, a sweep's): a link to each subfolder's page (the merged
    ``summary/`` first) under its own title, and the folder's README and files; ``folder`` as it is now (its
    subfolders written), links relative to it."""
    pages = sorted((p for p in folder.glob("*/index.html")), key=lambda p: (p.parent.name != "summary", p.parent.name))
    links = [(f"{p.parent.name}/: {_page_title(p)}", quote(f"{p.parent.name}/index.html"), "") for p in pages]
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    return page(title, subtitle, [("reports", "Reports", links_html(links)), ("files", "Files", files_html(files))])
