"""The built-in model families: VSE++ and VSRN on precomputed features, VSE++ on raw images (a CNN).

Each family's module lives in its own file of :mod:`cocos.models`; this module states their specs and registers
them. Their training hyper-parameters are the COCOS paper's (VSE++'s): a joint embedding of 1024 and word
embeddings of 300 (:mod:`cocos.defaults`); the raw-image family's CNN is the paper's ResNet-50, frozen unless
``finetune``. How the original code's image encoders map onto them is :mod:`cocos.models.original`.
"""

from __future__ import annotations

from cocos.defaults import DEFAULT_CNN, DEFAULT_EMBED_SIZE, DEFAULT_WORD_DIM
from cocos.errors import CocosError
from cocos.io import available_memory
from cocos.models import original
from cocos.models.clip import CLIPDual, check_freeze
from cocos.models.clip import describe as describe_clip
from cocos.models.cnn import CNN_TYPES
from cocos.models.family import ModelFamily, OriginalImage, Source
from cocos.models.image import VSEPPFull
from cocos.models.registry import register
from cocos.models.siglip import SiglipDual
from cocos.models.siglip import describe as describe_siglip
from cocos.models.vse_infty import REGION_DROP, VSEInfty, VSEInftyFull
from cocos.models.vsepp import VSEPP
from cocos.models.vsrn import VSRN
from cocos.results import model_label

SIZES = {"embed_size": DEFAULT_EMBED_SIZE, "word_dim": DEFAULT_WORD_DIM}


def check_sizes(params: dict) -> None:
    """Sizes of at least 1, and a caption encoder (a GRU of ``word_dim`` inputs and ``embed_size`` units, float32,
    with its gradient and Adam's two moments: 4 copies) that fits in the memory available: one line before anything
    is read, not an allocation failure (or the OOM killer) later."""
    for name in ("embed_size", "word_dim"):
        if params[name] < 1:
            raise CocosError(f"--{name.replace('_', '-')} must be an integer of at least 1, got {params[name]!r}")
    embed, word = params["embed_size"], params["word_dim"]
    need = 16 * 3 * embed * (word + embed + 2)
    if need > available_memory():
        raise CocosError(f"--embed-size {embed} with --word-dim {word} needs at least {need / 2**30:,.1f} GB for "
                         f"the caption encoder alone, more than the {available_memory() / 2**30:,.1f} GB of memory "
                         "available")


def check_cnn(params: dict) -> None:
    if params["cnn_type"] not in CNN_TYPES:
        raise CocosError(f"unknown CNN '{params['cnn_type']}' (choose from {', '.join(CNN_TYPES)})")
    check_sizes(params)


def describe_full(hparams: dict) -> str:
    """A raw-image VSE++ with its CNN and whether it was trained: ``VSE++ (ResNet-18, fine-tuned)``
    (:func:`cocos.results.model_label`, which also names the models of older results files)."""
    return model_label("vsepp_full", hparams)


VSEPP_FAMILY = ModelFamily(
    name="vsepp", label="VSE++", module=VSEPP, input="features", defaults=SIZES, check=check_sizes,
    images_family="vsepp_full",
    original=OriginalImage(original.is_vsepp_image, original.map_vsepp_image, "VSE++ EncoderImagePrecomp", "vsepp",
                           feature_rank=1),
    description="VSE++ (Faghri et al. 2018): a linear map of global (or region-averaged) features, a GRU caption "
                "encoder")
VSRN_FAMILY = ModelFamily(
    name="vsrn", label="VSRN", module=VSRN, input="features", defaults=SIZES, check=check_sizes, min_batch=2,
    original=OriginalImage(original.is_vsrn_image, original.map_vsrn_image, "VSRN model", "vsrn",
                           feature_rank=2),
    description="VSRN (Li et al. 2019): region features through a GCN and a GRU, a GRU caption encoder")
VSEPP_FULL_FAMILY = ModelFamily(
    name="vsepp_full", label="VSE++", module=VSEPPFull, input="images",
    defaults={"cnn_type": DEFAULT_CNN, "finetune": False, **SIZES}, check=check_cnn,
    original=OriginalImage(original.is_full_image, original.map_full_image, "VSE++ EncoderImageFull",
                           "vsepp"), describe=describe_full,
    description="VSE++ on raw images: a ResNet or VGG CNN (frozen, or fine-tuned), a GRU caption encoder")



