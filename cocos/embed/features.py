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
the captions), its sizes and source and the sha256 of its two files (``ims_sha256``,
``caps_sha256``); the CNN type, the hash of the CNN's weights (:func:`cnn_state_hash`)
and, when they came from a file, that file's name and sha256 (and ``known``: the readable name of a
known weights file, :mod:`cocos.models.weights`, else None); the transform sizes;
``use_restval``; the cocos version. Its ``format`` is :data:`FORMAT`
(``cocos-features/2``); caches of earlier versions (:data:`FORMAT_V1`, no hashes) are
still read, unchecked.

**The cache key** (:func:`cache_key`) is ``(image-split fingerprint, cnn_type, CNN weights
hash, resize, crop_size)``: the hash is over the CNN's own state (names, dtypes, shapes and
values of every parameter and buffer except BatchNorm's ``num_batches_tracked``, which does
not change the output), not over a file, so a checkpoint whose frozen CNN holds the same
weights as the file the cache was built from matches it, and a fine-tuned CNN (other
weights) never does. A cache that matches the key is used only if its rows still have
their recorded sha256 (:func:`cached_features`: otherwise one warning, and the features are
encoded from the images).

**Atomic, resumable, one writer.** The output is locked for the whole run
(:func:`cocos.io.output_lock`): a second writer of the same output is refused in one line.
Each run stages in a folder of its own beside the output, made by ``tempfile.mkdtemp``
(``.{name}.features-partial.XXXXXXXX``, mode 0700) and holding ``cocos-staging`` (a marker
with the folder's own random name), ``{split}_ims.npy`` of the final shape (created
exclusively, ``O_EXCL | O_NOFOLLOW``, rows written with ``pwrite``: nothing is ever opened
or written through a link) and ``progress.json``: the plan of the run (key, batch size,
sizes), the folder's name and per split the sha256 of each finished batch of rows (a
*block*), rewritten atomically after each batch. A killed run leaves only its staging
folder. A rerun **resumes** only from a folder it can verify as cocos's own: a real folder
(not a link) owned by this user and writable by nobody else, whose marker names it, whose
``progress.json`` is of the same plan and well formed; each recorded block is re-hashed
from the file first, and the rows from the first block that fails onward are recomputed
(a truncated or overwritten file, a file that is a link or has another header is made
anew). Anything unreadable or odd (random bytes, a nested or oversized ``progress.json``,
wrong types) is not resumable: the run starts afresh in a new folder. Staging folders of the
output that are verifiably ours but not resumed are removed; any other (another user's, a
link, the fixed ``.{name}.features-partial`` of earlier versions) is left alone, never read
or written. Bad input (a corrupt image) removes the staging folder (the rerun has other
inputs anyway). When every split is done the captions, the manifest and the output marker
are written, the staging marker and progress go, anything else is removed (the cache holds
regular files only), the folder gets the usual permissions and is renamed onto the
output: the output folder is never visible half-written. Resumed runs write the same bytes
as an uninterrupted run (blocks are the batches of the recorded batch size).

The checksums protect against damage (a disk, a killed write, an edit) and, with the
ownership checks, against other users; a process of the same user can rewrite anything
the user owns and is not guarded against.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from cocos import __version__
from cocos.data.images import ImageSplit, load_image_split
from cocos.data.precomp import SPLITS, PrecompSplit, _normalise_split
from cocos.data.transforms import CROP_SIZE, RESIZE, check_image_sizes, eval_transform
from cocos.errors import CocosError
from cocos.io import (
    MARKER,
    NOFOLLOW,
    _umask,
    check_interrupt,
    check_output_dir,
    create_exclusive,
    interrupt_pending,
    marker_text,
    output_lock,
    read_npy_checked,
    sha256_fd,
    swap_into_place,
    write_json,
    write_text,
)
from cocos.legacy import is_cocos_checkpoint, is_legacy_checkpoint, map_full_image, opt_dict, read_checkpoint_file
from cocos.models.cnn import build_cnn, load_cnn_weights, strip_classifier
from cocos.models.noinit import weights_to_be_loaded
from cocos.models.weights import file_sha256, known_by_digest
from cocos.progress import progress_bar
from cocos.training.checkpoint import load_checkpoint
from cocos.training.pixels import batch_loader
from cocos.training.pixels import pooled_features as pooled_batch

