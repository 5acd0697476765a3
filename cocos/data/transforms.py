"""Image transforms of the original VSE++ code, restated with Pillow and torch (no torchvision).

The original code (``vsepp/data.py``, ``get_transform``) builds, with torchvision::

    train:     RandomResizedCrop(crop_size) + RandomHorizontalFlip() + ToTensor() + Normalize
    val, test: Resize(256) + CenterCrop(224)                        + ToTensor() + Normalize

with ImageNet's ``mean = (0.485, 0.456, 0.406)``, ``std = (0.229, 0.224, 0.225)``.
Here, on a PIL RGB image (definitions file, "Raw images"):

* **Resize(s)**: the shorter side becomes ``s``, the longer ``int(s * long / short)``
  (truncated, as torchvision), with ``PIL.Image.BILINEAR`` (torchvision's default for
  PIL images; Pillow's resampling is antialiased, as torchvision's PIL path is).
* **CenterCrop(c)**: ``top = int(round((h - c) / 2.0))``, ``left = int(round((w - c) / 2.0))``
  (Python's round: halves go to the even number, as in torchvision). An image smaller
  than ``c`` is first padded with zeros as torchvision does (left/top get
  ``(c - w) // 2``, right/bottom ``(c - w + 1) // 2``).
* **RandomResizedCrop(c)**: torchvision's ``get_params`` (scale ``(0.08, 1.0)``, ratio
  ``(3/4, 4/3)`` drawn log-uniformly, 10 attempts, then the central-crop fallback), the
  crop resized to ``c x c`` with BILINEAR.
* **RandomHorizontalFlip(0.5)**: flip when ``torch.rand(1) < 0.5``.
* **ToTensor + Normalize**: ``(x / 255 - mean) / std``, ``(3, H, W)`` float32.

Deviation: torchvision draws from torch's global random stream; here every random
number comes from the ``torch.Generator`` passed in, in the same order and with the
same calls (``uniform_``, ``randint``, ``rand``), so for the same generator state the
crop and the flip are exactly torchvision's. :class:`cocos.data.images.ImageCaptionDataset`
gives every item its own generator, so a run does not depend on the number of workers.

Both transforms are called as ``transform(img, generator)`` (``eval_transform`` ignores
the generator) so that a dataset can hold either; sizes are keyword parameters (bind
them with ``functools.partial``, which stays picklable for DataLoader workers).

**Sizes checked up front** (:func:`check_image_sizes`, before anything is read or written):
``resize`` and ``crop_size`` are positive and at most :data:`MAX_SIDE` (8192) pixels (a larger
one makes every image above :data:`MAX_RESIZED_PIXELS`), and the pixels of the batches held at
once, ``batches x batch_size x 3 x crop_size² x 4`` bytes with ``batches = 1 + 2 x workers``
(the batch in use and a DataLoader's two prefetched batches per worker), fit in the memory
available (:func:`cocos.io.available_memory`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from cocos.defaults import DEFAULT_CROP_SIZE, DEFAULT_RESIZE, IMAGENET_MEAN, IMAGENET_STD  # noqa: F401 (here too)
from cocos.errors import CocosError
from cocos.io import available_memory

CROP_SIZE = DEFAULT_CROP_SIZE
RESIZE = DEFAULT_RESIZE
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
# Resize would make an image of more pixels than this (a 1 x 40,000 strip at Resize(256)): refused.
MAX_RESIZED_PIXELS = 1 << 26
# The largest Resize or CenterCrop side: a square of this side has MAX_RESIZED_PIXELS pixels.
MAX_SIDE = math.isqrt(MAX_RESIZED_PIXELS)
# Batches of pixels a DataLoader holds per worker besides the one in use (its prefetch_factor).
PREFETCH = 2


def _check_count(name: str, value: object, minimum: int, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "a positive" + ("" if unit else " integer") if minimum == 1 else f"an integer of at least {minimum}"
        raise CocosError(f"{name} must be {what}{unit}, got {value!r}")
    return int(value)


def batch_pixel_bytes(batch_size: int, crop_size: int) -> int:
    """Bytes of one batch of transformed pixels: ``batch_size x 3 x crop_size² x 4`` (float32)."""
    return int(batch_size) * 3 * int(crop_size) ** 2 * 4


def check_image_sizes(resize: int | None = None, crop_size: int = CROP_SIZE, batch_size: int = 1, workers: int = 0,
                      *, memory: int | None = None) -> None:
    """Refuse, in one :class:`CocosError` line, image sizes that no image could pass or that cannot fit in memory.

    ``resize`` (None: no Resize, the training transform) and ``crop_size`` must be integers in
    ``[1, MAX_SIDE]``, ``batch_size`` at least 1 and ``workers`` at least 0; the pixels of
    ``1 + 2 x workers`` batches (module docstring) must fit in ``memory`` bytes (default
    :func:`cocos.io.available_memory`). Call it before anything is read or written.
    """
    sides = [("crop size", crop_size)] + ([] if resize is None else [("resize", resize)])
    for name, value in sides:
        value = _check_count(f"the {name}", value, 1, " number of pixels")
        if value > MAX_SIDE:
            raise CocosError(f"the {name} of {value:,} pixels is above {MAX_SIDE:,}: an image of {value:,} x "
                             f"{value:,} pixels is above cocos's limit of {MAX_RESIZED_PIXELS:,} pixels")
    batch_size = _check_count("the batch size", batch_size, 1)
    workers = _check_count("the number of workers", workers, 0)
    batches = 1 + PREFETCH * workers
    need = batches * batch_pixel_bytes(batch_size, crop_size)
    have = available_memory() if memory is None else int(memory)
    if need > have:
        held = f"{batches} batches held at once with {workers} workers" if workers else "one batch"
        raise CocosError(f"a batch of {batch_size:,} images at crop size {int(crop_size):,} is "
                         f"{batch_pixel_bytes(batch_size, crop_size) / 2**30:,.1f} GiB of pixels ({held}: "
                         f"{need / 2**30:,.1f} GiB), more than the {have / 2**30:,.1f} GiB of memory available; "
                         "use a smaller batch size or crop size, or fewer workers")


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """``(width, height)`` after torchvision's ``Resize(size)``: shorter side ``size``, longer truncated."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def resize_shorter(img: Image.Image, size: int) -> Image.Image:
    """torchvision ``Resize(size)`` on a PIL image: shorter side to ``size``, BILINEAR."""
    w, h = resized_size(img.width, img.height, size)
    if w * h > MAX_RESIZED_PIXELS:
        raise CocosError(f"an image of {img.width} x {img.height} pixels would become {w} x {h} when resized "
                         f"to {size}; its aspect ratio is too extreme")
    if (w, h) == img.size:
        return img
    return img.resize((w, h), Image.BILINEAR)


