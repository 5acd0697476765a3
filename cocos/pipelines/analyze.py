"""``cocos analyze``: checkpoint -> frozen encoding of the training set -> all counts -> report.

What section 5 of the COCOS paper did by hand: freeze the model at its best
validation checkpoint, walk the training set in random batches (pair batches for
Triplet, Triplet SH and NT-Xent, ranking batches for SmoothAP), count per loss
and direction, and put the counts next to the retrieval scores they explain.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from cocos import __version__
from cocos.counting.engine import DEFAULT_SWEEP, CountRun, EmbeddingSet, count_embeddings
from cocos.data.precomp import data_fingerprint
from cocos.defaults import DEFAULT_EPS
from cocos.embed import FrozenModel, save_embeddings
from cocos.embed.features import read_manifest
from cocos.errors import CocosError
from cocos.losses.spec import Objective, format_value
from cocos.models.registry import get_family
from cocos.objectives import OBJECTIVES, counter_params, names, paper_names, resolve
from cocos.pipelines.explorer import LabelledEmbeddings
from cocos.presentation import LAST, Presentation
from cocos.results import (
    CountingInfo,
    DataInfo,
    Evaluation,
    ModelInfo,
    Results,
    Source,
    TrainingInfo,
    cnn_name,
    records,
)
from cocos.training.config import record_flat
from cocos.training.logs import TrainingLogs, read_logs


@dataclass
class Analysis:
    results: Results  # what results.json holds (see cocos/results/SCHEMA.md)
    run: CountRun  # the tidy per-batch and per-query values, both modes
    embeddings: EmbeddingSet  # the counted split's frozen embeddings (a LabelledEmbeddings: with its captions' texts)
    timings: dict  # seconds per stage (not part of results.json, which must be reproducible)
    logs: TrainingLogs | None = None  # the run's step log and COCOS track up to this checkpoint's epoch
    warnings: list = field(default_factory=list)  # one line each, for the terminal


def refuse_embeddings(path: str | os.PathLike) -> None:
    """An ``.npz`` of embeddings is not a checkpoint: say so, and which command counts it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return
    if {"images.npy", "captions.npy"} <= names:
        raise CocosError(f"{path}: this is an embeddings file (images and captions), not a checkpoint; "
                         f"count it with: cocos count {path}")


def data_warnings(frozen: FrozenModel, train=None) -> list[str]:
    """One line when the data folder is not the one the model was trained on (another fingerprint)."""
    recorded = frozen.checkpoint["data"].get("fingerprint")
    if frozen.is_images:  # a raw-image model: the content fingerprint of its training split, unless imported
        if "legacy" in frozen.checkpoint or train is None:  # (an imported one records its folder's, as found)
            return []
        found = train.images.fingerprint()
    else:
        found = data_fingerprint(frozen.data_folder)
    if recorded and found != recorded:
        return [f"{frozen.data_folder}: its fingerprint {found} differs from the checkpoint's {recorded} "
                "(not the data the model was trained on)"]
    return []


def run_counts(emb: EmbeddingSet, losses, *, batch_size: int, seed: int, compat: bool, params: dict,
               eps: float | None, sweep_eps, progress: bool, keep_per_query: bool = True) -> CountRun:
    """Both counting modes in one pass (the shown one first), with the eps sweep (and the per-query rows that
    the figures and queries.csv need, unless ``keep_per_query`` is off)."""
    modes = ["compat", "corrected"] if compat else ["corrected", "compat"]
    return count_embeddings(emb, losses, batch_size=batch_size, seed=seed, modes=modes, params=params, eps=eps,
                            sweep_eps=sweep_eps, progress=progress, keep_per_query=keep_per_query)


def counting_info(run: CountRun, compat: bool, sweep_eps) -> CountingInfo:
    return CountingInfo(compat=compat, seed=run.seed, batch_size=run.batch_size, n_batches=run.n_batches,
                        losses=run.losses, params=run.params,
                        eps_sweep=[float(e) for e in sweep_eps or ()],
                        labels={n: lab for n, lab in run.labels.items() if n not in OBJECTIVES})


def presentation_of(spec: Objective, rank: int = LAST) -> Presentation:
    """A family's presentation (:meth:`cocos.losses.spec.Objective.presentation`) at ``rank``."""
    return spec.presentation(rank)


def presentations(losses, labels: dict | None = None, recorded: dict | None = None) -> dict[str, Presentation]:
    """What results.json says about how each of these losses is shown (the report never asks the registry): the
    registered family's presentation, else the one ``recorded`` (a checkpoint's, for a loss whose plugin is not
    installed), else its label alone."""
    known = names()
    out = {}
    for name in dict.fromkeys(n for n in losses if n is not None):
        if name in OBJECTIVES:
            out[name] = presentation_of(OBJECTIVES[name], known.index(name))
        elif name in (recorded or {}):
            out[name] = recorded[name]
        else:
            out[name] = Presentation(label=(labels or {}).get(name, name))
    return out


