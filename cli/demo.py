"""``cocos demo``: the embedded default, end to end (the README's first command)."""

from __future__ import annotations

from pathlib import Path

import typer

from cocos.pipelines.demo_clip_config import CLIP_DEFAULTS, CLIP_LOSSES, ClipDemoConfig
from cocos.pipelines.demo_config import BERT_DEFAULTS, FINETUNE_DEFAULTS, IMAGE_DEFAULTS, DemoConfig
from cocos.training.config import default

from .common import handle_errors
from .main import app

CLIP_MODEL = "clip"  # cocos demo --model clip: the demo's own tiny CLIP, pre-trained, then fine-tuned (demo_clip)


def _check_paths(args: dict) -> None:
    """The folders, before the heavy imports (the demo checks them again, with the rest, before any work): --data
    and --checkpoints are folders where they exist, --out is allowed (:func:`cocos.io.check_output_dir`)."""
    from cocos.errors import CocosError
    from cocos.io import check_output_dir
    from cocos.pipelines.demo_config import FINETUNE_DEFAULTS, IMAGE_DEFAULTS

    images = bool(args.get("images"))
    model = args.get("model", default(DemoConfig, "model"))
    defaults = {"out": "reports/demo", "data": "data/synth", "checkpoints": "checkpoints/demo"}
    if model == CLIP_MODEL:  # the CLIP demo's own folders (its world is the image demo's)
        defaults = dict(CLIP_DEFAULTS)
    elif images:
        defaults = {k: (FINETUNE_DEFAULTS if args.get("finetune") else IMAGE_DEFAULTS)[k] for k in defaults}
    paths = {k: Path(args.get(k) or v) for k, v in defaults.items()}
    if not args.get("out") and model not in (default(DemoConfig, "model"), CLIP_MODEL) and not images:
        # another family than the demo's own: perhaps one whose report goes elsewhere
        from cocos.pipelines.demo import bert_family
        from cocos.pipelines.demo_config import BERT_DEFAULTS

        if bert_family(model):
            paths["out"] = Path(BERT_DEFAULTS["out"])
    for name in ("data", "checkpoints"):
        if paths[name].exists() and not paths[name].is_dir():
            raise CocosError(f"{paths[name]}: exists and is not a folder; choose another --{name}")
    check_output_dir(paths["out"], [paths["data"], paths["checkpoints"]], bool(args.get("overwrite")), kind="report",
                     by="demo")


def _losses(loss: list[str], bert_model: bool) -> list[str]:
    """--loss as loss names: none given, the COCOS paper's four (Triplet SH alone for a BERT family, whose steps are
    slow); ``paper``; or names."""
    from cocos.objectives import parse_names
    from cocos.pipelines.demo import BERT_LOSSES, paper_losses

    if not loss:
        return list(BERT_LOSSES) if bert_model else paper_losses()
    return paper_losses() if loss == ["paper"] else parse_names(loss)


def _no_image_flags(**values) -> None:
    """Without --images, the image demo's flags at their defaults (or not given: None); one line naming those that
    are not."""
    from cocos.errors import CocosError

    named = [f"--{n.replace('_', '-')}" for n, v in values.items() if v is not None and v != default(DemoConfig, n)]
    if named:
        raise CocosError(f"{', '.join(named)} only apply to cocos demo --images")


# the flags of the other demos that cocos demo --model clip does not take, at their defaults
DEFAULTS_OF_OTHERS = {n: default(DemoConfig, n) for n in ("embed_size", "word_dim", "cnn", "crop_size")}


def _clip_demo(paths: dict, loss: list[str], others: dict, progress: bool, **settings) -> None:
    """``cocos demo --model clip`` (:mod:`cocos.pipelines.demo_clip`): its flags as its config (those not given at
    its defaults), one line naming the flags it does not take."""
    from cocos.errors import CocosError
    from cocos.objectives import parse_names
    from cocos.pipelines.demo_clip import run_clip_demo

    named = [f"--{n.replace('_', '-')}" for n, v in others.items()
             if v is not None and v is not False and v != DEFAULTS_OF_OTHERS.get(n)]
    if named:
        raise CocosError(f"{', '.join(named)} do not apply to cocos demo --model clip")
    given = {k: (str(v) if isinstance(v, Path) else v) for k, v in {**paths, **settings}.items() if v is not None}
    cfg = ClipDemoConfig(**given, losses=parse_names(loss) if loss else list(CLIP_LOSSES))
    try:
        run_clip_demo(cfg, progress=progress, log=typer.echo)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {cfg.out} was left as it was; the stages finished in {cfg.checkpoints} are reused "
                   "by the next cocos demo --model clip", err=True)
        raise typer.Exit(code=130) from None


