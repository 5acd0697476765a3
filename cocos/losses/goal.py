"""GOAL gradient components (Xuan & Chen): triplet weights, pair weights, the gradient objective.

The GOAL paper writes the gradient of a symmetric triplet objective on the
L2-normalised embeddings as (its Eq. 3)::

    dl/dx = dL(S_xy, S_xy')/dS_xy · y + dL(S_xy, S_xy')/dS_xy' · y' + dL(S_yx, S_yx')/dS_yx · y

and replaces the two scalars of every triplet ``(anchor, positive, hardest negative)``
by ``-T·P+`` (positive) and ``+T·P−`` (negative): a *triplet weight* ``T(Sp, Sn)``
times a *pair weight* ``P±``. Everything here is a pure function of tensors that
broadcasts over any leading shape; the definitions file ("GOAL gradient
components") is the contract.

Weight names
------------
``TRIPLET_WEIGHTS`` maps ``T_con``, ``T_nca``, ``T_cir`` to ``f(sp, sn, **params) -> T``;
``PAIR_WEIGHTS`` maps ``P_con``, ``P_lin``, ``P_sig``, ``P_lin-ms``, ``P_sig-ms`` to
``f(sp, sn, **params) -> (P+, P−)``. A *weight name* for :func:`weight_grid` and the
diagrams is one of

* ``T_x``: the triplet weight alone;
* ``T_x*P_y+`` / ``T_x*P_y-``: the scalar of the positive (``T·P+``) or of the
  negative (``T·P−``) in the gradient;
* ``P_y+`` / ``P_y-``: a pair weight alone.

Names are case-insensitive; ``−`` (U+2212) is accepted for ``-``.

Choices where the paper leaves room (documented, tested)
--------------------------------------------------------
* ``T_cir`` offset: the paper's Eq. 8 is ``1/(1 + exp(τ (Sp(2−Sp) − Sn²)))``. The
  authors' code subtracts 0.5 *inside the exponent, from the bracket that τ
  multiplies*: ``1/(1 + exp(τ (Sp(2−Sp) − Sn² − 0.5)))`` (``offset=True``). This is
  the Circle-loss derivative ``sigmoid(γ((1−Sp)² + Sn² − 2m²))`` with relaxation
  ``m = 0.5`` (``2m² − 1 = −0.5``); its T = 1/2 contour is the circle
  ``(Sp−1)² + Sn² = 0.5`` instead of radius 1 (paper form). The paper text does not
  mention the offset and the authors' repository (VSE-Gradient) could not be
  consulted here, so the place of the 0.5 follows the definitions file ("subtracts
  0.5 inside the exponent"), read as a shift of the bracket, not of ``Sp`` or ``Sn``.
* Multi-similarity pair weights (Eq. 12–13, sets of §3.3): the relative
  similarities ``R`` of a triplet are the anchor's similarities to its *other*
  positives and *other* negatives in the batch. The mining sets are
  ``P = {R+ : R+ < max(Sn, R−) + ε}`` and ``N = {R− : R− > min(Sp, R+) − ε}``
  (ε = 0.1). The mean of Eq. 12–13 runs over the mined set only, as the paper writes
  it (``1/|P| Σ_P``, ``1/|N| Σ_N``). An *empty* mined set, which the paper leaves
  undefined (0/0), gives the neutral term: ``m^sig = 1``, ``m^lin = 0``, so the weights
  reduce exactly to ``P_sig`` / ``P_lin``, the reduction the paper states for
  ``m = 1``. (The authors' code returns 0 there, which makes ``P−^sig-ms =
  exp(β(Sn − λ))`` explode to 148 at ``Sn = 1``; cocos does not follow it.) Until
  cocos 0.1 the mean also counted the selected pair itself; for ``Sp = 0.75``,
  ``Sn = 0.7``, one other positive at 0 and one mined negative at 0.68 that gave
  ``m− = 0.909`` (``P− = 0.957``) against the paper's 0.819 (1.048). In a pair batch
  every query has one positive, so only ``P−`` changes. Without rows (for
  the diagrams) the relative terms are fixed numbers ``m_pos``, ``m_neg``; their
  default 0.1 is the value of the paper's Figure 3.
* Hardest negative: per query, the most similar candidate among the view's
  negatives (``QueryView.neg``: same-image pairs are excluded unless compat, as in
  the Triplet SH loss). With several positives (image queries of a ranking batch)
  every positive forms its own triplet with the same hardest negative, exactly
  like ``triplet_sh`` (``amax`` over negatives per (query, positive)). Ties go to the
  first index (``argmax``); autograd of ``amax`` would split the gradient between
  tied negatives instead (same total).
* The gradient is with respect to the *normalised* embeddings, ignoring the
  normalisation Jacobian (the paper's Eq. 3 treats ``x, y`` as the unit vectors);
  ``jacobian=True`` applies ``(I − x̂x̂ᵀ)/‖x‖`` to give the gradient with respect to the
  raw embeddings.

The family (spec, training objective and counter) lives here too, beside its maths:

The GOAL paper trains with a gradient it designs rather than derives: for every
(anchor, positive, hardest in-batch negative) triplet the positive's similarity gets
``−T·P+`` and the negative's ``+T·P−`` (its Eq. 3), with a triplet weight ``T``
(``con``, ``nca``, ``cir``) and a pair weight ``P`` (``con``, ``lin``, ``sig``,
``lin_ms``, ``sig_ms``).

As a training objective (``get_loss("goal", triplet_weight="cir", pair_weight="sig_ms",
tau=10.0)``) each direction is a custom :class:`torch.autograd.Function`: its
**forward returns the direction's Triplet SH value** (summed hinge on the hardest
negative, margin ``margin``; a number worth logging that falls as the model learns)
and its **backward is the designed gradient** on the similarity scores, from where
autograd carries it to the embeddings and the model. The two directions are summed,
so ``con × con`` is exactly the gradient of the summed Triplet SH loss.

Its counter counts, per query, the negatives whose designed weight ``T·P−`` exceeds
``eps`` (the hardest negative, or none), and records the per-query triplet weight
``T`` and pair weights ``P+``, ``P−`` (means over a query's positives).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from cocos.data.layout import DIRECTIONS, BatchLayout, QueryView, positive_index
from cocos.defaults import DEFAULT_MARGIN
from cocos.errors import CocosError, check_params
from cocos.losses.counts import DEFAULT_EPS, Count, Counter, batch_counts, companions, nanmean
from cocos.losses.functional import triplet_direction
from cocos.losses.spec import Objective

CIR_OFFSET = 0.5  # what the authors' code subtracts inside the T_cir exponent
MS_EPS = 0.1  # epsilon of the MS mining sets
MS_FIGURE_M = 0.1  # relative terms m+ = m- of the paper's Figure 3 (used without rows)


def _t(x) -> torch.Tensor:
    """A tensor; Python numbers and numpy arrays become float64."""
    if torch.is_tensor(x):
        return x if x.dtype.is_floating_point else x.double()
    return torch.as_tensor(x, dtype=torch.float64)


def _pair(sp, sn) -> tuple[torch.Tensor, torch.Tensor]:
    sp, sn = _t(sp), _t(sn)
    if sp.dtype != sn.dtype:
        dtype = torch.promote_types(sp.dtype, sn.dtype)
        sp, sn = sp.to(dtype), sn.to(dtype)
    return sp, sn


# -- triplet weights ------------------------------------------------------------------


def t_con(sp, sn, margin: float = DEFAULT_MARGIN) -> torch.Tensor:
    """Constant triplet weight (Eq. 5): ``1{m + Sn − Sp > 0}`` (strict: 0 on the boundary)."""
    sp, sn = _pair(sp, sn)
    return (margin + sn - sp > 0).to(sp.dtype)


def t_nca(sp, sn, tau: float = 10.0) -> torch.Tensor:
    """NCA triplet weight (Eq. 7): ``1 / (1 + exp(τ (Sp − Sn)))``."""
    sp, sn = _pair(sp, sn)
    return torch.sigmoid(-tau * (sp - sn))


def t_cir(sp, sn, tau: float = 10.0, offset: bool = False) -> torch.Tensor:
    """Circle triplet weight (Eq. 8): ``1 / (1 + exp(τ (Sp(2 − Sp) − Sn² [− 0.5])))``.

    ``offset=True`` is the authors' code: 0.5 is subtracted inside the bracket that
    τ multiplies (see the module docstring).
    """
    sp, sn = _pair(sp, sn)
    arg = sp * (2 - sp) - sn * sn
    if offset:
        arg = arg - CIR_OFFSET
    return torch.sigmoid(-tau * arg)


# -- pair weights -----------------------------------------------------------------------


def p_con(sp, sn) -> tuple[torch.Tensor, torch.Tensor]:
    """Constant pair weight (Eq. 9): ``P+ = P− = 1``."""
    sp, sn = _pair(sp, sn)
    return torch.ones_like(sp), torch.ones_like(sn)


def p_lin(sp, sn) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear pair weight (Eq. 10, Circle loss): ``P+ = 1 − Sp``, ``P− = Sn``."""
    sp, sn = _pair(sp, sn)
    return 1 - sp, sn.clone()