def check_vse_infty(params: dict) -> None:
    """A joint embedding of at least 2 (the MLP's hidden layer is half of it) and a region drop in [0, 1)."""
    if params["embed_size"] < 2:
        raise CocosError(f"--embed-size must be an integer of at least 2, got {params['embed_size']!r}")
    if not 0 <= params["region_drop"] < 1:
        raise CocosError(f"--region-drop must be in [0, 1), got {params['region_drop']!r}")


def check_vse_infty_full(params: dict) -> None:
    backbones = [c for c in CNN_TYPES if not c.startswith("vgg")]
    if params["cnn_type"] not in backbones:
        raise CocosError(f"unknown backbone '{params['cnn_type']}' (choose from {', '.join(backbones)})")
    if params["embed_size"] < 1:
        raise CocosError(f"--embed-size must be an integer of at least 1, got {params['embed_size']!r}")
    for name in ("embedding_warmup_epochs", "backbone_warmup_epochs"):
        if params[name] < 0:
            raise CocosError(f"--{name.replace('_', '-')} must be an integer of at least 0, got {params[name]!r}")


def describe_vse_infty_full(hparams: dict) -> str:
    return model_label("vse_infty_full", hparams)


def _read_bert(path: str):
    from cocos.data.wordpiece import BertFolder

    return BertFolder.read(path)


def _read_clip(path: str):
    from cocos.data.clip import CLIPFolder

    return CLIPFolder.read(path, copies=4)  # to train: the weights, their gradient and AdamW's two moments


def _clip_checkpoint(folder, data, *, log=None) -> dict:
    from cocos.models.clip_folder import clip_checkpoint

    return clip_checkpoint(folder, data, log=log)


def _read_siglip(path: str):
    from cocos.data.siglip import SiglipFolder

    return SiglipFolder.read(path, copies=4)  # to train: the weights, their gradient and AdamW's two moments


def _siglip_checkpoint(folder, data, *, log=None) -> dict:
    from cocos.models.siglip_folder import siglip_checkpoint

    return siglip_checkpoint(folder, data, log=log)


# VSE∞'s caption encoder: a Hugging Face BERT folder (its config, word pieces and weights)
BERT_SOURCE = Source(
    name="bert", what="a Hugging Face BERT folder (config.json, weights, vocab.txt or tokenizer.json), e.g. "
                      "bert-base-uncased saved on disk",
    read=_read_bert, records=lambda folder: {"bert_config": dict(folder.config)}, recorded=("bert_config",),
    load=lambda model, folder: model.load_text_encoder(folder.path), coder_words="its BERT's word pieces")
# a CLIP dual encoder's starting point: a Hugging Face CLIP folder (config, preprocessing, tokenizer, weights)
CLIP_SOURCE = Source(
    name="clip", what="a Hugging Face CLIP folder (config.json, weights, tokenizer files, preprocessor_config.json "
                      "or processor_config.json) saved on disk",
    read=_read_clip, records=lambda folder: {"clip_config": folder.config, "preprocess": folder.preprocess.record()},
    recorded=("clip_config", "preprocess"), load=lambda model, folder: model.load_pretrained(folder.path),
    coder_words="its CLIP tokenizer")

# VSE∞'s training (woodfrog/vse_infty train_region.sh, vse.py): AdamW with weight decay 1e-4, lr 5e-4 with the BERT at a
# tenth, x0.1 after 15 of 25 epochs, batch 128, gradient norm clipped at 2, one epoch of the sum-of-hinges warm-up
VSE_INFTY_RECIPE = {"optimizer": "adamw", "weight_decay": 1e-4, "lr": 5e-4, "lr_groups": {"txt_enc.bert": 0.1},
                    "epochs": 25, "lr_update": 15, "batch_size": 128, "grad_clip": 2.0, "warmup_epochs": 1}
VSE_INFTY_FAMILY = ModelFamily(
    name="vse_infty", label="VSE∞", module=VSEInfty, input="features", text="wordpiece",
    defaults={"embed_size": DEFAULT_EMBED_SIZE, "region_drop": REGION_DROP}, check=check_vse_infty, min_batch=2,
    images_family="vse_infty_full", recipe=VSE_INFTY_RECIPE, imports="vse_infty's model_best.pth (--bert)",
    sources=(BERT_SOURCE,),
    description="VSE∞ (Chen et al. 2021): region features + MLP residual and a BERT (--bert DIR), each pooled by GPO")
