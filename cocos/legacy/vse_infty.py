"""Checkpoints of the original VSE∞ code (woodfrog/vse_infty; the GOAL authors' microsoft/VSE_Gradient trains the
same model code): ``model_best.pth`` / ``checkpoint.pth``.

vse_infty's ``train.py`` saves ``{'epoch', 'model': [img_enc state dict, txt_enc state dict], 'best_rsum', 'opt':
argparse.Namespace, 'Eiters'}``: the layout of VSE++'s ``model_best.pth.tar`` (:mod:`cocos.legacy`), told apart by
the caption encoder, a BERT (``bert.*`` keys). The file holds no vocabulary and no BERT configuration: both come
from the BERT folder the run was trained with (``--bert DIR``: ``config.json`` and ``vocab.txt``,
:class:`cocos.data.wordpiece.BertFolder`), the data from ``--data``. It is read as every import is
(:func:`cocos.legacy.read_checkpoint_file`: nothing in the file runs) and converted in memory to a cocos checkpoint
of the ``vse_infty`` family (``opt.precomp_enc_type`` ``basic``: region features) or ``vse_infty_full``
(``backbone``: a CNN's grid over raw images).

**Layout mapping** (original key -> cocos key; a ``module.`` prefix of DataParallel is dropped first):

* ``EncoderImageAggr`` (``basic``): ``fc.*``, ``mlp.layers.{0,1}.*``, ``mlp.bns.{0,1}.*``, ``gpool.gru.*``,
  ``gpool.linear.weight`` -> ``img_enc.<same>``.
* ``EncoderImageFull`` (``backbone``): ``backbone.resnet.<torchvision names>`` -> ``img_enc.backbone.<names>``
  (its classifier ``backbone.resnet.fc.*`` dropped: the grid is read before it); ``backbone.base.N.*`` and
  ``backbone.top.0.*`` (the same tensors again, under the ``nn.Sequential`` views of the ResNet) dropped;
  ``image_encoder.{fc,gpool}.*`` -> ``img_enc.image_encoder.<same>``. Only the backbones of the torchvision
  architecture are imported: ``backbone_source`` ``wsl`` and ``imagenet_resnext`` (torch hub's
  ``resnext101_32x8d``). The other sources build vse_infty's own ResNet (``lib/modules/resnet.py``), which puts
  each block's stride in its first 1×1 convolution and max-pools with ``ceil_mode`` and no padding: cocos's
  torchvision-layout ResNets would compute other features from the same weights, so those are refused.
* ``EncoderText``: ``bert.<BertModel names>``, ``linear.*``, ``gpool.*`` -> ``txt_enc.<same>``;
  ``bert.embeddings.position_ids`` (and ``token_type_ids``), buffers that transformers before 4.31 saved and that
  are no state of today's ``BertModel``, dropped.

BatchNorm state of a torch before 0.4.1 (no ``num_batches_tracked``) gets a zero counter. ``opt.no_imgnorm`` or
``opt.no_txtnorm`` (embeddings not L2-normalised) cannot be represented and are refused, as is anything else that
does not fit, each in one line naming the file and the field; so is an ``opt`` value nested more than
:data:`cocos.legacy.MAX_OPT_DEPTH` deep (vse_infty's settings are numbers, strings and short lists), before
anything reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from cocos.data.precomp import PrecompSplit, data_fingerprint
from cocos.data.wordpiece import BertFolder
from cocos.errors import CocosError
from cocos.legacy import (
    _bool,
    _fit,
    _float,
    _int,
    _plain,
    _state_dict,
    is_legacy_checkpoint,
    loss_from_opt,
    opt_dict,
)
from cocos.models.vse_infty import REGION_DROP

CODE = "vse_infty"
# backbone_source -> the torchvision architecture torch hub built for it (wsl: facebookresearch/WSL-Images,
# imagenet_resnext: pytorch/vision v0.4.2); the "vsepp_" names are the same models
TORCHVISION_BACKBONES = {"wsl": "resnext101_32x8d", "vsepp_wsl": "resnext101_32x8d",
                         "imagenet_resnext": "resnext101_32x8d", "vsepp_resnext": "resnext101_32x8d"}
# backbone_source -> vse_infty's own Caffe-style ResNet (lib/modules/resnet.py): not representable
OWN_RESNETS = {"detector": "ResNet-101", "vsepp_detector": "ResNet-101", "imagenet": "ResNet-101",
               "vsepp_imagenet": "ResNet-101", "imagenet_res50": "ResNet-50", "vsepp_imagenet_res50": "ResNet-50",
               "imagenet_res152": "ResNet-152", "vsepp_imagenet_res152": "ResNet-152"}
# buffers older transformers saved with BertModel's state (no state of transformers 5's BertModel)
DROPPED_TEXT = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
WEIGHT_DECAY = 1e-4  # vse.py: AdamW(weight_decay=1e-4) for optim 'adam'
BERT_LR = 0.1  # vse.py: the BERT's parameter group at a tenth of the learning rate


def is_vse_infty_checkpoint(raw: object) -> bool:
    """The original layout (:func:`cocos.legacy.is_legacy_checkpoint`) with a BERT caption encoder."""
    if not is_legacy_checkpoint(raw):
        return False
    return any(isinstance(k, str) and k.removeprefix("module.").startswith("bert.") for k in raw["model"][1])


def checkpoint_from_raw(raw: dict, path: str | os.PathLike, *, vocab=None, data=None, bert=None) -> dict:
    """The converted checkpoint of a VSE∞ file: ``bert`` and ``data`` are needed, ``vocab`` is refused."""
    if vocab is not None:
        raise CocosError(f"{path}: a checkpoint of the original VSE∞ code (BERT word pieces, no vocabulary file); "
                         "pass --bert DIR (the BERT folder it was trained with) instead of --vocab")
    if bert is None:
        raise CocosError(f"{path}: a checkpoint of the original VSE∞ code; pass --bert DIR (the BERT folder it was "
                         "trained with: config.json, vocab.txt)")
    if data is None:
        raise CocosError(f"{path}: a checkpoint of the original VSE∞ code records no data folder; pass --data")
    return convert_checkpoint(raw, path, bert, data)


def convert_checkpoint(raw: dict, path: str | os.PathLike, bert: str | os.PathLike, data: str | os.PathLike,
                       k: int | None = None) -> dict:
    """The cocos checkpoint (plain types and tensors) of a vse_infty ``model_best.pth`` (module docstring)."""
    path = Path(path)
    opt = opt_dict(raw, path)  # every value nested at most MAX_OPT_DEPTH deep
    _refuse_unrepresentable(opt, path)
    folder = BertFolder.read(bert)
    img_sd = _state_dict(raw["model"][0], path, "image encoder")
    txt_sd = _state_dict(raw["model"][1], path, "text encoder")
    enc_type = opt.get("precomp_enc_type", "basic")
    if enc_type == "basic":
        kind = "vse_infty"
        state, img_dim, embed = _map_regions(img_sd, path)
    elif enc_type == "backbone":
        kind = "vse_infty_full"
        state, img_dim, embed = _map_grid(img_sd, path)
        cnn_type = _cnn_type(opt, path)
    else:
        raise CocosError(f"{path}: opt.precomp_enc_type = {enc_type!r}; vse_infty's image encoders are 'basic' "
                         "(region features) and 'backbone' (a CNN's grid)")
    text_state, text_embed = _map_text(txt_sd, folder, path)
    if text_embed != embed:
        raise CocosError(f"{path}: the image encoder embeds into {embed} dimensions but the text encoder into "
                         f"{text_embed}")
    state.update(text_state)
    _add_batch_counters(state)
    for name, actual in (("embed_size", embed), ("img_dim", img_dim)):
        recorded = _int(opt, name, None, path, minimum=1)
        if recorded is not None and recorded != actual:
            raise CocosError(f"{path}: opt says {name} {recorded} but the weights have {actual}")
    hparams = {"vocab_size": len(folder.coder), "bert_config": dict(folder.config), "embed_size": embed}
    if kind == "vse_infty":
        hparams.update(img_dim=img_dim, region_drop=REGION_DROP)
    else:
        factor = _float(opt, "backbone_lr_factor", path)
        hparams.update(cnn_type=cnn_type, finetune=factor is None or factor > 0)
        for name, default in (("embedding_warmup_epochs", 2), ("backbone_warmup_epochs", 5)):  # arguments.py's
            hparams[name] = _int(opt, name, default, path, minimum=0)
    state, hparams = _fit(kind, hparams, state, path)

    data = Path(data)
    if not data.is_dir():
        raise CocosError(f"{data}: no such data folder")
    k = int(k if k is not None else 5)
    images = kind == "vse_infty_full"
    feature_shape = [img_dim] if images else _feature_shape(data, k, img_dim, path)
    loss_name, loss_params = loss_from_opt(opt, path)
    return {
        "model": {"kind": kind, "hparams": hparams},
        "vocab": folder.coder.tokens,
        "text": folder.coder.options(),
        "state_dict": state,
        # vse_infty's ContrastiveLoss counts same-image pairs of a batch as negatives, as VSE++'s: compat
        "loss": {"name": loss_name, "params": loss_params, "compat": True},
        "data": {"path": str(data.resolve()), "fingerprint": data_fingerprint(data), "k": k,
                 "feature_shape": feature_shape, **({"input": "images"} if images else {})},
        "train": _train_record(opt, path, kind, data, k, embed, loss_name, loss_params, folder),
        "epoch": _int(raw, "epoch", 0, path, where="checkpoint"),
        "step": _int(raw, "Eiters", 0, path, where="checkpoint"),
        "metrics": {},
        "best_rsum": _float(raw, "best_rsum", path, where="checkpoint"),
        "history": [],
        "legacy": {"file": str(path), "code": CODE, "opt": _plain(opt), "bert": str(folder.path),
                   "note": "best_rsum is the original code's validation score"},
    }


def _refuse_unrepresentable(opt: dict, path: Path) -> None:
    for name, side in (("no_imgnorm", "image"), ("no_txtnorm", "caption")):
        if _bool(opt.get(name)):
            raise CocosError(f"{path}: trained with {name} (unnormalised {side} embeddings); cocos needs "
                             "L2-normalised embeddings (its similarities are cosines)")


def _cnn_type(opt: dict, path: Path) -> str:
    source = opt.get("backbone_source", "detector")  # vse_infty's argparse default
    if source in TORCHVISION_BACKBONES:
        return TORCHVISION_BACKBONES[source]
    if source in OWN_RESNETS:
        raise CocosError(f"{path}: opt.backbone_source = {source!r} is vse_infty's own {OWN_RESNETS[source]} (the "
                         "stride in each block's 1x1 convolution, max pooling with ceil_mode), not torchvision's; "
                         "cocos imports the torchvision backbones only (backbone_source wsl, imagenet_resnext)")
    raise CocosError(f"{path}: opt.backbone_source = {source!r}, which vse_infty does not know "
                     "(cocos imports wsl and imagenet_resnext)")


def _linear(sd: dict, prefix: str, path: Path, what: str) -> torch.Tensor:
    weight = sd.get(f"{prefix}weight")
    if weight is None or weight.dim() != 2:
        raise CocosError(f"{path}: the {what} lacks its {prefix}weight (a Linear layer's 2-d weight)")
    return weight


def _map_regions(sd: dict, path: Path) -> tuple[dict, int, int]:
    """``EncoderImageAggr`` (``basic``): ``(state, img_dim, embed_size)``."""
    if any(key.startswith(("backbone.", "image_encoder.")) for key in sd):
        raise CocosError(f"{path}: opt.precomp_enc_type is 'basic' (region features) but the image encoder holds "
                         "a backbone (backbone.*, image_encoder.*)")
    embed, img_dim = _linear(sd, "fc.", path, "image encoder").shape
    return {f"img_enc.{key}": value for key, value in sd.items()}, int(img_dim), int(embed)


def _map_grid(sd: dict, path: Path) -> tuple[dict, int, int]:
    """``EncoderImageFull`` (``backbone``): ``(state, img_dim, embed_size)``."""
    if not any(key.startswith("backbone.resnet.") for key in sd):
        raise CocosError(f"{path}: opt.precomp_enc_type is 'backbone' but the image encoder holds no backbone "
                         "weights (backbone.resnet.*)")
    state = {}
    for key, value in sd.items():
        if key.startswith(("backbone.base.", "backbone.top.", "backbone.resnet.fc.")):
            continue  # the same tensors again (the base/top views), and the classifier the grid does not use
        if key.startswith("backbone.resnet."):
            state["img_enc.backbone." + key.removeprefix("backbone.resnet.")] = value
        elif key.startswith("image_encoder."):
            state[f"img_enc.{key}"] = value
        else:
            raise CocosError(f"{path}: the image encoder holds {key}, which vse_infty's EncoderImageFull does not "
                             "(backbone.resnet.*, image_encoder.*)")
    embed, img_dim = _linear(sd, "image_encoder.fc.", path, "image encoder").shape
    return state, int(img_dim), int(embed)


def _map_text(sd: dict, folder: BertFolder, path: Path) -> tuple[dict, int]:
    """``EncoderText``: ``(state, embed_size)``, its BERT checked against the folder's ``config.json``."""
    sd = {key: value for key, value in sd.items() if key not in DROPPED_TEXT}
    words = sd.get("bert.embeddings.word_embeddings.weight")
    if words is None or words.dim() != 2:
        raise CocosError(f"{path}: the text encoder lacks its BERT word embedding "
                         "(bert.embeddings.word_embeddings.weight)")
    rows, hidden = (int(n) for n in words.shape)
    config = folder.path / "config.json"
    if rows != folder.config["vocab_size"]:
        raise CocosError(f"{path}: the BERT's word embedding has {rows} rows but {config} has vocab_size "
                         f"{folder.config['vocab_size']}; pass the BERT folder the model was trained with")
    if hidden != folder.config["hidden_size"]:
        raise CocosError(f"{path}: the BERT's hidden size is {hidden} but {config} has hidden_size "
                         f"{folder.config['hidden_size']}; pass the BERT folder the model was trained with")
    unknown = [key for key in sd if not key.startswith(("bert.", "linear.", "gpool."))]
    if unknown:
        raise CocosError(f"{path}: the text encoder holds {unknown[0]}, which vse_infty's EncoderText does not "
                         "(bert.*, linear.*, gpool.*)")
    embed, width = _linear(sd, "linear.", path, "text encoder").shape
    if width != hidden:
        raise CocosError(f"{path}: the text encoder's linear.weight takes {width} inputs but the BERT gives {hidden}")
    return {f"txt_enc.{key}": value for key, value in sd.items()}, int(embed)


