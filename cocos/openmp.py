"""How torch's CPU threads wait: OpenMP's wait policy, chosen before torch loads (no torch import here).

torch's CPU kernels (and MKL beside them) run on OpenMP threads that meet at a barrier after every parallel
region. By default they *spin* there (libgomp: 300,000 spins) before they sleep. On an idle machine that is
fastest: a thread is back at work the moment the next region starts. On a shared machine it is a collapse: when
one of the threads has lost its core to another process, the others spin through their time slices waiting for
it, and every step waits for the slowest thread. ``benchmarks/bench_load.py`` (``cocos train`` at the demo's
sizes on a 2-core machine; captions/s):

==========================  ======  ============  ===========
policy                       idle    beside 1      beside 8
==========================  ======  ============  ===========
spin (OpenMP's default)      1,936   636 (33%)     76 (4%)
passive                      1,500   1,412 (73%)   147 (8%)
cocos (as below)             2,386   1,278 (66%)   193 (10%)
one thread, spin             1,443   1,462 (76%)   251 (13%)
==========================  ======  ============  ===========

(one run, percentages of the default's idle speed; runs on this shared machine vary by about 20%, see
``benchmarks/README.md``).

A passive thread sleeps at once and gives its core away; on an idle machine that costs a quarter to a third of the speed
(waking a thread takes longer than a short region). cocos therefore chooses the policy from the load when a
command starts (:func:`other_runnable`: processes other than this one that want a core):

- other processes want more cores than the command's threads leave free (by default a command uses every core,
  so any other runnable process): ``OMP_WAIT_POLICY=PASSIVE``;
- there is room and the command is long (``train``, ``demo``, ``sweep``, ``data``: minutes to hours, while
  other work may start beside it): ``GOMP_SPINCOUNT=1000``, a short spin that keeps most of the idle speed and
  gives the core away soon when the load rises;
- there is room and the command is short (``count``, ``analyze``, ...): OpenMP's default.

**Never the thread count.** One thread would be faster still beside eight busy processes (13% against 10%), but
the split of a reduction, and so every result bit for bit, depends on the number of threads: a command's
results would then depend on the machine's load when it started, and a resumed run or feature cache would not
equal an uninterrupted one. The wait policy changes only how threads wait, never what they compute. A user who
prefers speed on a crowded machine passes ``--threads 1`` (results then those of one thread).

A user's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept as it is. The policy reaches every process the
command starts (DataLoader workers, ``torchrun`` workers, sweep runs) through the environment.
"""

from __future__ import annotations

import os
import time

LONG_COMMANDS = frozenset({"train", "demo", "sweep", "data"})
SHORT_SPIN = "1000"  # GOMP_SPINCOUNT of a long command on an idle machine
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


def cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def wait_policy(command: str | None, others: int | None = None, threads: int | None = None,
                available: int | None = None) -> dict[str, str]:
    """The OpenMP variables for ``command`` (module docstring): ``{"OMP_WAIT_POLICY": "PASSIVE"}`` when the
    ``others`` runnable processes leave fewer free cores than the command's ``threads`` (default: every core, as
    :func:`cocos.device.default_threads`), ``{"GOMP_SPINCOUNT": "1000"}`` for a long command on a machine with
    room, else nothing (OpenMP's default). ``others`` is :func:`other_runnable`'s count, read when not given;
    ``available`` the cores (:func:`cores`)."""
    available = cores() if available is None else available
    threads = available if threads is None else threads
    if others is None:
        others = other_runnable()
    if others > available - threads:
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    return {"GOMP_SPINCOUNT": SHORT_SPIN} if command in LONG_COMMANDS else {}


def configure(command: str | None, environ=None, threads: int | None = None) -> dict[str, str]:
    """Set the OpenMP variables of :func:`wait_policy` in ``environ`` (``os.environ``) for ``command`` run on
    ``threads`` threads (``--threads``; else ``OMP_NUM_THREADS``, else every core) unless the user set a wait
    policy; returns what was set. Must run before torch is imported to take effect. Without a command
    (``cocos --help``) nothing is read or set."""
    environ = os.environ if environ is None else environ
    if command is None or any(environ.get(name) for name in USER_VARIABLES):
        return {}
    if threads is None:
        text = environ.get("OMP_NUM_THREADS", "").strip()
        threads = int(text) if text.isdigit() and int(text) > 0 else None
    chosen = wait_policy(command, threads=threads)
    environ.update(chosen)
    return chosen


__all__ = ["LONG_COMMANDS", "configure", "cores", "other_runnable", "wait_policy"]
