"""The frozen-CNN feature cache: pooled CNN features of a raw-image dataset in the VSE++ precomputed layout.

A frozen CNN (VSE++ without ``--finetune``) is a fixed function of the image: with the
evaluation transform (``Resize(resize)`` + ``CenterCrop(crop_size)``, definitions file
section 18) every image has one pooled feature, the CNN's output before VSE++'s first
``l2norm`` (:meth:`cocos.models.image.VSEPPFull.pooled`). :func:`write_feature_cache` writes
them once as a precomputed folder (:mod:`cocos.data.precomp`)::

    {split}_ims.npy         (N, d) float32 pooled features, row i = image i of the split
    {split}_caps.txt        its k captions per image, image-major (caption c belongs to image c // k)
    cocos_features.json     the manifest (below)

for ``split`` in ``train``, ``dev`` (Karpathy ``val``), ``test``, so every command that reads
precomputed folders reads it (``cocos train --data DIR`` of a precomputed VSE++ model,
``cocos data info DIR``). The **manifest** records per split the image split's content
fingerprint (:meth:`cocos.data.images.ImageSplit.fingerprint`: every image's bytes and
the captions), its sizes and source; the CNN type, the hash of the CNN's weights
(:func:`cnn_state_hash`) and, when they came from a file, that file's name and sha256;
the transform sizes; ``use_restval``; the cocos version.

**The cache key** (:func:`cache_key`) is ``(image-split fingerprint, cnn_type, CNN weights
hash, resize, crop_size)``: the hash is over the CNN's own state (names, dtypes, shapes and
values of every parameter and buffer except BatchNorm's ``num_batches_tracked``, which does
not change the output), not over a file, so a checkpoint whose frozen CNN holds the same
weights as the file the cache was built from matches it, and a fine-tuned CNN (other
weights) never does.

**Atomic and resumable.** Rows are written batch by batch into a staging folder beside the
output (``.{name}.features-partial``) holding a memory-mapped ``{split}_ims.npy`` of the final
shape and ``progress.json`` (the key of the run and the rows done per split), rewritten
atomically after each batch is flushed. A killed run leaves only the staging folder; a
rerun with the same inputs (same key, same batch size) continues after the last recorded
batch, and one with other inputs starts afresh (bad input, such as a corrupt image, removes the staging
folder: the rerun has other inputs anyway). When every split is done the captions and
the manifest are written and the staging folder is renamed onto the output: the output
folder is never visible half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch

from cocos import __version__
from cocos.data.images import ImageSplit, load_image_split
from cocos.data.precomp import SPLITS, PrecompSplit, _normalise_split
from cocos.data.transforms import CROP_SIZE, RESIZE, eval_transform
from cocos.errors import CocosError
from cocos.io import MARKER, check_interrupt, check_output_dir, interrupt_pending, sha256_file, write_json, write_text
from cocos.legacy import is_cocos_checkpoint, is_legacy_checkpoint, map_full_image, opt_dict, read_checkpoint_file
from cocos.models.cnn import build_cnn, load_cnn_weights, strip_classifier
from cocos.progress import progress_bar
from cocos.training.checkpoint import load_checkpoint
from cocos.training.pixels import batch_loader
from cocos.training.pixels import pooled_features as pooled_batch

MANIFEST = "cocos_features.json"
FORMAT = "cocos-features/1"
PARTIAL = "features-partial"
PROGRESS = "progress.json"


# -- the key -----------------------------------------------------------------------------------------

def cnn_state_hash(cnn: torch.nn.Module, length: int = 16) -> str:
    """Short sha256 hex of a CNN's weights: every state entry but ``num_batches_tracked``, sorted by name,
    as ``name, dtype, shape, bytes`` (module docstring)."""
    h = hashlib.sha256(b"cocos-cnn-state\0")
    for name, tensor in sorted(cnn.state_dict().items()):
        if name.endswith("num_batches_tracked"):
            continue
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}\0{str(t.dtype)}\0{tuple(t.shape)}\0".encode())
        if t.numel():
            h.update(memoryview(t.view(torch.uint8).numpy()))
    return h.hexdigest()[:length]


def cache_key(fingerprint: str, cnn_type: str, cnn_hash: str, resize: int, crop_size: int) -> dict:
    """What must agree for cached features to be those a model would compute (module docstring)."""
    return {"fingerprint": fingerprint, "cnn_type": cnn_type, "cnn_hash": cnn_hash, "resize": int(resize),
            "crop_size": int(crop_size)}


def check_sizes(resize: int, crop_size: int) -> None:
    for name, value in (("resize", resize), ("crop size", crop_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CocosError(f"the {name} must be a positive number of pixels, got {value!r}")


def _checkpoint_cnn(path: Path) -> tuple[str, dict] | None:
    """``(cnn_type, CNN state)`` of a raw-image checkpoint (cocos ``vsepp_full``, or the original code's
    ``EncoderImageFull``), read without running code; None for any other file (a torchvision weights file)."""

    try:
        raw = read_checkpoint_file(path)
    except CocosError:
        return None  # not readable as a checkpoint: the weights-file reader gives its own message
    if is_cocos_checkpoint(raw):

        ckpt = load_checkpoint(path)
        if ckpt["model"]["kind"] != "vsepp_full":
            raise CocosError(f"{path}: a checkpoint of a {ckpt['model']['kind']} model, which has no CNN")
        state = ckpt["state_dict"]
        cnn_type = ckpt["model"]["hparams"]["cnn_type"]
    elif is_legacy_checkpoint(raw):
        opt = opt_dict(raw, path)
        if not any(str(k).startswith("cnn.") for k in raw["model"][0]):
            raise CocosError(f"{path}: a checkpoint of the original code without CNN weights (precomputed features)")
        state, hparams = map_full_image(raw["model"][0], path, opt)
        cnn_type = hparams["cnn_type"]
    else:
        return None
    return cnn_type, {k.removeprefix("cnn."): v for k, v in state.items() if k.startswith("cnn.")}


def load_cnn(path: str | os.PathLike, cnn_type: str) -> torch.nn.Module:
    """The headless CNN ``cnn_type`` (classifier stripped, eval mode) with the weights of ``path``: a torchvision
    weights file, or the CNN of a raw-image checkpoint (cocos or the original code's ``model_best.pth.tar``),
    so that a cache can hold the features of a checkpoint's own (fine-tuned or drifted) CNN."""

    path = Path(path)
    trunk = strip_classifier(build_cnn(cnn_type))
    found = _checkpoint_cnn(path)
    if found is None:
        return load_cnn_weights(trunk, path, cnn_type).eval()
    have, state = found
    if have != cnn_type:
        raise CocosError(f"{path}: the checkpoint's CNN is a {have}, not a {cnn_type}")
    try:
        trunk.load_state_dict(state)
    except RuntimeError as exc:
        raise CocosError(f"{path}: the checkpoint's CNN weights do not fit a {cnn_type} "
                         f"({str(exc).splitlines()[0]})") from None
    return trunk.eval()


# -- pooled features ---------------------------------------------------------------------------------

def iter_pooled(cnn: torch.nn.Module, split: ImageSplit, *, start: int = 0, resize: int = RESIZE,
                crop_size: int = CROP_SIZE, batch_size: int = 64, workers: int = 0,
                device: torch.device | str = "cpu") -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, (b, d) float32 features)`` of images ``start..N-1`` of ``split`` in order, batch by batch.

    Each image: :func:`cocos.data.images.open_image` (in ``workers`` DataLoader processes), the
    evaluation transform, then ``cnn`` in eval mode without gradients (the pooled feature; the
    CNN's training mode is restored afterwards). Loading and the CNN pass are training's own
    (:func:`cocos.training.pixels.batch_loader`, :func:`~cocos.training.pixels.pooled_features`:
    bf16 autocast and channels-last on CUDA). Bad images raise one CocosError line naming them.
    """
    if batch_size < 1 or workers < 0:
        raise CocosError(f"batch size must be positive and workers not negative, got {batch_size}, {workers}")
    if start >= split.n_images:
        return
    plan = [(rows, rows) for rows in (np.arange(a, min(a + batch_size, split.n_images))
                                      for a in range(start, split.n_images, batch_size))]
    loader = batch_loader(split, partial(eval_transform, resize=resize, crop_size=crop_size), plan, workers=workers,
                          device=device)
    was_training = cnn.training
    cnn.eval()
    row = start
    try:
        with torch.no_grad():
            for pixels in loader:
                check_interrupt()
                feats = pooled_batch(cnn, pixels, device).float().cpu().numpy()
                if not np.isfinite(feats).all():
                    bad = row + int(np.flatnonzero(~np.isfinite(feats).all(1))[0])
                    raise CocosError(f"{split.image_name(bad)}: the CNN gives a NaN or Inf feature")
                yield row, feats
                row += len(feats)
    finally:
        cnn.train(was_training)


def pooled_features(cnn: torch.nn.Module, split: ImageSplit, *, resize: int = RESIZE, crop_size: int = CROP_SIZE,
                    batch_size: int = 64, workers: int = 0, device: torch.device | str = "cpu",
                    progress: bool = False) -> np.ndarray:
    """``(N, d)`` float32 pooled features of every image of ``split`` (:func:`iter_pooled`), in memory."""
    parts = []
    with progress_bar(split.n_images, f"CNN features {split.split}", enabled=progress) as advance:
        for _, feats in iter_pooled(cnn, split, resize=resize, crop_size=crop_size, batch_size=batch_size,
                                    workers=workers, device=device):
            parts.append(feats)
            advance(len(feats))
    return np.concatenate(parts)


def image_major_captions(split: ImageSplit) -> list[str]:
    """The captions in the precomputed order: image 0's k captions, then image 1's, ... (every image needs k)."""
    return [split.captions[c] for c in split.image_captions().reshape(-1).tolist()]


# -- the cache on disk -------------------------------------------------------------------------------

def staging_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.{PARTIAL}"


def _read_progress(staging: Path, plan: dict) -> dict:
    """Rows done per split when ``staging`` holds a run of exactly ``plan``; otherwise the staging folder is
    cleared and nothing is done."""
    try:
        record = json.loads((staging / PROGRESS).read_text(encoding="utf-8"))
        if isinstance(record, dict) and record.get("plan") == plan and isinstance(record.get("done"), dict):
            done = {s: int(record["done"].get(s, 0)) for s in plan["splits"]}
            if all((staging / f"{s}_ims.npy").is_file() for s, n in done.items() if n > 0):
                return done
    except (OSError, ValueError, TypeError):
        pass
    shutil.rmtree(staging, ignore_errors=True)
    return {s: 0 for s in plan["splits"]}


def _open_rows(path: Path, shape: tuple[int, int], fresh: bool) -> np.memmap:
    if fresh or not path.is_file():
        return np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    arr = np.lib.format.open_memmap(path, mode="r+")
    if arr.shape != shape or arr.dtype != np.float32:
        raise CocosError(f"{path}: a partial feature file of another shape; remove {path.parent} and run again")
    return arr


def _feature_dim(cnn: torch.nn.Module, device) -> int:
    return int(getattr(cnn, "out_dim", 0)) or int(cnn(torch.zeros(1, 3, 64, 64, device=device)).shape[1])


def _fill_split(cnn, split: ImageSplit, staging: Path, done: dict, plan: dict, *, batch_size: int, workers: int,
                device, advance: Callable, on_batch: Callable | None) -> None:
    """Write the rows of one split still missing, recording each flushed batch in ``progress.json``."""
    name = split.split
    rows = _open_rows(staging / f"{name}_ims.npy", (split.n_images, plan["dim"]), done[name] == 0)
    try:
        for first, feats in iter_pooled(cnn, split, start=done[name], resize=plan["resize"],
                                        crop_size=plan["crop_size"], batch_size=batch_size, workers=workers,
                                        device=device):
            rows[first:first + len(feats)] = feats
            rows.flush()
            done[name] = first + len(feats)
            write_json(staging / PROGRESS, {"plan": plan, "done": done})
            advance(len(feats))
            if on_batch is not None:
                on_batch(name, done[name])
    finally:
        del rows


def write_feature_cache(data: str | os.PathLike, out: str | os.PathLike, cnn: torch.nn.Module, *, cnn_type: str,
                        splits=SPLITS, weights_file: str | os.PathLike | None = None, resize: int = RESIZE,
                        crop_size: int = CROP_SIZE, batch_size: int = 64, workers: int = 0,
                        device: torch.device | str = "cpu", use_restval: bool = False, overwrite: bool = False,
                        progress: bool = False, on_batch: Callable | None = None) -> dict:
    """Write the feature cache of ``data``'s ``splits`` computed by ``cnn`` (module docstring); return the manifest.

    ``on_batch(split, rows_done)`` is called after each batch is recorded (tests stop a run there).
    """
    out = Path(out)
    check_sizes(resize, crop_size)
    names = list(dict.fromkeys(_normalise_split(s) for s in splits))
    if not names or any(s not in SPLITS for s in names):
        raise CocosError(f"splits must be among train, dev (val), test; got {', '.join(map(str, splits))}")
    check_output_dir(out, [data] + ([weights_file] if weights_file else []), overwrite)
    opened = [load_image_split(data, s, use_restval=use_restval) for s in names]
    captions = {s.split: image_major_captions(s) for s in opened}  # every image with k captions, before work
    cnn.to(device)
    plan = {"format": FORMAT, "cnn_type": cnn_type, "cnn_hash": cnn_state_hash(cnn), "resize": int(resize),
            "crop_size": int(crop_size), "batch_size": int(batch_size), "use_restval": bool(use_restval),
            "dim": _feature_dim(cnn, device), "splits": {s.split: s.fingerprint() for s in opened}}
    staging = staging_dir(out)
    done = _read_progress(staging, plan) if staging.is_dir() else {s: 0 for s in plan["splits"]}
    staging.mkdir(parents=True, exist_ok=True)
    total = sum(s.n_images for s in opened)
    try:
        with progress_bar(total, "CNN features", enabled=progress) as advance:
            advance(sum(done.values()))
            for split in opened:
                _fill_split(cnn, split, staging, done, plan, batch_size=batch_size, workers=workers, device=device,
                            advance=advance, on_batch=on_batch)
    except CocosError:  # bad input (a corrupt image): a rerun needs other inputs, so nothing is kept
        if not interrupt_pending():
            shutil.rmtree(staging, ignore_errors=True)
        raise
    manifest = _manifest(plan, opened, weights_file)
    for split in opened:
        write_text(staging / f"{split.split}_caps.txt", "\n".join(captions[split.split]) + "\n")
    write_json(staging / MANIFEST, manifest)
    (staging / PROGRESS).unlink()
    (staging / MARKER).write_text("written by cocos; cocos may replace this folder\n")
    _move_into_place(staging, out)
    return manifest


def _manifest(plan: dict, opened: list[ImageSplit], weights_file) -> dict:
    weights = None
    if weights_file is not None:
        weights = {"name": Path(weights_file).name, "sha256": sha256_file(weights_file)}
    return {"format": FORMAT, "cocos_version": __version__, "cnn_type": plan["cnn_type"], "cnn_hash": plan["cnn_hash"],
            "weights_file": weights, "resize": plan["resize"], "crop_size": plan["crop_size"], "dim": plan["dim"],
            "use_restval": plan["use_restval"], "transform": "eval: Resize(resize) + CenterCrop(crop_size)",
            "splits": {s.split: {"fingerprint": s.fingerprint(), "n_images": s.n_images, "n_captions": s.n_captions,
                                 "layout": s.layout, "source": str(s.source)} for s in opened}}


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the finished staging folder onto ``out`` (an existing ``out`` is replaced only now)."""
    try:
        if out.exists():
            old = out.parent / f".{out.name}.{os.getpid()}.old"
            os.replace(out, old)
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    except OSError as exc:
        raise CocosError(f"{out}: cannot write ({exc.strerror or exc})") from None


# -- finding a cache ---------------------------------------------------------------------------------

def read_manifest(folder: str | os.PathLike) -> dict | None:
    """A cache folder's manifest, or None when ``folder`` holds none (or an unreadable one)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def default_cache_root(data: str | os.PathLike) -> Path:
    """Where ``cocos data features`` writes by default and ``cocos analyze`` looks: ``features/`` in the dataset
    folder (beside the file, for a CSV or pickle file)."""
    data = Path(data)
    return (data if data.is_dir() else data.parent) / "features"


def default_cache_dir(data: str | os.PathLike, cnn_type: str, cnn_hash: str, resize: int, crop_size: int) -> Path:
    return default_cache_root(data) / f"{cnn_type}-{cnn_hash[:12]}-{resize}-{crop_size}"


def candidate_caches(data: str | os.PathLike, extra=()) -> list[Path]:
    """The folders given (``--features``), then every folder under :func:`default_cache_root` with a manifest."""
    found = [Path(p) for p in extra]
    root = default_cache_root(data)
    if root.is_dir():
        found += sorted(p for p in root.iterdir()
                        if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())
    return list(dict.fromkeys(found))


def cached_features(folders, split: ImageSplit, key: dict) -> tuple[np.ndarray, Path] | None:
    """The ``(N, d)`` features of ``split`` from the first folder whose manifest matches ``key`` for this split
    (:func:`cache_key`), read whole and checked (shape, finite); None when no folder matches."""

    for folder in folders:
        manifest = read_manifest(folder)
        entry = (manifest or {}).get("splits", {}).get(split.split)
        if not isinstance(entry, dict):
            continue
        have = cache_key(entry.get("fingerprint"), manifest.get("cnn_type"), manifest.get("cnn_hash"),
                         manifest.get("resize", 0), manifest.get("crop_size", 0))
        if have != key:
            continue
        k = split.image_captions().shape[1]
        stored = PrecompSplit(folder, split.split, k=k)
        if stored.n_images != split.n_images or stored.is_regions:
            raise CocosError(f"{stored.features_path}: {stored.n_images} rows for the {split.n_images} images of "
                             f"split '{split.split}' its manifest names; remove the folder {folder}")
        return np.asarray(stored.features, dtype=np.float32), Path(folder)
    return None


__all__ = ["MANIFEST", "cache_key", "cached_features", "candidate_caches", "cnn_state_hash", "default_cache_dir",
           "default_cache_root", "image_major_captions", "iter_pooled", "load_cnn", "pooled_features", "read_manifest",
           "write_feature_cache"]
