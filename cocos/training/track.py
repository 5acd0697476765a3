"""COCOS during training: the statistics of the training batch, every ``N`` steps, in anyone's training loop.

:class:`Tracker` is the one tracker: ``cocos train --track-cocos N`` uses it
(:meth:`Tracker.for_training`, through :class:`cocos.training.hooks.TrackHook`) and a
researcher's own loop uses it through :mod:`cocos.track` (``docs/tracking.md``)::

    with Tracker("runs/mine", every=50) as tracker:
        for step, (x, t) in enumerate(loader, start=1):
            img, cap = model(x, t)
            tracker.observe(step, img, cap, epoch=epoch)   # before or after the loss: it only reads
            loss = loss_fn(img, cap); ...

Definitions (``docs/definitions.md``, "Notation"):

- **When.** Steps count from 1; a step is *due* when ``(step - 1) % every == 0`` (steps
  1, N+1, 2N+1, ...: step 1 is the model at initialisation, the counts come from the
  embeddings the step's forward pass computed, before its update). Other steps cost
  nothing. One observation per step: a due step is counted once (the first batch
  observed at it, e.g. the first micro-batch of an accumulated step). Steps and epochs
  must not decrease (the CSV's readers refuse such a log); ``epoch=None`` is the last
  epoch given, 1 before any.
- **Which batches.** Counts depend on the batch size, so only batches of one size
  are comparable: the batch size is ``batch_size`` (images per batch) if given, else
  that of the first counted batch, and captions per batch are those of the first
  counted batch. A due batch of another shape (another number of images *or* of
  captions) is not counted; :attr:`Tracker.skipped` counts them (as ``cocos train``
  skips an epoch's short final batch). A batch has at least one image and one caption.
- **Layout.** A batch of ``B`` images and ``M = B`` captions is a pair batch (caption
  ``c`` of image ``c``, or of ``caption_image[c]``); ``M = kB`` captions is a ranking
  batch (``k`` per image: ``caption_image`` given, or implied as ``c // k``). A pair
  counter (Triplet, Triplet SH, NT-Xent) counts a ranking batch through its pair
  batch: each image with its first caption. A ranking counter (SmoothAP) needs a
  ranking batch: with ``losses=None`` it is left out of a run of pair batches; named
  explicitly, a pair batch is one error line.
- **What.** ``losses=None`` counts the COCOS paper's four counters (those the batch can
  serve) at their default parameters; otherwise registered names (``"paper"``,
  ``"all"``, ``"triplet,ntxent"`` as ``cocos count -l`` takes them), :class:`~cocos.objectives.Objective`
  specs or whole-batch callables, as :func:`cocos.counting.count_embeddings` takes
  them, with ``params`` (``{"ntxent": {"tau": 0.05}}``) and ``eps``. Each counter
  writes the statistics its family reports (``Objective.stats``).
- **Value.** One row per (step, epoch, loss, direction, stat); ``value`` is the
  statistic's mean over the batch's queries (the value a row of ``batches.csv``
  holds; NaN where undefined, e.g. ``C_q`` when no query has a gradient).
- **Memory.** A batch whose whole count would need more than
  :data:`cocos.counting.blocks.BLOCK_BUDGET` bytes of temporaries (256 MB; about 64 bytes per query-candidate pair
  and positive: 4 GB for 8192 x 8192) is counted in blocks of query rows against all candidates, with the same
  values (:func:`cocos.counting.blocks.count_batch_values`; counters that cannot be blocked are counted whole).
- **Several processes** (``torch.distributed`` joined before the tracker is made: torchrun, open_clip, Lightning
  DDP). Every rank makes the tracker with the same arguments and observes every step with its own embeddings;
  ``batch`` says which batch is counted, that which the loss sees:

  - ``"global"`` (the default): the *global batch*, every rank's images and captions gathered (``all_gather`` of
    detached tensors) and concatenated in rank order, as a loss over the gathered embeddings sees it (open_clip's
    ``gather_features`` with ``local_loss=False``). The values are those one process computes for the
    concatenated batch.
  - ``"local"``: open_clip's ``local_loss=True``, where rank ``r``'s loss is its own queries against every
    rank's candidates (``image_features @ all_text_features.T`` and ``text_features @ all_image_features.T``):
    each rank's block of queries (images for i2t, captions for t2i; a ranking batch's pair counters: the images'
    first captions) is counted against all candidates (:func:`count_local`), and the statistic is reduced over
    every rank's queries. Only counters whose per-query values read the query's own row can be so counted
    (:meth:`cocos.losses.counts.Counter.blocks`: Triplet, Triplet SH, NT-Xent, SmoothAP, but not the published
    Triplet/SmoothAP t2i of ``compat``, IMC or a whole-batch callable): others are one error line when the tracker
    is made. For the counters that can, the values are the global batch's (each query's row is the same), up to
    rounding.
  - ``"given"``: the embeddings :meth:`Tracker.observe` is given, as they are, with no collective (observe on any
    rank, or on one): a loop that gathers the global batch itself (``cocos train`` does, and counts it on rank
    0), or one rank's batch.

  Gathered, a rank's ``caption_image`` holds rows of its own images (offset by the images of the ranks before it
  in the global batch; ``c // k`` where not given) and ``image_ids`` are dataset ids (given on every rank or on
  none); ranks may hold different numbers of rows (an epoch's short last batch). Whether a due batch is counted
  or skipped follows the global shape, alike on every rank. Rank 0 counts and alone writes the files and
  TensorBoard values; every rank holds the same rows (:meth:`Tracker.frame`). A counted step costs two
  ``all_gather_object`` of a few numbers and one ``all_gather`` per modality; a refused part of a batch on one
  rank is the same error line on every rank. In one process the three count the batch given.

Observing has no effect on the caller's training: the embeddings are detached and
counted under ``torch.no_grad`` (the grad mode is restored on return), no random
numbers are drawn, and the model is never called. A counted observation costs one
device sync.

Files (with ``out_dir``): ``cocos_track.csv`` (columns ``step, epoch, loss, direction, stat,
value``, as ``cocos train`` writes it) is created when the tracker opens (atomically: the header, or the rows
of :meth:`Tracker.restore`) and kept open; each counted observation's rows are *appended* to it and flushed
(``autoflush``; otherwise at :meth:`Tracker.flush` and :meth:`Tracker.close`), so an observation costs the same
at any length of the track. ``cocos_track.json`` (the settings and how reports show each counter) is
replaced atomically when it changes. The folder is locked for the tracker's life
(:func:`cocos.io.output_lock`, ``.NAME.lock`` beside it, released at :meth:`Tracker.close`, when the tracker is
garbage-collected, and by the kernel when the process dies): a second live tracker, ``cocos train`` or other
cocos writer of the same folder is refused in one line. ``out_dir`` may be new or empty (it is then marked a
cocos ``track`` folder), a tracking folder, or a folder of the caller's own (an open_clip run folder: the
tracker adds its two files, and TensorBoard's, and never removes anything); another kind of cocos folder (a
dataset, feature cache, report, ``cocos train`` run) is refused even with ``overwrite``, and a folder that holds
a track already needs ``overwrite=True``. Every argument is checked before the folder is created.
With ``tensorboard`` the same values go to a ``SummaryWriter`` (one written into
``out_dir``, or any object with ``add_scalar(tag, value, global_step)``) under
:func:`tensorboard_tag`. On several processes counting one batch (``batch`` "global" or "local"), rank 0
alone opens the folder and writes; every rank learns whether it could.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cocos.counting import get_counter
from cocos.counting.blocks import count_batch_values
from cocos.counting.engine import counter_settings, resolve_losses
from cocos.data.layout import DIRECTIONS
from cocos.distributed import SINGLE, Dist, current, gather_blocks, gather_rows
from cocos.errors import CocosError
from cocos.io import KINDS, make_dirs, mark_output, output_kind, output_lock, remove_created, write_csv, write_json
from cocos.objectives import counter_params, get_objective, names, order, paper_names
from cocos.presentation import LAST
from cocos.training.logs import TRACK_COLUMNS, TRACK_LOG, TRACK_META
from cocos.training.track_parts import batch_mode, check_parts, count_local, first_line, joined, part_of

COLUMNS = list(TRACK_COLUMNS)
META_FORMAT, META_VERSION = "cocos-track", 1
TENSORBOARD_HINT = "pip install tensorboard (or 'cocos[tensorboard]')"
FLOAT_FORMAT = "%.10g"  # the values' format in cocos_track.csv (as cocos train writes it)
TRACK_KIND = "track"  # the kind of cocos folder a Tracker writes (cocos.io.KINDS)


def tensorboard_tag(loss: str, direction: str, stat: str) -> str:
    """``cocos/<loss>/<direction>/<stat>``; a statistic's trailing sign is spelled out (``W_qv+`` ->
    ``W_qv_pos``, ``C_qv-`` -> ``C_qv_neg``) and any other character TensorBoard refuses in a tag becomes ``_``."""
    stat = re.sub(r"\+$", "_pos", re.sub(r"-$", "_neg", stat))
    return "/".join(re.sub(r"[^-\w.]", "_", part) for part in ("cocos", loss, direction, stat))


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise CocosError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------- the folder


def _check_folder(out_dir: Path, overwrite: bool, kinds: tuple[str, ...]) -> bool:
    """Whether the Tracker may write into ``out_dir`` (see the module docstring; one :class:`CocosError` line
    otherwise); returns whether it is new or empty (then marked a ``track`` folder)."""
    if out_dir.is_symlink() and not out_dir.exists():
        raise CocosError(f"{out_dir}: is a dangling link; choose another out_dir")
    if out_dir.exists() and not out_dir.is_dir():
        raise CocosError(f"{out_dir}: exists and is not a folder")
    if not out_dir.exists():
        return True
    kind = output_kind(out_dir)
    if kind is not None and kind not in kinds:
        raise CocosError(f"{out_dir}: is {KINDS.get(kind, KINDS['unknown'])}; a Tracker writes into a new or empty "
                         "folder, a tracking folder or a folder of your own: choose another out_dir")
    held = [name for name in (TRACK_LOG, TRACK_META) if (out_dir / name).exists() or (out_dir / name).is_symlink()]
    if held and not overwrite:
        raise CocosError(f"{out_dir}: holds {' and '.join(held)} already; choose another folder or pass "
                         "overwrite=True to replace them")
    try:
        return not any(out_dir.iterdir())
    except OSError as exc:
        raise CocosError(f"{out_dir}: cannot read the folder ({exc.strerror or exc})") from None


def _writer_class(tensorboard, out_dir):
    """Check the TensorBoard sink before anything is written: ``SummaryWriter`` (the class) for ``True``, else
    None; one :class:`CocosError` line for a sink that cannot be used."""
    if tensorboard is None or tensorboard is False:
        return None
    if tensorboard is True:
        if out_dir is None:
            raise CocosError("tensorboard=True writes into out_dir; give an out_dir or pass your own SummaryWriter")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise CocosError(f"tensorboard=True needs the tensorboard package: {TENSORBOARD_HINT}") from None
        return SummaryWriter
    if not callable(getattr(tensorboard, "add_scalar", None)):
        raise CocosError(f"tensorboard must be True, False or an object with add_scalar(tag, value, global_step) "
                         f"(a SummaryWriter), got {type(tensorboard).__name__}")
    return None


def csv_lines(rows) -> str:
    """``rows`` (tuples of :data:`COLUMNS`) as the lines ``write_csv(frame, float_format=FLOAT_FORMAT)`` writes
    for them: integers as they are, values in :data:`FLOAT_FORMAT`, NaN as an empty field, text quoted as pandas
    quotes it (only where it holds a comma, a quote or a line break)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=os.linesep)
    for step, epoch, loss, direction, stat, value in rows:
        value = float(value)
        writer.writerow((int(step), int(epoch), loss, direction, stat,
                         "" if math.isnan(value) else FLOAT_FORMAT % value))
    return out.getvalue()


