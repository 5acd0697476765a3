"""Shared CLI plumbing: bad input becomes one line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Optional

import typer

from cocos.errors import CocosError


def fail(message: str) -> None:
    """Print one error line and exit with code 2."""
    first = str(message).strip().splitlines()[0] if str(message).strip() else "error"
    typer.echo(f"error: {first}", err=True)
    raise typer.Exit(code=2)


def parse_params(items: list[str], losses: list[str]) -> dict[str, dict]:
    """``-p margin=0.3 -p ntxent.tau=0.05`` as ``{loss: {name: value}}`` for the given losses.

    ``NAME=VALUE`` applies to every given loss that has the parameter; ``LOSS.NAME=VALUE``
    to one loss. A name no given loss takes is refused (one line naming what they take).
    """
    from cocos.objectives import get_objective

    specs = {n: get_objective(n) for n in losses}
    out: dict[str, dict[str, float]] = {}
    for item in items:
        key, value, name, targets = _param_targets(item, specs)
        for t in targets:
            if name in out.get(t, {}):
                raise CocosError(f"--param {key}: {t}.{name} is given twice")
            out.setdefault(t, {})[name] = _param_value(key, value, specs[t].defaults[name])
    return out


def _param_targets(item: str, specs: dict) -> tuple[str, str, str, list[str]]:
    """``(key, value, name, losses)`` of one ``--param`` item: the key as given, the value text
    (stripped), the parameter's name and the counted losses it applies to (every one that takes ``name``, or the
    one ``LOSS.`` names), each of which must take it."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip() or not text.strip():
        raise CocosError(f"--param wants NAME=VALUE or LOSS.NAME=VALUE, got '{item}'")
    loss, dot, name = key.strip().rpartition(".")
    targets = [loss] if dot else [n for n, s in specs.items() if name in s.defaults]
    if dot and loss not in specs:
        raise CocosError(f"--param {key}: '{loss}' is not among the counted losses ({', '.join(specs)})")
    if not targets or any(name not in specs[t].defaults for t in targets):
        takes = "; ".join(f"{n}: {', '.join(s.defaults) or 'none'}" for n, s in specs.items())
        raise CocosError(f"--param {key}: no counted loss takes '{name}' ({takes})")
    return key, text.strip(), name, targets


def _param_value(key: str, value: str, default) -> float | str:
    """A ``--param`` value typed by the parameter's default: a float for a number (else one line naming
    ``key``), the text for a name or a switch (the loss's spec types it)."""
    if isinstance(default, (str, bool)):
        return value
    try:
        return float(value)
    except ValueError:
        raise CocosError(f"--param {key}: '{value}' is not a number") from None


def check_latex_width(width: str) -> None:
    if width not in ("column", "page"):
        raise CocosError(f"unknown --latex-width '{width}' (choose from column, page)")


INTERRUPTED = "interrupted"
_hard_exit = os._exit  # a second Ctrl-C stops at once (tests replace this)


