"""SigLIP (Zhai et al., ICCV 2023): a Hugging Face ``SiglipModel`` as a cocos model family.

Image embeddings are ``l2norm(vision_model(pixels).pooler_output)`` (the vision tower's attention-pooling head) and
caption embeddings ``l2norm(text_model(ids).pooler_output)`` (the text tower's ``head`` of its last position), SigLIP's
own ``get_image_features`` / ``get_text_features`` normalised, as SigLIP's loss normalises them. The caption ids are
padded to the text tower's ``max_position_embeddings`` with the tokenizer's pad token on its padding side
(:class:`cocos.data.siglip.TextPadding`, ``padding="max_length"``, as SigLIP was trained) and passed without an
attention mask: SigLIP's text tower attends to every position and pools the last. The model records the folder's
``config.json`` (``siglip_config``), its image preprocessing (``preprocess``) and the padding (``text_padding``), so a
checkpoint stands alone.

SigLIP's loss (definitions file, "SigLIP") scores a pair with ``z = t * s + b``: ``t = exp(logit_scale)`` and
``b = logit_bias`` are weights of the model (:attr:`SiglipDual.logit_scale`, :attr:`SiglipDual.logit_bias`, the
``SiglipModel``'s own ``nn.Parameter`` s of shape ``(1,)``), which the ``siglip`` loss learns with it.

As every raw-image family (:class:`cocos.models.image.PixelModel`): ``pooled(pixels)`` is the vision tower's pooled
output (the attention-pooling head's, SigLIP's image embedding before its norm), ``encode_pooled`` the norm.
Encoding a split for counting keeps its image embeddings, batch by batch (``keeps_embeddings``), with the model's
own transform (``image_transform``).

**Freezing** (``freeze``), as the CLIP family's (:mod:`cocos.models.clip`): ``none``, ``image`` (the vision tower
with its pooling head), ``text`` (the text tower with its head), ``both`` (only ``logit_scale`` and ``logit_bias``
would train, and only where the loss learns them: SigLIP's ``t`` and ``b``; with ``both`` frozen a loss that
learns neither has nothing to train). ``unfrozen_blocks = N > 0`` trains only the last ``N`` transformer blocks of
each tower that is not frozen, with what follows them (the vision tower's ``post_layernorm`` and pooling ``head``,
the text tower's ``final_layer_norm`` and ``head``); ``0`` trains the whole tower. A frozen part has
``requires_grad = False``; SigLIP has neither BatchNorm nor (by default) dropout, so eval and train modes compute
the same.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from cocos.data.siglip import Preprocess, TextPadding, check_siglip_config, pad_ids, quiet_transformers
from cocos.errors import CocosError
from cocos.models.clip import FREEZE, check_freeze
from cocos.models.image import PixelModel
from cocos.models.text import l2norm


class SiglipDual(PixelModel):
    """A SigLIP dual encoder (module docstring). ``vocab_size`` is the tokenizer's size (at most the text tower's
    ``vocab_size``: every id it makes is a row of the embedding table)."""

    kind = "siglip"
    keeps_embeddings = True  # an analysed split holds image embeddings, not pooled features (cocos.embed.images)

    def __init__(self, vocab_size: int, siglip_config: dict, preprocess: dict, text_padding: dict,
                 freeze: str = "none", unfrozen_blocks: int = 0, embed_size: int | None = None):
        super().__init__()
        transformers = quiet_transformers()
        check_freeze(freeze, unfrozen_blocks)
        if not isinstance(siglip_config, dict):
            raise CocosError(f"a SigLIP configuration is a dict, got {type(siglip_config).__name__}")
        on_meta = torch.empty(()).device.type == "meta"  # a checkpoint's model checked, not allocated
        text, vision, projection = check_siglip_config(siglip_config, "the SigLIP configuration",
                                                       copies=0 if on_meta else 1)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= text["vocab_size"]:
            raise CocosError(f"the tokenizer has {vocab_size} tokens but the text tower's vocab_size is "
                             f"{text['vocab_size']}")
        if embed_size is not None and embed_size != projection:
            raise CocosError(f"embed_size {embed_size} is not the SigLIP model's embedding size {projection}")
        self.padding = TextPadding.of(text_padding)
        if self.padding.pad_id >= vocab_size:
            raise CocosError(f"the pad id {self.padding.pad_id} is not one of the tokenizer's {vocab_size} tokens")
        self.preprocess = Preprocess.of(preprocess)
        if self.preprocess.size != vision["image_size"]:
            raise CocosError(f"the preprocessing resizes to {self.preprocess.size} pixels but the vision tower takes "
                             f"images of {vision['image_size']}")
        try:
            config = transformers.SiglipConfig.from_dict(dict(siglip_config))
        except Exception as exc:  # noqa: BLE001 - whatever a damaged config makes transformers raise
            raise CocosError(f"not a SigLIP configuration ({str(exc).splitlines()[0][:160] if str(exc) else exc})"
                             ) from None
        try:
            self.siglip = transformers.SiglipModel(config)
        except Exception as exc:  # noqa: BLE001 - a setting transformers cannot build (hidden_act "nosuch")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CocosError(f"cannot build the SigLIP model of its configuration ({first})") from None
        self.max_length = int(text["max_position_embeddings"])
        self.img_dim = int(vision["hidden_size"])
        self.hparams = {"vocab_size": int(vocab_size), "siglip_config": dict(siglip_config),
                        "preprocess": self.preprocess.record(), "text_padding": self.padding.record(),
                        "freeze": freeze, "unfrozen_blocks": int(unfrozen_blocks), "embed_size": int(projection)}
        self._freeze(freeze, int(unfrozen_blocks))

    def _freeze(self, freeze: str, blocks: int) -> None:
        towers = {"image": self.siglip.vision_model, "text": self.siglip.text_model}
        for side, tower in towers.items():
            frozen = freeze in (side, "both")
            for p in tower.parameters():
                p.requires_grad_(not frozen)
            if frozen or not blocks:
                continue
            layers = tower.encoder.layers
            if blocks > len(layers):
                raise CocosError(f"--unfrozen-blocks {blocks}: the {side} tower has {len(layers)} blocks")
            trained = {id(p) for layer in layers[-blocks:] for p in layer.parameters()}
            trained |= {id(p) for name, p in tower.named_parameters()
                        if name.startswith(("post_layernorm", "final_layer_norm", "head"))}
            for p in tower.parameters():
                p.requires_grad_(id(p) in trained)
        # logit_scale trains when the loss learns it (SigLIP's t, a softmax temperature with --learn-tau); so does
        # logit_bias (SigLIP's b), which nothing else reads: frozen with both towers, where it would be all that
        # trains for a loss that never reads it
        self.siglip.logit_bias.requires_grad_(freeze != "both")

    # -- weights --------------------------------------------------------------------------------------------

    def load_pretrained(self, folder: str | os.PathLike) -> SiglipDual:
        """The weights of a SigLIP folder, read completely or not at all (:func:`cocos.hf.read_weights`: every tensor
        of ``SiglipModel``'s state dict present, of its shape, floating point and finite; nothing downloaded, no code
        from the file run); one line naming the tensor otherwise."""
        from cocos.hf import read_weights

        folder = Path(folder)
        state = read_weights(folder, self.siglip.state_dict(), what="SigLIP")
        try:
            self.siglip.load_state_dict(state)
        except RuntimeError as exc:
            raise CocosError(f"{folder}: its weights do not fit its config.json ({str(exc).splitlines()[-1].strip()})"
                             ) from None
        return self

    @property
    def logit_scale(self) -> torch.nn.Parameter:
        """SigLIP's learned ``log t`` (the ``SiglipModel``'s parameter, shape ``(1,)``): ``t = exp(logit_scale)``."""
        return self.siglip.logit_scale

    @property
    def logit_bias(self) -> torch.nn.Parameter:
        """SigLIP's learned bias ``b`` (the ``SiglipModel``'s parameter, shape ``(1,)``)."""
        return self.siglip.logit_bias

    def loss_params(self) -> dict:
        """The model's own SigLIP loss parameters: ``{"t": exp(logit_scale), "b": logit_bias}`` (floats)."""
        return {"t": math.exp(float(self.logit_scale.detach().double().reshape(-1)[0])),
                "b": float(self.logit_bias.detach().double().reshape(-1)[0])}

    # -- encoding -------------------------------------------------------------------------------------------

    def image_transform(self, train: bool):
        """The model's own preprocessing (:mod:`cocos.data.siglip`): what its pixels must be."""
        return self.preprocess.transform(train)

    def cnn_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The vision tower's pooled output ``(n, hidden)`` (its attention-pooling head's)."""
        return self.siglip.vision_model(pixel_values=pixels).pooler_output

    def encode_pooled(self, features: torch.Tensor) -> torch.Tensor:
        return l2norm(features)

    def text_ids(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(n, L)`` ids padded after ``lengths`` -> ``(n, max_position_embeddings)``: padded as SigLIP was trained
        (:func:`cocos.data.siglip.pad_ids`)."""
        return pad_ids(tokens, lengths, self.padding, self.max_length)

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(n, L)`` ids padded after ``lengths`` -> ``(n, embed)``: the text tower's head of its last position, on
        the ids padded to the tower's length, without an attention mask."""
        return l2norm(self.siglip.text_model(input_ids=self.text_ids(tokens, lengths)).pooler_output)


def describe(hparams: dict) -> str:
    """``SigLIP (ViT-B/16)``: the vision tower's patch size and width, from the recorded config."""
    vision = (hparams.get("siglip_config") or {}).get("vision_config") or {}
    patch, width = vision.get("patch_size"), vision.get("hidden_size")
    name = {768: "B", 1024: "L", 1152: "SO400M"}.get(width)  # Google's SigLIP widths
    tower = f"ViT-{name}/{patch}" if name and patch else f"ViT {width or '?'}-d, patch {patch or '?'}"
    frozen = {"image": ", image tower frozen", "text": ", text tower frozen", "both": ", frozen"}
    return f"SigLIP ({tower}{frozen.get(hparams.get('freeze', 'none'), '')})"


__all__ = ["FREEZE", "SiglipDual", "describe"]