MANIFEST = "cocos_features.json"
FORMAT = "cocos-features/2"  # every file's sha256 in the manifest
FORMAT_V1 = "cocos-features/1"  # earlier versions: no hashes (read unchecked)
PARTIAL = "features-partial"
PROGRESS = "progress.json"
STAGING_MARKER = "cocos-staging"  # in a staging folder: its own random name (module docstring)
_SHA256 = re.compile(r"[0-9a-f]{64}")


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


def check_sizes(resize: int, crop_size: int, batch_size: int = 1, workers: int = 0) -> None:
    """The transform sizes, batch size and workers, and the memory the batches of pixels imply
    (:func:`cocos.data.transforms.check_image_sizes`): one line, before anything is read or written."""
    check_image_sizes(resize, crop_size, batch_size, workers)


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
    with weights_to_be_loaded():  # every tensor comes from the file (a strict load, or load_cnn_weights's check)
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
                device: torch.device | str = "cpu", transform=None) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, (b, d) float32 features)`` of images ``start..N-1`` of ``split`` in order, batch by batch.

    Each image: :func:`cocos.data.images.open_image` (in ``workers`` DataLoader processes), the
    evaluation transform (``transform``: a model's own, CLIP's; default ``Resize(resize)`` +
    ``CenterCrop(crop_size)``), then ``cnn`` in eval mode without gradients (the pooled feature; the
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
    transform = transform or partial(eval_transform, resize=resize, crop_size=crop_size)
    loader = batch_loader(split, transform, plan, workers=workers, device=device)
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
                    progress: bool = False, transform=None, what: str = "CNN features") -> np.ndarray:
    """``(N, d)`` float32 pooled features of every image of ``split`` (:func:`iter_pooled`), in memory."""
    parts = []
    with progress_bar(split.n_images, f"{what} {split.split}", enabled=progress) as advance:
        for _, feats in iter_pooled(cnn, split, resize=resize, crop_size=crop_size, batch_size=batch_size,
                                    workers=workers, device=device, transform=transform):
            parts.append(feats)
            advance(len(feats))
    return np.concatenate(parts)


def image_major_captions(split: ImageSplit) -> list[str]:
    """The captions in the precomputed order: image 0's k captions, then image 1's, ... (every image needs k)."""
    return [split.captions[c] for c in split.image_captions().reshape(-1).tolist()]


# -- the cache on disk -------------------------------------------------------------------------------

def staging_prefix(out: str | os.PathLike) -> str:
    """How every staging folder of ``out`` is named: ``.{name}.features-partial.`` + ``mkdtemp``'s random part."""
    return f".{Path(out).name}.{PARTIAL}."


def _staging_candidates(out: Path) -> list[Path]:
    """The entries beside ``out`` named as a staging folder of ``out`` (nothing about them checked yet)."""
    pattern = re.compile(re.escape(staging_prefix(out)) + r"[A-Za-z0-9_]+")
    try:
        with os.scandir(out.parent) as entries:
            names = sorted(e.name for e in entries if pattern.fullmatch(e.name))
    except OSError:
        return []
    return [out.parent / name for name in names]


def _marker_text(name: str) -> bytes:
    return f"cocos feature staging\n{name}\n".encode()


