"""Device selection: ``auto`` picks CUDA when present, else CPU."""

from __future__ import annotations

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
