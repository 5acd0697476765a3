"""The query explorer of a report page: a few training queries in the batch they were counted in.

For each direction a seeded sample of the counted (batch, query) positions of each batch layout is drawn; for each
loss the sample's queries with the most, the median and the fewest contributing candidates (the loss's per-query
count in the shown mode, e.g. ``C_q`` or ``C_qv-``) are shown with their positives and their :data:`TOP` nearest
negatives. Each batch is taken from the run's own batch plan (:attr:`cocos.counting.engine.CountRun.plans`) and
recounted alone by each loss's counter (as :func:`cocos.counting.count_queries` counts a batch): each shown
negative carries each loss's per-pair weight (:attr:`cocos.losses.counts.Count.weights`) and whether it contributes
(weight above the counter's threshold ``eps``, above 0 for a counter without one: a violating triplet), next to the
count the engine wrote for that query (``queries.csv``). The two are independent computations of the same number
(``recount``; SmoothAP's from its per-anchor weights, as its ``C_q`` also counts positives).

Likely false negatives are flagged by text: two captions are near-duplicates when the Jaccard index of their token
sets (lower case, punctuation removed) is at least :data:`JACCARD` (0.8). A negative caption is flagged when it is a
near-duplicate of a caption of the query image; a negative image when one of its captions is a near-duplicate of the
query caption. Negatives that score above the query's weakest positive are marked as such.

:func:`explore` returns tidy records (``explorer.json``); :func:`write_thumbnails` writes the images it shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from cocos.counting.engine import CountRun, EmbeddingSet
from cocos.data.layout import QueryView, batch_similarity
from cocos.losses.base import intra_similarities
from cocos.objectives import OBJECTIVES

TOP = 8  # nearest negatives shown per query
SAMPLE = 256  # (batch, query) positions drawn per layout and direction
SEED = 0
JACCARD = 0.8
THUMB = 96  # thumbnail side in pixels
WHICH = ("most", "median", "fewest")
FALSE_NEGATIVE_RULE = (f"a negative caption whose token set (lower case, punctuation removed) has a Jaccard index "
                       f">= {JACCARD} with a caption of the query image; a negative image with a caption at Jaccard "
                       f">= {JACCARD} from the query caption")
ABOVE_RULE = "a negative whose similarity to the query is above that of the query's weakest positive"


@dataclass
class LabelledEmbeddings(EmbeddingSet):
    """An :class:`~cocos.counting.engine.EmbeddingSet` that knows its items: the captions' ``texts`` (in caption
    row order) and the ``pictures`` (a split with ``image(i)`` giving image row ``i`` as PIL, for thumbnails)."""

    texts: list | None = None
    pictures: object | None = None

    @classmethod
    def of(cls, emb: EmbeddingSet, texts=None, pictures=None) -> LabelledEmbeddings:
        """``emb`` (its tensors shared, not copied) with its items; ``texts`` must have one entry per caption."""
        base = {f.name: getattr(emb, f.name) for f in fields(EmbeddingSet)}
        if texts is not None and len(texts) != emb.n_captions:
            texts = None
        if pictures is not None and not callable(getattr(pictures, "image", None)):
            pictures = None
        return cls(**base, texts=None if texts is None else [str(t) for t in texts], pictures=pictures)


def tokens(text: str) -> frozenset:
    """The token set of a caption: lower case, every character that is not a letter, digit or space dropped."""
    return frozenset(re.sub(r"[^\w\s]|_", " ", text.lower()).split())


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def contribution_threshold(loss: str, params: dict) -> float:
    """Above which per-pair weight a negative contributes: the counter's ``eps`` where its count uses one, else 0."""
    spec = OBJECTIVES.get(loss)
    return float(params.get("eps", 0.0)) if spec is not None and spec.uses_eps else 0.0


def rule_text(loss: str, params: dict) -> str:
    threshold = contribution_threshold(loss, params)
    if threshold:
        text = f"contributes: weight > ε = {threshold:g}"
    else:
        text = "contributes: weight > 0 (violating triplets, 0/1 per positive)"
    if loss == "smoothap":
        text += ("; C_q averages over the anchors (positives) the candidates, positives included, with w(a, b) > ε: "
                 "the recount uses the per-anchor weights, the shown weight is their sum")
    return text


@dataclass
class _Batch:
    """One counted batch recounted alone: the rows, the similarities and each loss's counts per direction."""

    captions: np.ndarray  # (M,) caption rows
    images: np.ndarray  # (B,) image rows
    scores: torch.Tensor  # (B, M)
    layout: object  # BatchLayout
    counts: dict  # (loss, direction) -> Count
    anchors: dict  # (loss, direction) -> per-query recount where it is not the marks' count (SmoothAP)


