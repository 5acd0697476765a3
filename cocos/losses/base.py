"""A contrastive loss over both retrieval directions of a batch, built from a loss family's spec.

The loss is the family's *direction loss* (its maths in :mod:`cocos.losses.functional`)
on the i2t and t2i :class:`~cocos.data.layout.QueryView` of the batch (the views the
counters use too), combined by the family's rule (sum or mean). A family given as a
whole-batch callable is called as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from cocos.data.layout import DIRECTIONS, batch_similarity
from cocos.defaults import MAX_LOGIT_SCALE


def intra_similarities(images, captions) -> dict[str, torch.Tensor]:
    """The queries' intra-modal cosine similarities per direction: i2t images ``I Iᵀ``, t2i captions ``C Cᵀ``."""
    x = torch.nn.functional.normalize(torch.as_tensor(images), dim=-1)
    y = torch.nn.functional.normalize(torch.as_tensor(captions).to(x.dtype), dim=-1)
    return {"i2t": x @ x.transpose(-1, -2), "t2i": y @ y.transpose(-1, -2)}


class ContrastiveLoss(nn.Module):
    """Maps ``(images, captions, caption_image=None, image_ids=None)`` to a scalar loss.

    ``images`` ``(B, d)``, ``captions`` ``(M, d)``; caption ``c`` belongs to image row
    ``caption_image[c]`` (default ``c // (M // B)``). ``image_ids`` (dataset ids of
    the image rows) lets the loss exclude same-image pairs from the negatives, the
    same way the counter does; ``compat=True`` keeps them as negatives.
    """

    def __init__(self, objective, compat: bool = False, **params) -> None:
        super().__init__()
        self.objective = objective
        self.name = objective.name
        self.batch_layout = objective.layout
        self.compat = bool(compat)
        self._params = objective.params(**params)
        for key, value in self._params.items():  # e.g. loss.margin, loss.tau
            setattr(self, key, value)

    def params(self) -> dict:
        """Hyper-parameters as plain types (stored in checkpoints)."""
        return dict(self._params)

    def _learned(self) -> dict:
        """The parameters the maths takes: the plain values (a learning subclass gives tensors with their
        gradient)."""
        return self._params

    def direction_loss(self, view) -> torch.Tensor:
        """The loss of one direction (a :class:`QueryView`), with this loss's parameters."""
        return self.objective.direction_loss(view, **self._learned())

    def direction_parts(self, view) -> dict[str, torch.Tensor]:
        """The named parts of one direction's loss (the family's ``parts``; one part ``"L_con"`` without)."""
        if self.objective.parts is None:
            return {"L_con": self.direction_loss(view)}
        return dict(self.objective.parts(view, **self._learned()))

    def views(self, images, captions, caption_image=None, image_ids=None) -> list:
        """The batch's i2t and t2i :class:`~cocos.data.layout.QueryView` (with this loss's compat mode)."""
        scores, layout = batch_similarity(images, captions, caption_image, image_ids, check=False)
        intra = intra_similarities(images, captions) if self.objective.needs_intra else {}
        return [layout.view(scores, d, self.compat, intra=intra.get(d)) for d in DIRECTIONS]

    def forward(self, images, captions, caption_image=None, image_ids=None) -> torch.Tensor:
        if self.objective.direction_loss is None:
            return self.objective.batch_loss(images, captions, caption_image)
        i2t, t2i = (self.direction_loss(view) for view in self.views(images, captions, caption_image, image_ids))
        return self.objective.combine_directions(i2t, t2i)

    def named_terms(self, images, captions, caption_image=None, image_ids=None) -> dict[str, torch.Tensor]:
        """The loss as named scalar parts (as open_clip's ``output_dict``), each combined over the two directions
        as the family combines them, so that they add up to :meth:`forward`'s value (bit for bit for a family of
        one part, ``{"L_con": ...}``; up to the rounding of the order of additions for several: IMC's
        ``{"L_con": Triplet SH, "L_intra": lam * (IMC(images) + IMC(captions))}``). A whole-batch callable is one
        part."""
        if self.objective.direction_loss is None:
            return {"L_con": self.objective.batch_loss(images, captions, caption_image)}
        i2t, t2i = (self.direction_parts(view) for view in self.views(images, captions, caption_image, image_ids))
        return {name: self.objective.combine_directions(i2t[name], t2i[name]) for name in i2t}

    def extra_repr(self) -> str:
        return ", ".join([f"name={self.name}", *(f"{k}={v}" for k, v in self._params.items())])




