"""Typed records from plain data: one declarative check of a dataclass's fields.

Every file format cocos reads back (``results.json``, checkpoints) is a tree of plain values whose
parts are described by dataclasses (:mod:`cocos.results`, :mod:`cocos.training.ckpt_schema`). This
module is the one place that checks such a part: each field present has the type its annotation
names, and each field without a default is present. Problems are reported as ``(field, message)``
so every format words its own one-line error around them. Annotations are strings (``from
__future__ import annotations``) of the names of :data:`TESTS` joined with ``|``: ``str``, ``int``
(never a bool), ``float`` (a finite number; an integer is one), ``inf`` (a number, infinity
allowed), ``number`` (a number whose infinity is refused in words of its own), ``finite``,
``name`` (a non-empty string), ``scalar`` (a number, a name or a switch), ``setting`` (plain
values, finite), ``bool``, ``dict``, ``list``, ``None`` and ``any`` (whatever the rules allow). A
name that is another record (a dataclass of the record's module) is checked as a nested record;
any other name leaves the field to the format's own checks.

A field declared with :func:`spec` carries rules beyond its type: bounds, a non-empty string, a
pattern, choices, the lengths of a list, string keys, the items of a list or the values of a dict
(each a :func:`each` rule of its own), its own wording of a value of the wrong shape (``says``) and
the key it has in the data when that is no Python name (``key``). A record class may say what
becomes of the keys it does not declare with a class attribute ``EXTRA``: a message refuses them
(before its fields are checked: a misspelt name is named as such), an :func:`each` rule checks
their values (after the fields); without it they are ignored.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass

NAMES = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false", "dict": "a dict",
         "list": "a list", "None": "null", "inf": "a number", "number": "a number", "finite": "a finite number",
         "name": "a non-empty string", "scalar": "a number, a name or a switch", "setting": "plain numbers",
         "any": "anything"}
PLAIN = (int, float, bool, str, type(None))

# names for the annotations of records (``epoch: number``): the checks read the annotation's words, not these
number = finite = inf = float


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _flat(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


TESTS: dict[str, Callable[[object], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": _is_int,
    "float": lambda v: _is_number(v) and math.isfinite(v),
    "inf": lambda v: _is_number(v) and not math.isnan(v),  # a number, +-inf allowed
    "number": lambda v: _is_number(v) and not math.isnan(v),  # then refused when infinite: "must be finite"
    "finite": lambda v: _is_number(v) and math.isfinite(v),
    "name": lambda v: isinstance(v, str) and v != "",
    "scalar": lambda v: _is_number(v) or isinstance(v, (str, bool)),
    "setting": lambda v: all(isinstance(x, PLAIN) for x in _flat(v)),  # then refused when not finite
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, (list, tuple)),
    "None": lambda v: v is None,
    "any": lambda v: True,  # no type: the rules say what the value must be
}
FINITE = ("number", "setting")  # types whose values must be finite, said so in words of their own


@dataclass(frozen=True)
class Rule:
    """What a value must be beyond its type; ``type`` the annotation of an item or value (:func:`each`)."""

    type: object = None
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    nonempty: bool = False
    pattern: str | None = None
    choices: tuple | None = None
    lengths: tuple | None = None
    keys: bool = False  # a dict's keys must be strings
    items: Rule | None = None
    values: Rule | None = None
    says: str | None = None  # the message for a value not of the shape asked ("{got}": the value shown)
    key: str | None = None  # the field's key in the data, when it is not the field's name (``lambda``)


NO_RULE = Rule()


def spec(default=MISSING, *, factory=MISSING, **rules):
    """A record field with :class:`Rule` ``rules``; ``default`` (or ``factory``) makes it optional."""
    return field(default=default, default_factory=factory, metadata={"rule": Rule(**rules)})


def each(annotation, **rules) -> Rule:
    """The rule of each item of a list or value of a dict: its annotation (a record class allowed) and rules."""
    return Rule(type=annotation, **rules)


def _rule(f) -> Rule:
    return f.metadata.get("rule", NO_RULE)


def _key(f) -> str:
    return _rule(f).key or f.name


def parts(annotation, scope: Mapping | None = None) -> list | None:
    """The type names (and record classes) of an annotation such as ``"float | None"``; None when one is neither."""
    if isinstance(annotation, type):
        return [annotation] if is_dataclass(annotation) else None
    out: list = []
    for part in str(annotation).split("|"):
        word = part.strip().split("[")[0]
        if word in TESTS:
            out.append(word)
            continue
        found = (scope or {}).get(word)
        if not (isinstance(found, type) and is_dataclass(found)):
            return None
        out.append(found)
    return out


def _passes(value, kind) -> bool:
    return isinstance(value, dict) if isinstance(kind, type) else TESTS[kind](value)


def conforms(value, annotation) -> bool:
    names = parts(annotation)
    return names is None or any(_passes(value, n) for n in names)


def expected(annotation, scope: Mapping | None = None) -> str:
    """``"an integer"``, ``"a number or null"``: what an annotation asks for, in words (a record: a dict)."""
    names = parts(annotation, scope) or [str(annotation)]
    return " or ".join(dict.fromkeys("a dict" if isinstance(n, type) else NAMES.get(n, n) for n in names))


def _scope(cls) -> Mapping:
    module = sys.modules.get(getattr(cls, "__module__", ""))
    return vars(module) if module is not None else {}


def problem(cls, node: Mapping, show: Callable[[object], str] = repr, *,
            complete: bool = True) -> tuple[str, str] | None:
    """The first ``(field, message)`` wrong with ``node`` as a ``cls`` record, or None if every field is right;
    ``complete=False`` checks only the fields present (a record that may lack any of them). ``field`` is a path
    below the record: ``"k"``, ``"weights.sha256"``, ``"feature_shape[0]"``."""
    scope, closed = _scope(cls), isinstance(getattr(cls, "EXTRA", None), str)
    found = _extra(cls, node, show) if closed else None  # first: a misspelt name is named, not the one it misses
    if found is not None:
        return found
    for f in fields(cls):
        key = _key(f)
        if key not in node:
            if complete and f.default is MISSING and f.default_factory is MISSING:
                return key, "is missing"
            continue
        found = check(node[key], f.type, _rule(f), show, scope)
        if found is not None:
            return key + found[0], found[1]
    return None if closed else _extra(cls, node, show)


def _extra(cls, node: Mapping, show) -> tuple[str, str] | None:
    """The keys ``cls`` does not declare, against its ``EXTRA`` (a message refuses them, a rule checks them)."""
    extra = getattr(cls, "EXTRA", None)
    declared = {_key(f) for f in fields(cls)}
    for key in (k for k in node if k not in declared) if extra is not None else ():
        if isinstance(extra, str):
            return str(key), extra
        found = check(node[key], extra.type, extra, show, _scope(cls))
        if found is not None:
            return f"{key}{found[0]}", found[1]
    return None


def check_record(cls, node, show: Callable[[object], str] = repr, *,
                 complete: bool = True) -> tuple[str, str] | None:
    """``node`` as a ``cls`` record: a dict with string keys whose fields are right (:func:`problem`); the
    path is ``""`` for the node itself, ``".field..."`` below it."""
    if not isinstance(node, dict):
        return "", f"must be a dict, got {show(node)}"
    bad = [k for k in node if not isinstance(k, str)]
    if bad:
        return "", f"must have string keys, has {show(bad[0])}"
    found = problem(cls, node, show, complete=complete)
    return None if found is None else ("." + found[0], found[1])


def check(value, annotation, rule: Rule = NO_RULE, show: Callable[[object], str] = repr,
          scope: Mapping | None = None) -> tuple[str, str] | None:
    """One value against an annotation and its rule: ``(path below the value, message)`` or None."""
    names = parts(annotation, scope)
    return None if names is None else _check(value, names, annotation, rule, show, scope)


def _check(value, names: list, annotation, rule: Rule, show, scope) -> tuple[str, str] | None:
    """:func:`check` with the annotation's parts resolved (once for all the items of a list)."""
    kind = next((n for n in names if _passes(value, n)), MISSING)
    if kind is MISSING:
        return "", f"must be {expected(annotation, scope)}, got {show(value)}"
    if isinstance(kind, type):
        return check_record(kind, value, show)
    message = _scalar_problem(value, kind, rule, show)
    if message is not None:
        return "", message
    return _inner_problem(value, rule, show, scope)


