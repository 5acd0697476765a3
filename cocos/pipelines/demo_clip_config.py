"""``cocos demo --model clip``'s settings, each default written once (torch-free: the command's flags take theirs from
here); the demo itself is :mod:`cocos.pipelines.demo_clip`.

The demo pre-trains its own tiny CLIP (:class:`TinyCLIP`, random initialisation) on the image world of ``cocos demo
--images`` for :attr:`ClipDemoConfig.pretrain_epochs` epochs at :data:`PRETRAIN_LR`, then fine-tunes it with each
loss of :data:`CLIP_LOSSES` for :attr:`ClipDemoConfig.epochs` epochs at :attr:`ClipDemoConfig.lr`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cocos.defaults import DEFAULT_BATCH_SIZE
from cocos.pipelines.demo_config import IMAGE_DEFAULTS

# the fine-tuning losses, in the report's order: CLIP's (NT-Xent at a learned temperature), SigLIP's (sigmoid, its
# t and b learned) and the COCOS paper's winner (Triplet SH)
CLIP_LOSSES = ("ntxent", "siglip", "triplet_sh")
LOSS_NAMES = {"ntxent": "NT-Xent (learned τ)", "siglip": "SigLIP (learned t, b)", "triplet_sh": "Triplet SH"}
PRETRAIN_LR = 1e-3  # pre-training from random initialisation (AdamW, CLIP's recipe otherwise)
# CHECKPOINTS/<name>/: the random CLIP folder, the pre-training run, the pre-trained CLIP folder
INIT_DIR, PRETRAIN_DIR, PRETRAINED_DIR = "clip_init", "clip_pretrain", "clip_pretrained"
CLIP_DEFAULTS = {"out": "reports/demo_clip", "data": IMAGE_DEFAULTS["data"], "checkpoints": "checkpoints/demo_clip"}


@dataclass(frozen=True)
class TinyCLIP:
    """The demo's CLIP: the sizes of its ``CLIPConfig`` (both towers ViTs; the text tower's width, blocks and heads
    are the vision tower's). Small enough that a pair step of 128 takes a fraction of a second on 2 CPU cores."""

    image_size: int = 32  # the vision tower's input (the 64-px image resized whole)
    patch_size: int = 8  # 4 x 4 patches
    width: int = 64  # hidden size of both towers (feed-forward 4x)
    layers: int = 2  # transformer blocks per tower
    heads: int = 4
    projection_dim: int = 64  # the joint embedding
    max_positions: int = 48  # the text tower's positions (the world's longest caption is 43 tokens)

    def config(self, vocab_size: int) -> dict:
        """The ``CLIPConfig`` as a dict (``bos``/``eos`` the tokenizer's last two ids)."""
        tower = {"hidden_size": self.width, "intermediate_size": 4 * self.width, "num_hidden_layers": self.layers,
                 "num_attention_heads": self.heads}
        text = {**tower, "vocab_size": vocab_size, "max_position_embeddings": self.max_positions,
                "bos_token_id": vocab_size - 2, "eos_token_id": vocab_size - 1, "pad_token_id": vocab_size - 1}
        vision = {**tower, "image_size": self.image_size, "patch_size": self.patch_size}
        return {"text_config": text, "vision_config": vision, "projection_dim": self.projection_dim}


@dataclass
class ClipDemoConfig:
    """``cocos demo --model clip``'s settings (module docstring). ``tower``: the tiny CLIP's sizes, a knob for tests
    (no flag)."""

    out: str = CLIP_DEFAULTS["out"]
    data: str = CLIP_DEFAULTS["data"]  # the image world (the image demo's: reused when there)
    checkpoints: str = CLIP_DEFAULTS["checkpoints"]
    losses: list[str] = field(default_factory=lambda: list(CLIP_LOSSES))
    pretrain_epochs: int = 6
    epochs: int = 2  # fine-tuning epochs per loss
    lr: float = 1e-4  # fine-tuning (AdamW, weight decay 0.1: CLIP's recipe)
    batch_size: int = DEFAULT_BATCH_SIZE
    n_train: int = IMAGE_DEFAULTS["n_train"]  # when the world is generated
    n_dev: int = IMAGE_DEFAULTS["n_dev"]
    n_test: int = IMAGE_DEFAULTS["n_test"]
    image_size: int = 64  # side of the rendered JPEGs
    seed: int = 0
    device: str = "auto"
    retrain: bool = False
    overwrite: bool = False
    track_cocos: int | None = 10
    workers: int = 0
    tower: TinyCLIP = field(default_factory=TinyCLIP)
