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
``cocos_track.csv``). ``save_every``
keeps ``epoch_NNN.pt`` every K epochs. Every step's losses (and LTD's ``λ`` and
``L_rec/η``) go to ``train_log.csv``. Both CSVs are rewritten atomically at the end
of each epoch and cut back to the checkpoint's epoch on resume.

The run folder (:meth:`Trainer.fit`): one writer at a time, the main process holding
:func:`cocos.io.output_lock` on it for the whole run (``cocos train``: from its checks to its last figure), so a
second run into the same folder is refused in one line. It is marked as cocos train's
(:data:`RUN_MARKER`, ``.cocos-train``: a folder of kind ``run`` for :func:`cocos.io.check_output_dir`, which no
other command replaces; a dataset, feature cache, report or user's folder is refused as ``--out``, even
with ``--overwrite``: :func:`check_run_folder`) before anything else is written into it, and **a failed run
(a full disk at any write, a CocosError, Ctrl-C) leaves either nothing or a resumable run folder, marked**: until
the first epoch's ``last.pt`` is on disk a failure removes the folder (if the run made it) or what the run added
to it; after that the folder holds a ``last.pt`` that ``--resume`` continues (a run that failed at its figures:
``--resume`` trains nothing and writes them), and the same command without ``--resume`` is refused with a line
that says what the folder holds. ``--overwrite`` starts over: the previous run's files (its checkpoints, logs and
figures; nothing else) are removed when training starts.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from cocos.data.images import load_image_split
from cocos.data.precomp import PrecompSplit, data_fingerprint
from cocos.data.samplers import pair_batches, ranking_batches
from cocos.data.targets import read_targets, sentence_targets
from cocos.data.text import Vocabulary, pad_batch
from cocos.data.transforms import check_image_sizes
from cocos.data.wordpiece import coder_of
from cocos.defaults import DEFAULT_CROP_SIZE
from cocos.device import check_device_name, resolve_device
from cocos.distributed import all_gather_with_grad, average_gradients, barrier, block, broadcast_buffers, current
from cocos.errors import CocosError, check_params
from cocos.io import (
    check_ancestors,
    check_inputs,
    check_interrupt,
    check_output_dir,
    is_own_temporary,
    make_dirs,
    output_kind,
    output_lock,
    remove_created,
    remove_stale_temporaries,
    write_csv,
    write_text,
)
from cocos.losses.base import LearnedTemperature
from cocos.losses.ltd import LatentTargetDecoding
from cocos.models.registry import families, get_family, training_family
from cocos.models.weights import EvalTransform, evaluation_transform, known_by_digest
from cocos.objectives import OBJECTIVES, get_loss, get_objective
from cocos.objectives import names as loss_names
from cocos.progress import progress_bar
from cocos.training.checkpoint import (
    RESUME_KEYS,
    SEED_LIMIT,
    Checkpoint,
    load_checkpoint,
    peek_epoch,
    save_checkpoint,
    validate_model,
)
from cocos.training.config import (
    ADDED_DEFAULTS,
    LossConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    check_optim,
    loss_params_of,
    lr_group_names,
)
from cocos.training.evaluate import evaluate_model, tokenize_split
from cocos.training.hooks import Hook, LTDHook, StepBatch, TrackHook, WarmUp
from cocos.training.logs import check_resumable, read_logs
from cocos.training.pixels import batch_loader, encode_pixels, eval_resize, model_transform, prepare_model
from cocos.training.track import Tracker

TRAIN_LOG = "train_log.csv"
TRACK_LOG = "cocos_track.csv"
# a run folder's marker, its first file: cocos.io.output_kind reads it as kind "run" (only cocos train --overwrite
# starts over in it, no other command replaces it); a "by: WRITER" line names the demo or a sweep that trained it
RUN_MARKER = ".cocos-train"
RUN_MARKER_TEXT = ("written by cocos train: a training run folder (cocos train --resume continues it, --overwrite "
                   "starts over)\n")
# the files cocos train writes into its folder (and their temporaries, which a killed run leaves)
OUTPUT_NAMES = (RUN_MARKER, "last.pt", "model_best.pt", TRAIN_LOG, TRACK_LOG, "training.png", "training.pdf",
                "cocos_track.png", "cocos_track.pdf")
OUTPUT_PATTERNS = (r"epoch_\d+\.pt",)
# flags that change what a run computes: a resumed run must keep them
# a module's records of the pre-trained folder it was built from (CLIP's config.json and preprocessing)
RESUME_FLAGS = ("lr", "lr_update", "batch_size", "embed_size", "word_dim", "seed", "k",
                "warmup_epochs", "compat", "grad_clip", "ltd", "ltd_mode", "ltd_eta", "ltd_beta", "ltd_targets",
                "cnn", "finetune", "crop_size", "use_restval", "optimizer", "weight_decay", "lr_groups",
                "model_params", "bert", "clip", "learn_tau", "resize")
# torchvision's ImageNet weights files, what a frozen CNN needs (--cnn-weights)
TORCHVISION_WEIGHTS = {"resnet18": ("resnet18-f37072fd.pth", "resnet18-5c106cde.pth"),
                       "resnet34": ("resnet34-b627a593.pth", "resnet34-333f7ec4.pth"),
                       "resnet50": ("resnet50-0676ba61.pth", "resnet50-19c8e357.pth"),
                       "resnet101": ("resnet101-63fe2227.pth", "resnet101-5d3b4d8f.pth"),
                       "resnet152": ("resnet152-394f9c45.pth", "resnet152-b121ed2d.pth"),
                       "resnext50_32x4d": ("resnext50_32x4d-7cdf4587.pth",),
                       "resnext101_32x8d": ("resnext101_32x8d-8ba56ff5.pth", "WSL's ig_resnext101_32x8-c38310e5.pth"),
                       "vgg19": ("vgg19-dcbb9e9d.pth",)}


def family_recipe(flat: dict) -> dict:
    """The recipe (:attr:`~cocos.models.family.ModelFamily.recipe`) of the family a run of ``flat`` trains: on raw
    images its images family's."""
    family = get_family(flat.get("model") or ModelConfig().name)
    if family.images_family and flat.get("data") and TrainConfig.of(data=flat["data"]).images():
        family = get_family(family.images_family)
    return dict(family.recipe)


