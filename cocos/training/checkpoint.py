"""Checkpoints: a dict of plain types and tensors that loads with ``weights_only=True``.

Format (``format = "cocos-checkpoint"``, ``format_version = 1``)::

    model:      {"kind": a registered model family ("vsepp", "vsrn", "vsepp_full", a plugin's), "hparams": {...}}
    vocab:      [token, ...]               plain strings, index = token id
    state_dict: {name: tensor}
    loss:       {"name": ..., "params": {...}, "compat": bool, "presentation": {...}}
                (presentation: how reports show the loss, as results.json records it; absent before #29)
    data:       {"path": ..., "fingerprint": ..., "k": ..., "feature_shape": [...]}
                raw images also: "input": "images", "crop_size": ..., "use_restval": bool, and since #31
                "resize": the evaluation Resize, "weights": {"file", "sha256", "name"} of the CNN weights file
                (fingerprint: the training split's ImageSplit.fingerprint; feature_shape: [pooled d])
    train:      the training flags (epochs, lr, lr_update, batch_size, seed, ...)
    epoch:      last finished epoch (1-based)
    metrics:    validation metrics of that epoch; best_rsum: best validation rsum so far
    history:    [{"epoch", "loss", "rsum", ...}, ...]
    optimizer, scheduler, rng: present in ``last.pt`` for resuming
    ltd:        with ``--ltd``: the decoder, its settings and the multiplier
    library_version
    content_sha256: sha256 of the canonical encoding of everything else (:func:`content_hash`)

Writes are atomic (temporary file, then rename). Loading never runs code from
the file (``torch.load(weights_only=True)``) and checks, once, everything a command
may use: the zip CRC of every member, the content hash (checkpoints written before it
existed load without it), and the structure (:func:`validate_checkpoint`): the type of
every field, the model rebuilt from ``model.kind`` + ``hparams`` (on the meta device,
nothing allocated) against the state dict's names, shapes and dtypes, the vocabulary
against the embedding table, the recorded loss against the registry (where its family is registered: a
checkpoint stands alone, its ``loss.presentation`` showing a loss whose plugin is gone), and the resume
state (optimizer, scheduler, RNG, LTD) against the parameters it belongs to. Anything
wrong raises :class:`CocosError` with one line naming the file and the field.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import inspect
import io
import math
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cocos import __version__, typed
from cocos.data.wordpiece import coder_of
from cocos.errors import CocosError
from cocos.io import write_bytes
from cocos.losses.ltd import LAMBDA_RANGE, MODES, TargetDecoder
from cocos.models.family import TEXTS, constructor_arguments
from cocos.models.registry import get_family
from cocos.models.registry import names as model_names
from cocos.objectives import OBJECTIVES
from cocos.presentation import Presentation
from cocos.safeload import first_line, load_torch_file
from cocos.training.config import lr_group_names

FORMAT = "cocos-checkpoint"
FORMAT_VERSION = 1
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a sha256 as its 64 lower-case hex digits
REQUIRED = ("model", "vocab", "state_dict", "loss", "data", "epoch")
HASH_KEY = "content_sha256"
RESUME_KEYS = ("optimizer", "scheduler", "rng")  # what last.pt holds beyond model_best.pt
SEED_LIMIT = 2**63  # seeds are integers in [0, 2**63): numpy, torch and the synthetic world all take them


# -- writing and reading -------------------------------------------------------------------------


def save_checkpoint(path: str | os.PathLike, checkpoint: dict) -> None:
    """Serialise to memory first, then write atomically: a crash never leaves a broken file.

    The payload carries ``content_sha256``, the hash of everything else (:func:`content_hash`),
    which :func:`load_checkpoint` recomputes. Equal contents give equal bytes (:func:`_canonical`):
    a resumed run's checkpoint is the file an uninterrupted run writes.
    """
    payload = {"format": FORMAT, "format_version": FORMAT_VERSION, "library_version": __version__,
               **{k: v for k, v in checkpoint.items() if k != HASH_KEY}}
    payload[HASH_KEY] = content_hash(payload)
    buffer = io.BytesIO()
    torch.save(_canonical(payload), buffer)
    write_bytes(path, buffer.getvalue())


def _canonical(obj):
    """``obj`` with fresh containers and every string interned: pickle refers back to an object it has written
    (its memo is by identity), so without this the bytes would depend on which equal strings happen to be one
    object (a key written by this process, or one read back from the checkpoint a run resumed from)."""
    if type(obj) is str:
        return sys.intern(obj)
    if type(obj) in (dict, collections.OrderedDict):
        out = type(obj)((_canonical(k), _canonical(v)) for k, v in obj.items())
        if getattr(obj, "_metadata", None) is not None:  # a state dict's module versions, which load_state_dict reads
            out._metadata = _canonical(obj._metadata)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_canonical(v) for v in obj)
    return obj


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
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def _check_version(ckpt: dict, where) -> None:
    version = ckpt.get("format_version")
    if not _is_int(version):
        raise CocosError(f"{where}: format_version must be an integer, got {_show(version)}")
    if version > FORMAT_VERSION:
        raise CocosError(f"{where}: checkpoint format {version} is newer than this cocos (reads up to "
                         f"{FORMAT_VERSION})")
    if version < 1:
        raise CocosError(f"{where}: format_version must be at least 1, got {version}")


# -- the content hash ----------------------------------------------------------------------------


def content_hash(payload: dict) -> str:
    """sha256 (hex) of a canonical encoding of ``payload`` without ``content_sha256``.

    Every value is encoded with a type tag: strings and bytes with their length, integers
    in decimal, floats exactly (``float.hex``), lists and tuples item by item, dicts with
    their entries in the order of their encoded keys (so insertion order does not matter),
    tensors as dtype, shape and raw bytes. Equal payloads give equal hashes, and the hash
    of a loaded checkpoint equals the one computed before it was saved.
    """
    digest = hashlib.sha256()
    _encode({k: v for k, v in payload.items() if k != HASH_KEY}, digest.update, 0)
    return digest.hexdigest()


def verify_content_hash(ckpt: dict, where) -> None:
    """Recompute the content hash and compare; a checkpoint without one (older cocos) passes."""
    if HASH_KEY not in ckpt:
        return
    stored = ckpt[HASH_KEY]
    if not isinstance(stored, str) or not SHA256_HEX.fullmatch(stored):
        raise CocosError(f"{where}: is corrupted ({HASH_KEY} is not a sha256 hex digest)")
    if content_hash(ckpt) != stored:
        raise CocosError(f"{where}: is corrupted (its content does not match the {HASH_KEY} stored in it)")


def _sized(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack("<Q", len(data)) + data


def _encode_scalar(value) -> bytes | None:
    """The bytes of a plain value (None, bool, int, float, complex, str, bytes, dtype, device); None otherwise."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"B1" if value else b"B0"
    if isinstance(value, int):
        return _sized(b"I", str(value).encode())
    if isinstance(value, float):
        return _sized(b"F", value.hex().encode())
    if isinstance(value, complex):
        return _sized(b"C", f"{value.real.hex()},{value.imag.hex()}".encode())
    if isinstance(value, str):
        return _sized(b"S", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray)):
        return _sized(b"Y", bytes(value))
    if isinstance(value, (torch.dtype, torch.device)):
        return _sized(b"O", str(value).encode())
    return None


