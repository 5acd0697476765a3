"""A checkpoint's model and data, rebuilt for evaluation and analysis: the resolution of a saved run.

:func:`build_from_checkpoint` rebuilds the module its family records (looked up by the recorded ``kind``) and the
caption coder; :func:`resolve_data` finds the data it was trained on (or the data given); :func:`open_split` opens
one split of it as the run read it (raw images with the recorded ``use_restval``; precomputed features with the
recorded ``k``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from cocos.data.images import load_image_split
from cocos.data.precomp import PrecompSplit
from cocos.data.text import Vocabulary
from cocos.data.wordpiece import coder_of
from cocos.errors import CocosError
from cocos.models.noinit import weights_to_be_loaded
from cocos.models.registry import get_family
from cocos.training.checkpoint import validate_model


def build_from_checkpoint(ckpt: dict, where="checkpoint") -> tuple[torch.nn.Module, Vocabulary]:
    """Rebuild the model (eval mode) and vocabulary recorded in a checkpoint.

    ``ckpt`` is what :func:`~cocos.training.checkpoint.load_checkpoint` returns, or a dict in the
    same format built in memory (a converted checkpoint of the original code): its ``model``,
    ``vocab`` and ``state_dict`` are checked against each other first
    (:func:`~cocos.training.checkpoint.validate_model`), so a bad one is one CocosError line.
    """
    validate_model(ckpt, where)
    kind = ckpt["model"]["kind"]
    try:
        with weights_to_be_loaded():  # every tensor comes from the checkpoint (a strict load)
            model = get_family(kind).build(**ckpt["model"]["hparams"])
        model.load_state_dict(ckpt["state_dict"])
    except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
        raise CocosError(f"{where}: weights do not fit a {kind} model ({str(exc).splitlines()[0]})") from None
    model.eval()
    return model, coder_of(ckpt["vocab"], ckpt.get("text"))


def resolve_data(ckpt: dict, data: str | Path | None, checkpoint_path: str | Path) -> Path:
    """The data folder: ``data`` if given, else the one recorded in the checkpoint if it still exists.

    A raw-image checkpoint (``data.input`` ``images``) may name an image dataset file (a CSV file
    list or a ``{split}_set.p``) instead of a folder."""
    images = ckpt["data"].get("input") == "images"

    def exists(path: Path) -> bool:
        return path.is_dir() or (images and path.is_file())

    if data is not None:
        folder = Path(data)
        if not exists(folder):
            raise CocosError(f"{folder}: no such data {'set' if images else 'folder'}")
        return folder
    recorded = Path(ckpt["data"]["path"])
    if not exists(recorded):
        raise CocosError(f"{checkpoint_path}: its data {'set' if images else 'folder'} {recorded} is gone; pass --data")
    return recorded


def open_split(ckpt: dict, data: str | Path, split: str):
    """One split of a checkpoint's data: a raw-image split for a raw-image checkpoint (with its recorded
    ``use_restval``), else the precomputed folder's split with the checkpoint's ``k``."""
    k = int(ckpt["data"]["k"])
    if ckpt["data"].get("input") == "images":
        return load_image_split(data, split, use_restval=bool(ckpt["data"].get("use_restval", False)))
    return PrecompSplit(data, split, k=k, check_finite=True)