class LearnedTemperature(ContrastiveLoss):
    """A loss whose softmax temperature is learned as CLIP learns it (``--learn-tau``).

    The family's temperature parameter (:attr:`~cocos.losses.spec.Objective.temperature`, NT-Xent's ``tau``)
    becomes ``tau = exp(-logit_scale)``, ``logit_scale`` a parameter of the model (CLIP's, trained with it; its
    gradient flows through ``tau``). As open_clip does, the forward pass does not clamp: the *parameter* is
    clamped in place to ``[0, log 100]`` (``0.01 <= tau <= 1``) by :meth:`project_`, which the trainer calls after
    each optimizer step (open_clip's ``logit_scale.clamp_(0, math.log(100))``) and once when the run starts (a
    folder saved above the clamp trains from it). A temperature at the clamp keeps its gradient and moves back when
    the loss asks for it; a clamp inside the forward pass (``exp(-min(s, log 100))``, this class before issue 37)
    has a zero gradient above it and freezes there. ``params()`` reports the current ``tau`` (a checkpoint's loss
    is the one its model was last trained with, and an analysis counts at it); everything else is the wrapped
    loss's.
    """

    def __init__(self, loss: ContrastiveLoss, logit_scale: torch.Tensor) -> None:
        from cocos.errors import CocosError

        name = loss.objective.temperature
        if name is None:
            raise CocosError(f"--learn-tau: the {loss.objective.label} loss has no softmax temperature to learn "
                             "(NT-Xent's tau has)")
        super().__init__(loss.objective, compat=loss.compat, **loss.params())
        self._scale = [logit_scale]  # the model's parameter: held, not registered (the loss owns no weights)
        self._name = name
        del self.__dict__[name]  # no stale ``loss.tau``: the temperature is temperature() (params() its value)

    def temperature(self) -> torch.Tensor:
        """The current temperature ``exp(-logit_scale)``, with its gradient to ``logit_scale``."""
        return torch.exp(-self._scale[0])

    @torch.no_grad()
    def project_(self) -> None:
        """Clamp ``logit_scale`` in place to ``[0, log 100]`` (open_clip's step after ``optimizer.step()``)."""
        self._scale[0].clamp_(0.0, MAX_LOGIT_SCALE)

    def extra_repr(self) -> str:
        return ", ".join([f"name={self.name}", *(f"{k}={v:g}" for k, v in self.params().items()),
                          "learned temperature"])

    def _learned(self) -> dict:
        return {**self._params, self._name: self.temperature()}

    def params(self) -> dict:
        return {**self._params, self._name: float(self.temperature().detach())}


@dataclass(frozen=True)
class Learned:
    """A parameter of a loss family learned with the model (:attr:`cocos.losses.spec.Objective.learned`; SigLIP's
    ``t`` and ``b``): held as the raw parameter ``attr`` (the model's, where the model has a parameter of that
    name, e.g. a SigLIP folder's ``logit_scale``; else the loss's own), the value ``exp(raw)`` (``log``) or
    ``raw``; the raw parameter clamped in place to ``clamp`` after each optimiser step (not in the forward pass)."""

    attr: str
    log: bool = False
    clamp: tuple[float, float] | None = None

    def raw(self, value: float) -> float:
        return math.log(value) if self.log else float(value)

    def value(self, raw: torch.Tensor) -> torch.Tensor:
        return raw.exp() if self.log else raw


class LearnedParameters(ContrastiveLoss):
    """A loss whose :attr:`~cocos.losses.spec.Objective.learned` parameters train with the model.

    Each :class:`Learned` parameter is the model's own where the model has a parameter named ``attr`` (held, not
    registered: the model owns it, and its checkpoint holds it), else a parameter of this loss, started at the
    loss's value of it (``log t`` from ``t``) and saved in a checkpoint's ``learned`` entry
    (:meth:`own_parameters`, :meth:`state`/:meth:`load`). ``params()`` reports the current values (a checkpoint's
    loss is the one its model was last trained with, and an analysis counts at it); :meth:`project_` clamps the
    raw parameters after each optimiser step (and once when the run starts).
    """

    def __init__(self, loss: ContrastiveLoss, model: nn.Module | None = None) -> None:
        super().__init__(loss.objective, compat=loss.compat, **loss.params())
        self._held: dict[str, torch.Tensor] = {}  # the model's own parameters, by loss parameter
        self.own = nn.ParameterDict()  # the loss's own, by raw name
        for name, spec in loss.objective.learned.items():
            held = getattr(model, spec.attr, None) if model is not None else None
            if isinstance(held, torch.Tensor) and held.numel() == 1:
                self._held[name] = held
            else:
                start = torch.tensor(spec.raw(self._params[name]), dtype=torch.float32)
                self.own[spec.attr] = nn.Parameter(start.to(_device_of(model)))
            self.__dict__.pop(name, None)  # no stale ``loss.t``: params() holds the value

    def raw(self, name: str) -> torch.Tensor:
        spec = self.objective.learned[name]
        return self._held[name] if name in self._held else self.own[spec.attr]

    def own_parameters(self) -> list[nn.Parameter]:
        """The parameters this loss owns (trained beside the model's)."""
        return list(self.own.values())

    def held(self) -> list[torch.Tensor]:
        """The model's parameters this loss learns (they must train even where the model's would not)."""
        return list(self._held.values())

    @torch.no_grad()
    def project_(self) -> None:
        for name, spec in self.objective.learned.items():
            if spec.clamp is not None:
                self.raw(name).clamp_(*spec.clamp)

    def state(self) -> dict[str, torch.Tensor]:
        """The loss's own raw parameters (a checkpoint's ``learned``), by name."""
        return {k: p.detach().clone().cpu() for k, p in self.own.items()}

    @torch.no_grad()
    def load(self, state: dict) -> None:
        for k, p in self.own.items():
            p.copy_(torch.as_tensor(state[k]).to(p))

    def _learned(self) -> dict:
        return {**self._params, **{name: spec.value(self.raw(name)) for name, spec in self.objective.learned.items()}}

    def params(self) -> dict:
        return {**self._params, **{name: float(spec.value(self.raw(name).detach()))
                                   for name, spec in self.objective.learned.items()}}

    def extra_repr(self) -> str:
        return ", ".join([f"name={self.name}", *(f"{k}={v:g}" for k, v in self.params().items()), "learned"])


def _device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")
