"""A run resolved once: what it reads, the model its family builds, the objective's loss, the hooks, the optimiser.

:func:`resolve` turns a validated :class:`~cocos.training.config.TrainConfig` (:func:`cocos.training.checks.validate`)
into a :class:`Setup`, and the trainer is a loop over it (:class:`cocos.training.trainer.Trainer`). This module and
:mod:`cocos.training.checks` are the only places of the training layer that look a family or a loss up in its
registry; both loop over what the specs declare and never name one:

- **the data** (:class:`RunData`): the training and dev splits of precomputed features or raw images, the content
  fingerprint a checkpoint records, the caption coder and the coded captions, a raw-image run's evaluation
  transform, LTD's targets;
- **the family** (:class:`~cocos.models.family.ModelFamily`): its pre-trained sources (a BERT folder, a CLIP folder,
  a plugin's own: :attr:`~cocos.models.family.ModelFamily.sources`), each read whole before anything is built; the
  caption coder a source brings (else the ``--vocab`` file or a vocabulary of the training captions); the module
  with the run's hyper-parameters, the sources' records and weights (a resumed run takes them from its checkpoint);
- **the objective** (:class:`~cocos.losses.spec.Objective`): the loss, with ``--learn-tau`` its temperature the
  model's ``logit_scale`` (:class:`~cocos.losses.base.LearnedTemperature`), its warm-up loss and its presentation;
- **the hooks** (:mod:`cocos.training.hooks`) and the optimiser over the model's parameter groups.

The order of the steps that draw random numbers is that of every earlier version (the seed, the model, the loss,
LTD's decoder), so a run of a given seed trains the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from cocos.data.images import load_image_split
from cocos.data.precomp import PrecompSplit, data_fingerprint
from cocos.data.targets import read_targets, sentence_targets
from cocos.data.text import Vocabulary
from cocos.data.wordpiece import coder_of
from cocos.distributed import barrier
from cocos.errors import CocosError
from cocos.losses.base import LearnedParameters, LearnedTemperature
from cocos.losses.ltd import LatentTargetDecoding
from cocos.models.family import ModelFamily
from cocos.models.registry import get_family
from cocos.models.weights import EvalTransform, evaluation_transform, known_by_digest
from cocos.objectives import get_loss, get_objective
from cocos.objectives import names as loss_names
from cocos.training.config import TrainConfig, lr_group_names
from cocos.training.evaluate import tokenize_split
from cocos.training.hooks import Hook, LearnedHook, LTDHook, TensorBoardHook, TrackHook, WarmUp
from cocos.training.pixels import eval_resize, prepare_model
from cocos.training.resume import check_resume
from cocos.training.track import Tracker

TRACK_LOG = "cocos_track.csv"


@dataclass
class RunData:
    """What a run reads (module docstring): the splits, their fingerprint, the coder and coded captions."""

    images: bool  # raw images (else precomputed features)
    train: Any  # PrecompSplit or ImageSplit
    dev: Any
    fingerprint: str
    image_captions: np.ndarray  # (n_images, k) caption rows of each training image
    coder: Any = None  # the caption coder: a Vocabulary, a WordPieceCoder, a CLIPCoder
    coder_source: str | None = None  # the source whose coder codes the captions (None: a vocabulary, a checkpoint's)
    sources: dict | None = None  # {source name: the opened source} of a new run
    records: dict | None = None  # what the model records of its sources among its constructor arguments
    train_ids: list | None = None
    dev_ids: list | None = None
    eval_sizes: EvalTransform | None = None  # a raw-image run's evaluation Resize and CenterCrop
    targets: torch.Tensor | None = None  # LTD's targets, one row per training caption


@dataclass
class Setup:
    """A run resolved (module docstring): the trainer's loop needs nothing else."""

    cfg: TrainConfig
    family: ModelFamily
    data: RunData
    model: torch.nn.Module
    loss_fn: Any  # a ContrastiveLoss (or LearnedTemperature around one)
    hooks: list[Hook]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.StepLR
    presentation: dict  # the loss's looks, recorded in each checkpoint

    @property
    def learned(self) -> bool:
        """Whether the loss learns its temperature or its own parameters (projected after each optimiser step)."""
        return isinstance(self.loss_fn, (LearnedTemperature, LearnedParameters))


