"""Checkpoints: a dict of plain types and tensors that loads with ``weights_only=True``.

Format (``format = "cocos-checkpoint"``, ``format_version = 1``), each part a record of
:mod:`cocos.training.ckpt_schema`::

    model:      {"kind": a registered model family ("vsepp", "vsrn", "vsepp_full", a plugin's), "hparams": {...}}
    vocab:      [token, ...]               plain strings, index = token id
    text:       the caption coder's options, for families that take word pieces (absent: a vocabulary)
    state_dict: {name: tensor}
    loss:       {"name": ..., "params": {...}, "compat": bool, "presentation": {...}}
                (presentation: how reports show the loss, as results.json records it; absent before #29)
    data:       {"path": ..., "fingerprint": ..., "k": ..., "feature_shape": [...]}
                raw images also: "input": "images", "crop_size": ..., "use_restval": bool, and since #31
                "resize": the evaluation Resize, "weights": {"file", "sha256", "name"} of the CNN weights file
                (fingerprint: the training split's ImageSplit.fingerprint; feature_shape: [pooled d])
    train:      the training flags (epochs, lr, lr_update, batch_size, seed, ...), read through
                :func:`_train_record`
    epoch:      last finished epoch (1-based); step: optimizer steps taken (absent before LTD)
    metrics:    validation metrics of that epoch; best_rsum: best validation rsum so far
    history:    [{"epoch", "loss", "rsum", ...}, ...]
    optimizer, scheduler, rng: present in ``last.pt`` for resuming
    ltd:        with ``--ltd``: the decoder, its settings and the multiplier
    library_version
    content_sha256: sha256 of the canonical encoding of everything else (:func:`content_hash`)

Writes are atomic (temporary file, then rename). Loading never runs code from
the file (``torch.load(weights_only=True)``) and checks, once, everything a command
may use: the zip CRC of every member, the content hash (checkpoints written before it
existed load without it), and the structure (:func:`validate_checkpoint`): every part against
its record, the model rebuilt from ``model.kind`` + ``hparams`` (on the meta device,
nothing allocated) against the state dict's names, shapes and dtypes, the vocabulary
against the embedding table, the recorded loss against the registry (where its family is registered: a
checkpoint stands alone, its ``loss.presentation`` showing a loss whose plugin is gone), and the resume
state (optimizer, scheduler, RNG, LTD) against the parameters it belongs to
(:mod:`cocos.training.ckpt_state`). Anything wrong raises :class:`CocosError` with one line naming
the file and the field.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from cocos import __version__, typed
from cocos.data.wordpiece import coder_of
from cocos.errors import CocosError
from cocos.io import write_bytes
from cocos.models.family import TEXTS
from cocos.models.registry import get_family
from cocos.models.registry import names as model_names
from cocos.objectives import OBJECTIVES
from cocos.presentation import Presentation
from cocos.safeload import first_line, load_torch_file
from cocos.training.ckpt_hash import HASH_KEY, SHA256_HEX, canonical, content_hash, verify_content_hash
from cocos.training.ckpt_schema import (
    SEED_LIMIT,
    Checker,
    DataEntry,
    FeatureData,
    Hash,
    ImageData,
    LossEntry,
    ModelEntry,
    ModelPart,
    Progress,
    TrainUsed,
    show,
)
from cocos.training.ckpt_state import check_hparams, check_resume_state, meta_module
from cocos.training.config import is_sectioned, record_flat, record_type

__all__ = ["FORMAT", "FORMAT_VERSION", "HASH_KEY", "REQUIRED", "RESUME_KEYS", "SEED_LIMIT", "SHA256_HEX",
           "Checkpoint", "DataEntry", "LossEntry", "ModelEntry", "Progress", "content_hash", "load_checkpoint",
           "peek", "peek_epoch", "save_checkpoint", "validate_checkpoint", "validate_model", "verify_content_hash"]

FORMAT = "cocos-checkpoint"
FORMAT_VERSION = 1
REQUIRED = ("model", "vocab", "state_dict", "loss", "data", "epoch")
RESUME_KEYS = ("optimizer", "scheduler", "rng")  # what last.pt holds beyond model_best.pt


# -- writing and reading -------------------------------------------------------------------------


def save_checkpoint(path: str | os.PathLike, checkpoint: dict) -> None:
    """Serialise to memory first, then write atomically: a crash never leaves a broken file.

    The payload carries ``content_sha256``, the hash of everything else (:func:`content_hash`),
    which :func:`load_checkpoint` recomputes. Equal contents give equal bytes
    (:func:`~cocos.training.ckpt_hash.canonical`): a resumed run's checkpoint is the file an
    uninterrupted run writes.
    """
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "library_version": __version__,
               **{k: v for k, v in checkpoint.items() if k != HASH_KEY}}
    payload[HASH_KEY] = content_hash(payload)
    buffer = io.BytesIO()
    torch.save(canonical(payload), buffer)
    write_bytes(path, buffer.getvalue())


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read, verify (zip CRC, content hash) and validate a cocos checkpoint; one CocosError line otherwise."""
    path = Path(path)
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, not a checkpoint (try {path}/model_best.pt)")
    ckpt = load_torch_file(path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("format"), str) or ckpt["format"] != FORMAT:
        raise CocosError(f"{path}: not a cocos checkpoint")
    _check_version(ckpt, path)
    verify_content_hash(ckpt, path)
    return validate_checkpoint(ckpt, path)


