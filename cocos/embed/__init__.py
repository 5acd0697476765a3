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
from cocos.errors import CocosError
from cocos.io import write_npz
from cocos.legacy import (
    UnsafeCheckpointError,
    checkpoint_from_raw,
    is_legacy_checkpoint,
    load_any_checkpoint,
    read_checkpoint_file,
)
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
             device: str = "auto", vocab: str | os.PathLike | None = None, trust: bool = False) -> FrozenModel:
        """A cocos checkpoint, or a ``model_best.pth.tar`` of the original VSE++/VSRN code.

        The original's checkpoint is converted in memory (:mod:`cocos.legacy`) and
        needs ``vocab`` (its ``*_vocab.pkl`` or vocabulary JSON) and ``data`` (it records no
        data folder). Loading never runs code from the file unless ``trust`` (then
        ``torch.load(weights_only=False)``: only for files the user trusts).
        """
        if vocab is None and not trust:
            try:  # the common case: a cocos checkpoint, read and checked as everywhere else
                ckpt = load_checkpoint(checkpoint)
            except CocosError as exc:  # perhaps the original code's: read it again with Namespace allowed
                ckpt, converted = cls._load_other(checkpoint, data, vocab, trust, exc)
            else:
                converted = False
        else:
            ckpt, converted = load_any_checkpoint(checkpoint, vocab=vocab, data=data, trust=trust)
        folder = Path(data) if converted else resolve_data(ckpt, data, checkpoint)
        dev = resolve_device(device)
        model, vocab = build_from_checkpoint(ckpt)
        model.to(dev).eval().requires_grad_(False)
        return cls(Path(checkpoint), ckpt, model, vocab, folder, dev)

    @staticmethod
    def _load_other(checkpoint, data, vocab, trust: bool, first: CocosError) -> tuple[dict, bool]:
        """After ``load_checkpoint`` failed: a checkpoint of the original code, or ``first`` (its error) again."""
        path = Path(checkpoint)
        if not path.is_file():
            raise first
        try:
            raw = read_checkpoint_file(path, trust=trust)
        except UnsafeCheckpointError:
            raise  # names the class or function the file wanted to run
        except CocosError:
            raise first from None
        if not is_legacy_checkpoint(raw):
            raise first  # a damaged or foreign file: the message every command gives
        return checkpoint_from_raw(raw, path, vocab=vocab, data=data)

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
                      progress: bool = False, vocab=None, trust: bool = False) -> EmbeddingSet:
    """Embeddings of one split of a checkpoint's data (the training split by default)."""
    frozen = FrozenModel.load(checkpoint, data, device, vocab=vocab, trust=trust)
    return frozen.encode(frozen.open_split(split), progress=progress)


def save_embeddings(path: str | os.PathLike, emb: EmbeddingSet) -> None:
    """Write embeddings in the ``cocos count`` format (atomically)."""
    write_npz(path, images=emb.images.cpu().numpy(), captions=emb.captions.cpu().numpy(),
              caption_image=np.asarray(emb.caption_image))


__all__ = ["FrozenModel", "encode_checkpoint", "save_embeddings"]
