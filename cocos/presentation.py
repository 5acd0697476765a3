"""How a loss family is shown in reports: one small frozen record, stored in every ``results.json``.

A loss spec provides its :class:`Presentation` (:meth:`cocos.losses.spec.Objective.presentation`, built from
its label, statistics, table, colour, marker, parameters and notes; its notes are :class:`TableNote`, which
``cocos.losses.spec.Note`` names); the pipelines
(``cocos analyze``/``cocos count``) write it into ``results.json`` under
``presentation.<loss>``; the report layer reads it from there and never consults the loss
registry, so a report of results made in another process (with a plugin loss, or another
version of a loss) renders the same everywhere. This module sits at the bottom of the
layer order (it imports nothing of cocos but the error type).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cocos.errors import CocosError

GREY = "#7f7f7f"
LAST = 10_000  # the rank of a family without a place in the registry's (paper) order
WHEN = ("always", "compat")


@dataclass(frozen=True)
class TableNote:
    """A note under a family's COCOS table, shown ``when`` "always" or "compat" (compat values shown or differing)."""

    text: str
    latex: str | None = None
    when: str = "always"


@dataclass(frozen=True)
class Presentation:
    """A family's label, statistics (in the paper's order), main statistic, paper table, colour, marker,
    default parameters (Table 1 shows those that differ), table notes and rank (order among families)."""

    label: str
    stats: tuple[str, ...] = ("C_q", "C_B", "C_0")
    main_stat: str = "C_q"
    table: str | None = None
    color: str = GREY
    marker: str = "o"
    params: Mapping[str, float | int | bool | str] = field(default_factory=dict)
    notes: tuple[TableNote, ...] = ()
    rank: int = LAST

    def to_dict(self) -> dict:
        return {"label": self.label, "stats": list(self.stats), "main_stat": self.main_stat, "table": self.table,
                "color": self.color, "marker": self.marker, "params": dict(self.params), "rank": self.rank,
                "notes": [{"text": n.text, "latex": n.latex, "when": n.when} for n in self.notes]}

    @classmethod
    def from_dict(cls, data) -> Presentation:
        """The record of :meth:`to_dict`; anything else is one CocosError line."""
        try:
            out = cls(label=_text(data["label"]), stats=tuple(_text(s) for s in data["stats"]),
                      main_stat=_text(data["main_stat"]),
                      table=None if data.get("table") is None else _text(data["table"]),
                      color=_text(data["color"]), marker=_text(data["marker"]),
                      params={_text(k): _value(v) for k, v in dict(data.get("params") or {}).items()},
                      notes=tuple(TableNote(_text(n["text"]), None if n.get("latex") is None else _text(n["latex"]),
                                            _text(n.get("when", "always"))) for n in data.get("notes") or ()),
                      rank=_count(data.get("rank", LAST)))
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:  # RuntimeError: a tensor
            raise CocosError(f"a loss presentation must hold label, stats, main_stat, table, color, marker, params, "
                             f"notes and rank ({type(exc).__name__}: {exc})") from None
        if any(n.when not in WHEN for n in out.notes):
            raise CocosError(f"a loss presentation's notes are shown {' / '.join(WHEN)}")
        return out


def _text(x) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected text, got {type(x).__name__}")
    return x


def _value(x):
    if not isinstance(x, (bool, int, float, str)):
        raise TypeError(f"a parameter must be a number, a flag or text, got {type(x).__name__}")
    return x


def _count(x) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"rank must be a count, got {x!r}")
    return x


def ranked(names, looks: Mapping[str, Presentation]) -> list[str]:
    """Loss names in the order of their presentations' ranks (then by name), each once."""
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (looks[n].rank if n in looks else LAST, n if n not in looks or
                                        looks[n].rank == LAST else "", names.index(n)))


def format_value(value) -> str:
    """A parameter for people: numbers without trailing zeros (``0.2``, ``10``), names and switches as they are."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return f"{value:g}"
