"""One spec per loss family: everything cocos knows about a loss, in one object.

An :class:`Objective` holds the family's name and label, its batch layout (pair or
ranking, definitions file "Notation"), its default hyper-parameters, the maths of
one direction of its training loss (a function of a
:class:`~cocos.data.layout.QueryView`, shared with its counter), how the two
directions combine, its closed-form counter (or its hinge-like ``terms``, counted in closed form by
:class:`~cocos.losses.reducers.TermsCounter`; or neither: then the generic autograd counter counts it), the
named parts of its loss, the statistics the paper reports and the main one, the paper
table it belongs to, its colour in figures and the notes its table needs; the last seven are what reports show,
one :class:`~cocos.presentation.Presentation` value (:meth:`Objective.presentation`). Each family
defines its spec in its own module of :mod:`cocos.losses`, beside its maths and counter.

The training losses (:func:`cocos.objectives.get_loss`), the counters, the engine,
the CLI's choices and flags, the tables, the figures and the summaries all loop
over the registry (:mod:`cocos.objectives`); nothing else names a loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cocos.defaults import DEFAULT_EPS  # noqa: F401  (re-exported)
from cocos.errors import CocosError, check_params
from cocos.losses.base import ContrastiveLoss, Learned  # noqa: F401  (Learned re-exported)
from cocos.losses.counts import Counter
from cocos.losses.generic import BatchLossCounter, GenericCounter
from cocos.losses.reducers import TermsCounter, TermsLoss
from cocos.presentation import LAST, Presentation, TableNote, format_value  # noqa: F401  (format_value re-exported)

LAYOUTS = ("pair", "ranking")
COMBINES = ("sum", "mean")

# A note under the family's table, plain and LaTeX, shown ``when`` "always" or "compat" (only where compat values
# are shown or the other counting mode differs in one of the family's cells): the report's own note type.
Note = TableNote


@dataclass(frozen=True)
class Objective:
    """A loss family (see the module docstring)."""

    name: str
    label: str
    direction_loss: Callable[..., Any] | None  # (view, **params) -> scalar: one direction of the training loss
    layout: str = "pair"  # "pair" (sample captions) or "ranking" (sample images with all k captions)
    defaults: Mapping[str, float] = field(default_factory=dict)  # loss hyper-parameters and their defaults
    combine: str = "sum"  # how the two directions' losses combine: "sum" or "mean"
    reduce: str = "sum"  # how one direction's loss reduces its queries' terms: "sum" (hinge losses) or "mean"
    counter: Callable[..., Counter] | None = None  # closed-form counter class; None: generic autograd counter
    stats: tuple[str, ...] = ("C_q", "C_B", "C_0")  # the statistics the paper reports, in its order
    main_stat: str = "C_q"  # the per-query count shown in figures and summaries
    table: str | None = None  # the paper table ("2", "3", "4"); families with the same table share it
    color: str = "#7f7f7f"
    marker: str = "o"  # matplotlib marker of the family in scatter plots
    notes: tuple[Note, ...] = ()
    description: str = ""  # one line for `cocos losses`
    warmup_loss: str | None = None  # a family to train with during --warmup-epochs (VSE-infinity practice)
    # the parameter that is a softmax temperature (NT-Xent's tau): what --learn-tau learns as CLIP learns its
    # logit scale (cocos.losses.base.LearnedTemperature); None: the loss has none
    temperature: str | None = None
    undefined_ok: tuple[str, ...] = ()  # its own statistics that may be NaN in a batch (besides C_q, companions)
    check: Callable[[dict], None] | None = None  # validates the family's parameters (names, ranges): CocosError
    needs_intra: bool = False  # its loss and counter read the queries' intra-modal similarities (QueryView.intra)
    distributions: tuple[str, ...] = ()  # per-query statistics whose distributions reports plot (GOAL's T, P+, P-)
    diagram: Callable[[dict], list[str]] | None = None  # triplet-diagram weights of a model trained with it
    # A whole-batch loss ``(images, captions, caption_image=None) -> scalar`` instead of direction maths
    # (a user's own callable): counted from dL/dS of the whole loss, rows for i2t, columns for t2i.
    batch_loss: Callable[..., Any] | None = None
    # ``(view, **params) -> (..., Q, K)`` (or ``(..., Q, A, K)``, one axis per positive) non-negative terms of one
    # direction, each term's gradient weight its indicator (hinge-like terms): a family given by its terms is
    # counted in closed form without a counter of its own (cocos.losses.reducers.TermsCounter: C_q = #{terms > 0}),
    # and its direction_loss, if not given, is their sum.
    terms: Callable[..., Any] | None = None
    # ``(view, **params) -> {name: scalar}``: the direction loss's named parts (IMC's {"L_con": ..., "L_intra": ...}),
    # whose sum is the direction loss; None: one part, "L_con" (cocos.losses.base.ContrastiveLoss.named_terms)
    parts: Callable[..., Any] | None = None
    # its parameters learned with the model, {param: Learned} (SigLIP's t and b through logit_scale and logit_bias;
    # cocos.losses.base.LearnedParameters): a training run always learns them, from the model's parameters of
    # those names where it has them
    learned: Mapping[str, Learned] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.direction_loss is None and callable(self.terms) and self.batch_loss is None:
            object.__setattr__(self, "direction_loss", TermsLoss(self.terms))  # the sum of its terms
        if not self.name or not isinstance(self.name, str) or any(c in self.name for c in " ,/="):
            raise CocosError(f"a loss name must be a word without spaces, commas, '/' or '=', got {self.name!r}")
        if self.layout not in LAYOUTS:
            raise CocosError(f"loss '{self.name}': unknown layout '{self.layout}' (use pair or ranking)")
        if self.combine not in COMBINES:
            raise CocosError(f"loss '{self.name}': unknown combine '{self.combine}' (use sum or mean)")
        if self.reduce not in COMBINES:
            raise CocosError(f"loss '{self.name}': unknown reduce '{self.reduce}' (use sum or mean)")
        if self.main_stat not in self.stats:
            raise CocosError(f"loss '{self.name}': main statistic {self.main_stat} is not among {self.stats}")
        if not callable(self.direction_loss) and not callable(self.batch_loss):
            raise CocosError(f"loss '{self.name}': needs a callable direction_loss or batch_loss")
        self._check_temperature()

    def _check_temperature(self) -> None:
        if self.temperature is not None and self.temperature not in self.defaults:
            raise CocosError(f"loss '{self.name}': its temperature '{self.temperature}' is not one of its parameters")
        unknown = [k for k in self.learned if k not in self.defaults]
        if unknown:
            raise CocosError(f"loss '{self.name}': its learned parameter '{unknown[0]}' is not one of its parameters")

    # -- parameters ---------------------------------------------------------------------

    @property
    def uses_eps(self) -> bool:
        """Whether the count depends on an absolute or relative threshold ``eps``."""
        if self.counter is None:
            return self.terms is None  # terms: counted above 0; otherwise the generic counter's threshold
        return bool(getattr(self.counter, "uses_eps", False))

    def params(self, **given) -> dict[str, Any]:
        """The loss's hyper-parameters: defaults, overridden by ``given`` (``None`` = default); checked.

        A parameter keeps the type of its default: numbers (float), names (str, e.g. GOAL's
        ``triplet_weight``) or switches (bool). The family's ``check`` then validates the whole set.
        """
        unknown = [k for k, v in given.items() if v is not None and k not in self.defaults]
        if unknown:
            takes = ", ".join(self.defaults) or "no parameters"
            raise CocosError(f"loss '{self.name}' takes no parameter {', '.join(unknown)} (it takes {takes})")
        out = {k: _typed(k, default if given.get(k) is None else given[k], default)
               for k, default in self.defaults.items()}
        check_params(**{k: v for k, v in out.items() if isinstance(v, float)})
        if self.check is not None:
            self.check(out)
        return out

    def counter_params(self, eps: float | None = None, **given) -> dict[str, float]:
        """Parameters of the counter: the loss's own, and ``eps`` when the count uses a threshold."""
        out = self.params(**given)
        if self.uses_eps:
            out["eps"] = DEFAULT_EPS if eps is None else float(eps)
            check_params(eps=out["eps"])
        return out

    # -- the loss and its counter ---------------------------------------------------------------

    def loss(self, compat: bool = False, **params) -> ContrastiveLoss:
        """The training loss as a module ``(images, captions, caption_image=None, image_ids=None) -> scalar``."""

        return ContrastiveLoss(self, compat=compat, **params)

    def make_counter(self, eps: float | None = None, **params) -> Counter:
        """The family's closed-form counter: its own, or the count of its terms; otherwise the generic autograd
        counter of its direction loss."""
        full = self.counter_params(eps, **params)
        if self.counter is not None:
            return self.counter(**full)
        if self.terms is not None:
            return TermsCounter(self.terms, **full)

        return GenericCounter(self, **full) if self.direction_loss is not None else BatchLossCounter(self, **full)

    def per_query(self, value: float, n_i2t: int, n_t2i: int) -> float:
        """A training loss value as each direction's mean over its queries, the directions combined as the family
        combines them: unchanged for a family that already averages (``reduce="mean"``); a summed one divided by
        the mean number of queries of a direction, ``value * 2 / (n_i2t + n_t2i)`` (exact for pair batches, where
        both directions have one query per row). A short final batch then no longer looks like a drop."""
        if self.reduce == "mean":
            return float(value)
        return float(value) * 2.0 / max(n_i2t + n_t2i, 1)

    def combine_directions(self, i2t, t2i):
        total = i2t + t2i
        return total / 2 if self.combine == "mean" else total

    # -- how it is shown ---------------------------------------------------------------------------

    def presentation(self, rank: int = LAST) -> Presentation:
        """The family's :class:`~cocos.presentation.Presentation` (what ``results.json`` stores under
        ``presentation.<name>``): its label, statistics, main statistic, table, colour, marker, default
        parameters and notes, at ``rank`` among the families (its place in the registry)."""
        return Presentation(label=self.label, stats=tuple(self.stats), main_stat=self.main_stat, table=self.table,
                            color=self.color, marker=self.marker, params=dict(self.defaults),
                            notes=tuple(self.notes), rank=rank)


