"""Test helpers: embeddings that realise a chosen similarity matrix exactly; file snapshots and the one-line
error check of the CLI."""

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


def snapshot(*folders) -> dict:
    """Every file under the folders with its bytes (hidden temporaries included): compare before and after."""
    from pathlib import Path

    out = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")):
            out[str(p)] = p.read_bytes() if p.is_file() else None
    return out


def one_error_line(res) -> str:
    """A CLI result that is bad input: exit code 2 and exactly one line, ``error: ...``; returns it."""
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]
