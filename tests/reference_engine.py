"""A frozen copy of the counting engine's hot loop as it was before the one-pass rewrite (issue 20).

The slow reference of ``tests/test_engine_equivalence.py`` and ``benchmarks/bench_analyze.py``:
every counter's ``count`` and, per threshold of the sweep, ``sweep`` on views made
anew for each (loss, mode, direction), the per-query and batch values collected per
chunk of 32 batches and the tidy frames built at the end, exactly as the engine did.
It shares only the batch plan, the argument checks and the summaries with the engine
(not the hot loop, not the collector), so the two computations are independent.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import torch

from cocos.counting.engine import BATCH_COLUMNS, CountRun, _check_defined, _setup, make_plan
from cocos.data.layout import DIRECTIONS, BatchLayout
from cocos.losses.base import intra_similarities


class Collector:
    """Per-chunk arrays, joined into the tidy frames at the end (the engine's collector, frozen)."""

    def __init__(self, keep_queries: bool) -> None:
        self.batch = defaultdict(list)
        self.queries = defaultdict(lambda: defaultdict(list))
        self.keep_queries = keep_queries

    @staticmethod
    def _np(x: torch.Tensor) -> np.ndarray:
        return x.detach().to("cpu", torch.float64).numpy()

    def add_batch(self, key: tuple, values: dict) -> None:
        for stat, v in values.items():
            self.batch[(*key, stat)].append(self._np(v).reshape(-1))

    def add_queries(self, key: tuple, per_query: dict, items: np.ndarray) -> None:
        node = self.queries[key]
        node["item"].append(items)
        for stat, v in per_query.items():
            node[stat].append(self._np(v))

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        parts = []
        for (loss, d, mode, eps, stat), arrays in self.batch.items():
            values = np.concatenate(arrays)
            parts.append(pd.DataFrame({"loss": loss, "direction": d, "mode": mode, "eps": eps,
                                       "batch": np.arange(len(values)), "stat": stat, "value": values}))
        batches = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=BATCH_COLUMNS)
        for col in ("loss", "direction", "mode", "stat"):
            batches[col] = batches[col].astype(str)
        queries = None
        if self.keep_queries:
            qparts = []
            for (loss, d, mode, kind), cols in self.queries.items():
                items = np.concatenate(cols.pop("item"))
                nb, q = items.shape
                frame = {"loss": loss, "direction": d, "mode": mode, "batch": np.repeat(np.arange(nb), q),
                         "query": np.tile(np.arange(q), nb), "item_kind": kind, "item": items.reshape(-1)}
                frame.update({stat: np.concatenate(arrs).reshape(-1) for stat, arrs in cols.items()})
                qparts.append(pd.DataFrame(frame))
            queries = pd.concat(qparts, ignore_index=True) if qparts else pd.DataFrame()
        return batches, queries


def reference_count_embeddings(emb, losses=None, *, batch_size=128, seed=0, compat=False, modes=None,
                               params=None, eps=None, sweep_eps=None, keep_per_query=True,
                               chunk=32) -> CountRun:
    """``count_embeddings`` of one process, computed the way the engine did before the rewrite."""
    params = params or {}
    objectives, counters, modes = _setup(losses, batch_size, compat, modes, params, eps, sweep_eps)
    by_layout: dict[str, list] = defaultdict(list)
    for o in objectives:
        by_layout[o.layout].append(o)
    plans = {layout: make_plan(emb, layout, batch_size, seed) for layout in ("pair", "ranking") if by_layout[layout]}
    collect = Collector(keep_per_query)
    for layout_name, plan in plans.items():
        for start in range(0, plan.n_batches, chunk):
            stop = min(start + chunk, plan.n_batches)
            _count_chunk(emb, plan.captions[start:stop], plan.images[start:stop], layout_name, batch_size,
                         [(o, counters[o.name]) for o in by_layout[layout_name]], modes, sweep_eps, collect)
    batches, queries = collect.frames()
    _check_defined(batches, {o.name: o.undefined_ok for o in objectives})
    return CountRun(batches=batches, queries=queries, plans=plans,
                    params={n: c.params() for n, c in counters.items()},
                    labels={o.name: o.label for o in objectives}, batch_size=int(batch_size), seed=int(seed))


def _count_chunk(emb, cap, img, layout_name, batch_size, specs, modes, sweep_eps, collect) -> None:
    device = emb.images.device
    c, i = torch.as_tensor(cap, device=device), torch.as_tensor(img, device=device)
    scores = emb.images[i] @ emb.captions[c].transpose(-1, -2)
    if layout_name == "pair":
        layout = BatchLayout.build(batch_size, batch_size, torch.arange(batch_size, device=device), image_ids=i)
    else:
        layout = BatchLayout.build(batch_size, c.shape[-1], device=device)
    for o, counter in specs:
        s = scores
        if getattr(counter, "needs_embeddings", False):
            s = counter.gradients(emb.images[i], emb.captions[c], layout.caption_image)
        main_eps = counter.params().get("eps", np.nan) if o.uses_eps else np.nan
        intra = {}
        if getattr(counter, "needs_intra", False):
            intra = intra_similarities(emb.images[i], emb.captions[c])
        for mode in modes:
            for d in DIRECTIONS:
                view = layout.view(s, d, mode == "compat", intra=intra.get(d))
                _collect_view(collect, o, counter, view, (o.name, d, mode), main_eps, sweep_eps, cap, img)


def _collect_view(collect, o, counter, view, key, main_eps, sweep_eps, cap, img) -> None:
    result = counter.count(view)
    collect.add_batch((*key, main_eps), {**result.batch, "n_excluded": result.n_excluded})
    if collect.keep_queries:
        kind = result.item_kind or ("image" if key[1] == "i2t" else "caption")
        collect.add_queries((*key, kind), result.per_query, img if kind == "image" else cap)
    if sweep_eps is not None and o.uses_eps:
        for e, res in counter.sweep(view, sweep_eps).items():
            if e != main_eps:
                collect.add_batch((*key, e), res.batch)