def _read_small(name: str, dir_fd: int, limit: int) -> bytes:
    """The bytes of the regular file ``name`` of the folder ``dir_fd``, owned by this user and at most ``limit``
    bytes long (no link followed); OSError otherwise."""
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=dir_fd)  # a FIFO never blocks
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > limit:
            raise OSError(f"{name}: not a file of this staging folder")
        parts, size = [], 0
        while size <= limit:
            part = os.read(fd, limit + 1 - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
        if size > limit:
            raise OSError(f"{name}: too large")
        return b"".join(parts)
    finally:
        os.close(fd)


def _open_own_dir(path: Path) -> int:
    """An fd of ``path`` when it is verifiably a staging folder that cocos made for this user: a real folder (not
    a link), owned by this user, writable by nobody else, holding the marker with its own (random) name.
    OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise OSError(f"{path}: not a staging folder of this user")
        if _read_small(STAGING_MARKER, fd, 4096) != _marker_text(path.name):
            raise OSError(f"{path}: no staging marker of its own")
    except BaseException:
        os.close(fd)
        raise
    return fd


def staging_dirs(out: str | os.PathLike) -> list[Path]:
    """The staging folders of ``out`` that cocos verifiably made (:func:`_open_own_dir`), by name."""
    found = []
    for path in _staging_candidates(Path(out)):
        try:
            os.close(_open_own_dir(path))
        except OSError:
            continue
        found.append(path)
    return found


def staging_dir(out: str | os.PathLike) -> Path:
    """The staging folder a stopped run left for ``out`` (the first of :func:`staging_dirs`); when there is none,
    ``.{name}.features-partial``, the fixed name of earlier versions, which cocos never makes or reads now."""
    found = staging_dirs(out)
    return found[0] if found else Path(out).parent / f".{Path(out).name}.{PARTIAL}"


def _npy_head(n: int, d: int) -> bytes:
    """The ``.npy`` header of an ``(n, d)`` little-endian float32 array (what ``numpy.save`` writes)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (n, d)})
    return buf.getvalue()


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _file_sha256(name: str, dir_fd: int) -> str:
    fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def _recorded_blocks(record, name: str, plan: dict) -> dict | None:
    """The block checksums per split of a ``progress.json`` of the staging folder ``name`` for ``plan``, or None
    for anything else (another id or plan, wrong types, rows done that disagree with the blocks)."""
    if not isinstance(record, dict) or record.get("id") != name or record.get("plan") != plan:
        return None
    blocks, done, size = record.get("blocks"), record.get("done"), plan["batch_size"]
    if not isinstance(blocks, dict) or not isinstance(done, dict) or set(done) != set(plan["rows"]):
        return None
    found = {}
    for split, n in plan["rows"].items():
        hashes = blocks.get(split, [])
        if (not isinstance(hashes, list) or len(hashes) > -(-n // size)
                or not all(isinstance(h, str) and _SHA256.fullmatch(h) for h in hashes)
                or type(done[split]) is not int or done[split] != min(len(hashes) * size, n)):
            return None
        found[split] = hashes
    return found


@dataclass
class _Staging:
    """An open staging folder: its path, an fd of it (every file in it is opened relative to the fd, never
    through a link), the checksums of the blocks of rows it holds per split, and the open row files."""

    path: Path
    fd: int
    blocks: dict
    rows: dict = field(default_factory=dict)

    @classmethod
    def fresh(cls, out: Path, plan: dict) -> _Staging:
        try:
            path = Path(tempfile.mkdtemp(prefix=staging_prefix(out), dir=out.parent))  # mode 0700
        except OSError as exc:
            raise CocosError(f"{out}: cannot write ({exc.strerror or exc})") from None
        fd = -1
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
            marker = create_exclusive(STAGING_MARKER, dir_fd=fd)
            try:
                _pwrite_all(marker, _marker_text(path.name), 0)
            finally:
                os.close(marker)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            raise CocosError(f"{out}: cannot write ({exc.strerror or exc})") from None
        return cls(path, fd, {split: [] for split in plan["rows"]})

    @classmethod
    def resume(cls, path: Path, plan: dict) -> _Staging | None:
        """``path`` opened for resuming when it is verifiably ours (:func:`_open_own_dir`) and its progress record
        is of ``plan``; None otherwise (anything unreadable or odd is not resumable)."""
        try:
            fd = _open_own_dir(path)
        except OSError:
            return None
        try:
            limit = 2**16 + 128 * sum(-(-n // plan["batch_size"]) for n in plan["rows"].values())
            blocks = _recorded_blocks(json.loads(_read_small(PROGRESS, fd, limit).decode("utf-8")), path.name, plan)
        except (OSError, ValueError, RecursionError):
            blocks = None
        if blocks is None:
            os.close(fd)
            return None
        return cls(path, fd, blocks)

    def open_rows(self, split: str, n: int, d: int, size: int) -> int:
        """Open ``{split}_ims.npy`` for writing and return the rows already done: the blocks recorded whose
        checksum the file still has, up to the first that fails (the rest is recomputed). A file that is not
        ours, not a plain file (a link, a hard link), or of another header is replaced by a new one."""
        name, head = f"{split}_ims.npy", _npy_head(n, d)
        hashes, self.blocks[split] = self.blocks[split], []
        if hashes:
            with contextlib.suppress(OSError):
                fd = os.open(name, os.O_RDWR | os.O_NONBLOCK | NOFOLLOW, dir_fd=self.fd)
                self.rows[split] = fd
                st = os.fstat(fd)
                if (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_nlink == 1
                        and os.pread(fd, len(head), 0) == head):
                    if st.st_size != len(head) + n * d * 4:
                        os.ftruncate(fd, len(head) + n * d * 4)
                    for i, digest in enumerate(hashes):
                        first, last = i * size, min(i * size + size, n)
                        at, length = len(head) + first * d * 4, (last - first) * d * 4
                        if hashlib.sha256(os.pread(fd, length, at)).hexdigest() != digest:
                            break
                        self.blocks[split].append(digest)
                    return min(len(self.blocks[split]) * size, n)
        self.close_rows(split)
        self.blocks[split] = []
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode):
                shutil.rmtree(self.path / name)
            else:
                os.unlink(name, dir_fd=self.fd)  # a link is removed, never followed
        fd = create_exclusive(name, dir_fd=self.fd)
        self.rows[split] = fd
        _pwrite_all(fd, head, 0)
        os.ftruncate(fd, len(head) + n * d * 4)
        return 0

    def close_rows(self, split: str) -> None:
        fd = self.rows.pop(split, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for split in list(self.rows):
            self.close_rows(split)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def keep_only(self, names: set) -> None:
        """Remove every entry but ``names`` (temporaries of a killed write); those must be regular files."""
        for entry in os.listdir(self.fd):
            st = os.stat(entry, dir_fd=self.fd, follow_symlinks=False)
            if entry in names and stat.S_ISREG(st.st_mode):
                continue
            if entry in names:
                raise CocosError(f"{self.path / entry}: not a regular file; remove {self.path} and run again")
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(self.path / entry)
            else:
                os.unlink(entry, dir_fd=self.fd)


def _open_staging(out: Path, plan: dict) -> _Staging:
    """The staging folder of this run: a verifiable one of ``plan`` left by a stopped run, else a fresh one.
    Other staging folders of ``out`` that are verifiably ours are stale and removed; those that are not (made by
    someone else, a link, writable by others, without the marker) are left alone and never read or written."""
    found = None
    for path in _staging_candidates(out):
        if found is None:
            found = _Staging.resume(path, plan)
            if found is not None:
                continue
        with contextlib.suppress(OSError):
            os.close(_open_own_dir(path))
            shutil.rmtree(path, ignore_errors=True)
    return found if found is not None else _Staging.fresh(out, plan)


def _feature_dim(cnn: torch.nn.Module, device) -> int:
    return int(getattr(cnn, "out_dim", 0)) or int(cnn(torch.zeros(1, 3, 64, 64, device=device)).shape[1])


def _fill_split(cnn, split: ImageSplit, staging: _Staging, done: dict, plan: dict, *, workers: int, device,
                advance: Callable, on_batch: Callable | None) -> None:
    """Write the rows of one split still missing, recording each batch's checksum in ``progress.json``."""
    name, d = split.split, plan["dim"]
    fd, offset = staging.rows[name], len(_npy_head(split.n_images, d))
    for first, feats in iter_pooled(cnn, split, start=done[name], resize=plan["resize"],
                                    crop_size=plan["crop_size"], batch_size=plan["batch_size"], workers=workers,
                                    device=device):
        data = np.ascontiguousarray(feats, dtype="<f4").tobytes()
        _pwrite_all(fd, data, offset + first * d * 4)
        staging.blocks[name].append(hashlib.sha256(data).hexdigest())
        done[name] = first + len(feats)
        write_json(staging.path / PROGRESS, {"id": staging.path.name, "plan": plan, "done": done,
                                             "blocks": staging.blocks})
        advance(len(feats))
        if on_batch is not None:
            on_batch(name, done[name])


def write_feature_cache(data: str | os.PathLike, out: str | os.PathLike, cnn: torch.nn.Module, *, cnn_type: str,
                        splits=SPLITS, weights_file: str | os.PathLike | None = None, resize: int = RESIZE,
                        crop_size: int = CROP_SIZE, batch_size: int = 64, workers: int = 0,
                        device: torch.device | str = "cpu", use_restval: bool = False, overwrite: bool = False,
                        progress: bool = False, on_batch: Callable | None = None, by: str = "data features") -> dict:
    """Write the feature cache of ``data``'s ``splits`` computed by ``cnn`` (module docstring); return the manifest.

    The output is locked for the whole run (:func:`cocos.io.output_lock`): a second writer of the same ``out`` is
    refused in one line. ``on_batch(split, rows_done)`` is called after each batch is recorded (tests stop a run
    there). ``out`` is checked first (:func:`cocos.io.check_output_dir`, kind ``features``): absent, empty, or a
    feature cache (replaced only with ``overwrite``, or a cache ``by`` the demo rewritten by the demo); it may lie
    inside ``data`` (the default cache folder does).
    """
    out = Path(out)
    check_sizes(resize, crop_size, batch_size, workers)
    names = _split_names(splits)
    with output_lock(out):
        check_output_dir(out, [data] + ([weights_file] if weights_file else []), overwrite, kind="features", by=by,
                         may_lie_in=[data])
        opened = [load_image_split(data, s, use_restval=use_restval) for s in names]
        captions = {s.split: image_major_captions(s) for s in opened}  # every image with k captions, before work
        cnn.to(device)
        plan = {"format": FORMAT, "cnn_type": cnn_type, "cnn_hash": cnn_state_hash(cnn), "resize": int(resize),
                "crop_size": int(crop_size), "batch_size": int(batch_size), "use_restval": bool(use_restval),
                "dim": _feature_dim(cnn, device), "splits": {s.split: s.fingerprint() for s in opened},
                "rows": {s.split: s.n_images for s in opened}}
        staging = _open_staging(out, plan)
        try:
            _fill(cnn, staging, opened, plan, workers=workers, device=device, progress=progress, on_batch=on_batch)
            manifest = _finish(staging, plan, opened, captions, weights_file, by)
        except CocosError:  # bad input (a corrupt image): a rerun needs other inputs, so nothing is kept
            if not interrupt_pending():
                staging.remove()
            raise
        except OSError as exc:  # a full disk: the staging folder stays, as after a kill, for a rerun to resume,
            if not (staging.path / STAGING_MARKER).exists():  # unless _finish took its marker: none would
                staging.remove()
            raise CocosError(f"{out}: cannot write ({exc.strerror or exc})") from None
        finally:
            staging.close()
        _swap(staging, out)
    return manifest


def _split_names(splits) -> list[str]:
    """The requested splits, normalised (``val`` is ``dev``) and once each, in order; each must be one of
    :data:`SPLITS` and at least one must be given."""
    names = list(dict.fromkeys(_normalise_split(s) for s in splits))
    if not names or any(s not in SPLITS for s in names):
        raise CocosError(f"splits must be among train, dev (val), test; got {', '.join(map(str, splits))}")
    return names


def _fill(cnn, staging: _Staging, opened: list[ImageSplit], plan: dict, *, workers: int, device, progress: bool,
          on_batch: Callable | None) -> None:
    """Open every split's row file in ``staging`` and write the rows still missing, split by split, with one
    progress bar over all rows (the rows already done counted at once)."""
    done = {s.split: staging.open_rows(s.split, s.n_images, plan["dim"], plan["batch_size"]) for s in opened}
    with progress_bar(sum(s.n_images for s in opened), "CNN features", enabled=progress) as advance:
        advance(sum(done.values()))
        for split in opened:
            _fill_split(cnn, split, staging, done, plan, workers=workers, device=device, advance=advance,
                        on_batch=on_batch)


def _swap(staging: _Staging, out: Path) -> None:
    """Move the finished staging folder to ``out``; if that fails, remove it (its marker is gone: no later run
    would) and re-raise."""
    try:
        swap_into_place(staging.path, out)
    except CocosError:
        shutil.rmtree(staging.path, ignore_errors=True)
        raise


def _finish(staging: _Staging, plan: dict, opened: list[ImageSplit], captions: dict, weights_file, by: str) -> dict:
    """Captions, the manifest with every file's sha256, the output marker; the staging marker and progress go.
    What stays is regular files only, in a folder with the usual permissions (not mkdtemp's 0700)."""
    hashes = {}
    for split in opened:
        caps = f"{split.split}_caps.txt"
        write_text(staging.path / caps, "\n".join(captions[split.split]) + "\n")
        staging.close_rows(split.split)
        hashes[split.split] = {"ims_sha256": _file_sha256(f"{split.split}_ims.npy", staging.fd),
                               "caps_sha256": _file_sha256(caps, staging.fd)}
    manifest = _manifest(plan, opened, weights_file, hashes)
    write_json(staging.path / MANIFEST, manifest)
    marker = create_exclusive(MARKER, dir_fd=staging.fd)
    try:
        _pwrite_all(marker, marker_text("features", by).encode(), 0)
    finally:
        os.close(marker)
    os.unlink(PROGRESS, dir_fd=staging.fd)
    os.unlink(STAGING_MARKER, dir_fd=staging.fd)
    staging.keep_only({MANIFEST, MARKER} | {f"{s.split}_{kind}" for s in opened for kind in ("ims.npy", "caps.txt")})
    os.fchmod(staging.fd, 0o777 & ~_umask())
    return manifest


def _manifest(plan: dict, opened: list[ImageSplit], weights_file, hashes: dict) -> dict:
    weights = None
    if weights_file is not None:  # known: the readable name of a known weights file (cocos.models.weights), else None
        digest = file_sha256(weights_file)  # hashed once per process (cocos data features identified it already)
        known = known_by_digest(digest)
        weights = {"name": Path(weights_file).name, "sha256": digest, "known": known.name if known else None}
    return {"format": FORMAT, "cocos_version": __version__, "cnn_type": plan["cnn_type"], "cnn_hash": plan["cnn_hash"],
            "weights_file": weights, "resize": plan["resize"], "crop_size": plan["crop_size"], "dim": plan["dim"],
            "use_restval": plan["use_restval"], "transform": "eval: Resize(resize) + CenterCrop(crop_size)",
            "splits": {s.split: {"fingerprint": s.fingerprint(), "n_images": s.n_images, "n_captions": s.n_captions,
                                 "layout": s.layout, "source": str(s.source), **hashes[s.split]} for s in opened}}


# -- finding a cache ---------------------------------------------------------------------------------

def read_manifest(folder: str | os.PathLike) -> dict | None:
    """A cache folder's manifest (:data:`FORMAT`, or :data:`FORMAT_V1` of earlier versions), or None when
    ``folder`` holds none (or an unreadable one)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") in (FORMAT, FORMAT_V1) else None


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


class FeatureCacheWarning(UserWarning):
    """A matching cache whose features cannot be verified (changed after they were written): not used."""


def _stored_key(manifest: dict, entry: dict) -> dict:
    """The :func:`cache_key` a manifest records for one split (values of the wrong type never match)."""
    sizes = [manifest.get(k) if type(manifest.get(k)) is int else None for k in ("resize", "crop_size")]
    return {"fingerprint": entry.get("fingerprint"), "cnn_type": manifest.get("cnn_type"),
            "cnn_hash": manifest.get("cnn_hash"), "resize": sizes[0], "crop_size": sizes[1]}


def _checked_rows(folder: Path, split: ImageSplit, manifest: dict, entry: dict) -> np.ndarray:
    """A split's rows of a :data:`FORMAT` cache, read whole with their sha256 checked against the manifest's
    (:func:`cocos.io.read_npy_checked`), then their shape and finiteness; one CocosError line otherwise."""
    path = folder / f"{split.split}_ims.npy"
    digest = entry.get("ims_sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise CocosError(f"{path}: its manifest records no sha256 for it")
    rows = read_npy_checked(path, digest)
    if rows.shape != (split.n_images, manifest.get("dim")) or rows.dtype != np.float32:
        raise CocosError(f"{path}: {rows.dtype} rows of shape {rows.shape}, not the {split.n_images} float32 rows "
                         f"of {manifest.get('dim')} its manifest records")
    if not np.isfinite(rows).all():
        raise CocosError(f"{path}: holds NaN or Inf features")
    return np.asarray(rows, dtype=np.float32)


def cached_features(folders, split: ImageSplit, key: dict) -> tuple[np.ndarray, Path] | None:
    """The ``(N, d)`` features of ``split`` from the first folder whose manifest matches ``key`` for this split
    (:func:`cache_key`), read whole and checked; None when no folder matches.

    A cache of this version (:data:`FORMAT`) is used only when its rows have the sha256 its manifest records
    (hashed while they are read), the shape it records and finite values. One that does not (changed or
    damaged after it was written) is **not used**: one :class:`FeatureCacheWarning` names the folder and why
    (the CLI prints it as one ``warning:`` line) and the next folder is tried; with none, the caller encodes
    the images (``cocos analyze`` does). A cache of earlier versions (:data:`FORMAT_V1`, no hashes recorded)
    is read as before, unchecked beyond its shape and finiteness."""

    for folder in map(Path, folders):
        manifest = read_manifest(folder)
        splits = manifest.get("splits") if manifest is not None else None
        entry = splits.get(split.split) if isinstance(splits, dict) else None
        if not isinstance(entry, dict) or _stored_key(manifest, entry) != key:
            continue
        if manifest["format"] == FORMAT_V1:
            return _unchecked_rows(folder, split), folder
        try:
            return _checked_rows(folder, split, manifest, entry), folder
        except CocosError as exc:
            reason = str(exc).removeprefix(f"{folder / f'{split.split}_ims.npy'}: ")
            warnings.warn(FeatureCacheWarning(
                f"feature cache {folder} not used for split {split.split}: {split.split}_ims.npy: {reason}; its "
                "features are encoded from the images instead"), stacklevel=2)
    return None


def _unchecked_rows(folder: Path, split: ImageSplit) -> np.ndarray:
    """A split's rows of a cache of earlier versions (no hash recorded): shape and finiteness checked."""
    k = split.image_captions().shape[1]
    stored = PrecompSplit(folder, split.split, k=k)
    if stored.n_images != split.n_images or stored.is_regions:
        raise CocosError(f"{stored.features_path}: {stored.n_images} rows for the {split.n_images} images of "
                         f"split '{split.split}' its manifest names; remove the folder {folder}")
    return np.asarray(stored.features, dtype=np.float32)


__all__ = ["FORMAT", "FORMAT_V1", "MANIFEST", "FeatureCacheWarning", "cache_key", "cached_features",
           "candidate_caches", "cnn_state_hash", "default_cache_dir", "default_cache_root", "image_major_captions",
           "iter_pooled", "load_cnn", "pooled_features", "read_manifest", "staging_dir", "staging_dirs",
           "write_feature_cache"]
