"""Checkpoints of the original code: VSE++ (fartashf/vsepp), VSRN (KunpengLi1994/VSRN) and the
COCOS reproducibility repository (MauritsBleeker/ecir-2022-reproducibility-bleeker); VSE∞
(woodfrog/vse_infty, microsoft/VSE_Gradient: the same layout, a BERT caption encoder) in
:mod:`cocos.legacy.vse_infty`.

Their ``model_best.pth.tar`` is a dict: ``model`` = ``[image encoder state dict, text encoder
state dict, ...]`` (VSRN may add more, e.g. its caption decoder; ignored), ``opt`` = the
``argparse.Namespace`` of the run, ``epoch``, ``best_rsum`` (and ``Eiters``).
:func:`convert_checkpoint` maps it, with the run's vocabulary and a data folder, onto an
in-memory checkpoint in the cocos format (:mod:`cocos.training.checkpoint`) that
:func:`cocos.training.trainer.build_from_checkpoint` rebuilds. The definitions file,
section 15, says what is read and what is refused.

**Safety.** :func:`read_checkpoint_file` loads with ``torch.load(weights_only=True)`` and
only ``argparse.Namespace`` allowed beyond tensors and plain containers: a file that names
any other class or function is refused before anything of it runs. ``trust=True``
(``--trust-checkpoint``) uses ``weights_only=False``, for files the user knows to be safe:
code in such a file may run.

**Layout mapping** (original key -> cocos key):

* VSE++ ``EncoderImagePrecomp``: ``fc.*`` -> ``fc.*``.
* VSE++ ``EncoderImageFull`` (``data_name`` ``f30k``/``coco``/..., raw images; model kind ``vsepp_full``):
  ``cnn.module.*`` (ResNet: the whole CNN in DataParallel) and ``cnn.features.module.*`` (VGG: only
  ``features`` in DataParallel) -> ``cnn.*`` with every ``module`` segment dropped; VGG ``cnn.classifier.{1,4}``
  of torchvision before pytorch/vision@989d52a -> ``cnn.classifier.{0,3}`` (as the original
  ``load_state_dict``); ``fc.*`` -> ``fc.*``. The architecture is ``opt.cnn_type``.
* VSRN ``EncoderImagePrecompAttn``: ``fc.*`` -> ``fc.*``; ``Rs_GCN_{i}.{g,theta,phi}.*``
  (``Conv1d``, kernel 1) -> ``gcn.{i-1}.{g,theta,phi}.*`` (``Linear``, weight squeezed);
  ``Rs_GCN_{i}.W.0.*`` (``Conv1d``) -> ``gcn.{i-1}.W.*``; ``Rs_GCN_{i}.W.1.*`` (BatchNorm)
  -> ``gcn.{i-1}.bn.*``; ``img_rnn.*`` -> ``img_rnn.*``; ``bn.*`` (if present) -> ``bn.*``.
* ``EncoderText``: ``embed.weight`` -> ``txt_enc.embed.weight``, ``rnn.*`` -> ``txt_enc.rnn.*``.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch

from cocos.data.precomp import PrecompSplit, data_fingerprint
from cocos.data.text import read_vocab_tokens
from cocos.defaults import DEFAULT_MARGIN, DEFAULT_TAU_NTXENT, DEFAULT_TAU_SMOOTHAP
from cocos.errors import CocosError
from cocos.models import build_model
from cocos.models.original import _cnn_key, gru_tensors, map_full_image  # noqa: F401  (re-exported)
from cocos.models.registry import families
from cocos.objectives import get_loss
from cocos.safeload import UnsafeCheckpointError, first_line, load_torch_file
from cocos.training.checkpoint import FORMAT, load_checkpoint

# Special tokens the cocos vocabulary keeps at ids 0..3 (as VSE++ builds them).
_SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")
# The losses of the reproducibility repository's ``--criterion`` (VSE++/VSRN have none: triplet).
_CRITERIA = {"triplet": None, "contrastive": None, "ntxent": "ntxent", "nt_xent": "ntxent",
             "ranking": "smoothap", "smoothap": "smoothap", "smooth_ap": "smoothap"}


# -- reading ---------------------------------------------------------------------------------------

def read_checkpoint_file(path: str | os.PathLike, trust: bool = False) -> object:
    """Whatever the file holds, loaded without running code from it (unless ``trust``): zip CRC of every
    member, ``weights_only`` with ``argparse.Namespace`` (the original code's ``opt``) allowed, and no tensor
    claiming more than its storage (:func:`cocos.safeload.load_torch_file`)."""
    return load_torch_file(path, trust=trust, safe_globals=[argparse.Namespace])


def is_cocos_checkpoint(obj: object) -> bool:

    return isinstance(obj, dict) and obj.get("format") == FORMAT


def is_legacy_checkpoint(obj: object) -> bool:
    """The original layout: a dict whose ``model`` is a list of (at least two) state dicts."""
    if not isinstance(obj, dict) or "format" in obj:
        return False
    model = obj.get("model")
    return isinstance(model, (list, tuple)) and len(model) >= 2 and all(isinstance(s, dict) for s in model[:2])


def load_any_checkpoint(path: str | os.PathLike, *, vocab: str | os.PathLike | None = None,
                        data: str | os.PathLike | None = None, trust: bool = False,
                        bert: str | os.PathLike | None = None) -> tuple[dict, bool]:
    """A cocos checkpoint as it is, or one of the original code converted: ``(checkpoint, converted)``.

    A checkpoint of the original VSE++/VSRN code needs ``vocab`` (its ``*_vocab.pkl`` or vocabulary
    JSON) and ``data`` (it records no data folder); one of the original VSE∞ code
    (:mod:`cocos.legacy.vse_infty`) ``bert`` (the BERT folder it was trained with) and ``data``; a
    cocos checkpoint carries all of them and refuses ``vocab`` and ``bert``.
    """
    return checkpoint_from_raw(read_checkpoint_file(path, trust=trust), path, vocab=vocab, data=data, bert=bert)


def checkpoint_from_raw(raw: object, path: str | os.PathLike, *, vocab: str | os.PathLike | None = None,
                        data: str | os.PathLike | None = None,
                        bert: str | os.PathLike | None = None) -> tuple[dict, bool]:
    """:func:`load_any_checkpoint` on what :func:`read_checkpoint_file` returned."""
    if is_cocos_checkpoint(raw):
        if vocab is not None:
            raise CocosError(f"{path}: a cocos checkpoint carries its vocabulary; --vocab is for checkpoints "
                             "of the original VSE++/VSRN code")
        if bert is not None:
            raise CocosError(f"{path}: a cocos checkpoint carries its BERT; --bert is for checkpoints of the "
                             "original VSE∞ code")

        return load_checkpoint(path), False  # read again the way every cocos checkpoint is: safe and checked
    if not is_legacy_checkpoint(raw):
        raise CocosError(f"{path}: not a cocos checkpoint, nor one of the original VSE++/VSRN/VSE∞ code "
                         "(a dict with 'model' = [image encoder, text encoder state dicts] and 'opt')")
    from cocos.legacy import vse_infty  # imports from this module

    if vse_infty.is_vse_infty_checkpoint(raw):
        return vse_infty.checkpoint_from_raw(raw, path, vocab=vocab, data=data, bert=bert), True
    if bert is not None:
        raise CocosError(f"{path}: a checkpoint of the original VSE++/VSRN code (a GRU caption encoder, no BERT); "
                         "--bert is for checkpoints of the original VSE∞ code; pass --vocab")
    if vocab is None:
        raise CocosError(f"{path}: a checkpoint of the original VSE++/VSRN code; pass --vocab (its "
                         "*_vocab.pkl or vocabulary JSON)")
    if data is None:
        raise CocosError(f"{path}: a checkpoint of the original VSE++/VSRN code records no data folder; "
                         "pass --data")
    return convert_checkpoint(raw, path, vocab, data), True


# -- converting ------------------------------------------------------------------------------------

def convert_checkpoint(raw: dict, path: str | os.PathLike, vocab: str | os.PathLike,
                       data: str | os.PathLike, k: int | None = None) -> dict:
    """The cocos checkpoint (a dict of plain types and tensors) of an original ``model_best.pth.tar``."""

    path = Path(path)
    opt = opt_dict(raw, path)
    _refuse_unrepresentable(opt, path)
    img_sd = _state_dict(raw["model"][0], path, "image encoder")
    txt_sd = _state_dict(raw["model"][1], path, "text encoder")
    family = _image_family(img_sd, opt, path)
    kind = family.name

    state, hparams = _map_text(txt_sd, path)
    img_state, img_hparams = family.original.convert(img_sd, path, opt)
    state.update(img_state)
    hparams = {**img_hparams, **hparams}
    if img_hparams["embed_size"] != hparams["embed_size"]:
        raise CocosError(f"{path}: the image encoder embeds into {img_hparams['embed_size']} dimensions but the "
                         f"text encoder into {hparams['embed_size']}")
    _check_opt_agrees(opt, hparams, path)
    if _bool(opt.get("use_abs")):  # |embedding| after the l2norm, both sides (cosines of unit vectors still)
        hparams["use_abs"] = True
    state, hparams = _fit(kind, hparams, state, path)

    # vocabulary: the embedding table's rows are the original ids
    tokens = read_vocab_tokens(vocab)
    rows = hparams["vocab_size"]
    if len(tokens) != rows:
        raise CocosError(f"{vocab}: the vocabulary has {len(tokens)} words but the checkpoint's word embedding "
                         f"{path.name} has {rows} rows; use the vocabulary the model was trained with")
    tokens, order = _cocos_order(tokens, vocab)
    if order is not None:  # specials moved to 0..3: move their embedding rows with them
        state["txt_enc.embed.weight"] = state["txt_enc.embed.weight"][torch.as_tensor(order)].clone()

    # data: what the model needs and what it is counted on
    folder = Path(data)
    if not folder.is_dir():
        raise CocosError(f"{folder}: no such data folder")
    k = int(k if k is not None else _int(opt, "k", 5, path, minimum=1))
    feature_shape = _feature_shape(family, folder, k, hparams, path)

    loss_name, loss_params = loss_from_opt(opt, path)
    batch_size = _int(opt, "batch_size", 128, path, minimum=1)
    return {
        "model": {"kind": kind, "hparams": hparams},
        "vocab": tokens,
        "state_dict": state,
        # the published losses count same-image pairs of a batch as negatives: compat
        "loss": {"name": loss_name, "params": loss_params, "compat": True},
        "data": {"path": str(folder.resolve()), "fingerprint": data_fingerprint(folder), "k": k,
                 "feature_shape": feature_shape, **({"input": "images"} if family.input == "images" else {})},
        "train": {"model": kind, "loss": loss_name, "data": str(folder.resolve()), "k": k,
                  "batch_size": batch_size, "epochs": _int(opt, "num_epochs", None, path, minimum=1),
                  "lr": _float(opt, "learning_rate", path), "lr_update": _int(opt, "lr_update", None, path, minimum=1),
                  "grad_clip": _float(opt, "grad_clip", path), "embed_size": hparams["embed_size"],
                  "word_dim": hparams["word_dim"], "seed": _int(opt, "seed", 0, path), "compat": True,
                  "margin": loss_params.get("margin"), "tau": loss_params.get("tau"), "vocab": str(vocab)},
        "epoch": _int(raw, "epoch", 0, path, where="checkpoint"),
        "step": _int(raw, "Eiters", 0, path, where="checkpoint"),
        "metrics": {},
        "best_rsum": _float(raw, "best_rsum", path, where="checkpoint"),
        "history": [],
        "legacy": {"file": str(path), "code": family.original.code, "opt": _plain(opt),
                   "vocab": str(vocab), "note": "best_rsum is the original code's validation score"},
    }


def _feature_shape(family, folder: Path, k: int, hparams: dict, path: Path) -> list[int]:
    """What the model reads per image: a precomputed folder's feature shape, checked against the model (one vector
    or regions per image, as the original encoder took them); for a raw-image model the CNN's pooled feature ``[d]``
    (what a feature cache holds)."""

    if family.input == "images":
        with torch.device("meta"):
            return [int(family.build(**hparams).img_dim)]
    feature_shape = list(PrecompSplit(folder, "train", k=k).feature_shape)
    rank = family.original.feature_rank
    if rank is not None and len(feature_shape) != rank:
        needs = (f"region features (N, R, {hparams['img_dim']})" if rank == 2
                 else f"one feature vector per image (N, {hparams['img_dim']})")
        raise CocosError(f"{path}: a {family.original.encoder} takes {needs}; {folder} has features of shape "
                         f"(N, {', '.join(map(str, feature_shape))})")
    if feature_shape[-1] != hparams["img_dim"]:
        raise CocosError(f"{path}: the model takes {hparams['img_dim']}-d image features but {folder} has "
                         f"{feature_shape[-1]}-d ones")
    return feature_shape


def loss_from_opt(opt: dict, path: str | os.PathLike) -> tuple[str, dict]:
    """The training loss of ``opt``: VSE++'s ``max_violation`` -> ``triplet_sh`` (else ``triplet``) with
    ``margin``; the reproducibility repository's ``criterion`` ``ntxent`` / ``ranking`` (SmoothAP) with ``tau``."""

    criterion = opt.get("criterion", "triplet")
    criterion = str(criterion).lower() if criterion is not None else "triplet"
    if criterion not in _CRITERIA:
        raise CocosError(f"{path}: trained with criterion {criterion!r}, which cocos does not know "
                         f"(triplet, ntxent, ranking)")
    name = _CRITERIA[criterion]
    def setting(key: str, default: float) -> float:  # absent: the default; present but not a number: refused
        value = _float(opt, key, path)
        return default if value is None else value

    if name is None:
        name = "triplet_sh" if _bool(opt.get("max_violation")) else "triplet"
        params = {"margin": setting("margin", DEFAULT_MARGIN)}
    else:
        params = {"tau": setting("tau", {"ntxent": DEFAULT_TAU_NTXENT, "smoothap": DEFAULT_TAU_SMOOTHAP}[name])}
    try:
        return name, get_loss(name, **params).params()
    except CocosError as exc:
        raise CocosError(f"{path}: {exc}") from None


