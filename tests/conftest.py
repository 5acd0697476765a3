"""Test configuration: one torch thread.

The tests use tiny tensors, for which one thread is fastest; with two threads on
a 2-core machine that also runs other work, OpenMP spin-waiting can make a tiny
training epoch ten times slower. ``OMP_NUM_THREADS=1`` makes every command run in
this process (their default thread count, ``cocos.device.default_threads``) and
every subprocess use one thread too.
"""

import os

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)
