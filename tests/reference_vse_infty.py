"""An independent oracle for cocos's VSE∞ (``cocos.models.vse_infty``): woodfrog/vse_infty's forward pass restated.

Each piece restates, in our own plain torch + transformers code, the module of the reference repository named in its
docstring (woodfrog/vse_infty, ``lib/...``); the parameter names are the reference's, so a state dict of either loads
into the other. Two deliberate departures, both forced by the test setting and not by the model:

* ``EncoderText`` builds its ``BertModel`` from a ``BertConfig`` dict instead of ``from_pretrained('bert-base-uncased')``
  (nothing is downloaded), and its ``linear`` reads the config's ``hidden_size`` instead of the literal 768;
* ``process_caption`` takes each basic word's WordPiece sub-tokens already split (transformers 5 has no slow
  tokenizer with ``basic_tokenizer`` / ``wordpiece_tokenizer``), and an explicit ``random.Random``.

It imports nothing from ``cocos``: the tests compare the two computations.
"""

from __future__ import annotations

import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import BertConfig, BertModel


def l2norm(x: torch.Tensor, dim: int, eps: float = 1e-8) -> torch.Tensor:
    """``lib/encoders.py: l2norm``: x / (||x|| + eps), the eps added to the norm (not clamped)."""
    return x / (x.pow(2).sum(dim=dim, keepdim=True).sqrt() + eps)


def positional_encoding_1d(d_model: int, length: int) -> torch.Tensor:
    """``lib/modules/aggr/gpo.py: positional_encoding_1d``: (length, d_model) sin on even columns, cos on odd."""
    if d_model % 2 != 0:
        raise ValueError(f"odd d_model {d_model}")
    pe = torch.zeros(length, d_model)
    position = torch.arange(0, length).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


