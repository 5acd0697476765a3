"""Where a model's triplets lie: the (positive, hardest negative) similarity of every query, for the diagrams.

The same seeded pair batches as the counting engine (:func:`cocos.data.samplers.pair_batches`); the report
layer draws them (:func:`cocos.report.diagram.plot_triplet_diagram`).
"""

from __future__ import annotations

import numpy as np
import torch

from cocos.data.layout import DIRECTIONS, BatchLayout
from cocos.data.samplers import pair_batches
from cocos.errors import CocosError
from cocos.losses.goal import hardest_triplets


def triplet_points(emb, batch_size: int = 128, seed: int = 0, max_batches: int | None = None,
                   compat: bool = False, chunk: int = 32) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{direction: (sp, sn)}``: positive and hardest-negative similarity of every query.

    ``emb`` is an :class:`~cocos.counting.engine.EmbeddingSet` (normalised). Batches
    are the counting engine's seeded pair batches (``pair_batches(caption_image,
    batch_size, seed)``, last short batch dropped), the first ``max_batches`` of
    them; the image ids of a batch exclude same-image pairs unless ``compat``.
    Arrays are float64, batch-major then query order.
    """
    if max_batches is not None and max_batches < 1:
        raise CocosError(f"max_batches must be positive, got {max_batches}")
    batches = pair_batches(emb.caption_image, batch_size, seed)
    if max_batches is not None:
        batches = batches[:max_batches]
    cap_idx = np.stack([c for c, _ in batches])
    img_idx = np.stack([i for _, i in batches])
    device = emb.images.device
    out: dict[str, tuple[list, list]] = {d: ([], []) for d in DIRECTIONS}
    for start in range(0, len(cap_idx), chunk):
        c = torch.as_tensor(cap_idx[start : start + chunk], device=device)
        i = torch.as_tensor(img_idx[start : start + chunk], device=device)
        scores = emb.images[i] @ emb.captions[c].transpose(-1, -2)  # (nb, B, B)
        layout = BatchLayout.build(batch_size, batch_size, torch.arange(batch_size, device=device),
                                   image_ids=i)
        for d in DIRECTIONS:
            sp, sn, _ = hardest_triplets(layout.view(scores, d, compat))
            sp = sp.detach().to("cpu", torch.float64).numpy().reshape(-1)
            sn = sn.detach().to("cpu", torch.float64).numpy().reshape(-1)
            keep = ~(np.isnan(sp) | np.isnan(sn))
            out[d][0].append(sp[keep])
            out[d][1].append(sn[keep])
    return {d: (np.concatenate(sps), np.concatenate(sns)) for d, (sps, sns) in out.items()}
