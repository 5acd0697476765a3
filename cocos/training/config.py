"""A training run's settings, in sections: what is read, the model, the loss, the optimisation, the hooks.

Each default is written once, here (the schedule's in :mod:`cocos.defaults`, a model family's own
hyper-parameters in its spec, a loss's in its spec, LTD's in :mod:`cocos.losses.ltd_config`);
``cocos train``'s flags take theirs from these classes (:func:`default`). Torch-free, so the command
line reads it before anything heavy is imported.

A run is also written down flat, one name per flag (``cocos train --lr 2e-4`` is ``lr``): the
``train`` record of a checkpoint, a sweep's grid, the keywords of :meth:`TrainConfig.of`.
:data:`FLAT` maps each flat name to its section and field; :meth:`TrainConfig.flat` writes the record
(the names and order of earlier versions, so their checkpoints read and resume; settings added since
appear only where they differ from their default).

Per-parameter-group learning rates and AdamW need no trainer code: ``OptimConfig.optimizer``
``"adamw"`` with ``weight_decay``, and ``lr_groups`` ``{prefix: factor}`` trains the parameters
whose names start with ``prefix`` at ``factor × lr`` (VSE∞ trains its BERT at a tenth:
``{"txt_enc.bert": 0.1}``); the longest matching prefix wins.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from cocos.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CROP_SIZE,
    DEFAULT_EPOCHS,
    DEFAULT_GRAD_CLIP,
    DEFAULT_LR,
    DEFAULT_LR_UPDATE,
)
from cocos.errors import CocosError
from cocos.losses.ltd_config import LTDConfig

OPTIMIZERS = ("adam", "adamw")


@dataclass
class DataConfig:
    """What a run reads: the data folder or image dataset, captions per image, the vocabulary, raw-image decoding."""

    path: str
    k: int = 5
    vocab: str | None = None  # a SCAN-style vocab JSON instead of building one from the training captions
    vocab_threshold: int = 4  # words seen fewer times are <unk>
    use_restval: bool = False  # Karpathy JSON: restval joins train
    crop_size: int = DEFAULT_CROP_SIZE  # raw images: training crop and evaluation centre crop
    workers: int = 0  # DataLoader workers decoding images (does not change the result)
    # raw images: the evaluation Resize; None: the CNN weights file's own when it is a known one
    # (cocos.models.weights.evaluation_transform: 232 for torchvision's V2 ResNets), else round(256 * crop / 224)
    resize: int | None = None


@dataclass
class ModelConfig:
    """The model family (:mod:`cocos.models.registry`) and its own hyper-parameters (``None``: the family's
    defaults); ``cnn_weights``: the weights file of a raw-image family's CNN; ``sources``: the pre-trained sources
    the family starts from, ``{source name: path}`` (:attr:`cocos.models.family.ModelFamily.sources`: VSE∞'s
    ``bert`` folder, a ``clip`` run's CLIP folder, a plugin family's own)."""

    name: str = "vsepp"
    params: dict | None = None
    cnn_weights: str | None = None
    sources: dict | None = None  # {source name: path}: `cocos train --source NAME=PATH` (or --bert / --clip)

    def source(self, name: str) -> str | None:
        """The path given for the source ``name`` (None: not given)."""
        return (self.sources or {}).get(name)


@dataclass
class LossConfig:
    """The loss family (:mod:`cocos.objectives`), its parameters (``None``: the spec's defaults), counting mode, and
    ``warmup_epochs`` of the family's warm-up loss first (VSE∞ practice); ``learn_tau``: the temperature is learned as
    CLIP learns it (:class:`cocos.losses.base.LearnedTemperature`)."""

    name: str = "triplet_sh"
    params: dict | None = None
    compat: bool = False
    warmup_epochs: int = 0
    learn_tau: bool = False  # the loss's softmax temperature is the model's learned logit_scale (CLIP)


@dataclass
class OptimConfig:
    """The optimisation and schedule (VSE++'s): Adam, ``lr`` dropped x0.1 every ``lr_update`` epochs, gradient norm
    clipped at ``grad_clip`` (0: none), batches of ``batch_size`` seeded by ``seed`` (module docstring: AdamW and
    per-group rates)."""

    epochs: int = DEFAULT_EPOCHS
    lr: float = DEFAULT_LR
    lr_update: int = DEFAULT_LR_UPDATE
    batch_size: int = DEFAULT_BATCH_SIZE
    grad_clip: float = DEFAULT_GRAD_CLIP
    optimizer: str = "adam"
    weight_decay: float = 0.0
    lr_groups: dict | None = None  # {parameter-name prefix: factor of lr}
    seed: int = 0


@dataclass
class HookConfig:
    """What a run adds to the loop (:mod:`cocos.training.hooks`): LTD, COCOS tracking every N steps, checkpoints
    every K epochs, TensorBoard event files (``OUT/tensorboard/``; records of earlier versions lack it: off)."""

    ltd: LTDConfig | None = None
    track_cocos: int | None = None
    save_every: int | None = None
    tensorboard: bool = False


@dataclass
class TrainConfig:
    """A run: its sections, the output folder and the device (module docstring)."""

    data: DataConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    hooks: HookConfig = field(default_factory=HookConfig)
    out: str = "checkpoints/run"
    device: str = "auto"

    @classmethod
    def of(cls, **flat) -> TrainConfig:
        """A run from flat settings (:data:`FLAT`; a checkpoint's ``train`` record, a sweep's grid, keywords)."""
        return from_flat(flat)

    def flat(self) -> dict:
        """The flat record of the run (module docstring)."""
        return to_flat(self)

    def record(self) -> dict:
        """The run as a checkpoint records it, in its sections (:func:`to_record`)."""
        return to_record(self)

    def validate(self) -> None:
        """Refuse nonsense settings before anything is read or written (:func:`cocos.training.checks.validate`)."""
        from cocos.training.checks import validate  # the checks need the registries: imported when used

        validate(self)

    def images(self) -> bool:
        """Whether ``data`` is a raw-image dataset (looked up on disk; nothing is read)."""
        from cocos.data.images import is_image_dataset

        return is_image_dataset(self.data.path)

    def loss_params(self) -> dict:
        """The loss parameters given (``None``: the spec's default)."""
        return loss_params_of({"params": self.loss.params})


def default(section: type, name: str):
    """The default of a section's field: what a flag of ``cocos train`` shows and takes."""
    for item in dataclasses.fields(section):
        if item.name == name:
            return item.default if item.default is not dataclasses.MISSING else item.default_factory()
    raise KeyError(name)


# -- the flat record --------------------------------------------------------------------------------------------

# flat name -> (section, field); the model family's hyper-parameters that earlier versions recorded flat are
# MODEL_FLAT, old loss settings LOSS_FLAT
FLAT = {"data": ("data", "path"), "model": ("model", "name"), "loss": ("loss", "name"), "out": ("", "out"),
        "epochs": ("optim", "epochs"), "lr": ("optim", "lr"), "lr_update": ("optim", "lr_update"),
        "batch_size": ("optim", "batch_size"), "params": ("loss", "params"), "grad_clip": ("optim", "grad_clip"),
        "warmup_epochs": ("loss", "warmup_epochs"), "vocab_threshold": ("data", "vocab_threshold"),
        "k": ("data", "k"), "seed": ("optim", "seed"), "device": ("", "device"), "compat": ("loss", "compat"),
        "vocab": ("data", "vocab"), "track_cocos": ("hooks", "track_cocos"), "save_every": ("hooks", "save_every"),
        "cnn_weights": ("model", "cnn_weights"), "crop_size": ("data", "crop_size"),
        "use_restval": ("data", "use_restval"), "workers": ("data", "workers"),
        "optimizer": ("optim", "optimizer"), "weight_decay": ("optim", "weight_decay"),
        "lr_groups": ("optim", "lr_groups"), "model_params": ("model", "params"), "sources": ("model", "sources"),
        "learn_tau": ("loss", "learn_tau"), "resize": ("data", "resize"), "tensorboard": ("hooks", "tensorboard")}
MODEL_FLAT = {"embed_size": "embed_size", "word_dim": "word_dim", "cnn": "cnn_type", "finetune": "finetune"}
LTD_FLAT = {"ltd_mode": "mode", "ltd_eta": "eta", "ltd_beta": "beta", "ltd_targets": "targets"}
LOSS_FLAT = ("margin", "tau")  # settings of their own beside params before loss parameters were the spec's flags
# the record's names in the order earlier versions wrote them
ORDER = ("data", "model", "loss", "out", "epochs", "lr", "lr_update", "batch_size", "embed_size", "word_dim",
         "params", "grad_clip", "warmup_epochs", "vocab_threshold", "k", "seed", "device", "compat", "vocab", "ltd",
         "ltd_mode", "ltd_eta", "ltd_beta", "ltd_targets", "track_cocos", "save_every", "cnn", "cnn_weights",
         "finetune", "crop_size", "use_restval", "workers")
# settings added since, written where they differ from their default (an earlier run had the default)
ADDED_DEFAULTS = {"optimizer": default(OptimConfig, "optimizer"), "weight_decay": default(OptimConfig, "weight_decay"),
                  "lr_groups": None, "model_params": None, "sources": None, "learn_tau": False,
                  "resize": None, "tensorboard": default(HookConfig, "tensorboard")}
SECTIONS = {"data": DataConfig, "model": ModelConfig, "loss": LossConfig, "optim": OptimConfig, "hooks": HookConfig}


def _annotation(section: type, name: str) -> str:
    return next(str(f.type) for f in dataclasses.fields(section) if f.name == name)


def record_type() -> type:
    """The flat record as a record type (each flat name with its field's annotation, and each registered source's
    name, the spelling ``bert=DIR`` of ``sources``), for :func:`cocos.typed.problem`: generated from the sections
    and the registry, not written again."""
    owners = {"": TrainConfig, **SECTIONS}
    items = [(n, _annotation(owners[s], f)) for n, (s, f) in FLAT.items()]
    items += [(n, _annotation(LTDConfig, f)) for n, f in LTD_FLAT.items()]
    items += [("ltd", "bool"), ("embed_size", "int | None"), ("word_dim", "int | None"), ("cnn", "str | None"),
              ("finetune", "bool")]
    items += [(n, "float | None") for n in LOSS_FLAT]
    from cocos.models.registry import source_names  # a source under its own name (bert=DIR): a path

    items += [(n, "str | None") for n in source_names() if n not in dict(items)]
    return dataclasses.make_dataclass("TrainRecord", [(n, t, field(default=None)) for n, t in items])


def names() -> list[str]:
    """Every flat name :meth:`TrainConfig.of` takes."""
    return [*FLAT, *MODEL_FLAT, "ltd", *LTD_FLAT, *LOSS_FLAT]


def sections_of(flat: dict) -> dict[str, dict]:
    """Flat settings as ``{section: {field: value}}`` (``""``: the run's own fields) plus ``ltd``: the LTD fields
    given; an unknown name is one line."""
    flat = _spelled_sources(flat)
    unknown = [k for k in flat if k not in names()]
    if unknown:
        raise CocosError(f"no training setting {', '.join(sorted(unknown))} (settings: {', '.join(names())})")
    out: dict[str, dict] = {s: {} for s in ("", *SECTIONS, "ltd")}
    for name, value in flat.items():
        if name in FLAT and name not in ("model_params", "params"):
            section, item = FLAT[name]
            out[section][item] = value
        elif name in LTD_FLAT:
            out["ltd"][LTD_FLAT[name]] = value
    for section, params in (("model", _model_flat(flat)), ("loss", _loss_flat(flat))):
        if params:
            out[section]["params"] = params
    return out


def _spelled_sources(flat: dict) -> dict:
    """Pre-trained sources given under their own names (``bert=DIR``, ``clip=DIR``: ``cocos train --bert``, and the
    flat records of earlier versions) moved into ``sources``: any name of a registered family's source."""
    spelled = [k for k in flat if k not in names()]
    if not spelled:
        return flat
    from cocos.models.registry import source_names  # the registries: imported when a spelling is used

    known = source_names()
    moved = {k: flat[k] for k in spelled if k in known and flat[k] is not None}
    given = {**(flat.get("sources") or {}), **moved}
    rest = {k: v for k, v in flat.items() if not (k in known and k in spelled)}
    return {**rest, "sources": given or None} if given or "sources" in flat else rest


RECORD_SECTIONS = ("data", "model", "loss", "optim", "hooks")


def is_sectioned(train) -> bool:
    """Whether a ``train`` record holds the run's sections (this version's) rather than flat names (earlier
    versions', a converted original checkpoint's)."""
    return isinstance(train, dict) and all(isinstance(train.get(s), dict) for s in RECORD_SECTIONS[:-1])


def to_record(cfg: TrainConfig) -> dict:
    """The run as a checkpoint records it: its sections, field by field (``hooks.ltd``: LTD's fields, or None), and
    the output folder and device."""
    return {**{s: dataclasses.asdict(getattr(cfg, s)) for s in RECORD_SECTIONS}, "out": cfg.out, "device": cfg.device}


def from_record(train: dict) -> TrainConfig:
    """The run a ``train`` record describes: its sections (:func:`to_record`), or an earlier version's flat names
    (:func:`from_flat`). A section or field this version does not know is one line (read after the record's name:
    ``train holds ...``)."""
    if not is_sectioned(train):
        return from_flat({k: v for k, v in _spelled_sources(dict(train)).items() if k in names()})
    _check_sections(train)
    hooks = dict(train.get("hooks", {}))
    ltd = hooks.pop("ltd", None)
    try:
        return TrainConfig(**{s: SECTIONS[s](**train[s]) for s in RECORD_SECTIONS[:-1]},
                           hooks=HookConfig(ltd=None if ltd is None else LTDConfig(**ltd), **hooks),
                           **{k: train[k] for k in ("out", "device") if k in train})
    except TypeError as exc:
        raise CocosError(f"does not fit a run's sections ({exc})") from None


def _check_sections(train: dict) -> None:
    """A sectioned ``train`` record holds only a run's sections, each a record of named fields (one line else)."""
    unknown = sorted(set(train) - {*RECORD_SECTIONS, "out", "device"})
    if unknown:
        raise CocosError(f"holds {', '.join(map(str, unknown))}, which is no section of a run (sections: "
                         f"{', '.join(RECORD_SECTIONS)}, out, device)")
    hooks = train.get("hooks", {})
    for name, section in [*((s, train[s]) for s in RECORD_SECTIONS[:-1]), ("hooks", hooks),
                          ("hooks.ltd", hooks.get("ltd") if isinstance(hooks, dict) else None)]:
        if section is not None and not (isinstance(section, dict) and all(isinstance(k, str) for k in section)):
            raise CocosError(f"does not fit a run's sections ({name} is not a record of named fields)")


def record_flat(train: dict) -> dict:
    """A checkpoint's recorded ``train`` in today's flat form, the one read-only mapping of every record written so
    far (the record is not changed): this version's sections through :func:`from_record`; an earlier version's flat
    names with their spellings (``bert``, ``clip``) as ``sources`` and no ``ltd`` as none; each setting added since
    at its default."""
    if is_sectioned(train):
        cfg = from_record(train)
        try:
            return {**ADDED_DEFAULTS, **cfg.flat()}
        except Exception as exc:  # noqa: BLE001 - a field of another type than its section's (a damaged record)
            raise CocosError(f"does not fit a run's sections ({type(exc).__name__}: {str(exc)[:80]})") from None
    return {**ADDED_DEFAULTS, "ltd": False, **_spelled_sources(dict(train))}


def _loss_flat(flat: dict) -> dict:
    """The loss parameters: ``params``, and ``margin``/``tau`` of records written before they were the spec's."""
    return {**{k: flat[k] for k in LOSS_FLAT if flat.get(k) is not None}, **(flat.get("params") or {})}


def loss_params_of(flat: dict) -> dict:
    """The loss parameters a flat record gives, those left at ``None`` (the spec's default) dropped: the spec
    refuses what the loss does not take."""
    return {k: v for k, v in _loss_flat(flat).items() if v is not None}


def _model_flat(flat: dict) -> dict:
    """The model hyper-parameters: ``model_params``, and those given under their flat names (``finetune`` false is
    the default: not given)."""
    named = {MODEL_FLAT[n]: v for n, v in flat.items()
             if n in MODEL_FLAT and v is not None and not (n == "finetune" and v is False)}
    return {**(flat.get("model_params") or {}), **named}


def from_flat(flat: dict) -> TrainConfig:
    """:meth:`TrainConfig.of`. LTD settings without ``ltd`` are refused in one line (they would do nothing)."""
    parts = sections_of(flat)
    ltd = None
    if flat.get("ltd"):
        ltd = LTDConfig(**{k: v for k, v in parts["ltd"].items() if v is not None})
    else:
        changed = [f"--{n.replace('_', '-')}" for n, f in LTD_FLAT.items()
                   if n in flat and flat[n] != getattr(LTDConfig, f)]
        if changed:
            raise CocosError(f"{', '.join(changed)} only apply with --ltd")
    if "path" not in parts["data"]:
        raise CocosError("a training run needs its data (data=...)")
    return TrainConfig(data=DataConfig(**parts["data"]), model=ModelConfig(**parts["model"]),
                       loss=LossConfig(**parts["loss"]), optim=OptimConfig(**parts["optim"]),
                       hooks=HookConfig(ltd=ltd, **parts["hooks"]), **parts[""])


def to_flat(cfg: TrainConfig) -> dict:
    """The flat record (module docstring): the model's hyper-parameters that earlier versions recorded flat under
    their flat names (``embed_size``, ``word_dim``, ``cnn``, ``finetune``), any others under ``model_params``."""
    params = dict(cfg.model.params or {})
    ltd = cfg.hooks.ltd
    values = {"ltd": ltd is not None, **{n: getattr(ltd or LTDConfig(), f) for n, f in LTD_FLAT.items()}}
    for name, item in MODEL_FLAT.items():
        values[name] = params.pop(item, False if name == "finetune" else None)
    for name, (section, item) in FLAT.items():
        values.setdefault(name, getattr(getattr(cfg, section) if section else cfg, item))
    values["model_params"] = params or None
    out = {name: values[name] for name in ORDER}
    out.update({name: values[name] for name, value in ADDED_DEFAULTS.items() if values[name] != value})
    return out


def lr_group_names(names: list[str], groups: dict | None) -> list[tuple[str | None, list[str]]]:
    """The optimiser's parameter groups by parameter name, in the order it holds them: ``(None, the rest)`` first,
    then ``(prefix, names)`` for each prefix of ``groups`` (longest first; the longest matching prefix wins) that
    names any. The trainer builds its groups with it and the checkpoint validator reads a saved optimizer's
    state in this order."""
    prefixes = sorted(groups or {}, key=len, reverse=True)
    named: dict[str | None, list[str]] = {None: [], **{p: [] for p in prefixes}}
    for name in names:
        named[next((p for p in prefixes if name.startswith(p)), None)].append(name)
    return [(None, named[None])] + [(p, named[p]) for p in prefixes if named[p]]


def _finite(value, least: float = 0.0) -> bool:
    """A finite number (not a bool) of at least ``least``."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and least <= value < math.inf


def check_optim(optim: OptimConfig) -> None:
    """The optimiser's settings, one line for the first bad one."""
    if optim.optimizer not in OPTIMIZERS:
        raise CocosError(f"unknown --optimizer '{optim.optimizer}' (choose from {', '.join(OPTIMIZERS)})")
    if not _finite(optim.weight_decay):
        raise CocosError(f"--weight-decay must be a finite number >= 0, got {optim.weight_decay!r}")
    if optim.weight_decay and optim.optimizer == "adam":
        raise CocosError("--weight-decay applies to --optimizer adamw (Adam's L2 penalty is not weight decay)")
    for prefix, factor in (optim.lr_groups or {}).items():
        if not isinstance(prefix, str) or not prefix:
            raise CocosError(f"--lr-group: a parameter-name prefix must be a non-empty name, got {prefix!r}")
        if not _finite(factor):
            raise CocosError(f"--lr-group {prefix}: the factor must be a finite number >= 0, got {factor!r}")
    if not _finite(optim.grad_clip):
        raise CocosError(f"gradient clipping must be a finite number >= 0, got {optim.grad_clip!r}")
