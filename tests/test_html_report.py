"""``index.html`` of every report folder, opened in a real browser, and the query explorer's numbers.

Headless Debian ``chromium`` (``.ci/run`` installs it) opens the pages of a tiny analysis of the precomputed world,
of the rendered image world (raw images: thumbnails), of ``cocos count`` on bare embeddings and of ``cocos report``
merging them: the DOM after the scripts ran (the page's self-check, the tables of ``tables.md``, the explorer's
queries, every ``src`` and ``href`` a local file), no console message, a screenshot that is not blank. The
explorer's contribution marks are checked against the per-query counts the engine wrote (``queries.csv``), and its
false-negative flags against the rule recomputed from the data folder's captions.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cli.main import app
from cocos.data.precomp import PrecompSplit
from cocos.data.synth import make_synthetic
from cocos.pipelines.explorer import JACCARD, jaccard, tokens
from cocos.report.html import page as html_page
from cocos.training.checkpoint import save_checkpoint
from cocos.training.trainer import TrainConfig, Trainer
from tests.helpers import figures_empty
from tests.test_analyze_images import SMALL, authors  # noqa: F401 - authors: the raw-image world, a module fixture
from tests.test_analyze_images import analyze as analyze_images

runner = CliRunner()
BATCH = 16
CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)


def _invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture(scope="module")
def folders(authors, tmp_path_factory):  # noqa: F811 - the imported fixture
    """The four kinds of page: an analysis of the precomputed world (one epoch of Triplet SH, no training run's
    files), ``cocos count`` of its saved embeddings, an analysis of the raw-image world and the merged report."""
    root = tmp_path_factory.mktemp("html")
    data = make_synthetic(root / "syn", n_train=64, n_dev=16, n_test=16, feature_dim=16, seed=3)
    cfg = TrainConfig.of(data=str(data), out=str(root / "run"), loss="triplet_sh", epochs=1, lr=2e-3,
                         batch_size=BATCH, embed_size=16, word_dim=8, device="cpu")
    trainer = Trainer(cfg, progress=False, log=lambda *a: None)
    trainer.train_epoch(1)
    trainer.epoch = 1
    (root / "run").mkdir()
    save_checkpoint(root / "run" / "model_best.pt", trainer.checkpoint({"rsum": 0.0}, full=False))
    with figures_empty({"pdf"}):  # the pages show the PNGs: this one's drawn
        _invoke("analyze", root / "run" / "model_best.pt", "--out", root / "analysis", "--batch-size", BATCH,
                "--seed", 4, "--no-progress", "--per-query", "--save-embeddings", root / "emb.npz")
    with placeholder_figures():  # the others' a small grey PNG each (figures are tested elsewhere)
        _invoke("count", root / "emb.npz", "--out", root / "count", "--batch-size", BATCH, "--per-query",
                "--no-progress")
        res = analyze_images(authors, root / "images", *SMALL, "--per-query")
        assert res.exit_code == 0, res.output
        _invoke("report", root / "analysis", root / "count", root / "images", "--out", root / "report")
    return {"root": root, "data": data, "analysis": root / "analysis", "count": root / "count",
            "images": root / "images", "report": root / "report"}


@contextlib.contextmanager
def placeholder_figures():
    """Figures saved as a 64 x 48 grey PNG (an empty PDF) instead of drawn: a page's ``<img>`` still loads."""
    from matplotlib.figure import Figure
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 200, 200)).save(buffer, format="PNG")

    def savefig(self, fname, *args, **kwargs):
        data = buffer.getvalue() if kwargs.get("format", Path(str(fname)).suffix[1:]) == "png" else b""
        if hasattr(fname, "write"):
            fname.write(data)
        else:
            Path(fname).write_bytes(data)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", savefig)
        yield