def peek(path: str | os.PathLike) -> dict:
    """A checkpoint file's dict read cheaply (tensors memory-mapped, nothing verified); ``{}`` if unreadable.

    For messages about what is on disk (after Ctrl-C) and checks made before the real load
    (which verifies everything): never trust more than a plain field of it.
    """
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an unreadable file has nothing to peek at
        return {}
    return ckpt if isinstance(ckpt, dict) else {}


def peek_epoch(path: str | os.PathLike) -> int | None:
    """The ``epoch`` a checkpoint file records (:func:`peek`); ``None`` if there is no readable checkpoint."""
    epoch = peek(path).get("epoch")
    return epoch if typed.TESTS["int"](epoch) else None


def _check_version(ckpt: dict, where) -> None:
    version = ckpt.get("format_version")
    if not typed.TESTS["int"](version):
        raise CocosError(f"{where}: format_version must be an integer, got {show(version)}")
    if version > FORMAT_VERSION:
        raise CocosError(f"{where}: checkpoint format {version} is newer than this cocos (reads up to "
                         f"{FORMAT_VERSION})")
    if version < 1:
        raise CocosError(f"{where}: format_version must be at least 1, got {version}")


# -- the structure -------------------------------------------------------------------------------


def validate_checkpoint(ckpt: dict, path="checkpoint") -> dict:
    """Check the structure of a loaded checkpoint against its format (module docstring); returns it.

    Every part is checked against its record (:mod:`cocos.training.ckpt_schema`); the model described
    by ``model`` is built on the meta device and compared with ``state_dict``; ``vocab`` has one token
    per row of the word embedding; the recorded loss is registered and its parameters valid;
    ``optimizer``/``scheduler``/``rng``/``ltd``, where present, fit the parameters they belong to.
    Raises one :class:`CocosError` line ``{path}: {field} ...``.
    """
    check = Checker(path)
    _check_header(check, ckpt, path)
    meta = validate_model(ckpt, path)
    train = _train_record(ckpt["train"], path) if "train" in ckpt else {}
    _check_loss(check, ckpt["loss"])
    _check_data(check, ckpt["data"], ckpt["model"]["hparams"], train)
    check.record(Progress, ckpt, "")
    check_resume_state(check, ckpt, meta, train)
    check.record(Hash, ckpt, "")  # well-formed; whether it matches is verify_content_hash's check
    return ckpt


def _check_header(check: Checker, ckpt, path) -> None:
    """A dict of format ``cocos-checkpoint``, of a version this cocos reads, holding every :data:`REQUIRED` field."""
    check.value(ckpt, "checkpoint", "dict", keys=True)
    if not isinstance(ckpt.get("format"), str) or ckpt["format"] != FORMAT:
        raise CocosError(f"{path}: not a cocos checkpoint")
    _check_version(ckpt, path)
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CocosError(f"{path}: checkpoint lacks {', '.join(missing)}")


def validate_model(ckpt: dict, where="checkpoint") -> torch.nn.Module:
    """Check ``model``, ``vocab`` and ``state_dict`` against each other; returns the model on the meta device.

    Also the check :func:`cocos.training.trainer.build_from_checkpoint` makes on a dict built in memory
    (e.g. a converted checkpoint of the original code).
    """
    check = Checker(where)
    check.record(ModelPart, ckpt, "")
    kind, vocab = ckpt["model"]["kind"], ckpt["vocab"]
    if kind not in model_names():
        check.fail("model.kind", f"must be one of {', '.join(model_names())}, got {show(kind)}")
    family = get_family(kind)
    hparams = check_hparams(check, family.module, ckpt["model"]["hparams"], "model.hparams")
    _check_text(check, ckpt, kind, family.text)
    if "vocab_size" in hparams and len(vocab) != hparams["vocab_size"]:
        check.fail("vocab", f"has {len(vocab)} tokens but the model's word embedding table has "
                            f"{hparams['vocab_size']} rows (model.hparams.vocab_size)")
    meta = meta_module(check, "model.hparams", lambda: family.module(**hparams))
    check.tensors(ckpt["state_dict"], meta.state_dict(), "state_dict", f"{kind} model")
    return meta


