"""``cocos diagram``: GOAL triplet-weight diagrams, optionally with a checkpoint's training triplets."""

from __future__ import annotations

from pathlib import Path

import typer

from cocos.defaults import DEFAULT_BATCH_SIZE

from .common import handle_errors
from .main import app


def canonical(text: str, table, prefix: str) -> str | None:
    """One spelling for weight names: ``sig_ms`` (as ``cocos train --pair-weight``), ``P_sig-ms`` or ``sig-ms``."""
    short = text.strip().replace("\u2212", "-")
    if short[:2].lower() == prefix.lower():
        short = short[2:]
    lookup = {k[2:].lower().replace("-", "_"): k for k in table}
    return lookup.get(short.lower().replace("-", "_"))


def weight_names(weight: str, pair_weight: str | None) -> list[str]:
    """The panel names: each of ``weight`` (comma list), or ``T*P+`` and ``T*P-`` with a pair weight."""
    from cocos.errors import CocosError
    from cocos.losses.goal import PAIR_WEIGHTS, TRIPLET_WEIGHTS, parse_weight

    names = [canonical(w, TRIPLET_WEIGHTS, "T_") or w.strip() for w in weight.split(",") if w.strip()]
    if not names:
        raise CocosError("--weight is empty")
    specs = [parse_weight(n) for n in names]
    if pair_weight is None:
        return [s.name for s in specs]
    pair = canonical(pair_weight.strip().rstrip("+"), PAIR_WEIGHTS, "P_")
    if pair is None:
        choices = ", ".join(k[2:].replace("-", "_") for k in PAIR_WEIGHTS)
        raise CocosError(f"unknown pair weight '{pair_weight}' (choose from {choices})")
    out = []
    for s in specs:
        if s.triplet is None or s.pair is not None:
            raise CocosError(f"--pair-weight needs triplet weights in --weight, got '{s.name}'")
        out += [f"{s.triplet}*{pair}+", f"{s.triplet}*{pair}-"]
    return out


def parse_extent(text: str) -> tuple[float, float] | None:
    from cocos.errors import CocosError

    if text.strip().lower() == "auto":
        return None
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise CocosError(f"--extent must be 'auto' or 'LO,HI' (e.g. 0,1), got '{text}'") from None
    if not lo < hi:
        raise CocosError(f"--extent needs LO < HI, got '{text}'")
    return lo, hi


