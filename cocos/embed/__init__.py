"""Frozen encoding: a checkpoint and a split -> cached embeddings for counting.

With a frozen model in eval mode every item's embedding is independent of the
batch, so a split is encoded once and all counting batches are formed from the
cache (:class:`cocos.counting.engine.EmbeddingSet`). The cache is written in the
``cocos count`` format: an ``.npz`` with ``images``, ``captions`` and
``caption_image``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cocos.counting.engine import EmbeddingSet
from cocos.data.precomp import PrecompSplit
from cocos.device import resolve_device
from cocos.io import write_npz
from cocos.training.checkpoint import load_checkpoint
from cocos.training.evaluate import encode_split, tokenize_split
from cocos.training.trainer import build_from_checkpoint, resolve_data


@dataclass
class Encoded:
    """What encoding a checkpoint gives: the embeddings and where they came from."""

    embeddings: EmbeddingSet
    checkpoint: dict
    data_folder: Path
    split: PrecompSplit


def encode_checkpoint(
    checkpoint: str | os.PathLike,
    data: str | os.PathLike | None = None,
    split: str = "train",
    *,
    device: str = "auto",
    batch_size: int = 256,
    progress: bool = False,
) -> Encoded:
    """Load a checkpoint safely, freeze its model and encode one split of its data."""
    ckpt = load_checkpoint(checkpoint)
    folder = resolve_data(ckpt, data, checkpoint)
    dev = resolve_device(device)
    model, vocab = build_from_checkpoint(ckpt)
    model.to(dev).requires_grad_(False)
    data_split = PrecompSplit(folder, split, k=int(ckpt["data"]["k"]))
    img, cap = encode_split(model, data_split, tokenize_split(data_split, vocab), batch_size=batch_size,
                            device=dev, progress=progress, description=f"encoding {split}")
    emb = EmbeddingSet.from_arrays(img, cap, data_split.caption_image)
    return Encoded(embeddings=emb, checkpoint=ckpt, data_folder=folder, split=data_split)


def save_embeddings(path: str | os.PathLike, emb: EmbeddingSet) -> None:
    """Write embeddings in the ``cocos count`` format (atomically)."""
    write_npz(path, images=emb.images.cpu().numpy(), captions=emb.captions.cpu().numpy(),
              caption_image=np.asarray(emb.caption_image))


__all__ = ["Encoded", "encode_checkpoint", "save_embeddings"]
