"""``cocos analyze CHECKPOINT``: the main job, from a checkpoint to COCOS tables and plots."""

from __future__ import annotations

from pathlib import Path

import typer

from cocos.defaults import DEFAULT_EPS

from .common import (
    check_input_dir,
    check_input_file,
    check_input_path,
    check_latex_width,
    check_open_clip_args,
    handle_errors,
)
from .main import app


def _check_paths(args: dict) -> None:
    """The paths, before the heavy imports: checkpoints are files, --vocab a file, --data and --features exist,
    an explicit --out (one checkpoint) or --save-embeddings is allowed."""
    checkpoints = args.get("checkpoints") or []
    _check_checkpoint_args(checkpoints, args.get("label"))
    _check_options(args)
    _check_input_paths(args)
    check_open_clip_args(args.get("open_clip_config"), args.get("tokenizer"), args.get("vocab"), args.get("bert"),
                         args.get("data"), needs_data=True)
    _check_output_paths(args, checkpoints)


def _check_checkpoint_args(checkpoints: list, label) -> None:
    """The CHECKPOINT arguments: files, none given twice, and one only with --label."""
    from cocos.errors import CocosError

    if len(checkpoints) > 1 and label is not None:
        raise CocosError("--label names one checkpoint; analyse several without it (cocos report --label epoch "
                         "tells epochs apart)")
    if len(set(checkpoints)) < len(checkpoints):
        raise CocosError("a checkpoint is given twice")
    for checkpoint in checkpoints:
        if not _is_model_folder(checkpoint):  # a checkpoint file, or a Hugging Face model folder (CLIP's)
            check_input_file(checkpoint, "checkpoint")


def _is_model_folder(path: Path) -> bool:
    """A Hugging Face model folder (a config.json with a model_type), which a family may read whole
    (:attr:`cocos.models.family.ModelFamily.folders`); whether one does is the analysis's to say."""
    from cocos.hf import model_type  # torch-free

    return model_type(path) is not None


def _check_input_paths(args: dict) -> None:
    """--vocab a file, --bert a folder, --data a folder or file list, every --features a folder, where given."""
    if args.get("vocab") is not None:
        check_input_file(args["vocab"], "vocabulary file")
    if args.get("bert") is not None:
        check_input_dir(args["bert"], "BERT folder")
    if args.get("data") is not None:
        check_input_path(args["data"], "data folder or file list")
    for folder in args.get("features") or []:
        check_input_dir(folder, "feature cache folder")


def _check_output_paths(args: dict, checkpoints: list) -> None:
    """An explicit --out of one checkpoint (absent, empty, or a report with --overwrite: a report folder of
    :func:`cocos.io.check_output_dir`), of several (no cocos folder: their reports go inside), and
    --save-embeddings: allowed, and none of the inputs."""
    from cocos.io import check_output_dir, check_output_file, check_output_parent

    inputs = [p for p in (*checkpoints, args.get("data"), args.get("vocab"), args.get("bert"),
                          args.get("open_clip_config"), args.get("tokenizer")) if p is not None]
    overwrite = bool(args.get("overwrite"))
    if args.get("out") is not None and len(checkpoints) == 1:
        check_output_dir(args["out"], inputs, overwrite, kind="report", by="analyze")
    elif args.get("out") is not None:
        check_output_parent(args["out"])
    if args.get("save_embeddings") is not None:
        check_output_file(args["save_embeddings"], inputs + ([args["out"]] if args.get("out") else []),
                          overwrite=overwrite, runs=checkpoints)


def _check_options(args: dict) -> None:
    """The counting options, before minutes of encoding: --eps a finite number >= 0, --batch-size and --resize,
    --crop-size positive when given, --workers not negative (as a sweep's [analyze] table is checked)."""
    import math

    from cocos.errors import CocosError

    eps = args.get("eps", DEFAULT_EPS)
    if eps is not None and not (math.isfinite(eps) and eps >= 0):
        raise CocosError(f"--eps must be a finite number >= 0, got {eps}")
    for name in ("batch_size", "resize", "crop_size"):
        value = args.get(name)
        if value is not None and value < 1:
            raise CocosError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if (args.get("workers") or 0) < 0:
        raise CocosError(f"--workers must not be negative, got {args['workers']}")
    if args.get("split") is not None and not str(args["split"]).strip():
        raise CocosError("--split must name a split (train, dev or test)")


