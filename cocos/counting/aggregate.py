"""Aggregation of per-batch statistics over a whole sweep of the training set.

For each statistic: the mean and the population standard deviation over batches
(as ``numpy.std``), the number of batches ``n`` that entered, and ``n_skipped``,
the batches left out because the statistic is undefined there (``C^q`` of a batch
where no query has a gradient).
"""

from __future__ import annotations

import numpy as np


def summarise(values: np.ndarray) -> dict[str, float | int | None]:
    values = np.asarray(values, dtype=np.float64)
    ok = values[~np.isnan(values)]
    if ok.size == 0:
        return {"mean": None, "std": None, "n": 0, "n_skipped": int(values.size)}
    return {
        "mean": float(ok.mean()),
        "std": float(ok.std()),
        "n": int(ok.size),
        "n_skipped": int(values.size - ok.size),
    }


def summarise_tree(tree):
    """Apply :func:`summarise` to every array leaf of nested dicts."""
    if isinstance(tree, dict):
        return {k: summarise_tree(v) for k, v in tree.items()}
    return summarise(tree)
