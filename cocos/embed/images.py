"""Frozen encoding of raw-image splits (model kind ``vsepp_full``), as the COCOS authors' notebooks did.

The notebooks load ``model_best.pth.tar``, build the training images with the *evaluation*
transform (``Resize(256)`` + ``CenterCrop(224)``), encode the training set once with the frozen
model and then count in shuffled batches of the checkpoint's batch size. Here a split becomes a
:class:`PooledSplit`: the CNN's pooled feature of every image (:meth:`VSEPPFull.pooled`, from a
matching feature cache, :mod:`cocos.embed.features`, or computed from the images) and the
captions in image-major order; :class:`PooledModel` embeds such features with
``encode_pooled``, so the precomputed-feature encoding and evaluation
(:func:`cocos.training.evaluate.encode_split`) run unchanged. With the CNN in eval mode every
image's embedding is ``encode_pooled(pooled(pixels))``, the same as ``encode_images``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from cocos.data.images import ImageSplit, load_image_split
from cocos.data.precomp import FeatureRows
from cocos.data.transforms import CROP_SIZE, RESIZE
from cocos.embed.features import (
    cache_key,
    cached_features,
    candidate_caches,
    check_sizes,
    cnn_state_hash,
    image_major_captions,
    pooled_features,
)
from cocos.errors import CocosError
from cocos.models.weights import WeightsTransformWarning, identify, known_by_name, proportional_resize
from cocos.training.config import record_flat
from cocos.training.pixels import eval_resize


class PooledSplit(FeatureRows):
    """An image split as pooled CNN features: the surface of :class:`cocos.data.precomp.PrecompSplit` that
    encoding and evaluation use (captions image-major: caption ``c`` belongs to image ``c // k``)."""

    def __init__(self, split: ImageSplit, features: np.ndarray, source: str | os.PathLike):
        self.images = split
        self.split = split.split
        self.k = int(split.image_captions().shape[1])
        self.captions = image_major_captions(split)
        if features.shape[0] != split.n_images:
            raise CocosError(f"{source}: {features.shape[0]} feature rows for {split.n_images} images")
        self.features = features
        self.features_path = Path(source)  # what messages name
        self.folder = Path(split.source)

    def features_for(self, image_idx) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.features[np.asarray(image_idx)], dtype=np.float32))


