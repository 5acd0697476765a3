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

from cocos.data.siglip import SiglipFolder
from cocos.hf import is_siglip_folder
from cocos.models.clip_folder import dual_checkpoint, image_data
from cocos.models.siglip import SiglipDual

LOSS = "siglip"  # SigLIP's own loss family (cocos.losses.siglip): parameters t and b


def siglip_checkpoint(folder: str | os.PathLike, data: str | os.PathLike | None, *, log=None) -> dict:
    """The cocos checkpoint (plain types and tensors) of a SigLIP folder, for the image dataset ``data``."""
    folder = Path(folder)
    data = image_data(folder, data, "a SigLIP folder", "SigLIP")
    siglip = SiglipFolder.read(folder)
    model = SiglipDual(len(siglip.coder), siglip.config, siglip.preprocess.record(),
                       siglip.padding.record()).load_pretrained(folder)
    loss = {"name": LOSS, "params": model.loss_params(), "compat": False}
    return dual_checkpoint(model, siglip.coder, loss, data, crop_size=siglip.preprocess.size, log=log,
                           train={"sources": {"siglip": str(folder.resolve())}})


__all__ = ["siglip_checkpoint", "is_siglip_folder"]