def _add_batch_counters(state: dict) -> None:
    """A zero ``num_batches_tracked`` beside every BatchNorm's statistics that lack it (torch < 0.4.1)."""
    for key in [k for k in state if k.endswith(".running_mean")]:
        counter = key.removesuffix("running_mean") + "num_batches_tracked"
        state.setdefault(counter, torch.tensor(0, dtype=torch.long))


def _feature_shape(folder: Path, k: int, img_dim: int, path: Path) -> list[int]:
    feature_shape = list(PrecompSplit(folder, "train", k=k).feature_shape)
    if len(feature_shape) != 2:
        raise CocosError(f"{path}: vse_infty's EncoderImageAggr takes region features (N, R, {img_dim}); {folder} "
                         f"has features of shape (N, {', '.join(map(str, feature_shape))})")
    if feature_shape[-1] != img_dim:
        raise CocosError(f"{path}: the model takes {img_dim}-d image features but {folder} has "
                         f"{feature_shape[-1]}-d ones")
    return feature_shape


def _train_record(opt: dict, path: Path, kind: str, data: Path, k: int, embed: int, loss_name: str,
                  loss_params: dict, folder: BertFolder) -> dict:
    """The run's settings as ``train`` records them (what vse_infty's ``opt`` and ``vse.py`` say)."""
    record = {"model": kind, "loss": loss_name, "data": str(data.resolve()), "k": k,
              "batch_size": _int(opt, "batch_size", 128, path, minimum=1),
              "epochs": _int(opt, "num_epochs", None, path, minimum=1), "lr": _float(opt, "learning_rate", path),
              "lr_update": _int(opt, "lr_update", None, path, minimum=1), "grad_clip": _float(opt, "grad_clip", path),
              "embed_size": embed, "seed": 0, "compat": True, "margin": loss_params.get("margin"),
              "bert": str(folder.path)}
    warmup = _int(opt, "vse_mean_warmup_epochs", 0, path)
    if warmup and loss_name == "triplet_sh":  # the sum of hinges (mean violation) first, then the hardest negative
        record["warmup_epochs"] = warmup
    if str(opt.get("optim", "adam")) == "adam":  # vse.py: AdamW, the BERT at a tenth (the backbone at its factor)
        groups = {"txt_enc.bert": BERT_LR}
        factor = _float(opt, "backbone_lr_factor", path)
        if kind == "vse_infty_full" and factor is not None:
            groups["img_enc.backbone"] = factor
        record.update(optimizer="adamw", weight_decay=WEIGHT_DECAY, lr_groups=groups)
    return record


__all__ = ["checkpoint_from_raw", "convert_checkpoint", "is_vse_infty_checkpoint"]
