"""A checkpoint's tensors against the modules they belong to: the model and LTD decoder built on the meta device
(shapes only, nothing allocated), and the resume state (``optimizer``, ``scheduler``, ``rng``, ``ltd``) against
the parameters it is for. The records of these parts are :mod:`cocos.training.ckpt_schema`'s; this module checks
what depends on the model: the shapes, the parameter order, the number of parameter groups.
"""

from __future__ import annotations

import contextlib

import torch

from cocos import typed
from cocos.errors import CocosError
from cocos.losses.ltd import TargetDecoder
from cocos.models.noinit import weights_to_be_loaded
from cocos.safeload import first_line
from cocos.training.ckpt_schema import (
    Checker,
    ConstraintLTD,
    LTDEntry,
    OptimizerState,
    RNGState,
    StepLRState,
    hparams_record,
    show,
)
from cocos.training.config import lr_group_names


@contextlib.contextmanager
def _on_meta_device():
    """Build modules on the meta device, their random initialisers skipped
    (:func:`~cocos.models.noinit.weights_to_be_loaded`): shapes only, and ``nn.init.normal_`` of a meta tensor would
    import torch's Python reference ops (a second of start-up for every command)."""
    with weights_to_be_loaded(), torch.device("meta"):
        yield


def meta_module(check: Checker, name: str, build):
    """Build a module on the meta device (shapes only, no memory); a failure is one line."""
    try:
        with _on_meta_device():
            return build()
    except CocosError as exc:
        check.fail(name, f"do not describe a valid model ({exc})")
    except Exception as exc:  # noqa: BLE001 - whatever a nonsense size makes torch raise
        check.fail(name, f"do not describe a valid model ({first_line(exc)})")


def check_hparams(check: Checker, cls, hparams, name: str) -> dict:
    """Constructor arguments of ``cls`` (:func:`~cocos.training.ckpt_schema.hparams_record`)."""
    return check.record(hparams_record(cls), hparams, name)


def check_resume_state(check: Checker, ckpt: dict, meta: torch.nn.Module, train: dict) -> None:
    """What resuming reads, where present: ``ltd`` (its decoder's parameters follow the model's first group in the
    optimizer), ``learned`` (a loss's own parameters, after them), ``optimizer`` against those parameters'
    shapes, ``scheduler`` against the optimizer's parameter groups (one group without an optimizer), ``rng``."""
    parts = _optimizer_order(meta, train.get("lr_groups"))
    shapes = parts[0]
    if ckpt.get("ltd") is not None:
        decoder = check_ltd(check, ckpt["ltd"], ckpt["model"]["hparams"].get("embed_size"))
        shapes += [tuple(p.shape) for p in decoder.parameters()]
    if ckpt.get("learned") is not None:  # a loss's own learned parameters follow the hooks' before them
        shapes += [tuple(v.shape) for v in check_learned(check, ckpt["learned"]).values()]
    shapes += [s for part in parts[1:] for s in part]
    if "optimizer" in ckpt:
        check_optimizer(check, ckpt["optimizer"], shapes, "optimizer")
    if "scheduler" in ckpt:
        groups = ckpt["optimizer"]["param_groups"] if "optimizer" in ckpt else [None]
        check_scheduler(check, ckpt["scheduler"], len(groups))
    if "rng" in ckpt:
        check_rng(check, ckpt["rng"])


def _optimizer_order(meta: torch.nn.Module, groups) -> list[list[tuple]]:
    """The shapes of the model's parameters in the optimizer's order, by parameter group: one group of them all, or
    with ``train.lr_groups`` the trained ones, the rest first, then each group's (as the trainer builds them,
    :func:`cocos.training.config.lr_group_names`); a hook's parameters (LTD's decoder) follow the first group."""
    if not groups or not isinstance(groups, dict):
        return [[tuple(p.shape) for p in meta.parameters()]]
    shape = {n: tuple(p.shape) for n, p in meta.named_parameters() if p.requires_grad}
    return [[shape[n] for n in names] for _, names in lr_group_names(list(shape), groups)]


