"""COCOS during training: the statistics of the current training batch, every ``N`` steps.

``cocos train --track-cocos N`` counts, at steps 1, N+1, 2N+1, ... (step 1 is the
model at initialisation: the counts come from the embeddings of the step's forward
pass, before its update), the batch's COCOS statistics for the training loss and the
four closed-form counters of the COCOS paper, from the embeddings the step already
computed: no extra forward pass, no gradient, no random numbers (training is the
same with and without tracking).

Which counters a batch can serve follows from its layout (``docs/definitions.md``,
"Notation"): a pair batch (Triplet, Triplet SH, NT-Xent training) serves the pair
counters; SmoothAP needs a ranking batch (``k`` captions per image), so it is tracked
only in runs with ranking batches. A ranking batch serves the pair counters through
the pair batch of its images, each with its first caption. Counter parameters are
the paper's defaults, or the training loss's own where it shares them
(:func:`cocos.objectives.counter_params`), in the run's counting mode. As in
counting a whole split, only batches of the configured size are counted: a due
step that falls on an epoch's short final batch is skipped (counts depend on B).

The result is tidy: one row per (step, epoch, loss, direction, stat) with ``value``
= the statistic's mean over the batch's queries (the value a row of ``batches.csv``
holds), written to ``cocos_track.csv``.
"""

from __future__ import annotations

import pandas as pd
import torch

from cocos.counting import count_queries
from cocos.errors import CocosError
from cocos.objectives import counter_params, get_objective, order, paper_names

COLUMNS = ["step", "epoch", "loss", "direction", "stat", "value"]


class CocosTracker:
    """Counts the training batch every ``every`` steps; :meth:`frame` gives the tidy table."""

    def __init__(self, every: int, loss: str, loss_params: dict, batch_layout: str, compat: bool = False) -> None:

        if every < 1:
            raise CocosError(f"--track-cocos must be at least 1 (count every N steps), got {every}")
        self.every, self.compat, self.batch_layout = int(every), bool(compat), batch_layout
        names = order([loss, *paper_names()])
        if batch_layout == "pair":  # a pair batch cannot serve a ranking counter (k captions per image)
            names = [n for n in names if n == loss or get_objective(n).layout == "pair"]
        params = counter_params(loss, loss_params, names)
        self.losses = {n: params.get(n, {}) for n in names}
        self.stats = {n: get_objective(n).stats for n in names}
        self.rows: list[tuple] = []

    def due(self, step: int) -> bool:
        return (step - 1) % self.every == 0

    @torch.no_grad()
    def observe(self, step: int, epoch: int, images: torch.Tensor, captions: torch.Tensor, caption_image=None,
                image_ids=None) -> None:
        """Count one batch (the step's own embeddings; detached here) and keep its rows."""

        images, captions = images.detach(), captions.detach()
        pair_view = None
        if self.batch_layout == "ranking":  # the pair batch of the step's images, each with its first caption
            k = captions.shape[0] // images.shape[0]
            pair_view = (images, captions[::k], None, image_ids)
        keys, values = [], []
        for name, params in self.losses.items():
            layout = get_objective(name).layout
            args = pair_view if (pair_view is not None and layout == "pair") else (images, captions, caption_image,
                                                                                    image_ids)
            counts = count_queries(args[0], args[1], name, compat=self.compat, caption_image=args[2],
                                   image_ids=args[3], **params)
            for direction, count in counts.items():
                for stat in self.stats[name]:
                    keys.append((name, direction, stat))
                    values.append(count.batch[stat].reshape(()).double())
        values = torch.stack(values).cpu().tolist()  # one device sync per observation
        self.rows.extend((step, epoch, *key, value) for key, value in zip(keys, values, strict=True))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def restore(self, frame: pd.DataFrame) -> None:
        """Rows of an earlier, resumed part of the run."""
        self.rows = [tuple(r) for r in frame[COLUMNS].itertuples(index=False, name=None)]