def _scalar_problem(value, kind: str, rule: Rule, show) -> str | None:
    """What is wrong with a value of the right type: finite, bounds, emptiness, shape, keys."""
    if kind in FINITE and not _finite(value):
        return f"must be finite, got {show(value)}"
    bound = _bound_problem(value, rule) if _is_number(value) else None
    if bound is not None:
        return bound
    if rule.nonempty and value == "":
        return "must not be empty"
    if _misshapen(value, rule):
        return (rule.says or _shape_words(rule)).format(got=show(value))
    bad = [k for k in value if not isinstance(k, str)] if rule.keys and isinstance(value, dict) else []
    return f"must have string keys, has {show(bad[0])}" if bad else None


def _finite(value) -> bool:
    """No infinite or NaN number in a value (or its items)."""
    return not any(_is_number(x) and not math.isfinite(x) for x in _flat(value))


def _bound_problem(value, rule: Rule) -> str | None:
    if rule.minimum is not None and value < rule.minimum:
        return f"must be at least {rule.minimum}, got {value}"
    if rule.above is not None and not value > rule.above:
        return f"must be greater than {rule.above}, got {value}"
    if rule.maximum is not None and value > rule.maximum:
        return f"must be at most {rule.maximum}, got {value}"
    return None


def _misshapen(value, rule: Rule) -> bool:
    """Not one of ``choices``, not matching ``pattern``, or a list of none of ``lengths``."""
    if rule.choices is not None and value not in rule.choices:
        return True
    if rule.pattern is not None and not (isinstance(value, str) and re.fullmatch(rule.pattern, value)):
        return True
    return rule.lengths is not None and isinstance(value, (list, tuple)) and len(value) not in rule.lengths