def check_learned(check: Checker, learned) -> dict:
    """``learned``: a loss's own learned parameters (SigLIP's ``logit_scale``, ``logit_bias`` on a model without
    them), each a finite floating-point scalar tensor by name."""
    check.value(learned, "learned", "dict", keys=True)
    for name, value in learned.items():
        if not isinstance(value, torch.Tensor) or value.dim() != 0 or not value.is_floating_point() \
                or not bool(torch.isfinite(value)):
            check.fail(f"learned.{name}", f"must be a finite scalar tensor, got {show(value)}")
    return learned


def check_ltd(check: Checker, ltd, embed_size) -> torch.nn.Module:
    """``ltd``: its record, the decoder's arguments (embedding what the model embeds) and state dict, and in
    constraint mode the multiplier's optimizer; returns the decoder on the meta device."""
    constraint = isinstance(ltd, dict) and ltd.get("mode") == "constraint"
    ltd = check.record(ConstraintLTD if constraint else LTDEntry, ltd, "ltd")
    hparams = check_hparams(check, TargetDecoder, ltd["hparams"], "ltd.hparams")
    if embed_size is not None and hparams.get("embed_size") != embed_size:
        check.fail("ltd.hparams.embed_size", f"is {hparams.get('embed_size')} but the model embeds into {embed_size}")
    decoder = meta_module(check, "ltd.hparams", lambda: TargetDecoder(**hparams))
    check.tensors(ltd["decoder"], decoder.state_dict(), "ltd.decoder", "LTD decoder")
    if constraint and "lambda_optimizer" in ltd:
        check_optimizer(check, ltd["lambda_optimizer"], [()], "ltd.lambda_optimizer")
    return decoder


def check_optimizer(check: Checker, opt, shapes: list[tuple], name: str) -> None:
    """A torch optimizer's state dict for parameters of ``shapes`` (in the order the optimizer holds them): every
    parameter in one group, and the state of each a step count and float32 tensors of its shape."""
    opt = check.record(OptimizerState, opt, name)
    for g, group in enumerate(opt["param_groups"]):
        if "lr" in group:
            check.value(group["lr"], f"{name}.param_groups[{g}].lr", "number", minimum=0)
    ids = [pid for group in opt["param_groups"] for pid in group["params"]]
    if len(ids) != len(shapes) or len(set(ids)) != len(ids):
        check.fail(name, f"covers {len(set(ids))} parameters, but the model has {len(shapes)}")
    shape_of = dict(zip(ids, shapes, strict=True))
    for pid, entry in opt["state"].items():
        if not typed.TESTS["int"](pid) or pid not in shape_of:
            check.fail(f"{name}.state", f"holds the state of parameter {show(pid)}, which no group names")
        _check_param_state(check, entry, shape_of[pid], f"{name}.state[{pid}]")


def _check_param_state(check: Checker, entry, shape: tuple, where: str) -> None:
    """One parameter's optimizer state: a step count (a number or a 0-d tensor) and float32 tensors of its shape."""
    for key, value in check.value(entry, where, "dict", keys=True).items():
        if key != "step":
            check.tensor(value, f"{where}.{key}", shape=shape, dtype=torch.float32)
            continue
        if isinstance(value, torch.Tensor):
            value = float(check.tensor(value, f"{where}.{key}", shape=()))
        check.value(value, f"{where}.{key}", "number", minimum=0)


def check_scheduler(check: Checker, scheduler, n_groups: int) -> None:
    """A StepLR's state (:class:`~cocos.training.ckpt_schema.StepLRState`) with one rate per parameter group."""
    for key in ("base_lrs", "_last_lr"):  # a list of another length is named as such, before its items are checked
        values = scheduler.get(key) if isinstance(scheduler, dict) else None
        if isinstance(values, (list, tuple)) and len(values) != n_groups:
            check.fail(f"scheduler.{key}", f"has {len(values)} values for {n_groups} parameter groups")
    check.record(StepLRState, scheduler, "scheduler")


def check_rng(check: Checker, rng) -> None:
    """``rng.torch``: a state of torch's generator (tried on a fresh generator: the global one is not touched)."""
    rng = check.record(RNGState, rng, "rng")
    state = check.tensor(rng["torch"], "rng.torch", shape=tuple(torch.get_rng_state().shape), dtype=torch.uint8)
    try:
        torch.Generator().set_state(state)
    except Exception as exc:  # noqa: BLE001
        check.fail("rng.torch", f"is not a random generator state ({first_line(exc)})")
