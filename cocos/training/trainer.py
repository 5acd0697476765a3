"""The bundled trainer: VSE++ / VSRN with any registered loss, the COCOS paper's schedule.

Adam, lr 2e-4 dropped x0.1 after ``lr_update`` of ``epochs`` epochs, batch 128,
gradient clipping at 2. Pair batches (Triplet, Triplet SH, NT-Xent) sample
captions (every caption once per epoch); ranking batches (SmoothAP) sample images
with all ``k`` captions (every image once). Only a final batch of a single item is
dropped (VSRN's BatchNorm needs two). Validation every epoch on the dev split;
``model_best.pt`` keeps the best validation rsum, ``last.pt`` allows resuming.
Batch order depends only on ``(seed, epoch)``, so a resumed run equals an
uninterrupted one.

Raw images (``data`` an image dataset, :func:`cocos.data.images.is_image_dataset`): the model is
VSE++'s full-image encoder (``vsepp_full``: ``cnn`` with ``cnn_weights``, frozen unless ``finetune``)
trained as VSE++'s ``train.py`` with the same schedule; each caption's image gets VSE++'s training
transform (RandomResizedCrop(``crop_size``) + flip) seeded by ``(seed, epoch, caption row)``
(ranking batches: the image's row), decoded in ``workers`` DataLoader workers over the epoch's batch
plan (:mod:`cocos.training.pixels`), so a run does not depend on ``workers``; the dev split is
evaluated with the evaluation transform. The dev split of a Karpathy-JSON dataset is its ``val``.

The step is VSE++'s loop (forward, loss, backward, clip, step); what a run adds to it
is a hook (:mod:`cocos.training.hooks`): ``warmup_epochs`` trains the family's warm-up
loss first; ``ltd`` adds latent target decoding (:mod:`cocos.losses.ltd`) to any loss;
``track_cocos`` counts the training batch every N steps (:mod:`cocos.training.track`,
``cocos_track.csv``); ``tensorboard`` writes the logs' values to TensorBoard (``tensorboard/``). ``save_every``
keeps ``epoch_NNN.pt`` every K epochs. Every step's losses (and LTD's ``λ`` and
``L_rec/η``) go to ``train_log.csv``. Both CSVs are rewritten atomically at the end
of each epoch and cut back to the checkpoint's epoch on resume.

The run folder (:mod:`cocos.training.runfolder`): one writer at a time, marked as cocos train's before anything
else is written; a failed run leaves either nothing or a resumable run folder. The run is resolved once
(:mod:`cocos.training.checks`, :mod:`cocos.training.setup`: the family with its sources, the objective, the hooks)
and the trainer is a loop over that setup; no code here names a family or looks one up.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cocos.data.text import pad_batch
from cocos.device import resolve_device
from cocos.distributed import all_gather_with_grad, average_gradients, barrier, broadcast_buffers, current
from cocos.io import check_interrupt, write_csv
from cocos.progress import progress_bar
from cocos.training.checkpoint import load_checkpoint, save_checkpoint
from cocos.training.checks import family_recipe, validate, with_recipe  # noqa: F401 - the trainer's API
from cocos.training.config import TrainConfig
from cocos.training.evaluate import evaluate_model
from cocos.training.hooks import Hook, LTDHook, StepBatch, WarmUp
from cocos.training.pixels import batch_loader, encode_pixels, model_transform
from cocos.training.plan import epoch_batches, epoch_seed, is_full, local_rows  # noqa: F401
from cocos.training.rebuild import build_from_checkpoint, open_split, resolve_data  # noqa: F401
from cocos.training.resume import RESUME_FLAGS, restore  # noqa: F401
from cocos.training.runfolder import (  # noqa: F401 - names of the run folder, imported from here by callers
    OUTPUT_NAMES,
    OUTPUT_PATTERNS,
    RUN_MARKER,
    TRACK_LOG,
    TRAIN_LOG,
    RunFolder,
    check_run_folder,
    is_output,
    run_writer,
)
from cocos.training.setup import resolve, trained_parameters


def _quiet(*args, **kwargs) -> None:
    """The log of a rank that is not the main process."""


class Trainer:
    """Train one model with one loss; call :meth:`fit`.

    ``locked``: the caller holds :func:`cocos.io.output_lock` on ``cfg.out`` already (``cocos train`` does, for the
    whole command); otherwise :meth:`fit` takes it for the run. ``by``: the command training (``demo``, ``sweep``),
    recorded in a new run folder's marker (a ``by:`` line, as in :data:`cocos.io.MARKER`).
    """

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, log=print, locked: bool = False, by: str = "train"):
        cfg.validate()
        self.group = current()  # under torchrun: this rank; rank 0 alone prints and writes
        self.cfg, self.progress = cfg, progress and self.group.is_main
        self.log = log if self.group.is_main else _quiet
        self.folder = RunFolder(cfg.out, by=by, resume=resume, overwrite=overwrite, locked=locked,
                                is_main=self.group.is_main)
        self.folder.check(cfg.data.path, cfg.optim.epochs)
        self.out, self.last_path, self.best_path = self.folder.out, self.folder.last, self.folder.best
        self.epoch_running = 0  # the epoch being trained (0: none yet)
        self.last_saved = False  # whether fit has written a last.pt (then a failure keeps the folder)
        self.device = resolve_device(cfg.device)
        resume_ckpt = load_checkpoint(self.last_path) if resume else None
        self.setup = resolve(cfg, resume_ckpt=resume_ckpt, last_path=self.last_path, device=self.device,
                             group=self.group, log=self.log, progress=self.progress)
        setup, data = self.setup, self.setup.data
        self.model, self.loss_fn, self.hooks = setup.model, setup.loss_fn, setup.hooks
        self.optimizer, self.scheduler = setup.optimizer, setup.scheduler
        self.images, self.vocab, self.fingerprint = data.images, data.coder, data.fingerprint
        self.train_split, self.dev_split, self.train_ids, self.dev_ids = data.train, data.dev, data.train_ids, \
            data.dev_ids
        self.epoch, self.step_count, self.best_rsum, self.history, self.step_log = 0, 0, -math.inf, [], []
        self.loss_weight = 1.0  # the step's loss factor: a family's ramp (VSEInftyFull.loss_scale), else 1
        self.best_metrics: dict = {}  # of this process's run (rank 0 returns the file's, which also covers a resume)
        if resume_ckpt is not None:
            restore(self, resume_ckpt)

    def _hook(self, kind: type[Hook]) -> Hook | None:
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    @property
    def ltd(self):
        """The latent target decoding module of an ``--ltd`` run (None otherwise)."""
        hook = self._hook(LTDHook)
        return hook.ltd if hook is not None else None

    @property
    def warmup_fn(self):
        hook = self._hook(WarmUp)
        return hook.loss_fn if hook is not None else None

    def saved(self) -> dict[str, int | None]:
        """What the out folder holds now: the epoch of ``last.pt`` and ``model_best.pt`` (None: none)."""
        return self.folder.saved()

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """What Adam trains and the gradient clip covers: the model, and the hooks' (LTD's decoder, not λ)."""
        return trained_parameters(self.model, self.hooks)

    # -- one epoch --------------------------------------------------------------------

    def batches(self, epoch: int):
        """The epoch's batches (:func:`cocos.training.plan.epoch_batches`)."""
        return epoch_batches(self.train_split, self.setup.data.image_captions, self.loss_fn.batch_layout,
                             self.cfg.optim.batch_size, self.cfg.optim.seed, epoch)

    def _local_rows(self, img: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """This rank's block of the global batch (a model with BatchNorm, VSRN, needs two rows on every rank)."""
        batchnorm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in self.model.modules())
        return local_rows(self.loss_fn.batch_layout, img, cap, self.group, 2 if batchnorm else 1)

    def step(self, img: np.ndarray, cap: np.ndarray, caption_image, loss_fn=None, epoch: int = 0,
             pixels: torch.Tensor | None = None) -> float:
        """One optimiser step, as VSE++'s loop: forward, loss, backward, clip, step; the hooks at their points.

        Raw images: ``pixels`` are this rank's rows of the batch (:meth:`pixel_batches`)."""
        check_interrupt()  # a Ctrl-C that something swallowed on its way up
        self.step_count += 1
        loss_fn = loss_fn or self.loss_fn
        full = is_full(self.train_split, self.loss_fn.batch_layout, img, cap, self.cfg.optim.batch_size)
        batch = StepBatch(self.step_count, epoch, img, cap, caption_image, torch.as_tensor(img, device=self.device),
                          full)
        img_emb, cap_emb, split = self.forward(batch, pixels)
        for hook in self.hooks:
            hook.observe(batch, img_emb, cap_emb)
        loss_con = loss_fn(img_emb, cap_emb, caption_image=caption_image, image_ids=batch.image_ids)
        loss, record = loss_con, {}
        for hook in self.hooks:
            term, more = hook.extra_loss(batch, img_emb, cap_emb)
            loss, record = (loss if term is None else loss + term), {**record, **more}
        if self.loss_weight != 1.0:  # a family's ramp (VSE∞'s first backbone epoch)
            loss = loss * self.loss_weight
        self.optimize(loss, split)
        for hook in self.hooks:
            hook.after_step()
        value = float(loss.detach())
        l_con = float(loss_con.detach()) if record else value
        self.step_log.append({"step": self.step_count, "epoch": epoch, "loss": value, "L_con": l_con,
                              "L_con/query": loss_fn.objective.per_query(l_con, len(img), len(cap)), **record,
                              **self._named_parts(loss_fn, batch, img_emb, cap_emb)})
        return value

    @staticmethod
    def _named_parts(loss_fn, batch: StepBatch, img_emb: torch.Tensor, cap_emb: torch.Tensor) -> dict[str, float]:
        """The loss's named parts beyond ``L_con`` (IMC's ``L_intra``: :meth:`ContrastiveLoss.named_terms`), for the
        step log; nothing for a family of one part. Computed without a gradient: the training loss is not touched."""
        if loss_fn.objective.parts is None:
            return {}
        with torch.no_grad():
            parts = loss_fn.named_terms(img_emb.detach(), cap_emb.detach(), caption_image=batch.caption_image,
                                        image_ids=batch.image_ids)
        return {name: float(term) for name, term in parts.items() if name != "L_con"}

    def forward(self, batch: StepBatch, pixels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The embeddings of the global batch; under torchrun this rank encodes its block and gathers the rest
        with their gradients (returns whether the batch was split)."""
        local_img, local_cap, split = self._local_rows(batch.images, batch.captions)
        tokens, lengths = pad_batch(self._captions(batch.captions, local_cap))
        if self.images:
            if pixels is None:  # a step called on its own (no loader): this rank's rows, decoded here
                pixels = next(iter(self.pixel_batches(batch.epoch, [(batch.images, batch.captions)])))
            img_emb = encode_pixels(self.model, pixels, self.device)
            cap_emb = self.model.encode_captions(tokens.to(self.device), lengths)
        else:
            feats = self.train_split.features_for(local_img).to(self.device)
            img_emb, cap_emb = self.model(feats, tokens.to(self.device), lengths)
        if split:  # the loss sees the global batch: every rank's rows, in order, with their gradients
            img_emb, cap_emb = all_gather_with_grad(img_emb, self.group), all_gather_with_grad(cap_emb, self.group)
        return img_emb, cap_emb, split

    def _captions(self, captions: np.ndarray, local: np.ndarray) -> list:
        """The coded captions of this rank's rows (``local``) of a batch. A coder that augments (VSE∞'s masking and
        dropping of word pieces, :meth:`cocos.data.wordpiece.WordPieceCoder.augment`) draws for the whole batch in
        its order on every rank, so that a torchrun run draws what one process draws."""
        augment = getattr(self.vocab, "augment", None)
        if augment is None:
            return [self.train_ids[c] for c in local]
        drawn = {int(c): augment(self.train_ids[c]) for c in captions}
        return [drawn[int(c)] for c in local]

    def optimize(self, loss: torch.Tensor, split: bool) -> None:
        """Backward, gradient clipping at ``grad_clip``, Adam; under torchrun the gradients are averaged first."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if split:  # each rank holds world x its rows' share of the gradient: the mean is the whole gradient
            average_gradients(self.trained_parameters(), self.group)
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.trained_parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        if self.setup.learned:
            self.loss_fn.project_()  # open_clip: the learned logit scale clamped after each step, not in the forward
        if split:  # BatchNorm running statistics saw this rank's rows: every rank takes rank 0's (as DDP)
            broadcast_buffers(self.model, self.group)

    def pixel_batches(self, epoch: int, batches: list):
        """The training pixels of this rank's rows of each ``(images, captions)`` batch, in order, decoded and
        transformed in ``workers`` DataLoader workers; each row seeded by ``(seed, epoch, key)``, the key being
        the caption's row (pair batches: VSE++ transforms the image anew for each caption) or the image's
        (ranking batches)."""
        plan = []
        for img, cap, *_ in batches:
            local_img, local_cap, _ = self._local_rows(np.asarray(img), np.asarray(cap))
            plan.append((local_img, local_img if self.loss_fn.batch_layout == "ranking" else local_cap))
        return batch_loader(self.train_split, model_transform(self.model, True, self.cfg.data.crop_size), plan,
                            seed=self.cfg.optim.seed, epoch=epoch, workers=self.cfg.data.workers, device=self.device)

    def train_epoch(self, epoch: int) -> tuple[float, float]:
        """One epoch's steps (a family's schedule and loss ramp, the hooks' loss); its mean loss and captions/s."""
        start_epoch = getattr(self.model, "start_epoch", None)  # a family's schedule (VSE∞'s backbone warm-up)
        if start_epoch is not None:
            start_epoch(epoch)
        self.model.train()
        batches = list(self.batches(epoch))
        scale = getattr(self.model, "loss_scale", None)
        loss_fn = self.loss_fn
        for hook in self.hooks:
            loss_fn = hook.loss_for(epoch, loss_fn)
        total_loss, n_caps, start = 0.0, 0, time.perf_counter()
        inputs = iter(self.pixel_batches(epoch, batches)) if self.images else None
        with progress_bar(len(batches), f"epoch {epoch}/{self.cfg.optim.epochs}", enabled=self.progress,
                          fields=True) as advance:
            for done, (img, cap, caption_image) in enumerate(batches, start=1):
                pixels = next(inputs) if inputs is not None else None
                self.loss_weight = scale(epoch, done - 1, len(batches)) if scale is not None else 1.0
                total_loss += self.step(img, cap, caption_image, loss_fn, epoch=epoch, pixels=pixels)
                n_caps += len(cap)
                rate = n_caps / max(time.perf_counter() - start, 1e-9)
                advance(1, f"loss {total_loss / done:.4f} · {rate:,.0f} captions/s")
        elapsed = time.perf_counter() - start
        return total_loss / max(len(batches), 1), n_caps / max(elapsed, 1e-9)

    # -- the loop ---------------------------------------------------------------------

    def checkpoint(self, metrics: dict, full: bool) -> dict:
        """The checkpoint of the run now (``full``: with the optimiser, scheduler and generator state: ``last.pt``)."""
        cfg = self.cfg
        ckpt = {"model": {"kind": cfg.model.name, "hparams": dict(self.model.hparams)}, "vocab": self.vocab.tokens,
                **({"text": self.vocab.options()} if hasattr(self.vocab, "options") else {}),
                "state_dict": {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
                "loss": {"name": cfg.loss.name, "params": self.loss_fn.params(), "compat": cfg.loss.compat,
                         "presentation": self.setup.presentation},
                "data": self._data_entry(), "train": cfg.record(), "epoch": self.epoch, "step": self.step_count,
                "metrics": metrics, "best_rsum": self.best_rsum, "history": self.history}
        for hook in self.hooks:
            ckpt.update(hook.checkpoint(full))
        if full:
            ckpt["optimizer"] = self.optimizer.state_dict()
            ckpt["scheduler"] = self.scheduler.state_dict()
            ckpt["rng"] = {"torch": torch.get_rng_state()}
        return ckpt

    def _data_entry(self) -> dict:
        """The checkpoint's ``data``; raw images: ``input: images``, the training split's content fingerprint
        (:meth:`cocos.data.images.ImageSplit.fingerprint`), the crop size, the CNN's pooled feature shape."""
        cfg, sizes = self.cfg, self.setup.data.eval_sizes
        data = {"path": str(Path(cfg.data.path).resolve()), "fingerprint": self.fingerprint, "k": cfg.data.k}
        if not self.images:
            return {**data, "feature_shape": list(self.train_split.feature_shape)}
        own = getattr(self.model, "preprocess", None)  # a model with its own preprocessing (CLIP): its crop
        data = {**data, "feature_shape": [int(self.model.img_dim)], "input": "images",
                "crop_size": own.crop_size if own is not None else cfg.data.crop_size,
                "use_restval": cfg.data.use_restval}
        if sizes is not None:  # the evaluation transform, and the weights file it is the transform of
            data["resize"] = sizes.resize
            if sizes.record() is not None:
                data["weights"] = sizes.record()
        return data

    def evaluate_dev(self) -> dict:
        """Validation metrics on the dev split (raw images: evaluation transform, ``workers``)."""
        sizes = self.setup.data.eval_sizes
        return evaluate_model(self.model, self.dev_split, self.dev_ids, device=self.device,
                              workers=self.cfg.data.workers, crop_size=self.cfg.data.crop_size,
                              resize=sizes.resize if sizes is not None else None, progress=self.progress)

    def fit(self) -> dict:
        """Train the remaining epochs; returns the best checkpoint's validation metrics.

        Under the run folder's lock the folder is made, cleaned and marked (:meth:`RunFolder.open`,
        :meth:`RunFolder.mark`) before the first step; if the run fails or is interrupted before its first
        ``last.pt`` is saved, what it added goes again (:meth:`RunFolder.undo`); once a ``last.pt`` is saved
        everything stays, and ``--resume`` continues from it.
        """
        with self.folder.lock():
            self.folder.open()
            self.last_saved = False
            try:
                self.folder.mark()
                while self.epoch < self.cfg.optim.epochs:
                    self._fit_epoch()
            except BaseException:
                if not self.last_saved:  # nothing of this run worth keeping (a full disk, Ctrl-C in epoch 1, ...)
                    self.folder.undo()
                raise
            finally:
                for hook in self.hooks:
                    hook.close()
            barrier(self.group)  # rank 0 has written the last checkpoint
            if not self.group.is_main:  # other nodes need not share rank 0's file system
                return dict(self.best_metrics)
            return load_checkpoint(self.best_path)["metrics"]

    def _fit_epoch(self) -> None:
        """Train, validate and save one epoch (``last_saved`` once its ``last.pt`` is on disk)."""
        epoch = self.epoch_running = self.epoch + 1
        lr = self.optimizer.param_groups[0]["lr"]
        first = len(self.step_log)
        loss, rate = self.train_epoch(epoch)
        self.scheduler.step()
        metrics = self.evaluate_dev()
        self.epoch = epoch
        improved = metrics["rsum"] > self.best_rsum
        if improved:
            self.best_rsum, self.best_metrics = metrics["rsum"], metrics
        # only values that the seed, data and flags determine: a checkpoint is reproducible byte for byte
        self.history.append({"epoch": epoch, "loss": loss, "lr": lr,
                             **{k: metrics[k] for k in ("rsum", "i2t_R@1", "t2i_R@1")}})
        if self.group.is_main:  # rank 0 alone writes (every rank holds the same weights)
            self._save(epoch, metrics, improved)
        for hook in self.hooks:  # once last.pt holds the epoch (TensorBoard)
            hook.end_epoch(epoch, {**self.history[-1], "metrics": metrics, "steps": self.step_log[first:]})
        self.epoch_running = 0
        self.log(self._epoch_line(epoch, loss, rate, metrics, improved))

    def _save(self, epoch: int, metrics: dict, improved: bool) -> None:
        """The logs (before ``last.pt``: a resume cuts them back to its epoch), the best, every K-th, the last."""
        self.write_logs()
        if improved:
            save_checkpoint(self.best_path, self.checkpoint(metrics, full=False))
        if self.cfg.hooks.save_every and epoch % self.cfg.hooks.save_every == 0:
            save_checkpoint(self.out / f"epoch_{epoch:03d}.pt", self.checkpoint(metrics, full=False))
        save_checkpoint(self.last_path, self.checkpoint(metrics, full=True))
        self.last_saved = True

    def _epoch_line(self, epoch: int, loss: float, rate: float, metrics: dict, improved: bool) -> str:
        m = metrics
        return (f"epoch {epoch:>3}  loss {loss:.4f}  {rate:,.0f} cap/s  "
                f"i2t R@1/5/10 {m['i2t_R@1']:.1f}/{m['i2t_R@5']:.1f}/{m['i2t_R@10']:.1f}  "
                f"t2i {m['t2i_R@1']:.1f}/{m['t2i_R@5']:.1f}/{m['t2i_R@10']:.1f}  "
                f"rsum {m['rsum']:.1f}{'  *best' if improved else ''}"
                + (f"  (warm-up: {self.loss_fn.objective.warmup_loss} loss)"
                   if epoch <= self.cfg.loss.warmup_epochs else ""))

    def write_logs(self) -> None:
        """``train_log.csv`` (every step) and the hooks' logs (``cocos_track.csv``), rewritten atomically."""
        write_csv(self.out / TRAIN_LOG, pd.DataFrame(self.step_log), float_format="%.10g")
        for hook in self.hooks:
            hook.write_logs(self.out)