def p_sig(sp, sn, alpha: float = 2.0, beta: float = 10.0, lam: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid pair weight (Eq. 11, binomial deviance).

    ``P+ = 1/(1 + exp(α (Sp − λ)))``, ``P− = 1/(1 + exp(−β (Sn − λ)))``.
    """
    sp, sn = _pair(sp, sn)
    return torch.sigmoid(-alpha * (sp - lam)), torch.sigmoid(beta * (sn - lam))


def ms_relative_terms(
    sp,
    sn,
    pos_others,
    neg_others,
    pos_mask=None,
    neg_mask=None,
    *,
    kind: str = "sig",
    alpha: float = 2.0,
    beta: float = 10.0,
    eps: float = MS_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative-similarity terms ``(m+, m−)`` of one triplet per entry of ``sp``/``sn``.

    ``sp``, ``sn``: ``(...)``; ``pos_others`` ``(..., A)`` and ``neg_others`` ``(..., K)``:
    the anchor's similarities to its other positives and other negatives, with
    boolean masks of the real entries (padding ``False``). ``kind="sig"``:
    ``m+ = mean exp(α (Sp − R+))``, ``m− = mean exp(−β (Sn − R−))``; ``kind="lin"``:
    ``m+ = mean (Sp − R+)``, ``m− = mean (Sn − R−)``; means over the mined set only, the
    neutral term (1 for sig, 0 for lin) where it is empty (module docstring). Either row
    may have no entries (``A = 0`` or ``K = 0``).
    """
    if kind not in ("sig", "lin"):
        raise CocosError(f"unknown multi-similarity kind '{kind}' (use sig or lin)")
    sp, sn = _pair(sp, sn)
    pos_others = _t(pos_others).to(sp.dtype)
    neg_others = _t(neg_others).to(sp.dtype)
    pos_mask = torch.ones_like(pos_others, dtype=torch.bool) if pos_mask is None else torch.as_tensor(pos_mask)
    neg_mask = torch.ones_like(neg_others, dtype=torch.bool) if neg_mask is None else torch.as_tensor(neg_mask)
    pos_mask = pos_mask.to(torch.bool).to(pos_others.device)
    neg_mask = neg_mask.to(torch.bool).to(neg_others.device)
    inf = torch.tensor(math.inf, dtype=sp.dtype, device=sp.device)
    hardest_neg, easiest_pos = sn, sp
    if neg_others.shape[-1]:
        hardest_neg = torch.maximum(sn, torch.where(neg_mask, neg_others, -inf).amax(-1))
    if pos_others.shape[-1]:
        easiest_pos = torch.minimum(sp, torch.where(pos_mask, pos_others, inf).amin(-1))
    in_p = pos_mask & (pos_others < hardest_neg[..., None] + eps)
    in_n = neg_mask & (neg_others > easiest_pos[..., None] - eps)
    dp = sp[..., None] - pos_others
    dn = sn[..., None] - neg_others
    if kind == "sig":
        fp, fn, neutral = torch.exp(alpha * dp), torch.exp(-beta * dn), 1.0
    else:
        fp, fn, neutral = dp, dn, 0.0
    zero = torch.zeros((), dtype=sp.dtype, device=sp.device)

    def mean(terms, mined):  # over the mined set; the neutral term where it is empty
        n = mined.sum(-1)
        total = torch.where(mined, terms, zero).sum(-1)
        return torch.where(n > 0, total / n.clamp_min(1), torch.full_like(total, neutral))

    return mean(fp, in_p), mean(fn, in_n)


def _ms_terms(sp, sn, pos_others, neg_others, pos_mask, neg_mask, m_pos, m_neg, kind, alpha, beta, eps):
    if pos_others is None and neg_others is None:
        sp, sn = _pair(sp, sn)
        mp = torch.full_like(sp, MS_FIGURE_M if m_pos is None else m_pos)
        mn = torch.full_like(sn, MS_FIGURE_M if m_neg is None else m_neg)
        return mp, mn
    if pos_others is None or neg_others is None:
        raise CocosError("multi-similarity pair weights need both pos_others and neg_others (or neither)")
    if m_pos is not None or m_neg is not None:
        raise CocosError("give either the similarity rows or fixed m_pos/m_neg, not both")
    return ms_relative_terms(sp, sn, pos_others, neg_others, pos_mask, neg_mask, kind=kind,
                             alpha=alpha, beta=beta, eps=eps)


def p_sig_ms(
    sp,
    sn,
    pos_others=None,
    neg_others=None,
    *,
    pos_mask=None,
    neg_mask=None,
    m_pos: float | None = None,
    m_neg: float | None = None,
    alpha: float = 2.0,
    beta: float = 10.0,
    lam: float = 0.5,
    eps: float = MS_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigmoid multi-similarity pair weight (Eq. 12).

    ``P+ = 1/(m+ + exp(α (Sp − λ)))``, ``P− = 1/(m− + exp(−β (Sn − λ)))`` with ``m±``
    from the anchor's other similarities (:func:`ms_relative_terms`), or the fixed
    ``m_pos``/``m_neg`` (default 0.1, paper Figure 3) when no rows are given.
    """
    mp, mn = _ms_terms(sp, sn, pos_others, neg_others, pos_mask, neg_mask, m_pos, m_neg, "sig",
                       alpha, beta, eps)
    sp, sn = _pair(sp, sn)
    return 1 / (mp + torch.exp(alpha * (sp - lam))), 1 / (mn + torch.exp(-beta * (sn - lam)))


def p_lin_ms(
    sp,
    sn,
    pos_others=None,
    neg_others=None,
    *,
    pos_mask=None,
    neg_mask=None,
    m_pos: float | None = None,
    m_neg: float | None = None,
    eps: float = MS_EPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear multi-similarity pair weight (Eq. 13): ``P+ = (1 − m+)(1 − Sp)``, ``P− = (1 + m−) Sn``.

    ``m+ = mean(Sp − R+)``, ``m− = mean(Sn − R−)`` over the mined sets
    (:func:`ms_relative_terms`), or the fixed ``m_pos``/``m_neg`` (default 0.1).
    """
    mp, mn = _ms_terms(sp, sn, pos_others, neg_others, pos_mask, neg_mask, m_pos, m_neg, "lin",
                       2.0, 10.0, eps)
    sp, sn = _pair(sp, sn)
    return (1 - mp) * (1 - sp), (1 + mn) * sn


p_sig_ms.needs_rows = True  # type: ignore[attr-defined]
p_lin_ms.needs_rows = True  # type: ignore[attr-defined]

TRIPLET_WEIGHTS: dict[str, Callable[..., torch.Tensor]] = {"T_con": t_con, "T_nca": t_nca, "T_cir": t_cir}
PAIR_WEIGHTS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "P_con": p_con, "P_lin": p_lin, "P_sig": p_sig, "P_lin-ms": p_lin_ms, "P_sig-ms": p_sig_ms,
}


# -- weight names -----------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSpec:
    """A parsed weight name: ``T``, ``T*P±`` or ``P±``."""

    triplet: str | None
    pair: str | None
    sign: str | None  # "+" (the positive's scalar) or "-" (the negative's)

    @property
    def name(self) -> str:
        pair = f"{self.pair}{self.sign}" if self.pair else None
        return "*".join(p for p in (self.triplet, pair) if p)

    def functions(self) -> list[Callable]:
        out = []
        if self.triplet:
            out.append(TRIPLET_WEIGHTS[self.triplet])
        if self.pair:
            out.append(PAIR_WEIGHTS[self.pair])
        return out


def weight_choices() -> str:
    t = ", ".join(TRIPLET_WEIGHTS)
    p = ", ".join(PAIR_WEIGHTS)
    return f"{t}; T*P+ or T*P- with P in {p}; or P+ / P- alone"


def _canonical(name: str, table: dict) -> str | None:
    lookup = {k.lower(): k for k in table}
    return lookup.get(name.strip().lower())


def parse_weight(name: str) -> WeightSpec:
    """Parse ``T_x``, ``T_x*P_y±`` or ``P_y±``; unknown names raise :class:`CocosError` listing the choices."""
    raw = str(name).strip().replace("\u2212", "-").replace(" ", "")
    parts = raw.split("*")
    triplet = pair = sign = None
    bad = CocosError(f"unknown weight '{name}' (choose from {weight_choices()})")
    if not raw or len(parts) > 2:
        raise bad
    if len(parts) == 2 or _canonical(parts[0], TRIPLET_WEIGHTS):
        triplet = _canonical(parts[0], TRIPLET_WEIGHTS)
        if triplet is None:
            raise bad
    pair_part = parts[1] if len(parts) == 2 else (None if triplet else parts[0])
    if pair_part is not None:
        if pair_part[-1:] not in ("+", "-"):
            if _canonical(pair_part, PAIR_WEIGHTS):
                raise CocosError(f"weight '{name}': say which pair weight, {pair_part}+ (positive) "
                                 f"or {pair_part}- (negative)")
            raise bad
        pair, sign = _canonical(pair_part[:-1], PAIR_WEIGHTS), pair_part[-1]
        if pair is None:
            raise bad
    return WeightSpec(triplet, pair, sign)


def _accepted(fn: Callable) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind == p.KEYWORD_ONLY or (p.kind == p.POSITIONAL_OR_KEYWORD and n not in ("sp", "sn"))}