def _encode(value, put, depth: int) -> None:
    if depth > 64:
        raise CocosError("checkpoint is nested too deeply")
    plain = _encode_scalar(value)
    if plain is not None:
        put(plain)
    elif isinstance(value, torch.Tensor):
        _encode_tensor(value, put)
    elif isinstance(value, (list, tuple)):  # torch.Size is a tuple
        put(b"L" + struct.pack("<Q", len(value)))
        for item in value:
            _encode(item, put, depth + 1)
    elif isinstance(value, dict):
        entries = []
        for key, item in value.items():
            parts: list[bytes] = []
            _encode(key, parts.append, depth + 1)
            entries.append((b"".join(parts), item))
        entries.sort(key=lambda e: e[0])
        put(b"D" + struct.pack("<Q", len(entries)))
        for key_bytes, item in entries:
            put(key_bytes)
            _encode(item, put, depth + 1)
    else:
        raise CocosError(f"checkpoint holds a value of type {type(value).__name__}, which a checkpoint may not hold")


def _encode_tensor(tensor: torch.Tensor, put) -> None:
    try:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        data = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
    except Exception as exc:  # noqa: BLE001 - sparse, quantised or meta tensors: not in a checkpoint
        raise CocosError(f"checkpoint holds a tensor cocos cannot read ({first_line(exc)})") from None
    head = f"{tensor.dtype}|{','.join(str(int(d)) for d in tensor.shape)}".encode()
    put(b"T" + struct.pack("<Q", len(head)) + head + struct.pack("<Q", data.nbytes))
    put(data)


