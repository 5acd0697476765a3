"""Test helpers: embeddings that realise a chosen similarity matrix exactly."""

from __future__ import annotations

import numpy as np


def embed_similarities(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors ``images`` (B, B+M) and ``captions`` (M, B+M) with ``images @ captions.T == s``.

    Image ``i`` is the one-hot ``e_i``; caption ``j`` is ``(s[:, j], pad)`` with its
    own padding axis so that it has unit norm (needs column norms <= 1).
    """
    s = np.asarray(s, dtype=np.float64)
    b, m = s.shape
    norms = (s * s).sum(0)
    assert (norms <= 1).all(), "every column of s needs norm <= 1"
    images = np.zeros((b, b + m))
    images[:, :b] = np.eye(b)
    captions = np.zeros((m, b + m))
    captions[:, :b] = s.T
    captions[np.arange(m), b + np.arange(m)] = np.sqrt(1 - norms)
    return images, captions
