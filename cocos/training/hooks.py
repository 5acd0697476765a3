"""Extensions of the training loop: warm-up, latent target decoding, COCOS tracking.

The loop (:meth:`cocos.training.trainer.Trainer.step`) stays the VSE++ loop: forward, loss, backward, clip, step.
Everything a run adds to it is a :class:`Hook`, called at fixed points of each step:

1. ``loss_for(epoch, loss_fn)``: the loss that trains this epoch (warm-up swaps it);
2. ``observe(batch, images, captions)``: the step's embeddings, before the loss (tracking counts them);
3. ``extra_loss(batch, images, captions)``: a term added to the loss and its step-log record (LTD);
4. ``after_step()``: after the optimiser step (LTD's ascent on λ, from the same backward pass).

``parameters()`` are trained and clipped with the model; ``checkpoint(full)`` adds entries to the checkpoint,
``resume(ckpt, logs)`` restores them, and ``write_logs(out)`` writes the hook's own log beside ``train_log.csv``.
Every method is a no-op by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cocos.errors import CocosError


@dataclass
class StepBatch:
    """One global training batch: dataset rows of its images and captions, and where it stands in the run."""

    step: int
    epoch: int
    images: np.ndarray  # dataset rows of the batch's images (pair batches: the image of each caption)
    captions: np.ndarray  # dataset rows of its captions
    caption_image: torch.Tensor | np.ndarray | None  # caption -> image column (None: ranking batches, k each)
    image_ids: torch.Tensor  # the images' dataset rows on the device (equal rows are one image)
    full: bool  # the batch has the configured size (the short final batch does not)


class Hook:
    """An extension of the training loop (see the module docstring)."""

    def loss_for(self, epoch: int, loss_fn):
        return loss_fn

    def observe(self, batch: StepBatch, images: torch.Tensor, captions: torch.Tensor) -> None:
        pass

    def extra_loss(self, batch: StepBatch, images: torch.Tensor,
                   captions: torch.Tensor) -> tuple[torch.Tensor | None, dict]:
        return None, {}

    def after_step(self) -> None:
        pass

    def parameters(self) -> list[torch.nn.Parameter]:
        return []

    def checkpoint(self, full: bool) -> dict:
        return {}

    def resume(self, ckpt: dict, logs) -> None:
        pass

    def write_logs(self, out: Path) -> None:
        pass


class WarmUp(Hook):
    """The first ``epochs`` epochs train with the family's warm-up loss (VSE-infinity: all-triplet before max
    violation); the step log marks them through the epoch column and the epoch line says so."""

    def __init__(self, epochs: int, loss_fn) -> None:
        self.epochs, self.loss_fn = int(epochs), loss_fn

    def loss_for(self, epoch: int, loss_fn):
        return self.loss_fn if epoch <= self.epochs else loss_fn


class LTDHook(Hook):
    """Latent target decoding (:mod:`cocos.losses.ltd`): the decoder's term on the captions' embeddings, λ's
    ascent after each step, the decoder beside the model in the checkpoint (``ltd``)."""

    def __init__(self, ltd, targets: torch.Tensor, where: Path) -> None:
        self.ltd, self.targets, self.where = ltd, targets, where

    def extra_loss(self, batch, images, captions):
        return self.ltd(captions, self.targets[torch.as_tensor(batch.captions)].to(captions.device))

    def after_step(self) -> None:
        self.ltd.step()

    def parameters(self):
        return list(self.ltd.decoder.parameters())

    def checkpoint(self, full: bool) -> dict:
        return {"ltd": self.ltd.state(full)}  # beside the retrieval model: analyze and evaluate never read it

    def check(self, ckpt: dict) -> None:
        """Before anything is loaded: the checkpoint holds a decoder of this run's target size."""
        if not isinstance(ckpt.get("ltd"), dict):
            raise CocosError(f"{self.where}: holds no LTD state; it was trained without --ltd")
        if ckpt["ltd"]["hparams"]["target_dim"] != self.targets.shape[1]:
            raise CocosError(f"{self.where}: its LTD decoder reconstructs {ckpt['ltd']['hparams']['target_dim']}-d "
                             f"targets, but the targets of this run are {self.targets.shape[1]}-d")

    def resume(self, ckpt: dict, logs) -> None:
        self.ltd.load(ckpt["ltd"])


class LearnedHook(Hook):
    """A loss's own learned parameters (:class:`~cocos.losses.base.LearnedParameters`: SigLIP's ``logit_scale``
    and ``logit_bias`` on a model without them) trained with the model, after its parameters (and LTD's decoder)
    in the optimiser, and saved beside it in the checkpoint (``learned``: raw values by name) for resuming; the
    values they give are the checkpoint's loss parameters, which analyses read."""

    def __init__(self, loss_fn, where: Path) -> None:
        self.loss_fn, self.where = loss_fn, where

    def parameters(self):
        return self.loss_fn.own_parameters()

    def checkpoint(self, full: bool) -> dict:
        return {"learned": self.loss_fn.state()}

    def check(self, ckpt: dict) -> None:
        """Before anything is loaded: the checkpoint holds this loss's learned parameters."""
        held = ckpt.get("learned")
        missing = [k for k in self.loss_fn.own if not isinstance(held, dict) or k not in held]
        if missing:
            raise CocosError(f"{self.where}: holds no learned {missing[0]} of the {self.loss_fn.objective.label} "
                             "loss")

    def load(self, ckpt: dict) -> None:
        """The checkpoint's values (checked first: :meth:`check`), loaded with the model's state on resuming."""
        self.loss_fn.load(ckpt["learned"])


class TrackHook(Hook):
    """COCOS of the training batch every N steps (:class:`cocos.training.track.Tracker`, the public tracker of
    :mod:`cocos.track`, as :meth:`~cocos.training.track.Tracker.for_training` builds it), from the step's own
    forward pass, on rank 0, full batches only; ``cocos_track.csv`` beside ``train_log.csv``."""

    def __init__(self, tracker, is_main: bool, log_name: str, live=None) -> None:
        self.tracker, self.is_main, self.log_name = tracker, is_main, log_name
        self.live = live  # () -> {counter: {param: value}}: parameters the training learns (CLIP's temperature)

    def observe(self, batch, images, captions) -> None:
        if self.is_main and batch.full and self.tracker.due(batch.step):
            for name, params in (self.live() if self.live is not None else {}).items():
                self.tracker.losses[name].update(params)  # counted at the value this step's loss uses
            self.tracker.observe(batch.step, images, captions, batch.caption_image, epoch=batch.epoch,
                                 image_ids=batch.image_ids)

    def resume(self, ckpt: dict, logs) -> None:
        if logs is not None and logs.track is not None:
            self.tracker.restore(logs.track)

    def write_logs(self, out: Path) -> None:
        self.tracker.write(out / self.log_name)
