"""Retrieval models: VSE++ and VSRN encoders for precomputed image features, VSE++ on raw images.

Every model exposes ``encode_images(features)`` (``vsepp_full``: normalised pixels
``(n, 3, H, W)``), ``encode_captions(tokens, lengths)`` and
``forward(features, tokens, lengths) -> (img_emb, cap_emb)``;
embeddings are L2-normalised. ``model.kind`` and ``model.hparams`` are enough
to rebuild it: ``build_model(model.kind, **model.hparams)``.
"""

from __future__ import annotations

import torch

from cocos.errors import CocosError
from cocos.models.cnn import CNN_TYPES, build_cnn, load_cnn_weights
from cocos.models.image import VSEPPFull
from cocos.models.text import CaptionEncoder, l2norm
from cocos.models.vsepp import VSEPP
from cocos.models.vsrn import VSRN, RsGCN
from cocos.safeload import first_line

MODELS: dict[str, type[torch.nn.Module]] = {"vsepp": VSEPP, "vsrn": VSRN, "vsepp_full": VSEPPFull}


def build_model(kind: str, **hparams) -> torch.nn.Module:
    """Build the model called ``kind`` with constructor arguments ``hparams``."""
    if kind not in MODELS:
        raise CocosError(f"unknown model '{kind}' (choose from {', '.join(MODELS)})")
    try:
        return MODELS[kind](**hparams)
    except TypeError as exc:  # a setting the model does not take (vsepp_full reads pixels: no img_dim)
        raise CocosError(f"model '{kind}' cannot be built with {', '.join(sorted(hparams))} "
                         f"({first_line(exc)})") from None


__all__ = ["CNN_TYPES", "MODELS", "VSEPP", "VSRN", "CaptionEncoder", "RsGCN", "VSEPPFull", "build_cnn",
           "build_model", "l2norm", "load_cnn_weights"]
