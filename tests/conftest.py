"""Test configuration: one torch thread.

The tests use tiny tensors, for which one thread is fastest; with two threads on
a 2-core machine that also runs other work, OpenMP spin-waiting can make a tiny
training epoch ten times slower.
"""

import torch

torch.set_num_threads(1)
