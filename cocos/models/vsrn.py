"""VSRN (Li et al., 2019) on precomputed region features, without the captioning decoder."""

from __future__ import annotations

import torch
from torch import nn

from cocos.defaults import DEFAULT_EMBED_SIZE, DEFAULT_WORD_DIM
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

    Options beyond the bundled trainer's model, for checkpoints of the original code
    (:mod:`cocos.legacy`): ``fc_norm=False`` leaves out the l2norm after the
    region projection (the VSRN code does so for ``f30k_precomp``); ``norm_over_regions=True``
    makes the two l2norms of the region features (after fc and after the graph reasoning)
    normalise each channel over the regions, as the VSRN code does (its ``l2norm`` sums over
    ``dim=1`` of the ``(n, R, E)`` tensor), instead of each region over the channels;
    ``num_layers`` GRU layers in the caption encoder; ``use_abs`` (absolute value of both
    normalised embeddings). They enter ``hparams`` only when they differ from the defaults, so a
    default model's ``hparams`` and state-dict keys are those of earlier versions.
    """

    kind = "vsrn"

    def __init__(self, img_dim: int, vocab_size: int, word_dim: int = DEFAULT_WORD_DIM,
                 embed_size: int = DEFAULT_EMBED_SIZE, n_gcn: int = 4, final_bn: bool = True,
                 num_layers: int = 1, fc_norm: bool = True, use_abs: bool = False,
                 norm_over_regions: bool = False):
        super().__init__()
        self.hparams = {"img_dim": int(img_dim), "vocab_size": int(vocab_size),
                        "word_dim": int(word_dim), "embed_size": int(embed_size),
                        "n_gcn": int(n_gcn), "final_bn": bool(final_bn)}
        if int(num_layers) != 1:
            self.hparams["num_layers"] = int(num_layers)
        if not fc_norm:
            self.hparams["fc_norm"] = False
        if use_abs:
            self.hparams["use_abs"] = True
        if norm_over_regions:
            self.hparams["norm_over_regions"] = True
        self.fc_norm, self.use_abs = bool(fc_norm), bool(use_abs)
        self._region_dim = 1 if norm_over_regions else -1  # the axis the region l2norms sum over
        self.fc = nn.Linear(img_dim, embed_size)
        self.gcn = nn.ModuleList(RsGCN(embed_size) for _ in range(n_gcn))
        self.img_rnn = nn.GRU(embed_size, embed_size, 1, batch_first=True)
        self.bn = nn.BatchNorm1d(embed_size) if final_bn else nn.Identity()
        self.txt_enc = CaptionEncoder(vocab_size, word_dim, embed_size, int(num_layers), use_abs=self.use_abs)
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
        regions = self.fc(features)
        if self.fc_norm:
            regions = l2norm(regions, dim=self._region_dim)
        for layer in self.gcn:
            regions = layer(regions)
        _, hidden = self.img_rnn(l2norm(regions, dim=self._region_dim))
        out = l2norm(self.bn(hidden[-1]))
        return out.abs() if self.use_abs else out

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.txt_enc(tokens, lengths)

    def forward(self, features, tokens, lengths) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_images(features), self.encode_captions(tokens, lengths)
