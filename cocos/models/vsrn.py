"""VSRN (Li et al., 2019) on precomputed region features, without the captioning decoder."""

from __future__ import annotations

import torch
from torch import nn

from cocos.errors import CocosError
from cocos.models.text import CaptionEncoder, l2norm, xavier_linear_


class RsGCN(nn.Module):
    """VSRN's ``Rs_GCN``: one graph-reasoning (non-local) layer over the regions.

    For regions ``v`` of shape ``(n, R, C)``: ``A = theta(v) phi(v)^T / R``,
    output ``BN(W(A g(v))) + v``. theta, phi, g and W are the 1x1 convolutions
    of the original, written as ``nn.Linear`` over the channel axis. The
    BatchNorm starts with zero weight and bias, so at init the layer is the
    identity.
    """

    def __init__(self, channels: int, inter_channels: int | None = None):
        super().__init__()
        inter = inter_channels or channels
        self.theta = nn.Linear(channels, inter)
        self.phi = nn.Linear(channels, inter)
        self.g = nn.Linear(channels, inter)
        self.W = nn.Linear(inter, channels)
        self.bn = nn.BatchNorm1d(channels)
        nn.init.zeros_(self.bn.weight)
        nn.init.zeros_(self.bn.bias)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        affinity = self.theta(v) @ self.phi(v).transpose(1, 2) / v.shape[1]  # (n, R, R)
        y = self.W(affinity @ self.g(v))  # (n, R, C)
        y = self.bn(y.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d wants (n, C, R)
        return y + v


class VSRN(nn.Module):
    """Image side of VSRN (``EncoderImagePrecompAttn``):

    regions ``(n, R, img_dim)`` -> Linear (Xavier) -> l2norm -> ``n_gcn`` x RsGCN
    -> l2norm -> GRU over the regions -> final hidden state -> BatchNorm1d
    (``final_bn``, as the reference code) -> l2norm. Global features
    ``(n, img_dim)`` are treated as one region. Caption side: ``CaptionEncoder``.
    """

    kind = "vsrn"

    def __init__(self, img_dim: int, vocab_size: int, word_dim: int = 300,
                 embed_size: int = 1024, n_gcn: int = 4, final_bn: bool = True):
        super().__init__()
        self.hparams = {"img_dim": int(img_dim), "vocab_size": int(vocab_size),
                        "word_dim": int(word_dim), "embed_size": int(embed_size),
                        "n_gcn": int(n_gcn), "final_bn": bool(final_bn)}
        self.fc = nn.Linear(img_dim, embed_size)
        self.gcn = nn.ModuleList(RsGCN(embed_size) for _ in range(n_gcn))
        self.img_rnn = nn.GRU(embed_size, embed_size, 1, batch_first=True)
        self.bn = nn.BatchNorm1d(embed_size) if final_bn else nn.Identity()
        self.txt_enc = CaptionEncoder(vocab_size, word_dim, embed_size)
        self.init_weights()

    def init_weights(self) -> None:
        """Xavier-uniform region projection with zero bias, as VSRN."""
        xavier_linear_(self.fc)

    def encode_images(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() == 2:
            features = features.unsqueeze(1)
        if features.dim() != 3 or features.shape[-1] != self.fc.in_features:
            raise CocosError(f"image features must be (n, R, {self.fc.in_features}) or "
                             f"(n, {self.fc.in_features}), got {tuple(features.shape)}")
        regions = l2norm(self.fc(features))
        for layer in self.gcn:
            regions = layer(regions)
        _, hidden = self.img_rnn(l2norm(regions))
        return l2norm(self.bn(hidden[-1]))

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.txt_enc(tokens, lengths)

    def forward(self, features, tokens, lengths) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_images(features), self.encode_captions(tokens, lengths)
