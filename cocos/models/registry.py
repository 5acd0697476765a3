"""The registry of model families: one :class:`~cocos.models.family.ModelFamily` per family, looked up by name.

The built-in families (``vsepp``, ``vsrn``, ``vsepp_full``, ``vse_infty``, ``vse_infty_full``, ``clip``)
register in :mod:`cocos.models.builtin`. A family in any installed package registers through the
``cocos.models`` entry-point group (``[project.entry-points."cocos.models"] linear = "mypkg.models:family"``,
the entry point naming a :class:`ModelFamily` or a list of them), or through ``COCOS_PLUGINS=module[,module]``
(a module on the path that defines ``model_family`` or ``model_families``); both load with the registry
(:func:`load_plugins`).

Loading, plugins and refusals are the loss registry's (:mod:`cocos.plugins`): a plugin that fails to load is one
error line naming it; a plugin family whose name is a built-in's is refused with one warning line naming its
package, and everything else keeps working.
"""

from __future__ import annotations

from collections.abc import Callable

from cocos.errors import CocosError
from cocos.models.family import ModelFamily
from cocos.plugins import Registry

ENTRY_POINT_GROUP = "cocos.models"
REGISTRY = Registry("model", ModelFamily, ENTRY_POINT_GROUP, "cocos.models.builtin",
                    ("model_families", "model_family"))


def _registry() -> dict[str, ModelFamily]:
    return REGISTRY.specs


def register(family: ModelFamily, replace: bool = False) -> ModelFamily:
    """Add a family (``replace`` to redefine one); returns it."""
    return REGISTRY.register(family, replace)


def unregister(name: str) -> None:
    REGISTRY.unregister(name)


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


def source_names() -> dict[str, list[str]]:
    """Every pre-trained source name of the registered families (:attr:`ModelFamily.sources`), with the families
    that take it: the names ``--source NAME=PATH`` takes, and the flat spellings of earlier records
    (``bert``, ``clip``)."""
    out: dict[str, list[str]] = {}
    for family in families():
        for source in family.sources:
            out.setdefault(source.name, []).append(family.name)
    return out


def folder_checkpoint(path) -> Callable[..., dict] | None:
    """For a Hugging Face model folder (a ``config.json`` with a ``model_type``) the function of the family that
    reads such folders whole (:attr:`ModelFamily.folders`: a CLIP folder), None for anything else (a checkpoint
    file); a model folder no family reads is one line."""
    from cocos.hf import model_type

    kind = model_type(path)
    if kind is None:
        return None
    readers = {t: read for f in families() for t, read in f.folders.items()}
    if kind not in readers:
        raise CocosError(f"{path}: a Hugging Face {kind} folder, which no model family reads as a whole model "
                         f"(folders: {', '.join(sorted(readers)) or 'none'})")
    return readers[kind]
