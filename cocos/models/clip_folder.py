"""A Hugging Face CLIP folder as a cocos checkpoint (``cocos analyze CLIP_DIR --data IMAGES``, ``cocos import``).

The folder (:class:`cocos.data.clip.CLIPFolder`: ``config.json``, weights, tokenizer, ``preprocessor_config.json``
or ``processor_config.json``) becomes, in memory, the checkpoint ``cocos train --model clip`` would write for a
model that was never trained by cocos: the ``clip`` family with the folder's config and preprocessing, its weights
(read completely or not at all by :func:`cocos.hf.read_weights`: safetensors or a ``weights_only`` torch file, no
code runs, nothing downloaded, every tensor of the model present, of its shape and dtype kind), its tokenizer
as the caption coder, and as its loss CLIP's own: InfoNCE at its learned temperature, NT-Xent with
``tau = 1 / exp(logit_scale)`` (clamped at 100, as CLIP). The loss is counted as cocos counts (``compat`` off:
a caption of the same image is not a negative; CLIP's training batches hold one caption per image, so its loss is
the same on them). The data folder is the one given (``--data``): a CLIP folder names none. Nothing records a
training batch size: an analysis counts at 128 unless told (``--batch-size``).

A reader of the model family's own pre-trained source (a folder as transformers saves it), not of the original
code's files: it lives with the family, not in :mod:`cocos.legacy`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cocos.data.clip import CLIPFolder
from cocos.data.images import is_image_dataset, load_image_split
from cocos.errors import CocosError
from cocos.hf import is_clip_folder
from cocos.models.clip import CLIPDual


def image_data(source, data, what: str, family: str) -> Path:
    """``data`` of ``what`` (``"a CLIP folder"``, ``"an open_clip checkpoint"``: a model that records none) at
    ``source``: an image dataset, else one line; ``family``: who encodes raw images (``"CLIP"``)."""
    if data is None:
        raise CocosError(f"{source}: {what} records no data; pass --data (an image dataset)")
    data = Path(data)
    if not is_image_dataset(data):
        raise CocosError(f"{data}: not an image dataset (images/ and a dataset_*.json, {{split}}_set.p or a CSV file "
                         f"list); a {family} model encodes raw images")
    return data


def dual_checkpoint(model, coder, loss: dict, data: Path, *, crop_size: int, log=None, train: dict | None = None,
                    epoch: int = 0, **extra) -> dict:
    """The cocos checkpoint (plain types and tensors) of a dual encoder read from elsewhere (a Hugging Face folder,
    an open_clip file): ``model`` with its weights, its caption ``coder``, the ``loss`` record it was trained with,
    the image dataset ``data`` (fingerprinted once), ``train`` entries beyond the run's model, loss, data and k
    (its ``sources``), ``extra`` top-level entries (open_clip's file)."""
    split = load_image_split(data, "train")
    k = int(split.image_captions().shape[1])
    if log is not None and split.n_images >= 1000:
        log(f"fingerprinting the {split.n_images:,} training images (read once)")
    return {
        "model": {"kind": model.kind, "hparams": dict(model.hparams)},
        "vocab": coder.tokens,
        "text": coder.options(),
        "state_dict": {key: v.detach().contiguous() for key, v in model.state_dict().items()},
        "loss": loss,
        "data": {"path": str(data.resolve()), "fingerprint": split.fingerprint(), "k": k,
                 "feature_shape": [int(model.img_dim)], "input": "images", "crop_size": int(crop_size)},
        "train": {"model": model.kind, "loss": loss["name"], "data": str(data.resolve()), "k": k, **(train or {})},
        **extra,
        "epoch": int(epoch),
        "step": 0,
        "metrics": {},
        "best_rsum": None,
        "history": [],
    }


def clip_checkpoint(folder: str | os.PathLike, data: str | os.PathLike | None, *, log=None) -> dict:
    """The cocos checkpoint (plain types and tensors) of a CLIP folder, for the image dataset ``data``."""
    folder = Path(folder)
    data = image_data(folder, data, "a CLIP folder", "CLIP")
    clip = CLIPFolder.read(folder)
    model = CLIPDual(len(clip.coder), clip.config, clip.preprocess.record()).load_pretrained(folder)
    loss = {"name": "ntxent", "params": {"tau": model.temperature()}, "compat": False}
    return dual_checkpoint(model, clip.coder, loss, data, crop_size=clip.preprocess.crop_size, log=log,
                           train={"sources": {"clip": str(folder.resolve())}})


__all__ = ["clip_checkpoint", "dual_checkpoint", "image_data", "is_clip_folder"]
