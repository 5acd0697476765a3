"""Device selection: ``auto`` picks CUDA when present, else CPU."""

from __future__ import annotations

import torch

from cocos.errors import CocosError


def resolve_device(name: str = "auto") -> torch.device:
    name = (name or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CocosError(f"device '{name}' requested but CUDA is not available")
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise CocosError(f"unknown device '{name}' (use auto, cpu or cuda)")


def bound_heap() -> bool:
    """Make freed large blocks go back to the system (glibc only; a no-op elsewhere); returns whether it applied.

    glibc raises its mmap threshold dynamically up to 32 MB once large blocks are freed, after which tensors of a
    few MB come from the heap and, freed in varying orders, fragment it: ``cocos count`` on 200 MB of embeddings
    then peaked at 2.3-2.5 GB instead of 0.8 GB. A fixed threshold of 128 KB (``mallopt(M_MMAP_THRESHOLD)``)
    keeps every large tensor in its own mapping, returned on free (measured: no slower).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(-3, 128 * 1024))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False
