"""Extensions of the training loop: warm-up, latent target decoding, COCOS tracking.

The loop (:meth:`cocos.training.trainer.Trainer.step`) stays the VSE++ loop: forward, loss, backward, clip, step.
Everything a run adds to it is a :class:`Hook`, called at fixed points of each step:

1. ``loss_for(epoch, loss_fn)``: the loss that trains this epoch (warm-up swaps it);
2. ``observe(batch, images, captions)``: the step's embeddings, before the loss (tracking counts them);
3. ``extra_loss(batch, images, captions)``: a term added to the loss and its step-log record (LTD);
4. ``after_step()``: after the optimiser step (LTD's ascent on λ, from the same backward pass).

``parameters()`` are trained and clipped with the model; ``checkpoint(full)`` adds entries to the checkpoint,
``resume(ckpt, logs)`` restores them, and ``write_logs(out)`` writes the hook's own log beside ``train_log.csv``.
After each epoch, once its ``last.pt`` is saved, ``end_epoch(epoch, record)`` gets the epoch's record (its
history row, the dev ``metrics`` and its ``steps``' rows of the step log); ``close()`` ends the run (failed or
not). Every method is a no-op by default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cocos.errors import CocosError
from cocos.training.runfolder import TENSORBOARD_DIR
from cocos.training.track import TENSORBOARD_HINT

EVENT_FILES = "events.out.tfevents.*"  # what a SummaryWriter writes into its folder
_REFUSED = re.compile(r"[^-/.\w]")  # characters TensorBoard refuses in a tag


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

    def end_epoch(self, epoch: int, record: dict) -> None:
        pass

    def close(self) -> None:
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


def summary_writer():
    """TensorBoard's ``SummaryWriter`` class; one line saying how to install it where it is not installed (the
    Tracker's hint: :data:`cocos.training.track.TENSORBOARD_HINT`)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise CocosError(f"--tensorboard needs the tensorboard package: {TENSORBOARD_HINT}") from None
    return SummaryWriter


def scalar_tag(section: str, name: str) -> str:
    """``section/name`` as TensorBoard takes it: ``R@1`` is ``R1``, any other character TensorBoard refuses
    ``_`` (``L_con/query`` stays: ``/`` groups)."""
    return f"{section}/{_REFUSED.sub('_', name.replace('@', ''))}"


def _scalars(values: dict) -> dict[str, float]:
    """The real numbers of a record (not bools, not the counters ``step`` and ``epoch``)."""
    return {k: float(v) for k, v in values.items() if k not in ("step", "epoch") and not isinstance(v, bool)
            and isinstance(v, (int, float, np.integer, np.floating)) and not math.isnan(float(v))}


class TensorBoardHook(Hook):
    """``--tensorboard``: the run's values as TensorBoard scalars in ``OUT/tensorboard/``, on rank 0, all at the
    global step (TensorBoard's x axis), written after each epoch once its ``last.pt`` is saved:

    - ``train/<column>`` at each step: the step log's values (``train/loss``, ``train/L_con``, ...: those of
      ``train_log.csv``);
    - at the epoch's last step: ``dev/<metric>`` (``dev/rsum``, ``dev/i2t_R1``, ... the dev metrics),
      ``train/lr`` (the epoch's learning rate), ``train/epoch_loss`` (its mean loss) and, where the loss learns
      them (``live``: ``--learn-tau``'s temperature, SigLIP's ``t`` and ``b``), ``loss/<param>``.

    A new run starts the folder afresh (a previous run's event files go: ``--overwrite``); a resumed run appends
    to it, and TensorBoard hides what an interrupted run wrote after the resumed checkpoint's step (the writer's
    ``purge_step``)."""

    def __init__(self, out: Path, is_main: bool, live=None, writer_class=None) -> None:
        self.folder, self.is_main, self.live = Path(out) / TENSORBOARD_DIR, is_main, live
        self.writer_class = writer_class if writer_class is not None else summary_writer()  # checked first
        self.writer, self.resumed_step = None, None

    def resume(self, ckpt: dict, logs) -> None:
        steps = getattr(logs, "steps", None)
        self.resumed_step = int(steps["step"].max()) if steps is not None and len(steps) else 0

    def _open(self):
        if self.writer is None:
            if self.resumed_step is None:  # a new run: a previous run's events go
                for path in self.folder.glob(EVENT_FILES) if self.folder.is_dir() else ():
                    if path.is_file():
                        path.unlink()
            purge = self.resumed_step + 1 if self.resumed_step is not None else None
            self.writer = self.writer_class(log_dir=str(self.folder), purge_step=purge)
        return self.writer

    def end_epoch(self, epoch: int, record: dict) -> None:
        steps = record.get("steps") or []
        if not self.is_main or not steps:
            return
        writer = self._open()
        for row in steps:
            for name, value in _scalars(row).items():
                writer.add_scalar(scalar_tag("train", name), value, int(row["step"]))
        last = int(steps[-1]["step"])
        for name, value in _scalars(record.get("metrics") or {}).items():
            writer.add_scalar(scalar_tag("dev", name), value, last)
        writer.add_scalar("train/lr", float(record["lr"]), last)
        writer.add_scalar("train/epoch_loss", float(record["loss"]), last)
        for params in (self.live() if self.live is not None else {}).values():
            for name, value in _scalars(params).items():
                writer.add_scalar(scalar_tag("loss", name), value, last)
        writer.flush()

    def close(self) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()