_ROW_ARGS = {"pos_others", "neg_others", "pos_mask", "neg_mask"}


def known_params() -> set[str]:
    """Every hyper-parameter some weight function takes (``margin``, ``tau``, ``alpha``, ...)."""
    out: set[str] = set()
    for fn in (*TRIPLET_WEIGHTS.values(), *PAIR_WEIGHTS.values()):
        out |= _accepted(fn)
    return out - _ROW_ARGS


def _select(fn: Callable, params: dict) -> dict:
    ok = _accepted(fn)
    return {k: v for k, v in params.items() if k in ok and v is not None}


def _check_params(params: dict) -> None:
    unknown = sorted(set(params) - known_params() - {"compat"})
    if unknown:
        raise CocosError(f"unknown weight parameter {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(known_params()))})")


def weight_params(name: str, **params) -> dict:
    """The parameters that weight ``name`` uses, with their effective values (defaults filled in)."""
    _check_params(params)
    out = {}
    for fn in parse_weight(name).functions():
        for n, p in inspect.signature(fn).parameters.items():
            if n in _accepted(fn) - _ROW_ARGS:
                value = params.get(n)
                if value is None:
                    value = MS_FIGURE_M if n in ("m_pos", "m_neg") else p.default
                out[n] = value
    return out


def weight_grid(name: str, sp, sn, **params) -> torch.Tensor:
    """Evaluate weight ``name`` (``T``, ``T*P±`` or ``P±``) at ``(sp, sn)`` (broadcast).

    Parameters that the named functions do not take are ignored (so one set of
    ``margin``/``tau``/... serves a list of weights); names that no weight takes
    raise :class:`CocosError`.
    """
    spec = parse_weight(name)
    _check_params(params)
    sp, sn = _pair(sp, sn)
    out = None
    if spec.triplet:
        fn = TRIPLET_WEIGHTS[spec.triplet]
        out = fn(sp, sn, **_select(fn, params))
    if spec.pair:
        fn = PAIR_WEIGHTS[spec.pair]
        p_pos, p_neg = fn(sp, sn, **_select(fn, params))
        p = p_pos if spec.sign == "+" else p_neg
        out = p if out is None else out * p
    return torch.broadcast_to(out, torch.broadcast_shapes(sp.shape, sn.shape)).contiguous()


