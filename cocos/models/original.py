"""The image encoders of the original VSE++ and VSRN code, mapped onto the cocos modules (pure renames and checks).

A built-in family's :class:`~cocos.models.family.OriginalImage` names two of these functions: one that tells whether
an original image encoder's state dict is its (``is_*``) and one that maps it (``map_*``: ``(state, hparams)``, the
state under the cocos module's names). :mod:`cocos.legacy` reads the original file, its ``opt`` and its text encoder,
asks each family whether the image encoder is its, and builds the checkpoint. Every refusal is one line naming the
file and what cocos cannot represent.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from cocos.errors import CocosError
from cocos.models.cnn import CNN_TYPES, build_cnn, check_cnn_state, strip_classifier

VSRN_KEYS = ("Rs_GCN_", "img_rnn.")


def is_full_image(sd: dict, opt: dict) -> bool:
    """VSE++ ``EncoderImageFull``: CNN weights (``cnn.*``), trained on raw images (``data_name`` not ``*_precomp``;
    with ``*_precomp`` the precomputed-feature mapping refuses the ``cnn.*`` weights)."""
    data_name = opt.get("data_name")
    raw = data_name is not None and not str(data_name).endswith("_precomp")
    return any(key.startswith("cnn.") for key in sd) and (raw or data_name is None)


def is_vsrn_image(sd: dict, opt: dict) -> bool:
    """VSRN ``EncoderImagePrecompAttn``: graph-reasoning blocks and an image GRU."""
    return not is_full_image(sd, opt) and any(key.startswith(VSRN_KEYS) for key in sd)


def is_vsepp_image(sd: dict, opt: dict) -> bool:
    """VSE++ ``EncoderImagePrecomp``: anything else (its mapping refuses weights other than ``fc``)."""
    return not is_full_image(sd, opt) and not is_vsrn_image(sd, opt)


def _bool(value: object) -> bool:
    return bool(value) if isinstance(value, (bool, int)) else str(value).lower() in ("true", "1", "yes")


def gru_tensors(sd: dict, prefix: str, path: Path, what: str) -> tuple[dict, int, int, int]:
    """A GRU's tensors under ``prefix``: ``(tensors, layers, input size, hidden size)``; refuses other RNNs."""
    keys = [k for k in sd if k.startswith(prefix)]
    if any(k.endswith("_reverse") for k in keys):
        raise CocosError(f"{path}: the {what} GRU is bidirectional; cocos models have a one-directional GRU")
    layers = sum(1 for k in keys if re.fullmatch(re.escape(prefix) + r"weight_ih_l\d+", k))
    if not layers or f"{prefix}weight_ih_l0" not in sd or f"{prefix}weight_hh_l0" not in sd:
        raise CocosError(f"{path}: the {what} lacks its GRU ({prefix}weight_ih_l0)")
    w_ih, w_hh = sd[f"{prefix}weight_ih_l0"], sd[f"{prefix}weight_hh_l0"]
    if w_ih.dim() != 2 or w_hh.dim() != 2:
        raise CocosError(f"{path}: {prefix}weight_ih_l0 is not a matrix")
    hidden = int(w_hh.shape[1])
    if w_ih.shape[0] != 3 * hidden:
        raise CocosError(f"{path}: the {what} RNN has {w_ih.shape[0]} gate rows for hidden size {hidden}; "
                         "cocos models take a GRU (3 gates), not an LSTM or plain RNN")
    return {k: sd[k] for k in keys}, layers, int(w_ih.shape[1]), hidden