def center_crop_box(width: int, height: int, crop: int) -> tuple[int, int]:
    """``(top, left)`` of torchvision's ``CenterCrop(crop)`` on an image at least ``crop`` in both sides."""
    return int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0))


def center_crop(img: Image.Image, crop: int) -> Image.Image:
    """torchvision ``CenterCrop(crop)``: zero padding first if a side is shorter than ``crop``."""
    if img.width < crop or img.height < crop:
        padded = Image.new("RGB", (max(crop, img.width), max(crop, img.height)), (0, 0, 0))
        padded.paste(img, ((crop - img.width) // 2 if crop > img.width else 0,
                           (crop - img.height) // 2 if crop > img.height else 0))
        img = padded
    top, left = center_crop_box(img.width, img.height, crop)
    return img.crop((left, top, left + crop, top + crop))


def to_tensor(img: Image.Image) -> torch.Tensor:
    """torchvision ``ToTensor`` of an RGB image: ``(3, H, W)`` float32 in ``[0, 1]``."""
    arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous().float().div_(255.0)


def normalize(x: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """torchvision ``Normalize``: ``(x - mean) / std`` per channel."""
    m = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - m) / s


def random_resized_crop_params(
    width: int, height: int, generator: torch.Generator, scale=SCALE, ratio=RATIO
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of torchvision's ``RandomResizedCrop.get_params``, drawn from ``generator``."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0].item(), log_ratio[1].item(),
                                                   generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    # fallback: the central crop, its aspect ratio clamped into the range
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def eval_transform(
    img: Image.Image, generator: torch.Generator | None = None, *, resize: int = RESIZE,
    crop_size: int = CROP_SIZE,
) -> torch.Tensor:
    """Evaluation transform: Resize(resize) + CenterCrop(crop_size) + ToTensor + Normalize.

    ``(3, crop_size, crop_size)`` float32; ``generator`` is ignored (same call as
    :func:`train_transform`).
    """
    return normalize(to_tensor(center_crop(resize_shorter(img, resize), crop_size)))


def train_transform(img: Image.Image, generator: torch.Generator, *, crop_size: int = CROP_SIZE) -> torch.Tensor:
    """Training transform: RandomResizedCrop(crop_size) + RandomHorizontalFlip + ToTensor + Normalize.

    All randomness from ``generator``: first the crop (:func:`random_resized_crop_params`),
    then one ``torch.rand(1)`` for the flip (flip when below 0.5).
    """
    if not isinstance(generator, torch.Generator):
        raise CocosError("train_transform needs a torch.Generator (every random draw comes from it)")
    top, left, h, w = random_resized_crop_params(img.width, img.height, generator)
    out = img.crop((left, top, left + w, top + h)).resize((crop_size, crop_size), Image.BILINEAR)
    if torch.rand(1, generator=generator).item() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return normalize(to_tensor(out))
