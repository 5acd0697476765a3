"""Reading torch files without running code from them, and without trusting what they declare.

Every checkpoint cocos reads (its own, the original VSE++/VSRN code's, CNN weights) goes
through :func:`load_torch_file`, which

1. checks the CRC of every member of the zip container (torch does not: flipped bytes in a
   tensor's storage would otherwise load as other weights);
2. loads with ``torch.load(weights_only=True)`` (only the classes in ``safe_globals`` besides
   torch's own plain types), unless the user trusts the file;
3. refuses any tensor that claims more elements than its storage holds (a stride-0 view of
   ``(10**9, 16)`` over 64 bytes loads in a millisecond and allocates 64 GB on the first copy);
4. turns every failure into one :class:`~cocos.errors.CocosError` line, and never repeats
   torch's advice to load with ``weights_only=False``.
"""

from __future__ import annotations

import os
import pickle
import re
import struct
import zipfile
from pathlib import Path

import torch

from cocos.errors import CocosError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class UnsafeCheckpointError(CocosError):
    """The file names a class or function that a safe load does not run (the message names it)."""


def first_line(exc: BaseException) -> str:
    """The informative line of an exception's text (torch's weights-only errors: the unpickler's own line)."""
    text = _ANSI.sub("", str(exc))
    found = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
    if found:
        text = found.group(1)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "weights_only" not in ln]
    return (lines[0] if lines else type(exc).__name__)[:160]


def check_zip(path: str | os.PathLike) -> None:
    """The CRC of every member of a zip container (torch's format, ``.npz``): flipped bytes are found here.

    Files that are not zip archives (torch's legacy format) pass; the loader decides about them.
    """
    path = Path(path)
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
            struct.error, RuntimeError, OverflowError) as exc:
        raise CocosError(f"{path}: is corrupted (its zip container is damaged: {first_line(exc)})") from None
    if bad is not None:
        raise CocosError(f"{path}: is corrupted (member {bad} fails its CRC check)")


def _tensors(obj, depth: int = 0):
    if depth > 64:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1)


def check_tensor_sizes(obj, path: str | os.PathLike) -> None:
    """Refuse tensors that claim more elements than their storage holds (zero or overlapping strides)."""
    for tensor in _tensors(obj):
        if tensor.layout != torch.strided or tensor.device.type == "meta":
            continue
        claimed = tensor.numel() * tensor.element_size()
        held = tensor.untyped_storage().nbytes()
        if claimed > held:
            shape = "x".join(map(str, tensor.shape))
            raise CocosError(f"{path}: a tensor declares {shape} elements ({claimed:,} bytes) but the file holds "
                             f"{held:,} bytes for it: the file is damaged or crafted")


def load_torch_file(path: str | os.PathLike, *, trust: bool = False, safe_globals=(), mmap: bool = False,
                    what: str = "checkpoint"):
    """Whatever a torch file holds, loaded safely (see the module docstring); one error line otherwise."""
    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such {what}")
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, not a {what}")
    if not path.is_file():
        raise CocosError(f"{path}: not a regular file, not a {what}")
    check_zip(path)
    if trust:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - a trusted pickle may raise anything
            raise CocosError(f"{path}: not a readable {what} ({first_line(exc)})") from None
    else:
        try:
            with torch.serialization.safe_globals(list(safe_globals)):
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as exc:
            found = re.search(r"GLOBAL ([\w.]+)", _ANSI.sub("", str(exc)))
            if found:
                raise UnsafeCheckpointError(f"{path}: the {what} refers to {found.group(1)}, which a safe load "
                                            "does not run (pass --trust-checkpoint only if you trust the file)"
                                            ) from None
            raise CocosError(f"{path}: not a readable {what} ({first_line(exc)})") from None
        except Exception as exc:  # noqa: BLE001 - nothing of the file ran: whatever a damaged file makes torch raise
            raise CocosError(f"{path}: not a readable {what} ({first_line(exc)})") from None
    check_tensor_sizes(obj, path)
    return obj
