"""How torch's CPU threads wait: OpenMP's wait policy, chosen before torch loads (no torch import here).

torch's CPU kernels (and MKL beside them) run on OpenMP threads that meet at a barrier after every parallel
region. By default they *spin* there for a while (libgomp: 300,000 spins) before they sleep. On an idle machine
that is fastest: a thread is back at work the moment the next region starts. On a shared machine it is a
collapse: when one of the threads has lost its core to another process, the others spin through their whole
time slice waiting for it, and every step waits for the slowest thread. Measured with one epoch of ``cocos
train`` at the demo's sizes on a 2-core machine (``benchmarks/bench_load.py``): beside **one** busy process the
default policy ran at 1/6 to 1/11 of its idle speed, beside eight at about 1/250.

With ``OMP_WAIT_POLICY=PASSIVE`` a waiting thread sleeps at once and gives its core away. The thread count (and
so every result, bit for bit: the split of a reduction depends on the number of threads, not on how threads
wait) stays the same; only the waiting changes. cocos therefore chooses the policy, never the thread count,
from the load:

- a long command (``train``, ``demo``, ``sweep``, ``data``; minutes to hours, while the load may change) always
  waits passively;
- a short one (``count``, ``analyze``, ...; seconds) spins when the machine is idle at its start (no other
  runnable process: :func:`other_runnable`) and waits passively otherwise.

A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept as it is. The policy reaches every process the
command starts (DataLoader workers, ``torchrun`` workers, sweep runs) through the environment.
"""

from __future__ import annotations

import os
import time

LONG_COMMANDS = frozenset({"train", "demo", "sweep", "data"})
USER_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def other_runnable(samples: int = 5, interval: float = 0.01) -> int:
    """Processes other than this one that want a core now: the median over ``samples`` readings of the runnable
    count of ``/proc/loadavg`` (its 4th field, ``running/total``; it counts the reader), less one; 0 where the
    file is missing (not Linux)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as fh:
                counts.append(int(fh.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return 0
        if i + 1 < samples:
            time.sleep(interval)
    counts.sort()
    return max(0, counts[len(counts) // 2] - 1)


def wait_policy(command: str | None, others: int | None = None) -> str | None:
    """``"PASSIVE"`` or None (OpenMP's default) for ``command`` (module docstring); ``others`` is
    :func:`other_runnable`'s count, read only for a short command when not given."""
    if command in LONG_COMMANDS:
        return "PASSIVE"
    if others is None:
        others = other_runnable()
    return "PASSIVE" if others > 0 else None


def configure(command: str | None, environ=None) -> str | None:
    """Set ``OMP_WAIT_POLICY`` in ``environ`` (``os.environ``) for ``command`` unless the user set a wait policy;
    returns the policy in force (None: OpenMP's default). Must run before torch is imported to take effect.
    Without a command (``cocos --help``) nothing is read or set."""
    environ = os.environ if environ is None else environ
    if command is None or any(environ.get(name) for name in USER_VARIABLES):
        return environ.get("OMP_WAIT_POLICY") or None
    policy = wait_policy(command)
    if policy is not None:
        environ["OMP_WAIT_POLICY"] = policy
    return policy


__all__ = ["LONG_COMMANDS", "configure", "other_runnable", "wait_policy"]
