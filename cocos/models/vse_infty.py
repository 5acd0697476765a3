"""VSE∞ (Chen et al., CVPR 2021): region or grid features and BERT tokens, each pooled by GPO.

The model of the GOAL paper's main tables (definitions file, section 20). As ``woodfrog/vse_infty``
(``lib/encoders.py``, ``lib/modules/aggr/gpo.py``, ``lib/modules/mlp.py``):

* **Image, regions** (:class:`EncoderImageAggr`, ``precomp_enc_type="basic"``): the ``(n, R, d)`` features
  through ``fc = Linear(d, E)`` (Xavier-uniform, zero bias) plus, as a residual, a two-layer MLP with BatchNorm
  (``Linear(d, E/2)``, BN, ReLU, ``Linear(E/2, E)``; the BatchNorm's statistics are over every row of the padded
  batch, padding included, as theirs), then GPO, then l2norm.
* **Image, grid** (:class:`VSEInftyFull`, ``precomp_enc_type="backbone"``): a CNN's last feature map
  (``(n, H*W, C)``, :meth:`cocos.models.cnn.ResNet.grid`) through ``fc`` and GPO (no MLP).
* **Text** (:class:`EncoderText`): a BERT (``transformers.BertModel``, attention mask ``tokens != 0``) ->
  ``Linear(hidden, E)`` -> GPO over the tokens (``[CLS]`` and ``[SEP]`` included) -> l2norm.
* **GPO** (:class:`GPO`): the pooling weights of a set of ``L`` vectors come from a bidirectional GRU (32 units)
  run over the sinusoidal positional encodings (32-d) of positions ``0..L-1``, its two directions averaged,
  a ``Linear(32, 1)`` score per position, ``softmax(score / 0.1)`` over the positions; each dimension's ``L``
  values are sorted in descending order and summed with these weights. The weights depend on ``L`` only.
* **Size augmentation** (training only): each region is dropped with probability ``region_drop`` (0.2), the
  kept ones moved to the front and the rest zero-padded (theirs: in the data loader, with numpy's RNG; here in
  the forward pass with torch's, so a seed fixes it and a resumed run continues it). Deviation: an image keeps
  at least one region (theirs could keep none, and GPO then fails). The grid variant drops as theirs: with
  probability 0.8 an image drops each cell with probability ``0.2 * u`` (``u`` uniform), else keeps them all.

The state dict's names are theirs, under ``img_enc.`` and ``txt_enc.``: a ``model_best.pth`` of vse_infty
(``['model'] = [img_enc state, txt_enc state]``) loads by prefixing (:mod:`cocos.legacy`). ``transformers`` is
imported when a text encoder is built: a missing one is one line naming the extra to install.
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from cocos.errors import CocosError
from cocos.models.cnn import CNN_TYPES, build_cnn, load_cnn_weights, strip_classifier
from cocos.models.image import PixelModel
from cocos.models.text import l2norm, xavier_linear_

BERT_INSTALL = "VSE∞'s caption encoder is a BERT: pip install 'cocos[bert]' (transformers)"
REGION_DROP = 0.2  # VSE∞'s size augmentation: each region dropped with this probability while training
GPO_DIM = 32  # GPO's positional encodings and GRU units (VSE∞'s GPO(32, 32))
GPO_TEMPERATURE = 0.1
BERT_CHUNKS = 4  # a caption batch runs through BERT in up to this many chunks of similar lengths ...
BERT_CHUNK_ROWS = 32  # ... of at least this many captions each


def positional_encoding(d: int, length: int) -> torch.Tensor:
    """The ``(length, d)`` sinusoidal positional encodings: ``sin`` in even, ``cos`` in odd columns."""
    if d % 2:
        raise CocosError(f"positional encodings need an even dimension, got {d}")
    position = torch.arange(length, dtype=torch.float).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float) * -(math.log(10000.0) / d))
    pe = torch.zeros(length, d)
    pe[:, 0::2] = torch.sin(position * freq)
    pe[:, 1::2] = torch.cos(position * freq)
    return pe


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``(n, width)`` bool: position ``j`` of row ``i`` is one of its ``lengths[i]`` vectors."""
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


