"""Precomputed image features and their captions: the VSE++/SCAN/VSRN folder layout.

A data folder holds, per split (``train``, ``dev``, ``test``; ``val`` is read as
``dev``)::

    {split}_ims.npy    (N, D) global features or (N, R, D) region features
    {split}_caps.txt   one caption per line; captions k*i .. k*i+k-1 belong to image i

The ``.npy`` is opened as a read-only memory map (``mmap_mode='r'``, no pickle)
and never copied to RAM whole: the NaN/Inf check at load walks it in chunks and
:meth:`PrecompSplit.features_for` gathers only the rows it is asked for.

**Karpathy JSON.** When ``{split}_caps.txt`` is absent but the folder holds one
``dataset_*.json`` (``dataset_flickr30k.json`` style: ``{"images": [{"split": ...,
"sentences": [{"raw": ..., "tokens": [...]}, ...]}, ...]}``), the captions come
from it: the images whose ``split`` belongs to the requested split, **in JSON
order**, each with its first ``k`` sentences (``raw``, or the joined ``tokens``
where ``raw`` is missing). ``dev`` takes the JSON's ``val`` images; ``train``
takes ``train`` and ``restval`` (COCO's 113,287-image Karpathy train set; Flickr30k
has no ``restval``). Row ``i`` of ``{split}_ims.npy`` must be the ``i``-th such
image of the JSON: cocos cannot check the order, only the count.

Every problem with the input raises :class:`cocos.errors.CocosError` with one line
that names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

from cocos.data.samplers import regular_image_captions
from cocos.errors import CocosError

SPLITS = ("train", "dev", "test")
SPLIT_ALIASES = {"val": "dev", "valid": "dev", "validation": "dev"}
# Karpathy JSON split labels that make up each cocos split.
KARPATHY_SPLITS = {"train": ("train", "restval"), "dev": ("val",), "test": ("test",)}
# The NaN/Inf scan reads at most this many rows, and about this many bytes, at a time.
CHECK_CHUNK_ROWS = 4096
CHECK_CHUNK_BYTES = 64 << 20
_FINGERPRINT_EDGE = 1 << 20


def _normalise_split(split: str) -> str:
    if not isinstance(split, str) or not split or not split.replace("_", "").isalnum():
        raise CocosError(f"bad split name {split!r} (use train, dev or test)")
    return SPLIT_ALIASES.get(split.lower(), split.lower())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _open_features(path: Path) -> np.ndarray:
    if not path.is_file():
        raise CocosError(f"{path}: no such feature file")
    if path.stat().st_size == 0:
        raise CocosError(f"{path}: the feature file is empty")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise CocosError(f"{path}: not a readable .npy array ({_first_line(exc)})") from None
    if not isinstance(arr, np.ndarray):
        raise CocosError(f"{path}: expected one .npy array, found an archive")
    if arr.ndim not in (2, 3):
        raise CocosError(
            f"{path}: features have shape {arr.shape}; expected (N, D) global or (N, R, D) region"
        )
    if not np.issubdtype(arr.dtype, np.floating):
        raise CocosError(f"{path}: features have dtype {arr.dtype}; expected floating point")
    if arr.shape[0] == 0 or any(d == 0 for d in arr.shape[1:]):
        raise CocosError(f"{path}: the split is empty (features of shape {arr.shape})")
    return arr


def _check_finite(features: np.ndarray, path: Path) -> None:
    """Raise if any row holds NaN/Inf; reads the memmap chunk by chunk, never whole."""
    row_bytes = max(1, int(np.prod(features.shape[1:])) * features.dtype.itemsize)
    step = max(1, min(CHECK_CHUNK_ROWS, CHECK_CHUNK_BYTES // row_bytes))
    limit = float(np.finfo(np.float32).max)  # features are used as float32: larger values would become Inf
    for start in range(0, features.shape[0], step):
        chunk = np.asarray(features[start : start + step])
        ok = np.isfinite(chunk) & (np.abs(chunk.astype(np.float64, copy=False)) <= limit)  # float16: no overflow
        if not ok.all():
            bad = start + int(np.flatnonzero(~ok.reshape(len(chunk), -1).all(1))[0])
            raise CocosError(f"{path}: features hold NaN, Inf or values beyond float32 (first in image row {bad})")


def _read_caption_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CocosError(f"{path}: not UTF-8 text ({_first_line(exc)})") from None
    except OSError as exc:
        raise CocosError(f"{path}: cannot read captions ({_first_line(exc)})") from None
    return [line.strip() for line in text.splitlines()]


def find_karpathy_json(folder: str | os.PathLike) -> Path | None:
    """The folder's single ``dataset_*.json``, or None; several of them are an error."""
    folder = Path(folder)
    found = sorted(p for p in folder.glob("dataset_*.json") if p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise CocosError(f"{folder}: several Karpathy split files ({names}); keep only one")
    return found[0] if found else None


def karpathy_sentences(path: Path, pos: int, entry: dict, k: int) -> list[str]:
    """The first ``k`` sentences of entry ``pos`` of a Karpathy JSON (``raw``, else its ``tokens`` joined), with
    whitespace collapsed; fewer than ``k`` or a sentence without either is one CocosError line."""
    sentences = entry.get("sentences")
    if not isinstance(sentences, list) or len(sentences) < k:
        have = len(sentences) if isinstance(sentences, list) else 0
        raise CocosError(f"{path}: image {pos} has {have} sentences, fewer than k={k}")
    out = []
    for sent in sentences[:k]:
        raw = sent.get("raw") if isinstance(sent, dict) else None
        if not isinstance(raw, str):
            tokens = sent.get("tokens") if isinstance(sent, dict) else None
            if not isinstance(tokens, list):
                raise CocosError(f"{path}: image {pos} has a sentence without 'raw' or 'tokens'")
            raw = " ".join(str(t) for t in tokens)
        out.append(" ".join(raw.split()))
    return out


def read_karpathy_captions(path: str | os.PathLike, split: str, k: int = 5) -> list[str]:
    """Captions of ``split`` from a Karpathy JSON: first ``k`` sentences per image, JSON order."""
    path = Path(path)
    split = _normalise_split(split)
    labels = KARPATHY_SPLITS.get(split, (split,))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise CocosError(f"{path}: not a readable Karpathy JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError, OSError) as exc:  # JSONDecodeError, and ints past the digit limit
        raise CocosError(f"{path}: not a readable Karpathy JSON ({_first_line(exc)})") from None
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise CocosError(f"{path}: expected a JSON object with an 'images' list")
    captions: list[str] = []
    n = 0
    for pos, image in enumerate(images):
        if not isinstance(image, dict) or image.get("split") not in labels:
            continue
        captions.extend(karpathy_sentences(path, pos, image, k))
        n += 1
    if n == 0:
        raise CocosError(f"{path}: no images with split {' or '.join(labels)}")
    return captions


class FeatureRows:
    """Shapes and index maps of a split held as image feature rows ``features`` (N, ...) with ``k`` captions per
    image, image-major (caption ``c`` belongs to image ``c // k``): :class:`PrecompSplit`, and the pooled CNN
    features of a raw-image split (:class:`cocos.embed.images.PooledSplit`)."""

    features: np.ndarray
    captions: list[str]
    k: int

    @property
    def n_images(self) -> int:
        return int(self.features.shape[0])

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one image's features: ``(D,)`` or ``(R, D)``."""
        return tuple(int(d) for d in self.features.shape[1:])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[-1])

    @property
    def is_regions(self) -> bool:
        return self.features.ndim == 3

    @property
    def caption_image(self) -> np.ndarray:
        """``(k N,)`` image index of every caption: ``c // k``."""
        return np.arange(self.n_captions) // self.k

    @property
    def image_captions(self) -> np.ndarray:
        """``(N, k)`` caption indices of every image."""
        return regular_image_captions(self.n_images, self.k)

    def __len__(self) -> int:
        return self.n_captions


class PrecompSplit(FeatureRows):
    """One split of a precomputed-feature folder (see the module docstring for the layout).

    ``features`` is the read-only ``np.memmap``; ``captions`` the list of ``k * N``
    caption strings; ``caption_image[c] = c // k``; ``image_captions`` the ``(N, k)``
    caption indices of each image. ``feature_shape`` is the shape of one image's
    features: ``(D,)`` or ``(R, D)``.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        split: str,
        k: int = 5,
        check_finite: bool = True,
    ):
        self.folder = Path(folder)
        self.split = _normalise_split(split)
        if not isinstance(k, int) or k < 1:
            raise CocosError(f"captions per image k must be a positive integer, got {k!r}")
        self.k = k
        if not self.folder.is_dir():
            raise CocosError(f"{self.folder}: no such data folder")
        self.features_path = self.folder / f"{self.split}_ims.npy"
        self.features = _open_features(self.features_path)
        self.captions, self.captions_path = self._load_captions()
        n = int(self.features.shape[0])
        if len(self.captions) == 0:
            raise CocosError(f"{self.captions_path}: the split is empty (no captions)")
        if len(self.captions) != k * n:
            hint = (
                "; one feature row per caption? cocos needs one row per image"
                if len(self.captions) == n and k > 1
                else ""
            )
            raise CocosError(
                f"{self.captions_path}: {len(self.captions)} captions for {n} images in "
                f"{self.features_path.name}, expected k * images = {k * n}{hint}"
            )
        if check_finite:
            _check_finite(self.features, self.features_path)

    def _load_captions(self) -> tuple[list[str], Path]:
        caps = self.folder / f"{self.split}_caps.txt"
        if caps.is_file():
            return _read_caption_lines(caps), caps
        karpathy = find_karpathy_json(self.folder)
        if karpathy is None:
            raise CocosError(f"{caps}: no such caption file (and no dataset_*.json in the folder)")
        return read_karpathy_captions(karpathy, self.split, self.k), karpathy

    def __repr__(self) -> str:
        return (
            f"PrecompSplit({str(self.folder)!r}, {self.split!r}, k={self.k}: "
            f"{self.n_images} images x {self.feature_shape}, {self.n_captions} captions)"
        )

    # -- data ---------------------------------------------------------------------------

    def features_for(self, image_idx) -> torch.Tensor:
        """Float32 features of the given image rows: ``(n, *feature_shape)``, or one row for an int.

        Reads only those rows from the memmap. Raises CocosError if they hold NaN/Inf.
        """
        scalar = isinstance(image_idx, (int, np.integer)) or (
            isinstance(image_idx, torch.Tensor) and image_idx.ndim == 0
        )
        if isinstance(image_idx, torch.Tensor):
            image_idx = image_idx.detach().cpu().numpy()
        idx = np.asarray(image_idx)
        if idx.dtype == bool or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
            raise CocosError(f"split '{self.split}': image indices must be integers")
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_images):
            raise CocosError(
                f"split '{self.split}': image index out of range [0, {self.n_images})"
            )
        rows = np.asarray(self.features[idx], dtype=np.float32)
        if not np.isfinite(rows).all():
            raise CocosError(
                f"split '{self.split}' ({self.features_path}): features hold NaN or Inf"
            )
        out = torch.from_numpy(np.ascontiguousarray(rows))
        return out[0] if scalar else out


def load_split(
    folder: str | os.PathLike, split: str, k: int = 5, check_finite: bool = True
) -> PrecompSplit:
    """Open and validate one split of a precomputed-feature folder."""
    return PrecompSplit(folder, split, k=k, check_finite=check_finite)


def data_fingerprint(folder: str | os.PathLike, length: int = 16) -> str:
    """Short sha256 hex over the folder's files: names, sizes, first and last 1 MiB of each.

    Covers every regular, non-hidden file directly in ``folder`` (sorted by name);
    cheap on large feature files, and changes when any file is replaced or resized.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CocosError(f"{folder}: no such data folder")
    h = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise CocosError(f"{folder}: the data folder holds no files")
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}\0{size}\0".encode())
        with open(p, "rb") as fh:
            h.update(fh.read(_FINGERPRINT_EDGE))
            if size > _FINGERPRINT_EDGE:
                fh.seek(max(_FINGERPRINT_EDGE, size - _FINGERPRINT_EDGE))
                h.update(fh.read(_FINGERPRINT_EDGE))
        h.update(b"\1")
    return h.hexdigest()[:length]
