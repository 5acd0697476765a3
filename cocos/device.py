"""Device selection (``auto`` picks CUDA when present, else CPU) and the CPU thread count of a command."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re

import torch

from cocos.errors import CocosError

DEVICE_NAME = re.compile(r"auto|cpu|cuda(:\d+)?", re.IGNORECASE)


def check_device_name(name) -> str:
    """A well-formed ``--device`` (``auto``, ``cpu``, ``cuda`` or ``cuda:N``), whether or not this machine has it;
    one CocosError line otherwise."""
    if not isinstance(name, str) or not DEVICE_NAME.fullmatch(name):
        raise CocosError(f"unknown device '{name}' (use auto, cpu, cuda or cuda:N)")
    return name


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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest dynamic threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc sets beside it


def steady_heap() -> bool:
    """Let freed tensors under 32 MB be reused from the heap from the start (glibc only; a no-op elsewhere);
    returns whether it applied.

    glibc starts with an mmap threshold of 128 KB and raises it (up to 32 MB, trimming above twice that) only
    after a larger mapped block is freed. Until then every tensor of 128 KB or more is a mapping of its own,
    faulted in page by page and returned when freed, and a counting pass allocates and frees the same tensor
    sizes every chunk: whether ``cocos count`` ran at heap speed depended on whether loading happened to free
    a large block first (measured on Flickr30k-size embeddings: 2.6 s against 3.3 s warm). cocos fixes the
    threshold where glibc would raise it. (An earlier fixed 128 KB threshold bounded the peak by faulting every
    temporary in again: 4.6 M page faults, twice the time; the peak it bounded came mostly from a reference
    cycle that is gone.)
    """
    libc = _libc()
    if libc is None:
        return False
    try:
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    except AttributeError:
        return False


@functools.cache
def _libc():
    """The C library, found once per process (``find_library`` runs ``ldconfig``), or None where there is none."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


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
