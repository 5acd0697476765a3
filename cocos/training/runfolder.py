"""A training run's folder: its kind, its marker, its lock, and what a failed run leaves.

One writer at a time: the main process holds :func:`cocos.io.output_lock` on it for the whole run (``cocos train``:
from its checks to its last figure), so a second run into the same folder is refused in one line. It is marked as
cocos train's (:data:`RUN_MARKER`, ``.cocos-train``: a folder of kind ``run`` for :func:`cocos.io.check_output_dir`,
which no other command replaces; a dataset, feature cache, report or user's folder is refused as ``--out``, even
with ``--overwrite``: :func:`check_run_folder`) before anything else is written into it, and **a failed run (a
full disk at any write, a CocosError, Ctrl-C) leaves either nothing or a resumable run folder, marked**: until the
first epoch's ``last.pt`` is on disk a failure removes the folder (if the run made it) or what the run added to it;
after that the folder holds a ``last.pt`` that ``--resume`` continues (a run that failed at its figures:
``--resume`` trains nothing and writes them), and the same command without ``--resume`` is refused with a line that
says what the folder holds. ``--overwrite`` starts over: the previous run's files (its checkpoints, logs and
figures; nothing else) are removed when training starts.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from cocos.errors import CocosError
from cocos.io import (
    check_ancestors,
    check_inputs,
    check_output_dir,
    is_own_temporary,
    make_dirs,
    output_kind,
    output_lock,
    remove_created,
    remove_stale_temporaries,
    write_text,
)
from cocos.training.checkpoint import peek_epoch

TENSORBOARD_DIR = "tensorboard"  # OUT/tensorboard/: cocos train --tensorboard's event files
EVENTS_PREFIX = "events.out.tfevents."  # TensorBoard's event file names

TRAIN_LOG = "train_log.csv"
TRACK_LOG = "cocos_track.csv"
# a run folder's marker, its first file: cocos.io.output_kind reads it as kind "run" (only cocos train --overwrite
# starts over in it, no other command replaces it); a "by: WRITER" line names the demo or a sweep that trained it
RUN_MARKER = ".cocos-train"
RUN_MARKER_TEXT = ("written by cocos train: a training run folder (cocos train --resume continues it, --overwrite "
                   "starts over)\n")
# the files cocos train writes into its folder (and their temporaries, which a killed run leaves)
OUTPUT_NAMES = (RUN_MARKER, "last.pt", "model_best.pt", TRAIN_LOG, TRACK_LOG, "training.png", "training.pdf",
                "cocos_track.png", "cocos_track.pdf")
OUTPUT_PATTERNS = (r"epoch_\d+\.pt",)


class RunFolder:
    """The run folder ``out`` of one run (module docstring); ``by``: the command training (``train``, ``demo``,
    ``sweep``), recorded in a new folder's marker; ``locked``: the caller holds the lock already."""

    def __init__(self, out, *, by: str = "train", resume: bool = False, overwrite: bool = False,
                 locked: bool = False, is_main: bool = True) -> None:
        self.out = Path(out)
        self.last, self.best = self.out / "last.pt", self.out / "model_best.pt"
        self.by, self.resume, self.overwrite, self.locked, self.is_main = by, resume, overwrite, locked, is_main
        self.created: list[Path] = []
        self.existed: set[Path] = set()

    def check(self, data: str, epochs: int) -> None:
        """The out folder: a folder (or nothing yet), not the data; a new run's empty or cocos train's own; a
        resumed run's holding its ``last.pt``."""
        data = Path(data)
        if self.out.exists() and not self.out.is_dir():
            raise CocosError(f"{self.out}: exists and is not a folder; choose another --out")
        if data.exists() and self.out.resolve() == data.resolve():
            raise CocosError(f"{self.out}: is the data folder; choose another --out")
        check_run_folder(self.out, [data])  # no other kind of cocos folder, no user's folder: even with --overwrite
        if self.out.is_dir() and not (self.resume or self.overwrite):
            self._check_new(epochs)
        if self.resume and not self.last.exists():
            raise CocosError(f"{self.last}: nothing to resume")

    def _check_new(self, epochs: int) -> None:
        """A new run (neither ``resume`` nor ``overwrite``) goes into an absent folder, an empty one, or one that
        holds only cocos train's marker and temporaries (a run killed before it saved anything); otherwise one line
        that says what the folder holds and which flag continues or replaces it."""
        entries = [p for p in self.out.iterdir()
                   if p.name != RUN_MARKER and not is_own_temporary(p.name, OUTPUT_NAMES, OUTPUT_PATTERNS)]
        if not entries:
            return
        out, epoch = self.out, peek_epoch(self.last)  # a run folder: check_run_folder refused any other
        if epoch is None:
            raise CocosError(f"{out}: holds a cocos train run with no last.pt to resume from; pass --overwrite to "
                             "start over")
        if epoch < epochs:
            raise CocosError(f"{out}: holds a cocos train run stopped after epoch {epoch}; continue it with --resume "
                             "or start over with --overwrite")
        if not self.figures_written():
            raise CocosError(f"{out}: holds a cocos train run of {epoch} epochs whose figures were not written; "
                             f"finish it with --resume{'' if epoch == epochs else f' --epochs {epoch}'} or start "
                             "over with --overwrite")
        raise CocosError(f"{out}: holds a finished cocos train run of {epoch} epochs; start over with --overwrite (or "
                         "train on with --resume and more --epochs)")

    def figures_written(self) -> bool:
        """Whether the figures of the folder's logs are all there (``cocos train`` writes them after the last
        epoch)."""
        figures = {TRAIN_LOG: "training", TRACK_LOG: "cocos_track"}
        return all((self.out / f"{stem}.{ext}").exists() for log, stem in figures.items() if (self.out / log).exists()
                   for ext in ("png", "pdf"))

    def saved(self) -> dict[str, int | None]:
        """What the folder holds now: the epoch of ``last.pt`` and ``model_best.pt`` (None: none)."""
        return {"last": peek_epoch(self.last), "best": peek_epoch(self.best)}

    @contextlib.contextmanager
    def lock(self):
        """Hold :func:`cocos.io.output_lock` on the folder (the main process alone; nothing if already held)."""
        if not self.is_main or self.locked:
            yield
            return
        with output_lock(self.out.resolve()):
            self.locked = True
            try:
                yield
            finally:
                self.locked = False

    def open(self) -> None:
        """Make the folder (the main process), remove temporaries a killed run left and, with ``overwrite``, the
        previous run's files; :meth:`mark` it next, the run's first write."""
        if not self.is_main:
            return
        self.created = make_dirs(self.out)
        remove_stale_temporaries(self.out, OUTPUT_NAMES, OUTPUT_PATTERNS, own=True)
        if self.overwrite and not self.resume:
            self._remove_previous_run()
        self.existed = set(self.out.iterdir())

    def mark(self) -> None:
        """The marker, first: written into a folder this run made or one that holds only cocos train's files (never
        into a user's folder that ``--overwrite`` trains into: it would then pass for a run folder)."""
        if not self.is_main:
            return
        text = RUN_MARKER_TEXT + (f"by: {self.by}\n" if self.by else "")
        if (self.out / RUN_MARKER).exists():  # a run starting over records who trains it now (an earlier
            if not self.resume and run_writer(self.out) != self.by:  # version's marker has no writer)
                write_text(self.out / RUN_MARKER, text)
            return
        if self.created or all(is_output(p.name) for p in self.existed):
            write_text(self.out / RUN_MARKER, text)

    def undo(self) -> None:
        """Undo a run that saved no ``last.pt``: the folder it made, or the files of its own that it added."""
        if not self.is_main:
            return
        remove_created(self.created)
        with contextlib.suppress(OSError):
            for path in set(self.out.iterdir()) - self.existed if self.out.is_dir() else ():
                if is_output(path.name) and not path.is_dir():
                    path.unlink(missing_ok=True)

    def _remove_previous_run(self) -> None:
        """``overwrite``: the previous run's checkpoints, logs and figures go, and its TensorBoard event files
        (``tensorboard/`` too where nothing else is left in it; the marker and other files stay), so the folder never
        mixes two runs."""
        board = self.out / TENSORBOARD_DIR
        events = _event_files(board)
        paths = events + [path for path in self.out.iterdir()
                          if path.name != RUN_MARKER and is_output(path.name) and (path.is_file() or path.is_symlink())]
        for path in paths:
            try:
                path.unlink()
            except OSError as exc:
                raise CocosError(f"{path}: cannot remove the previous run's file ({exc.strerror or exc})") from None
        with contextlib.suppress(OSError):
            if events and not any(board.iterdir()):
                board.rmdir()


