"""``cocos demo``: the embedded default, end to end (the README's first command)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import handle_errors
from .main import app


@app.command("demo")
@handle_errors
def demo(
    out: Path = typer.Option(Path("reports/demo"), help="Report folder."),
    data: Path = typer.Option(Path("data/synth"), help="Synthetic data folder (generated if absent)."),
    checkpoints: Path = typer.Option(Path("checkpoints/demo"), help="Where the four models go."),
    loss: list[str] = typer.Option(["paper"], "--loss", "-l", metavar="NAMES",
                                   help="Losses to train and analyse: paper (the COCOS paper's four), all, or "
                                        "registered names."),
    all_losses: bool = typer.Option(False, "--all-losses",
                                    help="Also train GOAL (cir x sig_ms and con x con) and IMC models."),
    model: str = typer.Option("vsepp", help="vsepp or vsrn."),
    epochs: int = typer.Option(8, help="Training epochs per model."),
    lr: float = typer.Option(1e-3, help="Adam learning rate (the demo's shorter schedule)."),
    lr_update: int = typer.Option(6, help="Epoch after which the learning rate drops x0.1."),
    warmup_epochs: int = typer.Option(1, help="Triplet SH: all-triplet epochs before max violation."),
    batch_size: int = typer.Option(128, help="Batch size of training and counting."),
    embed_size: int = typer.Option(256, help="Joint embedding size."),
    word_dim: int = typer.Option(128, help="Word embedding size."),
    n_train: int = typer.Option(3000, help="Synthetic training scenes (when generating)."),
    seed: int = typer.Option(0, help="Seed of data, training and counting."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    retrain: bool = typer.Option(False, "--retrain", help="Train even if matching checkpoints exist."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out or --data folder (or a model's "
                                                              "checkpoint folder) that cocos did not write."),
    track_cocos: int = typer.Option(10, metavar="N", help="Count COCOS on the training batches every N steps."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Synthetic data -> VSE++ with the four losses -> cocos analyze each -> combined report (reports/demo/)."""
    from cocos.objectives import parse_names
    from cocos.pipelines.demo import ALL_LOSSES_EXTRA, DemoConfig, paper_losses, run_demo

    cfg = DemoConfig(
        out=str(out),
        data=str(data),
        checkpoints=str(checkpoints),
        losses=(paper_losses() if loss == ["paper"] else parse_names(loss))
        + (list(ALL_LOSSES_EXTRA) if all_losses else []),
        model=model,
        epochs=epochs,
        lr=lr,
        lr_update=lr_update,
        warmup_epochs=warmup_epochs,
        batch_size=batch_size,
        embed_size=embed_size,
        word_dim=word_dim,
        n_train=n_train,
        seed=seed,
        device=device,
        retrain=retrain,
        overwrite=overwrite,
        track_cocos=track_cocos,
    )
    try:
        run_demo(cfg, progress=progress, log=typer.echo)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {out} was left as it was; models finished in {checkpoints} are reused by the "
                   "next cocos demo", err=True)
        raise typer.Exit(code=130) from None