# -- the structure -------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value) -> str:
    """A short one-line description of a value for an error message."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"


class _Checker:
    """Raises one CocosError line ``{where}: {field} ...``."""

    def __init__(self, where) -> None:
        self.where = str(where)

    def fail(self, field: str, message: str) -> None:
        text = f"{self.where}: {field} {message}"
        raise CocosError(text.replace("\r", "\\r").replace("\n", "\\n"))

    def dict(self, value, field: str) -> dict:
        if not isinstance(value, dict):
            self.fail(field, f"must be a dict, got {_show(value)}")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            self.fail(field, f"must have string keys, has {_show(bad[0])}")
        return value

    def key(self, mapping: dict, name: str, field: str):
        if name not in mapping:
            self.fail(f"{field}.{name}" if field else name, "is missing")
        return mapping[name]

    def int(self, value, field: str, minimum: int | None = 0, maximum: int | None = None) -> int:
        if not _is_int(value):
            self.fail(field, f"must be an integer, got {_show(value)}")
        if minimum is not None and value < minimum:
            self.fail(field, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(field, f"must be at most {maximum}, got {value}")
        return value

    def number(self, value, field: str, *, finite: bool = True, minimum: float | None = None,
               above: float | None = None, maximum: float | None = None) -> float:
        if not _is_number(value):
            self.fail(field, f"must be a number, got {_show(value)}")
        if isinstance(value, float) and math.isnan(value):
            self.fail(field, "must be a number, got nan")
        if finite and not math.isfinite(value):
            self.fail(field, f"must be finite, got {value}")
        if minimum is not None and value < minimum:
            self.fail(field, f"must be at least {minimum}, got {value}")
        if above is not None and not value > above:
            self.fail(field, f"must be greater than {above}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(field, f"must be at most {maximum}, got {value}")
        return value

    def str(self, value, field: str, nonempty: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string, got {_show(value)}")
        if nonempty and not value:
            self.fail(field, "must not be empty")
        return value

    def bool(self, value, field: str) -> bool:
        if not isinstance(value, bool):
            self.fail(field, f"must be true or false, got {_show(value)}")
        return value

    def list(self, value, field: str) -> list:
        if not isinstance(value, (list, tuple)):
            self.fail(field, f"must be a list, got {_show(value)}")
        return list(value)

    def tensors(self, state, reference: dict, field: str, what: str) -> None:
        """``state`` holds exactly the tensors of ``reference`` (a meta module's state dict): names, shapes, dtypes."""
        state = self.dict(state, field)
        missing = [k for k in reference if k not in state]
        if missing:
            self.fail(field, f"lacks {missing[0]} ({len(missing)} of the {what}'s {len(reference)} tensors missing)")
        extra = [k for k in state if k not in reference]
        if extra:
            self.fail(field, f"holds {extra[0]}, which the {what} does not have")
        for name, ref in reference.items():
            self.tensor(state[name], f"{field}[{name!r}]", tuple(ref.shape), ref.dtype)

    def tensor(self, value, field: str, shape: tuple | None = None, dtype: torch.dtype | None = None,
               finite: bool = False) -> torch.Tensor:
        """A dense tensor of ``shape`` and the kind of ``dtype``. Values are not judged (``finite`` to check
        NaN/Inf): NaN weights are a model's state, found where they make NaN embeddings."""
        if not isinstance(value, torch.Tensor):
            self.fail(field, f"must be a tensor, got {_show(value)}")
        if value.layout != torch.strided or value.is_quantized or value.device.type == "meta":
            self.fail(field, "must be a plain dense tensor")
        if shape is not None and tuple(value.shape) != tuple(shape):
            self.fail(field, f"has shape {tuple(value.shape)}, expected {tuple(shape)}")
        if dtype is not None:
            self.dtype(value, field, dtype)
        if finite and value.dtype.is_floating_point and value.numel() and not bool(torch.isfinite(value).all()):
            self.fail(field, "holds NaN or Inf")
        return value

    def dtype(self, value: torch.Tensor, field: str, dtype: torch.dtype) -> None:
        """``value`` has the kind of ``dtype``: any floating point dtype for a floating ``dtype`` (weights may be
        saved in half precision), else exactly ``dtype``."""
        if dtype.is_floating_point and not value.dtype.is_floating_point:
            self.fail(field, f"has dtype {value.dtype}, expected a floating point dtype ({dtype})")
        if not dtype.is_floating_point and value.dtype != dtype:
            self.fail(field, f"has dtype {value.dtype}, expected {dtype}")


def _check_hparams(check: _Checker, cls, hparams, field: str) -> dict:
    """Constructor arguments of ``cls``: known names, integers >= 1 (``n_gcn`` >= 0) or switches."""
    hparams = check.dict(hparams, field)
    params = constructor_arguments(cls)
    for name, value in hparams.items():
        if name not in params:
            check.fail(f"{field}.{name}", f"is not a parameter of the {getattr(cls, 'kind', cls.__name__)} model "
                                          f"(it takes {', '.join(params)})")
        _check_hparam_value(check, value, params[name], f"{field}.{name}")
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in hparams:
            check.fail(f"{field}.{name}", "is missing")
    return hparams


def _check_hparam_value(check: _Checker, value, param: inspect.Parameter, field: str) -> None:
    """One constructor argument, typed by its default: a switch, a name (``cnn_type``, ``head`` of the
    raw-image model: the model itself refuses unknown names), a finite number (a float default: VSE∞'s
    ``region_drop``), a record (an argument annotated ``dict``: VSE∞'s ``bert_config``), or an integer >= 1
    (``n_*``, ``*_epochs`` and ``*_blocks`` >= 0)."""
    default = param.default
    if re.fullmatch(r"dict(\[.*\])?( \| None)?", str(param.annotation).replace("typing.", "")):
        check.dict(value, field)
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            check.fail(field, f"must be a finite number, got {_show(value)}")
    elif isinstance(default, bool):
        check.bool(value, field)
    elif isinstance(default, str):
        check.str(value, field, nonempty=True)
    else:
        name = field.rsplit(".", 1)[-1]
        check.int(value, field, minimum=0 if name.startswith("n_") or name.endswith(("_epochs", "_blocks")) else 1)


@contextlib.contextmanager
def _on_meta_device():
    """Build modules on the meta device. ``nn.init.normal_`` of a meta tensor is skipped: its meta
    implementation imports torch's Python reference ops (a second of start-up for every command)."""
    original = torch.nn.init.normal_

    def normal_(tensor, *args, **kwargs):
        return tensor if tensor.is_meta else original(tensor, *args, **kwargs)

    torch.nn.init.normal_ = normal_
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.nn.init.normal_ = original


def _meta_module(check: _Checker, field: str, build):
    """Build a module on the meta device (shapes only, no memory); a failure is one line."""
    try:
        with _on_meta_device():
            return build()
    except CocosError as exc:
        check.fail(field, f"do not describe a valid model ({exc})")
    except Exception as exc:  # noqa: BLE001 - whatever a nonsense size makes torch raise
        check.fail(field, f"do not describe a valid model ({first_line(exc)})")


def validate_model(ckpt: dict, where="checkpoint") -> torch.nn.Module:
    """Check ``model``, ``vocab`` and ``state_dict`` against each other; returns the model on the meta device.

    Also the check :func:`cocos.training.trainer.build_from_checkpoint` makes on a dict built in memory
    (e.g. a converted checkpoint of the original code).
    """

    check = _Checker(where)
    check.dict(ckpt, "checkpoint")
    model = _entry(check, ModelEntry, check.key(ckpt, "model", ""), "model")
    kind = model["kind"]
    if not isinstance(kind, str) or kind not in model_names():
        check.fail("model.kind", f"must be one of {', '.join(model_names())}, got {_show(kind)}")
    family = get_family(kind)
    hparams = _check_hparams(check, family.module, check.key(model, "hparams", "model"), "model.hparams")
    vocab = check.list(check.key(ckpt, "vocab", ""), "vocab")
    for i, token in enumerate(vocab):
        if not isinstance(token, str) or not token:
            check.fail(f"vocab[{i}]", f"must be a non-empty string, got {_show(token)}")
    text = ckpt.get("text")
    if text is not None and (not isinstance(text, dict) or text.get("kind") not in TEXTS):
        check.fail("text", f"must be a record with kind one of {', '.join(TEXTS)}, got {_show(text)}")
    kind_of_text = (text or {}).get("kind", "vocab")
    if kind_of_text != family.text:
        check.fail("text", f"the {kind} model takes {family.text} captions, the checkpoint records {kind_of_text}")
    try:
        coder_of(vocab, text)
    except CocosError as exc:
        check.fail("vocab", f"is not a vocabulary ({exc})")
    if "vocab_size" in hparams and len(vocab) != hparams["vocab_size"]:
        check.fail("vocab", f"has {len(vocab)} tokens but the model's word embedding table has "
                            f"{hparams['vocab_size']} rows (model.hparams.vocab_size)")
    meta = _meta_module(check, "model.hparams", lambda: family.module(**hparams))
    check.tensors(check.key(ckpt, "state_dict", ""), meta.state_dict(), "state_dict", f"{kind} model")
    return meta


# -- the typed entries ---------------------------------------------------------------------------------
# The checkpoint's parts as records (checked field by field against these annotations by :mod:`cocos.typed`, the
# one checker results.json uses too); what the annotations cannot say (ranges, agreement between parts, the
# registry, the model's tensors) is checked after them.


@dataclass(frozen=True)
class ModelEntry:
    kind: str
    hparams: dict


@dataclass(frozen=True)
class LossEntry:
    name: str
    params: dict = field(default_factory=dict)
    compat: bool = False
    presentation: dict | None = None  # how reports show the training loss (Presentation.to_dict), since 0.1 (#29)


@dataclass(frozen=True)
class DataEntry:
    path: str
    fingerprint: str
    k: int
    feature_shape: list
    input: str = "features"  # "features" (precomputed) or "images" (raw images, vsepp_full)
    crop_size: int | None = None
    use_restval: bool | None = None
    resize: int | None = None  # raw images: the evaluation Resize the run used (since #31; absent: 256 : 224)
    weights: dict | None = None  # raw images: the CNN weights file, {"file", "sha256", "name"} (since #31)


@dataclass(frozen=True)
class Progress:
    epoch: int
    step: int = 0
    metrics: dict | None = None
    best_rsum: inf | None = None  # noqa: F821 - -inf before the first validation ("inf": a number, infinity allowed)
    history: list | None = None
    library_version: str | None = None


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
                   progress=typed.build(Progress, ckpt), train=dict(ckpt.get("train") or {}),
                   state_dict=ckpt["state_dict"], ltd=ckpt.get("ltd"))