VSE_INFTY_FULL_FAMILY = ModelFamily(
    name="vse_infty_full", label="VSE∞", module=VSEInftyFull, input="images", text="wordpiece",
    defaults={"cnn_type": "resnext101_32x8d", "finetune": False, "embed_size": DEFAULT_EMBED_SIZE,
              "embedding_warmup_epochs": 2, "backbone_warmup_epochs": 5},
    check=check_vse_infty_full, describe=describe_vse_infty_full, imports="vse_infty's model_best.pth (--bert)",
    recipe={**VSE_INFTY_RECIPE, "lr_groups": {"txt_enc.bert": 0.1, "img_enc.backbone": 0.01}}, sources=(BERT_SOURCE,),
    description="VSE∞ on raw images: a ResNeXt backbone's grid (WSL, --cnn-weights) and a BERT, each pooled by GPO")



def check_clip(params: dict) -> None:
    check_freeze(params["freeze"], params["unfrozen_blocks"])


# fine-tuning a CLIP as open_clip does: AdamW (weight decay 0.1) at a small rate, no gradient clipping, the
# temperature learned
CLIP_RECIPE = {"optimizer": "adamw", "weight_decay": 0.1, "lr": 1e-5, "grad_clip": 0.0, "learn_tau": True}
CLIP_FAMILY = ModelFamily(
    name="clip", label="CLIP", module=CLIPDual, input="images", text="clip",
    defaults={"freeze": "none", "unfrozen_blocks": 0}, check=check_clip, describe=describe_clip, recipe=CLIP_RECIPE,
    sources=(CLIP_SOURCE,), folders={"clip": _clip_checkpoint},
    imports="a Hugging Face CLIP folder (analyze/import CLIP_DIR --data)",
    description="CLIP-style dual encoder (Radford et al. 2021): a Hugging Face CLIPModel folder (--clip DIR), "
                "its tokenizer and preprocessing")


# a SigLIP dual encoder's starting point: a Hugging Face SigLIP folder (config, preprocessing, tokenizer, weights)
SIGLIP_SOURCE = Source(
    name="siglip", what="a Hugging Face SigLIP folder (config.json, weights, tokenizer.json and "
                        "tokenizer_config.json, preprocessor_config.json or processor_config.json) saved on disk",
    read=_read_siglip,
    records=lambda folder: {"siglip_config": folder.config, "preprocess": folder.preprocess.record(),
                            "text_padding": folder.padding.record()},
    recorded=("siglip_config", "preprocess", "text_padding"),
    load=lambda model, folder: model.load_pretrained(folder.path), coder_words="its SigLIP tokenizer")
# fine-tuning a SigLIP as open_clip does: AdamW (weight decay 0.1) at a small rate, no gradient clipping, and SigLIP's
# own loss unless told (its t and b learned as the model's logit_scale and logit_bias, cocos.losses.siglip); a loss
# with a softmax temperature (NT-Xent) learns it as 1 / t, through logit_scale, as CLIP's
SIGLIP_RECIPE = {"optimizer": "adamw", "weight_decay": 0.1, "lr": 1e-5, "grad_clip": 0.0, "loss": "siglip",
                 "learn_tau": True}
SIGLIP_FAMILY = ModelFamily(
    name="siglip", label="SigLIP", module=SiglipDual, input="images", text="clip",
    defaults={"freeze": "none", "unfrozen_blocks": 0}, check=check_clip, describe=describe_siglip,
    recipe=SIGLIP_RECIPE, sources=(SIGLIP_SOURCE,), folders={"siglip": _siglip_checkpoint},
    imports="a Hugging Face SigLIP folder (analyze/import SIGLIP_DIR --data)",
    description="SigLIP dual encoder (Zhai et al. 2023): a Hugging Face SiglipModel folder (--siglip DIR), its "
                "tokenizer (captions padded to its length) and preprocessing")

for _family in (VSEPP_FAMILY, VSRN_FAMILY, VSEPP_FULL_FAMILY, VSE_INFTY_FAMILY, VSE_INFTY_FULL_FAMILY, CLIP_FAMILY,
                SIGLIP_FAMILY):
    register(_family)