def with_recipe(flat: dict, given) -> dict:
    """A run's flat settings with its family's recipe (:func:`family_recipe`: VSE∞'s AdamW, rates, schedule and
    warm-up) for every setting ``given(name)`` says the user did not set: ``cocos train --model vse_infty`` trains
    as VSE∞ did unless told otherwise. A loss without a warm-up loss, or a run no longer than the recipe's warm-up,
    trains without one; another optimiser than the recipe's takes no weight decay from it; a loss without a softmax
    temperature, or one whose temperature is given, does not learn it (CLIP's ``learn_tau``)."""
    recipe = family_recipe(flat)
    objective = get_objective(flat.get("loss") or LossConfig().name)
    if objective.warmup_loss is None:
        recipe.pop("warmup_epochs", None)
    if objective.temperature is None or loss_params_of(flat).get(objective.temperature) is not None:
        recipe.pop("learn_tau", None)  # no temperature to learn, or the user's own
    if given("optimizer") and flat.get("optimizer") != recipe.get("optimizer"):
        recipe.pop("weight_decay", None)
    out = {**flat, **{k: v for k, v in recipe.items() if not given(k)}}
    if out.get("warmup_epochs", 0) >= out.get("epochs", OptimConfig().epochs) and not given("warmup_epochs"):
        out["warmup_epochs"] = flat.get("warmup_epochs", 0)
    return out


