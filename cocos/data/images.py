"""Raw images and their captions: safe image reading, three dataset layouts, a torch Dataset.

**Reading** (:func:`open_image`). The original code opens every image with
``Image.open(path).convert('RGB')``; cocos does the same, with these checks and one
change (definitions file, "Raw images"):

* the size in the header is checked *before* any pixel is decoded: above
  :data:`MAX_IMAGE_PIXELS` (Pillow's own default limit, about 89.5 million pixels) the
  image is refused (a 50,000 x 50,000 PNG header is a decompression bomb); Pillow's
  ``DecompressionBombWarning``/``DecompressionBombError`` become the same one line;
* unreadable, empty, truncated and non-image data are refused with one
  :class:`CocosError` line naming the image; so are formats other than the raster
  formats of :data:`FORMATS` (JPEG, PNG, GIF, BMP, TIFF, WebP, PPM): Pillow would hand
  EPS and PDF to Ghostscript, an outside program (the original code opens any format);
* 16-bit greyscale (``I;16*``, and 32-bit ``I``, read as 16-bit values) is scaled to 8 bit
  (``round(v / 257)``, so 65535 becomes 255) instead of Pillow's clipping at 255; every
  other mode (CMYK, L, P, LA, RGBA, ...) goes through ``convert('RGB')`` as in the original;
* EXIF orientation is **not** applied, as in the original code: the published
  checkpoints were trained and evaluated on the stored pixel order;
* memory: an image is decoded at full size (no JPEG ``draft`` or ``reduce``, which would
  change the pixels against the original pipeline) and nothing else of it is kept: at most
  one copy of the decoded pixels (16-bit grey is scaled in blocks of rows), so one image costs
  at most about twice ``3 x`` :data:`MAX_IMAGE_PIXELS` bytes (537 MB), and a batch decodes its
  images one at a time (:class:`ImageBatches`). Running out of memory while decoding is reported
  as that (one line naming the image), never as a corrupt image.

**Layouts** (:func:`load_image_split`), each giving an :class:`ImageSplit`:

(a) the original VSE++ layout: a folder with ``images/`` and one Karpathy
    ``dataset_*.json`` (``dataset_flickr30k.json``: files directly in ``images/``;
    ``dataset_coco.json``: in the image's ``filepath`` subfolder). The split's images are
    those whose ``split`` is the split's label (``train``, ``val`` for dev, ``test``;
    ``restval`` joins train with ``use_restval``), in JSON order, each with its first
    ``k = 5`` sentences (``raw``). Deviation: the original ``FlickrDataset`` takes every
    sentence of an image; Flickr30k has exactly five, so this changes nothing there.
(b) the COCOS reproducibility repository's ``{train,val,test}_set.p``: a dict with
    ``images`` (``{img_id: {'image': JPEG bytes, 'filename': ..., ...}}``) and
    ``captions`` (``{sent_id: {'caption': str, 'imgid': img_id, ...}}``), images in the
    dict's order and captions in theirs (as its ``MultiModalDataset``). The repository
    wrote it from ``collections.defaultdict(dict)``; the restricted unpickler resolves
    exactly ``collections.defaultdict`` (to a builder of a plain dict),
    ``builtins.dict`` (only as that builder's argument) and, for pickle protocols 0-2,
    ``_codecs.encode`` (to a str -> latin-1 bytes conversion); no other class or function.
    Its output is bounded by the file (:class:`cocos.safeload.BudgetedUnpickler`): memo
    references to data the file holds once (2,000 images referring to one 16 MB
    ``bytearray``) may not expand it beyond 8 x its size + 64 MiB.
(c) a CSV file list: columns ``image,caption`` (header row), image paths relative to
    the CSV's folder, several rows per image; images numbered in order of first
    appearance, captions in row order. Read as UTF-8 with an optional byte-order mark
    (``utf-8-sig``: spreadsheets save one), so a BOM changes nothing.

**Captions** (layouts (b) and (c)): whitespace is collapsed to single spaces; a caption
longer than :data:`MAX_CAPTION_CHARS` (65,536) characters is cut to its first 65,536 before
that, with a :class:`cocos.data.text.CaptionTruncatedWarning` (the tokenizer keeps at most
510 words anyway), so no caption costs more than that however large the file's string is.
A caption holding a NUL character (``\\0``, a sign of a binary or damaged file; it would
reach the caption files of a feature cache) is refused in one line naming its CSV line or
caption id (any layout: :class:`ImageSplit` checks every caption).

Every problem raises :class:`CocosError` with one line naming the file (and the image).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from cocos.data.precomp import KARPATHY_SPLITS, _normalise_split, find_karpathy_json, karpathy_sentences
from cocos.data.text import CaptionTruncatedWarning
from cocos.errors import CocosError
from cocos.io import available_memory
from cocos.safeload import BudgetedUnpickler

MAX_IMAGE_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)  # Pillow's default limit: 89,478,485 pixels
CAPTIONS_PER_IMAGE = 5
# the file names of layout (b), per cocos split
PICKLE_NAMES = {"train": "train_set.p", "dev": "val_set.p", "test": "test_set.p"}
CSV_NAMES = {"train": ("train.csv",), "dev": ("dev.csv", "val.csv"), "test": ("test.csv",)}
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
# The raster formats Pillow decodes itself; never EPS/PDF (Pillow hands those to Ghostscript, an outside program).
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP", "PPM")
# A caption is cut to this many characters before anything else is done with it (module docstring).
MAX_CAPTION_CHARS = 1 << 16
# 16-bit grey is scaled to 8 bit in blocks of about this many pixels (bounded temporary memory).
_SCALE_BLOCK = 1 << 22


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- one image -------------------------------------------------------------------------------


def _available_formats() -> list[str]:
    """:data:`FORMATS` that this Pillow build can open (a build may lack WebP)."""
    Image.init()
    return [f for f in FORMATS if f in Image.OPEN]


def _to_rgb(img: Image.Image) -> Image.Image:
    """RGB of a decoded image: 16-bit grey scaled to 8 bit, everything else ``convert('RGB')``.

    16-bit grey: ``round(v / 257)`` of ``v`` clipped to ``[0, 65535]``, computed in blocks of rows
    (int64 temporaries of a block, not of the whole image).
    """
    if img.mode in _SIXTEEN_BIT:
        arr = np.asarray(img)
        grey = np.empty(arr.shape, dtype=np.uint8)
        step = max(1, _SCALE_BLOCK // max(1, arr.shape[1]))
        for row in range(0, arr.shape[0], step):
            block = np.clip(arr[row:row + step].astype(np.int64), 0, 65535)
            grey[row:row + step] = (block + 128) // 257
        del arr
        return Image.fromarray(grey, mode="L").convert("RGB")
    if img.mode == "RGB":
        return img
    return img.convert("RGB")


def _open_source(source: str | os.PathLike | bytes, name: str):
    """A binary file object over the image's bytes: the bytes themselves, or the open file (read lazily)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        fh = io.BytesIO(source)
    else:
        try:
            fh = open(source, "rb")  # noqa: SIM115 - closed by open_image
        except OSError as exc:
            raise CocosError(f"{name}: cannot read the image ({exc.strerror or _first_line(exc)})") from None
    if fh.seek(0, io.SEEK_END) == 0:
        fh.close()
        raise CocosError(f"{name}: the image file is empty")
    fh.seek(0)
    return fh