# ---------------------------------------------------------------------- the tracker


class Tracker:
    """COCOS of the training batch every ``every`` steps (see the module docstring); :meth:`frame` gives the tidy
    table, ``cocos_track.csv`` in ``out_dir`` (None: kept in memory only, :meth:`write` writes it).

    ``losses``/``params``/``eps`` choose the counters, ``compat`` the counting mode, ``batch_size`` the images per
    counted batch (None: the first counted batch's), ``tensorboard`` a TensorBoard sink, ``autoflush`` whether
    each counted observation's rows are appended to the CSV (and flushed) at once, ``overwrite`` whether an
    ``out_dir`` that holds a track already may be replaced (otherwise one :class:`CocosError` line). The tracker
    holds ``out_dir``'s lock until :meth:`close` (a ``with`` block closes it).

    ``batch`` is what is counted when ``torch.distributed`` has several processes (module docstring, "Several
    processes"): ``"global"`` (the default) every rank's embeddings gathered, the global batch; ``"local"`` each
    rank's queries against every rank's candidates (open_clip's ``local_loss``), all ranks' queries reduced
    together; ``"given"`` the embeddings :meth:`observe` is given, as they are, with no collective. In one
    process the three count the batch given (``"local"`` refuses the counters it cannot count all the same).
    """

    def __init__(self, out_dir: str | os.PathLike | None = None, every: int = 1, losses=None, *,
                 params: dict | None = None, eps: float | None = None, compat: bool = False,
                 batch_size: int | None = None, tensorboard=False, autoflush: bool = True,
                 overwrite: bool = False, batch: str | None = None,
                 _kinds: tuple[str, ...] = (TRACK_KIND,)) -> None:
        self._closed, self._lock, self._csv = True, None, None  # until opened (a refused tracker holds nothing)
        self.every = _positive_int(every, "every (count every N steps)")
        self.batch = batch_mode(batch)
        # the process group joined before the tracker was made; "global" and "local" gather over it (collectives)
        self.group: Dist = SINGLE if self.batch == "given" else current()
        self.collective = self.group.active
        self.compat, self.autoflush = bool(compat), bool(autoflush)
        self.batch_size = None if batch_size is None else _positive_int(batch_size, "batch_size")
        self.default = losses is None  # the paper's four, less those the batches cannot serve
        objectives = resolve_losses(losses)
        self._objectives = {o.name: o for o in objectives}
        self.losses = counter_settings(objectives, dict(params or {}), eps)
        if self.batch == "local":
            self._check_local()
        self.layout: str | None = None  # "pair" or "ranking": fixed by the first counted batch (or the trainer)
        self.shape: tuple[int, int] | None = None  # (images, captions) of a counted batch
        self.skipped = 0
        self.rows: list[tuple] = []
        self._last = (0, 0)  # the last (step, epoch) observed
        self._written, self._meta_written = 0, None  # rows in the CSV, the cocos_track.json written
        self.out_dir = None if out_dir is None else Path(out_dir)
        writer = _writer_class(tensorboard, self.out_dir)  # every argument checked before the folder exists
        self.sink, self._owns_sink = (None if tensorboard is True or tensorboard is False else tensorboard), False
        if not self.writes:  # several processes counting one batch: rank 0 alone writes and logs
            self.sink = None
        if self.out_dir is not None:
            self._open_shared(overwrite, _kinds, writer)
        self._closed = False

    @property
    def writes(self) -> bool:
        """Whether this process writes the files and the TensorBoard values: one process, ``batch="given"``, or
        rank 0 of several that count one batch."""
        return not self.collective or self.group.is_main

    def _check_local(self) -> None:
        """``batch="local"`` counts each rank's queries against all candidates: only counters whose per-query
        values read the query's own row (:meth:`cocos.losses.counts.Counter.blocks`) can be so counted."""
        for name, objective in self._objectives.items():
            counter = get_counter(objective, **self.losses[name])
            refused = [d for d in DIRECTIONS if not counter.blocks(d, self.compat)]
            if refused:
                raise CocosError(f"batch='local' counts each rank's queries against every rank's candidates, which "
                                 f"{name} ({'/'.join(refused)}{' in compat mode' if self.compat else ''}) cannot: its "
                                 "per-query values do not read the query's own row alone; count batch='global' or "
                                 "leave it out")

    def _open_shared(self, overwrite: bool, kinds: tuple[str, ...], writer) -> None:
        """:meth:`_open` in one process; on several processes counting one batch, rank 0 opens the folder and
        every rank learns whether it could (rank 0's failure is one error line on every rank)."""
        if not self.collective:
            self._open(overwrite, kinds, writer)
            return
        failure = None
        if self.writes:
            try:
                self._open(overwrite, kinds, writer)
            except BaseException as exc:
                failure = exc
        refused = gather_blocks(None if failure is None else first_line(failure), self.group)[0]
        if failure is not None:
            raise failure
        if refused is not None:
            raise CocosError(f"{refused} (rank 0 could not open the tracker)")

    def _open(self, overwrite: bool, kinds: tuple[str, ...], writer) -> None:
        """Lock ``out_dir``, check it under the lock, create and mark it (new or empty), start the files and the
        TensorBoard writer; on failure nothing this call made is left and the lock is released."""
        lock = output_lock(self.out_dir.absolute())  # beside the folder's own name (also for ".")
        lock.__enter__()
        self._lock, created = lock, []
        try:
            mark = _check_folder(self.out_dir, overwrite, kinds)
            created = make_dirs(self.out_dir)
            if mark:
                mark_output(self.out_dir, TRACK_KIND)
            self._write_files()
            if writer is not None:
                self.sink, self._owns_sink = writer(log_dir=str(self.out_dir)), True
        except BaseException:
            self._release()
            remove_created(created)
            raise

    @classmethod
    def for_training(cls, every: int, loss: str, loss_params: dict, batch_layout: str, compat: bool = False,
                     **kw) -> Tracker:
        """``cocos train``'s tracker: the training loss first, then the paper's counters the run's batches serve
        (a pair run has no SmoothAP), each at the paper's defaults or the training loss's own parameters where it
        shares them (:func:`cocos.objectives.counter_params`); ``batch_layout`` is the run's. An ``out_dir`` may
        be a ``cocos train`` run folder."""
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise CocosError(f"--track-cocos must be at least 1 (count every N steps), got {every}")
        names = order([loss, *paper_names()])
        if batch_layout == "pair":  # a pair batch cannot serve a ranking counter (k captions per image)
            names = [n for n in names if n == loss or get_objective(n).layout == "pair"]
        params = counter_params(loss, loss_params, names)
        # the trainer gathers every rank's embeddings for its loss and hands rank 0 the global batch: counted as given
        tracker = cls(every=every, losses=names, params={n: params[n] for n in names if params.get(n)},
                      compat=compat, batch="given", _kinds=(TRACK_KIND, "run"), **kw)
        tracker.layout = batch_layout
        return tracker

    # ------------------------------------------------------------------ observing

    def due(self, step: int) -> bool:
        """Whether ``step`` (from 1) is counted: steps 1, N+1, 2N+1, ..."""
        return (step - 1) % self.every == 0

    @property
    def counted(self) -> list[str]:
        """The counters the batches serve: with ``losses=None``, no ranking counter on pair batches."""
        return [n for n, o in self._objectives.items()
                if not (self.default and self.layout == "pair" and o.layout == "ranking")]

    @property
    def path(self) -> Path | None:
        """``cocos_track.csv`` in ``out_dir`` (None without one)."""
        return None if self.out_dir is None else self.out_dir / TRACK_LOG

    def _advance(self, step, epoch) -> tuple[int, int]:
        """The checked ``(step, epoch)`` of an observation: positive integers, neither decreasing."""
        if self._closed:
            raise CocosError("Tracker.observe after close()")
        step = _positive_int(step, "step (counted from 1)")
        epoch = (self._last[1] or 1) if epoch is None else _positive_int(epoch, "epoch (counted from 1)")
        if step < self._last[0] or epoch < self._last[1]:
            raise CocosError(f"Tracker.observe: step {step}, epoch {epoch} after step {self._last[0]}, epoch "
                             f"{self._last[1]}: steps and epochs must not decrease")
        return step, epoch

    def observe(self, step: int, image_emb, caption_emb, caption_image=None, epoch: int | None = None,
                image_ids=None) -> bool:
        """Count the batch if ``step`` is due (see the module docstring); returns whether it was counted.

        ``image_emb`` ``(B, d)`` and ``caption_emb`` ``(M, d)``: the step's embeddings (tensors or arrays, any
        device; detached here). ``caption_image``: caption -> image row (default ``c // (M // B)``).
        ``image_ids``: the images' dataset ids, marking same-image rows of a pair batch (excluded from the
        negatives, or negatives with ``compat``).
        """
        step, epoch = self._advance(step, epoch)
        fresh = step > self._last[0]  # a due step is counted once: its first batch
        counted = due = self.due(step) and fresh
        if due and self.collective:
            counted = self._observe_gathered(step, epoch, image_emb, caption_emb, caption_image, image_ids)
        elif due:
            self._check_group(step)
            images, captions = self._tensors(step, image_emb, caption_emb)
            counted = self._fits((int(images.shape[0]), int(captions.shape[0])))
            if counted:
                bounds = None if self.batch != "local" else ([0, len(images)], [0, len(captions)])
                self._count(step, epoch, images, captions, caption_image, image_ids, bounds)
            else:
                self.skipped += 1
        self._last = (step, epoch)  # after the checks: a refused observation leaves the tracker as it was
        if due and self.autoflush:  # the rows of a counted one, the skip count of a skipped one
            self.flush()
        return counted

    def _tensors(self, step: int, image_emb, caption_emb) -> tuple[torch.Tensor, torch.Tensor]:
        """Both embeddings as detached 2-D tensors of one width on one device, each with at least one row (one
        error line otherwise)."""
        images = torch.as_tensor(image_emb.detach() if isinstance(image_emb, torch.Tensor) else image_emb)
        captions = torch.as_tensor(caption_emb.detach() if isinstance(caption_emb, torch.Tensor) else caption_emb,
                                   device=images.device)
        if images.ndim != 2 or captions.ndim != 2 or images.shape[1] != captions.shape[1]:
            raise CocosError(f"Tracker.observe at step {step}: image_emb (B, d) and caption_emb (M, d) must be 2-D "
                             f"with the same d, got {tuple(images.shape)} and {tuple(captions.shape)}")
        for what, x in (("images", images), ("captions", captions)):
            if not len(x):
                raise CocosError(f"Tracker.observe at step {step}: the batch has 0 {what} (image_emb "
                                 f"{tuple(images.shape)}, caption_emb {tuple(captions.shape)}); a batch needs at "
                                 "least one image and one caption")
        return images, captions

    def _check_group(self, step: int) -> None:
        """A tracker of one process that counts the global batch, in a process group joined after it was made,
        would count one rank's batch: one error line."""
        if self.batch != "given" and current().active:
            raise CocosError(f"Tracker.observe at step {step}: the tracker was made before "
                             "torch.distributed.init_process_group; make it after (every rank, to count the global "
                             "batch), or pass batch='given' to count each process's batch as given")

    def _observe_gathered(self, step: int, epoch: int, image_emb, caption_emb, caption_image, image_ids) -> bool:
        """A due step on several processes (``batch`` "global" or "local"): every rank's part gathered, the
        batch counted on rank 0, its values shared with every rank (whose rows are then rank 0's); a refused
        part or batch is the same one error line on every rank. Every rank must observe every due step."""
        tensors, parts = self._gather_parts(step, image_emb, caption_emb, caption_image, image_ids)
        caption_image, image_ids = joined(step, parts)
        shape = (sum(p["images"] for p in parts), sum(p["captions"] for p in parts))
        if not self._fits(shape):
            self.skipped += 1  # every rank decides alike: the global shape
            return False
        keys, values = self._shared_values(step, *self._gather_batch(tensors, parts, caption_image, image_ids))
        self._record(step, epoch, keys, values, shape)
        return True

    def _gather_parts(self, step: int, image_emb, caption_emb, caption_image, image_ids) -> tuple:
        """This rank's embeddings (:meth:`_tensors`) and every rank's part of the batch (:func:`part_of`, in
        rank order), in one collective; a part refused on any rank is its one error line on every rank."""
        tensors, part = None, None
        try:
            tensors = self._tensors(step, image_emb, caption_emb)
            part = part_of(step, *tensors, caption_image, image_ids)
        except CocosError as exc:
            part = {"error": str(exc)}
        parts = gather_blocks(part, self.group)  # one collective: every part's shape, layout, or its refusal
        check_parts(step, parts)
        return tensors, parts

    def _gather_batch(self, tensors: tuple, parts: list[dict], caption_image, image_ids) -> tuple:
        """The global batch on every rank: the ranks' images and captions gathered in rank order (one
        ``all_gather`` each), ``caption_image`` and ``image_ids`` on their device, and with ``batch="local"`` the
        ranks' first image and caption rows (:meth:`_values`'s ``bounds``; else None)."""
        group = self.group
        images, captions = tensors
        n = [p["images"] for p in parts]
        images = torch.cat(gather_rows(images, n, group))
        captions = torch.cat(gather_rows(captions, [p["captions"] for p in parts], group))
        device = images.device
        caption_image = None if caption_image is None else torch.as_tensor(caption_image, device=device)
        image_ids = None if image_ids is None else torch.as_tensor(image_ids, device=device)
        bounds = None
        if self.batch == "local":
            bounds = (np.cumsum([0, *n]).tolist(), np.cumsum([0, *(p["captions"] for p in parts)]).tolist())
        return images, captions, caption_image, image_ids, bounds

    def _shared_values(self, step: int, images, captions, caption_image, image_ids, bounds) -> tuple[list, list]:
        """:meth:`_values` of the gathered batch, counted on rank 0 and shared with every rank (one collective),
        with rank 0's layout; rank 0's refusal or failure is one error line on every rank (rank 0 raises its
        own)."""
        outcome, failure = None, None
        if self.group.is_main:
            outcome, failure = self._main_outcome(step, images, captions, caption_image, image_ids, bounds)
        outcome = gather_blocks(outcome, self.group)[0]  # rank 0's values (or refusal) on every rank
        if failure is not None:
            raise failure
        if "error" in outcome:
            raise CocosError(outcome["error"])
        self.layout = outcome["layout"]
        return outcome["keys"], outcome["values"]

    def _main_outcome(self, step: int, images, captions, caption_image, image_ids,
                      bounds) -> tuple[dict, BaseException | None]:
        """Rank 0's count of the gathered batch, as the other ranks receive it (``keys``, ``values`` and
        ``layout``, or the ``error`` line), and what it raised (None: counted; the layout is then left as it
        was)."""
        layout = self.layout
        try:
            keys, values = self._values(step, images, captions, caption_image, image_ids, bounds)
            return {"keys": keys, "values": values, "layout": self.layout}, None
        except BaseException as exc:  # every rank stops with the same line
            self.layout = layout
            return {"error": str(exc) if isinstance(exc, CocosError) else
                    f"Tracker.observe at step {step}: rank 0 could not count the batch ({first_line(exc)})"}, exc

    def _fits(self, shape: tuple[int, int]) -> bool:
        """Whether the batch has the tracked shape (images and captions); the first batch that fits
        ``batch_size`` fixes it."""
        if self.shape is None:  # fixed by _count once the batch is counted (a refused one fixes nothing)
            return self.batch_size is None or shape[0] == self.batch_size
        return shape == self.shape

    def _views(self, step, images, captions, caption_image, image_ids) -> dict:
        """The arguments of each counter layout: the batch itself, and for pair counters on a ranking batch its
        pair batch (each image with its first caption). The first counted batch fixes the layout."""
        self.layout = self.layout or ("pair" if len(captions) == len(images) else "ranking")
        whole = (images, captions, caption_image, image_ids)
        if self.layout == "pair":
            need = [n for n, o in self._objectives.items() if o.layout == "ranking"]
            if need and not self.default:
                raise CocosError(f"Tracker.observe at step {step}: {', '.join(need)} needs a ranking batch (k "
                                 f"captions per image); this batch has one caption per image")
            return {"pair": whole, "ranking": whole}
        first = self._first_captions(step, len(images), len(captions), caption_image)
        return {"pair": (images, captions[first], None, image_ids), "ranking": whole}

    def _first_captions(self, step: int, n: int, m: int, caption_image) -> torch.Tensor | slice:
        """Each image's first caption in a ranking batch of ``n`` images and ``m`` captions."""
        if caption_image is None:
            if m % n:
                raise CocosError(f"Tracker.observe at step {step}: {m} captions is not a multiple of {n} images; "
                                 "give caption_image")
            return slice(None, None, m // n)
        ci = np.asarray(torch.as_tensor(caption_image).cpu())
        if ci.shape != (m,) or not np.issubdtype(ci.dtype, np.integer) or (m and (ci.min() < 0 or ci.max() >= n)):
            raise CocosError(f"Tracker.observe at step {step}: caption_image must be {m} integers in [0, {n})")
        first = np.full(n, m)
        np.minimum.at(first, ci, np.arange(m))
        if (first == m).any():
            raise CocosError(f"Tracker.observe at step {step}: image {int(np.argmax(first == m))} has no caption")
        return torch.as_tensor(first)

    def _count(self, step: int, epoch: int, images, captions, caption_image, image_ids, bounds=None) -> None:
        keys, values = self._values(step, images, captions, caption_image, image_ids, bounds)
        self._record(step, epoch, keys, values, (int(images.shape[0]), int(captions.shape[0])))

    @torch.no_grad()
    def _values(self, step: int, images, captions, caption_image, image_ids, bounds=None) -> tuple[list, list]:
        """Each counted ``(loss, direction, stat)`` and its batch value. ``bounds`` (``batch="local"``): the
        ranks' first image and caption rows, each rank's queries counted against all candidates
        (:func:`count_local`); the pair view of a ranking batch (each image with its first caption) is cut by
        the images'."""
        views = self._views(step, images, captions, caption_image, image_ids)
        keys, values = [], []
        for name, objective in self._objectives.items():
            if name not in self.counted:
                continue
            view = "ranking" if objective.layout == "ranking" else "pair"
            args = views[view]
            try:
                if bounds is None:
                    counts = count_batch_values(args[0], args[1], objective, compat=self.compat,
                                                caption_image=args[2], image_ids=args[3], **self.losses[name])
                else:
                    paired = view == "pair" and self.layout == "ranking"  # the images' first captions
                    counts = count_local(args[0], args[1], objective,
                                         {"i2t": bounds[0], "t2i": bounds[0] if paired else bounds[1]},
                                         compat=self.compat, caption_image=args[2], image_ids=args[3],
                                         **self.losses[name])
            except CocosError as exc:
                raise CocosError(f"Tracker.observe at step {step}: {exc}") from None
            for direction, batch in counts.items():
                for stat in objective.stats:
                    keys.append((name, direction, stat))
                    values.append(batch[stat].reshape(()).double())
        return keys, torch.stack(values).cpu().tolist()  # one device sync per observation

    def _record(self, step: int, epoch: int, keys: list, values: list, shape: tuple[int, int]) -> None:
        """The rows of a counted batch of ``shape`` (the first fixes the tracked shape), and its TensorBoard
        values."""
        self.shape = self.shape or shape  # the batch shape tracked
        self.rows.extend((step, epoch, *key, value) for key, value in zip(keys, values, strict=True))
        if self.sink is not None:
            for (name, direction, stat), value in zip(keys, values, strict=True):
                self.sink.add_scalar(tensorboard_tag(name, direction, stat), value, step)

    # ------------------------------------------------------------------ the table and its files

    def frame(self) -> pd.DataFrame:
        """The tidy table: ``step, epoch, loss, direction, stat, value``."""
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def restore(self, frame: pd.DataFrame) -> None:
        """Rows of an earlier, resumed part of the run (observations continue after its last step); with an
        ``out_dir``, ``cocos_track.csv`` is rewritten with them at the next flush."""
        self.rows = [tuple(r) for r in frame[COLUMNS].itertuples(index=False, name=None)]
        if self.rows:
            self._last = (int(frame["step"].max()), int(frame["epoch"].max()))
        self._close_csv()  # the file no longer holds a prefix of the rows: rewritten whole, then appended to
        self._written = 0

    def write(self, path: str | os.PathLike) -> Path:
        """The table as CSV at ``path``, atomically (the float format ``cocos train`` writes); the tracker's own
        ``cocos_track.csv`` is then appended to from there. On several processes counting one batch, rank 0 alone
        writes (the others hold the same rows)."""
        if not self.writes:
            return Path(path)
        write_csv(path, self.frame(), float_format=FLOAT_FORMAT)
        if self._csv is not None and Path(path).resolve() == self.path.resolve():  # our own file, replaced
            self._close_csv()
            self._open_csv()
        return Path(path)

    def meta(self) -> dict:
        """``cocos_track.json``: the settings of the track and how each counter is shown (its
        :class:`~cocos.presentation.Presentation`, as ``results.json`` stores it: the report layer reads this,
        never the loss registry). ``counted`` is :attr:`batch` and ``ranks`` the processes whose embeddings a
        counted batch gathers (1: the batch as given)."""
        from cocos import __version__

        ranks = {n: i for i, n in enumerate(names())}
        return {"format": META_FORMAT, "format_version": META_VERSION, "cocos_version": __version__,
                "every": self.every, "compat": self.compat, "layout": self.layout,
                "batch": None if self.shape is None else {"images": self.shape[0], "captions": self.shape[1]},
                "skipped": self.skipped, "counted": self.batch, "ranks": self.group.world if self.collective else 1,
                "losses": {n: dict(self.losses[n]) for n in self.counted},
                "presentation": {n: o.presentation(ranks.get(n, LAST)).to_dict()
                                 for n, o in self._objectives.items() if n in self.counted}}

    def _write_files(self) -> None:
        """Bring ``cocos_track.csv`` up to :attr:`rows` (created atomically with every row so far where it is not
        open, appended to and flushed where it is) and ``cocos_track.json`` up to :meth:`meta` (replaced
        atomically when it changed)."""
        try:
            if self._csv is None:
                write_csv(self.path, self.frame(), float_format=FLOAT_FORMAT)
                self._open_csv()
            elif self._written < len(self.rows):
                self._csv.write(csv_lines(self.rows[self._written:]))  # one write: whole lines
                self._csv.flush()
                self._written = len(self.rows)
        except OSError as exc:
            raise CocosError(f"{self.path}: cannot write ({exc.strerror or exc})") from None
        meta = self.meta()
        if meta != self._meta_written:
            write_json(self.out_dir / TRACK_META, meta)
            self._meta_written = meta

    def flush(self) -> None:
        """Append the rows not yet in ``cocos_track.csv``, rewrite ``cocos_track.json`` if it changed (with an
        ``out_dir``), and flush the TensorBoard sink."""
        if self.out_dir is not None and self._lock is not None:
            self._write_files()
        if self.sink is not None and callable(getattr(self.sink, "flush", None)):
            self.sink.flush()

    def _open_csv(self) -> None:
        """Open ``cocos_track.csv``, which holds every row so far, to append to it."""
        try:
            self._csv = open(self.path, "a", encoding="utf-8", newline="")  # kept open: rows are appended
        except OSError as exc:
            raise CocosError(f"{self.path}: cannot write ({exc.strerror or exc})") from None
        self._written = len(self.rows)

    def _close_csv(self) -> None:
        csv_file, self._csv = getattr(self, "_csv", None), None
        if csv_file is not None:
            csv_file.close()

    def _release(self) -> None:
        """Close the CSV and release the folder's lock (no flush)."""
        try:
            self._close_csv()
        finally:
            lock, self._lock = getattr(self, "_lock", None), None
            if lock is not None:
                lock.__exit__(None, None, None)

    def close(self) -> None:
        """Flush, close a ``SummaryWriter`` the tracker opened (the caller's own stays open) and release
        ``out_dir``'s lock."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
            if self._owns_sink:
                self.sink.close()
        finally:
            self._release()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # a tracker dropped without close(): flushed and unlocked all the same
        try:
            self.close()
        except Exception:  # nothing to report to at garbage collection
            try:
                self._release()
            except Exception:
                pass
