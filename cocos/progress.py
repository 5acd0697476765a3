"""Progress bars for long work (rich), silent when disabled."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextlib.contextmanager
def progress_bar(
    total: int, description: str, enabled: bool = True, fields: bool = False
) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n=1, status=None)``; draws a bar on stderr when enabled.

    ``status`` (with ``fields=True``) is a short text shown after the bar, e.g. the loss.
    """
    if not enabled or total <= 0:
        yield lambda n=1, status=None: None
        return

    console = Console(file=sys.stderr)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if fields:
        columns.append(TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total, status="")

        def advance(n: int = 1, status: str | None = None) -> None:
            bar.update(task, advance=n, **({"status": status} if status is not None else {}))

        yield advance