def _plan_layout(loss: str) -> str | None:
    spec = OBJECTIVES.get(loss)
    return spec.layout if spec is not None else None


def explore(run: CountRun, emb: EmbeddingSet, compat: bool, *, sample: int = SAMPLE, seed: int = SEED,
            top: int = TOP) -> dict:
    """The explorer's records (see the module docstring): ``meta``, ``queries``, ``candidates``, ``weights`` and
    ``counts`` (lists of flat dicts); empty lists where the run kept no per-query values."""
    mode = "compat" if compat else "corrected"
    losses = [n for n in run.losses if _plan_layout(n) in run.plans]
    texts = getattr(emb, "texts", None)
    meta = {"mode": mode, "sample_size": int(sample), "seed": int(seed), "top": int(top), "jaccard": JACCARD,
            "false_negative_rule": FALSE_NEGATIVE_RULE if texts is not None else None, "above_rule": ABOVE_RULE,
            "batch_size": run.batch_size, "counting_seed": run.seed,
            "losses": {n: {"stat": OBJECTIVES[n].main_stat, "label": OBJECTIVES[n].label, "layout": _plan_layout(n),
                           "threshold": contribution_threshold(n, run.params[n]), "rule": rule_text(n, run.params[n])}
                       for n in losses},
            "texts": texts is not None, "images": getattr(emb, "pictures", None) is not None}
    out = {"meta": meta, "queries": [], "candidates": [], "weights": [], "counts": []}
    if run.queries is None or not losses:
        return out
    rows = run.queries.groupby(["loss", "direction", "mode"], sort=False, observed=True).indices  # one pass
    tables = {(n, d): _table_values(run.queries, rows.get((n, d, mode)), n, d) for n in losses for d in ("i2t", "t2i")}
    context = _Context(run, emb, mode, top, tables)
    batches: dict = {}
    for qid, ((layout, direction, b, q), picked) in enumerate(_picks(tables, losses, sample, seed).items()):
        key = (layout, b)
        if key not in batches:
            batches[key] = _recount(run, emb, layout, b, [n for n in losses if _plan_layout(n) == layout], compat)
        _entry(out, context, qid, batches[key], (layout, direction, b, q), picked)
    return _finite(out)


@dataclass
class _Context:
    run: CountRun
    emb: EmbeddingSet
    mode: str
    top: int
    tables: dict  # (loss, direction) -> the engine's per-query counts (n_batches, Q), or None


def _finite(obj):
    """``obj`` with every NaN or infinite float as None (strict JSON)."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def _picks(tables: dict, losses: list, sample: int, seed: int) -> dict:
    """``{(layout, direction, batch, query): [{"loss", "which", "value"}, ...]}`` in direction, loss, which order."""
    picks: dict = {}
    for direction in ("i2t", "t2i"):
        positions = {}
        for loss in losses:
            layout = _plan_layout(loss)
            values = tables[(loss, direction)]
            if values is None:
                continue
            if layout not in positions:
                rng = np.random.default_rng(seed)
                n = values.size
                positions[layout] = np.sort(rng.choice(n, size=min(sample, n), replace=False))
            chosen = values.reshape(-1)[positions[layout]]
            for which, at in zip(WHICH, _spread(chosen), strict=True):
                b, q = divmod(int(positions[layout][at]), values.shape[1])
                picks.setdefault((layout, direction, b, q), []).append(
                    {"loss": loss, "which": which, "value": float(chosen[at])})
    return picks


def _spread(values: np.ndarray) -> tuple[int, int, int]:
    """Indices of the largest, the median and the smallest value (first of ties; NaN last)."""
    order = np.argsort(np.where(np.isnan(values), -np.inf, values), kind="stable")[::-1]
    order = np.concatenate([order[~np.isnan(values[order])], order[np.isnan(values[order])]])
    defined = int((~np.isnan(values)).sum()) or len(values)
    most = order[0]
    fewest = order[defined - 1]
    by_value = np.argsort(values[order[:defined]], kind="stable")
    median = order[:defined][by_value[(defined - 1) // 2]]
    return int(most), int(median), int(fewest)


def _table_values(queries, rows, loss: str, direction: str) -> np.ndarray | None:
    """The engine's per-query count of ``loss`` (its main statistic) in ``direction`` as ``(n_batches, Q)``, from
    the ``rows`` of the per-query table of one mode; None where its rows are not per query (the compat Triplet t2i
    regrouping by negative image) or missing."""
    stat = OBJECTIVES[loss].main_stat
    if rows is None or not len(rows) or stat not in queries.columns:
        return None
    part = queries.iloc[rows]
    if (part["item_kind"] != ("image" if direction == "i2t" else "caption")).any():
        return None
    part = part.sort_values(["batch", "query"], kind="stable")
    nb = int(part["batch"].max()) + 1
    if len(part) % nb:
        return None
    return part[stat].to_numpy(dtype=float).reshape(nb, -1)


def _recount(run: CountRun, emb: EmbeddingSet, layout: str, b: int, losses: list, compat: bool) -> _Batch:
    """Batch ``b`` of the run's ``layout`` plan, its similarities and every loss's :class:`Count` per direction,
    counted by the loss's own counter on this batch alone (as :func:`cocos.counting.count_queries` counts one)."""
    plan = run.plans[layout]
    cap, img = np.asarray(plan.captions[b]), np.asarray(plan.images[b])
    # one batch: counted on the CPU, wherever the embeddings are
    images = emb.images[torch.as_tensor(img, device=emb.images.device)].cpu()
    captions = emb.captions[torch.as_tensor(cap, device=emb.captions.device)].cpu()
    caption_image, image_ids = (np.arange(len(img)), img) if layout == "pair" else (None, None)
    scores, lay = batch_similarity(images, captions, caption_image, image_ids)
    counts, anchors = {}, {}
    for loss in losses:
        params = run.params[loss]
        counter = OBJECTIVES[loss].make_counter(**params)
        for d, view in _views(counter, images, captions, scores, lay, caption_image, compat).items():
            counts[(loss, d)] = counter.count(view)
            if hasattr(counter, "pair_weights"):  # SmoothAP: C_q over the anchors, positives included
                w, divisor = counter.pair_weights(view)
                anchors[(loss, d)] = ((w > params["eps"]).sum((-1, -2)).to(torch.float64)
                                      / divisor.to(torch.float64)).numpy()
    return _Batch(cap, img, scores, lay, counts, anchors)


def _views(counter, images, captions, scores, lay, caption_image, compat: bool) -> dict:
    """Both directions' :class:`~cocos.data.layout.QueryView` of one batch for ``counter``: of the similarities
    (of a whole-batch callable's ``dL/dS``), with the queries' own similarities where the counter needs them."""
    if getattr(counter, "needs_embeddings", False):
        scores = counter.gradients(images, captions, caption_image)
    intra = intra_similarities(images, captions) if getattr(counter, "needs_intra", False) else {}
    views = {}
    for d in ("i2t", "t2i"):
        pos, neg = lay.masks(d, compat)
        oriented = scores if d == "i2t" else scores.transpose(-1, -2).contiguous()
        views[d] = QueryView(scores=oriented, pos=pos, neg=neg, direction=d, group_size=lay.group_size,
                             compat=compat, intra=intra.get(d))
    return views


def _entry(out: dict, context: _Context, qid: int, batch: _Batch, where: tuple, picked: list) -> None:
    """Append the records of one query (``where``: layout, direction, batch, position) to ``out``."""
    layout, direction, b, q = where
    emb = context.emb
    s = batch.scores if direction == "i2t" else batch.scores.T
    pos, neg = batch.layout.masks(direction, context.mode == "compat")
    row, pos, neg = s[q].double().numpy(), pos[q].numpy(), neg[q].numpy()
    query_item = int(batch.images[q] if direction == "i2t" else batch.captions[q])
    texts = getattr(emb, "texts", None)
    out["queries"].append({"query": qid, "direction": direction, "layout": layout, "batch": b, "position": q,
                           "item_kind": "image" if direction == "i2t" else "caption", "item": query_item,
                           "image": int(emb.caption_image[query_item]) if direction == "t2i" else query_item,
                           "text": texts[query_item] if texts is not None and direction == "t2i" else None,
                           "image_text": _image_text(emb, query_item) if direction == "i2t" else None,
                           "picked": picked})
    negatives = np.flatnonzero(neg)
    shown = negatives[np.argsort(-row[negatives], kind="stable")[:context.top]]
    cand_items = batch.captions if direction == "i2t" else batch.images
    _candidate_records(out, emb, qid, direction, query_item, row, np.flatnonzero(pos), shown, cand_items)
    for loss in (n for n in context.run.losses if (n, direction) in batch.counts):
        _loss_records(out, context, qid, loss, batch, where, neg, shown, cand_items)


