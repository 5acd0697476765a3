"""Loss parameters as flags: every parameter of a loss family's spec is an option of ``train`` and ``count``.

The flags are not written per loss: a command declares :data:`CONTEXT` and hands the options it does not know
(``ctx.args``) to :func:`as_params`, which turns ``--name VALUE``, ``--name=VALUE`` and, for a switch, ``--name`` /
``--no-name`` into the ``NAME=VALUE`` items of ``-p``; :func:`cocos_cli.common.parse_params` then types and checks
them against the counted families' specs (``Objective.defaults``), so a plugin's parameters are flags too. A flag
that is neither an option of the command nor a parameter of a counted loss is one error line.
"""

from __future__ import annotations

from cocos.errors import CocosError

# typer's context settings of a command that takes loss parameters as flags
CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def _is_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def as_params(args: list[str]) -> list[tuple[str, str]]:
    """``(flag, "NAME=VALUE")`` for each loss flag in ``args`` (the options the command did not parse)."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not _is_flag(token):
            raise CocosError(f"unexpected argument '{token}'")
        name, eq, value = token[2:].partition("=")
        if not eq:
            if i + 1 < len(args) and not _is_flag(args[i + 1]):
                value, i = args[i + 1], i + 1
            elif name.startswith("no-"):  # a switch turned off
                name, value = name[3:], "false"
            else:  # a switch turned on
                value = "true"
        out.append((f"--{name}", f"{name.replace('-', '_')}={value}"))
        i += 1
    return out


def merge(param: list[str], args: list[str], losses: list[str], command: str) -> dict[str, dict]:
    """``-p`` items and loss flags as ``{loss: {name: value}}`` for ``losses`` (see the module docstring)."""
    from .common import parse_params

    params = parse_params(param, losses) if param else {}
    for flag, item in as_params(args):
        try:
            given = parse_params([item], losses)
        except CocosError as exc:
            if "no counted loss takes" not in str(exc):
                raise CocosError(f"{flag}: {str(exc).partition(': ')[2] or exc}") from None
            takes = sorted({p for n in losses for p in _defaults(n)})
            raise CocosError(f"no such option {flag}: not an option of cocos {command} nor a parameter of "
                             f"{', '.join(losses)} (loss parameters: {', '.join(takes) or 'none'})") from None
        for loss, values in given.items():
            for name in values:
                if name in params.get(loss, {}):
                    raise CocosError(f"{flag}: {loss}.{name} is given twice")
            params.setdefault(loss, {}).update(values)
    return params


def _defaults(name: str) -> list[str]:
    from cocos.objectives import get_objective

    return [p.replace("_", "-") for p in get_objective(name).defaults]


HELP = ("Every parameter of the loss (see `cocos losses`) is a flag too, e.g. --margin 0.3, --tau 0.05, "
        "--triplet-weight cir; or -p NAME=VALUE.")
