"""What a sweep's runs read, checked before anything runs, and the fingerprint that tells a finished run's data.

A run's data is a precomputed-feature folder (``{split}_ims.npy`` + captions; a frozen CNN's feature cache is
one) or a raw-image dataset (:func:`cocos.data.images.is_image_dataset`: images/ + ``dataset_*.json``,
``{split}_set.p`` or a CSV file list), each model of a grid on its own if it names one. Per data path the splits
training reads (train, with Karpathy's restval where a run asks for it, and dev) and each run's ``[analyze]``
split are opened (the ``.npy`` header, the image list and captions: no pixel is read), the analysis batch size
is checked against the training split as ``cocos analyze`` checks it (the images when a counted loss batches
whole images, else the captions), and every file and pre-trained source folder a run names exists (the trainer
checks what they hold).

The fingerprint of a run's data is the one ``cocos train`` records in its checkpoint (``data.fingerprint``):
:func:`cocos.data.precomp.data_fingerprint` of a feature folder, the training split's content
(:meth:`cocos.data.images.ImageSplit.fingerprint`, every image's bytes) of an image dataset, computed once per
data path (and restval) per sweep, and only for runs that have a checkpoint to compare it with.
"""

from __future__ import annotations

from pathlib import Path

from cocos.data.images import is_image_dataset, load_image_split
from cocos.data.precomp import _open_features, data_fingerprint, find_karpathy_json
from cocos.device import resolve_device
from cocos.errors import CocosError
from cocos.objectives import OBJECTIVES, paper_names, resolve
from cocos.pipelines.sweep_schema import Grid, SweepRun, sources_of
from cocos.training.config import DataConfig, OptimConfig, TrainConfig, default

PATH_KEYS = ("vocab", "ltd_targets", "cnn_weights")  # [train] keys that name a file every run reads


def check_inputs(grid: Grid, executor: str = "local") -> None:
    """What every run reads, before anything runs (``--dry-run`` and a real sweep alike); nothing is written.

    Each data path (module docstring): its training splits and each run's [analyze] split, the analysis batch
    size (the training one unless [analyze] sets it) against the training split; each run's files (vocab,
    ltd_targets, cnn_weights) and pre-trained source folders; the device is one a run can use (on the local
    executor: available here).
    """
    where = grid.source or grid.name
    for data in grid.inputs:
        runs = [run for run in grid.runs if run.train["data"] == data]
        sizes = (_image_sizes if is_image_dataset(data) else _feature_sizes)(where, data, runs)
        for run in runs:
            _check_batch(where, run, *sizes[_restval(run.train)])
            check_run_files(where, run)
    if executor == "local":  # the name itself: TrainConfig.validate (check_device_name)
        for device in sorted({run.train.get("device", default(TrainConfig, "device")) for run in grid.runs}):
            try:
                resolve_device(device)
            except CocosError as exc:
                raise CocosError(f"{where}: [train] device: {exc}") from None


def _restval(train: dict) -> bool:
    return bool(train.get("use_restval", default(DataConfig, "use_restval")))


def _analysed_splits(runs: list[SweepRun]) -> list[str]:
    return sorted({run.analyze["split"] for run in runs} - {"train", "dev"})


def _feature_sizes(where: str, data: str, runs: list[SweepRun]) -> dict[bool, tuple[int, int]]:
    """A precomputed-feature folder: its splits' headers; ``{restval: (images, captions)}`` of its training split."""
    path = Path(data)
    if not (path / "train_ims.npy").exists():
        raise CocosError(f"{where}: data: {data}: no train_ims.npy, and not a raw-image dataset (images/ + "
                         "dataset_*.json, {split}_set.p or a CSV file list); make one with cocos data synth")
    n_images = _split_rows(path, "train", f"{where}: data")
    _split_rows(path, "dev", f"{where}: data (dev: the validation split of training)")
    for split in _analysed_splits(runs):
        _split_rows(path, split, f"{where}: [analyze] split")
    k = max(int(run.train.get("k", default(DataConfig, "k"))) for run in runs)
    return {False: (n_images, n_images * k), True: (n_images, n_images * k)}  # restval: raw images only