class PooledModel(torch.nn.Module):
    """A ``vsepp_full`` model that takes pooled CNN features as its images (``encode_pooled``)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model
        self.embedded = keeps_embeddings(model)  # its split holds its image embeddings (ImageSource.open)
        dim = model.hparams["embed_size"] if self.embedded else model.img_dim
        self.hparams = {**model.hparams, "img_dim": int(dim)}

    def encode_images(self, features: torch.Tensor) -> torch.Tensor:
        return features if self.embedded else self.inner.encode_pooled(features)

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.inner.encode_captions(tokens, lengths)

    def forward(self, features, tokens, lengths):
        return self.encode_images(features), self.encode_captions(tokens, lengths)


def keeps_embeddings(model: torch.nn.Module) -> bool:
    """Whether an analysed split of a raw-image model holds its image embeddings rather than its pooled features
    (``keeps_embeddings``): a grid ``(n, cells, d)`` too large to keep (VSE∞), or a model with its own
    preprocessing and no feature cache (CLIP)."""
    return bool(getattr(model, "keeps_embeddings", False))


class _Embedder(torch.nn.Module):
    """A model that keeps its embeddings (VSE∞'s grid, CLIP) as a "CNN" whose output is its image embedding
    (``encode_pooled . pooled``, eval mode)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        grid = self.model.pooled(pixels).float()
        with torch.autocast(pixels.device.type, enabled=False):  # the head in float32, as training's encode_pixels
            return self.model.encode_pooled(grid)


@dataclass
class ImageSource:
    """Where a ``vsepp_full`` model's images come from and how they are turned into pooled features."""

    data: Path
    resize: int = RESIZE
    crop_size: int = CROP_SIZE
    use_restval: bool = False
    features: list = field(default_factory=list)  # --features folders, before the default location
    workers: int = 0
    batch_size: int = 64
    log: object = None  # called with one line when a cache is used
    weights: str | None = None  # the readable name of the CNN's known weights file (cocos.models.weights), if any

    def __post_init__(self):
        check_sizes(self.resize, self.crop_size)

    def transform_record(self) -> dict:
        """The evaluation transform as reports record it: ``{"resize", "crop_size", "weights"}`` (weights: the known
        file's readable name, or None)."""
        return {"resize": int(self.resize), "crop_size": int(self.crop_size), "weights": self.weights}

    def peek(self, split: str) -> ImageSplit:
        """The image split alone (its sizes; no image is read)."""
        return load_image_split(self.data, split, use_restval=self.use_restval)

    def open(self, model: torch.nn.Module, split: str, device, progress: bool = False) -> PooledSplit:
        """``split`` as pooled features of ``model``'s CNN: from a matching cache, else computed from the images.

        A matching cache is used only when its rows still have the sha256 its manifest records
        (:func:`cocos.embed.features.cached_features`); a changed or damaged one is not used: one
        :class:`~cocos.embed.features.FeatureCacheWarning` line names it (``cocos analyze`` prints it as a
        ``warning:``) and the images are encoded instead, so the analysis is the uncached one."""
        images = load_image_split(self.data, split, use_restval=self.use_restval)
        if keeps_embeddings(model):  # the image embeddings, batch by batch (a grid is too large to keep)
            own = getattr(model, "image_transform", None)  # a model's own preprocessing (CLIP's), else the source's
            feats = pooled_features(_Embedder(model), images, resize=self.resize, crop_size=self.crop_size,
                                    batch_size=self.batch_size, workers=self.workers, device=device,
                                    progress=progress, transform=own(False) if own else None,
                                    what="image embeddings")
            return PooledSplit(images, feats, images.source)
        cnn = model.cnn
        folders = candidate_caches(self.data, self.features)
        found = None
        if folders:  # the key reads every image's bytes once: only when there is a cache to compare with
            key = cache_key(images.fingerprint(), model.hparams["cnn_type"], cnn_state_hash(cnn), self.resize,
                            self.crop_size)
            found = cached_features(folders, images, key)
        if found is not None:
            feats, folder = found
            if self.log is not None:
                self.log(f"features: split {images.split} from the cache {folder} (fingerprint {key['fingerprint']}, "
                         f"CNN {key['cnn_type']} {key['cnn_hash']})")
            return PooledSplit(images, feats, folder / f"{images.split}_ims.npy")
        feats = pooled_features(cnn, images, resize=self.resize, crop_size=self.crop_size, batch_size=self.batch_size,
                                workers=self.workers, device=device, progress=progress)
        return PooledSplit(images, feats, images.source)


def image_source_of(ckpt: dict, data: Path, *, resize: int | None = None, crop_size: int | None = None,
                    features=(), workers: int = 0, log=None) -> ImageSource:
    """The image source of a ``vsepp_full`` checkpoint: ``use_restval`` as recorded (the original's ``opt``, or
    the checkpoint's ``data``/``train`` entries) and the evaluation sizes (:func:`recorded_transform`): those given
    win; what is not given is the checkpoint's own. Given sizes unlike those of a known weights file
    (:mod:`cocos.models.weights`) are said in one :class:`~cocos.models.weights.WeightsTransformWarning` line
    (``cocos analyze`` prints it as a ``warning:``)."""
    train = ckpt.get("train")
    recorded = {**(record_flat(train) if isinstance(train, dict) else {}), **ckpt.get("data", {})}
    opt = (ckpt.get("legacy") or {}).get("opt") or {}
    restval = bool(recorded.get("use_restval", opt.get("use_restval", False)))
    preprocess = (ckpt.get("model") or {}).get("hparams", {}).get("preprocess")
    if isinstance(preprocess, dict):  # a model with its own preprocessing (CLIP): its sizes, whatever is given
        return ImageSource(Path(data), resize=int(preprocess["resize"]), crop_size=int(preprocess["crop_size"]),
                           use_restval=restval, features=[Path(f) for f in features], workers=workers, log=log)
    own_resize, own_crop, weights = recorded_transform(ckpt)
    crop = own_crop if crop_size is None else int(crop_size)
    size = proportional_resize(crop, own_resize, own_crop) if resize is None else int(resize)
    if weights is not None:
        _warn_transform(ckpt, weights, (own_resize, own_crop), (size, crop), (resize, crop_size))
    return ImageSource(Path(data), resize=size, crop_size=crop, use_restval=restval,
                       features=[Path(f) for f in features], workers=workers, log=log, weights=weights)


def _warn_transform(ckpt: dict, weights: str, own: tuple, used: tuple, given: tuple) -> None:
    """One :class:`WeightsTransformWarning` line: sizes given unlike a known weights file's, or an old checkpoint
    (:func:`_unrecorded`) now evaluated at its file's own resize rather than the 256 : 224 it was validated at."""
    (size, crop), (resize, _) = used, given
    if used != own and given != (None, None):
        warnings.warn(WeightsTransformWarning(
            f"the checkpoint's CNN weights are {weights}, evaluated at Resize {own[0]} + CenterCrop {own[1]}; "
            f"using Resize {size} + CenterCrop {crop} as given"), stacklevel=3)
    elif _unrecorded(ckpt) and resize is None and size != eval_resize(crop):
        warnings.warn(WeightsTransformWarning(
            f"the checkpoint records no evaluation transform (written before cocos knew weights files): its CNN "
            f"weights are {weights}, evaluated at their own Resize {size} + CenterCrop {crop}, not the "
            f"Resize {eval_resize(crop)} it was validated at while training (--resize {eval_resize(crop)} for that)"),
            stacklevel=3)


def _unrecorded(ckpt: dict) -> bool:
    """A cocos checkpoint written before the evaluation transform was recorded (no ``data.resize``)."""
    return "legacy" not in ckpt and not (ckpt.get("data") or {}).get("resize")


def recorded_transform(ckpt: dict) -> tuple[int, int, str | None]:
    """``(resize, crop_size, weights name or None)``: a raw-image checkpoint's own evaluation transform.

    * the original code's (``legacy``): ``Resize(256)`` + ``CenterCrop(224)``, what it always evaluated at (its
      ``opt.crop_size`` is its training crop);
    * a checkpoint that records ``data.resize`` (cocos since #31): that, its ``data.crop_size``, and the readable
      name of ``data.weights``;
    * an earlier cocos checkpoint: its ``data.crop_size`` (224 when not recorded) and the resize of the weights file
      it started from (``train.cnn_weights``) when that file is known (:func:`cocos.models.weights.identify` when it
      is still there, else by torchvision's file name), in the file's ratio; else ``round(crop * 256 / 224)``.
    """
    data, train = ckpt.get("data") or {}, ckpt.get("train")
    train = record_flat(train) if isinstance(train, dict) else {}
    if "legacy" in ckpt:
        return RESIZE, CROP_SIZE, None
    crop = int(data.get("crop_size") or train.get("crop_size") or CROP_SIZE)
    if data.get("resize"):
        named = (data.get("weights") or {}).get("name")
        return int(data["resize"]), crop, named
    path = train.get("cnn_weights")
    known = None
    if path and Path(path).is_file():
        with contextlib.suppress(CocosError):  # a file that no longer is what its name says: not known
            known = identify(path)[0]
    elif path:
        known = known_by_name(path)
    if known is None:
        return eval_resize(crop), crop, None
    return proportional_resize(crop, known.resize, known.crop_size), crop, known.name


__all__ = ["ImageSource", "PooledModel", "PooledSplit", "image_source_of", "recorded_transform"]
