"""``cocos count EMB.npz``: COCOS for anyone's own embeddings, as a report folder like ``cocos analyze``."""

from __future__ import annotations

from pathlib import Path

import typer

from cocos.defaults import DEFAULT_BATCH_SIZE, DEFAULT_EPS

from . import lossflags
from .common import check_input_file, check_latex_width, handle_errors
from .main import app


def _check_paths(args: dict) -> None:
    """The paths, before the heavy imports: the embeddings file, and --out / --json allowed."""
    from cocos.io import check_output_dir, check_output_file

    embeddings, out, json_path = args.get("embeddings"), args.get("out"), args.get("json_path")
    check_input_file(embeddings, "file")
    if out is not None:
        check_output_dir(out, [embeddings] + ([json_path] if json_path else []), bool(args.get("overwrite")),
                         kind="report", by="count")
    if json_path is not None:
        check_output_file(json_path, [embeddings] + ([out] if out else []), overwrite=bool(args.get("overwrite")))


@app.command("count", context_settings=lossflags.CONTEXT, epilog=lossflags.HELP)
@handle_errors(check=_check_paths)
def count(
    ctx: typer.Context,
    embeddings: Path = typer.Argument(..., help="An .npz with 'images' (N, d), 'captions' (N*k, d) "
                                      "and optionally 'caption_image' (N*k,)."),
    out: Path = typer.Option(None, "--out", "-o", help="Write a report folder here (results.json, batches.csv, "
                                                       "tables.md/.tex, figures), as cocos analyze does."),
    loss: list[str] = typer.Option(["paper"], "--loss", "-l", metavar="NAMES",
                                   help="Losses to count: paper (the COCOS paper's four), all, or registered names "
                                        "(see `cocos losses`)."),
    name: str = typer.Option(None, help="Dataset name of the embeddings (default: the file name)."),
    label: str = typer.Option("embeddings", help="What made the embeddings, e.g. 'CLIP ViT-B/32' (the model "
                                                 "column of reports)."),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, help="Images per batch (pair batches: captions per batch)."),
    seed: int = typer.Option(0, help="Seed of the random batches."),
    compat: bool = typer.Option(False, "--compat/--no-compat", help="Show the published reference counter's values."),
    param: list[str] = typer.Option([], "--param", "-p", metavar="[LOSS.]NAME=VALUE",
                                    help="A loss parameter, LOSS.NAME=VALUE or NAME=VALUE for every loss that "
                                         "has it, e.g. -p margin=0.3 -p ntxent.tau=0.05 (see `cocos losses`)."),
    eps: float = typer.Option(DEFAULT_EPS, help="Threshold eps of the counters that use one (NT-Xent, SmoothAP)."),
    per_query: bool = typer.Option(False, "--per-query", help="Also write queries.csv (one row per query)."),
    json_path: Path = typer.Option(None, "--json", help="Also write results.json to this path."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    latex_width: str = typer.Option("column", "--latex-width", metavar="column|page",
                                    help="LaTeX tables fit one LNCS column (12.2 cm, table) or a page (table*)."),
    overwrite: bool = typer.Option(False, "--overwrite",
                                   help="Replace an --out report (never another folder), or an existing --json file."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    label_prefix: str = typer.Option(None, "--label-prefix", metavar="TEXT",
                                     help="Start every LaTeX label of the --out tables.tex with this "
                                          "(tab:[PREFIX-]NAME-ROLE)."),
) -> None:
    """Count contributing samples per loss and direction on your own embeddings."""
    from cocos.objectives import parse_names
    from cocos.pipelines.count import count_file

    check_latex_width(latex_width)
    names = parse_names(loss)
    params = lossflags.merge(param, ctx.args, names, "count")
    inputs = _check_outputs(embeddings, out, json_path, overwrite)
    from cocos.distributed import context

    with context() as group:  # under torchrun: every rank counts its block of batches, rank 0 writes
        counted = count_file(embeddings, names, batch_size=batch_size, seed=seed, compat=compat, params=params,
                             eps=eps, name=name, label=label, device=device, progress=progress,
                             keep_per_query=out is not None)  # the figures' and queries.csv's rows: only with --out
    if not group.is_main:
        return
    _print_tables(counted.results, embeddings, batch_size, seed, compat)
    if out is not None:
        from cocos.pipelines.folder import write_results_folder
        files = write_results_folder(counted.results, counted.run, out, inputs, overwrite, per_query=per_query,
                                     embeddings=counted.embeddings, latex_width=latex_width, by="count",
                                     label_prefix=label_prefix)
        typer.echo(f"wrote {out}/: {', '.join(f.name for f in files)}")
    if json_path is not None:
        counted.results.write(json_path)
        typer.echo(f"wrote {json_path}")


def _check_outputs(embeddings: Path, out: Path | None, json_path: Path | None, overwrite: bool) -> list[Path]:
    """``--out`` and ``--json`` may be written (neither is an input nor the other); returns the inputs of the
    report folder (the embeddings file, and the --json path)."""
    from cocos.io import check_output_dir, check_output_file

    inputs = [embeddings] + ([json_path] if json_path else [])
    if out is not None:
        check_output_dir(out, inputs, overwrite, kind="report", by="count")
    if json_path is not None:
        check_output_file(json_path, [embeddings] + ([out] if out else []), overwrite=overwrite)
    return inputs


def _print_tables(results, embeddings: Path, batch_size: int, seed: int, compat: bool) -> None:
    """One heading line (the data, the batches) and one table per counted loss (statistics x directions) of the
    results' default mode, on the terminal."""
    from rich.console import Console
    from rich.table import Table

    from cocos.data.layout import DIRECTIONS
    from cocos.losses.spec import format_value
    from cocos.pipelines.count import count_rows

    console = Console(width=100)
    batches = ", ".join(f"{n} {kind} batches" for kind, n in results.counting.n_batches.items())
    console.print(f"COCOS of {embeddings} ({results.data.n_images} images, {results.data.n_captions} captions; "
                  f"batch {batch_size}, seed {seed}, {batches}{', compat' if compat else ''})")
    main = results.main()
    for loss_name in [n for n in results.counting.losses if n in set(main["loss"])]:
        summary = main[main["loss"] == loss_name]
        params = ", ".join(f"{k} {format_value(v)}" for k, v in results.counting.params[loss_name].items())
        table = Table(title=f"{loss_name} ({params})" if params else loss_name, title_justify="left")
        table.add_column("statistic")
        for d in [d for d in DIRECTIONS if d in set(summary["direction"])]:
            table.add_column(d, justify="right")
        for row in count_rows(summary):
            table.add_row(*row)
        console.print(table)