def _shape_words(rule: Rule) -> str:
    if rule.choices is not None:
        return f"must be one of {', '.join(map(str, rule.choices))}, got {{got}}"
    if rule.pattern is not None:
        return f"must match {rule.pattern}, got {{got}}"
    return f"must have {' or '.join(map(str, rule.lengths or ()))} items, got {{got}}"


def _inner_problem(value, rule: Rule, show, scope) -> tuple[str, str] | None:
    """The items of a list (``[i]``) and the values of a dict (``.key``), each against its rule."""
    if rule.items is not None and isinstance(value, (list, tuple)):
        sub, keys, items, label = rule.items, range(len(value)), value, "[{}]"
    elif rule.values is not None and isinstance(value, dict):
        sub, keys, items, label = rule.values, list(value), list(value.values()), ".{}"
    else:
        return None
    names = parts(sub.type, scope)
    if names is None or _all_pass(items, names, sub):
        return None
    for key, item in zip(keys, items, strict=True):
        found = _check(item, names, sub.type, sub, show, scope)
        if found is not None:
            return label.format(key) + found[0], found[1]
    return None


def _all_pass(items, names: list, rule: Rule) -> bool:
    """Whether every item passes an item rule that is its type alone (a vocabulary's tokens: one quick pass)."""
    if rule != Rule(type=rule.type) or any(isinstance(n, type) or n in FINITE for n in names):
        return False
    tests = [TESTS[n] for n in names]
    return all(any(test(item) for test in tests) for item in items) if len(tests) > 1 else all(map(tests[0], items))


def build(cls, node: Mapping):
    """``cls`` from the fields of ``node`` it declares (other keys ignored); call after :func:`problem`."""
    return cls(**{f.name: node[_key(f)] for f in fields(cls) if _key(f) in node})