def _entry(check: _Checker, cls, node, field_name: str, complete: bool = True) -> dict:
    """``node`` checked as a ``cls`` record (one line naming the field); ``field_name`` "" for the top level."""
    node = check.dict(node, field_name or "checkpoint")
    found = typed.problem(cls, node, _show, complete=complete)
    if found is not None:
        check.fail(f"{field_name}.{found[0]}" if field_name else found[0], found[1])
    return node


# fields of `train` that commands read as numbers: they may not be missing values
_TRAIN_USED = {"batch_size": 1, "k": 1, "seed": 0}


def _check_train(check: _Checker, train) -> dict:
    from cocos.training.config import record_type

    train = check.dict(train, "train")
    for name, minimum in _TRAIN_USED.items():
        if name in train:
            check.int(train[name], f"train.{name}", minimum=minimum, maximum=SEED_LIMIT - 1 if name == "seed" else None)
    # a setting the run did not record is None (a converted checkpoint of the original code)
    _entry(check, record_type(), {k: v for k, v in train.items() if v is not None}, "train", complete=False)
    for name, value in train.items():
        if _is_int(value) and value < 0:
            check.fail(f"train.{name}", f"must not be negative, got {value}")
    return train


def _check_loss(check: _Checker, loss) -> None:
    """The training loss: a name and parameters, checked against the family's spec where it is registered. A loss
    whose plugin is not installed is accepted as recorded (evaluating and analysing need no loss; the checkpoint's
    ``presentation`` shows it; resuming needs the plugin and says so)."""

    loss = _entry(check, LossEntry, loss, "loss")
    name = check.str(loss["name"], "loss.name", nonempty=True)
    params = check.dict(loss.get("params", {}), "loss.params")
    for key, value in params.items():
        if not (_is_number(value) or isinstance(value, (str, bool))):
            check.fail(f"loss.params.{key}", f"must be a number, a name or a switch, got {_show(value)}")
    if loss.get("presentation") is not None:
        try:
            Presentation.from_dict(loss["presentation"])
        except Exception as exc:  # noqa: BLE001 - CocosError, or what a tensor planted in it raises
            check.fail("loss.presentation", f"is not a loss presentation ({first_line(exc)})")
    if name not in OBJECTIVES:
        return
    try:
        OBJECTIVES[name].params(**params)
    except CocosError as exc:
        check.fail("loss.params", f"are not valid for {name} ({exc})")
    except Exception as exc:  # noqa: BLE001 - a family's own check on a value of an odd type
        check.fail("loss.params", f"are not valid for {name} ({first_line(exc)})")


