"""Frozen encoding: a checkpoint's model, frozen, encodes splits once for counting.

With a frozen model in eval mode every item's embedding is independent of the
batch, so a split is encoded once and all counting batches are formed from the
cache (:class:`cocos.counting.engine.EmbeddingSet`). The cache is written in the
``cocos count`` format: an ``.npz`` with ``images``, ``captions`` and
``caption_image``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cocos.counting.engine import EmbeddingSet
from cocos.data.precomp import PrecompSplit
from cocos.data.text import Vocabulary
from cocos.device import resolve_device
from cocos.io import write_npz
from cocos.training.checkpoint import load_checkpoint
from cocos.training.evaluate import encode_split, evaluate_model, tokenize_split
from cocos.training.trainer import build_from_checkpoint, resolve_data


@dataclass
class FrozenModel:
    """A checkpoint's model in eval mode with gradients off, its vocabulary and data folder."""

    path: Path
    checkpoint: dict
    model: torch.nn.Module
    vocab: Vocabulary
    data_folder: Path
    device: torch.device

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, data: str | os.PathLike | None = None,
             device: str = "auto") -> FrozenModel:
        ckpt = load_checkpoint(checkpoint)
        folder = resolve_data(ckpt, data, checkpoint)
        dev = resolve_device(device)
        model, vocab = build_from_checkpoint(ckpt)
        model.to(dev).eval().requires_grad_(False)
        return cls(Path(checkpoint), ckpt, model, vocab, folder, dev)

    @property
    def k(self) -> int:
        return int(self.checkpoint["data"]["k"])

    def open_split(self, split: str) -> PrecompSplit:
        return PrecompSplit(self.data_folder, split, k=self.k)

    def encode(self, split: PrecompSplit, *, batch_size: int = 256, progress: bool = False) -> EmbeddingSet:
        img, cap = encode_split(self.model, split, tokenize_split(split, self.vocab), batch_size=batch_size,
                                device=self.device, progress=progress, description=f"encoding {split.split}")
        return EmbeddingSet.from_arrays(img, cap, split.caption_image, device=self.device)

    def evaluate(self, split: PrecompSplit, *, progress: bool = False) -> dict[str, float]:
        return evaluate_model(self.model, split, tokenize_split(split, self.vocab), device=self.device,
                              progress=progress)

    def sha256(self) -> str:
        h = hashlib.sha256()
        with open(self.path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()


def encode_checkpoint(checkpoint, data=None, split: str = "train", *, device: str = "auto",
                      progress: bool = False) -> EmbeddingSet:
    """Embeddings of one split of a checkpoint's data (the training split by default)."""
    frozen = FrozenModel.load(checkpoint, data, device)
    return frozen.encode(frozen.open_split(split), progress=progress)


def save_embeddings(path: str | os.PathLike, emb: EmbeddingSet) -> None:
    """Write embeddings in the ``cocos count`` format (atomically)."""
    write_npz(path, images=emb.images.cpu().numpy(), captions=emb.captions.cpu().numpy(),
              caption_image=np.asarray(emb.caption_image))


__all__ = ["FrozenModel", "encode_checkpoint", "save_embeddings"]
