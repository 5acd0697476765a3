"""Entry point of the ``cocos`` console script: one typer app, one module per command.

Start-up (measured): the command modules import the library inside their commands, not at the top. The library
pulls in torch, pandas and matplotlib (1.9 s on this 2-core machine), which ``cocos --help``, ``--version`` and a
mistyped flag (0.13 s) should not wait for.
"""

from __future__ import annotations

import typer

from cocos import __version__

app = typer.Typer(
    name="cocos",
    help="COCOS gradient diagnostics for contrastive image-caption retrieval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no type column (no "<bool>" after flags)
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cocos {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """COCOS gradient diagnostics for contrastive image-caption retrieval."""


def configure_process(argv: list[str] | None = None) -> dict[str, str]:
    """Process-wide settings that must precede loading torch: OpenMP's wait policy for the command named in
    ``argv`` (``sys.argv[1:]``) and the load, :func:`cocos.openmp.configure`; returns the variables it set."""
    import sys

    from cocos.openmp import configure

    args = sys.argv[1:] if argv is None else argv
    command = next((a for a in args if not a.startswith("-")), None)
    threads = None
    for i, arg in enumerate(args):  # --threads N or --threads=N: the cores the command will keep busy
        text = arg.partition("=")[2] if arg.startswith("--threads=") else (
            args[i + 1] if arg == "--threads" and i + 1 < len(args) else "")
        threads = int(text) if text.isdigit() and int(text) > 0 else threads
    return configure(command, threads=threads)


def _main() -> None:
    """``app()`` with click's usage errors (a value of the wrong type or range, an unknown option or command) as one
    ``error:`` line and exit code 2, as every other bad input: click's standalone mode prints a usage line, a hint
    and the error over three or more lines. ``--help`` and a bare ``cocos`` print their help as before."""
    import sys

    try:  # typer >= 0.24 carries its own copy of click
        from typer._click import exceptions
    except ImportError:
        from click import exceptions

    try:
        code = app(standalone_mode=False)
    except getattr(exceptions, "NoArgsIsHelpError", ()) as exc:  # a bare group (click >= 8.2): its help, exit 0
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = 0
    except exceptions.UsageError as exc:
        typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        code = 2
    except getattr(exceptions, "Abort", KeyboardInterrupt):  # click's own Ctrl-C at a prompt
        typer.echo("interrupted", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The console script: a Ctrl-C before a command starts or after it returns is one line and exit code 130."""
    from .common import install_late_interrupt

    install_late_interrupt()
    configure_process()
    try:
        _main()
    finally:  # the command has finished (its outputs are written): a Ctrl-C while Python shuts down changes nothing
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _register() -> None:
    # Each command module adds itself to ``app``; imported here so the order of
    # ``cocos --help`` is stable.
    from . import analyze, count, data, demo, diagram, import_, losses, models, report, sweep, train  # noqa: F401


_register()