def _refuse_unrepresentable(opt: dict, path: Path) -> None:
    """One line for each thing of the original that the cocos models cannot represent."""
    measure = opt.get("measure")
    if measure is not None and str(measure).lower() != "cosine":
        raise CocosError(f"{path}: trained with measure={measure!r} (order embeddings); cocos counts and "
                         "evaluates cosine similarities only")
    if _bool(opt.get("no_imgnorm")):
        raise CocosError(f"{path}: trained with no_imgnorm (unnormalised image embeddings); cocos needs "
                         "L2-normalised embeddings (its similarities are cosines)")


def _image_family(sd: dict, opt: dict, path: Path):
    """The registered family whose original image encoder the weights are (:class:`cocos.models.family.
    OriginalImage`); the run's ``data_name`` and ``finetune`` must agree with the weights."""
    data_name = opt.get("data_name")
    raw = data_name is not None and not str(data_name).endswith("_precomp")
    found = [f for f in families() if f.original is not None and f.original.matches(sd, opt)]
    if found and found[0].input == "images":
        return found[0]
    if raw:
        raise CocosError(f"{path}: trained on raw images (data_name {str(data_name)!r}) but the image encoder "
                         "holds no CNN weights (cnn.*)")
    if _bool(opt.get("finetune")):
        raise CocosError(f"{path}: trained with finetune (a CNN image encoder) but the image encoder holds no "
                         "CNN weights (cnn.*)")
    if not found:
        raise CocosError(f"{path}: the image encoder is none that cocos imports "
                         f"({', '.join(f.original.encoder for f in families() if f.original is not None)})")
    return found[0]