def recorded_presentation(ckpt: dict) -> dict[str, Presentation]:
    """The training loss's presentation as the checkpoint records it (``loss.presentation``; none before #29)."""
    look = ckpt["loss"].get("presentation")
    return {ckpt["loss"]["name"]: Presentation.from_dict(look)} if isinstance(look, dict) else {}


def analyze_checkpoint(
    checkpoint: str | os.PathLike,
    data: str | os.PathLike | None = None,
    *,
    losses=None,
    batch_size: int | None = None,
    seed: int = 0,
    compat: bool = False,
    split: str = "test",
    device: str = "auto",
    eps: float = DEFAULT_EPS,
    sweep_eps=DEFAULT_SWEEP,
    save_embeddings_to: str | os.PathLike | None = None,
    label: str | None = None,
    progress: bool = False,
    vocab: str | os.PathLike | None = None,
    trust: bool = False,
    image_options: dict | None = None,
    bert: str | os.PathLike | None = None,
    reader=None,
) -> Analysis:
    """Encode the training split once, count every loss both ways (in both modes), evaluate.

    ``batch_size=None`` counts at the batch size the checkpoint was trained with (the paper's
    practice). ``label`` (e.g. ``"last"``, ``"epoch 5"``) keeps checkpoints of one run apart in
    reports: the model is shown as ``VSE++ (last)``. ``vocab`` (and ``data``) import a checkpoint of
    the original VSE++/VSRN code (:mod:`cocos.legacy`), ``bert`` (and ``data``) one of the original
    VSE∞ code (:mod:`cocos.legacy.vse_infty`); ``trust`` loads a checkpoint with
    ``weights_only=False`` (code in it may run: only for files the user trusts).

    A raw-image model (``vsepp_full``: a cocos checkpoint, or an original ``model_best.pth.tar`` with
    ``vocab`` and an image dataset as ``data``) is encoded as the COCOS authors' notebooks did: the
    evaluation transform on the training images, one frozen encoding; its pooled CNN features come
    from a matching feature cache when there is one (``image_options``: ``features`` folders,
    ``resize``, ``crop_size``, ``workers``, ``log``; :mod:`cocos.embed.images`). ``reader`` reads a checkpoint
    of another tool into a cocos checkpoint in memory (:meth:`cocos.embed.FrozenModel.load`; open_clip's:
    :func:`cocos.models.open_clip.open_clip_checkpoint`).
    """

    clock = time.perf_counter()
    timings = {}
    refuse_embeddings(checkpoint)
    frozen = FrozenModel.load(checkpoint, data, device, vocab=vocab, trust=trust, image_options=image_options,
                              bert=bert, reader=reader)
    ckpt = frozen.checkpoint
    losses = _losses(ckpt, losses)
    if batch_size is None:
        batch_size = int(_trained(ckpt).get("batch_size") or 128)
    if frozen.is_images:  # before minutes of CNN features
        _check_batch_size(batch_size, frozen.images.peek("train"), losses)
    train = frozen.open_split("train", progress=progress)
    _check_batch_size(batch_size, train, losses)  # before minutes of encoding
    timings["load"] = time.perf_counter() - clock
    emb = frozen.encode(train, progress=progress)
    # what the report's query explorer shows: the captions' texts, and the images of a raw-image dataset
    emb = LabelledEmbeddings.of(emb, texts=getattr(train, "captions", None), pictures=getattr(train, "images", None))
    timings["encode"] = time.perf_counter() - clock - timings["load"]
    trained = ckpt["loss"]["name"]
    params = counter_params(trained, ckpt["loss"].get("params", {}), losses)
    run = run_counts(emb, losses, batch_size=batch_size, seed=seed, compat=compat, params=params, eps=eps,
                     sweep_eps=sweep_eps, progress=progress)
    timings["count"] = time.perf_counter() - clock - timings["load"] - timings["encode"]
    eval_split = frozen.open_split(split, progress=progress)
    metrics = frozen.evaluate(eval_split, progress=progress)
    timings["evaluate"] = time.perf_counter() - clock - sum(timings.values())
    if save_embeddings_to is not None:  # last: a failed analysis leaves no partial output
        save_embeddings(save_embeddings_to, emb)
    kind = ckpt["model"]["kind"]
    ltd = {k: ckpt["ltd"][k] for k in ("mode", "eta", "beta")} if isinstance(ckpt.get("ltd"), dict) else None
    results = Results(
        source=Source("analyze", str(checkpoint), frozen.sha256(), int(ckpt["epoch"])),
        data=DataInfo(name=_dataset_name(frozen.data_folder), path=str(frozen.data_folder),
                      fingerprint=ckpt["data"]["fingerprint"], n_images=train.n_images,
                      n_captions=train.n_captions, k=frozen.k, split_counted="train",
                      image_transform=frozen.images.transform_record() if frozen.is_images else None),
        model=ModelInfo(label=get_family(kind).words(ckpt["model"]["hparams"]) + ltd_label(ltd)
                        + (f" ({label})" if label else ""),
                        kind=kind, hparams=ckpt["model"]["hparams"]),
        training=TrainingInfo(loss=trained, params=ckpt["loss"].get("params", {}),
                              seed=int(_trained(ckpt).get("seed") or 0), ltd=ltd, **_warmup(ckpt)),
        counting=counting_info(run, compat, sweep_eps),
        statistics=records(run.summary()),
        evaluation=Evaluation(eval_split.split, metrics, n_images=int(eval_split.n_images),
                              n_captions=int(eval_split.n_captions)), cocos_version=__version__,
        presentation=presentations([*run.losses, trained], {**run.labels, trained: ckpt["loss"].get("label", trained)},
                                   recorded_presentation(ckpt)),
    )
    results = Results.from_dict(results.to_dict())  # exactly what results.json will hold
    return Analysis(results=results, run=run, embeddings=emb, timings=timings, logs=_run_logs(checkpoint, ckpt),
                    warnings=data_warnings(frozen, train))


