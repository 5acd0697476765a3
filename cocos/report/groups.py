"""Results grouped into experiments, their statistics as one long table, and the one aggregation over replicates.

Results (:class:`~cocos.results.Results`, from ``cocos analyze`` or ``cocos
count``) are grouped by their metadata, never by file name: dataset =
``data.name``, model = ``model.label``, training loss = ``training.loss`` (none for
``cocos count``). The results of a group are replicates (seeds: the training seed
of a checkpoint, the counting seed of an embeddings file). One result is a group
of one, so ``cocos analyze``, ``cocos count`` and ``cocos report`` share this code.
Results of the same seed and configuration are not replicates: they are refused
(``cocos analyze --label`` keeps checkpoints of one run apart as separate rows).

The statistics are read from each result's one table (:meth:`Results.main`) into one
long frame (:func:`stat_frame`), the metrics likewise (:func:`metric_frame`). Every mean
± std over replicates is :func:`over_seeds`: the mean and the sample std (ddof 1) of the
replicates' values (a result's statistic is already a mean over its batches: one
replicate keeps its batch mean ± batch std).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cocos.errors import CocosError
from cocos.presentation import LAST, ranked
from cocos.report.tables import (
    mode_name,
)
from cocos.results import Results, mode_of

DATASET_NAMES = {"f30k": "Flickr30k", "f30k_precomp": "Flickr30k", "flickr30k": "Flickr30k",
                 "coco": "MS-COCO", "coco_precomp": "MS-COCO", "mscoco": "MS-COCO"}
NO_LOSS = "-"  # the training-loss label of a result without one (cocos count)


def dataset_name(name: str) -> str:
    return DATASET_NAMES.get(name, name)


def loss_label(name: str | None, results: Results) -> str:
    """A loss's label as the results file describes it ("-" for none)."""
    return NO_LOSS if name is None else results.look(name).label


def load_results(paths: Iterable[str | os.PathLike]) -> list[Results]:
    """``results.json`` files, and folders (every ``results.json`` below them, sorted)."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(p.rglob("results.json"))
            if not found:
                raise CocosError(f"{p}: a folder without any results.json")
            files += found
        else:
            files.append(p)
    if not files:
        raise CocosError("no results files given")
    return [Results.read(f) for f in files]


# --------------------------------------------------------------------------- grouping


@dataclass
class Group:
    """The replicates of one experiment: dataset × model × training loss."""

    dataset: str
    model: str
    loss: str | None
    results: list[Results] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def labels(self) -> tuple[str, str, str]:
        return (dataset_name(self.dataset), self.model, loss_label(self.loss, self.results[0]))

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.model}/{self.loss or NO_LOSS}"

    def counters(self, which: str = "own") -> list[str]:
        """The counters this group shows (see the module docstring), in the families' order."""
        counted = list(self.results[0].counting.losses)
        if which == "own" and self.loss is not None:
            return [self.loss] if self.loss in counted else []
        return ranked(counted, self.results[0].presentation)

    def sort_key(self):
        rank = self.results[0].look(self.loss).rank if self.loss is not None else LAST
        shown = dataset_name(self.dataset)
        return ({"Flickr30k": 0, "MS-COCO": 1}.get(shown, 2), self.dataset, _natural(self.model), rank,
                self.loss or "")


