"""Training objectives, one per registered loss family (:mod:`cocos.objectives`).

``get_loss(name, **params)`` returns a module mapping
``(images, captions, caption_image=None, image_ids=None)`` to the scalar loss; its
positives, negatives and maths are those of the family's counter. New families
register an :class:`~cocos.objectives.Objective`; nothing here needs to change.
"""

from __future__ import annotations


def get_loss(name, compat: bool = False, **params):
    """Build the training loss of a registered family (or an ``Objective``); ``None`` parameters take defaults."""
    from cocos.objectives import get_objective

    return get_objective(name).loss(compat=compat, **params)


def __getattr__(name):  # ContrastiveLoss without importing torch for a bare ``import cocos.losses``
    if name == "ContrastiveLoss":
        from cocos.losses.base import ContrastiveLoss

        return ContrastiveLoss
    raise AttributeError(name)


__all__ = ["ContrastiveLoss", "get_loss"]
