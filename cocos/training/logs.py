"""The logs ``cocos train`` writes into a checkpoint folder, read back with their columns checked.

``train_log.csv``: one row per step (``step, epoch, loss, L_con`` and, with LTD, ``L_rec, L_rec/eta, lambda``);
``cocos_track.csv`` (``--track-cocos N``): tidy ``step, epoch, loss, direction, stat, value``. The trainer
restores them on resume; ``cocos analyze`` copies them into its report folder and the report layer plots them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cocos.errors import CocosError

TRAIN_LOG = "train_log.csv"
TRACK_LOG = "cocos_track.csv"
TRACK_COLUMNS = ("step", "epoch", "loss", "direction", "stat", "value")
LOG_COLUMNS = ("step", "epoch", "loss", "L_con")
LTD_COLUMNS = ("lambda", "L_rec/eta")


@dataclass
class TrainingLogs:
    """The step log and the COCOS track of one run (either may be absent)."""

    steps: pd.DataFrame | None = None
    track: pd.DataFrame | None = None

    def __bool__(self) -> bool:
        return self.steps is not None or self.track is not None

    @property
    def has_ltd(self) -> bool:
        return self.steps is not None and all(c in self.steps for c in LTD_COLUMNS)


def _read(path: Path, columns) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise CocosError(f"{path}: not a readable CSV ({(str(exc).splitlines() or ['?'])[0]})") from None
    missing = [c for c in columns if c not in frame]
    if missing:
        raise CocosError(f"{path}: lacks the column(s) {', '.join(missing)}")
    for c in ("step", "epoch"):
        if not pd.api.types.is_integer_dtype(frame[c]):
            raise CocosError(f"{path}: column {c} must hold integers")
    return frame


def read_logs(folder: str | os.PathLike, max_epoch: int | None = None) -> TrainingLogs:
    """The logs in a checkpoint or report folder; rows after ``max_epoch`` (a later checkpoint's) are left out."""
    folder = Path(folder)
    steps, track = _read(folder / TRAIN_LOG, LOG_COLUMNS), _read(folder / TRACK_LOG, TRACK_COLUMNS)
    if max_epoch is not None:
        steps = steps[steps["epoch"] <= max_epoch] if steps is not None else None
        track = track[track["epoch"] <= max_epoch] if track is not None else None
    return TrainingLogs(steps, track)


def write_log_csvs(logs: TrainingLogs, folder: str | os.PathLike) -> None:
    """Both CSVs (those there are) into ``folder``, atomically."""
    from cocos.io import write_csv

    for frame, name in ((logs.steps, TRAIN_LOG), (logs.track, TRACK_LOG)):
        if frame is not None:
            write_csv(Path(folder) / name, frame, float_format="%.10g")