def triplet_part(name: str, sp, sn, **params) -> torch.Tensor | None:
    """The triplet weight ``T`` of weight ``name`` at ``(sp, sn)``, or ``None`` for a pair weight alone."""
    spec = parse_weight(name)
    if spec.triplet is None:
        return None
    return weight_grid(spec.triplet, sp, sn, **params)


# -- triplets of a batch ----------------------------------------------------------------


@dataclass(frozen=True)
class Triplets:
    """Every (query, positive, hardest negative) triplet of one direction: ``(..., Q, A)``.

    ``A`` is the largest number of positives of a query (1 in pair batches).
    ``valid`` is false for padding positives and for queries without any negative.
    """

    p_index: torch.Tensor  # (..., Q, A) candidate index of the positive
    n_index: torch.Tensor  # (..., Q, A) candidate index of the hardest negative
    sp: torch.Tensor  # (..., Q, A)
    sn: torch.Tensor  # (..., Q, A)
    valid: torch.Tensor  # (..., Q, A) bool


def view_triplets(view: QueryView) -> Triplets:
    """The hardest-negative triplets of a view (one per (query, positive))."""
    p_idx, pos_valid = positive_index(view.pos)
    sp = torch.gather(view.scores, -1, p_idx)
    masked = view.scores.masked_fill(~view.neg, -math.inf)
    sn, n_idx = masked.max(-1, keepdim=True)  # first index among ties
    has_neg = view.neg.any(-1, keepdim=True)
    valid = pos_valid & has_neg
    n_idx = n_idx.expand_as(p_idx)
    sn = sn.expand_as(sp)
    return Triplets(p_index=p_idx, n_index=n_idx, sp=sp, sn=sn, valid=valid)


