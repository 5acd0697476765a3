"""Known CNN weights files and the evaluation transform each was made for (torchvision's weights enums, restated).

torchvision names its weights ``<stem>-<first 8 hex digits of the file's sha256>.pth`` and, since
0.13, gives every file an evaluation transform (``Weights(url=..., transforms=partial(
ImageClassification, crop_size=..., resize_size=...))``, whose defaults are ``resize_size=256``
and ImageNet's mean and std). The same architecture has files meant for different transforms:
ResNet-50's ``IMAGENET1K_V1`` (``resnet50-0676ba61.pth``) is evaluated at ``Resize(256)`` +
``CenterCrop(224)``, its ``IMAGENET1K_V2`` (``resnet50-11ad3fa6.pth``, the new training recipe)
at ``Resize(232)`` + ``CenterCrop(224)``. :data:`KNOWN_WEIGHTS` is that table for the
architectures cocos builds (:data:`cocos.models.cnn.CNN_TYPES`); every number is torchvision's
(``torchvision/models/resnet.py``, ``vgg.py`` and their 2021 ``prototype`` versions; the files
of torchvision's earlier ``model_urls`` (2017), which had no transform of their own, with the
``Resize(256)`` + ``CenterCrop(224)`` every ImageNet evaluation of the time used), and for
Facebook's WSL ResNeXt the ``Resize(256)`` + ``CenterCrop(224)`` of its torch.hub page
(``pytorch/hub``, ``facebookresearch_WSL-Images_resnext.md``). Every entry normalises with
ImageNet's mean and std (:data:`IMAGENET_MEAN`, :data:`IMAGENET_STD`).

**Identification is by content** (:func:`identify`): the file's sha256 (:func:`file_sha256`,
streamed in 1 MB blocks and remembered per file, device, inode, size and modification time
within the process) is compared with every entry's 8-digit prefix, so a renamed file is still
known. **A file named as a torchvision file** (``<stem>-<8 hex>.pth`` with a stem of the table,
e.g. ``resnet50-11ad3fa6.pth``) whose sha256 does not start with the digits of its name is
refused in one :class:`~cocos.errors.CocosError` line, as torchvision's ``check_hash`` refuses
a download (deviation: torchvision checks any ``-<hex>.`` in any name; here only the table's
stems, so that a user's ``weights-20240101.pth`` is not taken for a torchvision file). Any other
file is unknown: no error, and the evaluation transform stays cocos's ``Resize(256 · c / 224)`` +
``CenterCrop(c)`` (:func:`evaluation_transform`).

**The rule** (:func:`evaluation_transform`): the evaluation ``Resize`` and ``CenterCrop`` a user
gives win; what the user does not give is the known file's (a crop other than the file's own
takes its resize in the file's ratio, ``round(resize · crop / file crop)``, as cocos does for 256 :
224); a given value that differs from the known file's is said in one warning line. Torch-free.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cocos.defaults import DEFAULT_CROP_SIZE, DEFAULT_RESIZE, IMAGENET_MEAN, IMAGENET_STD
from cocos.errors import CocosError

# cocos's (and VSE++'s) evaluation transform for a file it does not know
RESIZE, CROP_SIZE = DEFAULT_RESIZE, DEFAULT_CROP_SIZE
_TV = "https://github.com/pytorch/vision/blob/main/torchvision/models/"
_TV_OLD = "torchvision's earlier model_urls (no transform of its own; ImageNet's Resize(256) + CenterCrop(224))"
_NAME = re.compile(r"(?P<stem>[A-Za-z0-9_]+)-(?P<hash>[0-9a-f]{8})\.pth")


@dataclass(frozen=True)
class KnownWeights:
    """One known weights file: torchvision's file name (its hash prefix after the last ``-``), the cocos
    architecture (:data:`cocos.models.cnn.CNN_TYPES`), a readable name, the evaluation transform and where the
    numbers come from."""

    file: str
    arch: str
    name: str
    resize: int
    crop_size: int = CROP_SIZE
    source: str = ""
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    checked_name: bool = True  # whether its publisher checks the name's hash (torchvision's check_hash does)

    @property
    def hash_prefix(self) -> str:
        return _NAME.fullmatch(self.file).group("hash")

    @property
    def stem(self) -> str:
        return _NAME.fullmatch(self.file).group("stem")

    def describe(self) -> str:
        """``torchvision ResNet50_Weights.IMAGENET1K_V2 (resnet50-11ad3fa6.pth; eval Resize 232, CenterCrop 224)``."""
        return f"{self.name} ({self.file}; eval Resize {self.resize}, CenterCrop {self.crop_size})"


def _tv(file: str, arch: str, enum: str, resize: int = RESIZE, module: str = "resnet.py") -> KnownWeights:
    return KnownWeights(file, arch, f"torchvision {enum}", resize, CROP_SIZE, _TV + module)


def _tv_old(file: str, arch: str) -> KnownWeights:
    return KnownWeights(file, arch, f"torchvision {arch} (2017 model_urls)", RESIZE, CROP_SIZE, _TV_OLD)


KNOWN_WEIGHTS: tuple[KnownWeights, ...] = (
    _tv("resnet18-f37072fd.pth", "resnet18", "ResNet18_Weights.IMAGENET1K_V1"),
    _tv_old("resnet18-5c106cde.pth", "resnet18"),
    _tv("resnet34-b627a593.pth", "resnet34", "ResNet34_Weights.IMAGENET1K_V1"),
    _tv_old("resnet34-333f7ec4.pth", "resnet34"),
    _tv("resnet50-0676ba61.pth", "resnet50", "ResNet50_Weights.IMAGENET1K_V1"),
    _tv("resnet50-11ad3fa6.pth", "resnet50", "ResNet50_Weights.IMAGENET1K_V2", 232),
    _tv_old("resnet50-19c8e357.pth", "resnet50"),
    KnownWeights("resnet50-f46c3f97.pth", "resnet50", "torchvision ResNet50_Weights.ImageNet1K_V2 (2021 prototype)",
                 232, CROP_SIZE, "torchvision/prototype/models/resnet.py (2021, before torchvision 0.13)"),
    _tv("resnet101-63fe2227.pth", "resnet101", "ResNet101_Weights.IMAGENET1K_V1"),
    _tv("resnet101-cd907fc2.pth", "resnet101", "ResNet101_Weights.IMAGENET1K_V2", 232),
    _tv_old("resnet101-5d3b4d8f.pth", "resnet101"),
    _tv("resnet152-394f9c45.pth", "resnet152", "ResNet152_Weights.IMAGENET1K_V1"),
    _tv("resnet152-f82ba261.pth", "resnet152", "ResNet152_Weights.IMAGENET1K_V2", 232),
    _tv_old("resnet152-b121ed2d.pth", "resnet152"),
    _tv("resnext50_32x4d-7cdf4587.pth", "resnext50_32x4d", "ResNeXt50_32X4D_Weights.IMAGENET1K_V1"),
    _tv("resnext50_32x4d-1a0047aa.pth", "resnext50_32x4d", "ResNeXt50_32X4D_Weights.IMAGENET1K_V2", 232),
    _tv("resnext101_32x8d-8ba56ff5.pth", "resnext101_32x8d", "ResNeXt101_32X8D_Weights.IMAGENET1K_V1"),
    _tv("resnext101_32x8d-110c445d.pth", "resnext101_32x8d", "ResNeXt101_32X8D_Weights.IMAGENET1K_V2", 232),
    KnownWeights("ig_resnext101_32x8-c38310e5.pth", "resnext101_32x8d",
                 "Facebook WSL resnext101_32x8d_wsl (Instagram pre-trained, ImageNet fine-tuned)", RESIZE, CROP_SIZE,
                 "https://github.com/pytorch/hub/blob/master/facebookresearch_WSL-Images_resnext.md",
                 checked_name=False),  # torch.hub's WSL loader never checks the name's hash
    _tv("vgg19-dcbb9e9d.pth", "vgg19", "VGG19_Weights.IMAGENET1K_V1", module="vgg.py"),
)


class WeightsTransformWarning(UserWarning):
    """Evaluation sizes given that differ from those a known weights file was made for (the given ones are used)."""


# -- hashing -------------------------------------------------------------------------------------------------------

_HASHES: dict[tuple, str] = {}  # (device, inode, size, mtime_ns) -> sha256 hex, within this process
_HASHES_KEPT = 64


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 hex digest of a file, read in 1 MB blocks; remembered within the process per (device, inode,
    size, modification time) of the open file, so a second look at the same unchanged file costs nothing. An
    unreadable file: one :class:`CocosError` line."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key in _HASHES:
                return _HASHES[key]
            h = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        raise CocosError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(_HASHES) >= _HASHES_KEPT:
        _HASHES.pop(next(iter(_HASHES)))
    _HASHES[key] = h.hexdigest()
    return _HASHES[key]


# -- identification ------------------------------------------------------------------------------------------------

def known_by_digest(sha256: str) -> KnownWeights | None:
    """The entry whose hash prefix begins ``sha256`` (a full hex digest), or None."""
    return next((w for w in KNOWN_WEIGHTS if sha256.startswith(w.hash_prefix)), None)


def known_by_name(name: str | os.PathLike) -> KnownWeights | None:
    """The entry of torchvision's file name ``name`` (the base name, exactly as torchvision's), or None: for a record
    of a file that is no longer there (a checkpoint's ``cnn_weights``); never for identifying a file on disk."""
    base = Path(name).name
    return next((w for w in KNOWN_WEIGHTS if w.file == base), None)


def check_name_hash(path: str | os.PathLike, sha256: str) -> None:
    """A file named as a torchvision weights file (``<stem>-<8 hex>.pth``, a stem of :data:`KNOWN_WEIGHTS`) must have
    a sha256 that starts with those digits (torchvision's ``check_hash``); else one :class:`CocosError` line."""
    m = _NAME.fullmatch(Path(path).name)
    if m is None or m.group("stem") not in {w.stem for w in KNOWN_WEIGHTS if w.checked_name}:
        return
    if not sha256.startswith(m.group("hash")):
        raise CocosError(f"{path}: its name carries the hash {m.group('hash')} of a torchvision weights file but its "
                         f"sha256 is {sha256[:16]}...: a damaged or partial download, or other weights under that name "
                         "(download it again, or rename it)")


def identify(path: str | os.PathLike) -> tuple[KnownWeights | None, str]:
    """``(entry or None, sha256)`` of a weights file, by its content (module docstring); a torchvision file name its
    content does not match is one :class:`CocosError` line (:func:`check_name_hash`)."""
    digest = file_sha256(path)
    check_name_hash(path, digest)
    return known_by_digest(digest), digest


# -- the evaluation transform --------------------------------------------------------------------------------------

def proportional_resize(crop_size: int, resize: int = RESIZE, crop: int = CROP_SIZE) -> int:
    """The ``Resize`` for a ``crop_size`` crop in the ratio ``resize : crop`` (256 : 224 by default: 256 for 224)."""
    return int(resize) if int(crop_size) == int(crop) else int(round(resize * int(crop_size) / crop))


class EvalTransform(NamedTuple):
    """What :func:`evaluation_transform` decides: the sizes, the known file (or None), its sha256 (or None without a
    file), and one warning line (or None)."""

    resize: int
    crop_size: int
    weights: KnownWeights | None = None
    sha256: str | None = None
    warning: str | None = None
    file: str | None = None

    def record(self) -> dict | None:
        """The ``weights`` record of a checkpoint's ``data`` (and of reports): ``{"file", "sha256", "name"}`` (name
        None for an unknown file); None without a file."""
        if self.file is None:
            return None
        return {"file": Path(self.file).name, "sha256": self.sha256,
                "name": self.weights.name if self.weights is not None else None}


def evaluation_transform(weights_path: str | os.PathLike | None, resize: int | None = None,
                         crop_size: int | None = None, *, cnn: str | None = None,
                         flags: tuple[str, str] = ("--resize", "--crop-size")) -> EvalTransform:
    """The evaluation ``Resize`` and ``CenterCrop`` for a CNN with the weights of ``weights_path`` (module docstring).

    ``resize``/``crop_size`` None: not given by the user. A known file gives what is not given (its crop, its
    resize in its own ratio); an unknown file or none (``weights_path`` None) gives cocos's 224 and 256 : 224. A
    given value unlike the known file's makes :attr:`EvalTransform.warning` one line naming ``flags``. ``cnn``: the
    architecture the file is for; a known file of another one is one :class:`CocosError` line. A torchvision file
    name whose hash the content does not match: one CocosError line (:func:`identify`).
    """
    known, digest = identify(weights_path) if weights_path is not None else (None, None)
    if known is not None and cnn is not None and known.arch != cnn:
        raise CocosError(f"{weights_path}: is {known.name}, weights of a {known.arch}, not of a {cnn}")
    file = None if weights_path is None else str(weights_path)
    if known is None:
        crop = CROP_SIZE if crop_size is None else int(crop_size)
        return EvalTransform(proportional_resize(crop) if resize is None else int(resize), crop, None, digest, None,
                             file)
    crop = known.crop_size if crop_size is None else int(crop_size)
    size = proportional_resize(crop, known.resize, known.crop_size) if resize is None else int(resize)
    given = [f"{flag} {value}" for flag, value, own in ((flags[0], resize, known.resize),
                                                        (flags[1], crop_size, known.crop_size))
             if value is not None and int(value) != own]
    return EvalTransform(size, crop, known, digest, _given_warning(weights_path, known, given, size, crop), file)


def _given_warning(path, known: KnownWeights, given: list[str], resize: int, crop: int) -> str | None:
    """The one warning line of sizes given (``given``: ``--resize 256``, ...) unlike a known file's, or None."""
    if not given:
        return None
    return (f"{Path(path).name} is {known.name}, evaluated at Resize {known.resize} + CenterCrop {known.crop_size}; "
            f"using {' and '.join(given)} as given (Resize {resize} + CenterCrop {crop})")


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "KNOWN_WEIGHTS", "EvalTransform", "KnownWeights", "WeightsTransformWarning",
           "check_name_hash",
           "evaluation_transform", "file_sha256", "identify", "known_by_digest",
           "known_by_name", "proportional_resize"]