def _split_rows(data: Path, split: str, where: str) -> int:
    """The number of images of a split of a precomputed-feature folder (its .npy header), or one line."""
    path = data / f"{split}_ims.npy"
    if not path.is_file():
        have = sorted(p.name[:-len("_ims.npy")] for p in data.glob("*_ims.npy"))
        raise CocosError(f"{where}: {data} has no split '{split}' (no {path.name}; its splits: "
                         f"{', '.join(have) or 'none'})")
    try:
        rows = int(_open_features(path).shape[0])
    except CocosError as exc:
        raise CocosError(f"{where}: {exc}") from None
    if not (data / f"{split}_caps.txt").is_file() and find_karpathy_json(data) is None:
        raise CocosError(f"{where}: {data / f'{split}_caps.txt'}: no such caption file (and no dataset_*.json)")
    return rows


def _image_sizes(where: str, data: str, runs: list[SweepRun]) -> dict[bool, tuple[int, int]]:
    """A raw-image dataset: its splits' image lists and captions (no image is read); ``{restval: (images,
    captions)}`` of its training split, with Karpathy's restval for the runs that ask for it."""

    def opened(split: str, what: str, restval: bool = False):
        try:
            return load_image_split(data, split, use_restval=restval)
        except CocosError as exc:
            raise CocosError(f"{where}: {what}: {exc}") from None

    sizes = {}
    for restval in sorted({_restval(run.train) for run in runs}):
        train = opened("train", "data", restval)
        sizes[restval] = (train.n_images, train.n_captions)
    opened("dev", "data (dev: the validation split of training)")
    for split in _analysed_splits(runs):
        opened(split, "[analyze] split")
    return sizes


def _check_batch(where: str, run: SweepRun, n_images: int, n_captions: int) -> None:
    """The analysis batch fits the training split as cocos analyze requires: its images when a counted loss (the
    paper's four and the run's own) batches whole images, its captions otherwise."""
    batch = run.analyze["batch_size"] or run.train.get("batch_size", default(OptimConfig, "batch_size"))
    own = run.train.get("loss")
    counted = paper_names() + ([own] if own in OBJECTIVES and own not in paper_names() else [])
    whole_images = any(resolve(name).layout == "ranking" for name in counted)
    size, unit = (n_images, "images") if whole_images else (n_captions, "captions")
    if batch > size:
        key = "[analyze] batch_size" if run.analyze["batch_size"] else \
            "[train] batch_size (the analysis counts at the training batch size unless [analyze] sets one)"
        raise CocosError(f"{where}: run {run.name}: {key}: {batch} is larger than the training split "
                         f"({size} {unit})")


def check_run_files(where: str, run: SweepRun) -> None:
    """A run's [train] files exist (vocab, ltd_targets, cnn_weights), and each pre-trained source folder its model
    takes (:attr:`cocos.models.family.ModelFamily.sources`, given by its name or in ``sources``)."""
    for key in PATH_KEYS:
        if run.train.get(key) and not Path(run.train[key]).is_file():
            raise CocosError(f"{where}: run {run.name}: {key}: {run.train[key]}: no such file")
    given = run.train.get("sources") or {}
    for source in sources_of(run.train["model"]):
        path = run.train.get(source.name) or given.get(source.name)
        if path and not Path(path).exists():
            what = "folder" if source.metavar == "DIR" else "file"
            raise CocosError(f"{where}: run {run.name}: {source.name}: {path}: no such {what} ({source.what})")


def fingerprint(train: dict, memo: dict | None = None) -> str:
    """The fingerprint ``cocos train`` records for a run's data (module docstring); ``memo`` keeps each once."""
    data = train["data"]
    key = (str(data), _restval(train))
    if memo is not None and key in memo:
        return memo[key]
    if is_image_dataset(data):
        value = load_image_split(data, "train", use_restval=key[1]).fingerprint()
    else:
        value = data_fingerprint(data)
    if memo is not None:
        memo[key] = value
    return value
