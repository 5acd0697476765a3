"""``cocos report RESULTS... --out DIR``: paper-ready tables and a figure over many results.json."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import handle_errors
from cli.main import app
from cocos.errors import CocosError

COUNTING = {"own": None, "compat": True, "corrected": False}


@app.command("report")
@handle_errors
def report(
    results: list[Path] = typer.Argument(..., help="results.json files written by `cocos analyze`."),
    out: Path = typer.Option(Path("reports/summary"), "--out", "-o",
                             help="Output folder (replaced whole if cocos wrote it)."),
    counting: str = typer.Option("own", help="Counting mode shown: own (each file's), compat, corrected."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out folder that cocos did not write."),
) -> None:
    """Tables 1-4 of the COCOS paper (mean ± std over seeds) and COCOS vs rsum, from results.json files."""
    from cocos.report.merge import build_report, write_report
    from cocos.report.tables import to_markdown

    if counting not in COUNTING:
        raise CocosError(f"unknown counting mode '{counting}' (choose from {', '.join(COUNTING)})")
    report = build_report(results, compat=COUNTING[counting])
    files = write_report(report, out, overwrite=overwrite)
    for w in report.warnings:
        typer.echo(f"warning: {w}", err=True)
    typer.echo(to_markdown(report.tables[0]))
    typer.echo(f"{len(report.results)} results in {len(report.groups)} groups; "
               f"wrote {', '.join(str(f) for f in files)}")
