"""VSE++ on raw images (Faghri et al., 2018: ``EncoderImageFull``), and LTD's two-layer head variant.

The definitions file, section 17, states the forward pass and what cocos does with BatchNorm.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from cocos.defaults import DEFAULT_CNN, DEFAULT_EMBED_SIZE, DEFAULT_WORD_DIM
from cocos.errors import CocosError
from cocos.models.cnn import CNN_TYPES, build_cnn, load_cnn_weights, strip_classifier
from cocos.models.text import CaptionEncoder, l2norm, xavier_linear_

HEADS = ("linear", "mlp")


class PixelModel(nn.Module):
    """What the raw-image families share: pixels -> :meth:`pooled` (the CNN's output, what a feature cache stores;
    a subclass's ``cnn_features``) -> ``encode_pooled``; captions through ``txt_enc``."""

    def pooled(self, pixels: torch.Tensor) -> torch.Tensor:
        """``(n, 3, H, W)`` normalised pixels -> the CNN's features (before anything the model trains)."""
        if pixels.dim() != 4 or pixels.shape[1] != 3:
            raise CocosError(f"images must be pixels (n, 3, H, W), got {tuple(pixels.shape)}")
        return self.cnn_features(pixels)

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.encode_pooled(self.pooled(pixels))

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.txt_enc(tokens, lengths)

    def forward(self, pixels, tokens, lengths) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encode_images(pixels), self.encode_captions(tokens, lengths)


class VSEPPFull(PixelModel):
    """Image side: CNN (ImageNet classifier stripped) -> l2norm -> ``fc`` -> l2norm -> ``abs`` (``use_abs``).

    As VSE++'s ``EncoderImageFull``: a ResNet's pooled 512/2048-d feature or VGG-19's 4096-d
    second fully connected layer (:func:`cocos.models.cnn.strip_classifier`) is L2-normalised,
    projected by ``fc = Linear(d, embed_size)`` (Xavier-uniform, zero bias: VSE++'s
    ``init_weights``) and L2-normalised again unless ``no_imgnorm``; ``use_abs`` takes the
    absolute value. Caption side: :class:`~cocos.models.text.CaptionEncoder`, as :class:`VSEPP`.

    ``head="mlp"`` is LTD's image encoder (Bleeker et al. 2023): average pooling followed by a
    projection head ``fc = Sequential(Linear(d, hidden), ReLU, Linear(hidden, embed_size))``
    (``hidden`` defaults to ``d``: the paper does not state it), applied to the pooled feature
    as the paper describes, without VSE++'s first l2norm; each ``Linear`` Xavier-initialised.

    ``finetune`` trains the CNN too; without it the CNN's parameters have ``requires_grad=False``
    (VSE++) and the CNN stays in eval mode whatever ``train()`` is called with (deviation:
    VSE++ put its frozen CNN in train mode while training, so BatchNorm used batch statistics
    and drifted its running statistics; see the definitions file, section 17).

    ``pooled(pixels)`` is the CNN's feature before the first l2norm (what a feature cache
    stores), ``encode_pooled(features)`` the rest, ``encode_images = encode_pooled . pooled``.
    """

    kind = "vsepp_full"

    def __init__(self, vocab_size: int, cnn_type: str = DEFAULT_CNN, word_dim: int = DEFAULT_WORD_DIM,
                 embed_size: int = DEFAULT_EMBED_SIZE, num_layers: int = 1, finetune: bool = False,
                 use_abs: bool = False, no_imgnorm: bool = False, head: str = "linear", hidden: int | None = None):
        super().__init__()
        if cnn_type not in CNN_TYPES:
            raise CocosError(f"unknown CNN '{cnn_type}' (choose from {', '.join(CNN_TYPES)})")
        if head not in HEADS:
            raise CocosError(f"unknown image head '{head}' (choose from {', '.join(HEADS)})")
        if hidden is not None and head != "mlp":
            raise CocosError("hidden is the width of the 'mlp' head; the 'linear' head has none")
        self.cnn = strip_classifier(build_cnn(cnn_type))
        dim = self.cnn.out_dim
        self.hparams = {"vocab_size": int(vocab_size), "cnn_type": cnn_type, "word_dim": int(word_dim),
                        "embed_size": int(embed_size), "num_layers": int(num_layers), "finetune": bool(finetune),
                        "use_abs": bool(use_abs), "no_imgnorm": bool(no_imgnorm), "head": head}
        if head == "mlp":
            hidden = int(hidden if hidden is not None else dim)
            self.hparams["hidden"] = hidden
            self.fc = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, embed_size))
        else:
            self.fc = nn.Linear(dim, embed_size)
        self.img_dim, self.head = dim, head
        self.finetune, self.use_abs, self.no_imgnorm = bool(finetune), bool(use_abs), bool(no_imgnorm)
        self.txt_enc = CaptionEncoder(vocab_size, word_dim, embed_size, int(num_layers), use_abs=self.use_abs)
        for p in self.cnn.parameters():
            p.requires_grad_(self.finetune)
        self.init_weights()
        self.train()

    def init_weights(self) -> None:
        """Xavier-uniform projection(s) with zero bias, as VSE++'s ``init_weights``."""
        for layer in self.fc.modules():
            if isinstance(layer, nn.Linear) and not layer.weight.is_meta:
                xavier_linear_(layer)

    def train(self, mode: bool = True) -> VSEPPFull:
        """As ``nn.Module.train``, except that a frozen CNN (no ``finetune``) always stays in eval mode."""
        super().train(mode)
        if not self.finetune:
            self.cnn.eval()
        return self

    def load_cnn_weights(self, path: str | os.PathLike) -> VSEPPFull:
        """Load a torchvision-format weights file of ``cnn_type`` into the CNN (the classifier is not used)."""
        load_cnn_weights(self.cnn, path, self.hparams["cnn_type"])
        return self

    def cnn_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The CNN's ``(n, d)`` feature (before any l2norm)."""
        return self.cnn(pixels)

    def encode_pooled(self, features: torch.Tensor) -> torch.Tensor:
        """The CNN's ``(n, d)`` features -> ``(n, embed_size)`` image embeddings (class docstring)."""
        if features.dim() != 2 or features.shape[1] != self.img_dim:
            raise CocosError(f"pooled CNN features must be (n, {self.img_dim}), got {tuple(features.shape)}")
        out = self.fc(l2norm(features) if self.head == "linear" else features)
        if not self.no_imgnorm:
            out = l2norm(out)
        return out.abs() if self.use_abs else out



__all__ = ["HEADS", "PixelModel", "VSEPPFull"]