def _check_data(check: _Checker, data, hparams: dict, train: dict) -> None:
    data = _entry(check, DataEntry, data, "data")
    for name in ("path", "fingerprint"):
        check.str(data[name], f"data.{name}", nonempty=True)
    k = check.int(data["k"], "data.k", minimum=1)
    if "k" in train and train["k"] != k:
        check.fail("data.k", f"is {k} but train.k is {train['k']}")
    shape = data["feature_shape"]
    if len(shape) not in (1, 2):
        check.fail("data.feature_shape", f"must be (D,) or (R, D), got {_show(shape)}")
    for i, d in enumerate(shape):
        check.int(d, f"data.feature_shape[{i}]", minimum=1)
    if "img_dim" in hparams and shape[-1] != hparams["img_dim"]:
        check.fail("data.feature_shape", f"has dimension {shape[-1]} but the model takes {hparams['img_dim']} "
                                         "(model.hparams.img_dim)")
    kind = data.get("input", "features")
    if kind not in ("features", "images"):
        check.fail("data.input", f"must be features or images, got {_show(kind)}")
    if kind == "images":  # raw images: the CNN's crop (224 when not recorded) and the Karpathy restval switch
        if "cnn_type" not in hparams and "preprocess" not in hparams:  # a CNN, or a model's own preprocessing
            check.fail("data.input", "is images but the model reads precomputed features")
        if data.get("crop_size") is not None:
            check.int(data["crop_size"], "data.crop_size", minimum=8)
    _check_transform_record(check, data, kind == "images")


