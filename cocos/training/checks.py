"""A run's settings completed and checked, before anything is read or written: the resolution's first half.

:func:`with_recipe` fills the settings a run does not set from its model family's recipe (VSE∞'s AdamW, rates,
schedule and warm-up); :func:`validate` refuses nonsense settings in one :class:`~cocos.errors.CocosError` line
each and resolves the family the run trains (on raw images a feature family gives way to its images family,
``vsepp`` -> ``vsepp_full``) with its hyper-parameters filled in. The registries are looked up here and in
:mod:`cocos.training.setup`, nowhere else in the training layer: the checks loop over the family's declared
sources and the objective's declared temperature and never name a family.
"""

from __future__ import annotations

from cocos.data.transforms import check_image_sizes
from cocos.defaults import DEFAULT_CROP_SIZE
from cocos.device import check_device_name
from cocos.errors import CocosError, check_params
from cocos.models.registry import families, get_family, source_names, training_family
from cocos.objectives import OBJECTIVES, get_loss, get_objective
from cocos.training.checkpoint import SEED_LIMIT
from cocos.training.config import LossConfig, ModelConfig, OptimConfig, TrainConfig, check_optim, loss_params_of
from cocos.training.pixels import eval_resize

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
    loss = flat.get("loss") if given("loss") else recipe.get("loss", flat.get("loss"))  # a SigLIP's: siglip
    objective = get_objective(loss or LossConfig().name)
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
    """The family's pre-trained sources (:attr:`~cocos.models.family.ModelFamily.sources`) each given (``--source
    NAME=PATH``, or ``--NAME PATH``), a source that brings the caption coder taking no ``--vocab``; a source the
    family does not take (another family's, or none's) refused. A resumed run takes them from its checkpoint
    (:func:`cocos.training.setup.read_captions`)."""
    given = cfg.model.sources or {}
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise CocosError(f"--source takes NAME=PATH items, got {given!r}")
    for source in family.sources:
        if not cfg.model.source(source.name):
            raise CocosError(f"--model {family.name} needs --{source.name} {source.metavar} (or --source "
                             f"{source.name}={source.metavar}): {source.what}")
        if cfg.data.vocab and source.coder_words:
            raise CocosError(f"--model {family.name} codes captions with {source.coder_words}; --vocab does not "
                             "apply")
    takers = source_names()
    for name in sorted(set(given) - {s.name for s in family.sources}):
        if name in takers:
            raise CocosError(f"--{name} applies to {', '.join(takers[name])}, not to --model {family.name}")
        known = "; ".join(f"{n} ({', '.join(f)})" for n, f in takers.items()) or "none"
        raise CocosError(f"--source {name}: no model family takes a source of that name (sources: {known})")


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
    _check_learned(cfg)


def _check_learned(cfg: TrainConfig) -> None:
    """The objective's learned parameters (SigLIP's ``t``, ``b``) start from the model's where it holds them (a
    CLIP's ``logit_scale``): a value given for one of those would be ignored, so it is one line."""
    objective, family = get_objective(cfg.loss.name), get_family(cfg.model.name)
    given = cfg.loss_params()
    for name, spec in objective.learned.items():
        if given.get(name) is not None and hasattr(family.module, spec.attr):
            raise CocosError(f"--{name}: the {family.label} model's own {spec.attr} is the {objective.label} loss's "
                             f"{name}, learned from its value; leave --{name} out")


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