@app.command("diagram")
@handle_errors
def diagram(
    weight: str = typer.Option("con", "--weight", "-w",
                               help="Triplet weight con, nca or cir (as cocos train --triplet-weight; T_con also "
                                    "works), T*P+ / T*P- (e.g. T_nca*P_sig-), or a comma list (one panel each)."),
    pair_weight: str = typer.Option(None, "--pair-weight",
                                    help="con, lin, sig, lin_ms or sig_ms (as cocos train --pair-weight; P_sig-ms "
                                         "also works): draw T*P+ and T*P- and the pair-weight curves."),
    tau: float = typer.Option(None, help="Scale tau of T_nca and T_cir (default 10)."),
    margin: float = typer.Option(None, help="Margin of T_con (default 0.2)."),
    cir_offset: bool = typer.Option(False, "--cir-offset",
                                    help="T_cir as in the authors' code (0.5 subtracted in the exponent)."),
    checkpoint: Path = typer.Option(None, "--checkpoint",
                                    help="Overlay where this checkpoint's training triplets lie."),
    data: Path = typer.Option(None, help="Data folder (default: the one recorded in the checkpoint)."),
    batch_size: int = typer.Option(DEFAULT_BATCH_SIZE, help="Captions per pair batch."),
    seed: int = typer.Option(0, help="Seed of the random batches."),
    max_batches: int = typer.Option(None, help="Use only the first N batches."),
    compat: bool = typer.Option(False, "--compat/--no-compat", help="Keep same-image pairs as negatives."),
    extent: str = typer.Option("auto", help="'auto' ([0,1], or [-1,1] when points lie outside) or LO,HI."),
    out: Path = typer.Option(None, help="Output path stem (default reports/diagram_<weight>); "
                                        "writes .png and .pdf."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing figure files."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Triplet-weight diagram (GOAL Figure 2): a weight over (Sp, Sn), with a checkpoint's triplets."""
    from cocos.pipelines.triplets import (
        checkpoint_triplet_points,
        diagram_stem,
        pair_of,
        plot_pair_weights,
        plot_triplet_diagram,
    )

    names = weight_names(weight, pair_weight)
    ext = parse_extent(extent)
    params = _params(tau, margin, cir_offset, checkpoint, data, batch_size)
    out = out if out is not None else diagram_stem(names, pair_weight is not None)
    _check_outputs(out, pair_weight is not None, checkpoint, data, overwrite)
    points = None
    if checkpoint is not None:
        points = checkpoint_triplet_points(checkpoint, data, device=device, progress=progress, batch_size=batch_size,
                                           seed=seed, max_batches=max_batches, compat=compat)
    result = plot_triplet_diagram(names, params=params, points=points, path_stem=out, extent=ext,
                                  points_label="training triplets")
    written = [str(p) for p in result.paths]
    if pair_weight is not None:
        curves = plot_pair_weights(pair_of(names), params=params, path_stem=f"{out}_pair")
        written += [str(p) for p in curves.paths]
    typer.echo(f"wrote {', '.join(written)}")
    if points is not None:
        for line in _point_summary(names, points, result, f"batches of {batch_size}, seed {seed}"
                                                           f"{', compat' if compat else ''}"):
            typer.echo(line)


def _params(tau, margin, cir_offset: bool, checkpoint, data, batch_size: int) -> dict:
    """The weights' parameters (``None``: the weight's default), after checking the options that go with them."""
    from cocos.errors import CocosError, check_params

    if data is not None and checkpoint is None:
        raise CocosError("--data needs --checkpoint")
    if batch_size < 1:
        raise CocosError(f"--batch-size must be positive, got {batch_size}")
    check_params(tau=tau, margin=margin)
    return {"tau": tau, "margin": margin, "offset": True if cir_offset else None}


def _check_outputs(out: Path, paired: bool, checkpoint, data, overwrite: bool) -> None:
    """Before any work: ``--out`` is a path stem, and no figure file lands on (or inside) what is read, nor
    replaces a file without ``--overwrite``."""
    from cocos.errors import CocosError
    from cocos.io import check_output_file

    from .analyze import _inputs

    inputs = _inputs(checkpoint, data) if checkpoint is not None else []
    if out.is_dir() or out.name in ("", ".", ".."):
        raise CocosError(f"{out}: --out is a path stem for the figures (e.g. reports/diagram_con), not a folder")
    for stem in (str(out), f"{out}_pair") if paired else (str(out),):
        for suffix in (".png", ".pdf"):
            check_output_file(stem + suffix, inputs, overwrite=overwrite, runs=[checkpoint])


def _point_summary(names: list[str], points: dict, result, batches: str) -> list[str]:
    """What the terminal says about the triplets: how many (from which batches), each triplet weight's active
    share per direction (once per weight), and the share of each direction outside the drawn square."""
    n = {d: len(sp) for d, (sp, _) in points.items()}
    lines = [f"{sum(n.values())} triplets ({', '.join(f'{d} {k}' for d, k in n.items())}) from {batches}"]
    firsts: dict[str, str] = {}  # each T_x with its first panel
    for name in names:
        firsts.setdefault(name.split("*")[0], name)
    for t_name, name in firsts.items():
        if t_name.startswith("T_"):
            parts = ", ".join(f"{d} {100 * s:.1f}%" for d, s in result.active[name].items() if s is not None)
            lines.append(f"{t_name}: share of triplets in the active region (T > 0.5): {parts}")
    lines += [f"note: {100 * share:.1f}% of {d} triplets lie outside the drawn square"
              for d, share in result.outside.items() if share > 0]
    return lines