def _check_transform_record(check: _Checker, data: dict, images: bool) -> None:
    """Raw images: ``data.resize``, the evaluation Resize, and ``data.weights``, the CNN weights file's record (both
    absent before #31, and both only on raw images)."""
    if not images:
        if data.get("resize") is not None or data.get("weights") is not None:
            check.fail("data.resize" if data.get("resize") is not None else "data.weights",
                       "applies to raw images (data.input images) only")
        return
    if data.get("resize") is not None:
        check.int(data["resize"], "data.resize", minimum=1)
    _check_weights_record(check, data.get("weights"))


def _check_weights_record(check: _Checker, weights) -> None:
    """``data.weights`` (absent before #31): the CNN weights file the run started from, ``{"file": its base name,
    "sha256": its 64 hex digits, "name": the readable name of a known file or None}`` (:mod:`cocos.models.weights`)."""
    if weights is None:
        return
    weights = check.dict(weights, "data.weights")
    check.str(check.key(weights, "file", "data.weights"), "data.weights.file", nonempty=True)
    digest = check.str(check.key(weights, "sha256", "data.weights"), "data.weights.sha256")
    if not SHA256_HEX.fullmatch(digest):
        check.fail("data.weights.sha256", f"must be 64 lower-case hex digits, got {_show(digest)}")
    if weights.get("name") is not None:
        check.str(weights["name"], "data.weights.name", nonempty=True)
    extra = sorted(set(weights) - {"file", "sha256", "name"})
    if extra:
        check.fail(f"data.weights.{extra[0]}", "is not a field of data.weights (file, sha256, name)")


def _check_progress(check: _Checker, ckpt: dict) -> None:
    _entry(check, Progress, ckpt, "")
    check.int(ckpt["epoch"], "epoch", minimum=0)
    check.int(ckpt.get("step", 0), "step", minimum=0)
    for key, value in (ckpt.get("metrics") or {}).items():
        check.number(value, f"metrics.{key}")
    for i, row in enumerate(ckpt.get("history") or ()):
        for key, value in check.dict(row, f"history[{i}]").items():
            check.number(value, f"history[{i}].{key}")


def _check_ltd(check: _Checker, ltd, embed_size) -> torch.nn.Module:

    ltd = check.dict(ltd, "ltd")
    mode = check.key(ltd, "mode", "ltd")
    if mode not in MODES:
        check.fail("ltd.mode", f"must be one of {', '.join(MODES)}, got {_show(mode)}")
    check.number(check.key(ltd, "eta", "ltd"), "ltd.eta", above=0)
    check.number(check.key(ltd, "beta", "ltd"), "ltd.beta", minimum=0)
    if ltd.get("targets") is not None:
        check.str(ltd["targets"], "ltd.targets")
    hparams = _check_hparams(check, TargetDecoder, check.key(ltd, "hparams", "ltd"), "ltd.hparams")
    if embed_size is not None and hparams.get("embed_size") != embed_size:
        check.fail("ltd.hparams.embed_size", f"is {hparams.get('embed_size')} but the model embeds into {embed_size}")
    decoder = _meta_module(check, "ltd.hparams", lambda: TargetDecoder(**hparams))
    check.tensors(check.key(ltd, "decoder", "ltd"), decoder.state_dict(), "ltd.decoder", "LTD decoder")
    if mode == "constraint":
        check.number(check.key(ltd, "lambda", "ltd"), "ltd.lambda", minimum=LAMBDA_RANGE[0], maximum=LAMBDA_RANGE[1])
        if "lambda_optimizer" in ltd:
            _check_optimizer(check, ltd["lambda_optimizer"], [()], "ltd.lambda_optimizer")
    return decoder