def resolve(cfg: TrainConfig, *, resume_ckpt: dict | None, last_path: Path, device: torch.device, group,
            log=print, progress: bool = True) -> Setup:
    """The run of ``cfg`` (validated) resolved once (module docstring); ``resume_ckpt``: the ``last.pt`` a resumed
    run continues (checked against the run first)."""
    family = get_family(cfg.model.name)
    data = open_data(cfg, log)
    if resume_ckpt is not None:
        check_resume(resume_ckpt, cfg, data.fingerprint, last_path)
    read_captions(cfg, family, data, resume_ckpt)
    data.eval_sizes = eval_sizes(cfg, resume_ckpt, log) if data.images else None
    if len(data.train.captions) >= 100_000:  # COCO's 590k through a BERT's tokenizer: a while, said once
        log(f"coding the {len(data.train.captions):,} training captions")
    data.train_ids = tokenize_split(data.train, data.coder)
    warn_unknown(cfg, data, log)
    data.dev_ids = tokenize_split(data.dev, data.coder)
    if cfg.hooks.ltd is not None:  # before anything is written
        data.targets = ltd_targets(cfg, data, group, log, progress)
    torch.manual_seed(cfg.optim.seed)
    model = build_model(cfg, family, data, device)
    loss_fn = learn_temperature(cfg, model, get_loss(cfg.loss.name, **cfg.loss_params(), compat=cfg.loss.compat))
    loss_fn = learn_parameters(cfg, model, loss_fn)
    hooks = make_hooks(cfg, model, loss_fn, data.targets, last_path, group.is_main, device)
    optimizer = make_optimizer(cfg, model, hooks, big=data.images or bool(family.sources))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg.optim.lr_update, gamma=0.1)
    looks = loss_fn.objective.presentation(loss_names().index(cfg.loss.name)).to_dict()
    return Setup(cfg, family, data, model, loss_fn, hooks, optimizer, scheduler, looks)


# -- what the run reads ---------------------------------------------------------------------------------------------

def open_data(cfg: TrainConfig, log=print) -> RunData:
    """The training and dev splits (precomputed features of one shape, or raw images with ``k`` captions each;
    raw images: train with ``use_restval``, dev = Karpathy's val) and the training data's fingerprint."""
    if not cfg.images():
        train = PrecompSplit(cfg.data.path, "train", k=cfg.data.k, check_finite=True)
        dev = PrecompSplit(cfg.data.path, "dev", k=cfg.data.k, check_finite=True)
        if dev.feature_shape != train.feature_shape:
            raise CocosError(f"{dev.features_path}: dev features have shape {dev.feature_shape} per image but the "
                             f"training features {train.feature_shape}")
        return RunData(False, train, dev, data_fingerprint(cfg.data.path), train.image_captions)
    train = load_image_split(cfg.data.path, "train", use_restval=cfg.data.use_restval)
    dev = load_image_split(cfg.data.path, "dev")
    for split in (train, dev):
        per_image = split.image_captions()  # one line if images have different numbers of captions
        if per_image.shape[1] != cfg.data.k:
            raise CocosError(f"{split.source}: split '{split.split}' has {per_image.shape[1]} captions per image, "
                             f"not --k {cfg.data.k}")
    if train.n_images >= 1000:  # reads every image once: a while for Flickr30k or COCO
        log(f"fingerprinting the {train.n_images:,} training images (read once)")
    return RunData(True, train, dev, train.fingerprint(), train.image_captions())


def read_captions(cfg: TrainConfig, family: ModelFamily, data: RunData, resume_ckpt: dict | None) -> None:
    """The run's caption coder and what the model records of its pre-trained sources: a resumed run's as its
    checkpoint recorded them; a new run's from its family's sources, each read whole before anything is written;
    else the ``--vocab`` file or a vocabulary of the training captions."""
    data.sources = {} if resume_ckpt is not None else {
        s.name: s.read(cfg.model.source(s.name)) for s in family.sources}
    coders = [(name, opened.coder) for name, opened in data.sources.items()
              if getattr(opened, "coder", None) is not None]
    data.coder_source = coders[0][0] if coders else None
    if resume_ckpt is not None:
        data.coder = coder_of(resume_ckpt["vocab"], resume_ckpt.get("text"))
        data.records = family.source_records(resume_ckpt["model"]["hparams"])
        return
    data.records = {k: v for s in family.sources for k, v in s.records(data.sources[s.name]).items()}
    if coders:
        data.coder = coders[0][1]
    elif cfg.data.vocab:
        data.coder = Vocabulary.from_scan_json(cfg.data.vocab)
    else:
        data.coder = Vocabulary.build(data.train.captions, threshold=cfg.data.vocab_threshold)


def eval_sizes(cfg: TrainConfig, resume_ckpt: dict | None, log=print) -> EvalTransform | None:
    """A raw-image run's evaluation Resize and CenterCrop: the CNN weights file's own
    (:func:`cocos.models.weights.evaluation_transform`: 232 for torchvision's V2 ResNets) unless ``--resize``
    says otherwise (a ``warning:`` line then); a resumed run's as its checkpoint recorded them (its file may be
    gone); None for a model with its own preprocessing (CLIP)."""
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
        log(f"warning: {sizes.warning}")
    return sizes


