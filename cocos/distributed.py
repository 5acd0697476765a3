"""Several processes, one result: the process group torchrun sets up, and how work is split.

``torchrun --nproc_per_node N cocos ...`` starts N copies of a command with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in their environment.
:func:`context` joins that process group (NCCL when the process has a CUDA device,
else Gloo) with a timeout, so that when one process dies the others stop with an
error instead of waiting forever. Without torchrun (no ``WORLD_SIZE`` or
``WORLD_SIZE=1``) nothing is set up and every helper here is the identity.

Results must not depend on the number of processes. The rule everywhere: the work
is planned once, from the seed, exactly as one process plans it (the batches of a
seeded permutation, the rows of a split); then the plan's items are cut into
``world`` contiguous blocks (:func:`block`), rank ``r`` computes block ``r``, and the
blocks are put back together in rank order (:func:`gather_blocks`). Each item is
computed by the same code on the same inputs, so the joined result is the
one-process result.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_gather

from cocos.errors import CocosError

TIMEOUT_ENV = "COCOS_DIST_TIMEOUT"  # seconds a process waits for the others (default 600)
DEFAULT_TIMEOUT = 600
WRITE_TIMEOUT_ENV = "COCOS_DIST_WRITE_TIMEOUT"  # seconds the other ranks wait while rank 0 writes (default 3600)
DEFAULT_WRITE_TIMEOUT = 3600
_LEAVING: dict = {"group": None}  # the group of the leaving barrier (its timeout is the writing budget)


@dataclass(frozen=True)
class Dist:
    """This process's place in the group: ``rank`` of ``world`` (``world == 1``: a single process)."""

    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


SINGLE = Dist()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise CocosError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def from_env() -> Dist:
    """The group torchrun describes in the environment, joined once; :data:`SINGLE` without torchrun."""

    world = _env_int("WORLD_SIZE") or 1
    if world <= 1:
        return SINGLE
    rank = _env_int("RANK")
    if rank is None or not 0 <= rank < world:
        raise CocosError(f"RANK={os.environ.get('RANK')!r} does not fit WORLD_SIZE={world} (start with torchrun)")
    if not dist.is_available():
        raise CocosError("this torch build has no torch.distributed; run a single process")
    if not dist.is_initialized():
        _join()
    return Dist(rank=dist.get_rank(), world=dist.get_world_size())


