"""Progress bars for long work (rich); where no bar is drawn, a long phase still says where it is.

:func:`progress_bar` draws a bar on stderr when it is enabled and stderr is a terminal. Where no bar can be
watched (``--no-progress``, or stderr redirected to a file or a pipe, where rich draws only the finished bar), a
phase that runs longer than :data:`HEARTBEAT_S` says where it stands in one line, at most once a
:data:`HEARTBEAT_S` (``description: done/total (share) after N s; status``, on stderr unless given ``log``; rank
0 alone under torchrun): a phase shorter than that prints nothing more than before. Work counted in epochs
says so once per epoch instead (the trainer's and the pre-training's epoch lines).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

HEARTBEAT_S = 60.0  # a phase without a bar says where it is at most this often (and first after this long)


def draws_bar(enabled: bool = True) -> bool:
    """Whether :func:`progress_bar` draws a live bar: enabled, and stderr a terminal."""
    return bool(enabled) and Console(file=sys.stderr).is_terminal


def _main_process() -> bool:
    """Not a rank other than 0 of a torchrun launch (``RANK``): rank 0 alone prints."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Heartbeat:
    """The lines of a phase without a live bar (module docstring): ``advance(n, status)`` as the bar's, a line to
    ``log`` when ``every`` seconds have passed since the phase began or since its last line."""

    def __init__(self, total: int, description: str, log: Callable[[str], None] | None = None,
                 every: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.description, self.every, self.clock = int(total), description, float(every), clock
        self.log = log if log is not None else _stderr
        self.done, self.status = 0, None
        self.start = self.last = clock()

    def advance(self, n: int = 1, status: str | None = None) -> None:
        self.done += n
        if status is not None:
            self.status = status
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            self.log(self.line(now))

    def line(self, now: float) -> str:
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        status = f"; {self.status}" if self.status else ""
        return f"{self.description}: {self.done:,}/{self.total:,}{share} after {now - self.start:.0f} s{status}"


@contextlib.contextmanager
def progress_bar(
    total: int, description: str, enabled: bool = True, fields: bool = False, *,
    log: Callable[[str], None] | None = None, every: float | None = HEARTBEAT_S,
) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n=1, status=None)``; draws a bar on stderr when enabled (module docstring).

    ``status`` (with ``fields=True``) is a short text shown after the bar, e.g. the loss. Without a live bar a
    phase longer than ``every`` seconds says where it is at most once every ``every`` seconds, to ``log`` (default
    stderr); ``every=None``: silent.
    """
    if total <= 0:
        yield lambda n=1, status=None: None
        return
    quiet = every is None or draws_bar(enabled) or not _main_process()
    beat = None if quiet else Heartbeat(total, description, log, every)
    if not enabled:
        yield beat.advance if beat is not None else (lambda n=1, status=None: None)
        return

    console = Console(file=sys.stderr)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if fields:
        columns.append(TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total, status="")

        def advance(n: int = 1, status: str | None = None) -> None:
            bar.update(task, advance=n, **({"status": status} if status is not None else {}))
            if beat is not None:  # stderr is a file: rich draws the bar when it is finished, the lines meanwhile
                beat.advance(n, status)

        yield advance
