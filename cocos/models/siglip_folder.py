"""A Hugging Face SigLIP folder as a cocos checkpoint (``cocos analyze SIGLIP_DIR --data IMAGES``, ``cocos import``).

The folder (:class:`cocos.data.siglip.SiglipFolder`: ``config.json``, weights, ``tokenizer.json``,
``preprocessor_config.json`` or ``processor_config.json``) becomes, in memory, the checkpoint ``cocos train --model
siglip`` would write for a model that was never trained by cocos: the ``siglip`` family with the folder's config,
preprocessing and caption padding, its weights (read completely or not at all by :func:`cocos.hf.read_weights`:
safetensors or a ``weights_only`` torch file, no code runs, nothing downloaded, every tensor of the model present,
of its shape and dtype kind), its tokenizer as the caption coder, and as its loss SigLIP's own: the ``siglip`` loss
at the folder's learned ``t = exp(logit_scale)`` and ``b = logit_bias`` (neither clamped: transformers' forward
scores pairs with them as they are). The loss is counted as cocos counts (``compat`` off). The data folder is the
one given (``--data``): a SigLIP folder names none. Nothing records a training batch size: an analysis counts at
128 unless told (``--batch-size``).

A reader of the model family's own pre-trained source (a folder as transformers saves it), not of the original
code's files: it lives with the family, not in :mod:`cocos.legacy`.
"""

from __future__ import annotations

import os
from pathlib import Path

from cocos.data.images import is_image_dataset, load_image_split
from cocos.data.siglip import SiglipFolder
from cocos.errors import CocosError
from cocos.hf import is_siglip_folder
from cocos.models.siglip import SiglipDual

LOSS = "siglip"  # SigLIP's own loss family (cocos.losses.siglip): parameters t and b


def siglip_checkpoint(folder: str | os.PathLike, data: str | os.PathLike | None, *, log=None) -> dict:
    """The cocos checkpoint (plain types and tensors) of a SigLIP folder, for the image dataset ``data``."""
    folder = Path(folder)
    if data is None:
        raise CocosError(f"{folder}: a SigLIP folder records no data; pass --data (an image dataset)")
    data = Path(data)
    if not is_image_dataset(data):
        raise CocosError(f"{data}: not an image dataset (images/ and a dataset_*.json, {{split}}_set.p or a CSV file "
                         f"list); a SigLIP model encodes raw images")
    siglip = SiglipFolder.read(folder)
    model = SiglipDual(len(siglip.coder), siglip.config, siglip.preprocess.record(),
                       siglip.padding.record()).load_pretrained(folder)
    train = load_image_split(data, "train")
    k = int(train.image_captions().shape[1])
    if log is not None and train.n_images >= 1000:
        log(f"fingerprinting the {train.n_images:,} training images (read once)")
    return {
        "model": {"kind": SiglipDual.kind, "hparams": dict(model.hparams)},
        "vocab": siglip.coder.tokens,
        "text": siglip.coder.options(),
        "state_dict": {k_: v.detach().contiguous() for k_, v in model.state_dict().items()},
        "loss": {"name": LOSS, "params": model.loss_params(), "compat": False},
        "data": {"path": str(data.resolve()), "fingerprint": train.fingerprint(), "k": k,
                 "feature_shape": [int(model.img_dim)], "input": "images", "crop_size": siglip.preprocess.size},
        "train": {"model": SiglipDual.kind, "loss": LOSS, "data": str(data.resolve()), "k": k,
                  "sources": {"siglip": str(folder.resolve())}},
        "epoch": 0,
        "step": 0,
        "metrics": {},
        "best_rsum": None,
        "history": [],
    }


__all__ = ["siglip_checkpoint", "is_siglip_folder"]
