"""Retrieval models: VSE++ and VSRN encoders for precomputed image features, VSE++ on raw images.

Each is a registered model family (:mod:`cocos.models.family`, :mod:`cocos.models.registry`); families of other
packages register through the ``cocos.models`` entry-point group.

Every model exposes ``encode_images(features)`` (``vsepp_full``: normalised pixels
``(n, 3, H, W)``), ``encode_captions(tokens, lengths)`` and
``forward(features, tokens, lengths) -> (img_emb, cap_emb)``;
embeddings are L2-normalised. ``model.kind`` and ``model.hparams`` are enough
to rebuild it: ``build_model(model.kind, **model.hparams)``.
"""

from __future__ import annotations

import torch

from cocos.models.cnn import CNN_TYPES, build_cnn, load_cnn_weights
from cocos.models.image import VSEPPFull
from cocos.models.text import CaptionEncoder, l2norm
from cocos.models.vsepp import VSEPP
from cocos.models.vsrn import VSRN, RsGCN


def build_model(kind: str, **hparams) -> torch.nn.Module:
    """Build the model of the registered family ``kind`` with constructor arguments ``hparams``."""
    from cocos.models.registry import get_family

    return get_family(kind).build(**hparams)


def __getattr__(name: str):
    if name == "MODELS":  # family name -> module class, of the registered families
        from cocos.models.registry import families

        return {f.name: f.module for f in families()}
    raise AttributeError(name)


__all__ = ["CNN_TYPES", "MODELS", "VSEPP", "VSRN", "CaptionEncoder", "RsGCN", "VSEPPFull", "build_cnn",
           "build_model", "l2norm", "load_cnn_weights"]