def _join() -> None:
    """Join torchrun's process group: Gloo for CPU tensors, and NCCL for CUDA ones where this process has a GPU (a
    --device cpu run on a GPU node works too; the process takes the GPU ``LOCAL_RANK``), with the peers' timeout
    (:data:`TIMEOUT_ENV`); and the group of the leaving barrier, with the writing budget. A failure is one line."""
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=_env_int(TIMEOUT_ENV) or DEFAULT_TIMEOUT)
    if cuda:
        _take_local_gpu()
    try:
        dist.init_process_group(backend=backend, timeout=timeout)
        # the ranks that do not write wait for rank 0's writing on a group of its own, with a writing budget:
        # a report may take longer to write than a peer may take to answer
        budget = max(_env_int(WRITE_TIMEOUT_ENV) or DEFAULT_WRITE_TIMEOUT, timeout.total_seconds())
        _LEAVING["group"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=budget))
    except (RuntimeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CocosError(f"cannot join the torchrun process group ({first})") from None


def _take_local_gpu() -> None:
    """Make GPU ``LOCAL_RANK`` (default 0) this process's CUDA device; one line if the node has no such GPU."""
    local = _env_int("LOCAL_RANK") or 0
    if local >= torch.cuda.device_count():
        raise CocosError(f"LOCAL_RANK {local} but this node has {torch.cuda.device_count()} GPU(s); start "
                         "at most one process per GPU (--nproc_per_node), or run on the CPU with "
                         "CUDA_VISIBLE_DEVICES=''")
    torch.cuda.set_device(local)


@contextlib.contextmanager
def context() -> Iterator[Dist]:
    """Join the group for one command and leave it at the end (also on errors)."""

    group = from_env()
    try:
        yield group
        barrier(group, leaving=True)  # every rank leaves together, waiting while rank 0 writes (its own budget)
    finally:
        if group.active and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        _LEAVING["group"] = None


def current() -> Dist:
    """The group this process has joined (:data:`SINGLE` if none)."""

    if dist.is_available() and dist.is_initialized():
        return Dist(rank=dist.get_rank(), world=dist.get_world_size())
    return SINGLE


def block(n: int, group: Dist = SINGLE) -> range:
    """Rank ``group.rank``'s contiguous block of ``range(n)``; the blocks of ranks 0..world-1 tile it in order."""
    lo = n * group.rank // group.world
    hi = n * (group.rank + 1) // group.world
    return range(lo, hi)


def aligned_block(n: int, step: int, group: Dist = SINGLE) -> range:
    """Rank ``group.rank``'s block of ``range(n)`` made of whole chunks of ``step`` items (the one-process chunks).

    Work done in chunks (a batch of captions encoded together, batches counted together)
    then sees exactly the chunks one process sees, so even the rounding is the same.
    """
    chunks = block(-(-n // step), group)
    return range(min(chunks.start * step, n), min(chunks.stop * step, n))


def gather_blocks(value, group: Dist = SINGLE) -> list:
    """Every rank's ``value``, in rank order, on every rank (one item when single)."""
    if not group.active:
        return [value]

    out: list = [None] * group.world
    try:
        dist.all_gather_object(out, value)
    except RuntimeError as exc:  # a peer died or timed out
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CocosError(f"rank {group.rank}: another process stopped ({first})") from None
    return out


def barrier(group: Dist = SINGLE, leaving: bool = False) -> None:
    """Wait for every rank (``leaving``: at the end of a command, on the group whose timeout is the writing budget
    ``COCOS_DIST_WRITE_TIMEOUT``, since rank 0 alone writes the outputs while the others wait)."""
    if group.active:

        try:
            dist.barrier(group=_LEAVING["group"] if leaving else None)
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CocosError(f"rank {group.rank}: another process stopped ({first})") from None


def all_gather_with_grad(x: torch.Tensor, group: Dist = SINGLE) -> torch.Tensor:
    """Concatenate every rank's ``x`` along dim 0 (rank order); gradients flow back to each rank's own part.

    As CLIP-style trainers do, so that a contrastive loss sees the global batch (its
    hardest negatives are global). Ranks may hold different numbers of rows (the
    blocks of :func:`block`): each part is padded to the largest for the collective and
    cut back after it. The backward pass sums every rank's gradient of its own rows, so
    a loss that every rank computes identically gives ``world`` times the gradient;
    :func:`average_gradients` divides it back.
    """
    if not group.active:
        return x

    sizes = torch.tensor([x.shape[0]], device=x.device)
    all_sizes = [torch.zeros_like(sizes) for _ in range(group.world)]
    try:
        dist.all_gather(all_sizes, sizes)
        largest = int(max(int(n) for n in all_sizes))
        padded = x if x.shape[0] == largest else torch.cat([x, x.new_zeros(largest - x.shape[0], *x.shape[1:])])
        with warnings.catch_warnings():  # deprecated in favour of a private API; still the public one with autograd
            warnings.simplefilter("ignore", FutureWarning)
            parts = all_gather(padded)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CocosError(f"rank {group.rank}: another process stopped ({first})") from None
    return torch.cat([part[: int(n)] for part, n in zip(parts, all_sizes, strict=True)], dim=0)


def gather_rows(x: torch.Tensor, sizes: list[int], group: Dist = SINGLE) -> list[torch.Tensor]:
    """Every rank's ``x`` (detached: no gradient flows back), in rank order, on every rank: one ``all_gather``.

    ``sizes`` are the ranks' numbers of rows (known to every rank, e.g. from :func:`gather_blocks`); the ranks may
    hold different numbers (an epoch's short last batch): each part is padded to the largest for the collective
    and cut back after it. The rows keep their dtype and values bit for bit. A CPU tensor is gathered through the
    current CUDA device where the group has no CPU backend (NCCL alone) and comes back to the CPU."""
    x = x.detach()
    if not group.active:
        return [x]
    if len(sizes) != group.world or sizes[group.rank] != x.shape[0]:
        raise CocosError(f"rank {group.rank}: gather_rows needs every rank's number of rows, got {sizes} "
                         f"({x.shape[0]} here)")
    home = x.device
    if home.type == "cpu" and "gloo" not in str(dist.get_backend()).lower() and torch.cuda.is_available():
        x = x.to(torch.device("cuda", torch.cuda.current_device()))
    largest = max(int(n) for n in sizes)
    padded = x if x.shape[0] == largest else torch.cat([x, x.new_zeros(largest - x.shape[0], *x.shape[1:])])
    parts = [torch.empty_like(padded) for _ in range(group.world)]
    try:
        dist.all_gather(parts, padded.contiguous())
    except RuntimeError as exc:  # a peer died or timed out, or the group cannot gather this device's tensors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CocosError(f"rank {group.rank}: cannot gather the other processes' rows ({first})") from None
    return [part[: int(n)].to(home) for part, n in zip(parts, sizes, strict=True)]


def broadcast_buffers(module: torch.nn.Module, group: Dist = SINGLE) -> None:
    """Rank 0's buffers (BatchNorm running statistics) on every rank, as DistributedDataParallel keeps them."""
    if not group.active:
        return

    try:
        for buffer in module.buffers():
            dist.broadcast(buffer, src=0)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CocosError(f"rank {group.rank}: another process stopped ({first})") from None


def average_gradients(parameters, group: Dist = SINGLE) -> None:
    """Average the gradients over ranks (what DistributedDataParallel does), in one flat all-reduce."""
    if not group.active:
        return

    params = [p for p in parameters if p.grad is not None]
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    try:
        dist.all_reduce(flat)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CocosError(f"rank {group.rank}: another process stopped ({first})") from None
    flat /= group.world
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