def _natural(text: str) -> tuple:
    """Sort key that puts "epoch 2" before "epoch 10"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _counting_settings(r: Results, losses=None) -> str:
    """Batch size and counter parameters (of ``losses``, default all counted ones): equal for replicates."""
    c = r.counting
    params = c.params if losses is None else {k: v for k, v in c.params.items() if k in losses}
    return f"batch {c.batch_size}, params {json.dumps(params, sort_keys=True)}"


def group_results(results: Sequence[Results]) -> tuple[list[Group], list[str]]:
    """Group by (dataset, model label, training loss); returns the sorted groups and warnings."""
    _refuse_repeats(results)
    by_key: dict[tuple, Group] = {}
    for r in results:
        key = (r.data.name, r.model.label, r.training.loss if r.training is not None else None)
        by_key.setdefault(key, Group(*key)).results.append(r)
    groups = sorted(by_key.values(), key=Group.sort_key)
    for g in groups:
        _check_replicates(g)
    warnings = _fingerprint_warnings(groups)
    if len({r.counting.compat for r in results}) > 1:
        warnings.append("results were counted in different modes (compat and corrected); each file's own "
                        "mode is shown unless a mode is chosen")
    return groups, warnings


def _refuse_repeats(results: Sequence[Results]) -> None:
    """The same analysis twice (same source file, model, seed, settings, counters and mode) would pose as two
    replicates: refused."""
    seen: dict[tuple, str] = {}
    for r in results:
        key = (r.source.sha256, r.model.label, r.counting.seed, _counting_settings(r),
               tuple(r.counting.losses), r.counting.compat)
        if r.source.sha256 and key in seen:
            raise CocosError(f"{r.where}: counts the same {'checkpoint' if r.source.kind == 'analyze' else 'file'} "
                             f"in the same way as {seen[key]}; give each once")
        seen[key] = r.where


def _check_replicates(g: Group) -> None:
    """A group's results are replicates: counted alike (batch size and the shared counters' parameters) and of
    different seeds; sorts them by (seed, file)."""
    shared = set.intersection(*(set(r.counting.losses) for r in g.results))
    settings = {_counting_settings(r, shared) for r in g.results}
    if len(settings) > 1:
        which = " vs ".join(sorted(settings))
        raise CocosError(f"{g.name}: results were counted with different settings ({which}); "
                         "count them alike (batch size, eps, margin/tau) before merging")
    g.results.sort(key=lambda r: (r.replicate, r.where))
    repeated = sorted(seed for seed, n in Tally(r.replicate for r in g.results).items() if n > 1)
    if repeated:  # the same seed and configuration twice is one experiment, not two replicates
        seed = repeated[0]
        files = " and ".join(r.where for r in g.results if r.replicate == seed)
        raise CocosError(f"{g.name}: {files} have the same seed ({seed}) and configuration, so they are not "
                         "replicates; keep them apart with a label (cocos analyze CKPT --label last, "
                         "cocos count EMB --label 'tau 0.05')")


def _fingerprint_warnings(groups: Sequence[Group]) -> list[str]:
    """A warning per dataset whose analysed results carry different data fingerprints (a count result's
    fingerprint is its embeddings file, not the data: left out)."""
    fingerprints: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for g in groups:
        for r in g.results:
            if r.source.kind == "analyze":
                fingerprints[g.dataset][r.data.fingerprint].append(f"{g.model}/{g.loss or NO_LOSS}")
    return [f"dataset '{dataset}': results carry different data fingerprints ({_fingerprint_list(fps)}); "
            "they may not be counted on the same data" for dataset, fps in fingerprints.items() if len(fps) > 1]


def _fingerprint_list(fps: dict[str, list[str]]) -> str:
    """``<fingerprint[:12]> in <who, ...>; ...`` in fingerprint order."""
    return "; ".join(f"{fp[:12]} in {', '.join(sorted(set(who)))}" for fp, who in sorted(fps.items()))


# --------------------------------------------------------------------------- statistics as a long table


def shown_compat(r: Results, compat: bool | None = None) -> bool:
    """Whether ``r`` is shown in compat mode: ``compat``, or the mode the file was counted in (``None``)."""
    own = bool(r.counting.compat)
    if compat is None or compat == own:
        return own
    if mode_of(compat) not in r.modes():
        raise CocosError(f"{r.where}: has no {mode_name(compat)} statistics (counted {mode_name(own)} only)")
    return compat


STAT_FRAME = ["group", "replicate", "counter", "direction", "stat", "which", "compat", "mean", "std", "n",
              "n_skipped"]


def stat_frame(groups: Sequence[Group], compat: bool | None = None) -> pd.DataFrame:
    """The statistics of every result at each counter's own threshold (:meth:`Results.main`), one row per (group,
    replicate, counter, direction, stat, which) with mean, std, n, n_skipped over the result's batches.

    ``which`` is ``"shown"`` (the selected mode) or ``"other"`` (the other mode).
    """
    parts = []
    for gi, g in enumerate(groups):
        for ri, r in enumerate(g.results):
            shown = mode_of(shown_compat(r, compat))
            rows = r.main("all").rename(columns={"loss": "counter"})
            parts.append(rows.assign(group=gi, replicate=ri, which=np.where(rows["mode"] == shown, "shown", "other"),
                                     compat=rows["mode"] == "compat"))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=STAT_FRAME)
    return frame[STAT_FRAME]


def metric_frame(groups: Sequence[Group], metrics: Sequence[str], scale: dict | None = None) -> pd.DataFrame:
    """The evaluation metrics of every evaluated result, one row per (group, replicate, metric) with its ``value``
    (times ``scale[metric]``; NaN where the result lacks it)."""
    rows = [(gi, ri, m, (scale or {}).get(m, 1.0) * r.evaluation.metrics.get(m, np.nan))
            for gi, g in enumerate(groups) for ri, r in enumerate(g.results) if r.evaluation is not None
            for m in metrics]
    return pd.DataFrame(rows, columns=["group", "replicate", "metric", "value"])


def over_seeds(frame: pd.DataFrame, keys: Sequence[str], column: str = "value") -> pd.DataFrame:
    """The one aggregation over replicates: per ``keys``, the ``mean`` and the sample ``std`` (ddof 1) of ``column``
    over the rows where it is not NaN (mean NaN without any, std NaN with fewer than two), and the number of rows
    (``replicates``). Every table and figure aggregates replicates with it; over the batches of one result the
    engine's ``summarise`` already did (mean and population std)."""
    def seeds(values: pd.Series) -> tuple[float, float]:
        v = values.to_numpy(dtype=float)
        v = v[~np.isnan(v)]
        return (float(v.mean()) if v.size else np.nan), (float(v.std(ddof=1)) if v.size > 1 else np.nan)

    keys = list(keys)
    if frame.empty:
        return pd.DataFrame(columns=[*keys, "mean", "std", "replicates"])
    g = frame.groupby(keys, sort=False)[column]
    pairs = g.agg(seeds)
    out = pd.DataFrame({"mean": pairs.map(lambda t: t[0]), "std": pairs.map(lambda t: t[1]),
                        "replicates": g.size()})
    return out.reset_index()


