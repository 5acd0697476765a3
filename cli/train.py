"""``cocos train`` and ``cocos evaluate``."""

from __future__ import annotations

from pathlib import Path

import typer

from cocos.losses.ltd_config import LTDConfig
from cocos.training.config import DataConfig, LossConfig, ModelConfig, OptimConfig, TrainConfig, default

from . import lossflags
from .common import handle_errors
from .main import app


@app.command("train", context_settings=lossflags.CONTEXT, epilog=lossflags.HELP)
@handle_errors
def train(
    ctx: typer.Context,
    data: Path = typer.Option(..., help="Folder with {train,dev,test}_ims.npy and _caps.txt, or raw images: "
                                        "images/ + dataset_*.json, {train,val,test}_set.p or a CSV file list."),
    model: str = typer.Option(default(ModelConfig, "name"), help="A registered model family (see `cocos models`); "
                                                                 "on raw images vsepp trains vsepp_full."),
    loss: str = typer.Option(default(LossConfig, "name"), help="A registered loss (see `cocos losses`)."),
    out: Path = typer.Option(..., help="Output folder, e.g. checkpoints/NAME."),
    epochs: int = typer.Option(default(OptimConfig, "epochs"), help="Training epochs."),
    lr: float = typer.Option(default(OptimConfig, "lr"), help="Learning rate."),
    lr_update: int = typer.Option(default(OptimConfig, "lr_update"),
                                  help="Epochs after which the learning rate drops x0.1."),
    batch_size: int = typer.Option(default(OptimConfig, "batch_size"),
                                   help="Pair batches: captions; ranking batches: images."),
    embed_size: int = typer.Option(None, help="Joint embedding size (default: the model family's; `cocos models`)."),
    word_dim: int = typer.Option(None, help="Word embedding size (default: the model family's)."),
    param: list[str] = typer.Option([], "--param", "-p", metavar="NAME=VALUE",
                                    help="A parameter of the loss (see `cocos losses`); each is also a flag, "
                                         "e.g. --margin 0.3, --tau 0.05, --triplet-weight cir."),
    warmup_epochs: int = typer.Option(default(LossConfig, "warmup_epochs"),
                                      help="triplet_sh only: epochs of all-triplet loss first (VSE-inf)."),
    ltd: bool = typer.Option(False, "--ltd", help="Add latent target decoding (LTD, Bleeker et al. 2023) to the loss."),
    ltd_mode: str = typer.Option(default(LTDConfig, "mode"), metavar="constraint|dual",
                                 help="LTD as a constraint (Lagrange multiplier) or a dual loss (fixed weight beta)."),
    ltd_eta: float = typer.Option(default(LTDConfig, "eta"),
                                  help="LTD constraint bound eta on the reconstruction loss."),
    ltd_beta: float = typer.Option(default(LTDConfig, "beta"), help="LTD dual-loss weight beta."),
    ltd_targets: Path = typer.Option(None, metavar="FILE.npy",
                                     help="Your own LTD targets, one row per training caption (default: "
                                          "all-MiniLM-L6-v2 embeddings, needs cocos[ltd])."),
    track_cocos: int = typer.Option(None, metavar="N", help="Count COCOS on the training batch every N steps "
                                                            "(cocos_track.csv)."),
    save_every: int = typer.Option(None, metavar="K", help="Keep a checkpoint epoch_NNN.pt every K epochs."),
    tensorboard: bool = typer.Option(False, "--tensorboard",
                                     help="Write TensorBoard event files into OUT/tensorboard/ (loss per step, dev "
                                          "rsum and R@K, learning rate, learned loss parameters); needs "
                                          "'cocos[tensorboard]'."),
    k: int = typer.Option(default(DataConfig, "k"), help="Captions per image."),
    vocab: Path = typer.Option(None, help="A SCAN-style vocab JSON (default: built from the training captions)."),
    cnn: str = typer.Option(None, help="Raw images: the CNN (resnet18/34/50/101/152, resnext50_32x4d, "
                                       "resnext101_32x8d, vgg19; default: the family's, resnet50 for VSE++, "
                                       "resnext101_32x8d for VSE∞)."),
    cnn_weights: Path = typer.Option(None, metavar="FILE", help="Raw images: the CNN's ImageNet weights "
                                                                "(torchvision's resnet50-0676ba61.pth, ...)."),
    bert: Path = typer.Option(None, metavar="DIR", help="VSE∞: the Hugging Face BERT folder (config.json, weights, "
                                                        "vocab.txt; read from disk, never downloaded)."),
    clip: Path = typer.Option(None, metavar="DIR", help="CLIP: the Hugging Face CLIP folder to fine-tune (config.json, "
                                                        "weights, tokenizer, preprocessor_config.json; from disk)."),
    source: list[str] = typer.Option([], "--source", metavar="NAME=PATH",
                                     help="A pre-trained source of the model family (see `cocos models`: VSE∞'s "
                                          "bert, CLIP's clip, a plugin family's own); repeatable."),
    learn_tau: bool = typer.Option(default(LossConfig, "learn_tau"), "--learn-tau/--fixed-tau",
                                   help="Learn the loss's softmax temperature as the model's logit_scale, as CLIP "
                                        "trains (NT-Xent; --model clip's default)."),
    finetune: bool = typer.Option(False, "--finetune", help="Raw images: train the CNN too (without "
                                                            "--cnn-weights: from random initialisation)."),
    crop_size: int = typer.Option(default(DataConfig, "crop_size"),
                                  help="Raw images: training crop and evaluation centre crop."),
    resize: int = typer.Option(None, help="Raw images: the evaluation Resize (default: the --cnn-weights file's own, "
                                          "232 for torchvision's V2 ResNets; else 256 : 224 of the crop)."),
    use_restval: bool = typer.Option(False, "--use-restval", help="Raw images: Karpathy's restval joins train."),
    workers: int = typer.Option(default(DataConfig, "workers"),
                                help="Raw images: DataLoader workers decoding images (same result for any)."),
    seed: int = typer.Option(default(OptimConfig, "seed"), help="Seed of initialisation and batch order."),
    optimizer: str = typer.Option(default(OptimConfig, "optimizer"), metavar="adam|adamw", help="The optimiser."),
    weight_decay: float = typer.Option(default(OptimConfig, "weight_decay"), help="AdamW's weight decay."),
    lr_group: list[str] = typer.Option([], "--lr-group", metavar="PREFIX=FACTOR",
                                       help="Train the parameters whose names start with PREFIX at FACTOR x lr "
                                            "(e.g. txt_enc.bert=0.1); repeatable."),
    device: str = typer.Option(default(TrainConfig, "device"), help="auto, cpu or cuda."),
    resume: bool = typer.Option(False, "--resume", help="Continue from OUT/last.pt."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start over in an existing OUT (the previous run's "
                                                              "checkpoints, logs and figures are removed)."),
    json_path: Path = typer.Option(None, "--json", help="Write the best validation metrics here."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Train a model family (VSE++, VSRN, a plugin's) with one loss; keeps model_best.pt (best validation rsum) and
    last.pt."""
    from cocos.training.trainer import Trainer

    _known_loss(loss, resume, out)  # an unknown loss is named before its parameters are looked up
    model_args, loss_args, source_args = _model_flags(model, ctx.args)
    extra = lossflags.merge(param, loss_args, [loss], "train").get(loss) or None
    flat = dict(data=str(data), model=model, loss=loss, out=str(out), epochs=epochs, lr=lr,
                lr_update=lr_update, batch_size=batch_size, embed_size=embed_size, word_dim=word_dim,
                model_params=model_args or None, params=extra, k=k, seed=seed, device=device,
                warmup_epochs=warmup_epochs, vocab=str(vocab) if vocab else None, ltd=ltd,
                ltd_mode=ltd_mode, ltd_eta=ltd_eta, ltd_beta=ltd_beta,
                ltd_targets=str(ltd_targets) if ltd_targets else None, track_cocos=track_cocos,
                save_every=save_every, cnn=cnn, cnn_weights=str(cnn_weights) if cnn_weights else None,
                finetune=finetune, crop_size=crop_size, use_restval=use_restval, workers=workers,
                optimizer=optimizer, weight_decay=weight_decay, lr_groups=_lr_groups(lr_group) or None,
                sources=_sources([*source, *source_args], bert=bert, clip=clip) or None, learn_tau=learn_tau,
                resize=resize, tensorboard=tensorboard)
    cfg = TrainConfig.of(**_with_recipe(ctx, flat, resume))
    cfg.validate()  # nonsense flags first, before any file is looked at
    if cfg.hooks.tensorboard:  # the writer's package, before anything is read
        from cocos.training.hooks import summary_writer

        summary_writer()
    if json_path is not None:
        _check_json(json_path, cfg, overwrite)
    import contextlib

    from cocos.distributed import context
    from cocos.io import output_lock

    # the run folder's lock, held by the main process from the checks of the folder to the last figure
    with contextlib.ExitStack() as held:
        with context() as group:  # under torchrun: every rank trains its block of each global batch
            if group.is_main:
                held.enter_context(output_lock(Path(cfg.out).resolve()))
            trainer = Trainer(cfg, resume=resume, overwrite=overwrite, progress=progress, log=typer.echo,
                              locked=group.is_main)
            try:
                metrics = trainer.fit()
            except KeyboardInterrupt:
                if group.is_main:
                    typer.echo(interrupted_message(trainer), err=True)
                raise typer.Exit(code=130) from None
        if group.is_main:
            _finish(trainer, metrics, json_path)


def _known_loss(loss: str, resume: bool, out: Path) -> None:
    """An unknown loss is one line; resuming a run whose loss plugin is gone says what is missing."""
    from cocos.errors import CocosError
    from cocos.objectives import get_objective

    try:
        get_objective(loss)
    except CocosError as exc:
        if not resume:
            raise
        raise CocosError(f"{out / 'last.pt'}: --resume needs the loss '{loss}' it was trained with, which no installed "
                         "package registers (install the plugin that defines it; evaluating and analysing the "
                         f"checkpoint need no plugin). {exc}") from None


def _model_flags(model: str, args: list[str]) -> tuple[dict, list[str], list[str]]:
    """The options the command did not parse (read as loss flags are, :func:`lossflags.as_params`), split: a model
    family's own hyper-parameters (typed later by the family's spec), its pre-trained sources given under their
    own names (``--NAME PATH``, as ``--source NAME=PATH``) and the rest (the loss's flags)."""
    from cocos.models.registry import get_family

    family = get_family(model)
    related = [family, *([get_family(family.images_family)] if family.images_family else [])]
    own = {k for f in related for k in f.defaults} - {"embed_size", "word_dim", "cnn_type", "finetune"}
    sourced = {s.name for f in related for s in f.sources}
    params, rest, sources = {}, [], []
    for flag, item in lossflags.as_params(args):
        name, _, value = item.partition("=")
        if name in own:
            params[name] = value
        elif name in sourced:
            sources.append(f"{name}={value}")
        else:
            rest.append(f"{flag}={value}")
    return params, rest, sources


FLAG_OF = {"lr_groups": "lr_group"}  # a flat setting whose flag has another name


def _with_recipe(ctx: typer.Context, flat: dict, resume: bool) -> dict:
    """The model family's training recipe (VSE∞'s AdamW, rates, schedule and warm-up) for every setting not given on
    the command line (:func:`cocos.training.trainer.with_recipe`); a resumed run takes the recipe's settings as its
    ``last.pt`` recorded them where none is given (every other flag must be given as before)."""
    from cocos.training.trainer import with_recipe

    def given(name: str) -> bool:
        source = ctx.get_parameter_source(FLAG_OF.get(name, name))  # typer's click or click's own enum: by name
        return source is not None and getattr(source, "name", str(source)) not in ("DEFAULT", "DEFAULT_MAP")

    if resume:  # the recipe's settings as the run recorded them (a 1-epoch run recorded no warm-up, say)
        from cocos.training.trainer import family_recipe

        keys = family_recipe(flat)
        recorded = {k: v for k, v in _recorded_train(Path(flat["out"]) / "last.pt").items() if k in keys}
        flat = {**flat, **{k: v for k, v in recorded.items() if not given(k)}}
        return with_recipe(flat, lambda k: given(k) or k in recorded)
    return with_recipe(flat, given)


def _recorded_train(last: Path) -> dict:
    """The flat ``train`` record of a run's ``last.pt`` (cheaply read; ``{}`` if there is none: resuming then
    fails with its own line)."""
    from cocos.errors import CocosError
    from cocos.training.checkpoint import peek
    from cocos.training.config import record_flat

    train = peek(last).get("train") if last.is_file() else None
    try:
        return record_flat(train) if isinstance(train, dict) else {}
    except CocosError:  # a record the checked load of last.pt refuses in its own line
        return {}


def _sources(items: list[str], **spelled: Path | None) -> dict[str, str]:
    """``--source NAME=PATH`` items and the sources given under their own flags (``--bert DIR``, ``--clip DIR``) as
    ``{name: path}``; a name given twice is one line."""
    from cocos.errors import CocosError

    out = {name: str(path) for name, path in spelled.items() if path is not None}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise CocosError(f"--source takes NAME=PATH, got '{item}'")
        if name in out:
            raise CocosError(f"--source {name}: given twice")
        out[name] = path
    return out


def _lr_groups(items: list[str]) -> dict[str, float]:
    """``--lr-group PREFIX=FACTOR`` items as ``{prefix: factor}``."""
    from cocos.errors import CocosError

    out = {}
    for item in items:
        prefix, eq, factor = item.partition("=")
        try:
            out[prefix] = float(factor)
        except ValueError:
            raise CocosError(f"--lr-group takes PREFIX=FACTOR, got '{item}'") from None
        if not eq:
            raise CocosError(f"--lr-group takes PREFIX=FACTOR, got '{item}'")
    return out


def _finish(trainer, metrics: dict, json_path: Path | None) -> None:
    """After training (the main process): the best rsum, the figures of the run's logs, ``--json``."""
    try:
        from cocos.io import check_interrupt

        check_interrupt()  # a Ctrl-C swallowed after the last step: no figures, no --json
        typer.echo(f"best validation rsum {metrics['rsum']:.1f} -> {trainer.best_path}")
        from cocos.objectives import names
        from cocos.pipelines.analyze import presentations
        from cocos.report.training import plot_run

        for figure in plot_run(trainer.out, looks=presentations(names())):
            typer.echo(f"wrote {figure}")
        if json_path is not None:
            from cocos.io import write_json

            write_json(json_path, metrics)
    except KeyboardInterrupt:
        typer.echo(interrupted_message(trainer), err=True)
        raise typer.Exit(code=130) from None


def _check_json(json_path: Path, cfg, overwrite: bool = False) -> None:
    """``--json`` before the first step: not an input, not one of the run's own files, in a writable place."""
    import re

    from cocos.errors import CocosError
    from cocos.io import check_output_file, check_writable_file
    from cocos.training.trainer import OUTPUT_NAMES, OUTPUT_PATTERNS

    ltd_targets = cfg.hooks.ltd.targets if cfg.hooks.ltd is not None else None
    check_output_file(json_path, [cfg.data.path, cfg.data.vocab, ltd_targets, cfg.model.cnn_weights,
                                  *(cfg.model.sources or {}).values()], overwrite=overwrite)
    if json_path.resolve().parent == Path(cfg.out).resolve() and (
            json_path.name in OUTPUT_NAMES or any(re.fullmatch(p, json_path.name) for p in OUTPUT_PATTERNS)):
        raise CocosError(f"{json_path}: is one of the files cocos train writes into {cfg.out}; choose another "
                         "--json path")
    check_writable_file(json_path)


def interrupted_message(trainer) -> str:
    """One line after Ctrl-C that says exactly what the out folder holds now."""
    saved = trainer.saved()
    if trainer.epoch_running:
        head = f"interrupted in epoch {trainer.epoch_running}"
    elif trainer.epoch >= trainer.cfg.optim.epochs:
        head = "interrupted after training finished"
    else:
        head = "interrupted"
    if saved["last"] is None and saved["best"] is None:
        return f"{head}: nothing was saved"
    held = []
    if saved["last"] is not None:
        held.append(f"{trainer.last_path} holds epoch {saved['last']}")
    if saved["best"] is not None:
        held.append(f"{trainer.best_path} {'holds ' if not held else ''}epoch {saved['best']}")
    if saved["last"] is None:
        tail = "; no last.pt to resume from (start over with --overwrite)"
    elif saved["last"] < trainer.cfg.optim.epochs:
        tail = "; continue with --resume"
    else:
        tail = ""
    return f"{head}: {', '.join(held)}{tail}"


@app.command("evaluate")
@handle_errors
def evaluate(
    checkpoint: Path = typer.Argument(..., help="A checkpoint written by cocos train."),
    data: Path = typer.Option(None, help="Data folder or image dataset (default: the one recorded in the "
                                         "checkpoint)."),
    split: str = typer.Option("test", help="train, dev or test."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    workers: int = typer.Option(0, help="Raw images: DataLoader workers decoding images."),
    json_path: Path = typer.Option(None, "--json", help="Write the metrics here."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --json file."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """R@1/5/10 both ways, rsum, mAP@5 and R-precision of a checkpoint on a split."""
    from cocos.device import resolve_device
    from cocos.errors import CocosError
    from cocos.io import check_interrupt, check_output_file, check_writable_file
    from cocos.training.checkpoint import load_checkpoint
    from cocos.training.evaluate import evaluate_model, tokenize_split
    from cocos.training.trainer import build_from_checkpoint, open_split, resolve_data

    if json_path is not None:  # before anything is read: --json never replaces the checkpoint or the data
        from .analyze import _inputs

        check_output_file(json_path, _inputs(checkpoint, data), overwrite=overwrite, runs=[checkpoint])
        check_writable_file(json_path)
    ckpt = load_checkpoint(checkpoint)
    folder = resolve_data(ckpt, data, checkpoint)
    if json_path is not None:
        check_output_file(json_path, [checkpoint, folder], overwrite=overwrite, runs=[checkpoint])
    if workers < 0:
        raise CocosError(f"--workers must be at least 0, got {workers}")
    dev = resolve_device(device)
    model, vocab = build_from_checkpoint(ckpt, checkpoint)
    split_data = open_split(ckpt, folder, split)
    from cocos.distributed import context
    from cocos.training.pixels import prepare_model

    with context() as group:  # under torchrun: ranks split the encoding, rank 0 prints and writes
        metrics = evaluate_model(prepare_model(model, dev), split_data, tokenize_split(split_data, vocab),
                                 device=dev, progress=progress, workers=workers,
                                 crop_size=int(ckpt["data"].get("crop_size", 224)))
    if not group.is_main:
        return
    check_interrupt()  # a Ctrl-C swallowed during the evaluation: stop before anything is written
    typer.echo(format_metrics(metrics, f"{checkpoint} on {split}"))
    if json_path is not None:
        from cocos.io import write_json

        write_json(json_path, metrics)


def format_metrics(m: dict, title: str) -> str:
    lines = [f"{title}: rsum {m['rsum']:.1f}",
             f"  i2t R@1/5/10 {m['i2t_R@1']:.1f} / {m['i2t_R@5']:.1f} / {m['i2t_R@10']:.1f}   "
             f"mAP@5 {m['mAP@5']:.3f}   R-prec {m['i2t_Rprec']:.3f}",
             f"  t2i R@1/5/10 {m['t2i_R@1']:.1f} / {m['t2i_R@5']:.1f} / {m['t2i_R@10']:.1f}   "
             f"R-prec {m['t2i_Rprec']:.3f}"]
    if "1k_rsum" in m:
        lines.append(f"  5-fold 1K mean rsum {m['1k_rsum']:.1f}")
    return "\n".join(lines)