def _typed(name: str, value, default):
    """``value`` as the type of ``default`` (bool, str or float); one CocosError line otherwise."""
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise CocosError(f"{name} must be true or false, got '{value}'")
            return value.lower() in ("true", "1", "yes")
        return bool(value)
    if isinstance(default, str):
        return str(value)
    if isinstance(value, bool):
        raise CocosError(f"{name} must be a number, got {value}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CocosError(f"{name} must be a number, got {value!r}") from None


def from_callable(fn: Callable[..., Any], name: str | None = None, label: str | None = None,
                  layout: str = "pair") -> Objective:
    """A user's loss ``fn(images, captions, caption_image=None) -> scalar`` as a family without a closed form.

    It is counted by the generic autograd counter on the whole loss's ``dL/dS`` (see
    :class:`cocos.losses.generic.BatchLossCounter`); ``name`` defaults to the function's name.
    """
    if not callable(fn):
        raise CocosError(f"a loss must be a registered name, an Objective or a callable, got {type(fn).__name__}")
    if name is None:
        name = getattr(fn, "__name__", "") or type(fn).__name__
        name = name if name.isidentifier() else "custom"
    return Objective(name=name, label=label or name, direction_loss=None, batch_loss=fn, layout=layout,
                     description="a user's own loss (whole-batch callable)")