def hardest_triplets(view: QueryView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query and positive: ``(sp, sn, n_star)``, each ``(..., Q, A)`` (``A = 1`` in pair batches).

    ``sp`` is the positive's similarity, ``sn`` that of the hardest in-batch
    negative (``QueryView.neg``: same-image pairs excluded unless compat) and
    ``n_star`` its candidate index. With several positives (image queries of a
    ranking batch) each positive forms its own triplet with the same ``n_star``.
    Entries that are no triplet (padding, or a query without negatives) hold NaN
    in ``sp``/``sn`` and -1 in ``n_star``.
    """
    t = view_triplets(view)
    nan = torch.tensor(math.nan, dtype=t.sp.dtype, device=t.sp.device)
    return (torch.where(t.valid, t.sp, nan), torch.where(t.valid, t.sn, nan),
            torch.where(t.valid, t.n_index, torch.full_like(t.n_index, -1)))


# -- the gradient objective -------------------------------------------------------------


def _resolve(weight, table: dict, kind: str) -> Callable:
    if callable(weight):
        return weight
    name = _canonical(str(weight), table)
    if name is None:
        raise CocosError(f"unknown {kind} weight '{weight}' (choose from {', '.join(table)})")
    return table[name]


def _others(view: QueryView, t: Triplets) -> tuple[torch.Tensor, ...]:
    """Rows of the other positives / other negatives of every triplet: ``(..., Q, A, K)``."""
    k = view.scores.shape[-1]
    cand = torch.arange(k, device=view.scores.device)
    rows = view.scores[..., None, :].expand(*t.sp.shape, k)
    pos_mask = view.pos[..., None, :] & (cand != t.p_index[..., None])
    neg_mask = view.neg[..., None, :] & (cand != t.n_index[..., None])
    return rows, rows, pos_mask, neg_mask


def triplet_weights(view: QueryView, triplet_weight, pair_weight="P_con", **params):
    """Every hardest-negative triplet of a view with its weights: ``(triplets, T, P+, P−)``, each ``(..., Q, A)``.

    ``T`` is the triplet weight, ``P±`` the pair weights (multi-similarity forms from the
    anchor's other positives and negatives in the batch). Entries that are no triplet
    (``triplets.valid`` false) hold values to be ignored.
    """
    t_fn = _resolve(triplet_weight, TRIPLET_WEIGHTS, "triplet")
    p_fn = _resolve(pair_weight, PAIR_WEIGHTS, "pair")
    t = view_triplets(view)
    with torch.no_grad():
        tw = t_fn(t.sp, t.sn, **_select(t_fn, params))
        p_params = _select(p_fn, params)
        if getattr(p_fn, "needs_rows", False):
            pos_rows, neg_rows, pos_mask, neg_mask = _others(view, t)
            p_params = {k: v for k, v in p_params.items() if k not in ("m_pos", "m_neg")}
            p_pos, p_neg = p_fn(t.sp, t.sn, pos_rows, neg_rows, pos_mask=pos_mask, neg_mask=neg_mask,
                                **p_params)
        else:
            p_pos, p_neg = p_fn(t.sp, t.sn, **p_params)
    return t, tw, p_pos, p_neg


def direction_score_gradient(view: QueryView, triplet_weight, pair_weight="P_con", **params) -> torch.Tensor:
    """``dl/dscores`` of one direction, oriented like ``view.scores`` (``(..., Q, K)``).

    Triplet ``(q, p, n*)`` adds ``−T·P+`` at ``[q, p]`` and ``+T·P−`` at ``[q, n*]``.
    """
    t, tw, p_pos, p_neg = triplet_weights(view, triplet_weight, pair_weight, **params)
    with torch.no_grad():
        zero = torch.zeros((), dtype=view.scores.dtype, device=view.scores.device)
        g_pos = torch.where(t.valid, -tw * p_pos, zero).to(view.scores.dtype)
        g_neg = torch.where(t.valid, tw * p_neg, zero).to(view.scores.dtype)
        grad = torch.zeros_like(view.scores)
        grad.scatter_add_(-1, t.p_index, g_pos)
        grad.scatter_add_(-1, t.n_index, g_neg)
    return grad


def score_gradient(scores: torch.Tensor, layout: BatchLayout, triplet_weight, pair_weight="P_con",
                   compat: bool = False, **params) -> torch.Tensor:
    """``dl/dS`` (``(..., B, M)``) of the GOAL objective summed over both directions."""
    total = torch.zeros_like(scores)
    for d in DIRECTIONS:
        g = direction_score_gradient(layout.view(scores, d, compat), triplet_weight, pair_weight, **params)
        total = total + (g.transpose(-1, -2) if d == "t2i" else g)
    return total


def goal_gradient(
    images,
    captions,
    triplet_weight="T_con",
    pair_weight="P_con",
    caption_image=None,
    image_ids=None,
    *,
    compat: bool = False,
    jacobian: bool = False,
    **params,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GOAL gradient objective (paper Eq. 3) of a batch: ``(dl/dimages, dl/dcaptions)``.

    ``images`` ``(..., B, d)``, ``captions`` ``(..., M, d)`` are L2-normalised here;
    caption ``c`` belongs to image row ``caption_image[c]`` (default ``c // (M // B)``);
    ``image_ids`` (dataset ids of the rows) excludes same-image pairs from the
    negatives unless ``compat``, the same masks as the training losses. For an image
    anchor ``x`` with positive ``y`` and hardest negative ``y'``:
    ``dl/dx = T·(P− y' − P+ y)`` plus ``−T·P+ y`` / ``+T·P− y`` of every text triplet in
    which ``x`` is the positive / the hardest negative (and symmetrically for text).
    ``triplet_weight``/``pair_weight`` are names (``"T_nca"``, ``"P_sig"``, ...) or
    functions; ``params`` (``margin``, ``tau``, ``offset``, ``alpha``, ``beta``, ``lam``,
    ``eps``) go to the functions that take them. The result is with respect to the
    normalised embeddings (no normalisation Jacobian) unless ``jacobian=True``.
    ``T_con × P_con`` equals the gradient of the summed Triplet SH loss.
    """
    _check_params(params)
    raw_i = _t(images).detach()
    raw_c = _t(captions).detach().to(device=raw_i.device, dtype=raw_i.dtype)
    norm = torch.nn.functional.normalize
    x, y = norm(raw_i, dim=-1), norm(raw_c, dim=-1)
    layout = BatchLayout.build(x.shape[-2], y.shape[-2], caption_image, image_ids, device=x.device)
    scores = x @ y.transpose(-1, -2)
    g = score_gradient(scores, layout, triplet_weight, pair_weight, compat, **params)
    grad_x = g @ y
    grad_y = g.transpose(-1, -2) @ x
    if jacobian:
        grad_x = (grad_x - x * (x * grad_x).sum(-1, keepdim=True)) / raw_i.norm(dim=-1, keepdim=True)
        grad_y = (grad_y - y * (y * grad_y).sum(-1, keepdim=True)) / raw_c.norm(dim=-1, keepdim=True)
    return grad_x, grad_y


__all__ = [
    "CIR_OFFSET", "MS_EPS", "MS_FIGURE_M", "PAIR_WEIGHTS", "TRIPLET_WEIGHTS", "Triplets", "WeightSpec",
    "direction_score_gradient", "goal_gradient", "hardest_triplets", "known_params", "ms_relative_terms",
    "p_con", "p_lin", "p_lin_ms", "p_sig", "p_sig_ms", "parse_weight", "score_gradient", "t_cir", "t_con",
    "t_nca", "triplet_part", "triplet_weights", "view_triplets", "weight_choices", "weight_grid", "weight_params",
]


# -- the family: training objective with designed gradients, counter and spec ------------------------------------
TRIPLET = {"con": "T_con", "nca": "T_nca", "cir": "T_cir"}
PAIR = {"con": "P_con", "lin": "P_lin", "sig": "P_sig", "lin_ms": "P_lin-ms", "sig_ms": "P_sig-ms"}
DEFAULTS = {"triplet_weight": "con", "pair_weight": "con", "margin": DEFAULT_MARGIN, "tau": 10.0, "alpha": 2.0,
            "beta": 10.0, "lam": 0.5, "offset": False}


def check(params: dict) -> None:
    """Weight names and ranges, one CocosError line naming the allowed values."""
    if params["triplet_weight"] not in TRIPLET:
        raise CocosError(f"unknown triplet weight '{params['triplet_weight']}' (choose from {', '.join(TRIPLET)})")
    if params["pair_weight"] not in PAIR:
        raise CocosError(f"unknown pair weight '{params['pair_weight']}' (choose from {', '.join(PAIR)})")
    for name in ("alpha", "beta"):
        if params[name] <= 0:
            raise CocosError(f"{name} must be positive, got {params[name]:g}")


def _weights(params: dict) -> tuple[str, str, dict]:
    rest = {k: v for k, v in params.items() if k not in ("triplet_weight", "pair_weight")}
    return TRIPLET[params["triplet_weight"]], PAIR[params["pair_weight"]], rest


class DesignedGradient(torch.autograd.Function):
    """Forward: a value to log; backward: a given gradient for ``scores`` (times the upstream gradient)."""

    @staticmethod
    def forward(ctx, scores, grad, value):  # noqa: ARG004
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        return upstream * grad, None, None


def goal_direction(view: QueryView, **params) -> torch.Tensor:
    """One direction of the GOAL objective: Triplet SH value forward, ``−T·P+`` / ``+T·P−`` backward."""
    t_name, p_name, rest = _weights({**DEFAULTS, **params})
    detached = replace(view, scores=view.scores.detach())
    with torch.no_grad():
        grad = direction_score_gradient(detached, t_name, p_name, **rest)
        value = triplet_direction(detached, rest["margin"], hardest=True)
    return DesignedGradient.apply(view.scores, grad, value)


class GoalCounter(Counter):
    """Per query: the negatives whose designed weight ``T·P−`` exceeds ``eps``; ``T``, ``P+``, ``P−`` recorded."""

    uses_eps = True
    autograd = False

    def __init__(self, eps: float = DEFAULT_EPS, **params) -> None:
        check_params(eps=eps)
        self.eps = float(eps)
        self.loss_params = {**DEFAULTS, **params}
        check(self.loss_params)

    def params(self) -> dict:
        return {**self.loss_params, "eps": self.eps}

    def _weights(self, view: QueryView):
        t_name, p_name, rest = _weights(self.loss_params)
        t, tw, p_pos, p_neg = triplet_weights(view, t_name, p_name, **rest)
        neg_weight = torch.where(t.valid, tw * p_neg, 0.0)  # (..., Q, A): the hardest negative's weight
        return t, tw, p_pos, p_neg, neg_weight

    def _count(self, view: QueryView, parts, eps: float, extras: bool = True) -> Count:
        t, tw, p_pos, p_neg, neg_weight = parts
        c_q = (neg_weight > eps).any(-1).to(torch.float64)  # one hardest negative per query: 0 or 1
        batch = batch_counts(c_q)
        if not extras:
            return Count({"C_q": c_q}, batch, view.n_excluded)
        valid = t.valid.to(torch.float64)
        n = valid.sum(-1)

        def per_query(x):
            mean = (torch.where(t.valid, x.to(torch.float64), 0.0)).sum(-1) / n.clamp(min=1)
            return torch.where(n > 0, mean, torch.nan)

        stats = {"T": per_query(tw), "P_pos": per_query(p_pos), "P_neg": per_query(p_neg)}
        for k, v in stats.items():
            batch[k] = nanmean(v)
        weights = torch.zeros_like(view.scores, dtype=torch.float64)
        weights.scatter_add_(-1, t.n_index, neg_weight.to(torch.float64))
        weights = torch.where(view.neg, weights, 0.0)
        comp_q, comp_b = companions(weights)
        batch.update(comp_b)
        return Count({"C_q": c_q, **stats, **comp_q}, batch, view.n_excluded, weights=weights)

    def count(self, view: QueryView) -> Count:
        return self._count(view, self._weights(view), self.eps)

    def sweep(self, view: QueryView, eps_values) -> dict[float, Count]:
        parts = self._weights(view)
        return {float(e): self._count(view, parts, float(e), extras=False) for e in eps_values}

    def count_sweep(self, view: QueryView, eps_values=()) -> tuple[Count, dict[float, dict[str, torch.Tensor]]]:
        """The designed weights once for the count and every threshold (equal to ``count`` and ``sweep``)."""
        parts = self._weights(view)
        main = self._count(view, parts, self.eps)
        return main, {float(e): self._count(view, parts, float(e), extras=False).batch for e in eps_values}


def diagram_weights(params: dict) -> list[str]:
    """The diagram of a GOAL model: its own triplet weight and the two gradient scalars T*P+ and T*P-."""
    t, p = TRIPLET[params["triplet_weight"]], PAIR[params["pair_weight"]]
    return [t, f"{t}*{p}+", f"{t}*{p}-"]


GOAL = Objective(
    name="goal", label="GOAL", layout="pair", direction_loss=goal_direction, defaults=DEFAULTS, combine="sum",
    counter=GoalCounter, stats=("C_q", "C_0", "T", "P_neg"), main_stat="C_q", table=None, color="#9467bd",
    marker="v", undefined_ok=("T", "P_pos", "P_neg"), check=check, distributions=("T", "P_pos", "P_neg"),
    diagram=diagram_weights,
    description="designed gradients T x P on the hardest triplets (Xuan & Chen); triplet_weight con|nca|cir, "
                "pair_weight con|lin|sig|lin_ms|sig_ms",
)