def warn_unknown(cfg: TrainConfig, data: RunData, log=print) -> None:
    """One ``warning:`` line when more than 5 % of the training captions' word pieces are unknown to a coder with
    an unknown piece (a BERT for another language, or the wrong folder): such a run trains, but hardly on words."""
    unk = getattr(data.coder, "unk_id", None)
    if unk is None:
        return
    pieces = sum(len(ids) - 2 for ids in data.train_ids)
    unknown = sum(ids.count(unk) for ids in data.train_ids)
    if pieces and unknown > 0.05 * pieces:
        name = data.coder_source  # None on a resume: the coder is the checkpoint's
        where = f"--{name} {cfg.model.source(name)}" if name else "the checkpoint's"
        log(f"warning: {unknown / pieces:.0%} of the training captions' word pieces are [UNK] in the vocabulary "
            f"of {where}")


def ltd_targets(cfg: TrainConfig, data: RunData, group, log=print, progress: bool = True) -> torch.Tensor:
    """LTD's targets: the ``--ltd-targets`` file, else sentence embeddings of the training captions computed by
    rank 0 and cached beside the data (raw images: beside the image dataset) for the other ranks."""
    n = len(data.train.captions)
    if cfg.hooks.ltd.targets:
        return torch.from_numpy(read_targets(cfg.hooks.ltd.targets, n))
    if not group.is_main:  # rank 0 computes and caches them; the others then read the cache
        barrier(group)
    split = data.train
    if data.images:  # cached beside the image dataset (its folder, or the folder of its file)
        path = Path(cfg.data.path)
        split = SimpleNamespace(folder=path if path.is_dir() else path.parent, split=split.split,
                                captions=split.captions)
    targets = sentence_targets(split, progress=progress, log=log)
    if group.is_main:
        barrier(group)
    return torch.from_numpy(targets)


# -- the model, the loss, the hooks, the optimiser ------------------------------------------------------------------

def build_model(cfg: TrainConfig, family: ModelFamily, data: RunData, device: torch.device) -> torch.nn.Module:
    """The run's model on the device: the family's module with the run's hyper-parameters, the coder's size, the
    features' dimension and its sources' records; a new run's sources' weights loaded (a resumed run's come from
    its checkpoint); a raw-image family's CNN weights file loaded."""
    feature_dim = None if data.images else data.train.feature_dim
    model = family.build(**family.hparams(cfg.model.params, len(data.coder), feature_dim, data.records))
    for source in family.sources:
        if source.name in data.sources:
            source.load(model, data.sources[source.name])
    if not data.images:
        return model.to(device)
    if cfg.model.cnn_weights:
        model.load_cnn_weights(cfg.model.cnn_weights)
    return prepare_model(model, device)


def learn_temperature(cfg: TrainConfig, model: torch.nn.Module, loss_fn):
    """``--learn-tau``: the loss's temperature is the model's ``logit_scale``, trained with it (CLIP) and clamped
    from the start; without it a model's ``logit_scale`` does not train. A model with nothing left to train is
    one line."""
    scale = getattr(model, "logit_scale", None)
    if isinstance(scale, torch.nn.Parameter):
        scale.requires_grad_(bool(cfg.loss.learn_tau))
    if cfg.loss.learn_tau:
        loss_fn = LearnedTemperature(loss_fn, scale)
        loss_fn.project_()  # a folder saved above CLIP's clamp trains from the clamp
    return loss_fn


def learn_parameters(cfg: TrainConfig, model: torch.nn.Module, loss_fn):
    """The objective's learned parameters (:attr:`~cocos.losses.spec.Objective.learned`: SigLIP's ``t`` and
    ``b``), always learned in training: the model's parameters of their names where it has them (a SigLIP
    folder's ``logit_scale`` and ``logit_bias``, trained even where the model's would not), else the loss's own
    (:class:`~cocos.losses.base.LearnedParameters`), clamped from the start. A run with nothing left to train
    (every weight frozen, no temperature or loss parameter learned) is one line."""
    if loss_fn.objective.learned and not isinstance(loss_fn, LearnedTemperature):
        loss_fn = LearnedParameters(loss_fn, model)
        for held in loss_fn.held():
            held.requires_grad_(True)
        loss_fn.project_()
    if not any(p.requires_grad for p in model.parameters()) and not getattr(loss_fn, "own_parameters", list)():
        scale = getattr(model, "logit_scale", None)
        raise CocosError(f"--model {cfg.model.name}: nothing to train (every weight is frozen"
                         f"{'' if scale is None else ', and the temperature is not learned'})")
    return loss_fn


