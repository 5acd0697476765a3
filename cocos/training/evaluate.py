"""Encode a split with a frozen model, and evaluate retrieval on it."""

from __future__ import annotations

import numpy as np
import torch

from cocos.data.precomp import PrecompSplit
from cocos.data.text import Vocabulary, pad_batch
from cocos.errors import CocosError
from cocos.io import check_interrupt
from cocos.progress import progress_bar
from cocos.training.metrics import evaluate_embeddings


def tokenize_split(split: PrecompSplit, vocab: Vocabulary) -> list[list[int]]:
    """Token ids of every caption of the split (with <start>/<end>)."""
    return [vocab.encode(c) for c in split.captions]


def check_compatible(model: torch.nn.Module, split: PrecompSplit) -> None:
    expected = int(model.hparams["img_dim"])
    if split.feature_dim != expected:
        raise CocosError(
            f"{split.features_path}: features have dimension {split.feature_dim} but the model "
            f"expects {expected}"
        )


@torch.no_grad()
def encode_split(
    model: torch.nn.Module,
    split: PrecompSplit,
    token_ids: list[list[int]],
    *,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    progress: bool = False,
    description: str = "encoding",
    group=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings of all images ``(N, e)`` and captions ``(N k, e)`` of a split, in eval mode.

    Every item is encoded on its own (no batch statistics in eval mode), so the
    result does not depend on ``batch_size``. Raises CocosError on NaN embeddings.
    Under torchrun (``group``, default the joined one) each rank encodes its
    contiguous block of the images and of the captions, and every rank gets the
    whole split back in order (:mod:`cocos.distributed`).
    """
    from cocos.distributed import aligned_block, current, gather_blocks

    group = current() if group is None else group
    check_compatible(model, split)
    was_training = model.training
    model.eval()
    images, captions = [], []
    rows_img = aligned_block(split.n_images, batch_size, group)  # whole one-process chunks: the same rounding
    rows_cap = aligned_block(split.n_captions, batch_size, group)
    total = -(-len(rows_img) // batch_size) + -(-len(rows_cap) // batch_size)
    try:
        with progress_bar(total, description, enabled=progress and group.is_main) as advance:
            for start in range(rows_img.start, rows_img.stop, batch_size):
                check_interrupt()
                feats = split.features_for(np.arange(start, min(start + batch_size, rows_img.stop)))
                images.append(model.encode_images(feats.to(device)).float().cpu())
                advance(1)
            for start in range(rows_cap.start, rows_cap.stop, batch_size):
                check_interrupt()
                tokens, lengths = pad_batch(token_ids[start : min(start + batch_size, rows_cap.stop)])
                captions.append(model.encode_captions(tokens.to(device), lengths).float().cpu())
                advance(1)
    finally:
        model.train(was_training)
    if group.active:  # every rank's blocks, in rank order: the whole split
        parts = gather_blocks((images, captions), group)
        images = [x for own, _ in parts for x in own]
        captions = [x for _, own in parts for x in own]
    img, cap = torch.cat(images), torch.cat(captions)
    for name, emb in (("image", img), ("caption", cap)):
        bad = ~torch.isfinite(emb).all(-1)
        if bad.any():
            row = int(bad.nonzero()[0])
            raise CocosError(f"{split.features_path}: the model gives a NaN {name} embedding (row {row})")
    return img, cap


def evaluate_model(
    model: torch.nn.Module,
    split: PrecompSplit,
    token_ids: list[list[int]],
    *,
    device="cpu",
    batch_size: int = 256,
    progress: bool = False,
) -> dict[str, float]:
    """R@1/5/10 both ways, rsum, mAP@5, R-precision (and 5-fold 1K means for 5K test sets)."""
    img, cap = encode_split(model, split, token_ids, batch_size=batch_size, device=device,
                            progress=progress)
    return evaluate_embeddings(img.numpy(), cap.numpy(), split.k)
