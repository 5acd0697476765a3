"""Frozen encoding: a checkpoint's model, frozen, encodes splits once for counting.

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
import torch

from cocos.counting.engine import EmbeddingSet
from cocos.data.images import is_image_dataset
from cocos.data.precomp import PrecompSplit
from cocos.data.text import Vocabulary
from cocos.device import resolve_device
from cocos.embed.images import ImageSource, PooledModel, PooledSplit, image_source_of
from cocos.errors import CocosError
from cocos.io import sha256_file, write_npz
from cocos.legacy import (
    UnsafeCheckpointError,
    checkpoint_from_raw,
    is_legacy_checkpoint,
    load_any_checkpoint,
    read_checkpoint_file,
)
from cocos.models.registry import folder_checkpoint, get_family
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
    images: ImageSource | None = None  # a raw-image model (vsepp_full): where its images come from

    @property
    def is_images(self) -> bool:
        return self.images is not None

    @classmethod
    def load(cls, checkpoint: str | os.PathLike, data: str | os.PathLike | None = None,
             device: str = "auto", vocab: str | os.PathLike | None = None, trust: bool = False,
             image_options: dict | None = None, bert: str | os.PathLike | None = None,
             reader=None) -> FrozenModel:
        """A cocos checkpoint, or a ``model_best.pth.tar`` of the original VSE++/VSRN code (a
        ``model_best.pth`` of the original VSE∞ code), or a Hugging Face CLIP folder (:mod:`cocos.models.clip_folder`:
        ``data`` needed).

        The original's checkpoint is converted in memory (:mod:`cocos.legacy`) and
        needs ``vocab`` (its ``*_vocab.pkl`` or vocabulary JSON; VSE∞: ``bert``, the BERT folder
        it was trained with) and ``data`` (it records no
        data folder). Loading never runs code from the file unless ``trust`` (then
        ``torch.load(weights_only=False)``: only for files the user trusts). A raw-image
        model (``vsepp_full``) reads its ``data`` as an image dataset; ``image_options``
        (``resize``, ``crop_size``, ``features``, ``workers``, ``log``) go to
        :func:`cocos.embed.images.image_source_of`. ``reader``, ``(path, data, *, log) -> checkpoint dict``, reads
        a checkpoint of another tool (open_clip's ``epoch_K.pt``:
        :func:`cocos.models.open_clip.open_clip_checkpoint`) into a cocos checkpoint in memory.
        """
        # a Hugging Face model folder a family reads whole (CLIP's), or the caller's reader of another tool's file
        whole = reader if reader is not None else folder_checkpoint(checkpoint)
        if whole is not None:  # its checkpoint, built in memory
            if vocab is not None or bert is not None:
                raise CocosError(f"{checkpoint}: a model folder carries its tokenizer; --vocab and --bert do not "
                                 "apply")
            ckpt, converted = whole(checkpoint, data, log=(image_options or {}).get("log")), True
        elif vocab is None and bert is None and not trust:
            try:  # the common case: a cocos checkpoint, read and checked as everywhere else
                ckpt = load_checkpoint(checkpoint)
            except CocosError as exc:  # perhaps the original code's: read it again with Namespace allowed
                ckpt, converted = cls._load_other(checkpoint, data, vocab, trust, exc)
            else:
                converted = False
        else:
            ckpt, converted = load_any_checkpoint(checkpoint, vocab=vocab, data=data, trust=trust, bert=bert)
        images = get_family(ckpt["model"]["kind"]).input == "images"
        if images:
            folder = _image_data(ckpt, data, checkpoint)
        else:
            folder = Path(data) if converted else resolve_data(ckpt, data, checkpoint)
        dev = resolve_device(device)
        model, vocab = build_from_checkpoint(ckpt)
        model.to(dev).eval().requires_grad_(False)
        source = image_source_of(ckpt, folder, **(image_options or {})) if images else None
        return cls(Path(checkpoint), ckpt, model, vocab, folder, dev, source)

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

    def open_split(self, split: str, progress: bool = False) -> PrecompSplit | PooledSplit:
        """A precomputed split, or for a raw-image model its pooled CNN features (cached or computed)."""
        if self.images is not None:
            return self.images.open(self.model, split, self.device, progress=progress)
        return PrecompSplit(self.data_folder, split, k=self.k)

    @property
    def encoder(self) -> torch.nn.Module:
        """What encodes an opened split's rows: the model, or for a raw-image model its pooled-feature side."""
        return PooledModel(self.model) if self.images is not None else self.model

    def encode(self, split: PrecompSplit | PooledSplit, *, batch_size: int = 256,
               progress: bool = False) -> EmbeddingSet:
        img, cap = encode_split(self.encoder, split, tokenize_split(split, self.vocab), batch_size=batch_size,
                                device=self.device, progress=progress, description=f"encoding {split.split}")
        return EmbeddingSet.from_arrays(img, cap, split.caption_image, device=self.device)

    def evaluate(self, split: PrecompSplit | PooledSplit, *, progress: bool = False) -> dict[str, float]:
        return evaluate_model(self.encoder, split, tokenize_split(split, self.vocab), device=self.device,
                              progress=progress)

    def sha256(self) -> str:
        """The checkpoint file's sha256; a CLIP folder's: of its files' names and sha256s, in name order."""
        if not self.path.is_dir():
            return sha256_file(self.path)
        import hashlib

        digest = hashlib.sha256()
        for entry in sorted(p for p in self.path.iterdir() if p.is_file()):
            digest.update(f"{entry.name}\0{sha256_file(entry)}\n".encode())
        return digest.hexdigest()


def _image_data(ckpt: dict, data, checkpoint) -> Path:
    """The image dataset of a raw-image model: ``data`` if given, else the one the checkpoint records."""

    path = Path(data) if data is not None else Path(ckpt["data"]["path"])
    if not path.exists():
        raise CocosError(f"{path}: no such image dataset" if data is not None else
                         f"{checkpoint}: its image dataset {path} is gone; pass --data")
    if not is_image_dataset(path):
        raise CocosError(f"{path}: not an image dataset (images/ and a dataset_*.json, {{split}}_set.p or a CSV "
                         f"file list); {checkpoint} encodes raw images (model {ckpt['model']['kind']})")
    return path


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