def _check_text(check: Checker, ckpt: dict, kind: str, takes: str) -> None:
    """``text``, the caption coder's options (absent: a vocabulary): the kind of captions the model takes, and a
    coder the vocabulary makes."""
    text = ckpt.get("text")
    if text is not None and (not isinstance(text, dict) or text.get("kind") not in TEXTS):
        check.fail("text", f"must be a record with kind one of {', '.join(TEXTS)}, got {show(text)}")
    kind_of_text = (text or {}).get("kind", "vocab")
    if kind_of_text != takes:
        check.fail("text", f"the {kind} model takes {takes} captions, the checkpoint records {kind_of_text}")
    try:
        coder_of(ckpt["vocab"], text)
    except CocosError as exc:
        check.fail("vocab", f"is not a vocabulary ({exc})")


def _train_record(train, where="checkpoint") -> dict:
    """The run's ``train`` record as the flat record commands read (:func:`cocos.training.config.record_type`),
    checked; one CocosError line otherwise. The one place that reads ``train``: this version's record of the
    run's sections (:meth:`cocos.training.config.TrainConfig.record`) is converted to the flat one here
    (:func:`cocos.training.config.record_flat`), before the checks. A setting the run did not record is None (a
    converted checkpoint of the original code); what commands read as numbers (:class:`TrainUsed`) is never None,
    and no integer is negative."""
    check = Checker(where)
    if is_sectioned(train):  # this version's record: its sections, read as the flat record
        try:
            train = record_flat(train)
        except CocosError as exc:
            check.fail("train", str(exc))
    flat = check.record(TrainUsed, train, "train", complete=False)
    check.record(record_type(), {k: v for k, v in flat.items() if v is not None}, "train", complete=False)
    for name, value in flat.items():
        if typed.TESTS["int"](value) and value < 0:
            check.fail(f"train.{name}", f"must not be negative, got {value}")
    return dict(flat)


def _check_loss(check: Checker, loss) -> None:
    """The training loss, checked against the family's spec where it is registered. A loss whose plugin is not
    installed is accepted as recorded (evaluating and analysing need no loss; the checkpoint's ``presentation``
    shows it; resuming needs the plugin and says so)."""
    loss = check.record(LossEntry, loss, "loss")
    name, params = loss["name"], loss.get("params", {})
    if loss.get("presentation") is not None:
        try:
            Presentation.from_dict(loss["presentation"])
        except Exception as exc:  # noqa: BLE001 - CocosError, or what a tensor planted in it raises
            check.fail("loss.presentation", f"is not a loss presentation ({first_line(exc)})")
    if name not in OBJECTIVES:
        return
    try:
        OBJECTIVES[name].params(**params)
    except Exception as exc:  # noqa: BLE001 - the family's own check, or one on a value of an odd type
        why = exc if isinstance(exc, CocosError) else first_line(exc)
        check.fail("loss.params", f"are not valid for {name} ({why})")


def _check_data(check: Checker, data, hparams: dict, train: dict) -> None:
    """``data`` (:class:`~cocos.training.ckpt_schema.ImageData` for raw images, else ``FeatureData``) against the
    model that reads it and the run's ``train.k``."""
    images = isinstance(data, dict) and data.get("input") == "images"
    data = check.record(ImageData if images else FeatureData, data, "data")
    if "k" in train and train["k"] != data["k"]:
        check.fail("data.k", f"is {data['k']} but train.k is {train['k']}")
    if "img_dim" in hparams and data["feature_shape"][-1] != hparams["img_dim"]:
        check.fail("data.feature_shape", f"has dimension {data['feature_shape'][-1]} but the model takes "
                                         f"{hparams['img_dim']} (model.hparams.img_dim)")
    if images and "cnn_type" not in hparams and "preprocess" not in hparams:  # a CNN, or the model's own preprocessing
        check.fail("data.input", "is images but the model reads precomputed features")


# -- the typed view ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's parts, typed (:meth:`of` a validated checkpoint dict); the file holds the plain dict."""

    model: ModelEntry
    vocab: list
    loss: LossEntry
    data: DataEntry
    progress: Progress
    train: dict
    state_dict: dict
    ltd: dict | None = None

    @classmethod
    def of(cls, ckpt: dict) -> Checkpoint:
        return cls(model=typed.build(ModelEntry, ckpt["model"]), vocab=list(ckpt["vocab"]),
                   loss=typed.build(LossEntry, ckpt["loss"]), data=typed.build(DataEntry, ckpt["data"]),
                   progress=typed.build(Progress, ckpt), train=_train_record(ckpt.get("train") or {}),
                   state_dict=ckpt["state_dict"], ltd=ckpt.get("ltd"))
