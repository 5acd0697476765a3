"""The image transforms against hand-computed sizes, offsets and pixels, and RandomResizedCrop against
a restatement of torchvision's get_params (torchvision itself is not installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from cocos.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    center_crop_box,
    eval_transform,
    random_resized_crop_params,
    resized_size,
    train_transform,
)
from cocos.errors import CocosError

MEAN = np.array(IMAGENET_MEAN).reshape(3, 1, 1)
STD = np.array(IMAGENET_STD).reshape(3, 1, 1)


def _hand_normalise(pixels_hwc: np.ndarray) -> np.ndarray:
    """``(x / 255 - mean) / std`` in float64, CHW."""
    return (pixels_hwc.transpose(2, 0, 1) / 255.0 - MEAN) / STD


def _image_4x6() -> tuple[Image.Image, np.ndarray]:
    """A 6-wide, 4-high image whose pixel (r, c) is (10 r + c, 100 + c, 200 - 10 r)."""
    r, c = np.mgrid[0:4, 0:6]
    pixels = np.stack([10 * r + c, 100 + c, 200 - 10 * r], axis=-1).astype(np.uint8)
    return Image.fromarray(pixels, "RGB"), pixels


@pytest.mark.parametrize(("w", "h", "size", "expected"), [
    (6, 4, 3, (4, 3)),        # shorter side h: w = int(3 * 6 / 4) = int(4.5) = 4
    (4, 6, 3, (3, 4)),
    (5, 7, 4, (4, 5)),        # int(4 * 7 / 5) = int(5.6) = 5 (truncated, not rounded)
    (1, 1, 256, (256, 256)),
    (3, 1000, 2, (2, 666)),   # int(666.67)
    (640, 480, 256, (341, 256)),  # a COCO-sized image: int(341.33)
])
def test_resize_sizes(w, h, size, expected):
    assert resized_size(w, h, size) == expected


@pytest.mark.parametrize(("w", "h", "crop", "expected"), [
    (6, 4, 2, (1, 2)),    # top round(1.0), left round(2.0)
    (7, 5, 2, (2, 2)),    # round(1.5) = 2 and round(2.5) = 2: halves to even, as torchvision's round
    (3, 3, 2, (0, 0)),    # round(0.5) = 0
    (341, 256, 224, (16, 58)),  # round(16.0), round(58.5) = 58
])
def test_center_crop_offsets(w, h, crop, expected):
    assert center_crop_box(w, h, crop) == expected


def test_eval_transform_crop_and_normalisation_by_hand():
    img, pixels = _image_4x6()
    out = eval_transform(img, resize=4, crop_size=2)  # shorter side already 4: no resampling
    assert out.shape == (3, 2, 2) and out.dtype == torch.float32
    expected = _hand_normalise(pixels[1:3, 2:4])  # top 1, left 2
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)
    # pixel (1, 2) by hand: (12, 102, 190)
    assert out[0, 0, 0].item() == pytest.approx((12 / 255 - 0.485) / 0.229, abs=1e-6)
    assert out[2, 0, 0].item() == pytest.approx((190 / 255 - 0.406) / 0.225, abs=1e-6)


def test_bilinear_resize_pixels_by_hand():
    """Halving [0, 0, 200, 200]: Pillow's triangle filter widened to 2 px gives weights 3/7, 3/7, 1/7."""
    pixels = np.zeros((2, 4, 3), np.uint8)
    pixels[:, 2:] = 200
    out = eval_transform(Image.fromarray(pixels, "RGB"), resize=1, crop_size=1)  # resized to 2 x 1, crop col 0
    left = round(200 * 1 / 7)  # 28.57 -> 29
    np.testing.assert_allclose(out.numpy()[:, 0, 0], _hand_normalise(np.full((1, 1, 3), left))[:, 0, 0], atol=1e-6)


def test_one_pixel_image_and_padding():
    img = Image.new("RGB", (1, 1), (255, 0, 128))
    out = eval_transform(img)
    assert out.shape == (3, 224, 224)
    colour = [(1 - 0.485) / 0.229, (0 - 0.456) / 0.224, (128 / 255 - 0.406) / 0.225]
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(np.array(colour).reshape(3, 1, 1), out.shape), atol=1e-5)
    # a crop larger than the image: zero padding, (4 - 2) // 2 = 1 before, 1 after
    padded = eval_transform(Image.new("RGB", (2, 2), (255, 255, 255)), resize=2, crop_size=4).numpy()
    zero, one = (-MEAN / STD)[:, 0, 0], ((1 - MEAN) / STD)[:, 0, 0]
    mask = np.zeros((4, 4), bool)
    mask[1:3, 1:3] = True
    np.testing.assert_allclose(padded[:, mask].T, np.broadcast_to(one, (4, 3)), atol=1e-6)
    np.testing.assert_allclose(padded[:, ~mask].T, np.broadcast_to(zero, (12, 3)), atol=1e-6)
    assert train_transform(img, torch.Generator().manual_seed(0), crop_size=3).shape == (3, 3, 3)


def test_extreme_aspect_ratio_refused():
    with pytest.raises(CocosError, match="aspect ratio"):
        eval_transform(Image.new("RGB", (1, 70000)), resize=256)


def _torchvision_get_params(width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, restated on torch's global generator."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def test_random_resized_crop_params_equal_torchvision():
    state = torch.random.get_rng_state()
    try:
        for seed in range(40):
            for w, h in ((500, 375), (6, 4), (3, 40), (40, 3), (1, 1)):
                torch.manual_seed(seed)
                expected = _torchvision_get_params(w, h)
                got = random_resized_crop_params(w, h, torch.Generator().manual_seed(seed))
                assert got == expected, (seed, w, h)
    finally:
        torch.random.set_rng_state(state)


def test_random_resized_crop_fallback_by_hand():
    # 1 x 100: no crop of ratio in [3/4, 4/3] and area >= 8 fits; central crop w = 1, h = round(1 / 0.75) = 1
    assert random_resized_crop_params(1, 100, torch.Generator().manual_seed(3)) == (49, 0, 1, 1)
    # 100 x 1: h = 1, w = round(1 * 4/3) = 1, left (100 - 1) // 2 = 49
    assert random_resized_crop_params(100, 1, torch.Generator().manual_seed(3)) == (0, 49, 1, 1)


def test_train_transform_crop_and_flip_by_hand():
    """A 2 x 2 image, left column red, right blue: crops of the whole image show it flipped or not."""
    pixels = np.zeros((2, 2, 3), np.uint8)
    pixels[:, 0] = (255, 0, 0)
    pixels[:, 1] = (0, 0, 255)
    img = Image.fromarray(pixels, "RGB")
    seen = set()
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        params = random_resized_crop_params(2, 2, g)
        flip = torch.rand(1, generator=g).item() < 0.5
        out = train_transform(img, torch.Generator().manual_seed(seed), crop_size=2).numpy()
        if params != (0, 0, 2, 2):
            continue
        expected = pixels[:, ::-1] if flip else pixels
        np.testing.assert_allclose(out, _hand_normalise(expected), atol=1e-6)
        seen.add(flip)
    assert seen == {True, False}


def test_train_transform_deterministic_for_a_generator_state():
    img, _ = _image_4x6()
    a = train_transform(img, torch.Generator().manual_seed(5), crop_size=3)
    b = train_transform(img, torch.Generator().manual_seed(5), crop_size=3)
    outs = {train_transform(img, torch.Generator().manual_seed(s), crop_size=3).numpy().tobytes() for s in range(8)}
    assert torch.equal(a, b) and len(outs) > 1
    with pytest.raises(CocosError):
        train_transform(img, None)
