"""Raw images in training and evaluation: batch loaders in DataLoader workers, mixed precision on CUDA.

* **Loading.** A step's pixels come from :class:`cocos.data.images.ImageBatches` over the epoch's
  batch plan (this rank's rows of each global batch), read by one ``DataLoader`` per epoch with
  ``--workers`` processes: a worker decodes and transforms a whole batch while the model trains
  on the previous one. Every row's transform is seeded by ``(seed, epoch, key)`` (the caption's
  row for pair batches, the image's for ranking batches and evaluation), so the pixels, and the
  run, are the same for any number of workers.
* **Sizes.** Training: ``RandomResizedCrop(crop_size)`` + flip (VSE++'s ``train`` transform);
  evaluation: ``Resize(resize)`` + ``CenterCrop(crop_size)`` with ``resize = round(256 ·
  crop_size / 224)`` (256 for the original 224; deviation for other crop sizes, which the
  original code does not have: the same ratio of resize to crop), or the resize given: a known
  weights file's own (:mod:`cocos.models.weights`: 232 for torchvision's V2 ResNets). The sizes are checked by
  :func:`cocos.data.transforms.check_image_sizes` (commands call it up front, with the memory
  check; :func:`batch_loader` again, the sizes only).
* **Memory.** A worker decodes, transforms and lets go of a batch's images one at a time
  (:class:`~cocos.data.images.ImageBatches`): a batch holds the ``(n, 3, c, c)`` float32 pixels
  and at most one full-size decoded image, whatever the images' size.
* **CUDA.** The CNN runs in channels-last memory format under bf16 autocast (when the GPU
  supports bf16); its pooled feature is cast back to float32 before the projection, so the
  projection, the caption encoder and the loss stay in float32. On the CPU nothing changes:
  no autocast (bf16 on the CPU is slower for these convolutions and not exact), the model's
  plain float32 forward.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import numpy as np
import torch

from cocos.data.images import ImageBatches, ImageSplit
from cocos.data.transforms import CROP_SIZE, check_image_sizes, eval_transform, train_transform
from cocos.models.weights import proportional_resize


def eval_resize(crop_size: int) -> int:
    """The evaluation transform's ``Resize``: 256 for a 224 crop, the same ratio otherwise
    (:func:`cocos.models.weights.proportional_resize` at 256 : 224)."""
    return proportional_resize(crop_size)


def image_transform(train: bool, crop_size: int = CROP_SIZE, resize: int | None = None):
    """VSE++'s training or evaluation transform at ``crop_size`` (picklable for workers); the evaluation ``Resize`` is
    ``resize`` (a known weights file's own: :func:`cocos.models.weights.evaluation_transform`), else
    :func:`eval_resize`."""
    if train:
        return functools.partial(train_transform, crop_size=crop_size)
    return functools.partial(eval_transform, resize=eval_resize(crop_size) if resize is None else int(resize),
                             crop_size=crop_size)


def batch_loader(split: ImageSplit, transform, plan: list, *, seed: int = 0, epoch: int = 0, workers: int = 0,
                 device: torch.device | str = "cpu") -> torch.utils.data.DataLoader:
    """A DataLoader yielding the stacked pixels of each batch of ``plan`` in order (see the module docstring).

    The transform's sizes (a ``functools.partial`` of :func:`~cocos.data.transforms.train_transform` or
    ``eval_transform``: its ``crop_size`` and ``resize``), the largest batch and ``workers`` are checked by
    :func:`~cocos.data.transforms.check_image_sizes` without its memory check (memory is the caller's
    up-front check; here it would change during a run).
    """
    sizes = getattr(transform, "keywords", None) or {}
    largest = max((len(np.atleast_1d(images)) for images, _ in plan), default=1)
    check_image_sizes(sizes.get("resize"), sizes.get("crop_size", CROP_SIZE), max(1, largest), workers,
                      memory=sys.maxsize)
    dataset = ImageBatches(split, transform, plan, seed=seed, epoch=epoch)
    return torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=int(workers),
                                       pin_memory=torch.device(device).type == "cuda",
                                       prefetch_factor=2 if workers else None)


def uses_amp(device: torch.device | str) -> bool:
    """bf16 autocast for the CNN: on a CUDA device that supports bf16, never on the CPU."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def prepare_model(model: torch.nn.Module, device: torch.device | str) -> torch.nn.Module:
    """A raw-image model on ``device``: on CUDA its CNN in channels-last format (the CPU path is unchanged)."""
    model = model.to(device)
    if torch.device(device).type == "cuda" and hasattr(model, "cnn"):
        model.cnn.to(memory_format=torch.channels_last)
    return model


def pooled_features(model: torch.nn.Module, pixels: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """The CNN's float32 ``(n, d)`` features of a batch of normalised pixels (bf16 autocast on CUDA); ``model`` is
    a raw-image model (its ``pooled``) or a bare CNN whose classifier is stripped."""
    device = torch.device(device)
    pooled = model.pooled if hasattr(model, "pooled") else model
    pixels = pixels.to(device, non_blocking=True)
    if device.type != "cuda":
        return pooled(pixels)
    pixels = pixels.contiguous(memory_format=torch.channels_last)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if uses_amp(device) else contextlib.nullcontext()
    with amp:
        out = pooled(pixels)
    return out.float()


def encode_pixels(model: torch.nn.Module, pixels: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Image embeddings of a batch of pixels: ``encode_pooled(pooled_features(...))``; on the CPU exactly
    ``model.encode_images(pixels)``."""
    return model.encode_pooled(pooled_features(model, pixels, device))


def model_transform(model: torch.nn.Module, train: bool, crop_size: int = CROP_SIZE, resize: int | None = None):
    """A raw-image model's pixels: its own preprocessing where it has one (CLIP's, ``model.image_transform(train)``,
    :mod:`cocos.data.clip`), else :func:`image_transform` at ``crop_size`` (and ``resize``)."""
    own = getattr(model, "image_transform", None)
    return own(train) if own is not None else image_transform(train, crop_size, resize)
