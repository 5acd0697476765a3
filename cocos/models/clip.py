"""CLIP-style dual encoders (Radford et al. 2021): a Hugging Face ``CLIPModel`` as a cocos model family.

The definitions file, section 21, states what cocos computes. In short: image embeddings are
``l2norm(visual_projection(vision_model(pixels).pooler_output))`` and caption embeddings
``l2norm(text_projection(text_model(ids, mask).pooler_output))``, CLIP's own ``get_image_features`` /
``get_text_features`` normalised, as CLIP's loss normalises them. The model records the folder's
``config.json`` (``clip_config``) and its image preprocessing (``preprocess``), so a checkpoint stands alone;
``logit_scale`` (CLIP's learned ``log(1 / tau)``) is one of its weights.

As every raw-image family (:class:`cocos.models.image.PixelModel`): ``pooled(pixels)`` is the vision tower's pooled
output (``pooler_output``, before the projection), ``encode_pooled`` the projection and the norm. Encoding a split
for counting keeps its image embeddings, batch by batch (``keeps_embeddings``: no feature cache), with the
model's own transform (``image_transform``).

**Freezing** (``freeze``): ``none``, ``image`` (the vision tower and its projection), ``text`` (the text tower,
its projection), ``both`` (only ``logit_scale`` would train). ``unfrozen_blocks = N > 0`` trains only the last
``N`` transformer blocks of each tower that is not frozen, with what follows them (the vision tower's
``post_layernorm``, the text tower's ``final_layer_norm``, the projections); ``0`` trains the whole tower. A
frozen part has ``requires_grad = False``; CLIP has neither BatchNorm nor (by default) dropout, so eval and train
modes compute the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from cocos.data.clip import INSTALL, Preprocess, check_clip_config
from cocos.defaults import MAX_LOGIT_SCALE
from cocos.errors import CocosError
from cocos.hf import quiet_transformers
from cocos.models.image import PixelModel
from cocos.models.text import l2norm

FREEZE = ("none", "image", "text", "both")


def check_freeze(freeze: str, unfrozen_blocks: int) -> None:
    """``freeze`` one of :data:`FREEZE`, ``unfrozen_blocks`` an integer >= 0 (the family's check and the module's)."""
    if freeze not in FREEZE:
        raise CocosError(f"unknown --freeze '{freeze}' (choose from {', '.join(FREEZE)})")
    if isinstance(unfrozen_blocks, bool) or not isinstance(unfrozen_blocks, int) or unfrozen_blocks < 0:
        raise CocosError(f"--unfrozen-blocks must be an integer of at least 0, got {unfrozen_blocks!r}")


def temperature_of(logit_scale: torch.Tensor) -> torch.Tensor:
    """CLIP's temperature ``tau = exp(-min(logit_scale, log 100))``: the one a CLIP folder's loss is counted at (a
    scale above CLIP's clamp counts as the clamp). Training does not clamp in the forward pass:
    :class:`cocos.losses.base.LearnedTemperature` clamps the parameter after each step, as open_clip."""
    return torch.exp(-logit_scale.clamp(max=MAX_LOGIT_SCALE))


def _transformers():
    """``transformers``, quiet (:func:`cocos.hf.quiet_transformers`), or one line naming the extra."""
    return quiet_transformers(INSTALL)


class CLIPDual(PixelModel):
    """A CLIP dual encoder (module docstring). ``vocab_size`` must be the text tower's (the tokenizer's size)."""

    kind = "clip"
    keeps_embeddings = True  # an analysed split holds image embeddings, not pooled features (cocos.embed.images)

    def __init__(self, vocab_size: int, clip_config: dict, preprocess: dict, freeze: str = "none",
                 unfrozen_blocks: int = 0, embed_size: int | None = None):
        super().__init__()
        transformers = _transformers()
        check_freeze(freeze, unfrozen_blocks)
        if not isinstance(clip_config, dict):
            raise CocosError(f"a CLIP configuration is a dict, got {type(clip_config).__name__}")
        on_meta = torch.empty(()).device.type == "meta"  # a checkpoint's model checked, not allocated
        check_clip_config(clip_config, "the CLIP configuration", copies=0 if on_meta else 1)
        try:
            config = transformers.CLIPConfig.from_dict(dict(clip_config))
        except Exception as exc:  # noqa: BLE001 - whatever a damaged config makes transformers raise
            raise CocosError(f"not a CLIP configuration ({str(exc).splitlines()[0][:160] if str(exc) else exc})"
                             ) from None
        if config.text_config.vocab_size != vocab_size:
            raise CocosError(f"the tokenizer has {vocab_size} tokens but the text tower's vocab_size is "
                             f"{config.text_config.vocab_size}")
        if embed_size is not None and embed_size != config.projection_dim:
            raise CocosError(f"embed_size {embed_size} is not the CLIP model's projection_dim {config.projection_dim}")
        self.preprocess = Preprocess.of(preprocess)
        try:
            self.clip = transformers.CLIPModel(config)
        except Exception as exc:  # noqa: BLE001 - a setting transformers cannot build (hidden_act "nosuch")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise CocosError(f"cannot build the CLIP model of its configuration ({first})") from None
        self.img_dim = int(config.vision_config.hidden_size)
        self.hparams = {"vocab_size": int(vocab_size), "clip_config": dict(clip_config),
                        "preprocess": self.preprocess.record(), "freeze": freeze,
                        "unfrozen_blocks": int(unfrozen_blocks), "embed_size": int(config.projection_dim)}
        self._freeze(freeze, int(unfrozen_blocks))

    def _freeze(self, freeze: str, blocks: int) -> None:
        clip = self.clip
        towers = {"image": (clip.vision_model, clip.vision_model.encoder.layers, clip.visual_projection),
                  "text": (clip.text_model, clip.text_model.encoder.layers, clip.text_projection)}
        for side, (tower, layers, projection) in towers.items():
            frozen = freeze in (side, "both")
            for p in [*tower.parameters(), *projection.parameters()]:
                p.requires_grad_(not frozen)
            if frozen or not blocks:
                continue
            if blocks > len(layers):
                raise CocosError(f"--unfrozen-blocks {blocks}: the {side} tower has {len(layers)} blocks")
            trained = {id(p) for layer in layers[-blocks:] for p in layer.parameters()}
            trained |= {id(p) for name, p in tower.named_parameters()
                        if name.startswith(("post_layernorm", "final_layer_norm"))}
            for p in tower.parameters():
                p.requires_grad_(id(p) in trained)

    # -- weights --------------------------------------------------------------------------------------------

    def load_pretrained(self, folder: str | os.PathLike) -> CLIPDual:
        """The weights of a CLIP folder, read completely or not at all (:func:`cocos.hf.read_weights`: every tensor
        of ``CLIPModel``'s state dict present, of its shape, floating point and finite; nothing downloaded, no code
        from the file run); one line naming the tensor otherwise."""
        from cocos.hf import read_weights

        folder = Path(folder)
        state = read_weights(folder, self.clip.state_dict(), what="CLIP")
        try:
            self.clip.load_state_dict(state)
        except RuntimeError as exc:
            raise CocosError(f"{folder}: its weights do not fit its config.json ({str(exc).splitlines()[-1].strip()})"
                             ) from None
        return self

    @property
    def logit_scale(self) -> torch.Tensor:
        """CLIP's learned ``log(1 / tau)`` (a parameter of the model)."""
        return self.clip.logit_scale

    def temperature(self) -> float:
        """``tau = 1 / exp(logit_scale)``, with CLIP's clamp at ``exp(logit_scale) <= 100``."""
        return float(temperature_of(self.logit_scale.detach().float()).item())

    # -- encoding -------------------------------------------------------------------------------------------

    def image_transform(self, train: bool):
        """The model's own preprocessing (:mod:`cocos.data.clip`): what its pixels must be."""
        return self.preprocess.transform(train)

    def cnn_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """The vision tower's pooled output ``(n, hidden)`` (before the projection)."""
        return self.clip.vision_model(pixel_values=pixels).pooler_output

    def encode_pooled(self, features: torch.Tensor) -> torch.Tensor:
        return l2norm(self.clip.visual_projection(features))

    def encode_captions(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(n, L)`` ids padded after ``lengths`` -> ``(n, embed)``: the text tower's end-of-text output, projected."""
        mask = (torch.arange(tokens.shape[1], device=tokens.device)[None, :]
                < torch.as_tensor(lengths, device=tokens.device)[:, None]).long()
        out = self.clip.text_model(input_ids=tokens, attention_mask=mask).pooler_output
        return l2norm(self.clip.text_projection(out))


def describe(hparams: dict) -> str:
    """``CLIP (ViT-B/32)``: the vision tower's patch size and width, from the recorded config."""
    vision = (hparams.get("clip_config") or {}).get("vision_config") or {}
    patch, width = vision.get("patch_size"), vision.get("hidden_size")
    name = {768: "B", 1024: "L", 1280: "H"}.get(width)  # OpenAI's and open_clip's ViT widths (S and M differ)
    tower = f"ViT-{name}/{patch}" if name and patch else f"ViT {width or '?'}-d, patch {patch or '?'}"
    frozen = {"image": ", image tower frozen", "text": ", text tower frozen", "both": ", frozen"}
    return f"CLIP ({tower}{frozen.get(hparams.get('freeze', 'none'), '')})"


__all__ = ["CLIPDual", "FREEZE", "check_freeze", "describe", "temperature_of"]
