"""Device selection (``auto`` picks CUDA when present, else CPU) and the CPU thread count of a command."""

from __future__ import annotations

import os

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


def available_cores() -> int:
    """The number of cores this process may run on: its CPU affinity (``os.sched_getaffinity``, which a batch
    system, ``taskset`` or a container narrows), else ``os.cpu_count()``, at least 1."""
    if hasattr(os, "sched_getaffinity"):
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The torch thread count of a command without ``--threads``.

    ``OMP_NUM_THREADS`` when it is set to a positive integer (a user's explicit choice; torchrun sets it to 1 for
    several processes per node), else :func:`available_cores`. Deviation from torch's own default (the machine's
    physical cores, whatever the affinity): on a shared 2-core machine under a load of 5 a one-epoch ``cocos
    train`` ran 5-10x slower with torch's default than with one thread per core this process may use.
    """
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    return available_cores()


def set_threads(threads: int | None = None) -> int:
    """Use ``threads`` CPU threads in torch (``None``: :func:`default_threads`); returns the number set.

    Sets the intra-op threads (``torch.set_num_threads``) and, where torch still allows it (before any
    inter-op parallel work of this process), the inter-op threads to the same number. Fewer than 1 is refused.
    """
    n = default_threads() if threads is None else int(threads)
    if n < 1:
        raise CocosError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(n)
    try:
        if torch.get_num_interop_threads() != n:
            torch.set_num_interop_threads(n)
    except RuntimeError:  # torch allows it once, before inter-op work started: keep what is there
        pass
    return n