def make_hooks(cfg: TrainConfig, model, loss_fn, targets, last_path: Path, is_main: bool, device) -> list[Hook]:
    """The run's extensions of the loop (:mod:`cocos.training.hooks`), in the order they are called: the
    objective's warm-up loss (with the parameters it shares with the loss: the margin), LTD (built after the model:
    its initialisation is that of a run without LTD), COCOS tracking (with a learned temperature read live),
    TensorBoard (``OUT/tensorboard/``, rank 0; one line where the package is not installed)."""
    hooks: list[Hook] = []
    if cfg.loss.warmup_epochs:
        warmup = get_objective(loss_fn.objective.warmup_loss)
        shared = {k: v for k, v in loss_fn.params().items() if k in warmup.defaults}
        hooks.append(WarmUp(cfg.loss.warmup_epochs, get_loss(warmup.name, **shared, compat=cfg.loss.compat)))
    if cfg.hooks.ltd is not None:
        ltd = LatentTargetDecoding(cfg.hooks.ltd, int(model.hparams["embed_size"]), targets.shape[1]).to(device)
        hooks.append(LTDHook(ltd, targets, last_path))
    if isinstance(loss_fn, LearnedParameters) and loss_fn.own_parameters():
        hooks.append(LearnedHook(loss_fn, last_path))
    if cfg.hooks.track_cocos:
        tracker = Tracker.for_training(cfg.hooks.track_cocos, cfg.loss.name, loss_fn.params(),
                                       loss_fn.batch_layout, compat=cfg.loss.compat)
        hooks.append(TrackHook(tracker, is_main, TRACK_LOG, live=learned_params(cfg, loss_fn)))
    if cfg.hooks.tensorboard:
        hooks.append(TensorBoardHook(last_path.parent, is_main, live=learned_params(cfg, loss_fn)))
    return hooks


def learned_params(cfg: TrainConfig, loss_fn):
    """What a tracked training loss learns (``--learn-tau``: its temperature; SigLIP: its ``t`` and ``b``), read at
    each counted step, as ``() -> {name: {param: value}}``; None for a loss whose parameters are fixed."""
    if isinstance(loss_fn, LearnedParameters):
        learned = list(loss_fn.objective.learned)
        return lambda: {cfg.loss.name: {k: v for k, v in loss_fn.params().items() if k in learned}}
    if not isinstance(loss_fn, LearnedTemperature):
        return None
    name, param = cfg.loss.name, loss_fn.objective.temperature
    return lambda: {name: {param: loss_fn.params()[param]}}


def make_optimizer(cfg: TrainConfig, model, hooks: list[Hook], big: bool) -> torch.optim.Optimizer:
    """Adam (or AdamW with ``weight_decay``) over :func:`parameter_groups`; ``big`` (raw images, a pre-trained
    source): fused into one kernel per step (a CNN's or a BERT's millions of weights make the per-tensor loop as
    slow as the step itself on the CPU, and a GPU step of their size is bound by kernel launches)."""
    optim, fused = cfg.optim, {"fused": True} if big else {}
    groups = parameter_groups(cfg, model, hooks)
    if optim.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=optim.lr, weight_decay=optim.weight_decay, **fused)
    return torch.optim.Adam(groups, lr=optim.lr, **fused)


def trained_parameters(model, hooks: list[Hook]) -> list[torch.nn.Parameter]:
    """What the optimiser trains and the gradient clip covers: the model, and the hooks' (LTD's decoder, not λ)."""
    return list(model.parameters()) + [p for h in hooks for p in h.parameters()]


def parameter_groups(cfg: TrainConfig, model, hooks: list[Hook]) -> list:
    """What the optimiser trains: one group (the trained parameters), or with ``lr_groups`` one group per prefix
    (the model's parameters whose names start with it, the longest prefix winning, at ``factor x lr``) and the
    rest at ``lr``."""
    groups = cfg.optim.lr_groups
    if not groups:
        return trained_parameters(model, hooks)
    names = [name for name, _ in model.named_parameters()]
    unused = [p for p in groups if not any(name.startswith(p) for name in names)]  # a frozen part is a match
    if unused:
        raise CocosError(f"--lr-group {unused[0]}: no parameter of the {cfg.model.name} model has a name starting "
                         "with it")
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    parts = lr_group_names(list(trained), groups)
    rest = [trained[n] for n in parts[0][1]] + [p for h in hooks for p in h.parameters()]
    return [{"params": rest}] + [{"params": [trained[n] for n in names], "lr": cfg.optim.lr * groups[prefix]}
                                 for prefix, names in parts[1:]]
