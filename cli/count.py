"""``cocos count EMB.npz``: COCOS for anyone's own embeddings."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import handle_errors
from cli.main import app
from cocos.counting import COUNTERS
from cocos.counting.engine import EmbeddingSet, count_embeddings
from cocos.device import resolve_device
from cocos.errors import CocosError
from cocos.io import load_npz, write_json
from cocos.report.tables import count_rows


def loss_names(requested: list[str]) -> list[str]:
    names: list[str] = []
    for item in requested:
        for name in item.split(","):
            name = name.strip()
            if name == "all":
                names.extend(COUNTERS)
            elif name in COUNTERS:
                names.append(name)
            else:
                raise CocosError(f"unknown loss '{name}' (choose from all, {', '.join(COUNTERS)})")
    return list(dict.fromkeys(names))


def read_embeddings(path: Path, device: str = "cpu") -> EmbeddingSet:
    arrays = load_npz(path)
    for name in ("images", "captions"):
        if name not in arrays:
            found = ", ".join(arrays) or "none"
            raise CocosError(f"{path}: no array named '{name}' (found: {found})")
    try:
        return EmbeddingSet.from_arrays(
            arrays["images"], arrays["captions"], arrays.get("caption_image"), device=device
        )
    except CocosError as exc:
        raise CocosError(f"{path}: {exc}") from None


@app.command("count")
@handle_errors
def count(
    embeddings: Path = typer.Argument(..., help="An .npz with 'images' (N, d), 'captions' (N*k, d) "
                                      "and optionally 'caption_image' (N*k,)."),
    loss: list[str] = typer.Option(["all"], "--loss", "-l",
                                   help="Loss(es) to count: all, triplet, triplet_sh, ntxent, smoothap."),
    batch_size: int = typer.Option(128, help="Images per batch (pair batches: captions per batch)."),
    seed: int = typer.Option(0, help="Seed of the random batches."),
    compat: bool = typer.Option(False, "--compat", help="Reproduce the published reference counter."),
    margin: float = typer.Option(0.2, help="Triplet margin alpha."),
    tau_ntxent: float = typer.Option(0.1, help="NT-Xent temperature."),
    tau_smoothap: float = typer.Option(0.01, help="SmoothAP temperature."),
    eps: float = typer.Option(0.01, help="Threshold eps for NT-Xent and SmoothAP."),
    json_path: Path = typer.Option(None, "--json", help="Also write the numbers to this JSON file."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Count contributing samples per loss and direction on your own embeddings."""
    from rich.console import Console
    from rich.table import Table

    names = loss_names(loss)
    emb = read_embeddings(embeddings, device=str(resolve_device(device)))
    params = {
        "triplet": {"margin": margin}, "triplet_sh": {"margin": margin},
        "ntxent": {"tau": tau_ntxent, "eps": eps}, "smoothap": {"tau": tau_smoothap, "eps": eps},
    }
    run = count_embeddings(emb, names, batch_size=batch_size, seed=seed, compat=compat,
                           params=params, keep_per_query=False, progress=progress)
    summary = run.summary()
    console = Console(width=100)
    batches = ", ".join(f"{n} {kind} batches" for kind, n in run.n_batches.items())
    console.print(f"COCOS of {embeddings} ({emb.n_images} images, {emb.captions.shape[0]} captions; "
                  f"batch {batch_size}, seed {seed}, {batches}{', compat' if compat else ''})")
    for name, by_direction in summary.items():
        table = Table(title=f"{name} {run.params[name]}", title_justify="left")
        table.add_column("statistic")
        for d in by_direction:
            table.add_column(d, justify="right")
        for row in count_rows(by_direction):
            table.add_row(*row)
        console.print(table)
    if json_path is not None:
        write_json(json_path, {
            "embeddings": str(embeddings),
            "n_images": emb.n_images,
            "n_captions": int(emb.captions.shape[0]),
            "batch_size": batch_size,
            "seed": seed,
            "compat": compat,
            "n_batches": run.n_batches,
            "params": run.params,
            "stats": summary,
        })
        typer.echo(f"wrote {json_path}")
