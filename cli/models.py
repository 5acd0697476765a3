"""``cocos models``: the registered model families and what each one takes."""

from __future__ import annotations

import typer

from .common import handle_errors
from .main import app


@app.command("models")
@handle_errors
def models() -> None:
    """List the registered model families: input, caption input, hyper-parameters and defaults, original imports, the
    pre-trained sources a run starts from."""
    from cocos.losses.spec import format_value
    from cocos.models.registry import families

    width = max(len(f.name) for f in families())
    for family in families():
        params = ", ".join(f"{k}={format_value(v)}" for k, v in family.defaults.items()) or "none"
        imports = (f"imports {family.original.encoder}" if family.original is not None
                   else f"imports {family.imports}" if family.imports else "no original imports")
        typer.echo(f"{family.name:<{width}} {family.label}: {family.description}")
        typer.echo(f"{'':<{width}} input {family.input}, captions {family.text}; parameters {params}; {imports}")
        for source in family.sources:  # what a run starts from: --NAME PATH, or --source NAME=PATH
            typer.echo(f"{'':<{width}} source --{source.name} {source.metavar}: {source.what}")
