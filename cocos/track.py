"""COCOS in anyone's training loop: :class:`Tracker` (``docs/tracking.md``).

``Tracker(out_dir, every=N).observe(step, image_emb, caption_emb)`` counts the training
batch's COCOS statistics every ``N`` steps, with no effect on training, into the
``cocos_track.csv`` that ``cocos train --track-cocos N`` writes (and, with
``tensorboard=True``, TensorBoard). Each counted step's rows are appended to the file, which the tracker
keeps open and its folder locked (one writer per folder) until ``close()``. The class lives in the training
layer (:mod:`cocos.training.track`), where ``cocos train`` uses the same one.
"""

from cocos.training.track import COLUMNS, Tracker, tensorboard_tag

__all__ = ["COLUMNS", "Tracker", "tensorboard_tag"]
