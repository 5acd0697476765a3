"""Encode a split with a frozen model, and evaluate retrieval on it.

A split is a precomputed-feature split (:class:`~cocos.data.precomp.PrecompSplit`) or a raw-image
split (:class:`~cocos.data.images.ImageSplit`), encoded by a raw-image model (``vsepp_full``) with
VSE++'s evaluation transform at ``crop_size``, its images decoded in ``workers`` DataLoader workers
(:mod:`cocos.training.pixels`).
"""

from __future__ import annotations

import numpy as np
import torch

from cocos.data.images import ImageSplit
from cocos.data.precomp import PrecompSplit
from cocos.data.text import Vocabulary, pad_batch
from cocos.data.transforms import CROP_SIZE
from cocos.distributed import aligned_block, current, gather_blocks
from cocos.errors import CocosError
from cocos.io import check_interrupt
from cocos.progress import progress_bar
from cocos.training.metrics import evaluate_embeddings
from cocos.training.pixels import batch_loader, encode_pixels, model_transform


def tokenize_split(split: PrecompSplit, vocab: Vocabulary) -> list[list[int]]:
    """Token ids of every caption of the split (with <start>/<end>; a BERT's: [CLS]/[SEP], batched)."""
    encode_all = getattr(vocab, "encode_all", None)
    return encode_all(split.captions) if encode_all else [vocab.encode(c) for c in split.captions]


def is_image_split(split) -> bool:
    """Whether ``split`` holds raw images (an :class:`~cocos.data.images.ImageSplit`), not features."""

    return isinstance(split, ImageSplit)


def split_source(split) -> str:
    """What error lines call a split: its features file, or its image dataset."""
    return str(split.source) if is_image_split(split) else str(split.features_path)


def check_compatible(model: torch.nn.Module, split: PrecompSplit) -> None:
    raw = hasattr(model, "pooled")
    if is_image_split(split) or raw:
        if is_image_split(split) != raw:
            what = "raw images" if raw else "precomputed features"
            raise CocosError(f"{split_source(split)}: the {model.kind} model reads {what}, which this data is not")
        return
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
    workers: int = 0,
    crop_size: int = CROP_SIZE,
    resize: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings of all images ``(N, e)`` and captions ``(M, e)`` of a split (in its order), in eval mode.

    A raw-image split is encoded with the evaluation transform at ``crop_size`` and ``resize`` (None: in the
    ratio 256 : 224; a model with its own
    preprocessing, CLIP: that one, :func:`cocos.training.pixels.model_transform`), decoded in
    ``workers`` DataLoader workers, the CNN under bf16 autocast on CUDA
    (:func:`cocos.training.pixels.encode_pixels`).

    Every item is encoded on its own (no batch statistics in eval mode), so the
    result does not depend on ``batch_size``. Raises CocosError on NaN embeddings.
    Under torchrun (``group``, default the joined one) each rank encodes its
    contiguous block of the images and of the captions, and every rank gets the
    whole split back in order (:mod:`cocos.distributed`).
    """

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
            transform = model_transform(model, False, crop_size, resize)
            for feats in _image_inputs(split, rows_img, batch_size, workers, transform, device):
                check_interrupt()
                images.append(_encode_images(model, feats, device).float().cpu())
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
            raise CocosError(f"{split_source(split)}: the model gives a NaN {name} embedding (row {row})")
    return img, cap


def _image_inputs(split, rows: range, batch_size: int, workers: int, transform, device):
    """The model's image inputs of ``rows`` in chunks of ``batch_size``: features, or pixels decoded and transformed
    by ``transform`` (the model's evaluation transform)."""
    if not is_image_split(split):
        for start in range(rows.start, rows.stop, batch_size):
            yield split.features_for(np.arange(start, min(start + batch_size, rows.stop)))
        return

    plan = [(chunk, chunk) for chunk in (np.arange(s, min(s + batch_size, rows.stop))
                                         for s in range(rows.start, rows.stop, batch_size))]
    yield from batch_loader(split, transform, plan, workers=workers, device=device)


def _encode_images(model, inputs: torch.Tensor, device) -> torch.Tensor:
    if hasattr(model, "pooled"):

        return encode_pixels(model, inputs, device)
    return model.encode_images(inputs.to(device))


def image_major(split) -> np.ndarray:
    """Caption rows in image-major order (image 0's k captions, then image 1's, ...), as the metrics need."""
    if is_image_split(split):
        return split.image_captions().reshape(-1)
    return np.arange(split.n_captions)


def evaluate_model(
    model: torch.nn.Module,
    split: PrecompSplit,
    token_ids: list[list[int]],
    *,
    device="cpu",
    batch_size: int = 256,
    progress: bool = False,
    workers: int = 0,
    crop_size: int = CROP_SIZE,
    resize: int | None = None,
) -> dict[str, float]:
    """R@1/5/10 both ways, rsum, mAP@5, R-precision (and 5-fold 1K means for 5K test sets).

    A raw-image split's captions are put in image-major order first (every image needs the
    same number ``k`` of captions)."""
    img, cap = encode_split(model, split, token_ids, batch_size=batch_size, device=device,
                            progress=progress, workers=workers, crop_size=crop_size, resize=resize)
    order = image_major(split)
    k = len(order) // split.n_images
    return evaluate_embeddings(img.numpy(), cap[torch.as_tensor(order)].numpy(), k)
