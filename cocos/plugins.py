"""A registry of specs with plugins: the one mechanism behind the loss families (:mod:`cocos.objectives`) and the
model families (:mod:`cocos.models.registry`).

A :class:`Registry` holds specs by name in registration order. On first use it imports its built-in module (which
registers the built-in specs) and then its plugins: every entry point of its group (``[project.entry-points."GROUP"]
name = "package.module:spec"``, naming a spec or a list of them) and every module named in ``COCOS_PLUGINS``
(comma-separated modules on the path; their ``attributes``, e.g. ``objective``/``objectives``, if they define them).

- A plugin that fails to load, or names something that is not a spec, is one error line naming it.
- A plugin whose spec takes a built-in's name is refused with one ``warning:`` line naming its package (a Python
  warning, which the CLI prints as one line), and everything else keeps working.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Iterator
from importlib.metadata import entry_points

from cocos.errors import CocosError

PLUGINS_ENV = "COCOS_PLUGINS"


class Registry:
    """Specs of one kind (``what``: "loss", "model"; ``cls``: their class) by name (see the module docstring)."""

    def __init__(self, what: str, cls: type, group: str, builtin: str, attributes: tuple[str, ...]) -> None:
        self.what, self.cls, self.group, self.builtin, self.attributes = what, cls, group, builtin, attributes
        self._specs: dict = {}
        self._builtin_names: set[str] = set()
        self._loaded = False

    @property
    def specs(self) -> dict:
        """The registry itself, name -> spec, the built-ins first (loaded on first use)."""
        if not self._loaded:
            self._loaded = True
            importlib.import_module(self.builtin)  # registers the built-in specs through register()
            self._builtin_names.update(self._specs)
            self.load_plugins()
        return self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self.specs)

    def register(self, spec, replace: bool = False):
        """Add a spec (``replace`` to redefine one); returns it."""
        if not isinstance(spec, self.cls):
            raise CocosError(f"register() takes a {self.cls.__name__}, got {type(spec).__name__}")
        specs = self.specs
        if spec.name in specs and not replace and specs[spec.name] is not spec:
            raise CocosError(f"a {self.what} named '{spec.name}' is registered already")
        specs[spec.name] = spec
        return spec

    def unregister(self, name: str) -> None:
        self.specs.pop(name, None)

    def load_plugins(self) -> None:
        """Register the specs of installed plugins: the entry points of the group, then ``COCOS_PLUGINS``."""
        for point in entry_points(group=self.group):
            package = point.dist.name if point.dist is not None else point.value.partition(":")[0]
            where = f"{point.name} ({point.value}) of package {package}"
            found = _import(lambda point=point: point.load(), f"{self.what} plugin {where}")
            self._add(found, f"{point.name} ({point.value})", package)
        for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
            loaded = _import(lambda module=module: importlib.import_module(module),
                             f"{self.what} plugin module {module} ({PLUGINS_ENV})")
            found = next((getattr(loaded, a) for a in self.attributes if hasattr(loaded, a)), None)
            if found is not None:
                self._add(found, module, module)

    def _add(self, found, where: str, package: str) -> None:
        for spec in found if isinstance(found, (list, tuple)) else [found]:
            if not isinstance(spec, self.cls):
                raise CocosError(f"{self.what} plugin {where}: names a {type(spec).__name__}, not a cocos "
                                 f"{self.cls.__name__}")
            if spec.name in self._builtin_names and self._specs[spec.name] is not spec:
                warnings.warn(f"{self.what} plugin {where} of package {package}: refused, its name '{spec.name}' is "
                              f"a built-in {self.what} family's", stacklevel=2)
            elif self._specs.get(spec.name) is not spec:
                self.register(spec)


def _import(load, what: str):
    """``load()`` (a plugin's import), whatever it raises as one :class:`CocosError` line naming ``what`` (its entry
    point and package): an exception, and also ``SystemExit`` (a plugin that calls ``sys.exit(0)`` on import must
    not end a command with exit 0 and nothing done) and a ``KeyboardInterrupt`` the plugin raised itself. A real
    Ctrl-C (the CLI's handler has recorded it: :func:`cocos.io.interrupt_pending`) stays an interruption (exit 130).
    """
    try:
        return load()
    except KeyboardInterrupt:
        from cocos.io import interrupt_pending

        if interrupt_pending():
            raise
        raise CocosError(f"{what} raised KeyboardInterrupt while it was imported; cocos stops") from None
    except SystemExit as exc:
        raise CocosError(f"{what} called sys.exit({exc.code!r}) while it was imported; cocos stops") from None
    except Exception as exc:  # noqa: BLE001 - whatever a broken plugin raises: one line naming it
        raise CocosError(f"{what} failed to load: {exc}") from None