_GROUP_VALUE = (int, float, bool, str, type(None))


def _check_optimizer(check: _Checker, opt, shapes: list[tuple], field: str) -> None:
    """A torch optimizer's state dict for parameters of ``shapes`` (in the order the optimizer holds them)."""
    opt = check.dict(opt, field)
    state = check.key(opt, "state", field)
    groups = check.list(check.key(opt, "param_groups", field), f"{field}.param_groups")
    if not isinstance(state, dict):
        check.fail(f"{field}.state", f"must be a dict, got {_show(state)}")
    ids: list[int] = []
    for g, group in enumerate(groups):
        ids += _check_param_group(check, group, f"{field}.param_groups[{g}]")
    if len(ids) != len(shapes) or len(set(ids)) != len(ids):
        check.fail(field, f"covers {len(set(ids))} parameters, but the model has {len(shapes)}")
    shape_of = dict(zip(ids, shapes, strict=True))
    for pid, entry in state.items():
        if not _is_int(pid) or pid not in shape_of:
            check.fail(f"{field}.state", f"holds the state of parameter {_show(pid)}, which no group names")
        _check_param_state(check, check.dict(entry, f"{field}.state[{pid}]"), shape_of[pid], f"{field}.state[{pid}]")


def _check_param_group(check: _Checker, group, where: str) -> list[int]:
    """One parameter group: plain finite settings; returns the parameter ids it names."""
    group = check.dict(group, where)
    ids = [check.int(pid, f"{where}.params[{i}]")
           for i, pid in enumerate(check.list(check.key(group, "params", where), f"{where}.params"))]
    for key, value in group.items():
        if key == "params":
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, _GROUP_VALUE) for v in items):
            check.fail(f"{where}.{key}", f"must be plain numbers, got {_show(value)}")
        if any(_is_number(v) and not math.isfinite(v) for v in items):
            check.fail(f"{where}.{key}", f"must be finite, got {_show(value)}")
    if "lr" in group:
        check.number(group["lr"], f"{where}.lr", minimum=0)
    return ids


def _check_param_state(check: _Checker, entry: dict, shape: tuple, where: str) -> None:
    """One parameter's optimizer state: a step count and float32 tensors of the parameter's shape."""
    for key, value in entry.items():
        name = f"{where}.{key}"
        if key == "step":
            if isinstance(value, torch.Tensor):
                check.tensor(value, name, shape=())
                value = float(value)
            check.number(value, name, minimum=0)
        elif isinstance(value, torch.Tensor):
            check.tensor(value, name, shape=shape, dtype=torch.float32)
        else:
            check.fail(name, f"must be a tensor, got {_show(value)}")


_SCHEDULER_TYPES = {"step_size": "int", "gamma": "number", "base_lrs": "numbers", "last_epoch": "int",
                    "_step_count": "int", "_is_initial": "bool", "_get_lr_called_within_step": "bool",
                    "_last_lr": "numbers", "verbose": "bool"}


def _check_scheduler(check: _Checker, scheduler, n_groups: int) -> None:
    scheduler = check.dict(scheduler, "scheduler")
    for key in ("step_size", "gamma", "base_lrs", "last_epoch"):
        check.key(scheduler, key, "scheduler")
    for key, value in scheduler.items():
        kind, name = _SCHEDULER_TYPES.get(key), f"scheduler.{key}"
        if kind is None:  # loading sets attributes of the scheduler: refuse anything unknown
            check.fail(name, "is not part of a StepLR state")
        elif kind == "int":
            check.int(value, name, minimum=1 if key == "step_size" else -1)
        elif kind == "number":
            check.number(value, name, minimum=0)
        elif kind == "bool":
            check.bool(value, name)
        else:
            values = check.list(value, name)
            if len(values) != n_groups:
                check.fail(name, f"has {len(values)} values for {n_groups} parameter groups")
            for i, v in enumerate(values):
                check.number(v, f"{name}[{i}]", minimum=0)


