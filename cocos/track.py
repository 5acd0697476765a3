"""COCOS in anyone's training loop: :class:`Tracker` (``docs/tracking.md``).

``Tracker(out_dir, every=N).observe(step, image_emb, caption_emb)`` counts the training
batch's COCOS statistics every ``N`` steps, with no effect on training, into the
``cocos_track.csv`` that ``cocos train --track-cocos N`` writes (and, with
``tensorboard=True``, TensorBoard). Each counted step's rows are appended to the file, which the tracker
keeps open and its folder locked (one writer per folder) until ``close()``. Under ``torch.distributed``
(torchrun), made on every rank, it counts the batch the loss sees: every rank's embeddings gathered, the global
batch (``batch="global"``, the default), or each rank's queries against all candidates (``batch="local"``,
open_clip's ``local_loss``); ``batch="given"`` counts what it is given, with no collective. Rank 0 writes. The
class lives in the training layer (:mod:`cocos.training.track`), where ``cocos train`` uses the same one.
"""

from cocos.training.track import COLUMNS, Tracker, tensorboard_tag

__all__ = ["COLUMNS", "Tracker", "tensorboard_tag"]