def validate(cfg: TrainConfig) -> None:
    """Refuse nonsense settings before anything is read or written (one CocosError line).

    On raw-image data a family that reads precomputed features gives way to its ``images_family`` (``vsepp`` ->
    ``vsepp_full``); the model's parameters are then resolved (the family's defaults filled in) and checked.
    """

    for what, value in (("model", cfg.model.name), ("loss", cfg.loss.name), ("device", cfg.device)):
        if not isinstance(value, str):
            raise CocosError(f"--{what} must be a name, got {value!r}")
    get_objective(cfg.loss.name)  # unknown names: one line listing the registered losses
    check_device_name(cfg.device)
    images = cfg.images()
    _check_input(cfg, images)
    family = training_family(cfg.model.name, images)
    cfg.model.name = family.name
    cfg.model.params = family.params(**(cfg.model.params or {}))
    _check_numbers(cfg, family)
    _check_sources(cfg, family)
    if images:
        _check_images(cfg)
    _check_loss(cfg)
    check_optim(cfg.optim)
    for name in ("track_cocos", "save_every"):
        value = getattr(cfg.hooks, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise CocosError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if cfg.hooks.ltd is not None:
        cfg.hooks.ltd.validate()


def _check_input(cfg: TrainConfig, images: bool) -> None:
    """Raw-image settings only with raw-image data; the decoding workers a count."""
    data = cfg.data
    if isinstance(data.workers, bool) or not isinstance(data.workers, int) or data.workers < 0:
        raise CocosError(f"--workers must be an integer >= 0, got {data.workers}")
    if images:
        return
    family = get_family(cfg.model.name)
    changed = _image_flags(cfg, family)
    if changed or family.input == "images":
        raise CocosError(f"{', '.join(changed) or '--model ' + family.name} only apply to raw-image data; "
                         f"{data.path} is not an image dataset (images/ + dataset_*.json, {{split}}_set.p "
                         "or a CSV file list)")


def _image_flags(cfg: TrainConfig, family) -> list[str]:
    """The raw-image flags a run on precomputed features was given (its family's images family's own parameters,
    the CNN weights, the crop, restval)."""
    given = {k for k, v in (cfg.model.params or {}).items() if v is not None} - set(family.defaults)
    pixels = set(get_family(family.images_family).defaults) if family.images_family else set()
    flags = {"cnn": "cnn_type" in given, "cnn_weights": cfg.model.cnn_weights is not None,
             "finetune": "finetune" in given and cfg.model.params["finetune"] is not False,
             "crop_size": cfg.data.crop_size != DEFAULT_CROP_SIZE, "use_restval": cfg.data.use_restval}
    changed = [f"--{n.replace('_', '-')}" for n, on in flags.items() if on]
    return changed + [f"--{n.replace('_', '-')}" for n in sorted((given & pixels) - {"cnn_type", "finetune"})]


def _check_sources(cfg: TrainConfig, family) -> None:
    """The family's pre-trained sources (:attr:`~cocos.models.family.ModelFamily.sources`) each given (``--NAME
    DIR``), a source that brings the caption coder taking no ``--vocab``; a source no longer of this family's (one
    of another's) refused. A resumed run takes them from its checkpoint (:meth:`Trainer._read_captions`)."""
    own = {s.name for s in family.sources}
    for source in family.sources:
        if not getattr(cfg.model, source.name, None):
            raise CocosError(f"--model {family.name} needs --{source.name} DIR: {source.what}")
        if cfg.data.vocab and source.coder_words:
            raise CocosError(f"--model {family.name} codes captions with {source.coder_words}; --vocab does not "
                             "apply")
    for name in sorted({s.name for f in families() for s in f.sources} - own):
        if getattr(cfg.model, name, None):
            takers = [f.name for f in families() if any(s.name == name for s in f.sources)]
            raise CocosError(f"--{name} applies to {', '.join(takers)}, not to --model {family.name}")


def _positive_int(value, flag: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CocosError(f"--{flag} must be an integer of at least 1, got {value!r}")


def _check_numbers(cfg: TrainConfig, family) -> None:
    """The integer settings: integers in their ranges (from Python too, where a string or a bool could be given);
    a batch that the family can train on."""

    optim = cfg.optim
    for name in ("epochs", "batch_size", "lr_update"):
        _positive_int(getattr(optim, name), name.replace("_", "-"))
    for name in ("k", "vocab_threshold"):
        _positive_int(getattr(cfg.data, name), name.replace("_", "-"))
    if isinstance(optim.seed, bool) or not isinstance(optim.seed, int) or not 0 <= optim.seed < SEED_LIMIT:
        raise CocosError(f"--seed must be an integer in [0, 2**63 - 1], got {optim.seed}")
    if optim.batch_size < family.min_batch:
        raise CocosError(f"--model {family.name} needs --batch-size of at least {family.min_batch} (its BatchNorm "
                         f"needs two images), got {optim.batch_size}")
    if optim.batch_size < 2:  # one caption, or one image, has nothing to contrast with
        raise CocosError(f"--batch-size must be at least 2 (a batch of one has no negatives), got "
                         f"{optim.batch_size}")
    warmup = cfg.loss.warmup_epochs
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < optim.epochs:
        raise CocosError(f"--warmup-epochs must lie in [0, epochs), got {warmup}")


def _check_loss(cfg: TrainConfig) -> None:
    """The loss, its parameters (its spec's checks) and its warm-up; the learning rate."""
    if cfg.loss.warmup_epochs and get_objective(cfg.loss.name).warmup_loss is None:
        with_warmup = [n for n, o in OBJECTIVES.items() if o.warmup_loss]
        raise CocosError(f"--warmup-epochs applies to {', '.join(with_warmup)} only (e.g. all-triplet warm-up "
                         "before max violation)")
    check_params(lr=cfg.optim.lr)
    get_loss(cfg.loss.name, **cfg.loss_params())  # the loss's own checks
    if cfg.loss.learn_tau:
        _check_learn_tau(cfg)


def _check_learn_tau(cfg: TrainConfig) -> None:
    """``--learn-tau``: a loss with a softmax temperature (not also given), a model with a ``logit_scale``."""
    objective, family = get_objective(cfg.loss.name), get_family(cfg.model.name)
    if objective.temperature is None:
        learnable = [n for n, o in OBJECTIVES.items() if o.temperature]
        raise CocosError(f"--learn-tau: the {objective.label} loss has no softmax temperature (losses with one: "
                         f"{', '.join(learnable)})")
    if cfg.loss_params().get(objective.temperature) is not None:
        raise CocosError(f"--learn-tau learns --{objective.temperature} from the model's logit_scale; give one or "
                         "the other")
    if not hasattr(family.module, "logit_scale"):
        with_scale = [f.name for f in families() if hasattr(f.module, "logit_scale")]
        raise CocosError(f"--learn-tau: the {family.name} model has no logit_scale to learn (models with one: "
                         f"{', '.join(with_scale)})")


def _check_images(cfg: TrainConfig) -> None:
    """Raw images: the crop, the memory of a batch of pixels, and a frozen CNN's weights file."""
    crop, params = cfg.data.crop_size, cfg.model.params
    if isinstance(crop, bool) or not isinstance(crop, int) or crop < 8:
        raise CocosError(f"--crop-size must be an integer of at least 8 pixels, got {crop}")
    # the pixels of a training batch and of an evaluation batch (evaluate_model's 256) must fit in memory
    check_image_sizes(cfg.data.resize or eval_resize(crop), crop, max(cfg.optim.batch_size, 256), cfg.data.workers)
    cnn = params.get("cnn_type")
    if cnn is None:  # a model with its own preprocessing (CLIP): no CNN, no sizes of ours
        given = [flag for flag, on in (("--cnn-weights", cfg.model.cnn_weights), ("--resize", cfg.data.resize),
                                       ("--crop-size", crop != DEFAULT_CROP_SIZE)) if on]
        if given:
            raise CocosError(f"--model {cfg.model.name} preprocesses images as its folder says (its own resize and "
                             f"crop) and has no CNN: {', '.join(given)} do not apply")
        return
    if not params.get("finetune") and not cfg.model.cnn_weights:
        files = " or ".join(TORCHVISION_WEIGHTS.get(cnn, ("a torchvision weights file",)))
        raise CocosError(f"a frozen {cnn} needs ImageNet weights: pass --cnn-weights FILE (torchvision's "
                         f"{files}), or --finetune to train it from random initialisation")


def recorded_loss_params(train: dict) -> dict:
    """The loss parameters a run's flat record gives (:func:`cocos.training.config.loss_params_of`)."""
    return loss_params_of(train)


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch


def build_from_checkpoint(ckpt: dict, where="checkpoint") -> tuple[torch.nn.Module, Vocabulary]:
    """Rebuild the model (eval mode) and vocabulary recorded in a checkpoint.

    ``ckpt`` is what :func:`~cocos.training.checkpoint.load_checkpoint` returns, or a dict in the
    same format built in memory (a converted checkpoint of the original code): its ``model``,
    ``vocab`` and ``state_dict`` are checked against each other first
    (:func:`~cocos.training.checkpoint.validate_model`), so a bad one is one CocosError line.
    """

    validate_model(ckpt, where)
    kind = ckpt["model"]["kind"]
    try:
        model = get_family(kind).build(**ckpt["model"]["hparams"])
        model.load_state_dict(ckpt["state_dict"])
    except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
        raise CocosError(f"{where}: weights do not fit a {kind} model ({str(exc).splitlines()[0]})") from None
    model.eval()
    return model, coder_of(ckpt["vocab"], ckpt.get("text"))


class Trainer:
    """Train one model with one loss; call :meth:`fit`.

    ``locked``: the caller holds :func:`cocos.io.output_lock` on ``cfg.out`` already (``cocos train`` does, for the
    whole command); otherwise :meth:`fit` takes it for the run. ``by``: the command training (``demo``, ``sweep``),
    recorded in a new run folder's marker (a ``by:`` line, as in :data:`cocos.io.MARKER`).
    """

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False,
                 progress: bool = True, log=print, locked: bool = False, by: str = "train"):

        cfg.validate()
        self.by = by  # the writer recorded in a new run folder's marker (``train``, ``demo``, ``sweep``)
        self.group = current()  # under torchrun: this rank; rank 0 alone prints and writes
        self.resume, self.overwrite, self.locked = resume, overwrite, locked
        self.cfg, self.progress = cfg, progress and self.group.is_main
        self.log = log if self.group.is_main else (lambda *a, **k: None)
        self.out = Path(cfg.out)
        self.last_path, self.best_path = self.out / "last.pt", self.out / "model_best.pt"
        self.epoch_running = 0  # the epoch being trained (0: none yet)
        self.last_saved = False  # whether fit has written a last.pt (then a failure keeps the folder)
        self._check_out_folder()
        self.device = resolve_device(cfg.device)
        self.images = cfg.images()
        if self.images:
            self._open_images()
        else:
            self._open_features()

        resume_ckpt = load_checkpoint(self.last_path) if resume else None
        if resume_ckpt is not None:
            self._check_resume(resume_ckpt)
        self._read_captions(resume_ckpt)
        self.eval_sizes = self._eval_sizes(resume_ckpt) if self.images else None
        self.train_ids = tokenize_split(self.train_split, self.vocab)
        self._warn_unknown()
        self.dev_ids = tokenize_split(self.dev_split, self.vocab)
        self.targets = self._ltd_targets() if cfg.hooks.ltd is not None else None  # before anything is written

        torch.manual_seed(cfg.optim.seed)
        self.model = self._build_model()
        self.loss_fn = get_loss(cfg.loss.name, **cfg.loss_params(), compat=cfg.loss.compat)
        self._learn_temperature()
        self.hooks = self._hooks()
        self.optimizer = self._optimizer()
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=cfg.optim.lr_update, gamma=0.1)
        self.epoch, self.step_count, self.best_rsum, self.history, self.step_log = 0, 0, -math.inf, [], []
        self.loss_weight = 1.0  # the step's loss factor: a family's ramp (VSEInftyFull.loss_scale), else 1
        self.best_metrics: dict = {}  # of this process's run (rank 0 returns the file's, which also covers a resume)
        if resume_ckpt is not None:
            self._resume_from(resume_ckpt)
            if isinstance(self.loss_fn, LearnedTemperature):  # a run saved above the clamp (an earlier cocos
                self.loss_fn.project_()  # clamped in the forward pass only) resumes from the clamp

    def _learn_temperature(self) -> None:
        """``--learn-tau``: the loss's temperature is the model's ``logit_scale``, trained with it (CLIP); without
        it a model's ``logit_scale`` does not train. A model with nothing left to train is one line."""
        scale = getattr(self.model, "logit_scale", None)
        if isinstance(scale, torch.nn.Parameter):
            scale.requires_grad_(bool(self.cfg.loss.learn_tau))
        if self.cfg.loss.learn_tau:
            self.loss_fn = LearnedTemperature(self.loss_fn, scale)
            self.loss_fn.project_()  # a folder saved above CLIP's clamp trains from the clamp
        if not any(p.requires_grad for p in self.model.parameters()):
            raise CocosError(f"--model {self.cfg.model.name}: nothing to train (every weight is frozen"
                             f"{'' if scale is None else ', and the temperature is not learned'})")

    def _read_captions(self, resume_ckpt: dict | None) -> None:
        """The run's caption coder (``self.vocab``) and what the model records of its pre-trained sources
        (``self.records``): a resumed run's as its checkpoint recorded them; a new run's from its family's sources
        (a BERT folder: its config, word pieces and, later, weights; a CLIP folder: config, preprocessing,
        tokenizer, weights), each read whole before anything is written; else the ``--vocab`` file or a vocabulary
        of the training captions."""
        cfg, family = self.cfg, get_family(self.cfg.model.name)
        self.sources = {} if resume_ckpt is not None else {
            s.name: s.read(getattr(cfg.model, s.name)) for s in family.sources}
        coders = [(s.name, self.sources[s.name].coder) for s in family.sources
                  if getattr(self.sources.get(s.name), "coder", None) is not None]
        self.coder_source = coders[0][0] if coders else None  # the source whose coder codes the captions
        if resume_ckpt is not None:
            self.vocab = coder_of(resume_ckpt["vocab"], resume_ckpt.get("text"))
            self.records = family.source_records(resume_ckpt["model"]["hparams"])
            return
        self.records = {k: v for s in family.sources for k, v in s.records(self.sources[s.name]).items()}
        if coders:
            self.vocab = coders[0][1]
        elif cfg.data.vocab:
            self.vocab = Vocabulary.from_scan_json(cfg.data.vocab)
        else:
            self.vocab = Vocabulary.build(self.train_split.captions, threshold=cfg.data.vocab_threshold)

    def _eval_sizes(self, resume_ckpt: dict | None) -> EvalTransform | None:
        """A raw-image run's evaluation Resize and CenterCrop: the CNN weights file's own
        (:func:`cocos.models.weights.evaluation_transform`: 232 for torchvision's V2 ResNets) unless ``--resize``
        says otherwise (a ``warning:`` line then); a resumed run's as its checkpoint recorded them (its file may be
        gone); None for a model with its own preprocessing (CLIP)."""
        cfg = self.cfg
        if "cnn_type" not in cfg.model.params:
            return None
        recorded = (resume_ckpt or {}).get("data") or {}
        if recorded.get("resize"):
            weights = recorded.get("weights") or {}
            return EvalTransform(int(recorded["resize"]), int(recorded.get("crop_size") or cfg.data.crop_size),
                                 sha256=weights.get("sha256"), file=weights.get("file"),
                                 weights=known_by_digest(weights["sha256"]) if weights.get("sha256") else None)
        if resume_ckpt is not None:  # a run begun before the transform was recorded: 256 : 224 to its end
            return EvalTransform(eval_resize(cfg.data.crop_size), cfg.data.crop_size)
        sizes = evaluation_transform(cfg.model.cnn_weights, cfg.data.resize, cfg.data.crop_size,
                                     cnn=cfg.model.params["cnn_type"])
        if sizes.warning:
            self.log(f"warning: {sizes.warning}")
        return sizes

    def _warn_unknown(self) -> None:
        """One ``warning:`` line when more than 5 % of the training captions' word pieces are unknown to a BERT's
        vocabulary (a BERT for another language, or the wrong folder): such a run trains, but hardly on words."""
        unk = getattr(self.vocab, "unk_id", None)
        if unk is None:
            return
        pieces = sum(len(ids) - 2 for ids in self.train_ids)
        unknown = sum(ids.count(unk) for ids in self.train_ids)
        if pieces and unknown > 0.05 * pieces:
            name = self.coder_source  # None on a resume: the coder is the checkpoint's
            where = f"--{name} {getattr(self.cfg.model, name, '')}" if name else "the checkpoint's"
            self.log(f"warning: {unknown / pieces:.0%} of the training captions' word pieces are [UNK] in the "
                     f"vocabulary of {where}")

    def _check_out_folder(self) -> None:
        """The out folder: a folder (or nothing yet), not the data; a new run's empty or cocos train's own; a resumed
        run's holding its ``last.pt``."""
        data = Path(self.cfg.data.path)
        if self.out.exists() and not self.out.is_dir():
            raise CocosError(f"{self.out}: exists and is not a folder; choose another --out")
        if data.exists() and self.out.resolve() == data.resolve():
            raise CocosError(f"{self.out}: is the data folder; choose another --out")
        check_run_folder(self.out, [data])  # no other kind of cocos folder, no user's folder: even with --overwrite
        if self.out.is_dir() and not (self.resume or self.overwrite):
            self._check_new_folder()
        if self.resume and not self.last_path.exists():
            raise CocosError(f"{self.last_path}: nothing to resume")

    def _open_features(self) -> None:
        """The precomputed-feature splits (train and dev, k captions per image), of one feature shape."""
        cfg = self.cfg
        self.train_split = PrecompSplit(cfg.data.path, "train", k=cfg.data.k, check_finite=True)
        self.dev_split = PrecompSplit(cfg.data.path, "dev", k=cfg.data.k, check_finite=True)
        if self.dev_split.feature_shape != self.train_split.feature_shape:
            raise CocosError(f"{self.dev_split.features_path}: dev features have shape "
                             f"{self.dev_split.feature_shape} per image but the training features "
                             f"{self.train_split.feature_shape}")
        self.fingerprint = data_fingerprint(cfg.data.path)
        self.image_captions = self.train_split.image_captions

    def _open_images(self) -> None:
        """The raw-image splits (train with ``use_restval``; dev = Karpathy's val), k captions per image."""

        cfg = self.cfg
        self.train_split = load_image_split(cfg.data.path, "train", use_restval=cfg.data.use_restval)
        self.dev_split = load_image_split(cfg.data.path, "dev")
        for split in (self.train_split, self.dev_split):
            per_image = split.image_captions()  # one line if images have different numbers of captions
            if per_image.shape[1] != cfg.data.k:
                raise CocosError(f"{split.source}: split '{split.split}' has {per_image.shape[1]} captions per "
                                 f"image, not --k {cfg.data.k}")
        self.image_captions = self.train_split.image_captions()
        if self.train_split.n_images >= 1000:  # reads every image once: a while for Flickr30k or COCO
            self.log(f"fingerprinting the {self.train_split.n_images:,} training images (read once)")
        self.fingerprint = self.train_split.fingerprint()  # the content of the training images and captions

    def _build_model(self) -> torch.nn.Module:
        """The run's model on the device: its family's module with the run's hyper-parameters, the vocabulary's size
        and the features' dimension; a raw-image family's CNN with the weights file loaded."""
        cfg = self.cfg
        family = get_family(cfg.model.name)
        feature_dim = None if self.images else self.train_split.feature_dim
        model = family.build(**family.hparams(cfg.model.params, len(self.vocab), feature_dim, self.records))
        for source in family.sources:  # a new run starts from its sources' weights (a resumed one from its checkpoint)
            if source.name in self.sources:
                source.load(model, self.sources[source.name])
        if not self.images:
            return model.to(self.device)
        if cfg.model.cnn_weights:
            model.load_cnn_weights(cfg.model.cnn_weights)
        return prepare_model(model, self.device)

    def _optimizer(self) -> torch.optim.Optimizer:
        """Adam (or AdamW with ``weight_decay``) over :meth:`parameter_groups`. Raw images and BERT families: fused
        into one kernel per step (a CNN's or a BERT's millions of weights make the per-tensor loop as slow as the
        step itself on the CPU, and a GPU step of their size is bound by kernel launches)."""
        optim = self.cfg.optim
        big = self.images or bool(get_family(self.cfg.model.name).sources)  # a pre-trained BERT or CLIP
        fused = {"fused": True} if big else {}
        if optim.optimizer == "adamw":
            return torch.optim.AdamW(self.parameter_groups(), lr=optim.lr, weight_decay=optim.weight_decay, **fused)
        return torch.optim.Adam(self.parameter_groups(), lr=optim.lr, **fused)

    def parameter_groups(self) -> list:
        """What the optimiser trains: one group (the trained parameters), or with ``lr_groups`` one group per prefix
        (the model's parameters whose names start with it, the longest prefix winning, at ``factor x lr``) and the
        rest at ``lr``."""
        groups = self.cfg.optim.lr_groups
        if not groups:
            return self.trained_parameters()
        names = [name for name, _ in self.model.named_parameters()]
        unused = [p for p in groups if not any(name.startswith(p) for name in names)]  # a frozen part is a match
        if unused:
            raise CocosError(f"--lr-group {unused[0]}: no parameter of the {self.cfg.model.name} model has a name "
                             "starting with it")
        trained = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        parts = lr_group_names(list(trained), groups)
        lr = self.cfg.optim.lr
        rest = [trained[n] for n in parts[0][1]] + [p for h in self.hooks for p in h.parameters()]
        return [{"params": rest}] + [{"params": [trained[n] for n in names], "lr": lr * groups[prefix]}
                                     for prefix, names in parts[1:]]

    def _hooks(self) -> list[Hook]:
        """The run's extensions of the loop (:mod:`cocos.training.hooks`), in the order they are called."""
        cfg, hooks = self.cfg, []
        if cfg.loss.warmup_epochs:  # the warm-up loss takes the parameters it shares with the loss (the margin)
            warmup = get_objective(self.loss_fn.objective.warmup_loss)
            shared = {k: v for k, v in self.loss_fn.params().items() if k in warmup.defaults}
            hooks.append(WarmUp(cfg.loss.warmup_epochs, get_loss(warmup.name, **shared, compat=cfg.loss.compat)))
        if cfg.hooks.ltd is not None:  # built after the model: its initialisation is that of a run without LTD
            embed = int(self.model.hparams["embed_size"])
            ltd = LatentTargetDecoding(cfg.hooks.ltd, embed, self.targets.shape[1]).to(self.device)
            hooks.append(LTDHook(ltd, self.targets, self.last_path))
        if cfg.hooks.track_cocos:
            tracker = Tracker.for_training(cfg.hooks.track_cocos, cfg.loss.name, self.loss_fn.params(),
                                           self.loss_fn.batch_layout, compat=cfg.loss.compat)
            hooks.append(TrackHook(tracker, self.group.is_main, TRACK_LOG, live=self._learned_params()))
        return hooks

    def _learned_params(self):
        """What a tracked training loss learns (``--learn-tau``: its temperature, read at each counted step), as
        ``() -> {name: {param: value}}``; None for a loss whose parameters are fixed."""
        if not isinstance(self.loss_fn, LearnedTemperature):
            return None
        name, param = self.cfg.loss.name, self.loss_fn.objective.temperature
        return lambda: {name: {param: self.loss_fn.params()[param]}}

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

    def _resume_from(self, ckpt: dict) -> None:
        """Load model, optimizer, scheduler, LTD and RNG state; anything that does not fit is one line."""
        if dict(self.model.hparams) != ckpt["model"]["hparams"]:
            raise CocosError(f"{self.last_path}: holds a model with {ckpt['model']['hparams']}, but this run builds "
                             f"{dict(self.model.hparams)}; resume with the same flags and data")
        if ckpt["epoch"] > self.cfg.optim.epochs:
            raise CocosError(f"{self.last_path}: already holds epoch {ckpt['epoch']}, beyond --epochs "
                             f"{self.cfg.optim.epochs}")
        for hook in self.hooks:
            if isinstance(hook, LTDHook):
                hook.check(ckpt)
        rng = torch.get_rng_state()
        for what, load in (("model weights", lambda: self.model.load_state_dict(ckpt["state_dict"])),
                           ("optimizer state", lambda: self.optimizer.load_state_dict(ckpt["optimizer"])),
                           ("scheduler state", lambda: self.scheduler.load_state_dict(ckpt["scheduler"])),
                           ("LTD state", lambda: self.ltd.load(ckpt["ltd"]) if self.ltd is not None else None),
                           ("random generator state", lambda: torch.set_rng_state(ckpt["rng"]["torch"]))):
            try:
                load()
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
                torch.set_rng_state(rng)
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
                raise CocosError(f"{self.last_path}: its {what} does not fit this run ({reason})") from None
        if self.scheduler.step_size != self.cfg.optim.lr_update:
            raise CocosError(f"{self.last_path}: its learning-rate schedule drops after {self.scheduler.step_size} "
                             f"epochs, not --lr-update {self.cfg.optim.lr_update}; resume with the same flags")
        self.epoch = int(ckpt["epoch"])
        self.step_count = int(ckpt.get("step", 0))
        self.best_rsum = float(ckpt["best_rsum"])
        self.history = list(ckpt["history"])
        self._restore_logs()
        if self.best_path.exists():  # written again when an epoch improves: readable now, not after an epoch
            load_checkpoint(self.best_path)

    def _foreign_entries(self) -> list[Path]:
        """What the out folder holds besides its marker and temporaries of this command's own outputs (a killed
        run's)."""

        return [p for p in self.out.iterdir()
                if p.name != RUN_MARKER and not is_own_temporary(p.name, OUTPUT_NAMES, OUTPUT_PATTERNS)]

    def _check_new_folder(self) -> None:
        """A new run (neither ``resume`` nor ``overwrite``) goes into an absent folder, an empty one, or one that holds
        only cocos train's marker and temporaries (a run killed before it saved anything); otherwise one line that
        says what the folder holds and which flag continues or replaces it."""

        entries = self._foreign_entries()
        if not entries:
            return
        out, epochs = self.out, self.cfg.optim.epochs  # a run folder: check_run_folder refused any other
        epoch = peek_epoch(self.last_path)
        if epoch is None:
            raise CocosError(f"{out}: holds a cocos train run with no last.pt to resume from; pass --overwrite to "
                             "start over")
        if epoch < epochs:
            raise CocosError(f"{out}: holds a cocos train run stopped after epoch {epoch}; continue it with --resume "
                             "or start over with --overwrite")
        if not self._figures_written():
            raise CocosError(f"{out}: holds a cocos train run of {epoch} epochs whose figures were not written; finish "
                             f"it with --resume{'' if epoch == epochs else f' --epochs {epoch}'} or start over with "
                             "--overwrite")
        raise CocosError(f"{out}: holds a finished cocos train run of {epoch} epochs; start over with --overwrite (or "
                         "train on with --resume and more --epochs)")

    def _figures_written(self) -> bool:
        """Whether the figures of the folder's logs are all there (``cocos train`` writes them after the last epoch)."""
        figures = {TRAIN_LOG: "training", TRACK_LOG: "cocos_track"}
        return all((self.out / f"{stem}.{ext}").exists() for log, stem in figures.items() if (self.out / log).exists()
                   for ext in ("png", "pdf"))

    def saved(self) -> dict[str, int | None]:
        """What the out folder holds now: the epoch of ``last.pt`` and ``model_best.pt`` (None: none)."""
        return {"last": peek_epoch(self.last_path), "best": peek_epoch(self.best_path)}

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """What Adam trains and the gradient clip covers: the model, and the hooks' (LTD's decoder, not λ)."""
        return list(self.model.parameters()) + [p for h in self.hooks for p in h.parameters()]

    def _ltd_targets(self) -> torch.Tensor:

        n = len(self.train_split.captions)
        if self.cfg.hooks.ltd.targets:
            return torch.from_numpy(read_targets(self.cfg.hooks.ltd.targets, n))
        if not self.group.is_main:  # rank 0 computes and caches them; the others then read the cache
            barrier(self.group)
        split = self.train_split
        if self.images:  # cached beside the image dataset (its folder, or the folder of its file)

            data = Path(self.cfg.data.path)
            split = SimpleNamespace(folder=data if data.is_dir() else data.parent, split=split.split,
                                    captions=split.captions)
        targets = sentence_targets(split, progress=self.progress, log=self.log)
        if self.group.is_main:
            barrier(self.group)
        return torch.from_numpy(targets)

    def _restore_logs(self) -> None:
        """Keep the rows of the epochs the resumed checkpoint holds (a crash may have left later ones)."""

        logs = read_logs(self.out, max_epoch=self.epoch)  # the checked reader: a damaged log is one line
        check_resumable(logs, self.out, self.step_count)
        if logs.steps is not None:
            self.step_log = logs.steps.to_dict("records")
        for hook in self.hooks:
            if not isinstance(hook, LTDHook):  # LTD's state was loaded with the model's
                hook.resume({}, logs)

    def _check_resume(self, ckpt: dict) -> None:
        cfg = self.cfg
        lacking = [k for k in (*RESUME_KEYS, "best_rsum", "history") if ckpt.get(k) is None]
        if lacking:
            raise CocosError(f"{self.last_path}: holds no {', '.join(lacking)} to resume from (only a last.pt "
                             "written by cocos train can be resumed)")
        entry = Checkpoint.of(ckpt)
        if entry.model.kind != cfg.model.name:
            raise CocosError(f"{self.last_path}: checkpoint is a {entry.model.kind} model, not {cfg.model.name}")
        if entry.loss.name != cfg.loss.name:
            raise CocosError(f"{self.last_path}: checkpoint was trained with {entry.loss.name}, not {cfg.loss.name}")
        if entry.data.fingerprint != self.fingerprint:
            raise CocosError(f"{self.last_path}: checkpoint was trained on other data than {cfg.data.path}")
        # a resumed run equals an uninterrupted one only with the same flags (epochs may grow)
        recorded = {"ltd": False, **entry.train}
        if "params" in recorded and recorded_loss_params(recorded) != cfg.loss_params():
            raise CocosError(f"{self.last_path}: was trained with loss parameters {recorded_loss_params(recorded)}, "
                             f"not {cfg.loss_params()}; resume with the same flags")
        # settings added since an earlier run wrote its record: that run had their defaults
        recorded, now = {**ADDED_DEFAULTS, **recorded}, {**ADDED_DEFAULTS, **cfg.flat()}
        for name in RESUME_FLAGS:
            if name in recorded and recorded[name] != now[name]:
                raise CocosError(f"{self.last_path}: was trained with --{name.replace('_', '-')} {recorded[name]}, "
                                 f"not {now[name]}; resume with the same flags")

    # -- one epoch --------------------------------------------------------------------

    def batches(self, epoch: int):
        seed = epoch_seed(self.cfg.optim.seed, epoch)
        bs = self.cfg.optim.batch_size
        if self.loss_fn.batch_layout == "ranking":
            n = self.train_split.n_images
            images = ranking_batches(n, min(bs, n), seed, drop_last=False)
            if len(images) > 1 and len(images[-1]) == 1:  # a batch of one image: nothing to contrast
                images = images[:-1]
            for img in images:
                cap = self.image_captions[img].reshape(-1)
                yield img, cap, None
        else:
            caption_image = self.train_split.caption_image
            batches = pair_batches(caption_image, min(bs, len(caption_image)), seed, drop_last=False)
            if len(batches) > 1 and len(batches[-1][0]) == 1:  # a batch of one caption: nothing to contrast
                batches = batches[:-1]
            for cap, img in batches:
                yield img, cap, np.arange(len(cap))

    def _full_batch(self, img: np.ndarray, cap: np.ndarray) -> bool:
        """Whether a batch has the configured size (counts depend on it; the short final batch is not tracked)."""
        if self.loss_fn.batch_layout == "ranking":
            return len(img) == min(self.cfg.optim.batch_size, self.train_split.n_images)
        return len(cap) == min(self.cfg.optim.batch_size, len(self.train_split.caption_image))

    def _local_rows(self, img: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        """This rank's contiguous block of the global batch (images and their captions), and whether it is split.

        A batch with fewer items than processes is not split: every rank computes all of it.
        """

        group = self.group
        # a model with BatchNorm (VSRN) needs two rows on every rank in training mode
        least = group.world * (2 if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                        for m in self.model.modules()) else 1)
        if self.loss_fn.batch_layout == "ranking":
            if not group.active or len(img) < least:
                return img, cap, False
            rows, k = block(len(img), group), len(cap) // len(img)
            return img[rows.start:rows.stop], cap[rows.start * k:rows.stop * k], True
        if not group.active or len(cap) < least:
            return img, cap, False
        rows = block(len(cap), group)
        return img[rows.start:rows.stop], cap[rows.start:rows.stop], True

    def step(self, img: np.ndarray, cap: np.ndarray, caption_image, loss_fn=None, epoch: int = 0,
             pixels: torch.Tensor | None = None) -> float:
        """One optimiser step, as VSE++'s loop: forward, loss, backward, clip, step; the hooks at their points.

        Raw images: ``pixels`` are this rank's rows of the batch (:meth:`pixel_batches`)."""
        check_interrupt()  # a Ctrl-C that something swallowed on its way up
        self.step_count += 1
        batch = StepBatch(self.step_count, epoch, img, cap, caption_image, torch.as_tensor(img, device=self.device),
                          self._full_batch(img, cap))
        img_emb, cap_emb, split = self.forward(batch, pixels)
        for hook in self.hooks:
            hook.observe(batch, img_emb, cap_emb)
        loss_con = (loss_fn or self.loss_fn)(img_emb, cap_emb, caption_image=caption_image, image_ids=batch.image_ids)
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
        objective = (loss_fn or self.loss_fn).objective  # the warm-up's family during warm-up epochs
        self.step_log.append({"step": self.step_count, "epoch": epoch, "loss": value, "L_con": l_con,
                              "L_con/query": objective.per_query(l_con, len(img), len(cap)), **record,
                              **self._named_parts(loss_fn or self.loss_fn, batch, img_emb, cap_emb)})
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
        """The coded captions of this rank's rows (``local``) of a batch. BERT captions get VSE∞'s masking and
        dropping of words (:meth:`cocos.data.wordpiece.WordPieceCoder.augment`), drawn for the whole batch in its
        order on every rank, so that a torchrun run draws what one process draws."""
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
        if isinstance(self.loss_fn, LearnedTemperature):
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
        ckpt = {
            "model": {"kind": self.cfg.model.name, "hparams": dict(self.model.hparams)},
            "vocab": self.vocab.tokens,
            **({"text": self.vocab.options()} if hasattr(self.vocab, "options") else {}),
            "state_dict": {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()},
            "loss": {"name": self.cfg.loss.name, "params": self.loss_fn.params(), "compat": self.cfg.loss.compat,
                     "presentation": self.loss_fn.objective.presentation(loss_names().index(self.cfg.loss.name))
                     .to_dict()},
            "data": self._data_entry(),
            "train": self.cfg.flat(),
            "epoch": self.epoch,
            "step": self.step_count,
            "metrics": metrics,
            "best_rsum": self.best_rsum,
            "history": self.history,
        }
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
        data = {"path": str(Path(self.cfg.data.path).resolve()), "fingerprint": self.fingerprint, "k": self.cfg.data.k}
        if not self.images:
            return {**data, "feature_shape": list(self.train_split.feature_shape)}
        own = getattr(self.model, "preprocess", None)  # a model with its own preprocessing (CLIP): its crop
        data = {**data, "feature_shape": [int(self.model.img_dim)], "input": "images",
                "crop_size": own.crop_size if own is not None else self.cfg.data.crop_size,
                "use_restval": self.cfg.data.use_restval}
        if self.eval_sizes is not None:  # the evaluation transform, and the weights file it is the transform of
            data["resize"] = self.eval_sizes.resize
            if self.eval_sizes.record() is not None:
                data["weights"] = self.eval_sizes.record()
        return data

    def evaluate_dev(self) -> dict:
        """Validation metrics on the dev split (raw images: evaluation transform, ``workers``)."""
        return evaluate_model(self.model, self.dev_split, self.dev_ids, device=self.device,
                              workers=self.cfg.data.workers, crop_size=self.cfg.data.crop_size,
                              resize=self.eval_sizes.resize if self.eval_sizes is not None else None)

    def fit(self) -> dict:
        """Train the remaining epochs; returns the best checkpoint's validation metrics.

        Under the run folder's lock (:meth:`run_lock`) the folder is made (and checked writable) and
        marked (:data:`RUN_MARKER`, the first write) before the first step; temporaries of its
        own outputs that a killed run left there are removed; ``overwrite`` removes the previous
        run's files. A failed run leaves either nothing or a resumable run folder, marked: if it
        fails or is interrupted before its first ``last.pt`` is saved, the folder is removed again
        if this run made it, else what this run added to it (the marker included); once a
        ``last.pt`` is saved everything stays, and ``--resume`` continues from it.
        """

        with self.run_lock():
            return self._fit()

    @contextlib.contextmanager
    def run_lock(self):
        """Hold :func:`cocos.io.output_lock` on the run folder (the main process alone; nothing if already held):
        a second writer of the same folder is refused in one line."""

        if not self.group.is_main or self.locked:
            yield
            return
        with output_lock(self.out.resolve()):
            self.locked = True
            try:
                yield
            finally:
                self.locked = False

    def _fit(self) -> dict:
        main = self.group.is_main
        created = make_dirs(self.out) if main else None
        if main:
            remove_stale_temporaries(self.out, OUTPUT_NAMES, OUTPUT_PATTERNS, own=True)
            if self.overwrite and not self.resume:
                self._remove_previous_run()
        existed = set(self.out.iterdir()) if main else set()
        self.last_saved = False
        try:
            if main:
                self._mark(created, existed)
            while self.epoch < self.cfg.optim.epochs:
                self._fit_epoch()
        except BaseException:
            if main and not self.last_saved:  # nothing of this run worth keeping (a full disk, Ctrl-C in epoch 1, ...)
                self._remove_added(created, existed)
            raise
        barrier(self.group)  # rank 0 has written the last checkpoint
        if not self.group.is_main:  # other nodes need not share rank 0's file system
            return dict(self.best_metrics)
        return load_checkpoint(self.best_path)["metrics"]

    def _mark(self, created: list[Path], existed: set[Path]) -> None:
        """The marker, first: written into a folder this run made or one that holds only cocos train's files (never
        into a user's folder that ``--overwrite`` trains into: it would then pass for a run folder)."""

        text = RUN_MARKER_TEXT + (f"by: {self.by}\n" if self.by else "")
        if (self.out / RUN_MARKER).exists():  # a run starting over records who trains it now (an earlier
            if not self.resume and run_writer(self.out) != self.by:  # version's marker has no writer)
                write_text(self.out / RUN_MARKER, text)
            return
        if created or all(is_output(p.name) for p in existed):
            write_text(self.out / RUN_MARKER, text)

    def _remove_added(self, created: list[Path], existed: set[Path]) -> None:
        """Undo a run that saved no ``last.pt``: the folder it made, or the files of its own that it added."""

        remove_created(created)
        with contextlib.suppress(OSError):
            for path in set(self.out.iterdir()) - existed if self.out.is_dir() else ():
                if is_output(path.name) and not path.is_dir():
                    path.unlink(missing_ok=True)

    def _remove_previous_run(self) -> None:
        """``overwrite``: the previous run's checkpoints, logs and figures go (its marker and other files stay), so
        the folder never mixes two runs."""

        for path in self.out.iterdir():
            if path.name != RUN_MARKER and is_output(path.name) and (path.is_file() or path.is_symlink()):
                try:
                    path.unlink()
                except OSError as exc:
                    raise CocosError(f"{path}: cannot remove the previous run's file ({exc.strerror or exc})") \
                        from None

    def _fit_epoch(self) -> None:
        """Train, validate and save one epoch (``last_saved`` once its ``last.pt`` is on disk)."""
        epoch = self.epoch + 1
        self.epoch_running = epoch
        lr = self.optimizer.param_groups[0]["lr"]
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
            self.write_logs()  # before last.pt: a resume cuts the logs back to its epoch
            if improved:
                save_checkpoint(self.best_path, self.checkpoint(metrics, full=False))
            if self.cfg.hooks.save_every and epoch % self.cfg.hooks.save_every == 0:
                save_checkpoint(self.out / f"epoch_{epoch:03d}.pt", self.checkpoint(metrics, full=False))
            save_checkpoint(self.last_path, self.checkpoint(metrics, full=True))
            self.last_saved = True
        self.epoch_running = 0
        self.log(
            f"epoch {epoch:>3}  loss {loss:.4f}  {rate:,.0f} cap/s  "
            f"i2t R@1/5/10 {metrics['i2t_R@1']:.1f}/{metrics['i2t_R@5']:.1f}/{metrics['i2t_R@10']:.1f}  "
            f"t2i {metrics['t2i_R@1']:.1f}/{metrics['t2i_R@5']:.1f}/{metrics['t2i_R@10']:.1f}  "
            f"rsum {metrics['rsum']:.1f}{'  *best' if improved else ''}"
            + (f"  (warm-up: {self.loss_fn.objective.warmup_loss} loss)"
               if epoch <= self.cfg.loss.warmup_epochs else "")
        )

    def write_logs(self) -> None:
        """``train_log.csv`` (every step) and ``cocos_track.csv`` (every N steps), rewritten atomically."""


        write_csv(self.out / TRAIN_LOG, pd.DataFrame(self.step_log), float_format="%.10g")
        for hook in self.hooks:
            hook.write_logs(self.out)