@app.command("analyze")
@handle_errors(check=_check_paths)
def analyze(
    checkpoints: list[Path] = typer.Argument(..., metavar="CHECKPOINT...",
                                             help="Checkpoints written by cocos train (model_best.pt; several, "
                                                  "e.g. epoch_*.pt of --save-every, are analysed one by one)."),
    data: Path = typer.Option(None, help="Data folder (default: the one recorded in the checkpoint); for a "
                                         "raw-image model (vsepp_full) the image dataset: images/ + its Karpathy "
                                         "dataset_*.json, {split}_set.p pickles, or a CSV file list."),
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
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out report (never another "
                                                              "folder), or an existing --save-embeddings file."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
    vocab: Path = typer.Option(None, "--vocab", metavar="PATH",
                               help="Vocabulary of a checkpoint of the original VSE++/VSRN code (model_best.pth.tar): "
                                    "its *_vocab.pkl (read without running code) or a vocabulary JSON; needs --data."),
    bert: Path = typer.Option(None, "--bert", metavar="DIR",
                              help="VSE∞ checkpoint of the original code: the BERT folder it was trained with "
                                   "(config.json, vocab.txt)"),
    features: list[Path] = typer.Option(None, "--features", metavar="DIR",
                                        help="Raw-image models: a feature cache of `cocos data features` to use "
                                             "when it matches (same images and captions, CNN weights and transform "
                                             "sizes); repeatable. Also looked for: every cache under "
                                             "IMAGE_DATA/features/. Else the features are computed from the images."),
    resize: int = typer.Option(None, "--resize", metavar="PX",
                               help="Raw-image models: evaluation Resize (default: as recorded, else 256)."),
    crop_size: int = typer.Option(None, "--crop-size", metavar="PX",
                                  help="Raw-image models: evaluation CenterCrop (default: as recorded, else 224; "
                                       "checkpoints of the original code: 224)."),
    workers: int = typer.Option(0, "--workers", help="Raw-image models: DataLoader processes decoding images."),
    open_clip_config: Path = typer.Option(None, "--open-clip-config", metavar="CONFIG.json",
                                          help="The checkpoints are open_clip's (epoch_K.pt of its trainer): their "
                                               "model config (open_clip's ViT-B-32.json, ..., or a hub "
                                               "open_clip_config.json); needs --tokenizer and --data."),
    tokenizer: Path = typer.Option(None, "--tokenizer", metavar="DIR",
                                   help="open_clip checkpoints: the tokenizer, a Hugging Face CLIP tokenizer folder "
                                        "(tokenizer.json, or vocab.json and merges.txt; OpenAI's BPE)."),
    trust_checkpoint: bool = typer.Option(False, "--trust-checkpoint",
                                          help="Load checkpoints with full pickle (weights_only=False): code in the "
                                               "file may run. Only for files you trust."),
    label_prefix: str = typer.Option(None, "--label-prefix", metavar="TEXT",
                                     help="Start every LaTeX label of tables.tex with this (tab:[PREFIX-]NAME-ROLE)."),
) -> None:
    """Encode the training set with the frozen model, count every loss both ways, write tables and figures."""
    from cocos.objectives import parse_names

    targets = _targets(checkpoints, out, save_embeddings)
    check_latex_width(latex_width)
    losses = None if loss == ["paper"] else parse_names(loss)  # default: the paper's four and the model's own
    inputs = _check_inputs(checkpoints, data, vocab, bert)
    inputs += [p for p in (open_clip_config, tokenizer) if p is not None]
    _check_outputs(checkpoints, targets, inputs, save_embeddings, overwrite)  # all before minutes of encoding
    if trust_checkpoint:
        typer.echo("warning: --trust-checkpoint: checkpoints are loaded with full pickle, code in them may run",
                   err=True)
    options = {"losses": losses, "batch_size": batch_size, "seed": seed, "compat": compat, "split": split,
               "device": device, "eps": eps, "label": label, "progress": progress, "vocab": vocab, "bert": bert,
               "trust": trust_checkpoint, "image_options": _image_options(features, resize, crop_size, workers)}
    outputs = {"inputs": inputs, "save_embeddings": save_embeddings, "overwrite": overwrite, "per_query": per_query,
               "latex_width": latex_width}
    options["reader"] = _open_clip_reader(open_clip_config, tokenizer, trust_checkpoint)
    outputs["label_prefix"] = label_prefix
    _analyze_all(checkpoints, targets, data, options, outputs)


def _open_clip_reader(config: Path | None, tokenizer: Path | None, trust: bool):
    """With --open-clip-config: the checkpoints are read as open_clip's (:func:`cocos.models.open_clip.
    open_clip_checkpoint`, a ``clip`` checkpoint built in memory); None otherwise."""
    if config is None:
        return None
    from cocos.models.open_clip import open_clip_checkpoint

    def reader(path, data, *, log=None):
        return open_clip_checkpoint(path, config, tokenizer, data, trust=trust, log=log)

    return reader


def _targets(checkpoints: list[Path], out: Path | None, save_embeddings: Path | None) -> list[Path]:
    """Each checkpoint's report folder: --out (one checkpoint) or its default name (inside --out, with several);
    two checkpoints may not share one, and --save-embeddings takes one checkpoint."""
    from cocos.errors import CocosError
    from cocos.pipelines.folder import default_out

    several = len(checkpoints) > 1
    if several and save_embeddings is not None:
        raise CocosError("--save-embeddings takes one checkpoint")
    targets = [(out / default_out(c).name if out else default_out(c)) if several else (out or default_out(c))
               for c in checkpoints]
    if len(set(targets)) < len(targets):
        raise CocosError("two checkpoints would write the same report folder; analyse them with their own --out")
    return targets


def _check_inputs(checkpoints: list[Path], data: Path | None, vocab: Path | None,
                  bert: Path | None = None) -> list[Path]:
    """Every path the analyses read (:func:`_inputs` of each checkpoint), after checking --vocab, --bert and that
    each checkpoint exists and is not an embeddings file."""
    from cocos.errors import CocosError
    from cocos.pipelines.analyze import refuse_embeddings

    if vocab is not None and not vocab.is_file():
        raise CocosError(f"{vocab}: no such vocabulary file")
    if bert is not None and not bert.is_dir():
        raise CocosError(f"{bert}: no such BERT folder")
    found = []
    for checkpoint in checkpoints:
        if not checkpoint.exists():
            raise CocosError(f"{checkpoint}: no such checkpoint")
        if not _is_model_folder(checkpoint):
            refuse_embeddings(checkpoint)
        found.append(_inputs(checkpoint, data, vocab, bert))
    return [p for paths in found for p in paths]


def _check_outputs(checkpoints: list[Path], targets: list[Path], inputs: list[Path], save_embeddings: Path | None,
                   overwrite: bool) -> None:
    """Every report folder and the embeddings file may be written (:func:`cocos.io.check_output_dir`: absent,
    empty, or a report replaced with --overwrite); none holds any checkpoint's input, and the folder of several
    reports is no cocos folder."""
    from cocos.io import check_output_dir, check_output_file, check_output_parent

    if len(targets) > 1:
        for parent in {t.parent for t in targets}:
            check_output_parent(parent)
    for target in targets:
        check_output_dir(target, inputs, overwrite, kind="report", by="analyze")
        if save_embeddings is not None:
            check_output_file(save_embeddings, inputs + [target], overwrite=overwrite, runs=checkpoints)


def _analyze_all(checkpoints: list[Path], targets: list[Path], data: Path | None, options: dict,
                 outputs: dict) -> None:
    """Analyse each checkpoint (``options``: :func:`cocos.pipelines.analyze.analyze_checkpoint`'s) and write its
    report (``outputs``: :func:`_write`'s); under torchrun the ranks split encoding and counting, rank 0 writes."""
    from cocos.distributed import context
    from cocos.pipelines.analyze import analyze_checkpoint

    with context() as group:
        for checkpoint, target in zip(checkpoints, targets, strict=True):
            analysis = analyze_checkpoint(checkpoint, data, **options)
            if group.is_main:
                for line in analysis.warnings:
                    typer.echo(f"warning: {line}", err=True)
                _write(analysis, target, **outputs)


def _image_options(features, resize, crop_size, workers) -> dict:
    """What a raw-image model's encoding needs (cocos.embed.images.image_source_of); checked before any work."""
    from cocos.errors import CocosError

    for folder in features or []:
        if not folder.is_dir():
            raise CocosError(f"{folder}: no such feature cache folder")
    return {"features": list(features or []), "resize": resize, "crop_size": crop_size, "workers": workers,
            "log": typer.echo}


def _write(analysis, target, inputs, save_embeddings, overwrite, per_query, latex_width, label_prefix=None) -> None:
    """The report folder, then the embeddings (last: a failed or interrupted analysis leaves no embeddings file).
    ``inputs``: every checkpoint's inputs (no report folder may hold any of them)."""
    from cocos.embed import save_embeddings as write_embeddings
    from cocos.pipelines.folder import summary_lines, write_results_folder

    files = write_results_folder(analysis.results, analysis.run, target, inputs, overwrite,
                                 per_query=per_query, embeddings=analysis.embeddings, latex_width=latex_width,
                                 logs=analysis.logs, by="analyze", label_prefix=label_prefix)
    if save_embeddings is not None:
        write_embeddings(save_embeddings, analysis.embeddings)
    for line in summary_lines(analysis.results):
        typer.echo(line)
    typer.echo(f"wrote {target}/: {', '.join(f.name for f in files)}"
               + (f"; embeddings {save_embeddings}" if save_embeddings is not None else ""))


def _inputs(checkpoint: Path, data: Path | None, vocab: Path | None = None, bert: Path | None = None) -> list[Path]:
    """What an analysis reads: the checkpoint, its vocabulary (or BERT folder), and the data folder (given, or
    recorded in it)."""
    found = [checkpoint] + ([data] if data else []) + ([vocab] if vocab else []) + ([bert] if bert else [])
    if data is None and not checkpoint.is_dir():
        recorded = _recorded_data(checkpoint)
        if recorded is not None:
            found.append(recorded)
    return found


def _recorded_data(checkpoint: Path) -> Path | None:
    """The data folder a cocos checkpoint names, peeked at (the analysis verifies the file once, later);
    None for other files, which fail later with their own message."""
    from cocos.training.checkpoint import peek

    data = peek(checkpoint).get("data")
    path = data.get("path") if isinstance(data, dict) else None
    return Path(path) if isinstance(path, str) else None