def aggregate(frame: pd.DataFrame, groups: Sequence[Group]) -> pd.DataFrame:
    """Cells per (group, counter, direction, stat, which).

    One replicate keeps its batch mean ± batch std (``spread="batches"``); several give
    the mean over replicates ± the *sample* std (ddof 1) over replicates (``spread="seeds"``).
    A statistic missing in one replicate has no honest value (NaN).
    """
    keys = ["group", "counter", "direction", "stat", "which"]
    g = frame.groupby(keys, sort=False)
    seeds = over_seeds(frame, keys, "mean").set_index(keys)
    out = pd.DataFrame({"replicates": seeds["replicates"], "seed_mean": seeds["mean"], "seed_std": seeds["std"],
                        "first_mean": g["mean"].first(), "first_std": g["std"].first(),
                        "n_skipped": g["n_skipped"].sum(), "n_batches": g["n"].sum() + g["n_skipped"].sum()})
    out = out.reset_index()
    size = out["group"].map(lambda i: groups[i].n)
    single = size == 1
    out["mean"] = np.where(single, out["first_mean"], out["seed_mean"])
    out["std"] = np.where(single, out["first_std"], out["seed_std"])
    out["spread"] = np.where(single, "batches", "seeds")
    out.loc[out["replicates"] < size, ["mean", "std"]] = np.nan
    return out.set_index(keys)