def _memory_message(name: str, size: tuple[int, int] | None) -> str:
    pixels = f"its {size[0]} x {size[1]} pixels" if size else "it"
    return (f"{name}: not enough memory to decode {pixels} (a resource problem, not a damaged image: free "
            "memory, or use fewer --workers or a smaller --batch-size)")


def open_image(source: str | os.PathLike | bytes, name: str, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode one image into a PIL RGB image (see the module docstring for the rules).

    ``source`` is a path or the file's bytes; ``name`` is what error lines call the image
    (a path, or ``train_set.p image 42``). Only the header is read before the size check;
    no file handle stays open afterwards, and no second full-size copy of the pixels is made
    (an RGB image is returned as decoded).
    """
    size = None
    try:
        with _open_source(source, name) as fh, warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(fh, formats=_available_formats())
            try:
                size = img.size
                if size[0] * size[1] > max_pixels:
                    raise CocosError(f"{name}: {size[0]} x {size[1]} pixels is above the limit of "
                                     f"{max_pixels:,} pixels (a decompression bomb?); refused")
                img.load()  # reads the pixels and lets go of the file (Pillow sets img.fp = None)
                rgb = _to_rgb(img)
            except BaseException:
                img.close()
                raise
            if rgb is not img:
                img.close()
            return rgb
    except CocosError:
        raise
    except MemoryError:
        raise CocosError(_memory_message(name, size)) from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise CocosError(f"{name}: above Pillow's pixel limit (a decompression bomb?); refused "
                         f"({_first_line(exc)})") from None
    except UnidentifiedImageError:
        raise CocosError(f"{name}: not an image in a format cocos reads ({', '.join(FORMATS)})") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # truncated or corrupt data
        raise CocosError(f"{name}: cannot decode the image, corrupt or truncated? ({_first_line(exc)})") from None


def caption_text(text: str) -> str:
    """A caption as cocos keeps it: the first :data:`MAX_CAPTION_CHARS` characters (a longer one is cut, with a
    :class:`~cocos.data.text.CaptionTruncatedWarning`), whitespace collapsed to single spaces."""
    if len(text) > MAX_CAPTION_CHARS:
        warnings.warn(f"a caption of {len(text):,} characters was cut to its first {MAX_CAPTION_CHARS:,} (cocos "
                      f"keeps at most {MAX_CAPTION_CHARS:,} characters per caption)", CaptionTruncatedWarning,
                      stacklevel=2)
        text = text[:MAX_CAPTION_CHARS]
    return " ".join(text.split())


# -- a split ---------------------------------------------------------------------------------


class ImageSplit:
    """One split of a raw-image dataset: images (files or in-memory bytes) and their captions.

    The surface of :class:`cocos.data.precomp.PrecompSplit` where it applies:
    ``captions`` (list of str), ``caption_image`` (``(M,)`` int64 image index of every
    caption), ``n_images``, ``n_captions``, plus :meth:`image_captions` (``(N, k)``; as
    the counting engine's ``Embeddings.image_captions()``, a method), :meth:`image`,
    :meth:`image_name`, :meth:`image_bytes` and :meth:`fingerprint`. Holds no open file
    handle (safe to pickle into DataLoader workers).
    """

    def __init__(
        self,
        *,
        source: Path,
        split: str,
        layout: str,
        captions: list[str],
        caption_image: np.ndarray,
        names: list[str],
        paths: list[Path] | None = None,
        blobs: list[bytes] | None = None,
    ):
        if (paths is None) == (blobs is None):
            raise ValueError("ImageSplit needs paths or blobs")
        self.source = Path(source)
        self.split = split
        self.layout = layout
        self.captions = captions
        self.caption_image = np.asarray(caption_image, dtype=np.int64)
        self.names = names
        self.paths = paths
        self.blobs = blobs
        self._fingerprint: str | None = None
        if len(names) == 0 or len(captions) == 0:
            raise CocosError(f"{source}: split '{split}' is empty")
        nul = next((c for c, text in enumerate(captions) if "\0" in text), None)
        if nul is not None:
            raise CocosError(f"{source}: caption {nul} of split '{split}' holds a NUL character (a binary or "
                             "damaged file?)")
        used = np.bincount(self.caption_image, minlength=len(names))
        if used.min() == 0:
            raise CocosError(f"{source}: image {names[int(np.argmin(used))]} of split '{split}' has no caption")

    @property
    def n_images(self) -> int:
        return len(self.names)

    @property
    def n_captions(self) -> int:
        return len(self.captions)

    def __len__(self) -> int:
        return self.n_captions

    def __repr__(self) -> str:
        return (f"ImageSplit({str(self.source)!r}, {self.split!r}, {self.layout}: "
                f"{self.n_images} images, {self.n_captions} captions)")

    def image_captions(self) -> np.ndarray:
        """``(N, k)`` caption indices per image, in caption order; every image must have ``k``."""
        counts = np.bincount(self.caption_image, minlength=self.n_images)
        if counts.min() != counts.max():
            raise CocosError(f"{self.source}: split '{self.split}' has between {counts.min()} and "
                             f"{counts.max()} captions per image; this needs the same number for every image")
        return np.argsort(self.caption_image, kind="stable").reshape(self.n_images, int(counts[0]))

    def image_name(self, i: int) -> str:
        """What error lines call image ``i`` (its path, or the pickle and its id)."""
        return self.names[i]

    def image_bytes(self, i: int) -> bytes:
        """The stored (encoded) bytes of image ``i``."""
        if self.blobs is not None:
            return self.blobs[i]
        try:
            return self.paths[i].read_bytes()
        except OSError as exc:
            raise CocosError(f"{self.names[i]}: cannot read the image ({exc.strerror or _first_line(exc)})") from None

    def image(self, i: int) -> Image.Image:
        """Image ``i`` decoded to PIL RGB by :func:`open_image`."""
        if not 0 <= int(i) < self.n_images:
            raise CocosError(f"split '{self.split}': image index {i} out of range [0, {self.n_images})")
        i = int(i)
        return open_image(self.blobs[i] if self.blobs is not None else self.paths[i], self.names[i])

    def fingerprint(self, length: int = 16) -> str:
        """Short sha256 hex of the content: every image's bytes in order, the captions and their images.

        Independent of the layout and of file names: the same images and captions in a
        folder, a pickle or a CSV give the same fingerprint. Reads every image once
        (cached on the object).
        """
        if self._fingerprint is None:
            h = hashlib.sha256(b"cocos-image-split\0")
            for i in range(self.n_images):
                h.update(hashlib.sha256(self.image_bytes(i)).digest())
            h.update(b"\1")
            for text, img in zip(self.captions, self.caption_image.tolist(), strict=True):
                h.update(f"{img}\0{text}\0".encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint[:length]


# -- layout (a): images/ + Karpathy JSON -----------------------------------------------------


def _inside(root: Path, rel: str, what: str) -> Path:
    parts = Path(rel)
    if not rel or parts.is_absolute() or ".." in parts.parts:
        raise CocosError(f"{what}: image path {rel!r} is not a relative path inside {root}")
    return root / parts


def _check_present(paths: list[Path], names: list[str], source: Path) -> None:
    missing = [n for p, n in zip(paths, names, strict=True) if not p.is_file()]
    if missing:
        raise CocosError(f"{source}: {len(missing)} of {len(paths)} image files are missing "
                         f"(the first: {missing[0]})")


def _load_karpathy_images(folder: Path, karpathy: Path, split: str, use_restval: bool, k: int) -> ImageSplit:
    labels = KARPATHY_SPLITS[split] if split != "train" else (("train", "restval") if use_restval else ("train",))
    try:
        data = json.loads(karpathy.read_text(encoding="utf-8"))
    except RecursionError:
        raise CocosError(f"{karpathy}: not a readable Karpathy JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError, OSError) as exc:
        raise CocosError(f"{karpathy}: not a readable Karpathy JSON ({_first_line(exc)})") from None
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CocosError(f"{karpathy}: expected a JSON object with an 'images' list")
    root = folder / "images"
    captions, caption_image, names, paths = [], [], [], []
    for pos, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("split") not in labels:
            continue
        filename, sub = entry.get("filename"), entry.get("filepath", "")
        if not isinstance(filename, str) or not isinstance(sub, str):
            raise CocosError(f"{karpathy}: image {pos} has no string 'filename'")
        rel = f"{sub}/{filename}" if sub else filename
        paths.append(_inside(root, rel, str(karpathy)))
        names.append(str(root / rel))
        for text in karpathy_sentences(karpathy, pos, entry, k):
            captions.append(text)
            caption_image.append(len(names) - 1)
    if not names:
        raise CocosError(f"{karpathy}: no images with split {' or '.join(labels)}")
    _check_present(paths, names, karpathy)
    return ImageSplit(source=karpathy, split=split, layout="karpathy", captions=captions,
                      caption_image=np.array(caption_image), names=names, paths=paths)


# -- layout (b): the reproducibility repository's pickles ------------------------------------


class _DictFactory:
    """What ``builtins.dict`` resolves to: a marker, usable only as defaultdict's factory."""


def _defaultdict(factory=None, *args):
    """``collections.defaultdict`` as the pickle rebuilds it: a plain dict (the factory is dropped)."""
    if factory is not None and not isinstance(factory, _DictFactory) or args:
        raise pickle.UnpicklingError("collections.defaultdict with a factory other than dict")
    return {}


def _latin1_bytes(text, encoding="latin1"):
    """``_codecs.encode`` as pickle protocols 0-2 use it for ``bytes``: ``str`` -> latin-1 bytes only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode other than of a str to latin1 bytes")
    return text.encode("latin1")


class _DataUnpickler(BudgetedUnpickler):
    """Plain containers, strings, bytes and numbers only; ``defaultdict(dict)`` becomes a dict.

    A :class:`cocos.safeload.BudgetedUnpickler`, as for vocabularies (:class:`cocos.data.text._VocabularyUnpickler`):
    a damaged memo index cannot make it allocate more than the file holds, nor memo references expand it beyond
    8 x the file's size + 64 MiB.

    Protocols 0-2 store ``bytes`` as ``_codecs.encode(str, 'latin1')``: that one call is
    resolved to :func:`_latin1_bytes`, which does nothing else.
    """

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "defaultdict"):
            return _defaultdict
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        if (module, name) in (("builtins", "dict"), ("__builtin__", "dict")):
            return _DictFactory()
        raise pickle.UnpicklingError(f"the pickle refers to {module}.{name}")


def read_data_pickle(path: Path) -> dict:
    """The dict of a ``{split}_set.p`` file, read without running any code from it."""
    try:
        size = path.stat().st_size
        if size > available_memory():
            raise CocosError(f"{path}: {size / 2**30:.1f} GiB does not fit in the memory available")
        with open(path, "rb") as fh:
            obj = _DataUnpickler(fh, size, encoding="bytes").load()
    except CocosError:
        raise
    except pickle.UnpicklingError as exc:
        message = _first_line(exc)
        if message.startswith("the pickle refers to"):
            raise CocosError(f"{path}: {message}, which cocos does not load (an image pickle may hold only "
                             "dicts, lists, strings, bytes and numbers)") from None
        raise CocosError(f"{path}: not a readable image pickle ({message})") from None
    except OSError as exc:
        raise CocosError(f"{path}: cannot read ({exc.strerror or _first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a foreign pickle is bad input
        raise CocosError(f"{path}: not a readable image pickle ({type(exc).__name__}: {_first_line(exc)})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("images"), dict) or not isinstance(
            obj.get("captions"), dict):
        raise CocosError(f"{path}: expected a dict with 'images' and 'captions' dicts "
                         "(the reproducibility repository's layout)")
    return obj


def _load_pickle_images(path: Path, split: str) -> ImageSplit:
    obj = read_data_pickle(path)
    index, names, blobs = {}, [], []
    for img_id, entry in obj["images"].items():
        blob = entry.get("image") if isinstance(entry, dict) else None
        if not isinstance(blob, (bytes, bytearray)):
            raise CocosError(f"{path}: image {img_id!r} has no 'image' bytes")
        index[img_id] = len(names)
        filename = entry.get("filename")
        names.append(f"{path} image {img_id!r}" + (f" ({filename})" if isinstance(filename, str) else ""))
        blobs.append(bytes(blob))
    captions, caption_image = [], []
    for cap_id, entry in obj["captions"].items():
        text = entry.get("caption") if isinstance(entry, dict) else None
        img_id = entry.get("imgid") if isinstance(entry, dict) else None
        if not isinstance(text, str):
            raise CocosError(f"{path}: caption {cap_id!r} has no 'caption' string")
        if img_id not in index:
            raise CocosError(f"{path}: caption {cap_id!r} names image {img_id!r}, which is not in 'images'")
        if "\0" in text:
            raise CocosError(f"{path}: caption {cap_id!r} holds a NUL character (a binary or damaged file?)")
        captions.append(caption_text(text))
        caption_image.append(index[img_id])
    return ImageSplit(source=path, split=split, layout="pickle", captions=captions,
                      caption_image=np.array(caption_image), names=names, blobs=blobs)


# -- layout (c): a CSV file list -------------------------------------------------------------


def _load_csv_images(path: Path, split: str) -> ImageSplit:
    """The split listed by the CSV file ``path``: a header row naming the columns ``image`` (a path relative to the
    file's folder) and ``caption`` (any case, any order, other columns ignored), then one caption a row; blank rows
    are skipped and an image listed again gets the caption too."""
    rows = _read_csv_rows(path)
    col_img, col_cap = _csv_columns(path, rows)
    root = path.parent
    index: dict[str, int] = {}
    names, paths, captions, caption_image = [], [], [], []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        rel, text = _csv_row(path, line, row, col_img, col_cap)
        if rel not in index:
            index[rel] = len(names)
            paths.append(_inside(root, rel, f"{path} line {line}"))
            names.append(str(root / rel))
        captions.append(caption_text(text))
        caption_image.append(index[rel])
    if not names:
        raise CocosError(f"{path}: the CSV file lists no images")
    _check_present(paths, names, path)
    return ImageSplit(source=path, split=split, layout="csv", captions=captions,
                      caption_image=np.array(caption_image), names=names, paths=paths)


def _read_csv_rows(path: Path) -> list[list[str]]:
    """Every row of the CSV file ``path`` (UTF-8; a byte-order mark, as spreadsheets write, is dropped)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            return list(csv.reader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CocosError(f"{path}: not a readable CSV file ({_first_line(exc)})") from None


def _csv_columns(path: Path, rows: list[list[str]]) -> tuple[int, int]:
    """The indices of the ``image`` and ``caption`` columns of the header row (names stripped, any case)."""
    header = [h.strip().lower() for h in rows[0]] if rows else []
    if "image" not in header or "caption" not in header:
        found = ", ".join(h if h.isprintable() else ascii(h) for h in header[:20])  # nothing hidden in the line
        raise CocosError(f"{path}: needs a header row with columns image and caption, found {found or 'none'}")
    return header.index("image"), header.index("caption")


def _csv_row(path: Path, line: int, row: list[str], col_img: int, col_cap: int) -> tuple[str, str]:
    """The image path (stripped) and the caption (as written) of a non-blank row; both must be there and the
    caption must hold no NUL character."""
    if len(row) <= max(col_img, col_cap) or not row[col_img].strip() or not row[col_cap].strip():
        raise CocosError(f"{path}: line {line} lacks an image or a caption")
    if "\0" in row[col_cap]:
        raise CocosError(f"{path}: line {line}: the caption holds a NUL character (a binary or damaged file?)")
    return row[col_img].strip(), row[col_cap]


# -- dispatch --------------------------------------------------------------------------------


def load_image_split(path: str | os.PathLike, split: str, use_restval: bool = False) -> ImageSplit:
    """Open one split of a raw-image dataset in any of the three layouts (module docstring).

    ``path`` is a folder (``{split}_set.p``; else ``{split}.csv``, ``val.csv`` for dev;
    else ``images/`` + one ``dataset_*.json``), or a ``.csv`` / ``.p`` file of one split.
    ``split`` is ``train``, ``dev`` (``val``) or ``test``; ``use_restval`` adds the
    Karpathy ``restval`` images to train (layout (a) only).
    """
    path = Path(path)
    split = _normalise_split(split)
    if split not in PICKLE_NAMES:
        raise CocosError(f"bad split name {split!r} (use train, dev or test)")
    if path.is_file():
        if path.suffix.lower() == ".csv":
            return _load_csv_images(path, split)
        if path.suffix.lower() in (".p", ".pkl", ".pickle"):
            return _load_pickle_images(path, split)
        raise CocosError(f"{path}: not an image dataset (give a folder, a .csv file list or a {{split}}_set.p)")
    if not path.is_dir():
        raise CocosError(f"{path}: no such image dataset")
    if (path / PICKLE_NAMES[split]).is_file():
        return _load_pickle_images(path / PICKLE_NAMES[split], split)
    for name in CSV_NAMES[split]:
        if (path / name).is_file():
            return _load_csv_images(path / name, split)
    karpathy = find_karpathy_json(path)
    if karpathy is not None and (path / "images").is_dir():
        return _load_karpathy_images(path, karpathy, split, use_restval, CAPTIONS_PER_IMAGE)
    raise CocosError(f"{path}: not an image dataset folder (expected images/ and a dataset_*.json, "
                     f"{PICKLE_NAMES[split]}, or {CSV_NAMES[split][0]})")


def is_image_dataset(path: str | os.PathLike) -> bool:
    """True when ``path`` looks like a raw-image dataset (not a precomputed-feature folder)."""
    path = Path(path)
    if path.is_file():
        return path.suffix.lower() in (".csv", ".p", ".pkl", ".pickle")
    if not path.is_dir():
        return False
    names = set(PICKLE_NAMES.values()) | {n for ns in CSV_NAMES.values() for n in ns}
    return any((path / n).is_file() for n in names) or (path / "images").is_dir()


# -- the torch Dataset -----------------------------------------------------------------------


class ImageDataError(CocosError):
    """A CocosError raised while loading an item, that stays one line through DataLoader workers.

    A DataLoader re-raises a worker's exception in the main process as
    ``type(exc)("Caught ... in DataLoader worker process N.\nOriginal Traceback ...")``;
    this class keeps only the original message from that text.
    """

    def __init__(self, message: str):
        text = str(message)
        if "Original Traceback" in text:
            marker = f"{type(self).__name__}: "
            found = [line.split(marker, 1)[1] for line in text.splitlines() if marker in line]
            text = found[-1] if found else _first_line(ValueError(text))
        super().__init__(text)


def item_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The transform's generator of one item: seeded from ``(seed, epoch, index)`` only."""
    state = np.random.SeedSequence([int(seed), int(epoch), int(index)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class ImageCaptionDataset(torch.utils.data.Dataset):
    """A torch Dataset over an :class:`ImageSplit` that decodes and transforms in the workers.

    ``by="image"``: item ``i`` is ``(tensor, i)`` for image ``i``. ``by="caption"``: item
    ``c`` is ``(tensor, c, caption_image[c])``, the image of caption ``c`` (transformed
    anew for each caption, as the original per-caption Dataset). ``transform`` is called
    as ``transform(img, generator)`` (:func:`cocos.data.transforms.train_transform` or
    ``eval_transform``, sizes bound with ``functools.partial``); the generator of item
    ``index`` is :func:`item_generator` ``(seed, epoch, index)``, so the output does not
    depend on the number of workers or the order they run in. Call :meth:`set_epoch`
    before creating each epoch's iterator (with ``persistent_workers=False``, the
    default, workers copy the dataset when the iterator is created).

    Picklable: it holds the split (paths or bytes) and the transform, no open file. Bad
    input raises :class:`ImageDataError`, a CocosError that is still one line when it
    comes out of a worker process.
    """

    def __init__(self, split: ImageSplit, transform: Callable, *, seed: int = 0, by: str = "image"):
        if by not in ("image", "caption"):
            raise CocosError(f"by must be 'image' or 'caption', got {by!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**63:
            raise CocosError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        self.split = split
        self.transform = transform
        self.seed = int(seed)
        self.by = by
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.split.n_images if self.by == "image" else self.split.n_captions

    def __getitem__(self, index: int):
        index = int(index)
        img_idx = index if self.by == "image" else int(self.split.caption_image[index])
        try:
            tensor = self.transform(self.split.image(img_idx), item_generator(self.seed, self.epoch, index))
        except CocosError as exc:
            raise ImageDataError(str(exc)) from None
        except MemoryError:
            raise ImageDataError(_memory_message(self.split.image_name(img_idx), None)) from None
        if self.by == "image":
            return tensor, index
        return tensor, index, img_idx


class ImageBatches(torch.utils.data.Dataset):
    """A torch Dataset whose item ``b`` is batch ``b`` of a plan, stacked: ``(n, 3, c, c)`` pixels.

    ``plan[b] = (images, keys)``: the split's image rows of the batch (an image may repeat: the
    image of each caption of a pair batch) and each row's transform key. Row ``j`` is
    ``transform(image(images[j]), item_generator(seed, epoch, keys[j]))``, so it equals item
    ``keys[j]`` of :class:`ImageCaptionDataset` (``by="caption"`` with caption keys, ``by="image"``
    with image keys) and depends on nothing else: not on the batch, the number of workers or
    their order. Each distinct image of a batch is decoded once (a repeated image gets its own
    transform per row, as the original per-caption Dataset), and the images are decoded, transformed
    and let go **one at a time**: a batch holds at most one full-size decoded image (and its
    transformed rows), never several (a batch of 40 images of 9000 x 9000 pixels held together took 7.1 GB). Used with
    ``DataLoader(ImageBatches(...), batch_size=None, num_workers=w)``: a worker builds whole
    batches, so decoding overlaps the training step. Bad input raises :class:`ImageDataError`.
    """

    def __init__(self, split: ImageSplit, transform: Callable, plan: list, *, seed: int = 0, epoch: int = 0):
        self.split, self.transform, self.plan = split, transform, plan
        self.seed, self.epoch = int(seed), int(epoch)

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, b: int) -> torch.Tensor:
        images, keys = self.plan[int(b)]
        images, keys = np.asarray(images).tolist(), np.asarray(keys).tolist()
        if len(images) != len(keys):
            raise ImageDataError(f"batch {b} of the plan has {len(images)} images and {len(keys)} keys")
        positions: dict[int, list[int]] = {}  # each distinct image: its rows, in order of first appearance
        for j, img in enumerate(images):
            positions.setdefault(img, []).append(j)
        out, img = None, None
        try:
            for img, where in positions.items():
                decoded = self.split.image(img)
                for j in where:
                    row = self.transform(decoded, item_generator(self.seed, self.epoch, keys[j]))
                    if out is None:  # the batch's pixels, filled row by row (no second copy of them is stacked)
                        out = torch.empty((len(images), *row.shape), dtype=row.dtype)
                    out[j] = row
                del decoded  # before the next image is decoded: one full-size image at a time
        except CocosError as exc:
            raise ImageDataError(str(exc)) from None
        except MemoryError:
            raise ImageDataError(_memory_message(self.split.image_name(img), None)) from None
        if out is None:
            raise ImageDataError(f"batch {b} of the plan is empty")
        return out
