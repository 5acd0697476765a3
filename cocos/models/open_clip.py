"""open_clip checkpoints (``epoch_K.pt``) as cocos checkpoints of the ``clip`` family.

``cocos analyze epoch_K.pt --open-clip-config CONFIG.json --tokenizer DIR --data IMAGES`` (and ``cocos import``
likewise) reads a checkpoint of open_clip's trainer (``{"epoch", "name", "state_dict", "optimizer"}``, keys behind
``module.`` under DDP; or a bare state dict, as open_clip's released weights files are) for one of open_clip's
ViT + text-transformer CLIPs (its standard model configs: ``ViT-B-32.json``, ``ViT-B-16-quickgelu.json``, ...;
or a Hugging Face hub ``open_clip_config.json``, ``{"model_cfg", "preprocess_cfg"}``), and maps it onto the
``clip`` family (:class:`cocos.models.clip.CLIPDual`, a transformers ``CLIPModel``):

* **configuration** (:func:`read_config`, :func:`clip_config`): ``embed_dim`` -> ``projection_dim``; per tower
  ``width`` -> ``hidden_size``, ``layers`` -> ``num_hidden_layers``, ``int(width * mlp_ratio)`` ->
  ``intermediate_size``, heads (the vision tower's ``width // head_width``, the text tower's ``heads``),
  ``image_size``, ``patch_size``, ``context_length`` -> ``max_position_embeddings``, ``vocab_size``; ``quick_gelu``
  -> ``hidden_act`` ``quick_gelu`` (else ``gelu``, torch's exact ``nn.GELU``); LayerNorm eps 1e-5 (or
  ``norm_kwargs.eps``). The text tower pools the largest token id (open_clip's ``argmax`` pool, its end-of-text
  token): the text config's ``eos_token_id`` is 2, for which transformers' ``CLIPTextModel`` keeps exactly that
  pooling (``input_ids.argmax(-1)``, its handling of configs saved before transformers PR #24773).
* **weights** (:func:`convert_state_dict`): every open_clip tensor is used and every ``CLIPModel`` tensor filled:
  ``in_proj_weight``/``in_proj_bias`` split into q, k, v; ``visual.conv1``, ``class_embedding``,
  ``positional_embedding``, ``ln_pre``, ``ln_post``, ``token_embedding``, ``ln_final``, the blocks' ``ln_1``,
  ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``, ``attn.out_proj``; ``visual.proj`` and ``text_projection`` transposed
  (open_clip multiplies ``x @ proj``, transformers' ``Linear`` stores ``proj.T``); ``logit_scale``. A missing,
  extra, misshapen, non-floating or non-finite tensor is one line naming it. ``logit_bias`` (a SigLIP-loss model:
  ``init_logit_bias`` in its config) is no weight of ``CLIPModel``: it goes to the recorded loss.
* **loss**: NT-Xent at ``tau = 1 / exp(logit_scale)`` (CLIP's clamp at 100, as a CLIP folder's), or, for a
  checkpoint with ``logit_bias``, ``siglip`` with ``{"t": exp(logit_scale), "b": logit_bias}``.
* **tokenizer**: open_clip's ``SimpleTokenizer`` is OpenAI's byte-level BPE, what a Hugging Face CLIP tokenizer
  folder holds (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``, e.g. ``openai/clip-vit-base-patch32``
  saved on disk): ``--tokenizer DIR``, cut at the config's ``context_length``; its size must be ``vocab_size``.
* **images**: open_clip's evaluation transform, the shorter side resized to ``image_size`` with the config's
  ``preprocess_cfg.interpolation`` (bicubic unless bilinear), a centre crop, normalised with its ``mean``/``std``
  (OpenAI's by default): :class:`cocos.data.clip.Preprocess`, its centre crop torchvision's ``CenterCrop``
  (``round((h - c) / 2)``, half to even; a CLIP folder's processor takes ``int((h - c) / 2)``, one pixel apart when
  ``h - c`` is 3 mod 4), recorded as the preprocess record's ``crop``.

**Refused**, in one line naming the key: timm vision towers (``timm_model_name``), ResNet towers (``layers`` a list,
open_clip's ``ModifiedResNet``), Hugging Face text towers (``hf_model_name``) and tokenizers (``hf_tokenizer_name``,
``tokenizer_kwargs``), CoCa (``multimodal_cfg``), the attentional pooler, layer scale (``ls_init_value``),
``no_causal_mask``, a ``pool_type`` other than ``tok``/``argmax``, ``final_ln_after_pool``, ``no_ln_pre``,
``embed_cls``, a text projection other than a bias-free matrix, custom attention blocks, ``act_kwargs``, a
non-square image or patch, a ``resize_mode`` other than ``shortest``; any key open_clip's config classes do not
have. Nothing in the file runs: it is read with ``torch.load(weights_only=True)``
(:func:`cocos.safeload.load_torch_file`; ``--trust-checkpoint`` for files the user trusts).
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import torch

from cocos.data.clip import CLIPCoder, Preprocess
from cocos.errors import CocosError
from cocos.hf import check_layers, check_vocab, config_int, read_json
from cocos.models.clip import CLIPDual
from cocos.models.clip_folder import dual_checkpoint, image_data

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
LEGACY_EOS = 2  # transformers' CLIPTextModel pools input_ids.argmax(-1) for this eos_token_id (open_clip's argmax)
INTERPOLATION = {"bicubic": 3, "bilinear": 2, "random": 3}  # open_clip's eval transform: random -> bicubic

# Keys of open_clip's CLIPVisionCfg / CLIPTextCfg that change the model, with the one value cocos maps (the
# default) and what a non-default value is, in words.
VISION_FIXED = {
    "ls_init_value": (None, "layer scale"), "attentional_pool": (False, "an attentional pooler"),
    "no_ln_pre": (False, "a tower without ln_pre"), "pos_embed_type": ("learnable", "fixed position embeddings"),
    "final_ln_after_pool": (False, "ln_post after pooling"),
    "pool_type": ("tok", "a pooling other than the class token"),
    "timm_model_name": (None, "a timm vision tower"), "act_kwargs": (None, "activation options"),
    "block_type": (None, "custom attention blocks"),
}
TEXT_FIXED = {
    "hf_model_name": (None, "a Hugging Face text tower"),
    "hf_tokenizer_name": (None, "a tokenizer other than OpenAI's BPE"),
    "tokenizer_mode": (None, "a tokenizer other than OpenAI's BPE"),
    "tokenizer_kwargs": (None, "tokenizer options (open_clip's cleaning other than OpenAI's)"),
    "ls_init_value": (None, "layer scale"), "embed_cls": (False, "a class token"),
    "no_causal_mask": (False, "a text tower without the causal mask"),
    "final_ln_after_pool": (False, "ln_final after pooling"),
    "pool_type": ("argmax", "a pooling other than the end-of-text (argmax) token"),
    "proj_bias": (False, "a text projection with a bias"), "proj_type": ("linear", "a text projection other than "
                                                                          "a matrix"),
    "act_kwargs": (None, "activation options"), "block_type": (None, "custom attention blocks"),
}
CUSTOM_BLOCK = ("qk_norm", "scaled_cosine_attn", "scale_heads", "scale_attn_inner", "scale_attn", "scale_fc")
for _fixed in (VISION_FIXED, TEXT_FIXED):
    _fixed.update({k: (False, "custom attention blocks") for k in CUSTOM_BLOCK})
# keys read, or without effect on the frozen model's embeddings (training-time options, another tower's options)
VISION_FREE = ("image_size", "layers", "width", "head_width", "mlp_ratio", "patch_size", "patch_dropout",
               "output_tokens", "norm_kwargs", "attn_pooler_queries", "attn_pooler_heads", "timm_model_pretrained",
               "timm_pool", "timm_proj", "timm_proj_bias", "timm_drop", "timm_drop_path")
TEXT_FREE = ("context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio", "pad_id", "eos_id",
             "output_tokens", "norm_kwargs", "hf_model_pretrained", "hf_proj_type", "hf_pooler_type")
TOP_KEYS = ("embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "init_logit_scale", "init_logit_bias",
            "nonscalar_logit_scale", "custom_text", "preprocess_cfg")
PREPROCESS_KEYS = ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color")


# -- the configuration ----------------------------------------------------------------------------------------


def read_config(path: str | os.PathLike) -> dict:
    """An open_clip model config (``ViT-B-32.json``; or a hub ``open_clip_config.json``: its ``model_cfg`` and
    ``preprocess_cfg``), checked: the plain dict of what cocos maps (:func:`clip_config`, :func:`preprocess_of`)
    with ``logit_bias`` (whether the model has one), ``custom_text`` and ``nonscalar`` (a ``(1,)`` logit scale);
    one line naming the file and the key for anything else."""
    path = Path(path)
    raw = read_json(path, "open_clip model config")
    where = str(path)
    if "model_cfg" in raw:  # a Hugging Face hub open_clip_config.json
        unknown = sorted(set(raw) - {"model_cfg", "preprocess_cfg"})
        if unknown:
            raise CocosError(f"{where}: {unknown[0]} is not a key of an open_clip_config.json")
        model, preprocess = raw["model_cfg"], raw.get("preprocess_cfg")
        if not isinstance(model, dict):
            raise CocosError(f"{where}: model_cfg is not a JSON object")
        if isinstance(model.get("preprocess_cfg"), dict) and preprocess is not None:
            raise CocosError(f"{where}: preprocess_cfg is given twice (in model_cfg and beside it)")
        model = {**model, "preprocess_cfg": preprocess if preprocess is not None else model.get("preprocess_cfg")}
    else:
        model = raw
    return _check_model(model, where)


def _check_model(model: dict, where: str) -> dict:
    if "multimodal_cfg" in model:
        raise CocosError(f"{where}: a CoCa model (multimodal_cfg); cocos reads open_clip's CLIP models")
    unknown = [k for k in model if k not in TOP_KEYS]
    if unknown:
        raise CocosError(f"{where}: {unknown[0]} is not a key of an open_clip CLIP config")
    vision, text = (_section(model, name, where) for name in ("vision_cfg", "text_cfg"))
    _check_fixed(vision, VISION_FIXED, VISION_FREE, where, "vision_cfg")
    _check_fixed(text, TEXT_FIXED, TEXT_FREE, where, "text_cfg")
    for key in ("quick_gelu", "custom_text", "nonscalar_logit_scale"):
        if not isinstance(model.get(key, False), bool):
            raise CocosError(f"{where}: {key} must be true or false, got {str(model[key])[:40]!r}")
    bias = model.get("init_logit_bias")
    if bias is not None and (isinstance(bias, bool) or not isinstance(bias, (int, float))):
        raise CocosError(f"{where}: init_logit_bias must be a number, got {str(bias)[:40]!r}")
    out = {"embed_dim": config_int(model, "embed_dim", where), "quick_gelu": bool(model.get("quick_gelu", False)),
           "logit_bias": bias is not None, "custom_text": bool(model.get("custom_text", False)),
           "nonscalar": bool(model.get("nonscalar_logit_scale", False)),
           "vision": _vision(vision, where), "text": _text(text, where)}
    out["preprocess"] = preprocess_of(model.get("preprocess_cfg"), out["vision"]["image_size"], where)
    return out


def _section(model: dict, name: str, where: str) -> dict:
    section = model.get(name)
    if not isinstance(section, dict):
        raise CocosError(f"{where}: no {name} (a JSON object)")
    return section


def _check_fixed(section: dict, fixed: dict, free: tuple, where: str, name: str) -> None:
    """Every key one cocos maps: a free one, or a fixed one at the value cocos maps (``{}`` and null alike for the
    option dicts); one line naming the key and what its value would be."""
    for key, value in section.items():
        if key in free:
            continue
        if key not in fixed:
            raise CocosError(f"{where}: {name}.{key} is not a key of open_clip's {name}")
        want, what = fixed[key]
        if value == want or (want is None and value in ({}, None)) or (key == "block_type" and value == "default"):
            continue
        raise CocosError(f"{where}: {name}.{key} = {str(value)[:60]}: {what}, which cocos's CLIP model "
                         "(transformers' CLIPModel) does not have")


def _square(value, where: str, key: str) -> int:
    """An int, or a list of two equal ints (open_clip's ``to_2tuple``)."""
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    elif isinstance(value, list):
        raise CocosError(f"{where}: {key} {value}: only square images and patches are supported")
    return config_int({key: value}, key, where)


def _ratio(section: dict, where: str, name: str) -> float:
    ratio = section.get("mlp_ratio", 4.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1e4:
        raise CocosError(f"{where}: {name}.mlp_ratio must be a positive number, got {str(ratio)[:40]!r}")
    return float(ratio)


def _eps(section: dict, where: str, name: str) -> float:
    """LayerNorm's eps: 1e-5 (torch's, open_clip's) or ``norm_kwargs.eps``; other norm options are refused."""
    kwargs = section.get("norm_kwargs") or {}
    if not isinstance(kwargs, dict) or set(kwargs) - {"eps"}:
        raise CocosError(f"{where}: {name}.norm_kwargs {str(kwargs)[:60]}: only eps is supported")
    eps = kwargs.get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CocosError(f"{where}: {name}.norm_kwargs.eps must be a positive number below 1, got {str(eps)[:40]!r}")
    return float(eps)


def _vision(section: dict, where: str) -> dict:
    layers = section.get("layers", 12)
    if isinstance(layers, list):
        raise CocosError(f"{where}: vision_cfg.layers {layers}: a ResNet image tower (open_clip's ModifiedResNet), "
                         "which cocos's CLIP model (a ViT) does not have")
    width = config_int(section, "width", where, 768, prefix="vision_cfg.")
    head_width = config_int(section, "head_width", where, 64, prefix="vision_cfg.")
    heads = width // head_width
    if heads < 1 or width % heads:
        raise CocosError(f"{where}: vision_cfg.width {width} does not split into heads of head_width {head_width}")
    out = {"width": width, "heads": heads, "layers": config_int(section, "layers", where, 12, prefix="vision_cfg."),
           "mlp": int(width * _ratio(section, where, "vision_cfg")), "eps": _eps(section, where, "vision_cfg"),
           "image_size": _square(section.get("image_size", 224), where, "vision_cfg.image_size"),
           "patch_size": _square(section.get("patch_size", 16), where, "vision_cfg.patch_size")}
    check_layers(out["layers"], where, "vision_cfg.layers")
    if out["mlp"] < 1:
        raise CocosError(f"{where}: vision_cfg.mlp_ratio gives an MLP of no units")
    if out["patch_size"] > out["image_size"]:
        raise CocosError(f"{where}: vision_cfg.patch_size {out['patch_size']} is larger than its image_size "
                         f"{out['image_size']}")
    return out


def _text(section: dict, where: str) -> dict:
    width = config_int(section, "width", where, 512, prefix="text_cfg.")
    heads = config_int(section, "heads", where, 8, prefix="text_cfg.")
    if width % heads:
        raise CocosError(f"{where}: text_cfg.width {width} is not a multiple of text_cfg.heads {heads}")
    out = {"width": width, "heads": heads, "layers": config_int(section, "layers", where, 12, prefix="text_cfg."),
           "mlp": int(width * _ratio(section, where, "text_cfg")), "eps": _eps(section, where, "text_cfg"),
           "context_length": config_int(section, "context_length", where, 77, minimum=2, prefix="text_cfg."),
           "vocab_size": config_int(section, "vocab_size", where, 49408, prefix="text_cfg.")}
    check_layers(out["layers"], where, "text_cfg.layers")
    check_vocab(out["vocab_size"], where, "text_cfg.vocab_size")
    if out["mlp"] < 1:
        raise CocosError(f"{where}: text_cfg.mlp_ratio gives an MLP of no units")
    return out


def _triple(value, where: str, key: str) -> tuple:
    values = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if (not isinstance(values, list) or len(values) != 3
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)):
        raise CocosError(f"{where}: preprocess_cfg.{key} must be a number or 3 numbers, got {str(value)[:60]}")
    return tuple(float(v) for v in values)


def preprocess_of(cfg, image_size: int, where: str) -> Preprocess:
    """open_clip's evaluation transform for a ``preprocess_cfg`` (absent: OpenAI's mean and std, bicubic): the
    shorter side resized to ``image_size``, a centre crop of it (module docstring)."""
    cfg = {} if cfg is None else cfg
    if not isinstance(cfg, dict):
        raise CocosError(f"{where}: preprocess_cfg is not a JSON object")
    unknown = [k for k in cfg if k not in PREPROCESS_KEYS]
    if unknown:
        raise CocosError(f"{where}: preprocess_cfg.{unknown[0]} is not a key of open_clip's PreprocessCfg")
    if cfg.get("resize_mode", "shortest") != "shortest":
        raise CocosError(f"{where}: preprocess_cfg.resize_mode {str(cfg['resize_mode'])[:40]!r}: only 'shortest' "
                         "(resize the shorter side, centre crop) is supported")
    if cfg.get("mode", "RGB") != "RGB":
        raise CocosError(f"{where}: preprocess_cfg.mode must be RGB")
    if cfg.get("size") is not None and _square(cfg["size"], where, "preprocess_cfg.size") != image_size:
        raise CocosError(f"{where}: preprocess_cfg.size {cfg['size']} is not vision_cfg.image_size {image_size}")
    interpolation = cfg.get("interpolation", "bicubic")
    if interpolation not in INTERPOLATION:
        raise CocosError(f"{where}: preprocess_cfg.interpolation {str(interpolation)[:40]!r}: choose from "
                         f"{', '.join(INTERPOLATION)}")
    record = {"resize": image_size, "crop_size": image_size,
              "mean": _triple(cfg.get("mean", list(OPENAI_MEAN)), where, "mean"),
              "std": _triple(cfg.get("std", list(OPENAI_STD)), where, "std"), "resample": INTERPOLATION[interpolation],
              "crop": "torchvision"}  # open_clip's CenterCrop: the offset rounded half to even
    try:
        return Preprocess.of(record)
    except CocosError as exc:
        raise CocosError(f"{where}: {exc}") from None


def clip_config(config: dict) -> dict:
    """The transformers ``CLIPConfig`` (as the dict a ``config.json`` holds) of a :func:`read_config` result."""
    act = "quick_gelu" if config["quick_gelu"] else "gelu"
    vision, text = config["vision"], config["text"]
    return {
        "model_type": "clip", "projection_dim": config["embed_dim"],
        "text_config": {"vocab_size": text["vocab_size"], "hidden_size": text["width"],
                        "intermediate_size": text["mlp"], "num_hidden_layers": text["layers"],
                        "num_attention_heads": text["heads"], "max_position_embeddings": text["context_length"],
                        "hidden_act": act, "layer_norm_eps": text["eps"], "eos_token_id": LEGACY_EOS,
                        "bos_token_id": 0, "pad_token_id": 0},
        "vision_config": {"hidden_size": vision["width"], "intermediate_size": vision["mlp"],
                          "num_hidden_layers": vision["layers"], "num_attention_heads": vision["heads"],
                          "num_channels": 3, "image_size": vision["image_size"], "patch_size": vision["patch_size"],
                          "hidden_act": act, "layer_norm_eps": vision["eps"]},
    }


# -- the weights ----------------------------------------------------------------------------------------------


def _tower(oc: str, hf: str, layers: int) -> list[tuple[str, str, str]]:
    """``(open_clip name, CLIPModel name, how)`` of one tower's transformer blocks."""
    out = []
    for i in range(layers):
        a, b = f"{oc}transformer.resblocks.{i}.", f"{hf}encoder.layers.{i}."
        out += [(f"{a}attn.in_proj_weight", f"{b}self_attn.%s_proj.weight", "qkv"),
                (f"{a}attn.in_proj_bias", f"{b}self_attn.%s_proj.bias", "qkv")]
        for src, dst in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                         ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
            out += [(f"{a}{src}.weight", f"{b}{dst}.weight", "copy"), (f"{a}{src}.bias", f"{b}{dst}.bias", "copy")]
    return out


def tensor_map(config: dict) -> list[tuple[str, str, str]]:
    """Every open_clip tensor of the config's model with its ``CLIPModel`` name and how it maps (``copy``, ``t``:
    transposed, ``qkv``: split in three along the first axis into ``%s`` = q, k, v, ``scalar``: reshaped to ``()``)."""
    v, t = "vision_model.", "text_model."
    txt = "text." if config["custom_text"] else ""
    out = [("visual.conv1.weight", f"{v}embeddings.patch_embedding.weight", "copy"),
           ("visual.class_embedding", f"{v}embeddings.class_embedding", "copy"),
           ("visual.positional_embedding", f"{v}embeddings.position_embedding.weight", "copy"),
           ("visual.ln_pre.weight", f"{v}pre_layrnorm.weight", "copy"),
           ("visual.ln_pre.bias", f"{v}pre_layrnorm.bias", "copy"),
           *_tower("visual.", v, config["vision"]["layers"]),
           ("visual.ln_post.weight", f"{v}post_layernorm.weight", "copy"),
           ("visual.ln_post.bias", f"{v}post_layernorm.bias", "copy"),
           ("visual.proj", "visual_projection.weight", "t"),
           (f"{txt}token_embedding.weight", f"{t}embeddings.token_embedding.weight", "copy"),
           (f"{txt}positional_embedding", f"{t}embeddings.position_embedding.weight", "copy"),
           *_tower(txt, t, config["text"]["layers"]),
           (f"{txt}ln_final.weight", f"{t}final_layer_norm.weight", "copy"),
           (f"{txt}ln_final.bias", f"{t}final_layer_norm.bias", "copy"),
           (f"{txt}text_projection", "text_projection.weight", "t"),
           ("logit_scale", "logit_scale", "scalar")]
    return out


def _source_shape(how: str, target: tuple, nonscalar: bool) -> tuple:
    if how == "t":
        return tuple(reversed(target))
    if how == "qkv":
        return (3 * target[0], *target[1:])
    if how == "scalar":
        return (1,) if nonscalar else ()
    return target


def _wanted_names(table: list[tuple[str, str, str]], config: dict) -> list[str]:
    """The open_clip names the config's model has, in :func:`tensor_map`'s order (``logit_bias`` last, when the
    config has one)."""
    return [src for src, _, _ in table] + (["logit_bias"] if config["logit_bias"] else [])


def _check_names(state: Mapping, names: list[str], where: str) -> None:
    """Every name of ``names`` in ``state`` and nothing else; one line naming the first missing (then extra)
    tensor."""
    wanted = set(names)
    missing = [src for src in names if src not in state]
    if missing:
        hint = " (a SigLIP-loss model's config: init_logit_bias)" if missing[0] == "logit_bias" else ""
        raise CocosError(f"{where}: lacks {missing[0]}{hint} ({len(missing)} of {len(wanted)} tensors of the "
                         "config's model missing); cocos loads a model completely or not at all")
    extra = [k for k in state if k not in wanted]
    if extra:
        hint = (" (a SigLIP-loss model: its config needs init_logit_bias)" if extra[0] == "logit_bias" else
                " (the config is not the checkpoint's model)")
        raise CocosError(f"{where}: holds {extra[0]}, which the config's model does not have{hint}")


def _place(out: dict, tensor: torch.Tensor, dst: str, how: str) -> None:
    """``tensor`` (checked, of the target's dtype) into ``out`` under its ``CLIPModel`` name(s), mapped as ``how``
    says (:func:`tensor_map`)."""
    if how == "qkv":
        for part, piece in zip("qkv", tensor.chunk(3, dim=0), strict=True):
            out[dst % part] = piece.clone()
    elif how == "t":
        out[dst] = tensor.t().contiguous()
    elif how == "scalar":
        out[dst] = tensor.reshape(()).clone()
    else:
        out[dst] = tensor.clone()


def _mapped(state: Mapping, table: list[tuple[str, str, str]], config: dict, expected: Mapping,
            where: str) -> dict:
    """The ``CLIPModel`` state dict of the (present) open_clip tensors of ``table``, each checked against its
    target's shape and cast to its dtype."""
    out = {}
    for src, dst, how in table:
        target = expected[dst % "q" if how == "qkv" else dst]
        tensor = _checked(state[src], src, _source_shape(how, tuple(target.shape), config["nonscalar"]), where)
        _place(out, tensor.to(target.dtype), dst, how)
    return out


def convert_state_dict(state: Mapping, config: dict, expected: Mapping, where: str) -> tuple[dict, float | None]:
    """open_clip's state dict (``module.`` already dropped) -> ``(CLIPModel state dict, logit_bias or None)``:
    every tensor of :func:`tensor_map` present, of its shape, floating point and finite, none left over; one line
    naming the tensor otherwise. ``expected``: ``CLIPModel``'s own state dict (shapes and dtypes)."""
    table = tensor_map(config)
    _check_names(state, _wanted_names(table, config), where)
    out = _mapped(state, table, config, expected, where)
    left = [k for k in expected if k not in out]
    if left:  # a CLIPModel weight no open_clip tensor fills: a mapping this version of transformers does not share
        raise CocosError(f"{where}: nothing of the checkpoint fills CLIPModel's {left[0]}")
    bias = None
    if config["logit_bias"]:
        bias = float(_checked(state["logit_bias"], "logit_bias", (1,) if config["nonscalar"] else (), where))
    return out, bias


def _checked(tensor, name: str, shape: tuple, where: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise CocosError(f"{where}: {name} is a {type(tensor).__name__}, not a tensor")
    if tuple(tensor.shape) != shape:
        raise CocosError(f"{where}: {name} has shape {tuple(tensor.shape)}, the config's model has {shape}")
    if not tensor.dtype.is_floating_point:
        raise CocosError(f"{where}: {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, not floating "
                         "point")
    if not bool(torch.isfinite(tensor).all()):
        raise CocosError(f"{where}: {name} holds NaN or Inf")
    return tensor


# -- the file -------------------------------------------------------------------------------------------------


def _unpack(obj, path: Path) -> tuple:
    """``(state dict, epoch, name)`` of what the file holds: a trainer checkpoint's, or a bare state dict's (epoch
    0, no name); one line for anything else."""
    if not isinstance(obj, Mapping):
        raise CocosError(f"{path}: not an open_clip checkpoint (a dict with a state_dict)")
    if obj.get("format") == "cocos-checkpoint":
        raise CocosError(f"{path}: a cocos checkpoint; --open-clip-config is for open_clip's checkpoints")
    if "state_dict" in obj:
        return obj["state_dict"], obj.get("epoch", 0), obj.get("name")
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, 0, None
    raise CocosError(f"{path}: not an open_clip checkpoint (a dict with a state_dict, or a state dict)")


def _check_unpacked(state, epoch, path: Path) -> None:
    """The state dict a non-empty dict with string keys, the epoch an integer of at least 0."""
    if not isinstance(state, Mapping) or not state or not all(isinstance(k, str) for k in state):
        raise CocosError(f"{path}: its state_dict is not a dict of named tensors")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise CocosError(f"{path}: its epoch must be an integer of at least 0, got {str(epoch)[:40]!r}")


def _unwrapped(state: Mapping, path: Path) -> Mapping:
    """The state dict with DDP's ``module.`` dropped (when every key has it; one line when only some do)."""
    wrapped = [k.startswith("module.") for k in state]
    if any(wrapped) and not all(wrapped):
        first = next(k for k, w in zip(state, wrapped, strict=True) if not w)
        raise CocosError(f"{path}: some tensors are behind module. (DDP) and some not ({first})")
    if all(wrapped):
        return {k.removeprefix("module."): v for k, v in state.items()}
    return state


def read_checkpoint(path: str | os.PathLike, trust: bool = False) -> tuple[dict, dict]:
    """``(state dict without module., {"epoch", "name"})`` of an open_clip checkpoint file, read without running
    code from it (unless ``trust``); a bare state dict (open_clip's released weights) is epoch 0."""
    from cocos.safeload import load_torch_file

    path = Path(path)
    mmap = path.is_file() and zipfile.is_zipfile(path)  # the optimizer's moments stay on disk
    obj = load_torch_file(path, trust=trust, mmap=mmap, what="open_clip checkpoint")
    state, epoch, name = _unpack(obj, path)
    _check_unpacked(state, epoch, path)
    state = _unwrapped(state, path)
    return dict(state), {"epoch": int(epoch), "name": name if isinstance(name, str) else None}


def open_clip_checkpoint(path: str | os.PathLike, config_path: str | os.PathLike, tokenizer: str | os.PathLike | None,
                         data: str | os.PathLike | None, *, trust: bool = False, log=None) -> dict:
    """The cocos checkpoint (plain types and tensors) of an open_clip checkpoint for the image dataset ``data``."""

    path = Path(path)
    if tokenizer is None:
        raise CocosError(f"{path}: an open_clip checkpoint holds no tokenizer; pass --tokenizer DIR (a Hugging Face "
                         "CLIP tokenizer folder: tokenizer.json, or vocab.json and merges.txt)")
    data = image_data(path, data, "an open_clip checkpoint", "CLIP")
    config = read_config(config_path)
    coder = _coder(Path(tokenizer), config["text"])
    hf_config = clip_config(config)
    model = CLIPDual(len(coder), hf_config, config["preprocess"].record())
    state, meta = read_checkpoint(path, trust=trust)
    weights, bias = convert_state_dict(state, config, model.clip.state_dict(), str(path))
    del state
    model.clip.load_state_dict(weights)
    del weights
    loss = ({"name": "siglip", "params": {"t": math.exp(float(model.logit_scale.detach())), "b": bias}, "compat": False}
            if bias is not None else {"name": "ntxent", "params": {"tau": model.temperature()}, "compat": False})
    return dual_checkpoint(model, coder, loss, data, crop_size=model.preprocess.crop_size, log=log, epoch=meta["epoch"],
                           open_clip={"file": str(path.resolve()), "name": meta["name"],
                                      "config": str(Path(config_path).resolve()),
                                      "tokenizer": str(Path(tokenizer).resolve())})


def _coder(folder: Path, text: dict) -> CLIPCoder:
    """The tokenizer folder's BPE, cut at ``context_length``; its size must be the text tower's ``vocab_size``."""
    if not folder.is_dir():
        raise CocosError(f"{folder}: no such tokenizer folder (a Hugging Face CLIP tokenizer: tokenizer.json, or "
                         "vocab.json and merges.txt)")
    coder = CLIPCoder.from_folder(folder, text["context_length"], text["vocab_size"])
    if len(coder) != text["vocab_size"]:
        raise CocosError(f"{folder}: its tokenizer has {len(coder):,} tokens, the config's text_cfg.vocab_size is "
                         f"{text['vocab_size']:,} (not the model's tokenizer)")
    return coder


__all__ = ["clip_config", "convert_state_dict", "open_clip_checkpoint", "preprocess_of", "read_checkpoint",
           "read_config", "tensor_map"]
