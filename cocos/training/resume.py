"""A resumed run: its ``last.pt`` checked against the run, then its state restored, so that it equals an
uninterrupted one.

:func:`check_resume` (called while the run is resolved, before anything is built) refuses a checkpoint of
another model, loss or data, or one trained with other flags (:data:`RESUME_FLAGS`; ``epochs`` may grow), each
in one line; the checkpoint's ``train`` record is read through :func:`cocos.training.config.record_flat`, so a
record of an earlier version (its own spellings, settings added since at their defaults) compares as it was
meant. :func:`restore` loads the model, optimiser, scheduler, LTD and random-generator state into the trainer
and cuts its logs back to the checkpoint's epoch.
"""

from __future__ import annotations

import torch

from cocos.errors import CocosError
from cocos.training.checkpoint import RESUME_KEYS, Checkpoint, load_checkpoint
from cocos.training.config import TrainConfig, loss_params_of, record_flat
from cocos.training.hooks import LearnedHook, LTDHook
from cocos.training.logs import check_resumable, read_logs

# flags that change what a run computes: a resumed run must keep them
RESUME_FLAGS = ("lr", "lr_update", "batch_size", "embed_size", "word_dim", "seed", "k",
                "warmup_epochs", "compat", "grad_clip", "ltd", "ltd_mode", "ltd_eta", "ltd_beta", "ltd_targets",
                "cnn", "finetune", "crop_size", "use_restval", "optimizer", "weight_decay", "lr_groups",
                "model_params", "sources", "learn_tau", "resize")
RESUMED = (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError)


def check_resume(ckpt: dict, cfg: TrainConfig, fingerprint: str, where) -> None:
    """``ckpt`` (a ``last.pt``) continues the run of ``cfg`` on data of ``fingerprint`` (module docstring)."""
    lacking = [k for k in (*RESUME_KEYS, "best_rsum", "history") if ckpt.get(k) is None]
    if lacking:
        raise CocosError(f"{where}: holds no {', '.join(lacking)} to resume from (only a last.pt written by cocos "
                         "train can be resumed)")
    entry = Checkpoint.of(ckpt)
    if entry.model.kind != cfg.model.name:
        raise CocosError(f"{where}: checkpoint is a {entry.model.kind} model, not {cfg.model.name}")
    if entry.loss.name != cfg.loss.name:
        raise CocosError(f"{where}: checkpoint was trained with {entry.loss.name}, not {cfg.loss.name}")
    if entry.data.fingerprint != fingerprint:
        raise CocosError(f"{where}: checkpoint was trained on other data than {cfg.data.path}")
    recorded, now = record_flat(entry.train), record_flat(cfg.flat())
    if "params" in recorded and loss_params_of(recorded) != cfg.loss_params():
        raise CocosError(f"{where}: was trained with loss parameters {loss_params_of(recorded)}, not "
                         f"{cfg.loss_params()}; resume with the same flags")
    for name in RESUME_FLAGS:
        if name in recorded and recorded[name] != now[name]:
            raise CocosError(f"{where}: was trained with --{name.replace('_', '-')} {recorded[name]}, not "
                             f"{now[name]}; resume with the same flags")


def restore(trainer, ckpt: dict) -> None:
    """Load the model, optimiser, scheduler, LTD and random-generator state of ``ckpt`` into ``trainer`` (anything
    that does not fit is one line, the generator left as it was) and its progress; cut the logs back."""
    where, cfg = trainer.last_path, trainer.cfg
    if dict(trainer.model.hparams) != ckpt["model"]["hparams"]:
        raise CocosError(f"{where}: holds a model with {ckpt['model']['hparams']}, but this run builds "
                         f"{dict(trainer.model.hparams)}; resume with the same flags and data")
    if ckpt["epoch"] > cfg.optim.epochs:
        raise CocosError(f"{where}: already holds epoch {ckpt['epoch']}, beyond --epochs {cfg.optim.epochs}")
    for hook in trainer.hooks:
        if isinstance(hook, (LTDHook, LearnedHook)):
            hook.check(ckpt)
    _load_state(trainer, ckpt)
    if trainer.scheduler.step_size != cfg.optim.lr_update:
        raise CocosError(f"{where}: its learning-rate schedule drops after {trainer.scheduler.step_size} epochs, "
                         f"not --lr-update {cfg.optim.lr_update}; resume with the same flags")
    trainer.epoch, trainer.step_count = int(ckpt["epoch"]), int(ckpt.get("step", 0))
    trainer.best_rsum, trainer.history = float(ckpt["best_rsum"]), list(ckpt["history"])
    _restore_logs(trainer)
    if trainer.best_path.exists():  # written again when an epoch improves: readable now, not after an epoch
        load_checkpoint(trainer.best_path)
    if trainer.setup.learned:  # a run saved above the clamp (an earlier cocos clamped in the forward pass only)
        trainer.loss_fn.project_()  # resumes from the clamp


def _load_state(trainer, ckpt: dict) -> None:
    rng = torch.get_rng_state()
    ltd = trainer.ltd
    for what, load in (("model weights", lambda: trainer.model.load_state_dict(ckpt["state_dict"])),
                       ("optimizer state", lambda: trainer.optimizer.load_state_dict(ckpt["optimizer"])),
                       ("scheduler state", lambda: trainer.scheduler.load_state_dict(ckpt["scheduler"])),
                       ("LTD state", lambda: ltd.load(ckpt["ltd"]) if ltd is not None else None),
                       ("learned loss parameters", lambda: [h.load(ckpt) for h in trainer.hooks
                                                            if isinstance(h, LearnedHook)]),
                       ("random generator state", lambda: torch.set_rng_state(ckpt["rng"]["torch"]))):
        try:
            load()
        except RESUMED as exc:
            torch.set_rng_state(rng)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CocosError(f"{trainer.last_path}: its {what} does not fit this run ({reason})") from None


def _restore_logs(trainer) -> None:
    """Keep the rows of the epochs the resumed checkpoint holds (a crash may have left later ones)."""
    logs = read_logs(trainer.out, max_epoch=trainer.epoch)  # the checked reader: a damaged log is one line
    check_resumable(logs, trainer.out, trainer.step_count)
    if logs.steps is not None:
        trainer.step_log = logs.steps.to_dict("records")
    for hook in trainer.hooks:
        if not isinstance(hook, (LTDHook, LearnedHook)):  # their state was loaded with the model's
            hook.resume({}, logs)