def _linear(sd: dict, prefix: str, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    if f"{prefix}weight" not in sd or f"{prefix}bias" not in sd:
        raise CocosError(f"{path}: the image encoder lacks {prefix}weight / {prefix}bias")
    weight = sd[f"{prefix}weight"]
    if weight.dim() == 3 and weight.shape[-1] == 1:  # Conv1d with kernel size 1
        weight = weight[..., 0]
    if weight.dim() != 2:
        raise CocosError(f"{path}: {prefix}weight has shape {tuple(sd[f'{prefix}weight'].shape)}; expected a "
                         "linear map or a 1x1 convolution")
    return weight, sd[f"{prefix}bias"]


def _cnn_key(key: str) -> str:
    """``cnn.module.layer1.0.conv1.weight`` -> ``layer1.0.conv1.weight``; ``cnn.features.module.0.weight`` ->
    ``features.0.weight`` (VSE++ wraps a ResNet, but only a VGG's ``features``, in DataParallel)."""
    return ".".join(part for part in key.removeprefix("cnn.").split(".") if part != "module")


def map_full_image(sd: dict, path: Path, opt: dict) -> tuple[dict, dict]:
    """VSE++ ``EncoderImageFull``: the CNN of ``opt.cnn_type`` (classifier stripped) and ``fc``."""

    cnn_type = _full_cnn_type(opt, path)
    extra = sorted(k for k in sd if not k.startswith(("cnn.", "fc.")))
    if extra:
        raise CocosError(f"{path}: the image encoder holds weights other than cnn and fc ({', '.join(extra[:3])}); "
                         "cocos imports VSE++'s EncoderImageFull")
    cnn = _full_cnn_state(sd, path, cnn_type)
    weight, bias = _linear(sd, "fc.", path)
    state = {f"cnn.{k}": v for k, v in cnn.items()}
    state.update({"fc.weight": weight, "fc.bias": bias})
    return state, {"cnn_type": cnn_type, "embed_size": int(weight.shape[0]), "finetune": _bool(opt.get("finetune"))}


def _full_cnn_type(opt: dict, path: Path) -> str:
    """The ``cnn_type`` a VSE++ run was trained with (VSE++'s default: vgg19); one cocos builds, else refused."""
    cnn_type = opt.get("cnn_type", "vgg19")  # VSE++'s default
    if cnn_type not in CNN_TYPES:
        raise CocosError(f"{path}: trained with cnn_type {cnn_type!r}, which cocos does not support "
                         f"({', '.join(CNN_TYPES)})")
    return cnn_type


def _full_cnn_state(sd: dict, path: Path, cnn_type: str) -> dict:
    """The ``cnn.*`` weights under torchvision's current names of the trunk (classifier stripped), checked
    against the trunk's names and shapes."""
    cnn = _rename_old_classifier({_cnn_key(k): v for k, v in sd.items() if k.startswith("cnn.")})
    with torch.device("meta"):
        trunk = strip_classifier(build_cnn(cnn_type))
    _add_batch_counters(cnn, trunk.state_dict())
    check_cnn_state(cnn, {k: tuple(v.shape) for k, v in trunk.state_dict().items()},
                    f"{path}: the image encoder's CNN", cnn_type)
    return cnn


def _rename_old_classifier(cnn: dict) -> dict:
    """A VGG classifier saved by torchvision before pytorch/vision@989d52a (``classifier.1``/``.4``, as VSE++'s
    load_state_dict reads it) under the current names (``classifier.0``/``.3``); other state dicts unchanged."""
    if "classifier.1.weight" not in cnn:
        return cnn
    for old, new in (("1", "0"), ("4", "3")):
        for name in ("weight", "bias"):
            if f"classifier.{old}.{name}" in cnn:
                cnn[f"classifier.{new}.{name}"] = cnn.pop(f"classifier.{old}.{name}")
    return cnn


def _add_batch_counters(cnn: dict, reference: dict) -> None:
    """BatchNorm of torch < 0.4.1 (the original VSE++ runs) lacks ``num_batches_tracked``: a zero counter for each
    BatchNorm of ``reference`` whose running statistics ``cnn`` holds without it."""
    for key in reference:
        if key.endswith(".num_batches_tracked") and key not in cnn and key.replace("num_batches_tracked",
                                                                                   "running_mean") in cnn:
            cnn[key] = torch.tensor(0, dtype=torch.long)


def map_vsepp_image(sd: dict, path: Path, opt: dict | None = None) -> tuple[dict, dict]:
    extra = sorted(set(sd) - {"fc.weight", "fc.bias"})
    if extra:
        raise CocosError(f"{path}: the image encoder holds weights other than fc ({', '.join(extra[:3])}); cocos "
                         "imports VSE++'s EncoderImagePrecomp (precomputed features)")
    weight, bias = _linear(sd, "fc.", path)
    return ({"fc.weight": weight, "fc.bias": bias},
            {"img_dim": int(weight.shape[1]), "embed_size": int(weight.shape[0])})


_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _batchnorm(sd: dict, src: str, dst: str, path: Path) -> dict:
    out = {}
    for name in _BN:
        if f"{src}{name}" in sd:
            out[f"{dst}{name}"] = sd[f"{src}{name}"]
        elif name == "num_batches_tracked":  # state dicts of torch < 0.4.1 lack it
            out[f"{dst}{name}"] = torch.tensor(0, dtype=torch.long)
        else:
            raise CocosError(f"{path}: the image encoder lacks {src}{name}")
    return out


def map_vsrn_image(sd: dict, path: Path, opt: dict) -> tuple[dict, dict]:
    """VSRN ``EncoderImagePrecompAttn``: ``fc``, the graph-reasoning blocks ``Rs_GCN_1..n`` (as ``gcn.0..n-1``), the
    one-layer image GRU and, where present, the final BatchNorm ``bn``; any other weight is refused."""
    weight, bias = _linear(sd, "fc.", path)
    state = {"fc.weight": weight, "fc.bias": bias}
    blocks = _gcn_blocks(sd, path)
    for i in blocks:
        state.update(_gcn_block(sd, i, path))
    state.update(_vsrn_gru(sd, path))
    final_bn = any(k.startswith("bn.") for k in sd)
    if final_bn:
        state.update(_batchnorm(sd, "bn.", "bn.", path))
    _refuse_unused(sd, blocks, final_bn, path)
    hparams = {"img_dim": int(weight.shape[1]), "embed_size": int(weight.shape[0]), "n_gcn": len(blocks),
               "final_bn": final_bn, "norm_over_regions": True}  # VSRN's l2norm sums over dim 1 of (n, R, E)
    # The VSRN code with the final BatchNorm skips the l2norm after fc for data_name 'f30k_precomp'
    # (KunpengLi1994/VSRN and the reproducibility repository); without it, fc is always normalised.
    if final_bn and opt.get("data_name") == "f30k_precomp":
        hparams["fc_norm"] = False
    return state, hparams


def _gcn_blocks(sd: dict, path: Path) -> list[int]:
    """The numbers of the graph-reasoning blocks ``Rs_GCN_<i>``: 1..n, else refused."""
    blocks = sorted({int(m.group(1)) for k in sd if (m := re.match(r"Rs_GCN_(\d+)\.", k))})
    if blocks != list(range(1, len(blocks) + 1)):
        raise CocosError(f"{path}: the image encoder's graph-reasoning blocks are numbered {blocks}, "
                         "expected Rs_GCN_1..n")
    return blocks


def _gcn_block(sd: dict, i: int, path: Path) -> dict:
    """Block ``Rs_GCN_<i>`` as ``gcn.<i-1>``: the ``g``/``theta``/``phi`` maps, ``W`` (its 1x1 convolution ``W.0``)
    and its BatchNorm ``W.1`` (as ``bn``); a block without that BatchNorm (``bn_layer=False``) is refused."""
    src, dst = f"Rs_GCN_{i}.", f"gcn.{i - 1}."
    if f"{src}W.weight" in sd:
        raise CocosError(f"{path}: {src}W has no BatchNorm (bn_layer=False); cocos's RsGCN keeps VSRN's "
                         "BatchNorm")
    state = {}
    for name in ("g", "theta", "phi"):
        w, b = _linear(sd, f"{src}{name}.", path)
        state.update({f"{dst}{name}.weight": w, f"{dst}{name}.bias": b})
    w, b = _linear(sd, f"{src}W.0.", path)
    state.update({f"{dst}W.weight": w, f"{dst}W.bias": b})
    state.update(_batchnorm(sd, f"{src}W.1.", f"{dst}bn.", path))
    return state


def _vsrn_gru(sd: dict, path: Path) -> dict:
    """The image GRU's tensors (``img_rnn.*``, names unchanged): one layer, as VSRN's."""
    gru, layers, _, _ = gru_tensors(sd, "img_rnn.", path, "image encoder")
    if layers != 1:
        raise CocosError(f"{path}: the image GRU has {layers} layers; VSRN's has one")
    return gru


def _refuse_unused(sd: dict, blocks: list[int], final_bn: bool, path: Path) -> None:
    """Refuse weights outside what :func:`map_vsrn_image` maps: ``fc``, the blocks, ``img_rnn`` and ``bn``."""
    prefixes = tuple(f"Rs_GCN_{i}." for i in blocks) + ("img_rnn.",) + (("bn.",) if final_bn else ())
    extra = sorted(k for k in sd if k not in ("fc.weight", "fc.bias") and not k.startswith(prefixes))
    if extra:
        raise CocosError(f"{path}: the image encoder holds unexpected weights ({', '.join(extra[:3])}); cocos "
                         "imports VSRN's EncoderImagePrecompAttn")
