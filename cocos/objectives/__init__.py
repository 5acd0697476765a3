"""The registry of loss families: one :class:`Objective` per family, looked up by name.

``get_objective(name)`` gives a registered family; ``resolve(x)`` also accepts an
:class:`Objective` (registered or not) and any callable with the ``get_loss``
signature ``(images, captions, caption_image=None) -> scalar``. ``register`` adds
a family: it then appears in ``cocos.objectives.get_loss``, ``count_batch``, the
engine, the CLI's ``--loss`` choices, the tables and the figures. The built-in
families (Triplet, Triplet SH, NT-Xent, SmoothAP, GOAL, IMC), each defined in its module of
:mod:`cocos.losses`, register in :mod:`.builtin`.

Plugins: a family in any installed package registers through the ``cocos.losses``
entry-point group (``[project.entry-points."cocos.losses"] mytrip = "mypkg.losses:objective"``,
the entry point naming an :class:`Objective`), or through ``COCOS_PLUGINS=module[,module]``
for modules on the path; both are loaded with the registry (:mod:`cocos.plugins`, shared with the model families).
A plugin family that takes a built-in's name is refused with one warning line naming its package.
"""

from __future__ import annotations

from cocos.errors import CocosError
from cocos.losses.spec import DEFAULT_EPS, Note, Objective, from_callable
from cocos.plugins import PLUGINS_ENV, Registry  # noqa: F401  (PLUGINS_ENV re-exported)

ENTRY_POINT_GROUP = "cocos.losses"  # ``name = package.module:objective`` in a plugin's pyproject.toml
REGISTRY = Registry("loss", Objective, ENTRY_POINT_GROUP, "cocos.objectives.builtin", ("objectives", "objective"))


def _registry() -> dict[str, Objective]:
    """The registry, with the built-in families and then the plugins loaded on first use (:mod:`cocos.plugins`)."""
    return REGISTRY.specs


def load_plugins() -> None:
    """Register the loss families of installed plugins (:meth:`cocos.plugins.Registry.load_plugins`)."""
    REGISTRY.load_plugins()


def __getattr__(name: str):
    if name == "OBJECTIVES":  # the registry itself, name -> Objective, built-ins first
        return _registry()
    raise AttributeError(name)


def register(objective: Objective, replace: bool = False) -> Objective:
    """Add a family to the registry (``replace`` to redefine one); returns it."""
    return REGISTRY.register(objective, replace)


def unregister(name: str) -> None:
    REGISTRY.unregister(name)


def names() -> list[str]:
    """Registered family names in registration order (the built-ins in the paper's order)."""
    return list(_registry())


def paper_names() -> list[str]:
    """The families of the COCOS paper's tables (Triplet, Triplet SH, NT-Xent, SmoothAP): the default counters."""
    return [n for n, o in _registry().items() if o.table]


def get_objective(name: str) -> Objective:
    if isinstance(name, Objective):
        return name
    registry = _registry()
    if name not in registry:
        raise CocosError(f"unknown loss '{name}' (choose from {', '.join(registry)})")
    return registry[name]


def get_loss(name, compat: bool = False, **params):
    """The training loss of a registered family (or an ``Objective``): a module mapping ``(images, captions,
    caption_image=None, image_ids=None)`` to the scalar loss, whose positives, negatives and maths are those of
    the family's counter; ``None`` parameters take the family's defaults."""
    return get_objective(name).loss(compat=compat, **params)


def resolve(loss) -> Objective:
    """A registered name, an :class:`Objective`, or a whole-batch callable, as an :class:`Objective`."""
    if isinstance(loss, Objective):
        return loss
    if isinstance(loss, str):
        return get_objective(loss)
    return from_callable(loss)


def counter_params(trained: str | None, trained_params: dict, losses) -> dict:
    """Counter parameters: the paper's defaults, except where the model's own training loss says otherwise.

    A hyper-parameter of the training loss applies to its own counter and to the
    counters of the same paper table (Table 2 compares Triplet and Triplet SH at the
    model's margin); NT-Xent and SmoothAP keep their own temperatures.
    """
    registry = _registry()
    own = registry.get(trained) if trained else None
    params: dict = {}
    for name in losses:
        spec = registry.get(name)
        if own is None or spec is None:
            continue
        if name == own.name or (spec.table is not None and spec.table == own.table):
            params[name] = {k: v for k, v in trained_params.items() if k in spec.defaults}
    return params


def order(losses) -> list[str]:
    """Loss names in registry order; unregistered names after them, sorted."""
    losses = list(dict.fromkeys(losses))
    registry = _registry()
    known = [n for n in registry if n in losses]
    return known + sorted(n for n in losses if n not in registry)


def label(name: str) -> str:
    registry = _registry()
    return registry[name].label if name in registry else str(name)


def parse_names(requested) -> list[str]:
    """``["all"]``, ``["triplet,ntxent"]``, ... as registered names, in the given order (duplicates dropped)."""
    registry = _registry()
    out: list[str] = []
    for item in requested:
        for name in str(item).split(","):
            name = name.strip()
            if name == "all":
                out.extend(registry)
            elif name == "paper":
                out.extend(paper_names())
            elif name in registry:
                out.append(name)
            elif name:
                raise CocosError(f"unknown loss '{name}' (choose from paper, all, {', '.join(registry)})")
    if not out:
        raise CocosError("no loss given")
    return list(dict.fromkeys(out))

__all__ = ["DEFAULT_EPS", "OBJECTIVES", "Note", "Objective", "from_callable", "get_loss", "get_objective", "label",
           "names", "order", "paper_names", "parse_names", "register", "resolve", "unregister"]
