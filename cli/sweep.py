"""``cocos sweep GRID.toml``: losses x seeds x models, locally or on Slurm, merged into one report."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import handle_errors
from .main import app


@app.command("sweep")
@handle_errors
def sweep(
    grid_file: Path = typer.Argument(..., metavar="GRID.toml", help="The grid (see examples/demo_grid.toml; "
                                     "raw images and [[models]] tables: examples/goal_table5.toml)."),
    executor: str = typer.Option("local", metavar="local|slurm", help="Run here, or submit to Slurm (submitit)."),
    jobs: int = typer.Option(1, help="local: runs at a time, each on its share of cores (or one GPU each)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the commands; run nothing."),
    resume: bool = typer.Option(False, "--resume", help="Continue interrupted runs from their last.pt."),
    retrain: bool = typer.Option(False, "--retrain", help="Train every run again."),
    reports: Path = typer.Option(None, help="Reports root (default: the grid's, else reports/)."),
    checkpoints: Path = typer.Option(None, help="Checkpoints root (default: the grid's, else checkpoints/)."),
    partition: str = typer.Option(None, help="slurm: partition."),
    time_limit: str = typer.Option(None, "--time", help="slurm: time limit per run, HH:MM:SS."),
    gpus: int = typer.Option(None, help="slurm: GPUs per run."),
    mem_gb: int = typer.Option(None, help="slurm: memory per run in GB."),
    array_parallelism: int = typer.Option(None, help="slurm: runs at a time."),
    cluster: str = typer.Option(None, hidden=True, help="submitit cluster (debug, local) instead of slurm."),
    progress: bool = typer.Option(False, "--progress/--no-progress", help="Show progress bars (jobs 1)."),
) -> None:
    """Train and analyse every (model, loss, seed) of a grid (any model family, precomputed features or raw images)
    and merge them into one report (mean ± std)."""
    from cocos.errors import CocosError
    from cocos.pipelines.sweep import (
        analyze_command,
        check_inputs,
        check_outputs,
        load_grid,
        plan,
        run_sweep,
        slurm_params,
        train_command,
    )

    if executor not in ("local", "slurm"):
        raise CocosError(f"unknown executor '{executor}' (choose from local, slurm)")
    if jobs < 1:
        raise CocosError(f"--jobs must be at least 1, got {jobs}")
    grid = load_grid(grid_file, reports=reports, checkpoints=checkpoints)
    options = {"partition": partition, "time": time_limit, "gpus": gpus, "mem_gb": mem_gb,
               "array_parallelism": array_parallelism}
    if dry_run:  # the same checks as a real sweep makes before its first run: it catches what that would
        params = slurm_params(grid, options)
        check_inputs(grid, executor)
        check_outputs(grid)
        typer.echo(f"sweep {grid.name}: {len(grid.runs)} runs; checkpoints in {grid.checkpoints / grid.name}/, "
                   f"reports in {grid.report_dir}/, merged report in {grid.summary}/")
        for run, step in plan(grid, resume, retrain):
            typer.echo(f"  {run.name}: {step}")
            if step != "skip":
                typer.echo(f"    {train_command(run)}")
                typer.echo(f"    {analyze_command(run)}")
        typer.echo(f"  then: cocos report {grid.report_dir} --out {grid.summary}")
        if executor == "slurm":
            typer.echo(f"  slurm: one array job ({params}), the merge as a job depending on it")
        return
    try:
        results = run_sweep(grid, executor=executor, jobs=jobs, resume=resume, retrain=retrain, progress=progress,
                            slurm=options, cluster=cluster, log=typer.echo)
    except KeyboardInterrupt:
        typer.echo("interrupted: finished runs are kept; run the sweep again (with --resume) to complete it",
                   err=True)
        raise typer.Exit(code=130) from None
    if any(s["status"] != "ok" for s in results):
        raise typer.Exit(code=1)
