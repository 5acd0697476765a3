"""Shared CLI plumbing: bad input becomes one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from cocos.errors import CocosError


def fail(message: str) -> None:
    """Print one error line and exit with code 2."""
    first = str(message).strip().splitlines()[0] if str(message).strip() else "error"
    typer.echo(f"error: {first}", err=True)
    raise typer.Exit(code=2)


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn CocosError (bad input) into one clear line and exit code 2, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CocosError as exc:
            fail(str(exc))
        except FileNotFoundError as exc:
            fail(f"{exc.filename or exc}: no such file")
        except OSError as exc:  # a folder where a file was expected, no permission, disk full, ...
            fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper
