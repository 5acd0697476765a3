"""Where a sweep's runs run: here, each worker pinned to its share of the cores or to one GPU, or on Slurm through
submitit (its parameters from the grid's ``[slurm]`` table and the command line's options)."""

from __future__ import annotations

import os

import torch

from cocos.errors import CocosError
from cocos.pipelines.sweep_schema import SLURM_KEYS, Grid, _minutes, _unknown, check_slurm


def _pin(slots) -> None:
    """Worker initializer: take one slot (cores or a GPU) for the life of this process."""
    kind, value = slots.get()
    if kind == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(value)
    else:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, value)
        torch.set_num_threads(len(value))
        os.environ["OMP_NUM_THREADS"] = str(len(value))


def worker_slots(jobs: int, gpus: int | None = None) -> list[tuple[str, object]]:
    """One GPU each when there are at least ``jobs`` GPUs, else an equal share of this process's cores."""
    if gpus is not None and gpus >= jobs:
        return [("gpu", i) for i in range(jobs)]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = max(1, len(cores) // jobs)
    return [("cpu", set(cores[(i * share) % len(cores):][:share] or cores[:share])) for i in range(jobs)]


def slurm_params(grid: Grid, options: dict) -> dict:
    """submitit parameters from the grid's [slurm] table, overridden by the command line's options (checked
    here as the grid's are in load_grid)."""
    given = {k: v for k, v in options.items() if v is not None}
    _unknown("slurm options", given, SLURM_KEYS)
    check_slurm(given, lambda key: f"--{key.replace('_', '-')}")
    s = {**grid.slurm, **given}
    params = {"timeout_min": _minutes(s.get("time", "24:00:00")), "slurm_array_parallelism": s.get(
        "array_parallelism", 16)}
    if s.get("partition"):
        params["slurm_partition"] = s["partition"]
    if s.get("gpus"):
        params["gpus_per_node"] = int(s["gpus"])
    if s.get("mem_gb"):
        params["mem_gb"] = int(s["mem_gb"])
    if s.get("cpus"):
        params["cpus_per_task"] = int(s["cpus"])
    return params


def import_submitit():
    try:
        import submitit
    except ModuleNotFoundError:
        raise CocosError("--executor slurm needs submitit: pip install 'cocos[slurm]'") from None
    return submitit
