"""A SigLIP folder on disk: its captions (its own tokenizer, padded to the text tower's length) and its images
(SigLIP's preprocessing: a resize to the tower's square, no crop).

A Hugging Face SigLIP folder (what ``SiglipModel.save_pretrained`` and ``SiglipProcessor.save_pretrained`` write)
holds ``config.json`` (``model_type`` ``siglip``), the weights (``model.safetensors`` or ``pytorch_model.bin``, or
their sharded index), the tokenizer (``tokenizer.json`` with ``tokenizer_config.json``) and the image
preprocessing: ``preprocessor_config.json``, or ``processor_config.json`` with the same settings nested under
``image_processor`` (what transformers 5's ``SiglipProcessor.save_pretrained`` writes). :meth:`SiglipFolder.read`
reads all but the weights, with ``transformers``/``tokenizers`` and nothing downloaded, after checking every size
of ``config.json`` (:func:`check_siglip_config`) and the tokenizer files' sizes against the vocabulary it states;
the weights are read completely or not at all (:func:`cocos.hf.read_weights`).

**Captions**: the folder's own tokenizer as transformers 5 loads it (``AutoTokenizer.from_pretrained`` of the
folder, ``local_files_only``, no remote code: ``tokenizer.json`` with the special tokens and ``add_bos_token`` /
``add_eos_token`` of ``tokenizer_config.json``), cut to the text tower's positions ``P``
(``max_position_embeddings``, 64 for Google's SigLIP) as ``tokenizer(text, truncation=True, max_length=P)`` cuts.
The coder is a :class:`cocos.data.clip.CLIPCoder` of the tokenizer's JSON (text record ``kind: clip``: a
tokenizers JSON and its length, the coder the checkpoint reader :func:`cocos.data.wordpiece.coder_of` rebuilds),
so a checkpoint stands alone. **Padding**: SigLIP was trained on captions padded to ``P`` and its text tower takes
no attention mask (it pools the last position, which is padding for a short caption); every caption is padded to
``P`` with the tokenizer's pad token on the tokenizer's ``padding_side``, as ``tokenizer(text,
padding="max_length", max_length=P)`` pads, by the model (:class:`TextPadding`, recorded with the model), so the
ids the model sees do not depend on the batch. A folder whose tokenizer has no pad token, or truncates on the left,
is one line. A folder with only SigLIP's SentencePiece model (``spiece.model``, the slow ``SiglipTokenizer``,
whose text canonicalisation is Python code of transformers) is one line: cocos reads a ``tokenizer.json``.

**Images** (:func:`siglip_eval_transform`): transformers' ``SiglipImageProcessorPil``: the image resized to
``size`` x ``size`` (the aspect ratio not kept, no crop) with the folder's resampling (BICUBIC for Google's),
``x / 255``, normalised with the folder's mean and std (0.5 and 0.5 for Google's). Training (fine-tuning):
open_clip's training transform (:func:`cocos.data.clip.clip_train_transform`: a random resized crop of scale
``(0.9, 1.0)``, ratio ``(3/4, 4/3)``, resized to ``size`` x ``size`` with the same resampling, no flip, the same
normalisation); every draw from the item's generator.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from cocos.data.clip import RESAMPLING, CLIPCoder, clip_train_transform
from cocos.data.transforms import MAX_SIDE, normalize, to_tensor
from cocos.errors import CocosError
from cocos.hf import (
    check_file_size,
    check_heads,
    check_layers,
    check_memory,
    check_vocab,
    config_int,
    is_siglip_folder,
    read_json,
    weights_files,
)
from cocos.hf import (
    quiet_transformers as hf_quiet_transformers,
)

INSTALL = "SigLIP models need transformers and tokenizers: pip install 'cocos[clip]'"
SIDES = ("right", "left")
# transformers' SiglipTextConfig and SiglipVisionConfig defaults, for sizes a config.json leaves out
TEXT_SIZES = {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
              "num_attention_heads": 12, "max_position_embeddings": 64}
VISION_SIZES = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                "num_channels": 3, "image_size": 224, "patch_size": 16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


def quiet_transformers():
    """``transformers``, quiet (:func:`cocos.hf.quiet_transformers`), or one line naming the extra."""
    return hf_quiet_transformers(INSTALL)


# -- captions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextPadding:
    """How SigLIP's captions are padded to the text tower's ``max_position_embeddings``: with ``pad_id`` (the
    tokenizer's pad token) on ``side`` (its ``padding_side``), as ``padding="max_length"``; the model's
    ``text_padding`` record."""

    pad_id: int
    side: str = "right"

    def record(self) -> dict:
        return {"pad_id": self.pad_id, "side": self.side}

    @classmethod
    def of(cls, record: dict) -> TextPadding:
        """From a ``text_padding`` record (a checkpoint's), checked: one line for anything wrong."""
        if not isinstance(record, dict):
            raise CocosError(f"a SigLIP text_padding record is a dict with pad_id and side, got {record!r}")
        pad, side = record.get("pad_id"), record.get("side", "right")
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0 or side not in SIDES:
            raise CocosError(f"a SigLIP text_padding record has a pad_id >= 0 and side right or left, got {record!r}")
        return cls(int(pad), side)


def read_tokenizer(folder: str | os.PathLike, max_length: int, entries: int | None = None
                   ) -> tuple[CLIPCoder, TextPadding]:
    """The folder's tokenizer as transformers 5 loads it (module docstring) as a caption coder cutting at
    ``max_length``, and its padding; each tokenizer file at most 64 MiB and 1 KiB per entry of the ``entries``
    the model's config states (+ 1 MiB), checked before it is parsed; one line for a missing or unreadable
    tokenizer, one without a pad token or one that truncates on the left."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.is_file():
        if (folder / "spiece.model").is_file():
            raise CocosError(f"{folder}: its tokenizer is a SentencePiece model alone (spiece.model, the slow "
                             "SiglipTokenizer); cocos reads a tokenizer.json (e.g. a SigLIP 2 folder's)")
        raise CocosError(f"{folder}: no tokenizer (tokenizer.json and tokenizer_config.json)")
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            check_file_size(folder / name, entries, "tokenizer")
    transformers = quiet_transformers()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        backend = tok.backend_tokenizer.to_str()
    except CocosError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever transformers says of a damaged or unknown tokenizer
        raise CocosError(f"{folder}: its tokenizer cannot be read ({_first(exc)})") from None
    pad, side, cut = tok.pad_token_id, getattr(tok, "padding_side", "right"), getattr(tok, "truncation_side", "right")
    if pad is None:
        raise CocosError(f"{folder}: its tokenizer has no pad token (tokenizer_config.json's pad_token); SigLIP pads "
                         "every caption to its text tower's length")
    if side not in SIDES:
        raise CocosError(f"{folder}: its tokenizer pads on the {side!s:.20} side (right or left)")
    if cut != "right":
        raise CocosError(f"{folder}: its tokenizer truncates on the {cut!s:.20} (cocos cuts a caption's end)")
    try:
        coder = CLIPCoder(backend, max_length)
    except CocosError as exc:
        raise CocosError(f"{path}: {exc}") from None
    if not 0 <= int(pad) < len(coder):
        raise CocosError(f"{folder}: its pad token's id {pad} is not one of its {len(coder)} tokens")
    return coder, TextPadding(int(pad), side)


def pad_ids(tokens: torch.Tensor, lengths, padding: TextPadding, length: int) -> torch.Tensor:
    """``(n, L)`` ids (each row's first ``lengths[i]`` ids the caption, whatever follows ignored) -> ``(n,
    length)``: each caption padded with ``padding.pad_id`` on ``padding.side`` to ``length``, as
    ``tokenizer(..., padding="max_length", max_length=length)``; a caption longer than ``length`` is one line."""
    if tokens.dim() != 2:
        raise CocosError(f"caption ids must be (n, L), got {tuple(tokens.shape)}")
    n, width = tokens.shape
    lengths = torch.as_tensor(lengths, device=tokens.device).long().reshape(-1)
    if lengths.numel() != n:
        raise CocosError(f"{n} captions but {lengths.numel()} lengths")
    if n and (int(lengths.max()) > min(length, width) or int(lengths.min()) < 0):
        raise CocosError(f"a caption of {int(lengths.max())} ids does not fit the text tower's {length} positions")
    if width < length:
        tokens = torch.nn.functional.pad(tokens, (0, length - width), value=padding.pad_id)
    tokens = tokens[:, :length]
    pos = torch.arange(length, device=tokens.device)[None, :]
    if padding.side == "right":
        return torch.where(pos < lengths[:, None], tokens, padding.pad_id)
    source = pos - (length - lengths[:, None])  # left: the caption's ids end at the last position
    return torch.where(source >= 0, tokens.gather(1, source.clamp(min=0)), padding.pad_id)


# -- images ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preprocess:
    """SigLIP's image preprocessing (``preprocessor_config.json``), as the model's ``preprocess`` record: ``size``
    the square side. Its record names it ``resize`` and ``crop_size`` (both ``size``: the keys every image source
    of cocos reads), with ``squash: true`` (the whole image resized to the square, no crop)."""

    size: int = 224
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    resample: int = 3  # PIL's BICUBIC

    @property
    def crop_size(self) -> int:
        return self.size

    @property
    def resize(self) -> int:
        return self.size

    def record(self) -> dict:
        return {"resize": self.size, "crop_size": self.size, "squash": True, "mean": list(self.mean),
                "std": list(self.std), "resample": self.resample}

    @classmethod
    def of(cls, record: dict) -> Preprocess:
        """From a ``preprocess`` record (a checkpoint's), checked: one line for anything wrong."""
        try:
            out = cls(int(record["resize"]), tuple(float(x) for x in record["mean"]),
                      tuple(float(x) for x in record["std"]), int(record.get("resample", 3)))
            crop = int(record.get("crop_size", out.size))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise CocosError(f"a SigLIP preprocess record needs resize, mean, std, got {record!r}") from None
        if out.size < 1 or crop != out.size or len(out.mean) != 3 or len(out.std) != 3 or min(out.std) <= 0:
            raise CocosError(f"a SigLIP preprocess record has a size >= 1 (resize = crop_size), 3 means and positive "
                             f"stds, got {record!r}")
        if out.size > MAX_SIDE:
            raise CocosError(f"a SigLIP preprocess record resizes to at most {MAX_SIDE} pixels, got {out.size}")
        if out.resample not in RESAMPLING:
            raise CocosError(f"unknown resampling {out.resample} (PIL's 0..5)")
        return out

    def transform(self, train: bool):
        """The training or evaluation transform (a picklable ``functools.partial``, called ``(img, generator)``)."""
        keywords = {"mean": self.mean, "std": self.std, "resample": self.resample}
        if train:
            return functools.partial(clip_train_transform, crop_size=self.size, **keywords)
        return functools.partial(siglip_eval_transform, size=self.size, **keywords)


def siglip_eval_transform(img: Image.Image, generator: torch.Generator | None = None, *, size: int = 224,
                          mean=Preprocess.mean, std=Preprocess.std, resample: int = 3) -> torch.Tensor:
    """SigLIP's evaluation preprocessing (module docstring): ``(3, size, size)`` float32; ``generator`` unused."""
    img = img.convert("RGB")
    if img.size != (size, size):
        img = img.resize((size, size), RESAMPLING[resample])
    return normalize(to_tensor(img), mean, std)


def read_preprocess(path: Path) -> Preprocess:
    """``preprocessor_config.json`` -> :class:`Preprocess` (absent entries: ``SiglipImageProcessorPil``'s); given a
    ``processor_config.json``, the settings of its ``image_processor`` entry. Preprocessing the transform does not
    restate exactly (a crop, a resize of the shortest edge or to a rectangle, no normalisation, another rescale,
    padding) is one line."""
    cfg = read_json(path)
    if path.name == "processor_config.json":
        cfg = cfg.get("image_processor")
        if not isinstance(cfg, dict):
            raise CocosError(f"{path}: no image_processor settings (a JSON object)")
    size = cfg.get("size", {"height": Preprocess.size, "width": Preprocess.size})
    if not isinstance(size, dict) or set(size) != {"height", "width"} or size["height"] != size["width"]:
        raise CocosError(f"{path}: a size other than a square height and width ({str(size)[:80]}) is not supported "
                         "(SigLIP resizes to its tower's square)")
    if cfg.get("do_center_crop") or cfg.get("do_pad"):
        raise CocosError(f"{path}: a centre crop or padding is not supported (SigLIP resizes without either)")
    if cfg.get("do_resize") is False or cfg.get("do_normalize") is False:
        raise CocosError(f"{path}: preprocessing without resize or normalisation is not supported")
    factor = cfg.get("rescale_factor", 1 / 255)
    if cfg.get("do_rescale") is False or not isinstance(factor, (int, float)) or abs(factor * 255 - 1) > 1e-6:
        raise CocosError(f"{path}: pixels rescaled other than by 1/255 are not supported")
    default = Preprocess()
    record = {"resize": size["height"], "mean": cfg.get("image_mean", default.mean),
              "std": cfg.get("image_std", default.std), "resample": cfg.get("resample", default.resample)}
    try:
        return Preprocess.of(record)
    except CocosError as exc:
        raise CocosError(f"{path}: {exc}") from None


def _preprocessor_file(folder: Path) -> Path:
    """``preprocessor_config.json``, else ``processor_config.json``; one line naming both when neither is there."""
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (folder / name).is_file():
            return folder / name
    raise CocosError(f"{folder}: no image preprocessing (preprocessor_config.json or processor_config.json)")


# -- the folder -----------------------------------------------------------------------------------------------


def siglip_parameters(text: dict, vision: dict, projection: int) -> int:
    """About how many parameters a SigLIP of these (checked) sizes has: per tower its embeddings (words and
    positions; the patch convolution and patch positions) and, per layer, attention (4 h²) and feed-forward (2 h·i)
    weights; the text head (``h x projection_size``) and the vision tower's attention-pooling head (one more
    attention and feed-forward); biases and norms left out."""
    def layer(sizes):
        h = sizes["hidden_size"]
        return 4 * h * h + 2 * h * sizes["intermediate_size"]

    th, vh = text["hidden_size"], vision["hidden_size"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    return ((text["vocab_size"] + text["max_position_embeddings"]) * th + text["num_hidden_layers"] * layer(text)
            + th * projection + (vision["num_channels"] * vision["patch_size"] ** 2 + patches + 1) * vh
            + (vision["num_hidden_layers"] + 1) * layer(vision))


def check_siglip_config(config: dict, where: str, copies: int = 2) -> tuple[dict, dict, int]:
    """Every size of a SigLIP ``config.json`` (:data:`TEXT_SIZES`, :data:`VISION_SIZES`,
    ``text_config.projection_size``; absent: transformers' defaults, the projection the text tower's width) a
    positive integer, each tower's ``hidden_size`` a multiple of its heads, ``patch_size`` at most ``image_size``,
    at most :data:`cocos.hf.MAX_LAYERS` layers a tower and :data:`cocos.hf.MAX_VOCAB` tokens, the vision tower's
    attention-pooling head there (``vision_use_head``: its output is the image embedding), the text embedding
    (``projection_size``) the image embedding's size (``vision_config.hidden_size``), and ``copies`` float32 copies
    of the parameters they imply within the memory available; one line naming the key, before anything is built.
    Returns the towers' sizes and the projection's."""
    towers = []
    for tower, defaults in (("text_config", TEXT_SIZES), ("vision_config", VISION_SIZES)):
        section = config.get(tower)
        if not isinstance(section, dict):
            raise CocosError(f"{where}: no {tower}")
        sizes = {key: config_int(section, key, where, default, prefix=f"{tower}.") for key, default in defaults.items()}
        check_heads(sizes["hidden_size"], sizes["num_attention_heads"], where, f"{tower}.")
        check_layers(sizes["num_hidden_layers"], where, f"{tower}.num_hidden_layers")
        towers.append(sizes)
    text, vision = towers
    check_vocab(text["vocab_size"], where, "text_config.vocab_size")
    if vision["patch_size"] > vision["image_size"]:
        raise CocosError(f"{where}: vision_config.patch_size {vision['patch_size']} is larger than its image_size "
                         f"{vision['image_size']}")
    if config["vision_config"].get("vision_use_head", True) is not True:
        raise CocosError(f"{where}: vision_config.vision_use_head is not true: a SigLIP without its attention-pooling "
                         "head has no image embedding")
    projection = config_int(config["text_config"], "projection_size", where, text["hidden_size"],
                            prefix="text_config.")
    if projection != vision["hidden_size"]:
        raise CocosError(f"{where}: text_config.projection_size {projection} is not vision_config.hidden_size "
                         f"{vision['hidden_size']}: its text and image embeddings differ in size")
    check_memory(siglip_parameters(text, vision, projection),
                 text["num_hidden_layers"] + vision["num_hidden_layers"], copies, where, "a SigLIP model",
                 "to train" if copies > 2 else "")
    return text, vision, projection


@dataclass
class SiglipFolder:
    """A SigLIP folder read (module docstring): its ``config`` (``config.json`` as a dict), ``preprocess``, caption
    ``coder``, ``padding`` and ``weights`` file."""

    path: Path
    config: dict
    preprocess: Preprocess
    coder: CLIPCoder
    padding: TextPadding
    weights: Path = field(default=Path())

    @classmethod
    def read(cls, folder: str | os.PathLike, copies: int = 2) -> SiglipFolder:
        """The folder, every part checked (module docstring); ``copies``: the float32 copies of its parameters that
        must fit in memory (2 to analyse: the model and the weights read into it; 4 to fine-tune: the weights,
        their gradient and AdamW's two moments)."""
        path = Path(folder)
        if not path.is_dir():
            raise CocosError(f"{path}: no such SigLIP folder (a Hugging Face SigLIP model saved on disk: config.json, "
                             "model.safetensors, tokenizer.json, preprocessor_config.json or processor_config.json)")
        config = read_json(path / "config.json")
        if config.get("model_type") != "siglip":
            raise CocosError(f"{path / 'config.json'}: model_type is {str(config.get('model_type'))[:40]!r}, "
                             "not 'siglip'")
        text, vision, _ = check_siglip_config(config, str(path / "config.json"), copies)
        weights = weights_files(path)[0]
        preprocess = read_preprocess(_preprocessor_file(path))
        if preprocess.size != vision["image_size"]:
            raise CocosError(f"{path}: its preprocessing resizes to {preprocess.size} pixels but its vision tower "
                             f"takes images of {vision['image_size']}")
        coder, padding = read_tokenizer(path, text["max_position_embeddings"], text["vocab_size"])
        if len(coder) > text["vocab_size"]:
            raise CocosError(f"{path}: its tokenizer has {len(coder)} tokens, more than the text tower's vocab_size "
                             f"{text['vocab_size']}")
        return cls(path, config, preprocess, coder, padding, weights)


__all__ = ["Preprocess", "SiglipFolder", "TextPadding", "check_siglip_config", "is_siglip_folder", "pad_ids",
           "quiet_transformers", "read_preprocess", "read_tokenizer", "siglip_eval_transform", "siglip_parameters"]
