"""A contrastive loss over both retrieval directions of a batch.

A loss is the sum (or mean) of a *direction loss* over i2t and t2i, each computed
on the :class:`~cocos.data.layout.QueryView` that the counters use too.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from cocos.data.layout import DIRECTIONS, QueryView, batch_similarity


class ContrastiveLoss(nn.Module):
    """Maps ``(images, captions, caption_image=None, image_ids=None)`` to a scalar loss.

    ``images`` ``(B, d)``, ``captions`` ``(M, d)``; caption ``c`` belongs to image row
    ``caption_image[c]`` (default ``c // (M // B)``). ``image_ids`` (dataset ids of
    the image rows) lets the loss exclude same-image pairs from the negatives, the
    same way the counter does; ``compat=True`` keeps them as negatives.
    """

    name: ClassVar[str]
    batch_layout: ClassVar[str] = "pair"  # "pair" or "ranking" (definitions file, Notation)
    combine: ClassVar[str] = "sum"  # how the two directions are combined: "sum" or "mean"

    def __init__(self, compat: bool = False) -> None:
        super().__init__()
        self.compat = compat

    def params(self) -> dict:
        """Hyper-parameters as plain types (stored in checkpoints)."""
        return {}

    def direction_loss(self, view: QueryView) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, images, captions, caption_image=None, image_ids=None) -> torch.Tensor:
        scores, layout = batch_similarity(images, captions, caption_image, image_ids, check=False)
        terms = [self.direction_loss(layout.view(scores, d, self.compat)) for d in DIRECTIONS]
        total = terms[0] + terms[1]
        return total / 2 if self.combine == "mean" else total

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params().items())
