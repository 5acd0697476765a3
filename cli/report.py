"""``cocos report RESULTS... --out DIR``: paper-ready tables and a figure over many results.json."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import check_input_path, check_latex_width, handle_errors
from .main import app

COUNTING = {"own": None, "compat": True, "corrected": False}


def _check_paths(args: dict) -> None:
    """The inputs exist (files or folders), before the heavy imports."""
    for path in args.get("results") or []:
        check_input_path(path, "file")


@app.command("report")
@handle_errors(check=_check_paths)
def report(
    results: list[Path] = typer.Argument(..., help="results.json files (of cocos analyze or cocos count) or "
                                                   "folders holding them, or folders of cocos.track.Tracker "
                                                   "(cocos_track.csv)."),
    out: Path = typer.Option(Path("reports/summary"), "--out", "-o",
                             help="Output folder (absent or empty; a report with --overwrite)."),
    counting: str = typer.Option("own", help="Counting mode shown: own (each file's), compat, corrected."),
    counters: str = typer.Option("own", help="COCOS rows: own (each checkpoint's training loss; every counter of "
                                             "a cocos count result) or all."),
    latex_width: str = typer.Option("column", "--latex-width", metavar="column|page",
                                    help="LaTeX tables as table or table* (for two-column documents); both fit the "
                                         "12.2 cm LNCS text."),
    label: str = typer.Option(None, metavar="epoch", help="epoch: tell checkpoints of one run apart by their epoch "
                                                         "(cocos train --save-every), with a figure over epochs."),
    label_prefix: str = typer.Option(None, "--label-prefix", metavar="TEXT",
                                     help="Start every LaTeX label with this (labels are tab:[PREFIX-]NAME-ROLE, "
                                          "NAME the --out folder's name): for two reports of one name in a paper."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out report (never another folder)."),
) -> None:
    """Tables 1-4 of the COCOS paper (mean ± std over seeds, rows compared by t-tests over 3 or more seeds) and COCOS
    vs rsum, from results.json files."""
    from cocos.errors import CocosError
    from cocos.io import check_output_dir
    from cocos.report.merge import build_report, write_report
    from cocos.report.tables import to_markdown

    if counting not in COUNTING:
        raise CocosError(f"unknown counting mode '{counting}' (choose from {', '.join(COUNTING)})")
    if counters not in ("own", "all"):
        raise CocosError(f"unknown --counters '{counters}' (choose from own, all)")
    check_latex_width(latex_width)
    # before any input is read: --out is no input, holds none, and is absent, empty or a report (with --overwrite)
    check_output_dir(out, results, overwrite, kind="report", by="report", may_lie_in=[r for r in results if r.is_dir()])
    report = build_report(results, compat=COUNTING[counting], counters=counters, label=label,
                          label_prefix=label_prefix)
    files = write_report(report, out, overwrite=overwrite, latex_width=latex_width, by="report")
    for w in report.warnings:
        typer.echo(f"warning: {w}", err=True)
    if report.tables:
        typer.echo(to_markdown(report.tables[0]))
    tracked = f", {len(report.tracks)} tracked runs" if report.tracks else ""
    typer.echo(f"{len(report.results)} results in {len(report.groups)} groups{tracked}; "
               f"wrote {', '.join(str(f) for f in files)}")
