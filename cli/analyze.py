"""``cocos analyze CHECKPOINT``: the main job, from a checkpoint to COCOS tables and plots."""

from __future__ import annotations

from pathlib import Path

import typer

from cocos.objectives.spec import DEFAULT_EPS

from .common import check_latex_width, handle_errors
from .main import app


@app.command("analyze")
@handle_errors
def analyze(
    checkpoints: list[Path] = typer.Argument(..., metavar="CHECKPOINT...",
                                             help="Checkpoints written by cocos train (model_best.pt; several, "
                                                  "e.g. epoch_*.pt of --save-every, are analysed one by one)."),
    data: Path = typer.Option(None, help="Data folder (default: the one recorded in the checkpoint)."),
    out: Path = typer.Option(None, help="Output folder (default: reports/<run>/ for <run>/model_best.pt, "
                                        "reports/<run>_<file>/ for other checkpoints; with several checkpoints, "
                                        "the folder that holds those)."),
    loss: list[str] = typer.Option(["paper"], "--loss", "-l", metavar="NAMES",
                                   help="Losses to count: paper (the COCOS paper's four), all, or registered names "
                                        "(see `cocos losses`)."),
    batch_size: int = typer.Option(None, help="Images per counting batch (default: the batch size the checkpoint "
                                              "was trained with, as the paper counts)."),
    label: str = typer.Option(None, help="Tell this checkpoint apart in reports, e.g. 'last' or 'epoch 5' (shown "
                                         "as 'VSE++ (last)'); needed to report two checkpoints of one run."),
    seed: int = typer.Option(0, help="Seed of the counting batches."),
    compat: bool = typer.Option(False, "--compat/--no-compat", help="Show the published counter's values."),
    eps: float = typer.Option(DEFAULT_EPS, help="Threshold eps for NT-Xent and SmoothAP."),
    split: str = typer.Option("test", help="Split to evaluate retrieval on."),
    save_embeddings: Path = typer.Option(None, help="Also save the training embeddings (.npz, count format)."),
    per_query: bool = typer.Option(False, "--per-query", help="Also write queries.csv (one row per query)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    latex_width: str = typer.Option("column", "--latex-width", metavar="column|page",
                                    help="LaTeX tables fit one LNCS column (12.2 cm, table) or a page (table*)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out folder that cocos did not write."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Encode the training set with the frozen model, count every loss both ways, write tables and figures."""
    from cocos.errors import CocosError
    from cocos.io import check_output_dir
    from cocos.objectives import parse_names
    from cocos.report.analyze import analyze_checkpoint
    from cocos.report.folder import default_out, summary_lines, write_results_folder

    if len(checkpoints) > 1 and label is not None:
        raise CocosError("--label names one checkpoint; analyse several without it (cocos report --label epoch "
                         "tells epochs apart)")
    if len(set(checkpoints)) < len(checkpoints):
        raise CocosError("a checkpoint is given twice")
    several = len(checkpoints) > 1
    targets = [(out / default_out(c).name if out else default_out(c)) if several else (out or default_out(c))
               for c in checkpoints]
    if len(set(targets)) < len(targets):
        raise CocosError("two checkpoints would write the same report folder; analyse them with their own --out")
    check_latex_width(latex_width)
    losses = None if loss == ["paper"] else parse_names(loss)  # default: the paper's four and the model's own
    for checkpoint, target in zip(checkpoints, targets, strict=True):  # all before minutes of encoding
        if not checkpoint.exists():
            raise CocosError(f"{checkpoint}: no such checkpoint")
        check_output_dir(target, _inputs(checkpoint, data, save_embeddings), overwrite)
    if several and save_embeddings is not None:
        raise CocosError("--save-embeddings takes one checkpoint")
    for checkpoint, target in zip(checkpoints, targets, strict=True):
        inputs = _inputs(checkpoint, data, save_embeddings)
        analysis = analyze_checkpoint(checkpoint, data, losses=losses, batch_size=batch_size, seed=seed,
                                      compat=compat, split=split, device=device, eps=eps, label=label,
                                      save_embeddings_to=save_embeddings, progress=progress)
        files = write_results_folder(analysis.results, analysis.run, target, inputs, overwrite, per_query=per_query,
                                     embeddings=analysis.embeddings, latex_width=latex_width, logs=analysis.logs)
        for line in summary_lines(analysis.results):
            typer.echo(line)
        typer.echo(f"wrote {target}/: {', '.join(f.name for f in files)}")


def _inputs(checkpoint: Path, data: Path | None, save_embeddings: Path | None) -> list[Path]:
    return [checkpoint] + ([data] if data else []) + ([save_embeddings] if save_embeddings else [])
