"""``cocos losses``: the registered loss families and what each one knows."""

from __future__ import annotations

import typer

from .common import handle_errors
from .main import app


@app.command("losses")
@handle_errors
def losses() -> None:
    """List the registered losses: layout, parameters and defaults, counter, paper statistics and table."""
    from cocos.losses.spec import format_value
    from cocos.objectives import OBJECTIVES

    for name, spec in OBJECTIVES.items():
        params = ", ".join(f"{k}={format_value(v)}" for k, v in spec.defaults.items()) or "none"
        counter = spec.counter.__name__ if spec.counter is not None else "generic (autograd)"
        eps = " + eps" if spec.uses_eps else ""
        table = f"Table {spec.table}" if spec.table else "own table"
        typer.echo(f"{name:<11} {spec.label}: {spec.description}")
        typer.echo(f"{'':<11} {spec.layout} batches; parameters {params}{eps}; counter {counter}; "
                   f"reports {', '.join(spec.stats)} (main {spec.main_stat}), {table}")
