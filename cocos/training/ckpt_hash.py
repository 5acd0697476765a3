"""A checkpoint's content hash and its canonical bytes (:mod:`cocos.training.checkpoint`).

``content_sha256`` is the sha256 of a canonical encoding of everything else in the checkpoint
(:func:`content_hash`): written by :func:`~cocos.training.checkpoint.save_checkpoint`, recomputed by
:func:`~cocos.training.checkpoint.load_checkpoint` (:func:`verify_content_hash`). The encoding is
part of the format: a change would make every checkpoint written so far fail to verify.
"""

from __future__ import annotations

import collections
import hashlib
import re
import struct
import sys

import torch

from cocos.errors import CocosError
from cocos.safeload import first_line

HASH_KEY = "content_sha256"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a sha256 as its 64 lower-case hex digits


def content_hash(payload: dict) -> str:
    """sha256 (hex) of a canonical encoding of ``payload`` without ``content_sha256``.

    Every value is encoded with a type tag: strings and bytes with their length, integers
    in decimal, floats exactly (``float.hex``), lists and tuples item by item, dicts with
    their entries in the order of their encoded keys (so insertion order does not matter),
    tensors as dtype, shape and raw bytes. Equal payloads give equal hashes, and the hash
    of a loaded checkpoint equals the one computed before it was saved.
    """
    digest = hashlib.sha256()
    _encode({k: v for k, v in payload.items() if k != HASH_KEY}, digest.update, 0)
    return digest.hexdigest()


def verify_content_hash(ckpt: dict, where) -> None:
    """Recompute the content hash and compare; a checkpoint without one (older cocos) passes."""
    if HASH_KEY not in ckpt:
        return
    stored = ckpt[HASH_KEY]
    if not isinstance(stored, str) or not SHA256_HEX.fullmatch(stored):
        raise CocosError(f"{where}: is corrupted ({HASH_KEY} is not a sha256 hex digest)")
    if content_hash(ckpt) != stored:
        raise CocosError(f"{where}: is corrupted (its content does not match the {HASH_KEY} stored in it)")


def canonical(obj):
    """``obj`` with fresh containers and every string interned: pickle refers back to an object it has written
    (its memo is by identity), so without this the bytes would depend on which equal strings happen to be one
    object (a key written by this process, or one read back from the checkpoint a run resumed from)."""
    if type(obj) is str:
        return sys.intern(obj)
    if type(obj) in (dict, collections.OrderedDict):
        out = type(obj)((canonical(k), canonical(v)) for k, v in obj.items())
        if getattr(obj, "_metadata", None) is not None:  # a state dict's module versions, which load_state_dict reads
            out._metadata = canonical(obj._metadata)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(canonical(v) for v in obj)
    return obj


def _sized(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack("<Q", len(data)) + data


def _encode_scalar(value) -> bytes | None:
    """The bytes of a plain value (None, bool, int, float, complex, str, bytes, dtype, device); None otherwise."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"B1" if value else b"B0"
    if isinstance(value, int):
        return _sized(b"I", str(value).encode())
    if isinstance(value, float):
        return _sized(b"F", value.hex().encode())
    if isinstance(value, complex):
        return _sized(b"C", f"{value.real.hex()},{value.imag.hex()}".encode())
    if isinstance(value, str):
        return _sized(b"S", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray)):
        return _sized(b"Y", bytes(value))
    if isinstance(value, (torch.dtype, torch.device)):
        return _sized(b"O", str(value).encode())
    return None


def _encode(value, put, depth: int) -> None:
    if depth > 64:
        raise CocosError("checkpoint is nested too deeply")
    plain = _encode_scalar(value)
    if plain is not None:
        put(plain)
    elif isinstance(value, torch.Tensor):
        _encode_tensor(value, put)
    elif isinstance(value, (list, tuple)):  # torch.Size is a tuple
        put(b"L" + struct.pack("<Q", len(value)))
        for item in value:
            _encode(item, put, depth + 1)
    elif isinstance(value, dict):
        _encode_dict(value, put, depth)
    else:
        raise CocosError(f"checkpoint holds a value of type {type(value).__name__}, which a checkpoint may not hold")


def _encode_dict(value: dict, put, depth: int) -> None:
    """A dict's entries in the order of their encoded keys."""
    entries = []
    for key, item in value.items():
        parts: list[bytes] = []
        _encode(key, parts.append, depth + 1)
        entries.append((b"".join(parts), item))
    entries.sort(key=lambda e: e[0])
    put(b"D" + struct.pack("<Q", len(entries)))
    for key_bytes, item in entries:
        put(key_bytes)
        _encode(item, put, depth + 1)


def _encode_tensor(tensor: torch.Tensor, put) -> None:
    try:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        data = memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
    except Exception as exc:  # noqa: BLE001 - sparse, quantised or meta tensors: not in a checkpoint
        raise CocosError(f"checkpoint holds a tensor cocos cannot read ({first_line(exc)})") from None
    head = f"{tensor.dtype}|{','.join(str(int(d)) for d in tensor.shape)}".encode()
    put(b"T" + struct.pack("<Q", len(head)) + head + struct.pack("<Q", data.nbytes))
    put(data)