class GPO(nn.Module):
    """``lib/modules/aggr/gpo.py: GPO``: generalized pooling operator.

    Pooling weights: a bidirectional GRU over the positional encodings of positions 0..n-1 (packed by length, padded
    positions' encodings zeroed), the two directions averaged, a bias-free linear to one score, padded scores set to
    -10000, softmax over positions at temperature 0.1. Pooled: each feature dimension sorted descending over the
    valid positions (padding filled with -10000 before the sort, 0 after), weighted and summed.
    """

    def __init__(self, d_pe: int = 32, d_hidden: int = 32) -> None:
        super().__init__()
        self.d_pe = d_pe
        self.d_hidden = d_hidden
        self.gru = nn.GRU(d_pe, d_hidden, 1, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(d_hidden, 1, bias=False)

    def compute_pool_weights(self, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        max_len = int(lengths.max())
        b = lengths.size(0)
        pes = positional_encoding_1d(self.d_pe, max_len).unsqueeze(0).repeat(b, 1, 1)
        mask = (torch.arange(max_len).expand(b, max_len) < lengths.long().unsqueeze(1)).unsqueeze(-1)
        pes = pes.masked_fill(mask == 0, 0)
        packed = pack_padded_sequence(pes, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out_emb, _ = pad_packed_sequence(out, batch_first=True)
        half = out_emb.size(2) // 2
        out_emb = (out_emb[:, :, :half] + out_emb[:, :, half:]) / 2
        scores = self.linear(out_emb)
        scores[torch.where(mask == 0)] = -10000
        return torch.softmax(scores / 0.1, 1), mask

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights, mask = self.compute_pool_weights(lengths)
        features = features[:, : int(lengths.max()), :]
        ranked = features.masked_fill(mask == 0, -10000).sort(dim=1, descending=True)[0]
        ranked = ranked.masked_fill(mask == 0, 0)
        return (ranked * weights).sum(1), weights


class MLP(nn.Module):
    """``lib/modules/mlp.py: MLP``: Linear -> BatchNorm1d -> ReLU per hidden layer, a last Linear; the input (B, N, D)
    is flattened to B*N rows (padded rows included), so BatchNorm's batch statistics are over all B*N rows."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        self.output_dim = output_dim
        self.num_layers = num_layers
        h = [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in zip([input_dim] + h, h + [output_dim], strict=True))
        self.bns = nn.ModuleList(nn.BatchNorm1d(k) for k in h + [output_dim])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.size()
        x = x.reshape(b * n, d)
        for i, (bn, layer) in enumerate(zip(self.bns, self.layers, strict=True)):
            x = F.relu(bn(layer(x))) if i < self.num_layers - 1 else layer(x)
        return x.view(b, n, self.output_dim)


class EncoderImageAggr(nn.Module):
    """``lib/encoders.py: EncoderImageAggr``: fc(x) (+ MLP(x) for "basic"; none for "backbone", the grid features of
    EncoderImageFull), GPO over the regions, l2norm. ``forward`` returns the embeddings; ``pool_weights`` is set to
    GPO's weights of the last call (the reference drops them)."""

    def __init__(self, img_dim: int, embed_size: int, precomp_enc_type: str = "basic") -> None:
        super().__init__()
        self.precomp_enc_type = precomp_enc_type
        self.fc = nn.Linear(img_dim, embed_size)
        if precomp_enc_type == "basic":
            self.mlp = MLP(img_dim, embed_size // 2, embed_size, 2)
        self.gpool = GPO(32, 32)
        self.pool_weights = None

    def forward(self, images: torch.Tensor, image_lengths: torch.Tensor) -> torch.Tensor:
        features = self.fc(images)
        if self.precomp_enc_type == "basic":
            features = self.mlp(images) + features
        features, self.pool_weights = self.gpool(features, image_lengths)
        return l2norm(features, dim=-1)


class EncoderText(nn.Module):
    """``lib/encoders.py: EncoderText``: BERT with attention mask (x != 0), linear(hidden -> embed) of the last hidden
    states, GPO over the caption's tokens (its given length), l2norm. The BertModel is built from ``bert_config`` (a
    BertConfig dict), with its pooler as from_pretrained's."""

    def __init__(self, bert_config: dict, embed_size: int) -> None:
        super().__init__()
        cfg = BertConfig(**bert_config)
        self.bert = BertModel(cfg)
        self.linear = nn.Linear(cfg.hidden_size, embed_size)
        self.gpool = GPO(32, 32)
        self.pool_weights = None

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        bert_emb = self.bert(input_ids=x, attention_mask=(x != 0).float())[0]
        cap_emb = self.linear(bert_emb)
        pooled, self.pool_weights = self.gpool(cap_emb, lengths)
        return l2norm(pooled, dim=-1)


def collate_regions(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``lib/datasets/image_caption.py: collate_fn`` (region features): zero-pad to the longest; lengths as floats."""
    lengths = [len(im) for im in images]
    out = torch.zeros(len(images), max(lengths), images[0].size(-1))
    for i, im in enumerate(images):
        out[i, : lengths[i]] = im
    return out, torch.Tensor(lengths)


def collate_captions(captions: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """``lib/datasets/image_caption.py: collate_fn`` (captions): 0-padded long ids, lengths as ints."""
    lengths = [len(c) for c in captions]
    targets = torch.zeros(len(captions), max(lengths)).long()
    for i, c in enumerate(captions):
        targets[i, : lengths[i]] = torch.as_tensor(c, dtype=torch.long)
    return targets, lengths


def process_caption(words_subtokens: list[list[str]], vocab: dict, train: bool, rng: random.Random) -> list[int]:
    """``lib/datasets/image_caption.py: process_caption``, given each basic word's sub-tokens.

    Per word one ``rng.random()`` (drawn in eval too); in training, with probability 0.2 the word is altered: its
    sub-tokens all become [MASK] (half of that), each a ``rng.choice(list(vocab.keys()))`` (a tenth), or the word is
    dropped (the rest). Then [CLS] ... [SEP] and the ids (a token not in ``vocab`` -> [UNK], as
    convert_tokens_to_ids)."""
    out: list[str] = []
    deleted: list[int] = []
    for sub_tokens in words_subtokens:
        prob = rng.random()
        if prob < 0.20 and train:
            prob /= 0.20
            if prob < 0.5:
                out.extend("[MASK]" for _ in sub_tokens)
            elif prob < 0.6:
                for _ in sub_tokens:
                    out.append(rng.choice(list(vocab.keys())))
            else:
                for sub_token in sub_tokens:
                    out.append(sub_token)
                    deleted.append(len(out) - 1)
        else:
            out.extend(sub_tokens)
    if deleted:
        out = [t for i, t in enumerate(out) if i not in deleted]
    out = ["[CLS]"] + out + ["[SEP]"]
    return [vocab.get(t, vocab["[UNK]"]) for t in out]


def contrastive_loss(im: torch.Tensor, s: torch.Tensor, margin: float = 0.0, max_violation: bool = False
                     ) -> torch.Tensor:
    """``lib/loss.py: ContrastiveLoss``: scores im @ s.T; hinge [margin + s_ij - s_ii]_+ over the row (captions for
    an image) and [margin + s_ij - s_jj]_+ over the column (images for a caption), diagonal cleared; summed over all
    negatives, or only the largest per query with ``max_violation``."""
    scores = im.mm(s.t())
    diagonal = scores.diag().view(im.size(0), 1)
    cost_s = (margin + scores - diagonal.expand_as(scores)).clamp(min=0)
    cost_im = (margin + scores - diagonal.t().expand_as(scores)).clamp(min=0)
    eye = torch.eye(scores.size(0), dtype=torch.bool, device=scores.device)
    cost_s = cost_s.masked_fill(eye, 0)
    cost_im = cost_im.masked_fill(eye, 0)
    if max_violation:
        cost_s = cost_s.max(1)[0]
        cost_im = cost_im.max(0)[0]
    return cost_s.sum() + cost_im.sum()