MAX_OPT_DEPTH = 16  # the original code's opt holds numbers, strings and short lists


def _depth(value, limit: int) -> int:
    """The nesting depth of a value of lists, tuples, sets and dicts (a scalar 0), counted without recursion and
    stopping once it exceeds ``limit``."""
    deepest, stack = 0, [(value, 0)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_opt(opt: dict, path: Path) -> None:
    """Every value of ``opt`` nested at most :data:`MAX_OPT_DEPTH` deep (its repr and every check of it then
    recurse no deeper); one line naming the field otherwise."""
    for key, value in opt.items():
        if _depth(value, MAX_OPT_DEPTH) > MAX_OPT_DEPTH:
            raise CocosError(f"{path}: opt.{str(key)[:40]} is nested more than {MAX_OPT_DEPTH} deep; the original "
                             "code's settings are numbers, strings and short lists")


def opt_dict(raw: dict, path: Path) -> dict:
    """The checkpoint's ``opt`` (argparse.Namespace or dict) as a dict, every value nested at most
    :data:`MAX_OPT_DEPTH` deep (:func:`check_opt`), before anything else reads it."""
    opt = raw.get("opt")
    if isinstance(opt, (argparse.Namespace, dict)):
        found = dict(vars(opt)) if isinstance(opt, argparse.Namespace) else dict(opt)
        check_opt(found, path)
        return found
    if opt is None:
        raise CocosError(f"{path}: the checkpoint lacks 'opt' (the run's hyper-parameters)")
    raise CocosError(f"{path}: 'opt' is a {type(opt).__name__}, expected the run's argparse.Namespace")


def _state_dict(obj: object, path: Path, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(obj, dict) or not obj:
        raise CocosError(f"{path}: the {what} state dict is empty or not a dict")
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CocosError(f"{path}: the {what} state dict holds {key!r}, which is not a named tensor")
    return {k.removeprefix("module."): v for k, v in obj.items()}  # DataParallel prefixes


def _map_text(sd: dict, path: Path) -> tuple[dict, dict]:
    if "embed.weight" not in sd or sd["embed.weight"].dim() != 2:
        raise CocosError(f"{path}: the text encoder lacks its word embedding (embed.weight)")
    gru, layers, word_dim, embed = gru_tensors(sd, "rnn.", path, "text encoder")
    extra = sorted(set(sd) - set(gru) - {"embed.weight"})
    if extra:
        raise CocosError(f"{path}: the text encoder holds unexpected weights ({', '.join(extra[:3])}); "
                         "cocos imports VSE++'s EncoderText")
    rows, cols = sd["embed.weight"].shape
    if cols != word_dim:
        raise CocosError(f"{path}: the word embedding has {cols} columns but the GRU takes {word_dim}")
    state = {"txt_enc.embed.weight": sd["embed.weight"]}
    state.update({f"txt_enc.{k}": v for k, v in gru.items()})
    hparams = {"vocab_size": int(rows), "word_dim": int(cols), "embed_size": embed}
    if layers != 1:
        hparams["num_layers"] = layers
    return state, hparams


def _check_opt_agrees(opt: dict, hparams: dict, path: Path) -> None:
    for name, key in (("img_dim", "img_dim"), ("embed_size", "embed_size"), ("word_dim", "word_dim"),
                      ("vocab_size", "vocab_size"), ("num_layers", "num_layers")):
        if key == "img_dim" and key not in hparams:  # a raw-image model: VSE++ records its unused default 4096
            continue
        recorded = _int(opt, name, None, path, minimum=1)  # present but not a positive integer: refused
        actual = hparams.get(key, 1 if key == "num_layers" else None)
        if recorded is not None and recorded != actual:
            raise CocosError(f"{path}: opt says {name} {recorded} but the weights have {actual}")


def _fit(kind: str, hparams: dict, state: dict, path: Path) -> tuple[dict, dict]:
    """``state`` in the key order of a cocos ``kind`` model with ``hparams``, and the model's own ``hparams``.

    Refuses missing, unexpected or misshapen keys. The model is built on the meta device (no memory).
    """

    try:
        with torch.device("meta"):
            model = build_model(kind, **hparams)
        expected = model.state_dict()
    except CocosError as exc:
        raise CocosError(f"{path}: cannot build a {kind} model ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - whatever a nonsense size or config makes torch or transformers raise
        raise CocosError(f"{path}: cannot build a {kind} model ({first_line(exc)})") from None
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing or extra:
        raise CocosError(f"{path}: the weights do not fit a {kind} model (missing {missing[:3]}, "
                         f"unexpected {extra[:3]})")
    out = {}
    for key, want in expected.items():
        have = state[key]
        if tuple(have.shape) != tuple(want.shape):
            raise CocosError(f"{path}: {key} has shape {tuple(have.shape)}, a {kind} model with these "
                             f"hyper-parameters needs {tuple(want.shape)}")
        tensor = have.detach().to("cpu")
        if want.dtype.is_floating_point:
            if not tensor.dtype.is_floating_point:
                raise CocosError(f"{path}: {key} holds {tensor.dtype} values, expected floating point")
            tensor = tensor.to(want.dtype)
        else:
            tensor = tensor.to(want.dtype)
        if want.dtype.is_floating_point and not torch.isfinite(tensor).all():
            raise CocosError(f"{path}: {key} holds NaN or Inf")
        out[key] = tensor.contiguous()
    return out, dict(model.hparams)


def _cocos_order(tokens: list[str], vocab) -> tuple[list[str], list[int] | None]:
    """Tokens with the specials at ids 0..3, and the row order that gets them there (None: already)."""
    if tuple(tokens[:4]) == _SPECIALS:
        return tokens, None
    missing = [s for s in _SPECIALS if s not in tokens]
    if missing:
        raise CocosError(f"{vocab}: the vocabulary lacks {', '.join(missing)}; cocos needs <pad>, <start>, <end> "
                         "and <unk>")
    first = [tokens.index(s) for s in _SPECIALS]
    order = first + [i for i in range(len(tokens)) if i not in set(first)]
    return [tokens[i] for i in order], order


def _bool(value: object) -> bool:
    return bool(value) if isinstance(value, (bool, int)) else str(value).lower() in ("true", "1", "yes")


def _int(source: dict, key: str, default: int | None, path, minimum: int = 0, where: str = "opt") -> int | None:
    """An integer setting in ``[minimum, 2**63)``: ``default`` where it is absent (``None``); present but not
    such an integer (``-5``, ``'sixteen'``, ``nan``): refused with one line naming the field."""
    value = source.get(key)
    if value is None:
        return default
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value) or not minimum <= value < 2**63):
        raise CocosError(f"{path}: {where}.{key} = {value!r} is not an integer >= {minimum}")
    return int(value)


def _float(source: dict, key: str, path, where: str = "opt") -> float | None:
    """A finite number setting: ``None`` where it is absent; present but not a finite number: refused."""
    value = source.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if math.isfinite(number):
            return number
    raise CocosError(f"{path}: {where}.{key} = {value!r} is not a finite number")


def _plain(opt: dict) -> dict:
    """``opt`` with plain values only (a cocos checkpoint must load with ``weights_only=True``)."""
    out = {}
    for key, value in opt.items():
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[str(key)] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            out[str(key)] = list(value)
        else:
            out[str(key)] = repr(value)[:200]
    return out


__all__ = ["UnsafeCheckpointError", "checkpoint_from_raw", "convert_checkpoint", "is_cocos_checkpoint",
           "is_legacy_checkpoint", "load_any_checkpoint", "loss_from_opt", "read_checkpoint_file"]