class _Page(HTMLParser):
    """What the tests read from a DOM: tags with their attributes, in order."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def all(self, tag, **attrs):
        return [a for t, a in self.tags if t == tag and all(attrs[k] in (a.get(k) or "").split() for k in attrs)]


def _chromium(args: list[str], profile: Path) -> subprocess.Popen:
    return subprocess.Popen([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def browsed(folders, tmp_path_factory):
    """Each page opened once, all at the same time: its DOM after its scripts ran (opened with ``#selftest-sort``:
    its first sortable table sorted by its last column) and a 1200 x 2000 screenshot. ``{kind: (dom, stderr,
    screenshot path)}``."""
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
    out = tmp_path_factory.mktemp("browsed")
    broken = out / "broken" / "index.html"  # a page whose self-check must fail: a missing image, a script error
    broken.parent.mkdir()
    broken.write_text(html_page("broken", "", [("x", "X", '<img src="missing.png"><script>noSuchFunction();</script>')]))
    folders = {**folders, "broken": broken.parent}
    runs = {kind: _chromium(["--dump-dom", f"--screenshot={out / f'{kind}.png'}", "--window-size=1200,2000",
                             (folders[kind] / "index.html").as_uri() + "#selftest-sort"], out / kind)
            for kind in ("analysis", "count", "images", "report", "broken")}
    pages = {}
    for kind, run in runs.items():
        html, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        pages[kind] = (html, err, out / f"{kind}.png")
    return pages


def _parsed(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


@pytest.mark.parametrize("kind", ["analysis", "count", "images", "report"])
def test_the_page_runs_its_scripts_without_errors_and_links_only_local_files(folders, browsed, kind):
    html, err, _ = browsed[kind]
    page = _parsed(html)
    body = page.all("body")[0]
    assert body.get("data-selfcheck") == "ok", body.get("data-selfcheck")
    assert [line for line in err.splitlines() if ":CONSOLE" in line or "Uncaught" in line] == []
    assert page.all("link") == [] and all("src" not in a for a in page.all("script"))  # everything inline
    folder = folders[kind]
    targets = [a["src"] for a in page.all("img")] + [a["href"] for a in page.all("a") if "href" in a]
    for target in targets:
        if target.startswith("#"):
            assert page.all("section", id=target[1:]) or any(a.get("id") == target[1:] for _, a in page.tags)
            continue
        assert urlparse(target).scheme == "", target  # nothing fetched: no http(s), no file:// either
        assert (folder / unquote(target)).is_file(), target


def test_the_self_check_and_the_console_catch_a_broken_page(browsed):
    html, err, _ = browsed["broken"]
    check = _parsed(html).all("body")[0]["data-selfcheck"]
    assert check.startswith("fail: ") and "missing.png" in check and "noSuchFunction" in check
    assert any(":CONSOLE" in line and "noSuchFunction" in line for line in err.splitlines())


@pytest.mark.parametrize("kind", ["analysis", "count", "images", "report"])
def test_the_page_holds_the_tables_of_tables_md_sortable(folders, browsed, kind):
    html, _, _ = browsed[kind]
    titles = re.findall(r"^\*\*(.+)\*\*$", (folders[kind] / "tables.md").read_text(), flags=re.M)
    captions = re.findall(r'<table class="sortable" id="table-\d+"><caption>(.*?)</caption>', html)
    assert len(captions) == len(titles) >= 2
    assert [unescape_text(c) for c in captions] == [t.replace("\\|", "|") for t in titles]
    # the self-test clicked the last header of the first table: its rows now ascend in that column
    first = html.split('id="table-0"', 1)[1].split("</table>", 1)[0]
    assert 'aria-sort="ascending"' in first
    keys = [_key(row) for row in re.findall(r"<tr>(.*?)</tr>", first.split("<tbody>", 1)[1])]
    numbers = [k for k in keys if k is not None]
    assert numbers == sorted(numbers)


def unescape_text(text: str) -> str:
    import html

    return html.unescape(text)


def _key(row: str):
    cells = re.findall(r'data-sort="([^"]*)"', row)
    try:
        return float(cells[-1]) if cells else None
    except ValueError:
        return None


@pytest.mark.parametrize("kind", ["analysis", "count", "images", "report"])
def test_the_screenshot_is_not_blank(browsed, kind):
    from PIL import Image

    _, _, path = browsed[kind]
    image = Image.open(path).convert("RGB")
    assert image.size == (1200, 2000)
    pixels = np.asarray(image).reshape(-1, 3)
    assert len(np.unique(pixels.astype(np.int32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.int32))) > 50  # colours
    assert (pixels.min(axis=1) < 235).mean() > 0.03  # text, tables and figures: not an empty white page


@pytest.mark.parametrize("kind", ["analysis", "count", "images"])
def test_the_explorer_shows_its_queries(folders, browsed, kind):
    records = json.loads((folders[kind] / "explorer.json").read_text())
    page = _parsed(browsed[kind][0])
    assert len(page.all("article", **{"class": "query"})) == len(records["queries"]) >= 6
    assert {q["direction"] for q in records["queries"]} == {"i2t", "t2i"}
    rows = [a for a in page.all("tr") if a.get("class") in ("positive", "negative")]
    assert len(rows) == len(records["candidates"])
    meta = records["meta"]
    assert meta["sample_size"] > 0 and meta["seed"] == 0 and meta["top"] == 8
    shown = [len([c for c in records["candidates"] if c["query"] == q["query"] and c["role"] == "negative"])
             for q in records["queries"]]
    # batches of 16 (the images': of 4, where a same-image pair leaves 2 negatives)
    assert all(n == 8 for n in shown) if kind != "images" else all(2 <= n <= 3 for n in shown)


def test_the_image_world_shows_thumbnails(folders, browsed):
    from PIL import Image

    records = json.loads((folders["images"] / "explorer.json").read_text())
    thumbs = [a["src"] for a in _parsed(browsed["images"][0]).all("img", **{"class": "thumb"})]
    shown = {c["item"] for c in records["candidates"] + records["queries"] if c["item_kind"] == "image"}
    assert records["meta"]["images"] and set(thumbs) == {f"thumbs/image_{i}.png" for i in shown}
    assert {max(Image.open(folders["images"] / t).size) for t in thumbs} == {96}
    assert not (folders["count"] / "thumbs").exists() and not (folders["analysis"] / "thumbs").exists()


def test_bare_embeddings_show_dataset_rows(folders, browsed):
    records = json.loads((folders["count"] / "explorer.json").read_text())  # cocos count: no texts
    assert not records["meta"]["texts"] and records["meta"]["false_negative_rule"] is None
    assert all(c["text"] is None and not c["likely_false_negative"] for c in records["candidates"])
    html = browsed["count"][0]
    assert re.search(r"caption \d+ \(image \d+\) · batch column \d+", html)
    assert "likely false negative</span>" not in html


def test_the_merged_report_links_each_analysed_folders_page(folders, browsed):
    hrefs = [a["href"] for a in _parsed(browsed["report"][0]).all("a") if "href" in a]
    for kind in ("analysis", "count", "images"):
        assert f"../{kind}/index.html" in hrefs


@pytest.mark.parametrize("kind", ["analysis", "count", "images"])
def test_the_explorer_marks_give_the_engines_per_query_counts(folders, kind):
    """Two computations: the engine's per-query values (``queries.csv``) and the explorer's marks on the same batch,
    recounted alone from the counters' per-pair weights; the query's dataset row is the engine's for that position
    (the same batch)."""
    records = json.loads((folders[kind] / "explorer.json").read_text())
    table = pd.read_csv(folders[kind] / "queries.csv")
    table = table[table["mode"] == records["meta"]["mode"]].set_index(["loss", "direction", "batch", "query"])
    queries = {q["query"]: q for q in records["queries"]}
    checked = set()
    for c in records["counts"]:
        q = queries[c["query"]]
        row = table.loc[(c["loss"], q["direction"], q["batch"], q["position"])]
        assert row["item"] == q["item"]
        assert row[c["stat"]] == pytest.approx(c["recount"], abs=1e-9), (c, q)
        assert c["table"] == pytest.approx(row[c["stat"]], abs=1e-12)
        if c["loss"] != "smoothap":  # every other count is the number of marked negatives
            assert c["marked"] == c["recount"]
        checked.add(c["loss"])
    assert checked >= ({"triplet", "triplet_sh", "ntxent", "smoothap"} if kind != "images" else {"triplet_sh"})
    for q in records["queries"]:  # each picked query is what it says: the most, the median or the fewest
        for pick in q["picked"]:
            count = next(c for c in records["counts"] if c["query"] == q["query"] and c["loss"] == pick["loss"])
            assert count["recount"] == pytest.approx(pick["value"])


def test_the_near_duplicate_rule():
    assert jaccard(tokens("A red ball, on the left."), tokens("a red ball on the LEFT")) == 1.0
    assert jaccard(tokens("a red ball"), tokens("a blue ball")) == pytest.approx(0.5)
    assert jaccard(tokens("a big red ball on the left"), tokens("a big red ball on the right")) < JACCARD


def _best_jaccard(query: dict, candidate: dict, texts: list, by_image: dict) -> float:
    """The rule restated: a negative caption against the query image's captions (i2t), a negative image's
    captions against the query caption (t2i)."""
    if query["direction"] == "i2t":
        return max(jaccard(tokens(texts[candidate["item"]]), t) for t in by_image[query["item"]])
    return max(jaccard(tokens(texts[query["item"]]), t) for t in by_image[candidate["item"]])


def test_false_negative_flags_follow_the_stated_rule(folders):
    records = json.loads((folders["analysis"] / "explorer.json").read_text())
    texts = list(PrecompSplit(folders["data"], "train", k=5).captions)  # the data folder's own captions
    by_image = {}
    for c, text in enumerate(texts):
        by_image.setdefault(c // 5, []).append(tokens(text))
    queries = {q["query"]: q for q in records["queries"]}
    for c in (c for c in records["candidates"] if c["role"] == "negative"):
        best = _best_jaccard(queries[c["query"]], c, texts, by_image)
        assert c["likely_false_negative"] == (best >= JACCARD) and c["jaccard"] == pytest.approx(best)
        assert c["text"] == (texts[c["item"]] if c["item_kind"] == "caption" else None)


def test_above_positive_marks_negatives_above_the_weakest_positive(folders):
    records = json.loads((folders["analysis"] / "explorer.json").read_text())
    weakest = {}
    for c in records["candidates"]:
        if c["role"] == "positive":
            weakest[c["query"]] = min(weakest.get(c["query"], np.inf), c["similarity"])
    negatives = [c for c in records["candidates"] if c["role"] == "negative"]
    assert [c["above_positive"] for c in negatives] == [c["similarity"] > weakest[c["query"]] for c in negatives]


def test_every_header_row_spans_all_the_columns():
    """The group header (i2t, t2i) above the column names spans exactly the columns of its group: the rows of a
    table's head add up to the same number of columns."""
    import re

    from cocos.report.html import table_html
    from cocos.report.merge import build_tables, group_results
    from tests.test_report_tables import as_results, make_results

    groups, _ = group_results([as_results(make_results("triplet_sh", 0))])
    tables = build_tables(groups, counters="all")
    assert any("i2t" in table_html(t) for t in tables)
    for t in tables:
        head = table_html(t).split("<thead>")[1].split("</thead>")[0]
        widths = [sum(int(n) for n in re.findall(r'colspan="(\d+)"', row)) + len(re.findall(r"<th(?: class=\"num\")?>", row))
                  for row in head.split("</tr>")[:-1]]
        assert len(widths) >= 1 and len(set(widths)) == 1, (t.title, widths)
        assert widths[0] == len(t.label_columns) + len(t.columns)


def test_a_folder_of_reports_links_each_page_summary_first(tmp_path):
    """The top page of a demo's or a sweep's folder (cocos.report.html.collection_page): one link per subfolder
    page, the merged summary first, each under that page's own title; files listed; every link resolves."""
    import re

    from cocos.report.html import collection_page, page

    for name, title in (("triplet", "COCOS of VSE++ & co"), ("summary", "COCOS report"), ("ntxent", "COCOS of B")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.html").write_text(page(title, "", []), encoding="utf-8")
    (tmp_path / "logs").mkdir()  # no page: not linked
    (tmp_path / "README.md").write_text("# x\n")
    html = collection_page(tmp_path, "cocos demo", "sub")
    links = re.findall(r'<a href="([^"#]+)">([^<]*)</a>', html)
    assert links == [("summary/index.html", "summary/: COCOS report"), ("ntxent/index.html", "ntxent/: COCOS of B"),
                     ("triplet/index.html", "triplet/: COCOS of VSE++ &amp; co"), ("README.md", "README.md")]
    assert all((tmp_path / target).is_file() for target, _ in links)