def _check_rng(check: _Checker, rng) -> None:
    rng = check.dict(rng, "rng")
    state = check.tensor(check.key(rng, "torch", "rng"), "rng.torch", shape=tuple(torch.get_rng_state().shape),
                         dtype=torch.uint8)
    try:
        torch.Generator().set_state(state)  # a fresh generator: the global one is not touched
    except Exception as exc:  # noqa: BLE001
        check.fail("rng.torch", f"is not a random generator state ({first_line(exc)})")


def validate_checkpoint(ckpt: dict, path="checkpoint") -> dict:
    """Check the structure of a loaded checkpoint against its format (module docstring); returns it.

    Every field a command reads has its type checked; the model described by ``model`` is
    built on the meta device and compared with ``state_dict``; ``vocab`` has one token per
    row of the word embedding; the recorded loss is registered and its parameters valid;
    ``optimizer``/``scheduler``/``rng``/``ltd``, where present, fit the parameters they
    belong to. Raises one :class:`CocosError` line ``{path}: {field} ...``.
    """
    check = _Checker(path)
    _check_header(check, ckpt, path)
    meta = validate_model(ckpt, path)
    hparams = ckpt["model"]["hparams"]
    train = _check_train(check, ckpt["train"]) if "train" in ckpt else {}
    _check_loss(check, ckpt["loss"])
    _check_data(check, ckpt["data"], hparams, train)
    _check_progress(check, ckpt)
    _check_resume_state(check, ckpt, meta, hparams)
    _check_hash_field(check, ckpt)
    return ckpt


def _check_header(check: _Checker, ckpt, path) -> None:
    """A dict of format ``cocos-checkpoint``, of a version this cocos reads, holding every :data:`REQUIRED` field."""
    check.dict(ckpt, "checkpoint")
    if not isinstance(ckpt.get("format"), str) or ckpt["format"] != FORMAT:
        raise CocosError(f"{path}: not a cocos checkpoint")
    _check_version(ckpt, path)
    missing = [k for k in REQUIRED if k not in ckpt]
    if missing:
        raise CocosError(f"{path}: checkpoint lacks {', '.join(missing)}")


def _optimizer_order(ckpt: dict, meta: torch.nn.Module) -> list[list[tuple]]:
    """The shapes of the model's parameters in the optimizer's order, by parameter group: one group of them all, or
    with ``train.lr_groups`` the trained ones, the rest first, then each group's (as the trainer builds them,
    :func:`cocos.training.config.lr_group_names`); a hook's parameters (LTD's decoder) follow the first group."""
    groups = (ckpt.get("train") or {}).get("lr_groups") if isinstance(ckpt.get("train"), dict) else None
    if not groups or not isinstance(groups, dict):
        return [[tuple(p.shape) for p in meta.parameters()]]
    shape = {n: tuple(p.shape) for n, p in meta.named_parameters() if p.requires_grad}
    return [[shape[n] for n in names] for _, names in lr_group_names(list(shape), groups)]


def _check_resume_state(check: _Checker, ckpt: dict, meta: torch.nn.Module, hparams: dict) -> None:
    """What resuming reads, where present: ``ltd`` (its decoder's parameters follow the model's in the optimizer),
    ``optimizer`` against those parameters' shapes, ``scheduler`` against the optimizer's parameter groups (one
    group without an optimizer), ``rng``."""
    parts = _optimizer_order(ckpt, meta)
    shapes = parts[0]
    if ckpt.get("ltd") is not None:
        decoder = _check_ltd(check, ckpt["ltd"], hparams.get("embed_size"))
        shapes += [tuple(p.shape) for p in decoder.parameters()]
    shapes += [s for part in parts[1:] for s in part]
    if "optimizer" in ckpt:
        _check_optimizer(check, ckpt["optimizer"], shapes, "optimizer")
    if "scheduler" in ckpt:
        groups = ckpt["optimizer"]["param_groups"] if "optimizer" in ckpt else [None]
        _check_scheduler(check, ckpt["scheduler"], len(groups))
    if "rng" in ckpt:
        _check_rng(check, ckpt["rng"])


def _check_hash_field(check: _Checker, ckpt: dict) -> None:
    """``content_sha256``, where present: 64 lowercase hex digits (whether it matches is
    :func:`verify_content_hash`'s check)."""
    value = ckpt.get(HASH_KEY)
    if HASH_KEY in ckpt and (not isinstance(value, str) or not SHA256_HEX.fullmatch(value)):
        check.fail(HASH_KEY, "must be a sha256 hex digest")
