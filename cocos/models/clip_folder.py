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


def clip_checkpoint(folder: str | os.PathLike, data: str | os.PathLike | None, *, log=None) -> dict:
    """The cocos checkpoint (plain types and tensors) of a CLIP folder, for the image dataset ``data``."""
    folder = Path(folder)
    if data is None:
        raise CocosError(f"{folder}: a CLIP folder records no data; pass --data (an image dataset)")
    data = Path(data)
    if not is_image_dataset(data):
        raise CocosError(f"{data}: not an image dataset (images/ and a dataset_*.json, {{split}}_set.p or a CSV file "
                         f"list); a CLIP model encodes raw images")
    clip = CLIPFolder.read(folder)
    model = CLIPDual(len(clip.coder), clip.config, clip.preprocess.record()).load_pretrained(folder)
    train = load_image_split(data, "train")
    k = int(train.image_captions().shape[1])
    if log is not None and train.n_images >= 1000:
        log(f"fingerprinting the {train.n_images:,} training images (read once)")
    return {
        "model": {"kind": CLIPDual.kind, "hparams": dict(model.hparams)},
        "vocab": clip.coder.tokens,
        "text": clip.coder.options(),
        "state_dict": {k_: v.detach().contiguous() for k_, v in model.state_dict().items()},
        "loss": {"name": "ntxent", "params": {"tau": model.temperature()}, "compat": False},
        "data": {"path": str(data.resolve()), "fingerprint": train.fingerprint(), "k": k,
                 "feature_shape": [int(model.img_dim)], "input": "images", "crop_size": clip.preprocess.crop_size},
        "train": {"model": CLIPDual.kind, "loss": "ntxent", "data": str(data.resolve()), "k": k,
                  "sources": {"clip": str(folder.resolve())}},
        "epoch": 0,
        "step": 0,
        "metrics": {},
        "best_rsum": None,
        "history": [],
    }


__all__ = ["clip_checkpoint", "is_clip_folder"]