def _candidate_records(out: dict, emb: EmbeddingSet, qid: int, direction: str, query_item: int, row: np.ndarray,
                       positives: np.ndarray, shown: np.ndarray, cand_items: np.ndarray) -> None:
    """The query's positives and its shown negatives (columns of the batch), with their flags."""
    texts = getattr(emb, "texts", None)
    kind = "caption" if direction == "i2t" else "image"
    weakest = float(row[positives].min()) if len(positives) else np.inf
    duplicates = _false_negatives(emb, direction, query_item, cand_items[shown]) if texts is not None else {}
    for role, columns in (("positive", positives), ("negative", shown)):
        negative = role == "negative"
        for rank, k in enumerate(columns, 1):
            item = int(cand_items[k])
            out["candidates"].append({
                "query": qid, "role": role, "rank": rank, "column": int(k), "item_kind": kind, "item": item,
                "image": int(emb.caption_image[item]) if kind == "caption" else item,
                "similarity": float(row[k]), "above_positive": bool(negative and row[k] > weakest),
                "likely_false_negative": bool(negative and duplicates.get(item, 0.0) >= JACCARD),
                "jaccard": duplicates.get(item) if negative else None,
                "text": texts[item] if texts is not None and kind == "caption" else None,
                "image_text": _image_text(emb, item) if kind == "image" else None})


def _loss_records(out: dict, context: _Context, qid: int, loss: str, batch: _Batch, where: tuple, neg: np.ndarray,
                  shown: np.ndarray, cand_items: np.ndarray) -> None:
    _, direction, b, q = where
    count = batch.counts[(loss, direction)]
    threshold = contribution_threshold(loss, context.run.params[loss])
    weights = count.weights[q].double().numpy() if count.weights is not None else np.zeros(len(neg))
    marks = neg & (weights > threshold)
    for k in shown:
        out["weights"].append({"query": qid, "loss": loss, "column": int(k), "item": int(cand_items[k]),
                               "weight": float(weights[k]), "contributes": bool(marks[k])})
    stat = OBJECTIVES[loss].main_stat
    table = context.tables[(loss, direction)]
    recount = batch.anchors.get((loss, direction))
    out["counts"].append({"query": qid, "loss": loss, "stat": stat, "threshold": threshold,
                          "table": None if table is None else float(table[b, q]),
                          "counter": float(count.per_query[stat][q]), "marked": int(marks.sum()),
                          "recount": float(recount[q]) if recount is not None else float(marks.sum())})


def _image_text(emb: EmbeddingSet, image: int) -> str | None:
    """The first caption of an image row (what describes an image without pixels), where the texts are known."""
    texts = getattr(emb, "texts", None)
    rows = np.flatnonzero(emb.caption_image == image) if texts is not None else ()
    return texts[int(rows[0])] if len(rows) else None


def _false_negatives(emb: EmbeddingSet, direction: str, query_item: int, negatives: np.ndarray) -> dict:
    """``{negative item: largest Jaccard index}`` against the query's captions (see the module docstring)."""
    texts = emb.texts
    if direction == "i2t":  # negative captions against every caption of the query image
        own = [tokens(texts[c]) for c in np.flatnonzero(emb.caption_image == query_item)]
        return {int(c): max((jaccard(tokens(texts[c]), t) for t in own), default=0.0) for c in negatives}
    query = tokens(texts[query_item])
    return {int(i): max((jaccard(query, tokens(texts[c])) for c in np.flatnonzero(emb.caption_image == i)),
                        default=0.0) for i in negatives}


def thumbnail_items(records: dict) -> list[int]:
    """The image rows the explorer shows (queries and candidates), in order, once each."""
    items = [r["item"] for r in records["queries"] if r["item_kind"] == "image"]
    items += [r["item"] for r in records["candidates"] if r["item_kind"] == "image"]
    return list(dict.fromkeys(items))


def thumbnail_name(item: int) -> str:
    return f"thumbs/image_{int(item)}.png"


def write_thumbnails(pictures, items, folder: Path, side: int = THUMB) -> list[str]:
    """Each image row of ``items`` as a PNG of ``side`` pixels on its longer side under ``folder/thumbs/``;
    returns the written names (relative to ``folder``)."""
    from PIL import Image

    names = []
    for item in items:
        image = pictures.image(int(item))
        scale = side / max(image.size)
        size = (max(1, round(image.size[0] * scale)), max(1, round(image.size[1] * scale)))
        name = thumbnail_name(item)
        (folder / name).parent.mkdir(exist_ok=True)
        image.resize(size, Image.Resampling.LANCZOS).save(folder / name, format="PNG")
        names.append(name)
    return names
