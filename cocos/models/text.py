"""Caption encoder of VSE++ (and VSRN): word embedding -> GRU -> last state -> l2norm."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from cocos.defaults import DEFAULT_EMBED_SIZE, DEFAULT_WORD_DIM
from cocos.errors import CocosError


def xavier_linear_(layer: nn.Linear) -> None:
    """Xavier-uniform weights and zero bias, as the VSE++/VSRN image projections."""
    r = math.sqrt(6.0) / math.sqrt(layer.in_features + layer.out_features)
    with torch.no_grad():
        layer.weight.uniform_(-r, r)
        layer.bias.zero_()


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """Divide ``x`` by its L2 norm along ``dim`` (``eps`` guards against zero vectors)."""
    return x / (x.pow(2).sum(dim=dim, keepdim=True).sqrt() + eps)


class CaptionEncoder(nn.Module):
    """VSE++ ``EncoderText``: token ids ``(n, L)`` and lengths ``(n,)`` -> ``(n, embed_size)``.

    Token id 0 is padding. Lengths may come in any order; each caption's
    embedding is the top GRU layer's state after its last real token, so it does not
    depend on the padding or on the other captions in the batch. ``use_abs`` takes the
    absolute value of the normalised embedding (VSE++ ``--use_abs``; off by default).
    """

    def __init__(self, vocab_size: int, word_dim: int = DEFAULT_WORD_DIM, embed_size: int = DEFAULT_EMBED_SIZE,
                 num_layers: int = 1, use_abs: bool = False):
        super().__init__()
        self.use_abs = bool(use_abs)
        self.embed = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.rnn = nn.GRU(word_dim, embed_size, num_layers, batch_first=True)
        self.init_weights()

    def init_weights(self) -> None:
        """Word embeddings uniform in [-0.1, 0.1] as VSE++; the padding row stays zero."""
        with torch.no_grad():
            self.embed.weight.uniform_(-0.1, 0.1)
            self.embed.weight[0].zero_()

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        lengths = torch.as_tensor(lengths, dtype=torch.long).cpu()
        if tokens.dim() != 2 or lengths.shape != (tokens.shape[0],):
            raise CocosError(f"captions must be tokens (n, L) with lengths (n,), got "
                             f"{tuple(tokens.shape)} and {tuple(lengths.shape)}")
        if lengths.numel() and (lengths.min() < 1 or lengths.max() > tokens.shape[1]):
            raise CocosError(f"caption lengths must lie in [1, {tokens.shape[1]}], got "
                             f"{int(lengths.min())}..{int(lengths.max())}")
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                      enforce_sorted=False)
        _, hidden = self.rnn(packed)  # (num_layers, n, embed), back in the input order
        out = l2norm(hidden[-1])
        return out.abs() if self.use_abs else out
