"""The checkpoint's parts as typed records: one declarative schema, checked by :mod:`cocos.typed`.

Each record below says what a part of a checkpoint (:mod:`cocos.training.checkpoint`) must be: the
type of each field, its bounds and shape (:func:`cocos.typed.spec`), the records nested in it. What
the records cannot say (agreement between parts, the registries, the tensors against the modules
they belong to) is checked after them, by :mod:`cocos.training.checkpoint` and
:mod:`cocos.training.ckpt_state`. A :class:`Checker` words every problem as one line
``{file}: {field} {message}``.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, make_dataclass

import torch

from cocos import typed
from cocos.errors import CocosError
from cocos.losses.ltd import LAMBDA_RANGE, MODES
from cocos.models.family import constructor_arguments
from cocos.training.ckpt_hash import SHA256_HEX
from cocos.typed import each, inf, number, spec

SEED_LIMIT = 2**63  # seeds are integers in [0, 2**63): numpy, torch and the synthetic world all take them
ONLY_IMAGES = "applies to raw images (data.input images) only"


# -- the model -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    kind: str  # a registered model family ("vsepp", "vsrn", "vsepp_full", a plugin's)
    hparams: dict = spec(keys=True)  # its constructor's arguments (:func:`hparams_record`)


@dataclass(frozen=True)
class ModelPart:
    """What :func:`~cocos.training.checkpoint.validate_model` reads: the model, its vocabulary, its weights."""

    model: ModelEntry
    vocab: list = spec(items=each("name"))  # index = token id
    state_dict: dict = spec(keys=True)


@functools.cache
def hparams_record(cls) -> type:
    """The record of ``cls``'s constructor arguments (a checkpoint's ``hparams``): the names it takes, each typed by
    its annotation or default (:func:`_hparam_field`), those without a default required, no other name."""
    params = constructor_arguments(cls)
    record = make_dataclass(f"{cls.__name__}Hparams", [(n, *_hparam_field(n, p)) for n, p in params.items()],
                            frozen=True, kw_only=True)
    kind = getattr(cls, "kind", cls.__name__)
    record.EXTRA = f"is not a parameter of the {kind} model (it takes {', '.join(params)})"
    return record


def _hparam_field(name: str, param: inspect.Parameter) -> tuple:
    """One constructor argument, typed by its default: a record (an argument annotated ``dict``: VSE∞'s
    ``bert_config``), a finite number (a float default: VSE∞'s ``region_drop``), a switch, a name (``cnn_type``,
    ``head`` of the raw-image model: the model itself refuses unknown names), or an integer >= 1 (``n_*``,
    ``*_epochs`` and ``*_blocks`` >= 0)."""
    default = param.default
    optional = {} if default is inspect.Parameter.empty else {"default": None}
    if re.fullmatch(r"dict(\[.*\])?( \| None)?", str(param.annotation).replace("typing.", "")):
        return "dict", spec(keys=True, **optional)
    if isinstance(default, float):
        return "finite", spec(**optional)
    if isinstance(default, bool):
        return "bool", spec(**optional)
    if isinstance(default, str):
        return "str", spec(nonempty=True, **optional)
    counts = name.startswith("n_") or name.endswith(("_epochs", "_blocks"))
    return "int", spec(minimum=0 if counts else 1, **optional)


# -- the run: loss, data, progress, the flat training record -----------------------------------------------------


@dataclass(frozen=True)
class LossEntry:
    name: str = spec(nonempty=True)
    params: dict = spec(factory=dict, keys=True, values=each("scalar"))
    compat: bool = False
    presentation: dict | None = None  # how reports show the training loss (Presentation.to_dict), since 0.1 (#29)


@dataclass(frozen=True)
class WeightsEntry:
    """``data.weights`` (since #31): the CNN weights file a raw-image run started from (:mod:`cocos.models.weights`)."""

    file: str = spec(nonempty=True)  # its base name
    sha256: str = spec(pattern=SHA256_HEX.pattern, says="must be 64 lower-case hex digits, got {got}")
    name: str | None = spec(None, nonempty=True)  # the readable name of a known file
    EXTRA = "is not a field of data.weights (file, sha256, name)"


@dataclass(frozen=True)
class DataEntry:
    path: str = spec(nonempty=True)
    fingerprint: str = spec(nonempty=True)  # raw images: the training split's ImageSplit.fingerprint
    k: int = spec(minimum=1)
    feature_shape: list = spec(lengths=(1, 2), says="must be (D,) or (R, D), got {got}", items=each("int", minimum=1))
    input: str = spec("features", choices=("features", "images"), says="must be features or images, got {got}")
    crop_size: int | None = None
    use_restval: bool | None = None
    resize: int | None = None  # raw images: the evaluation Resize the run used (since #31; absent: 256 : 224)
    weights: dict | None = None  # raw images: the CNN weights file, {"file", "sha256", "name"} (since #31)


@dataclass(frozen=True)
class ImageData(DataEntry):
    """``data`` of raw images: the CNN's crop (224 when not recorded), the evaluation Resize, the weights file."""

    crop_size: int | None = spec(None, minimum=8)
    resize: int | None = spec(None, minimum=1)
    weights: WeightsEntry | None = None


@dataclass(frozen=True)
class FeatureData(DataEntry):
    """``data`` of precomputed features: no evaluation transform, no weights file."""

    resize: int | None = spec(None, choices=(None,), says=ONLY_IMAGES)
    weights: dict | None = spec(None, choices=(None,), says=ONLY_IMAGES)


@dataclass(frozen=True)
class Progress:
    epoch: int = spec(minimum=0)
    step: int = spec(0, minimum=0)  # optimizer steps taken (absent before LTD: 0)
    metrics: dict | None = spec(None, values=each("number"))
    best_rsum: inf | None = None  # -inf before the first validation ("inf": a number, infinity allowed)
    history: list | None = spec(None, items=each("dict", keys=True, values=each("number")))
    library_version: str | None = None


@dataclass(frozen=True)
class TrainUsed:
    """The fields of ``train`` that commands read as numbers: present, they are never a missing value."""

    batch_size: int = spec(None, minimum=1)
    k: int = spec(None, minimum=1)
    seed: int = spec(None, minimum=0, maximum=SEED_LIMIT - 1)


@dataclass(frozen=True)
class Hash:
    content_sha256: any = spec(None, pattern=SHA256_HEX.pattern, says="must be a sha256 hex digest")


# -- the resume state: optimizer, scheduler, rng, LTD ------------------------------------------------------------


@dataclass(frozen=True)
class ParamGroup:
    """One parameter group of a torch optimizer: the parameter ids it names and plain finite settings (its ``lr``
    then a number >= 0: :func:`cocos.training.ckpt_state.check_optimizer`)."""

    params: list = spec(items=each("int", minimum=0))
    EXTRA = each("setting")


@dataclass(frozen=True)
class OptimizerState:
    state: dict  # parameter id -> its state (:func:`cocos.training.ckpt_state.check_optimizer`)
    param_groups: list = spec(items=each(ParamGroup))


@dataclass(frozen=True)
class StepLRState:
    """A StepLR's state dict: loading sets attributes of the scheduler, so anything unknown is refused."""

    step_size: int = spec(minimum=1)
    gamma: number = spec(minimum=0)
    base_lrs: list = spec(items=each("number", minimum=0))  # one per parameter group
    last_epoch: int = spec(minimum=-1)
    _step_count: int = spec(None, minimum=-1)
    _is_initial: bool = None
    _get_lr_called_within_step: bool = None
    _last_lr: list = spec(None, items=each("number", minimum=0))
    verbose: bool = None
    EXTRA = "is not part of a StepLR state"


@dataclass(frozen=True)
class RNGState:
    torch: object  # the global generator's state (:func:`cocos.training.ckpt_state.check_rng`)


@dataclass(frozen=True, kw_only=True)
class LTDEntry:
    """``ltd`` (with ``--ltd``): the decoder, its settings and, in constraint mode, the multiplier."""

    mode: any = spec(choices=MODES)
    eta: number = spec(above=0)
    beta: number = spec(minimum=0)
    targets: str | None = None
    hparams: dict = spec(keys=True)  # TargetDecoder's arguments (:func:`hparams_record`)
    decoder: dict = spec(keys=True)  # its state dict


@dataclass(frozen=True, kw_only=True)
class ConstraintLTD(LTDEntry):
    lambda_: number = spec(key="lambda", minimum=LAMBDA_RANGE[0], maximum=LAMBDA_RANGE[1])
    lambda_optimizer: OptimizerState = None  # optional, never null


# -- one line per problem --------------------------------------------------------------------------------------


def show(value) -> str:
    """A short one-line description of a value for an error message."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (dict, list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__}"


class Checker:
    """Raises one CocosError line ``{where}: {field} ...``."""

    def __init__(self, where) -> None:
        self.where = str(where)

    def fail(self, name: str, message: str) -> None:
        text = f"{self.where}: {name} {message}"
        raise CocosError(text.replace("\r", "\\r").replace("\n", "\\n"))

    def record(self, cls, node, name: str, *, complete: bool = True) -> dict:
        """``node`` as a ``cls`` record (:func:`cocos.typed.check_record`); ``name`` "" for the top level."""
        found = typed.check_record(cls, node, show, complete=complete)
        if found is not None:
            self.fail(f"{name}{found[0]}" if name else found[0][1:] or "checkpoint", found[1])
        return node

    def value(self, value, name: str, annotation: str, **rules):
        """One value against an annotation and :class:`cocos.typed.Rule` ``rules``."""
        found = typed.check(value, annotation, typed.Rule(**rules), show)
        if found is not None:
            self.fail(name + found[0], found[1])
        return value

    def tensors(self, state, reference: dict, name: str, what: str) -> None:
        """``state`` holds exactly the tensors of ``reference`` (a meta module's state dict): names, shapes, dtypes."""
        state = self.value(state, name, "dict", keys=True)
        missing = [k for k in reference if k not in state]
        if missing:
            self.fail(name, f"lacks {missing[0]} ({len(missing)} of the {what}'s {len(reference)} tensors missing)")
        extra = [k for k in state if k not in reference]
        if extra:
            self.fail(name, f"holds {extra[0]}, which the {what} does not have")
        for key, ref in reference.items():
            self.tensor(state[key], f"{name}[{key!r}]", tuple(ref.shape), ref.dtype)

    def tensor(self, value, name: str, shape: tuple | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A dense tensor of ``shape`` and the kind of ``dtype``: any floating point dtype for a floating ``dtype``
        (weights may be saved in half precision), else exactly ``dtype``. Values are not judged: NaN weights are a
        model's state, found where they make NaN embeddings."""
        if not isinstance(value, torch.Tensor):
            self.fail(name, f"must be a tensor, got {show(value)}")
        if value.layout != torch.strided or value.is_quantized or value.device.type == "meta":
            self.fail(name, "must be a plain dense tensor")
        if shape is not None and tuple(value.shape) != tuple(shape):
            self.fail(name, f"has shape {tuple(value.shape)}, expected {tuple(shape)}")
        if dtype is not None and dtype.is_floating_point and not value.dtype.is_floating_point:
            self.fail(name, f"has dtype {value.dtype}, expected a floating point dtype ({dtype})")
        if dtype is not None and not dtype.is_floating_point and value.dtype != dtype:
            self.fail(name, f"has dtype {value.dtype}, expected {dtype}")
        return value