def check_run_folder(out: str | os.PathLike, inputs=(), option: str = "--out") -> Path:
    """The kind rule (:func:`cocos.io.check_output_dir`, kind ``run``) for a training run folder, before any work:
    ``out`` is absent, empty, a run folder (cocos train's marker :data:`RUN_MARKER`), or an unmarked folder that
    holds cocos train's files or their temporaries (a run of an earlier version); a cocos folder of any other kind
    (dataset, feature cache, report, ...) and a folder cocos did not write are refused in one line even with
    ``--overwrite``, and so is one that is, holds or lies inside an input. What a run folder may be without
    ``--resume`` or ``--overwrite`` is :meth:`Trainer._check_new_folder`'s."""
    out = Path(out)
    try:
        entries = list(out.iterdir()) if out.is_dir() and output_kind(out) is None else []
    except OSError:
        entries = []
    if entries and all(is_output(p.name) for p in entries):  # only cocos train's file names: an earlier run
        check_inputs(out, inputs, option)
        check_ancestors(out, "run", option)
    else:  # a user's folder that merely holds a last.pt or an epoch_1.pt among its own files is not a run
        check_output_dir(out, inputs, overwrite=True, kind="run", by="train", option=option)
    return out


def run_writer(out: str | os.PathLike) -> str | None:
    """The writer a run folder's :data:`RUN_MARKER` records (``train``, ``demo``, ``sweep``), None for a folder of an
    earlier version (its marker names no writer)."""
    try:
        text = (Path(out) / RUN_MARKER).read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return None
    for line in text.splitlines()[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "by":
            return value.strip() or None
    return None


def is_output(name: str) -> bool:
    """Whether a file name is one cocos train writes into its folder (or a temporary of one)."""
    return (name in OUTPUT_NAMES or any(re.fullmatch(p, name) for p in OUTPUT_PATTERNS)
            or is_own_temporary(name, OUTPUT_NAMES, OUTPUT_PATTERNS))


def resolve_data(ckpt: dict, data: str | Path | None, checkpoint_path: str | Path) -> Path:
    """The data folder: ``data`` if given, else the one recorded in the checkpoint if it still exists.

    A raw-image checkpoint (``data.input`` ``images``) may name an image dataset file (a CSV file
    list or a ``{split}_set.p``) instead of a folder."""
    images = ckpt["data"].get("input") == "images"

    def exists(path: Path) -> bool:
        return path.is_dir() or (images and path.is_file())

    if data is not None:
        folder = Path(data)
        if not exists(folder):
            raise CocosError(f"{folder}: no such data {'set' if images else 'folder'}")
        return folder
    recorded = Path(ckpt["data"]["path"])
    if not exists(recorded):
        raise CocosError(f"{checkpoint_path}: its data {'set' if images else 'folder'} {recorded} is gone; pass --data")
    return recorded


def open_split(ckpt: dict, data: str | Path, split: str):
    """One split of a checkpoint's data: a raw-image split for a raw-image checkpoint (with its recorded
    ``use_restval``), else the precomputed folder's split with the checkpoint's ``k``."""
    k = int(ckpt["data"]["k"])
    if ckpt["data"].get("input") == "images":

        return load_image_split(data, split, use_restval=bool(ckpt["data"].get("use_restval", False)))
    return PrecompSplit(data, split, k=k, check_finite=True)
