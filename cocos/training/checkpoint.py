"""Checkpoints: a dict of plain types and tensors that loads with ``weights_only=True``.

Format (``format = "cocos-checkpoint"``, ``format_version = 1``)::

    model:      {"kind": "vsepp" | "vsrn", "hparams": {...}}
    vocab:      [token, ...]               plain strings, index = token id
    state_dict: {name: tensor}
    loss:       {"name": ..., "params": {...}}
    data:       {"path": ..., "fingerprint": ..., "k": ..., "feature_shape": [...]}
    train:      the training flags (epochs, lr, lr_update, batch_size, seed, ...)
    epoch:      last finished epoch (1-based)
    metrics:    validation metrics of that epoch; best_rsum: best validation rsum so far
    history:    [{"epoch", "loss", "rsum", ...}, ...]
    optimizer, scheduler, rng: present in ``last.pt`` for resuming
    library_version

Writes are atomic (temporary file, then rename). Loading never runs code from
the file (``torch.load(weights_only=True)``); anything that is not a cocos
checkpoint raises :class:`CocosError` with one line naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import torch

from cocos import __version__
from cocos.errors import CocosError
from cocos.io import write_bytes

FORMAT = "cocos-checkpoint"
FORMAT_VERSION = 1
REQUIRED = ("model", "vocab", "state_dict", "loss", "data", "epoch")


def save_checkpoint(path: str | os.PathLike, checkpoint: dict) -> None:
    """Serialise to memory first, then write atomically: a crash never leaves a broken file."""
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "library_version": __version__,
               **checkpoint}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_bytes(path, buffer.getvalue())


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such checkpoint")
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, not a checkpoint (try {path}/model_best.pt)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError,
            OSError, AttributeError, KeyError, IndexError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise CocosError(f"{path}: not a readable checkpoint ({first})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CocosError(f"{path}: not a cocos checkpoint")
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CocosError(f"{path}: checkpoint lacks {', '.join(missing)}")
    if ckpt.get("format_version", 0) > FORMAT_VERSION:
        raise CocosError(f"{path}: checkpoint format {ckpt['format_version']} is newer than this cocos")
    return ckpt