def _on_sigint(signum, frame) -> None:
    """First Ctrl-C: KeyboardInterrupt, and the request stays pending (cocos.io.check_interrupt raises it
    again where something swallowed it). Second Ctrl-C: stop at once with exit code 130, no traceback."""
    from cocos.io import note_interrupt

    if note_interrupt():
        try:
            sys.stdout.flush()
            sys.stderr.write("interrupted again: stopped at once\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        _hard_exit(130)
        return
    raise KeyboardInterrupt


def _install(signum: int, handler) -> Any:
    """``signal.signal(signum, handler)`` unless the signal is ignored (``SIG_IGN``: the process was started with it
    ignored, as ``nohup ... &`` and batch systems start it, or the caller chose so): an ignored signal stays
    ignored, as Python itself leaves an inherited ignored SIGINT. Returns the handler found (``False``: not the
    main thread, nothing changed)."""
    try:
        previous = signal.getsignal(signum)
        if previous is not signal.SIG_IGN:
            signal.signal(signum, handler)
        return previous
    except (ValueError, OSError, AttributeError):  # not the main thread: leave signals alone
        return False


def _restore(signum: int, previous, default) -> None:
    if previous is not False:
        signal.signal(signum, previous if previous is not None else default)


@contextlib.contextmanager
def _interrupt_handling() -> Iterator[None]:
    """Install :func:`_on_sigint` for the command's duration (main thread only, and only for a signal that is not
    ignored), then restore the handler found."""
    from cocos.io import clear_interrupt

    clear_interrupt()
    previous = _install(signal.SIGINT, _on_sigint)
    # SIGTERM (torchrun stopping the other workers when one dies, a batch system's kill) cleans up the same way
    previous_term = _install(signal.SIGTERM, _on_sigint) if previous is not False else False
    try:
        yield
    finally:
        _restore(signal.SIGINT, previous, signal.default_int_handler)
        _restore(signal.SIGTERM, previous_term, signal.SIG_DFL)
        clear_interrupt()


@contextlib.contextmanager
def _library_warnings() -> Iterator[None]:
    """Python warnings of torch, numpy and the like are collected while the command runs: an error then stays one
    line; a command that succeeds prints each distinct one as one ``warning:`` line at the end."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        failed = True
        try:
            yield
            failed = False
        finally:
            if not failed:
                seen = dict.fromkeys((str(w.message).strip().splitlines() or [""])[0] for w in caught)
                for message in seen:
                    typer.echo(f"warning: {message}", err=True)


def _late_interrupt(signum, frame) -> None:
    """Ctrl-C (or SIGTERM) outside a command's own handling: while Python starts up, parses the command line
    or shuts down. One line and exit code 130, never death by the signal or a traceback."""
    try:
        sys.stdout.flush()
        sys.stderr.write(f"{INTERRUPTED}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _hard_exit(130)


def install_late_interrupt() -> None:
    """For the console script: :func:`_late_interrupt` from the start to the end of the process (each command
    installs its own handler for its duration and restores this one)."""
    _install(signal.SIGINT, _late_interrupt)  # an ignored signal stays ignored (nohup, batch systems)
    _install(signal.SIGTERM, _late_interrupt)


def _interrupted() -> None:
    typer.echo(INTERRUPTED, err=True)
    sys.exit(130)


THREADS_OPTION = typer.Option(
    None,
    "--threads",
    metavar="N",
    help="CPU threads of torch (default: OMP_NUM_THREADS when set, else the cores this process may use).",
)


def _with_threads_option(wrapper: Callable[..., Any], func: Callable[..., Any]) -> None:
    """Give ``wrapper`` the signature of ``func`` plus ``threads`` (``--threads``), which typer reads."""
    signature = inspect.signature(func)
    if "threads" in signature.parameters:
        raise TypeError(f"{func.__name__} has its own 'threads' parameter; handle_errors adds --threads")
    threads = inspect.Parameter("threads", inspect.Parameter.KEYWORD_ONLY, default=THREADS_OPTION,
                                annotation=Optional[int])  # noqa: UP045 (typer reads the annotation object)
    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), threads])
    wrapper.__annotations__ = {**getattr(func, "__annotations__", {}), "threads": Optional[int]}  # noqa: UP045


def _error_line(exc: Exception) -> str:
    """The one line a command prints for a user's error: the library's message, or the file an OS error names."""
    if isinstance(exc, CocosError):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: no such file"
    # a folder where a file was expected, no permission, disk full, ...
    return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")


def check_input_file(path, what: str = "file") -> None:
    """An input the command reads as a file: it exists and is not a folder (one line otherwise). Standard library
    only: commands call it (through ``handle_errors(check=...)``) before importing torch, pandas and matplotlib,
    which take seconds to load (a minute on a busy machine) that a mistyped path should not wait for."""
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such {what}")
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, not a {what}")


def check_input_dir(path, what: str = "folder") -> None:
    """An input the command reads as a folder: it exists and is a folder (standard library only, as
    :func:`check_input_file`)."""
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such {what}")
    if not path.is_dir():
        raise CocosError(f"{path}: is not a folder (expected a {what})")


def check_input_path(path, what: str = "file or folder") -> None:
    """An input that may be a file or a folder: it exists."""
    from pathlib import Path

    if not Path(path).exists():
        raise CocosError(f"{path}: no such {what}")


def handle_errors(func: Callable[..., Any] | None = None, *,
                  check: Callable[[dict], None] | None = None) -> Callable[..., Any]:
    """Turn CocosError (bad input) into one clear line and exit code 2, never a traceback.

    Ctrl-C gives one line and exit code 130: also when something swallowed the KeyboardInterrupt
    (the request stays pending and is honoured when the command returns) or turned it into an
    error on its way up; a second Ctrl-C stops at once.

    ``check`` (``@handle_errors(check=...)``): called with the command's arguments (a dict by parameter name)
    before anything heavy is imported; it checks the paths the command reads and writes with the standard library
    (and :mod:`cocos.io`), so that a missing file is one line at once, not after seconds of loading torch.

    Every command gets ``--threads N`` here (one definition, :data:`THREADS_OPTION`): torch's CPU threads are
    set by :func:`cocos.device.set_threads` before the command runs (after ``check``), to N or to the default there.
    """
    if func is None:
        return functools.partial(handle_errors, check=check)
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, threads: int | None = None, **kwargs: Any) -> Any:
        with _interrupt_handling(), _library_warnings():
            try:  # a Ctrl-C (or torchrun's SIGTERM) while an error is being handled below is an interruption too
                try:
                    if check is not None:
                        bound = signature.bind_partial(*args, **kwargs)
                        check(dict(bound.arguments))
                    from cocos.device import set_threads, steady_heap

                    steady_heap()  # freed tensors are reused from the heap (see cocos.device.steady_heap)
                    set_threads(threads)
                    result = func(*args, **kwargs)
                except (CocosError, OSError) as exc:
                    from cocos.io import interrupt_pending

                    if interrupt_pending():
                        _interrupted()
                    fail(_error_line(exc))
                from cocos.io import interrupt_pending

                if interrupt_pending():
                    _interrupted()
                return result
            except KeyboardInterrupt:
                _interrupted()

    _with_threads_option(wrapper, func)
    return wrapper


def check_open_clip_args(config, tokenizer, vocab=None, bert=None, data=None, *, needs_data: bool = False) -> None:
    """``--open-clip-config`` (a file) with ``--tokenizer`` (a folder), neither ``--vocab`` nor ``--bert`` (and with
    ``needs_data``, ``--data``); ``--tokenizer`` only with it (``cocos analyze``, ``cocos import``)."""
    if config is None:
        if tokenizer is not None:
            raise CocosError("--tokenizer is for open_clip checkpoints (with --open-clip-config CONFIG.json)")
        return
    check_input_file(config, "open_clip model config")
    if vocab is not None or bert is not None:
        raise CocosError("--open-clip-config reads open_clip checkpoints; --vocab and --bert do not apply")
    if tokenizer is None:
        raise CocosError("an open_clip checkpoint holds no tokenizer; pass --tokenizer DIR (a Hugging Face CLIP "
                         "tokenizer folder: tokenizer.json, or vocab.json and merges.txt)")
    check_input_dir(tokenizer, "tokenizer folder")
    if needs_data and data is None:
        raise CocosError("an open_clip checkpoint records no data; pass --data (an image dataset)")
