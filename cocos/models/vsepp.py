"""VSE++ (Faghri et al., 2018) on precomputed image features."""

from __future__ import annotations

import torch
from torch import nn

from cocos.defaults import DEFAULT_EMBED_SIZE, DEFAULT_WORD_DIM
from cocos.errors import CocosError
from cocos.models.text import CaptionEncoder, l2norm, xavier_linear_


class VSEPP(nn.Module):
    """Image side: ``Linear(img_dim, embed_size)`` -> l2norm (VSE++ ``EncoderImagePrecomp``).

    Takes global features ``(n, img_dim)``; region features ``(n, R, img_dim)``
    are mean-pooled over the regions first. Caption side: ``CaptionEncoder``.

    Options beyond the bundled trainer's model, for checkpoints of the original code
    (:mod:`cocos.legacy`): ``num_layers`` GRU layers in the caption encoder and
    ``use_abs`` (absolute value of both normalised embeddings, VSE++ ``--use_abs``). They
    enter ``hparams`` only when they differ from the defaults, so a default model's
    ``hparams`` and state-dict keys are those of earlier versions.
    """

    kind = "vsepp"

    def __init__(self, img_dim: int, vocab_size: int, word_dim: int = DEFAULT_WORD_DIM,
                 embed_size: int = DEFAULT_EMBED_SIZE, num_layers: int = 1, use_abs: bool = False):
        super().__init__()
        self.hparams = {"img_dim": int(img_dim), "vocab_size": int(vocab_size),
                        "word_dim": int(word_dim), "embed_size": int(embed_size)}
        if int(num_layers) != 1:
            self.hparams["num_layers"] = int(num_layers)
        if use_abs:
            self.hparams["use_abs"] = True
        self.use_abs = bool(use_abs)
        self.fc = nn.Linear(img_dim, embed_size)
        self.txt_enc = CaptionEncoder(vocab_size, word_dim, embed_size, int(num_layers), use_abs=self.use_abs)
        self.init_weights()

    def init_weights(self) -> None:
        """Xavier-uniform image projection with zero bias, as VSE++."""
        xavier_linear_(self.fc)

    def encode_images(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() == 3:
            features = features.mean(dim=1)
        if features.dim() != 2 or features.shape[-1] != self.fc.in_features:
            raise CocosError(f"image features must be (n, {self.fc.in_features}) or "
                             f"(n, R, {self.fc.in_features}), got {tuple(features.shape)}")
        out = l2norm(self.fc(features))
        return out.abs() if self.use_abs else out

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.txt_enc(tokens, lengths)

    def forward(self, features, tokens, lengths) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_images(features), self.encode_captions(tokens, lengths)
