"""Hugging Face model folders on disk, told apart without importing torch (what a command asks of its arguments
before anything heavy is loaded): a folder's ``config.json`` names its ``model_type``."""

from __future__ import annotations

import json
import os
from pathlib import Path

MAX_CONFIG_BYTES = 1 << 20


def model_type(folder: str | os.PathLike) -> str | None:
    """The ``model_type`` of a folder's ``config.json``; None for anything else (no folder, no or unreadable config)."""
    config = Path(folder) / "config.json"
    try:
        if not Path(folder).is_dir() or not config.is_file() or config.stat().st_size > MAX_CONFIG_BYTES:
            return None
        value = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def is_clip_folder(folder: str | os.PathLike) -> bool:
    """A folder whose ``config.json`` says ``model_type: clip`` (a Hugging Face ``CLIPModel``)."""
    return model_type(folder) == "clip"


__all__ = ["is_clip_folder", "model_type"]
