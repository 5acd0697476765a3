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
  counted batch. A due batch of another shape is not counted; :attr:`Tracker.skipped`
  counts them (as ``cocos train`` skips an epoch's short final batch).
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

Observing has no effect on the caller's training: the embeddings are detached and
counted under ``torch.no_grad`` (the grad mode is restored on return), no random
numbers are drawn, and the model is never called. A counted observation costs one
device sync. With ``out_dir``, ``cocos_track.csv`` (columns ``step, epoch, loss,
direction, stat, value``, as ``cocos train`` writes it) is rewritten atomically
after each counted observation (``autoflush``) and at :meth:`Tracker.flush` /
:meth:`Tracker.close`; a folder that holds a track already is refused unless ``overwrite=True``.
With ``tensorboard`` the same values go to a ``SummaryWriter`` (one written into
``out_dir``, or any object with ``add_scalar(tag, value, global_step)``) under
:func:`tensorboard_tag`. On several processes, observe on one (rank 0).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cocos.counting import count_queries
from cocos.counting.engine import counter_settings, resolve_losses
from cocos.errors import CocosError
from cocos.io import write_csv, write_json
from cocos.objectives import counter_params, get_objective, names, order, paper_names
from cocos.presentation import LAST
from cocos.training.logs import TRACK_COLUMNS, TRACK_LOG, TRACK_META

COLUMNS = list(TRACK_COLUMNS)
META_FORMAT, META_VERSION = "cocos-track", 1
TENSORBOARD_HINT = "pip install tensorboard (or 'cocos[tensorboard]')"


def tensorboard_tag(loss: str, direction: str, stat: str) -> str:
    """``cocos/<loss>/<direction>/<stat>``; a statistic's trailing sign is spelled out (``W_qv+`` ->
    ``W_qv_pos``, ``C_qv-`` -> ``C_qv_neg``) and any other character TensorBoard refuses in a tag becomes ``_``."""
    stat = re.sub(r"\+$", "_pos", re.sub(r"-$", "_neg", stat))
    return "/".join(re.sub(r"[^-\w.]", "_", part) for part in ("cocos", loss, direction, stat))


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise CocosError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def _folder(out_dir, overwrite: bool) -> Path | None:
    """``out_dir`` as a folder that exists (created with its parents); None stays None. A folder that holds a
    track already (an earlier run's, or a ``cocos train`` run's) is refused unless ``overwrite``."""
    if out_dir is None:
        return None
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CocosError(f"{out_dir}: exists and is not a folder")
    held = [name for name in (TRACK_LOG, TRACK_META) if (out_dir / name).exists()]
    if held and not overwrite:
        raise CocosError(f"{out_dir}: holds {' and '.join(held)} already; choose another folder or pass "
                         "overwrite=True to replace them")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CocosError(f"{out_dir}: cannot create the folder ({exc.strerror or exc})") from None
    return out_dir


def _sink(tensorboard, out_dir: Path | None):
    """The TensorBoard sink: None, a ``SummaryWriter`` of our own into ``out_dir`` (``True``), or the caller's
    object with ``add_scalar``. Returns ``(sink, owned)``."""
    if tensorboard is None or tensorboard is False:
        return None, False
    if tensorboard is True:
        if out_dir is None:
            raise CocosError("tensorboard=True writes into out_dir; give an out_dir or pass your own SummaryWriter")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise CocosError(f"tensorboard=True needs the tensorboard package: {TENSORBOARD_HINT}") from None
        return SummaryWriter(log_dir=str(out_dir)), True
    if not callable(getattr(tensorboard, "add_scalar", None)):
        raise CocosError(f"tensorboard must be True, False or an object with add_scalar(tag, value, global_step) "
                         f"(a SummaryWriter), got {type(tensorboard).__name__}")
    return tensorboard, False


class Tracker:
    """COCOS of the training batch every ``every`` steps (see the module docstring); :meth:`frame` gives the tidy
    table, ``cocos_track.csv`` in ``out_dir`` (None: kept in memory only, :meth:`write` writes it).

    ``losses``/``params``/``eps`` choose the counters, ``compat`` the counting mode, ``batch_size`` the images per
    counted batch (None: the first counted batch's), ``tensorboard`` a TensorBoard sink, ``autoflush`` whether the
    CSV is rewritten after every counted observation (the whole file each time: ``autoflush=False`` and an
    occasional :meth:`flush` for a very long track), ``overwrite`` whether an ``out_dir`` that holds a track
    already may be replaced (otherwise one :class:`CocosError` line).
    """

    def __init__(self, out_dir: str | os.PathLike | None = None, every: int = 1, losses=None, *,
                 params: dict | None = None, eps: float | None = None, compat: bool = False,
                 batch_size: int | None = None, tensorboard=False, autoflush: bool = True,
                 overwrite: bool = False) -> None:
        self.every = _positive_int(every, "every (count every N steps)")
        self.compat, self.autoflush = bool(compat), bool(autoflush)
        self.batch_size = None if batch_size is None else _positive_int(batch_size, "batch_size")
        self.default = losses is None  # the paper's four, less those the batches cannot serve
        objectives = resolve_losses(losses)
        self._objectives = {o.name: o for o in objectives}
        self.losses = counter_settings(objectives, dict(params or {}), eps)
        self.layout: str | None = None  # "pair" or "ranking": fixed by the first counted batch (or the trainer)
        self.shape: tuple[int, int] | None = None  # (images, captions) of a counted batch
        self.skipped = 0
        self.rows: list[tuple] = []
        self._last = (0, 0)  # the last (step, epoch) observed
        self._closed = False
        self.out_dir = _folder(out_dir, overwrite)
        self.sink, self._owns_sink = _sink(tensorboard, self.out_dir)

    @classmethod
    def for_training(cls, every: int, loss: str, loss_params: dict, batch_layout: str, compat: bool = False,
                     **kw) -> Tracker:
        """``cocos train``'s tracker: the training loss first, then the paper's counters the run's batches serve
        (a pair run has no SmoothAP), each at the paper's defaults or the training loss's own parameters where it
        shares them (:func:`cocos.objectives.counter_params`); ``batch_layout`` is the run's."""
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise CocosError(f"--track-cocos must be at least 1 (count every N steps), got {every}")
        names = order([loss, *paper_names()])
        if batch_layout == "pair":  # a pair batch cannot serve a ranking counter (k captions per image)
            names = [n for n in names if n == loss or get_objective(n).layout == "pair"]
        params = counter_params(loss, loss_params, names)
        tracker = cls(every=every, losses=names, params={n: params[n] for n in names if params.get(n)},
                      compat=compat, **kw)
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
        counted = False
        if self.due(step) and fresh:
            images, captions = self._tensors(step, image_emb, caption_emb)
            if self._fits(images, captions):
                self._count(step, epoch, images, captions, caption_image, image_ids)
                counted = True
            else:
                self.skipped += 1
        self._last = (step, epoch)  # after the checks: a refused observation leaves the tracker as it was
        if counted and self.autoflush:
            self.flush()
        return counted

    def _tensors(self, step: int, image_emb, caption_emb) -> tuple[torch.Tensor, torch.Tensor]:
        """Both embeddings as detached 2-D tensors of one width on one device (one error line otherwise)."""
        images = torch.as_tensor(image_emb.detach() if isinstance(image_emb, torch.Tensor) else image_emb)
        captions = torch.as_tensor(caption_emb.detach() if isinstance(caption_emb, torch.Tensor) else caption_emb,
                                   device=images.device)
        if images.ndim != 2 or captions.ndim != 2 or images.shape[1] != captions.shape[1] or not len(images):
            raise CocosError(f"Tracker.observe at step {step}: image_emb (B, d) and caption_emb (M, d) must be 2-D "
                             f"with the same d, got {tuple(images.shape)} and {tuple(captions.shape)}")
        return images, captions

    def _fits(self, images: torch.Tensor, captions: torch.Tensor) -> bool:
        """Whether the batch has the tracked shape; the first batch that fits ``batch_size`` fixes it."""
        shape = (int(images.shape[0]), int(captions.shape[0]))
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

    @torch.no_grad()
    def _count(self, step: int, epoch: int, images, captions, caption_image, image_ids) -> None:
        views = self._views(step, images, captions, caption_image, image_ids)
        keys, values = [], []
        for name, objective in self._objectives.items():
            if name not in self.counted:
                continue
            args = views["ranking" if objective.layout == "ranking" else "pair"]
            try:
                counts = count_queries(args[0], args[1], objective, compat=self.compat, caption_image=args[2],
                                       image_ids=args[3], **self.losses[name])
            except CocosError as exc:
                raise CocosError(f"Tracker.observe at step {step}: {exc}") from None
            for direction, count in counts.items():
                for stat in objective.stats:
                    keys.append((name, direction, stat))
                    values.append(count.batch[stat].reshape(()).double())
        values = torch.stack(values).cpu().tolist()  # one device sync per observation
        self.shape = self.shape or (int(images.shape[0]), int(captions.shape[0]))  # the batch shape tracked
        self.rows.extend((step, epoch, *key, value) for key, value in zip(keys, values, strict=True))
        if self.sink is not None:
            for (name, direction, stat), value in zip(keys, values, strict=True):
                self.sink.add_scalar(tensorboard_tag(name, direction, stat), value, step)

    # ------------------------------------------------------------------ the table and its files

    def frame(self) -> pd.DataFrame:
        """The tidy table: ``step, epoch, loss, direction, stat, value``."""
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def restore(self, frame: pd.DataFrame) -> None:
        """Rows of an earlier, resumed part of the run (observations continue after its last step)."""
        self.rows = [tuple(r) for r in frame[COLUMNS].itertuples(index=False, name=None)]
        if self.rows:
            self._last = (int(frame["step"].max()), int(frame["epoch"].max()))

    def write(self, path: str | os.PathLike) -> Path:
        """The table as CSV at ``path``, atomically (the float format ``cocos train`` writes)."""
        write_csv(path, self.frame(), float_format="%.10g")
        return Path(path)

    def meta(self) -> dict:
        """``cocos_track.json``: the settings of the track and how each counter is shown (its
        :class:`~cocos.presentation.Presentation`, as ``results.json`` stores it: the report layer reads this,
        never the loss registry)."""
        from cocos import __version__

        ranks = {n: i for i, n in enumerate(names())}
        return {"format": META_FORMAT, "format_version": META_VERSION, "cocos_version": __version__,
                "every": self.every, "compat": self.compat, "layout": self.layout,
                "batch": None if self.shape is None else {"images": self.shape[0], "captions": self.shape[1]},
                "skipped": self.skipped, "losses": {n: dict(self.losses[n]) for n in self.counted},
                "presentation": {n: o.presentation(ranks.get(n, LAST)).to_dict()
                                 for n, o in self._objectives.items() if n in self.counted}}

    def flush(self) -> None:
        """Rewrite ``cocos_track.csv`` and ``cocos_track.json`` (with an ``out_dir``) and flush the TensorBoard
        sink."""
        if self.out_dir is not None:
            self.write(self.path)
            write_json(self.out_dir / TRACK_META, self.meta())
        if self.sink is not None and callable(getattr(self.sink, "flush", None)):
            self.sink.flush()

    def close(self) -> None:
        """Flush, and close a ``SummaryWriter`` the tracker opened (the caller's own stays open)."""
        if self._closed:
            return
        self.flush()
        if self._owns_sink:
            self.sink.close()
        self._closed = True

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