def _losses(ckpt: dict, losses) -> list[str]:
    """The counters: ``losses``, by default the paper's four and the checkpoint's own training loss."""
    if losses is not None:
        return list(losses)
    own = ckpt["loss"]["name"]
    return paper_names() + ([own] if own in OBJECTIVES and own not in paper_names() else [])


def _run_logs(checkpoint, ckpt: dict) -> TrainingLogs | None:
    """The run's step log and COCOS track beside the checkpoint, if any, to its epoch, with the checkpoint's
    history to that epoch (the training figure's dev rsum)."""
    logs = read_logs(Path(checkpoint).parent, max_epoch=int(ckpt["epoch"]))
    if not logs:
        return None
    logs.history = [h for h in ckpt.get("history") or [] if int(h.get("epoch", 0)) <= int(ckpt["epoch"])] or None
    return logs


def _trained(ckpt: dict) -> dict:
    """The run's settings as the checkpoint records them, flat (:func:`cocos.training.config.record_flat`: this
    version's sections or an earlier version's names); ``{}`` for a checkpoint with no record."""
    train = ckpt.get("train")
    return record_flat(train) if isinstance(train, dict) else {}


def _warmup(ckpt: dict) -> dict:
    """The run's warm-up as the checkpoint records it (``train.warmup_epochs``; the family trained during it is
    the training loss's ``warmup_loss``): ``{"warmup_epochs", "warmup_loss"}`` for :class:`TrainingInfo`."""
    epochs = _trained(ckpt).get("warmup_epochs")
    spec = OBJECTIVES.get(ckpt["loss"]["name"])
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1 or spec is None or not spec.warmup_loss:
        return {"warmup_epochs": 0, "warmup_loss": None}
    return {"warmup_epochs": epochs, "warmup_loss": spec.warmup_loss}


def ltd_label(ltd: dict | None) -> str:
    """How a model trained with LTD is named in reports (its own rows): ``VSE++ + LTD η=0.2``, ``+ LTD dual β=1``."""
    if not ltd:
        return ""

    if ltd.get("mode") == "dual":
        return f" + LTD dual β={format_value(ltd.get('beta'))}"
    return f" + LTD η={format_value(ltd.get('eta'))}"


def _check_batch_size(batch_size: int, split, losses) -> None:

    if batch_size < 1:
        raise CocosError(f"batch size must be positive, got {batch_size}")
    if any(resolve(n).layout == "ranking" for n in losses) and batch_size > split.n_images:
        raise CocosError(f"batch size {batch_size} is larger than the training split ({split.n_images} images)")
    if batch_size > split.n_captions:
        raise CocosError(f"batch size {batch_size} is larger than the training split ({split.n_captions} captions)")


def _dataset_name(folder: Path) -> str:
    """The dataset's name: ``name`` in a ``synth.json``/``dataset.json`` if present; for a feature cache that
    ``cocos data features`` wrote, its image dataset's name and the CNN (``synth_images, ResNet-18 features``);
    else the folder name."""

    cached = _cache_name(folder)
    if cached is not None:
        return cached
    for meta in ("dataset.json", "synth.json"):
        path = folder / meta
        if path.is_file():
            try:
                name = json.loads(path.read_text()).get("name")
            except (ValueError, OSError, AttributeError, RecursionError):
                name = None
            if isinstance(name, str) and name:
                return name
    return folder.resolve().name


def _cache_name(folder: Path) -> str | None:
    """``IMAGES, CNN features`` of a feature cache folder (its manifest names the image dataset), else None."""
    manifest = read_manifest(folder)
    source = ((manifest or {}).get("splits") or {}).get("train", {}).get("source")
    if not isinstance(source, str) or not isinstance(manifest.get("cnn_type"), str):
        return None
    root = Path(source) if Path(source).is_dir() else Path(source).parent
    if not root.is_dir() or root.resolve() == folder.resolve():
        return None
    return f"{_dataset_name(root)}, {cnn_name(manifest['cnn_type'])} features"