def _mode_defaults(images: bool, finetune: bool, bert_model: bool) -> dict:
    """The settings where the image demo (frozen or fine-tuned) or a BERT family's demo differs from the plain one."""
    if images:
        return FINETUNE_DEFAULTS if finetune else IMAGE_DEFAULTS
    return BERT_DEFAULTS if bert_model else {}


@app.command("demo")
@handle_errors(check=_check_paths)
def demo(
    out: Path = typer.Option(None, help="Report folder [default: reports/demo; reports/demo_images with --images, "
                                        f"{CLIP_DEFAULTS['out']} with --model clip]."),
    data: Path = typer.Option(None, help="Synthetic data folder, generated if absent [default: data/synth; "
                                         "data/synth_images with --images or --model clip]."),
    checkpoints: Path = typer.Option(None, help="Where the four models go [default: checkpoints/demo; "
                                                "checkpoints/demo_images with --images, "
                                                f"{CLIP_DEFAULTS['checkpoints']} with --model clip]."),
    loss: list[str] = typer.Option([], "--loss", "-l", metavar="NAMES",
                                   help="Losses to train and analyse: paper (the COCOS paper's four), all, or "
                                        "registered names [default: paper; triplet_sh with --model vse_infty; "
                                        f"{', '.join(CLIP_LOSSES)} with --model clip]."),
    all_losses: bool = typer.Option(False, "--all-losses",
                                    help="Also train GOAL (cir x sig_ms and con x con) and IMC models."),
    model: str = typer.Option(default(DemoConfig, "model"), help="A registered model family (see `cocos models`); "
                                                                 "vse_infty trains beside VSE++ on its own schedule "
                                                                 "(2 epochs, VSE∞'s recipe; --epochs, --lr, "
                                                                 "--lr-update and --warmup-epochs set VSE++'s), its "
                                                                 "report in reports/demo_vse_infty; clip "
                                                                 "pre-trains the demo's own tiny CLIP (random "
                                                                 "init) on the image world, fine-tunes it with "
                                                                 "each loss, report in "
                                                                 f"{CLIP_DEFAULTS['out']}."),
    bert: Path = typer.Option(None, metavar="DIR", help="With --model vse_infty: its BERT folder [default: the "
                                                        "all-MiniLM-L6-v2 of the [ltd] extra]."),
    epochs: int = typer.Option(None, help="Training epochs per model [default: 8; with --images: "
                                          f"{IMAGE_DEFAULTS['epochs']}, {FINETUNE_DEFAULTS['epochs']} with "
                                          "--finetune; with --model clip: "
                                          f"{default(ClipDemoConfig, 'epochs')} of fine-tuning]."),
    lr: float = typer.Option(None, help="Adam learning rate (the demo's shorter schedule) [default: "
                                        f"{default(DemoConfig, 'lr'):g}; with --model clip: the fine-tuning's "
                                        f"AdamW rate, {default(ClipDemoConfig, 'lr'):g}]."),
    lr_update: int = typer.Option(None, help="Epoch after which the learning rate drops x0.1 [default: 6; with "
                                             f"--images: {IMAGE_DEFAULTS['lr_update']}, "
                                             f"{FINETUNE_DEFAULTS['lr_update']} with --finetune]."),
    warmup_epochs: int = typer.Option(None, help="Triplet SH: all-triplet epochs before max violation [default: "
                                                 f"{default(DemoConfig, 'warmup_epochs')}; "
                                                 f"{IMAGE_DEFAULTS['warmup_epochs']} with --images, "
                                                 f"{FINETUNE_DEFAULTS['warmup_epochs']} with --finetune]."),
    batch_size: int = typer.Option(default(DemoConfig, "batch_size"), help="Batch size of training and counting."),
    embed_size: int = typer.Option(default(DemoConfig, "embed_size"), help="Joint embedding size."),
    word_dim: int = typer.Option(default(DemoConfig, "word_dim"), help="Word embedding size."),
    n_train: int = typer.Option(None, help="Synthetic training scenes, when generating [default: 3000; "
                                           f"{IMAGE_DEFAULTS['n_train']} with --images]."),
    n_test: int = typer.Option(None, help="Synthetic dev and test scenes each, when generating [default: 500; 200 "
                                          "with --images]."),
    seed: int = typer.Option(default(DemoConfig, "seed"), help="Seed of data, training and counting."),
    device: str = typer.Option(default(DemoConfig, "device"), help="auto, cpu or cuda."),
    retrain: bool = typer.Option(False, "--retrain", help="Train even if matching checkpoints exist."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out report, a --data dataset or "
                                                              "a model's run folder that another command wrote "
                                                              "(the demo's own are rewritten without it)."),
    track_cocos: int = typer.Option(default(DemoConfig, "track_cocos"), metavar="N",
                                    help="Count COCOS on the training batches every N steps."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
    images: bool = typer.Option(False, "--images", help="Raw images: render the image world (JPEGs), pre-train a CNN "
                                                        "on its attribute task (not retrieval), write its frozen "
                                                        "features (cocos data features) and train VSE++ on them."),
    finetune: bool = typer.Option(False, "--finetune", help="With --images: fine-tune the pre-trained CNN inside "
                                                            "VSE++ (vsepp_full; the CNN at a tenth of the rate) "
                                                            "instead; report in "
                                                            f"{FINETUNE_DEFAULTS['out']}/."),
    pretrain_epochs: int = typer.Option(None, "--pretrain-epochs", help="With --images: epochs of the attribute "
                                        f"pre-training [default: {default(DemoConfig, 'pretrain_epochs')}]; with "
                                        "--model clip: of the CLIP's pre-training "
                                        f"[default: {default(ClipDemoConfig, 'pretrain_epochs')}]."),
    cnn: str = typer.Option(default(DemoConfig, "cnn"), help="With --images: the CNN (resnet18|34|50|101|152, vgg19)."),
    image_size: int = typer.Option(default(DemoConfig, "image_size"), "--image-size",
                                   help="With --images: side of the rendered images in pixels."),
    crop_size: int = typer.Option(default(DemoConfig, "crop_size"), "--crop-size",
                                  help="With --images: the CNN's input: resize crop x 256/224, centre crop "
                                       "(pre-training, features, evaluation); fine-tuning trains on random crops."),
    workers: int = typer.Option(0, "--workers", min=0, help="With --images: DataLoader processes decoding images."),
) -> None:
    """Synthetic data -> VSE++ with the four losses -> cocos analyze each -> combined report (reports/demo/).

    With --images: the rendered image world -> a CNN pre-trained on its attributes -> its frozen features ->
    VSE++ -> reports/demo_images/ (--finetune: the CNN fine-tuned inside VSE++ -> reports/demo_images_finetune/).

    With --model clip: the image world -> the demo's own tiny CLIP (random init) pre-trained with CLIP's loss ->
    fine-tuned with NT-Xent, SigLIP and Triplet SH -> reports/demo_clip/."""
    from cocos.errors import CocosError
    from cocos.pipelines.demo import ALL_LOSSES_EXTRA, DemoConfig, bert_family, run_demo

    if model == CLIP_MODEL:
        _clip_demo({"out": out, "data": data, "checkpoints": checkpoints}, loss,
                   {"images": images, "finetune": finetune, "all_losses": all_losses, "bert": bert,
                    "lr_update": lr_update, "warmup_epochs": warmup_epochs, "embed_size": embed_size,
                    "word_dim": word_dim, "cnn": cnn, "crop_size": crop_size}, progress,
                   epochs=epochs, lr=lr, pretrain_epochs=pretrain_epochs, batch_size=batch_size, n_train=n_train,
                   n_dev=n_test, n_test=n_test, image_size=image_size, seed=seed, device=device, retrain=retrain,
                   overwrite=overwrite, track_cocos=track_cocos, workers=workers)
        return
    given = {"out": out, "data": data, "checkpoints": checkpoints, "epochs": epochs, "lr_update": lr_update,
             "n_train": n_train, "n_dev": n_test, "n_test": n_test, "pretrain_epochs": pretrain_epochs,
             "warmup_epochs": warmup_epochs}
    if not images:
        _no_image_flags(cnn=cnn, image_size=image_size, crop_size=crop_size, workers=workers, finetune=finetune,
                        pretrain_epochs=pretrain_epochs)
    bert_model = bert_family(model)
    if bert is not None and not bert_model:
        raise CocosError(f"--bert applies to cocos demo --model vse_infty, not --model {model}")
    defaults = _mode_defaults(images, finetune, bert_model)
    sizes = {k: defaults[k] for k in given if k in defaults}
    sizes.update({k: (str(v) if isinstance(v, Path) else v) for k, v in given.items() if v is not None})
    cfg = DemoConfig(
        **sizes,
        losses=_losses(loss, bert_model) + (list(ALL_LOSSES_EXTRA) if all_losses else []),
        model=model,
        bert=str(bert) if bert else None,
        lr=lr if lr is not None else default(DemoConfig, "lr"),
        batch_size=batch_size,
        embed_size=embed_size,
        word_dim=word_dim,
        seed=seed,
        device=device,
        retrain=retrain,
        overwrite=overwrite,
        track_cocos=track_cocos,
        images=images,
        finetune=finetune,
        cnn=cnn,
        image_size=image_size,
        crop_size=crop_size,
        workers=workers,
    )
    try:
        run_demo(cfg, progress=progress, log=typer.echo)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {cfg.out} was left as it was; models finished in {cfg.checkpoints} are reused by the "
                   "next cocos demo", err=True)
        raise typer.Exit(code=130) from None
