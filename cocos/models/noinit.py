"""Modules built only to be filled from a file: their random initialisation skipped.

Building a ResNet-152 draws 60 M random numbers (kaiming initialisation) that a checkpoint's weights replace at
once. :func:`weights_to_be_loaded` leaves them undrawn, as transformers' ``no_init_weights`` does for its models.
"""

from __future__ import annotations

import contextlib

import torch

RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                "xavier_normal_", "orthogonal_", "sparse_")


def _kept(tensor, *args, **kwargs):
    return tensor


@contextlib.contextmanager
def weights_to_be_loaded():
    """Within the block, ``torch.nn.init``'s random initialisers (:data:`RANDOM_INITS`) leave a tensor as it was
    allocated and draw nothing from the global random generator (a module's own ``weight.data.uniform_()`` still
    draws).

    Only for a module whose every parameter and persistent buffer is then loaded with a strict
    ``load_state_dict``, which refuses a missing one: what is loaded is the whole module, bit for bit the module
    built the slow way and loaded. Buffers a module computes itself (position ids, masks) are computed as
    before. Not for training (a run's later draws would move) and not thread-safe (it swaps module functions)."""
    saved = {name: getattr(torch.nn.init, name) for name in RANDOM_INITS}
    for name in saved:
        setattr(torch.nn.init, name, _kept)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)
