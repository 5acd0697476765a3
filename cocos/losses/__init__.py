"""Training objectives, registered by the same names as their counters.

``get_loss(name, **params)`` returns a module mapping
``(images, captions, caption_image=None, image_ids=None)`` to the scalar loss.
Later losses (GOAL, IMC, ...) register with :func:`register_loss`.
"""

from __future__ import annotations

import inspect

from cocos.errors import CocosError
from cocos.losses.base import ContrastiveLoss
from cocos.losses.ntxent import NTXentLoss
from cocos.losses.smoothap import SmoothAPLoss
from cocos.losses.triplet import TripletLoss, TripletSHLoss

LOSSES: dict[str, type[ContrastiveLoss]] = {}


def register_loss(cls: type[ContrastiveLoss]) -> type[ContrastiveLoss]:
    LOSSES[cls.name] = cls
    return cls


for _cls in (TripletLoss, TripletSHLoss, NTXentLoss, SmoothAPLoss):
    register_loss(_cls)


def get_loss(name: str, **params) -> ContrastiveLoss:
    """Build a registered loss; ``None`` parameters take the loss's default."""
    if name not in LOSSES:
        raise CocosError(f"unknown loss '{name}' (choose from {', '.join(LOSSES)})")
    cls = LOSSES[name]
    accepted = inspect.signature(cls.__init__).parameters
    unknown = [k for k, v in params.items() if v is not None and k not in accepted]
    if unknown:
        raise CocosError(f"loss '{name}' takes no parameter {', '.join(unknown)}")
    return cls(**{k: v for k, v in params.items() if v is not None and k in accepted})


__all__ = ["LOSSES", "ContrastiveLoss", "get_loss", "register_loss"]