def _event_files(board: Path) -> list[Path]:
    """The TensorBoard event files in a run's ``tensorboard/`` folder (none where it is no folder of its own)."""
    if not board.is_dir() or board.is_symlink():
        return []
    return [e for e in board.iterdir() if e.is_file() and e.name.startswith(EVENTS_PREFIX)]


def check_run_folder(out: str | os.PathLike, inputs=(), option: str = "--out") -> Path:
    """The kind rule (:func:`cocos.io.check_output_dir`, kind ``run``) for a training run folder, before any work:
    ``out`` is absent, empty, a run folder (cocos train's marker :data:`RUN_MARKER`), or an unmarked folder that
    holds cocos train's files or their temporaries (a run of an earlier version); a cocos folder of any other kind
    (dataset, feature cache, report, ...) and a folder cocos did not write are refused in one line even with
    ``--overwrite``, and so is one that is, holds or lies inside an input. What a run folder may be without
    ``--resume`` or ``--overwrite`` is :meth:`RunFolder.check`'s."""
    out = Path(out)
    try:
        entries = list(out.iterdir()) if out.is_dir() and output_kind(out) is None else []
    except OSError:
        entries = []
    if entries and all(is_output(p.name) for p in entries):  # only cocos train's file names: an earlier run
        check_inputs(out, inputs, option)
        check_ancestors(out, "run", option)
    else:  # a user's folder that merely holds a last.pt or an epoch_1.pt among its own files is not a run
        check_output_dir(out, inputs, overwrite=True, kind="run", by="train", option=option)
    return out


def run_writer(out: str | os.PathLike) -> str | None:
    """The writer a run folder's :data:`RUN_MARKER` records (``train``, ``demo``, ``sweep``), None for a folder of an
    earlier version (its marker names no writer)."""
    try:
        text = (Path(out) / RUN_MARKER).read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return None
    for line in text.splitlines()[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "by":
            return value.strip() or None
    return None


def is_output(name: str) -> bool:
    """Whether a file name is one cocos train writes into its folder (or a temporary of one)."""
    return (name in OUTPUT_NAMES or any(re.fullmatch(p, name) for p in OUTPUT_PATTERNS)
            or is_own_temporary(name, OUTPUT_NAMES, OUTPUT_PATTERNS))
