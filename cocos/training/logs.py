"""The logs ``cocos train`` writes into a checkpoint folder, read back with their columns checked.

``train_log.csv``: one row per step (``step, epoch, loss, L_con, L_con/query`` — the contrastive loss and the same
as each direction's mean over its queries, :meth:`cocos.losses.spec.Objective.per_query`, absent in logs of
earlier versions — and, with LTD, ``L_rec, L_rec/eta, lambda``);
``cocos_track.csv`` (``--track-cocos N``): tidy ``step, epoch, loss, direction, stat, value``. The trainer
restores them on resume; ``cocos analyze`` copies them into its report folder and the report layer plots them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cocos.errors import CocosError
from cocos.io import write_csv

TRAIN_LOG = "train_log.csv"
TRACK_LOG = "cocos_track.csv"
TRACK_META = "cocos_track.json"  # beside a cocos.track.Tracker's cocos_track.csv: what reports need to show it
TRACK_COLUMNS = ("step", "epoch", "loss", "direction", "stat", "value")
LOG_COLUMNS = ("step", "epoch", "loss", "L_con")
LTD_COLUMNS = ("lambda", "L_rec/eta")
PER_QUERY = "L_con/query"
LOG_NUMERIC = ("loss", "L_con", PER_QUERY, "L_rec", "L_rec/eta", "lambda")


@dataclass
class TrainingLogs:
    """The step log and the COCOS track of one run (either may be absent), and the checkpoint's ``history`` (one
    record per epoch: dev rsum, ...) where the reader was given it (an analysis of a checkpoint)."""

    steps: pd.DataFrame | None = None
    track: pd.DataFrame | None = None
    history: list | None = None

    def __bool__(self) -> bool:
        return self.steps is not None or self.track is not None

    @property
    def has_ltd(self) -> bool:
        return self.steps is not None and all(c in self.steps for c in LTD_COLUMNS)


def _read(path: Path, columns, numeric, complete) -> pd.DataFrame | None:
    """A log CSV with its columns checked: the required ones present, ``step``/``epoch`` positive integers,
    the ``numeric`` ones numbers (text in a number column is refused) and the ``complete`` ones present in every
    row. cocos ends every log with a newline, so a file that does not was cut mid-line."""
    if not path.is_file():
        return None
    frame = _read_frame(path)
    missing = [c for c in columns if c not in frame]
    if missing:
        raise CocosError(f"{path}: lacks the column(s) {', '.join(missing)}")
    if frame.empty:  # a header alone: a log of no rows yet (a tracker that has counted nothing writes one)
        return frame
    _check_counters(path, frame)
    _check_values(path, frame, numeric, complete)
    _check_order(path, frame)
    return frame


def _read_frame(path: Path) -> pd.DataFrame:
    """The CSV at ``path`` as a frame; a file whose last byte is not a newline was cut mid-line (one line)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - 1))
            if path.stat().st_size and fh.read(1) != b"\n":
                raise CocosError(f"{path}: its last line is cut (a damaged file?)")
        return pd.read_csv(path)
    except CocosError:
        raise
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise CocosError(f"{path}: not a readable CSV ({(str(exc).splitlines() or ['?'])[0]})") from None


def _check_counters(path: Path, frame: pd.DataFrame) -> None:
    """``step`` and ``epoch`` hold positive integers in every row."""
    for c in ("step", "epoch"):
        if not pd.api.types.is_integer_dtype(frame[c]) or (frame[c] < 1).any():
            raise CocosError(f"{path}: column {c} must hold positive integers in every row (a damaged or cut file?)")


def _check_values(path: Path, frame: pd.DataFrame, numeric, complete) -> None:
    """The ``numeric`` columns there are hold numbers, and the ``complete`` ones there are have a value in every
    row (the first empty cell is named by its 1-based line, after the header)."""
    for c in (c for c in numeric if c in frame):
        if not pd.api.types.is_numeric_dtype(frame[c]):
            raise CocosError(f"{path}: column {c} must hold numbers (a damaged file?)")
    for c in (c for c in complete if c in frame):
        if frame[c].isna().any():
            row = int(frame.index[frame[c].isna()][0]) + 2  # 1-based, after the header line
            raise CocosError(f"{path}: line {row} has no value in column {c} (a cut or damaged file?)")


def _check_order(path: Path, frame: pd.DataFrame) -> None:
    """Each step once (in the step log: the track has a row per statistic), and neither steps nor epochs
    decreasing from row to row."""
    if frame["step"].duplicated().any() and "direction" not in frame:
        raise CocosError(f"{path}: a step appears twice")
    if not frame["step"].is_monotonic_increasing or not frame["epoch"].is_monotonic_increasing:
        raise CocosError(f"{path}: steps and epochs must not decrease from row to row (foreign rows?)")


def read_logs(folder: str | os.PathLike, max_epoch: int | None = None) -> TrainingLogs:
    """The logs in a checkpoint or report folder; rows after ``max_epoch`` (a later checkpoint's) are left out."""
    folder = Path(folder)
    # L_con/query may be missing in rows an earlier version wrote (a run resumed across versions)
    steps = _read(folder / TRAIN_LOG, LOG_COLUMNS, LOG_NUMERIC, complete=[c for c in LOG_NUMERIC if c != PER_QUERY])
    # a statistic may be undefined in a batch (NaN value, e.g. C_q when no query counts); its labels may not be
    track = _read(folder / TRACK_LOG, TRACK_COLUMNS, ("value",), complete=("loss", "direction", "stat"))
    if max_epoch is not None:
        steps = steps[steps["epoch"] <= max_epoch] if steps is not None else None
        track = track[track["epoch"] <= max_epoch] if track is not None else None
    return TrainingLogs(steps, track)


def check_resumable(logs: TrainingLogs, folder, steps: int) -> None:
    """The logs a resume keeps (rows up to the checkpoint's epoch) must be the checkpoint's own: the step log
    exactly steps ``1..steps``, the track only steps up to ``steps`` in the step log's epochs."""
    folder = Path(folder)
    if logs.steps is not None and len(logs.steps):
        found = logs.steps["step"].to_numpy()
        if len(found) != steps or found[0] != 1 or found[-1] != steps:
            raise CocosError(f"{folder / TRAIN_LOG}: holds steps {found[0]}..{found[-1]} ({len(found)} rows) up to "
                             f"the checkpoint's epoch, which ends at step {steps}: not this run's log")
    if logs.track is not None and len(logs.track):
        if int(logs.track["step"].max()) > steps:
            raise CocosError(f"{folder / TRACK_LOG}: holds step {int(logs.track['step'].max())}, beyond the "
                             f"checkpoint's step {steps}: not this run's log")
        if logs.steps is not None and len(logs.steps):
            epoch_of = dict(zip(logs.steps["step"], logs.steps["epoch"], strict=True))
            wrong = [s for s, e in zip(logs.track["step"], logs.track["epoch"], strict=True) if epoch_of.get(s) != e]
            if wrong:
                raise CocosError(f"{folder / TRACK_LOG}: step {wrong[0]} does not match the step log's epochs: not "
                                 "this run's log")


def write_log_csvs(logs: TrainingLogs, folder: str | os.PathLike) -> None:
    """Both CSVs (those there are) into ``folder``, atomically."""

    for frame, name in ((logs.steps, TRAIN_LOG), (logs.track, TRACK_LOG)):
        if frame is not None:
            write_csv(Path(folder) / name, frame, float_format="%.10g")
