"""Typed records from plain data: one check of a dataclass's fields against their annotations.

Every file format cocos reads back (``results.json``, checkpoints) is a tree of plain values whose
parts are described by dataclasses (:mod:`cocos.results`, :mod:`cocos.training.checkpoint`). This
module is the one place that checks such a part: each field present has the type its annotation
names (``str``, ``int``, ``float``, ``bool``, ``dict``, ``list`` and ``None``, joined with ``|``;
an integer is never a bool, a float may be an integer, and must be finite unless the annotation
allows ``inf``), and each field without a default is present. Problems are reported as
``(field, message)`` so every format words its own one-line error around them. Annotations are
strings (``from __future__ import annotations``); a field whose annotation names other types is
left to the format's own checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields

NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "dict": "a dict",
         "list": "a list", "None": "null", "inf": "a number"}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


TESTS: dict[str, Callable[[object], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": _is_int,
    "float": lambda v: _is_number(v) and math.isfinite(v),
    "inf": lambda v: _is_number(v) and not (isinstance(v, float) and math.isnan(v)),  # a number, +-inf allowed
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, (list, tuple)),
    "None": lambda v: v is None,
}


def parts(annotation) -> list[str] | None:
    """The type names of an annotation such as ``"float | None"``; None when one is not a plain type."""
    names = [p.strip().split("[")[0] for p in str(annotation).split("|")]
    return names if all(n in TESTS for n in names) else None


def conforms(value, annotation) -> bool:
    names = parts(annotation)
    return names is None or any(TESTS[n](value) for n in names)


def expected(annotation) -> str:
    """``"an integer"``, ``"a number or null"``: what an annotation asks for, in words."""
    names = parts(annotation) or [str(annotation)]
    return " or ".join(dict.fromkeys(NAMES.get(n, n) for n in names))


def problem(cls, node: Mapping, show: Callable[[object], str] = repr, *,
            complete: bool = True) -> tuple[str, str] | None:
    """The first ``(field, message)`` wrong with ``node`` as a ``cls`` record, or None if every field is right;
    ``complete=False`` checks only the fields present (a record that may lack any of them)."""
    for f in fields(cls):
        if f.name not in node:
            if complete and f.default is MISSING and f.default_factory is MISSING:
                return f.name, "is missing"
            continue
        if not conforms(node[f.name], f.type):
            return f.name, f"must be {expected(f.type)}, got {show(node[f.name])}"
    return None


def build(cls, node: Mapping):
    """``cls`` from the fields of ``node`` it declares (other keys ignored); call after :func:`problem`."""
    return cls(**{f.name: node[f.name] for f in fields(cls) if f.name in node})
