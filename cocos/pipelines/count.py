"""``cocos count``: anyone's own embeddings (CLIP, DPR, ...) -> the same results as ``cocos analyze``.

The embeddings file is an ``.npz`` with ``images`` ``(N, d)``, ``captions`` ``(M, d)``
and optionally ``caption_image`` ``(M,)`` (default ``c // (M // N)``). It is counted
in both modes (the shown one and the other, for the tables' notes) with the eps
sweep, and described by a :class:`~cocos.results.Results` record whose
dataset is ``name`` (default: the file name) and whose model is ``label``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from cocos import __version__
from cocos.counting.engine import DEFAULT_SWEEP, CountRun, EmbeddingSet
from cocos.data.layout import DIRECTIONS
from cocos.defaults import DEFAULT_BATCH_SIZE
from cocos.device import resolve_device
from cocos.errors import CocosError
from cocos.io import load_npz, sha256_file
from cocos.pipelines.analyze import counting_info, presentations, run_counts
from cocos.report.tables import fmt
from cocos.results import DataInfo, ModelInfo, Results, Source, records

# Order in which `cocos count` shows statistics: the paper's first, then the companions.
STAT_ORDER = ("C_q", "C_B", "C_0", "C_qv-", "W_qv-", "W_qv+", "W_low",
              "N_eff", "N_invsimpson", "top1_share", "n_excluded")


@dataclass
class Counted:
    results: Results
    run: CountRun
    embeddings: EmbeddingSet


def read_embeddings(path: str | os.PathLike, device: str = "cpu") -> EmbeddingSet:
    """An ``.npz`` in the count format as an :class:`EmbeddingSet`; bad files are one CocosError line."""
    path = Path(path)
    arrays = load_npz(path, mmap=True)  # uncompressed members are mapped, not copied: memory bounded by use
    for name in ("images", "captions"):
        if name not in arrays:
            found = ", ".join(arrays) or "none"
            raise CocosError(f"{path}: no array named '{name}' (found: {found})")
    try:
        return EmbeddingSet.from_arrays(arrays["images"], arrays["captions"], arrays.get("caption_image"),
                                        device=device)
    except CocosError as exc:
        raise CocosError(f"{path}: {exc}") from None


def count_file(
    path: str | os.PathLike,
    losses=None,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    seed: int = 0,
    compat: bool = False,
    params: dict | None = None,
    eps: float | None = None,
    sweep_eps=DEFAULT_SWEEP,
    name: str | None = None,
    label: str = "embeddings",
    device: str = "auto",
    progress: bool = False,
    keep_per_query: bool = True,
) -> Counted:
    """Count an embeddings file; returns the results record, the tidy run and the embeddings."""

    path = Path(path)
    emb = read_embeddings(path, device=str(resolve_device(device)))
    with ThreadPoolExecutor(1) as pool:  # the file's fingerprint beside the counting (hashlib releases the GIL)
        fingerprint = pool.submit(sha256_file, path)
        run = run_counts(emb, losses, batch_size=batch_size, seed=seed, compat=compat, params=params or {},
                         eps=eps, sweep_eps=sweep_eps, progress=progress, keep_per_query=keep_per_query)
        sha = fingerprint.result()
    counts = np.bincount(emb.caption_image, minlength=emb.n_images)
    results = Results(
        source=Source("count", str(path), sha),
        data=DataInfo(name=name or path.stem, path=str(path), fingerprint=sha, n_images=emb.n_images,
                      n_captions=emb.n_captions, k=int(counts[0]) if counts.min() == counts.max() else None),
        model=ModelInfo(label=label),
        counting=counting_info(run, compat, sweep_eps),
        statistics=records(run.summary()), cocos_version=__version__,
        presentation=presentations(run.losses, run.labels),
    )
    return Counted(Results.from_dict(results.to_dict()), run, emb)


def count_rows(summary: pd.DataFrame) -> list[tuple[str, ...]]:
    """The terminal table of one loss: rows ``(statistic, i2t, t2i)`` of ``mean ± std`` over batches (and the
    batches skipped). ``summary``: the loss's rows of the statistics table at its own threshold (``Results.main``)."""
    entries = summary.set_index(["direction", "stat"])
    directions = [d for d in DIRECTIONS if d in entries.index.get_level_values("direction")]
    first = set(entries.loc[directions[0]].index)
    stats = [s for s in STAT_ORDER if s in first] + sorted(s for s in first if s not in STAT_ORDER)
    return [(stat, *(fmt(e["mean"], e["std"]) + (f" ({int(e['n_skipped'])} skipped)" if e["n_skipped"] else "")
                     for e in (entries.loc[(d, stat)] for d in directions))) for stat in stats]
