"""COCOS for any differentiable loss ``L(S)``, by autograd.

``dL/dS[q, n]`` is the weight of candidate ``n`` in the gradient with respect to
query ``q`` (up to the normalisation Jacobian). A negative *contributes* when
``|dL/dS[q, n]| > eps * max_n |dL/dS[q, n]|`` (relative threshold, the default)
or ``> eps`` (absolute). The loss is a *direction loss*: a function of one
:class:`QueryView` (e.g. ``cocos.losses.get_loss(name).direction_loss``), so that
i2t and t2i gradients do not mix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from cocos.counting.base import Count, batch_counts, companions
from cocos.data.layout import QueryView


def negative_gradients(view: QueryView, loss_fn: Callable[[QueryView], torch.Tensor]) -> torch.Tensor:
    """``|dL/dS|`` on each query's negatives (0 elsewhere), ``(..., Q, K)``."""
    with torch.enable_grad():
        scores = view.scores.detach().clone().requires_grad_(True)
        loss = loss_fn(replace(view, scores=scores))
        (grad,) = torch.autograd.grad(loss, scores, allow_unused=True)
    if grad is None:
        grad = torch.zeros_like(scores)
    return torch.where(view.neg, grad.abs(), 0.0).detach()


def count_generic(
    view: QueryView,
    loss_fn: Callable[[QueryView], torch.Tensor],
    eps: float = 0.01,
    relative: bool = True,
) -> Count:
    """Per query: the number of negatives whose gradient weight passes the threshold."""
    g = negative_gradients(view, loss_fn)
    threshold = eps * g.amax(-1, keepdim=True) if relative else torch.full_like(g[..., :1], eps)
    c_q = ((g > threshold) & (g > 0)).sum(-1)
    batch = batch_counts(c_q)
    comp_q, comp_b = companions(g)
    batch.update(comp_b)
    return Count({"C_q": c_q.to(torch.float64), **comp_q}, batch, view.n_excluded, weights=g)
