"""The registry of model families: one :class:`~cocos.models.family.ModelFamily` per family, looked up by name.

The built-in families (``vsepp``, ``vsrn``, ``vsepp_full``) register in :mod:`cocos.models.builtin`. A family in
any installed package registers through the ``cocos.models`` entry-point group
(``[project.entry-points."cocos.models"] linear = "mypkg.models:family"``, the entry point naming a
:class:`ModelFamily` or a list of them), or through ``COCOS_PLUGINS=module[,module]`` (a module on the path that
defines ``model_family`` or ``model_families``); both load with the registry (:func:`load_plugins`).

A plugin that fails to load is one error line naming it. A plugin family whose name is a built-in's is refused
with one warning line naming its package, and everything else keeps working.
"""

from __future__ import annotations

import importlib
import os
import warnings
from importlib.metadata import entry_points

from cocos.errors import CocosError
from cocos.models.family import ModelFamily

ENTRY_POINT_GROUP = "cocos.models"
PLUGINS_ENV = "COCOS_PLUGINS"

_REGISTRY: dict[str, ModelFamily] = {}
_BUILTIN: set[str] = set()
_loaded = False


def _registry() -> dict[str, ModelFamily]:
    global _loaded
    if not _loaded:
        _loaded = True
        from cocos.models import builtin  # noqa: F401  (registers the built-in families)

        _BUILTIN.update(_REGISTRY)
        load_plugins()
    return _REGISTRY


def _register_plugin(found, where: str, package: str) -> None:
    for item in found if isinstance(found, (list, tuple)) else [found]:
        if not isinstance(item, ModelFamily):
            raise CocosError(f"model plugin {where}: names a {type(item).__name__}, not a cocos ModelFamily")
        if item.name in _BUILTIN and _REGISTRY[item.name] is not item:
            warnings.warn(f"model plugin {where} of package {package}: refused, its name '{item.name}' is a built-in "
                          "model family's", stacklevel=2)
            continue
        if _REGISTRY.get(item.name) is not item:
            register(item)


def load_plugins() -> None:
    """Register the model families of installed plugins (module docstring)."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        package = point.dist.name if point.dist is not None else "?"
        try:
            found = point.load()
        except Exception as exc:  # noqa: BLE001 - whatever a broken plugin raises: one line naming it
            raise CocosError(f"model plugin {point.name} ({point.value}) failed to load: {exc}") from None
        _register_plugin(found, f"{point.name} ({point.value})", package)
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            loaded = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - as above
            raise CocosError(f"plugin module {module} ({PLUGINS_ENV}) failed to load: {exc}") from None
        found = getattr(loaded, "model_families", getattr(loaded, "model_family", None))
        if found is not None:
            _register_plugin(found, module, module)


def register(family: ModelFamily, replace: bool = False) -> ModelFamily:
    """Add a family (``replace`` to redefine one); returns it."""
    if not isinstance(family, ModelFamily):
        raise CocosError(f"register() takes a ModelFamily, got {type(family).__name__}")
    registry = _registry()
    if family.name in registry and not replace and registry[family.name] is not family:
        raise CocosError(f"a model family named '{family.name}' is registered already")
    registry[family.name] = family
    return family


def unregister(name: str) -> None:
    _registry().pop(name, None)


def names() -> list[str]:
    """Registered family names, the built-ins first."""
    return list(_registry())


def families() -> list[ModelFamily]:
    return list(_registry().values())


def get_family(name) -> ModelFamily:
    """The registered family ``name`` (a :class:`ModelFamily` is returned as it is); one line for an unknown one."""
    if isinstance(name, ModelFamily):
        return name
    registry = _registry()
    if not isinstance(name, str) or name not in registry:
        raise CocosError(f"unknown model '{name}' (choose from {', '.join(registry)})")
    return registry[name]


def training_family(name: str, images: bool) -> ModelFamily:
    """The family a run of ``--model name`` trains on its data: on raw images a family that reads precomputed
    features gives way to its ``images_family`` (``vsepp`` -> ``vsepp_full``); the input must then be the data's."""
    family = get_family(name)
    if images and family.input != "images" and family.images_family:
        family = get_family(family.images_family)
    wanted = "images" if images else "features"
    if family.input != wanted:
        takes = [f.name for f in families() if f.input == wanted]
        reads = "raw images" if family.input == "images" else "precomputed features"
        what = "raw images train" if images else "precomputed features train"
        raise CocosError(f"--model {name} reads {reads}; {what} {', '.join(takes) or 'no registered model'}")
    return family