class GPO(nn.Module):
    """The Generalised Pooling Operator (module docstring): ``forward(features (n, L, d), lengths (n,))`` ->
    ``(pooled (n, d), weights (n, L, 1))``.

    The weights depend on the lengths alone, so on the CPU the GRU runs once per distinct length in the batch, not
    once per row (theirs runs it per row; the result is the same)."""

    def __init__(self, d_pe: int = GPO_DIM, d_hidden: int = GPO_DIM):
        super().__init__()
        self.d_pe, self.d_hidden = d_pe, d_hidden
        self.gru = nn.GRU(d_pe, d_hidden, 1, batch_first=True, bidirectional=True)
        self.linear = nn.Linear(d_hidden, 1, bias=False)
        self._pe: dict[tuple, torch.Tensor] = {}  # (length, device) -> encodings

    def encodings(self, length: int, device) -> torch.Tensor:
        key = (length, str(device))
        if key not in self._pe:
            self._pe[key] = positional_encoding(self.d_pe, length).to(device)
        return self._pe[key]

    def pool_weights(self, lengths: torch.Tensor) -> torch.Tensor:
        """``(n, max(lengths), 1)``: the softmax pooling weights of each row, 0 beyond its length."""
        lengths = lengths.long()
        width = int(lengths.max())
        if lengths.device.type == "cpu":  # one GRU run per distinct length (on a GPU one run per row costs no more)
            distinct, inverse = torch.unique(lengths, return_inverse=True)
        else:
            distinct, inverse = lengths, None
        pes = self.encodings(width, lengths.device).unsqueeze(0).repeat(len(distinct), 1, 1)
        pes = pes.masked_fill(~length_mask(distinct, width).unsqueeze(-1), 0)
        packed = pack_padded_sequence(pes, distinct.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=width)
        out = (out[:, :, : self.d_hidden] + out[:, :, self.d_hidden:]) / 2
        scores = self.linear(out)
        scores = scores if inverse is None else scores[inverse]  # (n, width, 1)
        mask = length_mask(lengths, width).unsqueeze(-1)
        return torch.softmax(scores.masked_fill(~mask, -10000) / GPO_TEMPERATURE, 1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = lengths.to(features.device).long()
        weights = self.pool_weights(lengths)
        width = weights.shape[1]
        mask = length_mask(lengths, width).unsqueeze(-1)
        ranked = features[:, :width].masked_fill(~mask, -10000).sort(dim=1, descending=True)[0]
        return (ranked.masked_fill(~mask, 0) * weights).sum(1), weights


class MLP(nn.Module):
    """VSE∞'s ``MLP``: ``num_layers`` Linear layers, BatchNorm and ReLU between them (the last BatchNorm exists but is
    not used, as theirs); over ``(n, R, d)`` rows, the BatchNorm taking every row of the batch."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int):
        super().__init__()
        self.output_dim, self.num_layers = output_dim, num_layers
        hidden = [hidden_dim] * (num_layers - 1)
        sizes = zip([input_dim, *hidden], [*hidden, output_dim], strict=True)
        self.layers = nn.ModuleList(nn.Linear(n, k) for n, k in sizes)
        self.bns = nn.ModuleList(nn.BatchNorm1d(k) for k in [*hidden, output_dim])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, r, d = x.shape
        x = x.reshape(n * r, d)
        for i, (bn, layer) in enumerate(zip(self.bns, self.layers, strict=True)):
            x = torch.relu(bn(layer(x))) if i < self.num_layers - 1 else layer(x)
        return x.view(n, r, self.output_dim)


class EncoderImageAggr(nn.Module):
    """Region (``basic``: fc + MLP residual) or grid (``backbone``: fc) features -> GPO -> l2norm."""

    def __init__(self, img_dim: int, embed_size: int, precomp_enc_type: str = "basic"):
        super().__init__()
        self.precomp_enc_type = precomp_enc_type
        self.fc = nn.Linear(img_dim, embed_size)
        if precomp_enc_type == "basic":
            self.mlp = MLP(img_dim, embed_size // 2, embed_size, 2)
        self.gpool = GPO(GPO_DIM, GPO_DIM)
        if not self.fc.weight.is_meta:
            xavier_linear_(self.fc)

    def forward(self, images: torch.Tensor, image_lengths: torch.Tensor) -> torch.Tensor:
        features = self.fc(images)
        if self.precomp_enc_type == "basic":
            features = self.mlp(images) + features
        return l2norm(self.gpool(features, image_lengths)[0])


def bert_model(config: dict):
    """An untrained ``transformers.BertModel`` of ``config`` (a ``config.json`` as a dict, its sizes checked by
    :func:`cocos.data.wordpiece.check_bert_config`); one line if transformers is missing or the config is not a
    BERT's."""
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        raise CocosError(BERT_INSTALL) from None
    from cocos.data.wordpiece import check_bert_config

    if not isinstance(config, dict):
        raise CocosError(f"a BERT's config is a dict, got {type(config).__name__}")
    check_bert_config(config, "the BERT's config", memory=False)  # sizes and depth; the memory when a folder is read
    try:
        return BertModel(BertConfig(**{k: v for k, v in config.items() if not k.startswith("_")}))
    except Exception as exc:  # noqa: BLE001 - whatever a nonsense config.json makes transformers raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CocosError(f"the BERT's config.json does not describe a BERT ({first})") from None


class EncoderText(nn.Module):
    """BERT -> Linear(hidden, E) -> GPO over the tokens -> l2norm (module docstring)."""

    def __init__(self, bert_config: dict, embed_size: int):
        super().__init__()
        self.bert = bert_model(bert_config)
        self.linear = nn.Linear(int(bert_config["hidden_size"]), embed_size)
        self.gpool = GPO(GPO_DIM, GPO_DIM)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        lengths = lengths.to(tokens.device)
        return l2norm(self.gpool(self.linear(self.hidden(tokens, lengths)), lengths)[0])

    def hidden(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """BERT's last hidden states ``(n, L, hidden)``, zero beyond each caption's length.

        A caption's states do not depend on the padding (the attention mask hides it), so the batch is run in
        :data:`BERT_CHUNKS` chunks of captions of similar length, each padded to its own longest rather than all
        to the batch's: the same result (up to float rounding) for less work when lengths differ. On the CPU only:
        on a GPU the extra kernel launches cost more than the padding."""
        n, width = tokens.shape
        # on a GPU a step of this size is bound by kernel launches, not arithmetic: one pass
        chunks = min(BERT_CHUNKS, max(n // BERT_CHUNK_ROWS, 1)) if tokens.device.type == "cpu" else 1
        if chunks == 1:
            return self.bert(input_ids=tokens, attention_mask=(tokens != 0).float())[0]
        order = torch.argsort(lengths, stable=True)
        parts, rows = [], []
        for idx in torch.tensor_split(order, chunks):
            longest = int(lengths[idx].max())
            part = tokens[idx, :longest]
            out = self.bert(input_ids=part, attention_mask=(part != 0).float())[0]
            parts.append(torch.nn.functional.pad(out, (0, 0, 0, width - longest)))
            rows.append(idx)
        return torch.cat(parts)[torch.argsort(torch.cat(rows))]


def drop_regions(features: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept rows of each image moved to the front (in order), the rest zeros, cut to the longest:
    ``(features (n, L, d), lengths (n,))``."""
    lengths = keep.sum(1)
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True)[1]  # kept first, each group in order
    width = int(lengths.max())
    moved = torch.gather(features, 1, order[:, :width, None].expand(-1, -1, features.shape[-1]))
    return moved * length_mask(lengths, width).unsqueeze(-1).to(moved.dtype), lengths


def region_dropout(features: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """VSE∞'s size augmentation of region features: each dropped with probability ``p``, at least one kept."""
    keep = (torch.rand(features.shape[:2]) > p).to(features.device)  # CPU draws: the same on any device
    none = ~keep.any(1)
    if none.any():  # deviation: theirs could keep no region
        keep[none, 0] = True
    return drop_regions(features, keep)


def grid_dropout(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """VSE∞'s size augmentation of grid features (``EncoderImageFull``): with probability 0.8 an image keeps the
    cells whose uniform draw exceeds ``0.2 * u`` (``u`` uniform per image), else all of them."""
    n, cells = features.shape[:2]
    cell = torch.rand(n, cells).to(features.device)  # CPU draws: the same on any device
    image = torch.rand(n).to(features.device)
    keep = (cell > 0.2 * image.unsqueeze(1)) | (image <= 0.2).unsqueeze(1)
    none = ~keep.any(1)
    if none.any():
        keep[none, 0] = True
    return drop_regions(features, keep)


def check_regions(features: torch.Tensor, dim: int) -> torch.Tensor:
    """Region features ``(n, R, dim)`` (global ``(n, dim)`` ones as one region each); one line otherwise."""
    if features.dim() == 2:
        features = features.unsqueeze(1)
    if features.dim() != 3 or features.shape[-1] != dim:
        raise CocosError(f"image features must be (n, R, {dim}) or (n, {dim}), got {tuple(features.shape)}")
    return features


class VSEInfty(nn.Module):
    """VSE∞ on precomputed region features (BUTD), a BERT caption encoder (module docstring).

    ``vocab_size`` is the BERT's (its word-piece vocabulary, recorded with the checkpoint); ``bert_config`` its
    ``config.json``; the pre-trained weights come from the BERT folder (:meth:`load_text_encoder`) or the
    checkpoint. ``region_drop`` is the size augmentation's probability (0: none)."""

    kind = "vse_infty"

    def __init__(self, vocab_size: int, img_dim: int, bert_config: dict, embed_size: int = 1024,
                 region_drop: float = REGION_DROP):
        super().__init__()
        if int(bert_config.get("vocab_size", vocab_size)) != int(vocab_size):
            raise CocosError(f"the BERT's config has a vocabulary of {bert_config.get('vocab_size')} word pieces "
                             f"but its vocab.txt {vocab_size}")
        self.hparams = {"vocab_size": int(vocab_size), "img_dim": int(img_dim), "bert_config": dict(bert_config),
                        "embed_size": int(embed_size), "region_drop": float(region_drop)}
        self.region_drop = float(region_drop)
        self.img_enc = EncoderImageAggr(img_dim, embed_size, "basic")
        self.txt_enc = EncoderText(bert_config, embed_size)

    def load_text_encoder(self, path: str | os.PathLike) -> VSEInfty:
        """Load the pre-trained BERT of a Hugging Face folder into the caption encoder."""
        load_bert_weights(self.txt_enc.bert, path)
        return self

    def encode_images(self, features: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        features = check_regions(features, self.img_enc.fc.in_features)
        if lengths is None:
            if self.training and self.region_drop > 0:
                features, lengths = region_dropout(features, self.region_drop)
            else:
                lengths = torch.full((features.shape[0],), features.shape[1], device=features.device)
        return self.img_enc(features, lengths)

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.txt_enc(tokens, lengths)

    def forward(self, features, tokens, lengths) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_images(features), self.encode_captions(tokens, lengths)


class GridEncoder(nn.Module):
    """vse_infty's ``EncoderImageFull``: ``backbone`` (a CNN trunk, torchvision's names) -> its grid ``(n, H*W, C)``
    -> size augmentation while training -> ``image_encoder`` (:class:`EncoderImageAggr`, ``backbone``)."""

    def __init__(self, cnn_type: str, embed_size: int):
        super().__init__()
        self.backbone = strip_classifier(build_cnn(cnn_type))
        self.image_encoder = EncoderImageAggr(self.backbone.out_dim, embed_size, "backbone")

    def forward(self, grid: torch.Tensor, augment: bool) -> torch.Tensor:
        if augment:
            grid, lengths = grid_dropout(grid)
        else:
            lengths = torch.full((grid.shape[0],), grid.shape[1], device=grid.device)
        return self.image_encoder(grid, lengths)


class VSEInftyFull(PixelModel):
    """VSE∞ on raw images (WSL): a ResNeXt (or ResNet) backbone's grid, GPO; a BERT caption encoder.

    ``finetune`` trains the backbone (VSE∞'s warm-up: :meth:`start_epoch`, called by the trainer before each epoch,
    opens it stage by stage; :meth:`loss_scale` ramps the loss over the first epoch that trains it); without it
    the backbone is frozen and stays in eval mode, as VSE∞'s backbone BatchNorm always is.
    ``pooled(pixels)`` is the grid (what ``cocos data features`` caches), ``encode_pooled(grid)`` the rest."""

    kind = "vse_infty_full"
    keeps_embeddings = True  # pooled() gives (n, H*W, C): an analysed split holds image embeddings, not grids

    def __init__(self, vocab_size: int, bert_config: dict, cnn_type: str = "resnext101_32x8d",
                 embed_size: int = 1024, finetune: bool = False, embedding_warmup_epochs: int = 2,
                 backbone_warmup_epochs: int = 5):
        super().__init__()
        self.warmup = (int(embedding_warmup_epochs), int(backbone_warmup_epochs))
        if cnn_type not in CNN_TYPES or cnn_type.startswith("vgg"):
            raise CocosError(f"unknown backbone '{cnn_type}' (choose from "
                             f"{', '.join(c for c in CNN_TYPES if not c.startswith('vgg'))})")
        self.hparams = {"vocab_size": int(vocab_size), "bert_config": dict(bert_config), "cnn_type": cnn_type,
                        "embed_size": int(embed_size), "finetune": bool(finetune)}
        if finetune:
            self.hparams.update(embedding_warmup_epochs=self.warmup[0], backbone_warmup_epochs=self.warmup[1])
        self.finetune = bool(finetune)
        self.img_enc = GridEncoder(cnn_type, embed_size)
        self.txt_enc = EncoderText(bert_config, embed_size)
        self.img_dim = self.img_enc.backbone.out_dim
        for p in self.img_enc.backbone.parameters():
            p.requires_grad_(self.finetune)
        self.train()

    def fixed_blocks(self, epoch: int) -> int:
        """VSE∞'s backbone warm-up (``train.py``; ``epoch`` 1-based): the backbone frozen for the
        ``embedding_warmup_epochs`` first epochs (4: all blocks fixed), then its last stage trained (3 fixed), then
        one more stage every ``backbone_warmup_epochs``, down to the whole backbone (0)."""
        embedding, step = self.warmup
        e = epoch - 1
        if e < embedding:
            return 4
        if step == 0:  # no stage-by-stage warm-up: the whole backbone at once (vse_infty's train_grid.sh)
            return 0
        return max(3 - (e - embedding) // step, 0)

    def start_epoch(self, epoch: int) -> None:
        """Before training epoch ``epoch`` (1-based): with ``finetune``, open the backbone as VSE∞'s warm-up does
        (:meth:`fixed_blocks`: stages ``layer{fixed+1}..layer4`` train, the stem with them only when none is
        fixed); without it the backbone stays frozen."""
        if not self.finetune:
            return
        fixed = self.fixed_blocks(epoch)
        cnn = self.img_enc.backbone
        parts = [("stem", [cnn.conv1, cnn.bn1]), *((f"layer{i}", [getattr(cnn, f"layer{i}")]) for i in range(1, 5))]
        for rank, (_, modules) in enumerate(parts):  # rank 0 the stem, 1..4 the stages
            trained = fixed < 4 and (rank > fixed or fixed == 0)
            for module in modules:
                for p in module.parameters():
                    p.requires_grad_(trained)

    def loss_scale(self, epoch: int, step: int, steps: int) -> float:
        """VSE∞ ramps the loss up linearly (``step / steps``) over the first epoch that trains the backbone."""
        if self.finetune and epoch - 1 == self.warmup[0]:
            return step / max(steps, 1)
        return 1.0

    @property
    def cnn(self) -> nn.Module:
        return self.img_enc.backbone

    def train(self, mode: bool = True) -> VSEInftyFull:
        """As ``nn.Module.train``; the backbone's BatchNorm layers always in eval mode (VSE∞ fixes them), the whole
        backbone when it is frozen."""
        super().train(mode)
        for m in self.img_enc.backbone.modules():
            if isinstance(m, nn.BatchNorm2d) or not self.finetune:
                m.eval()
        return self

    def load_cnn_weights(self, path: str | os.PathLike) -> VSEInftyFull:
        load_cnn_weights(self.img_enc.backbone, path, self.hparams["cnn_type"])
        return self

    def load_text_encoder(self, path: str | os.PathLike) -> VSEInftyFull:
        load_bert_weights(self.txt_enc.bert, path)
        return self

    def cnn_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The backbone's grid ``(n, H*W, C)``."""
        return self.img_enc.backbone.grid(pixels)

    def encode_pooled(self, grid: torch.Tensor) -> torch.Tensor:
        grid = check_regions(grid, self.img_dim)
        return self.img_enc(grid, augment=self.training)


def load_bert_weights(bert: nn.Module, path: str | os.PathLike) -> nn.Module:
    """The pre-trained weights of a Hugging Face BERT folder (``config.json`` and ``model.safetensors`` or
    ``pytorch_model.bin``, read by :func:`cocos.hf.read_weights`: nothing is fetched, no code in the file runs)
    into ``bert``: every tensor of ``bert``'s state dict (names of ``BertModel``, or behind ``bert.`` as a
    pre-training model saves them), of its shape, floating point and finite; one line naming the tensor
    otherwise (never a tensor left at its random initialisation). VSE∞ reads BERT's last hidden states, never its
    pooler: a folder saved without one (``BertForMaskedLM``, as a masked-LM fine-tuning saves it) loads with the
    pooler zeroed."""
    from cocos.hf import read_weights

    state = read_weights(path, bert.state_dict(), what="BERT", base_prefix="bert.", unused=("pooler.",))
    try:
        bert.load_state_dict(state)
    except RuntimeError as exc:
        raise CocosError(f"{path}: its BERT does not fit the config ({str(exc).splitlines()[-1].strip()})") from None
    return bert


__all__ = ["GPO", "MLP", "EncoderImageAggr", "EncoderText", "GridEncoder", "VSEInfty", "VSEInftyFull",
           "drop_regions", "grid_dropout", "load_bert_weights", "positional_encoding", "region_dropout"]
