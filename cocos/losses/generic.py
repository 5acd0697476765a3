"""COCOS for any differentiable loss, by autograd (definitions file, "Generic counting").

``dL/dS[q, n]`` is the weight of candidate ``n`` in the gradient with respect to
query ``q`` (up to the normalisation Jacobian). A negative *contributes* when
``|dL/dS[q, n]| > eps * max_n |dL/dS[q, n]|`` (relative threshold, the default)
or ``> eps`` (absolute).

Two forms of loss:

* a *direction loss*, a function of one :class:`QueryView` (a family's maths, e.g.
  ``cocos.objectives.get_loss(name).direction_loss``): i2t and t2i gradients do not mix,
  and the count equals the closed form for Triplet and Triplet SH
  (:class:`GenericCounter`);
* a *whole-batch* loss ``fn(images, captions, caption_image=None) -> scalar`` (a
  user's own callable, :class:`BatchLossCounter`). Its ``dL/dS`` holds both
  directions' terms in one matrix, and no function of the loss can separate them:
  row ``q`` counts the captions that reach image ``q``'s gradient through the i2t
  term of ``q`` **or** the t2i terms of those captions (and column ``c`` likewise for
  t2i). For a symmetric two-direction loss this is at least the per-direction count.
  ``dL/dS`` is read with probe coordinates: the loss gets unit vectors ``[x, t a]``
  for images (``a = 0``, a leaf) and ``[sqrt(1 - t^2) c, t e_c]`` for captions, so
  that ``S' = sqrt(1 - t^2) S + t^2 A`` and ``dL/dA = t^2 dL/dS'``; with ``t^2 = 1e-12``
  in float64, ``S'`` differs from ``S`` by less than ``1e-12`` (whether or not the
  loss normalises its inputs, and intra-modal terms get no probe gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from cocos.data.layout import QueryView
from cocos.defaults import DEFAULT_EPS
from cocos.errors import CocosError, check_params
from cocos.losses.counts import Count, Counter, batch_counts, companions

PROBE_T2 = 1e-12  # t^2 of the probe coordinates


def negative_gradients(view: QueryView, loss_fn: Callable[[QueryView], torch.Tensor]) -> torch.Tensor:
    """``|dL/dS|`` on each query's negatives (0 elsewhere), ``(..., Q, K)``."""
    with torch.enable_grad():
        scores = view.scores.detach().clone().requires_grad_(True)
        loss = loss_fn(replace(view, scores=scores))
        (grad,) = torch.autograd.grad(loss, scores, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(scores)
    if not bool(torch.isfinite(loss).all()) or not bool(torch.isfinite(grad).all()):
        raise CocosError("the loss or its gradient is not finite (NaN or Inf); nothing can be counted")
    return torch.where(view.neg, grad.abs(), 0.0).detach()


def count_from_gradients(g: torch.Tensor, view: QueryView, eps: float = DEFAULT_EPS, relative: bool = True,
                         extras: bool = True) -> Count:
    """Per query: the negatives whose gradient magnitude ``g`` (``(..., Q, K)``, 0 off negatives) passes ``eps``."""
    threshold = eps * g.amax(-1, keepdim=True) if relative else torch.full_like(g[..., :1], eps)
    c_q = ((g > threshold) & (g > 0)).sum(-1)
    batch = batch_counts(c_q)
    if not extras:
        return Count({"C_q": c_q.to(torch.float64)}, batch, view.n_excluded)
    comp_q, comp_b = companions(g)
    batch.update(comp_b)
    return Count({"C_q": c_q.to(torch.float64), **comp_q}, batch, view.n_excluded, weights=g)


def count_generic(
    view: QueryView,
    loss_fn: Callable[[QueryView], torch.Tensor],
    eps: float = DEFAULT_EPS,
    relative: bool = True,
) -> Count:
    """Per query: the number of negatives whose gradient weight passes the threshold."""
    return count_from_gradients(negative_gradients(view, loss_fn), view, eps, relative)


class GenericCounter(Counter):
    """The generic count of a family's direction loss (a family without a closed-form counter)."""

    uses_eps = True

    def __init__(self, objective, eps: float = DEFAULT_EPS, relative: bool = True, **params) -> None:
        check_params(eps=eps)
        self.objective, self.eps, self.relative = objective, float(eps), relative
        self.loss_params = objective.params(**params)

    def params(self) -> dict:
        return {**self.loss_params, "eps": self.eps}

    def _gradients(self, view: QueryView) -> torch.Tensor:
        return negative_gradients(view, lambda v: self.objective.direction_loss(v, **self.loss_params))

    def count(self, view: QueryView) -> Count:
        return count_from_gradients(self._gradients(view), view, self.eps, self.relative)

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        g = self._gradients(view)
        return {float(e): count_from_gradients(g, view, float(e), self.relative, extras=False) for e in eps_values}

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """The gradients once for the count and every threshold (equal to ``count`` and ``sweep``)."""
        g = self._gradients(view)
        main = count_from_gradients(g, view, self.eps, self.relative)
        return main, {float(e): count_from_gradients(g, view, float(e), self.relative, extras=False).batch
                      for e in eps_values}


class BatchLossCounter(GenericCounter):
    """The generic count of a whole-batch callable: counts ``|dL/dS|`` of the whole loss (see the module docstring).

    The engine first calls :meth:`gradients` on the batch's embeddings; the views it
    then passes to :meth:`count` hold ``dL/dS`` in place of the scores.
    """

    needs_embeddings = True

    def gradients(self, images: torch.Tensor, captions: torch.Tensor, caption_image) -> torch.Tensor:
        """``dL/dS`` of each batch, ``(..., B, M)``, from unit-norm ``images (..., B, d)``, ``captions (..., M, d)``."""
        lead = images.shape[:-2]
        b, m = images.shape[-2], captions.shape[-2]
        flat_i = images.reshape(-1, b, images.shape[-1]).to(torch.float64)
        flat_c = captions.reshape(-1, m, captions.shape[-1]).to(torch.float64)
        t = PROBE_T2 ** 0.5
        scale = (1.0 - PROBE_T2) ** 0.5
        eye = torch.eye(m, dtype=torch.float64, device=images.device)
        ci = None if caption_image is None else torch.as_tensor(caption_image, device=images.device)
        out = []
        for img, cap in zip(flat_i, flat_c, strict=True):
            with torch.enable_grad():
                probe = torch.zeros(b, m, dtype=torch.float64, device=images.device, requires_grad=True)
                img_aug = torch.cat([img, t * probe], dim=-1)
                cap_aug = torch.cat([scale * cap, t * eye], dim=-1)
                loss = self.objective.batch_loss(img_aug, cap_aug, ci)
                if not torch.is_tensor(loss) or loss.numel() != 1:
                    raise CocosError(f"loss '{self.objective.name}' must return a scalar tensor")
                (grad,) = torch.autograd.grad(loss.reshape(()), probe, allow_unused=True)
            if not bool(torch.isfinite(loss).all()) or (grad is not None and not bool(torch.isfinite(grad).all())):
                raise CocosError(f"loss '{self.objective.name}' or its gradient is not finite (NaN or Inf); "
                                 "nothing can be counted")
            out.append(torch.zeros_like(probe) if grad is None else grad / PROBE_T2)
        return torch.stack(out).reshape(*lead, b, m).detach()

    def _gradients(self, view: QueryView) -> torch.Tensor:
        return torch.where(view.neg, view.scores.abs(), 0.0)  # the view holds dL/dS already
