"""A CLIP folder on disk: its captions (CLIP's byte-level BPE) and its images (CLIP's preprocessing).

A Hugging Face CLIP folder (what ``CLIPModel.save_pretrained`` and ``CLIPProcessor.save_pretrained`` write) holds
``config.json`` (``model_type`` ``clip``), the weights (``model.safetensors`` or ``pytorch_model.bin``, or their
sharded index), the tokenizer (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) and the image preprocessing:
``preprocessor_config.json``, or ``processor_config.json`` with the same settings nested under ``image_processor``
(what transformers 5's ``CLIPProcessor.save_pretrained`` writes). :meth:`CLIPFolder.read` reads all but the
weights, with ``transformers``/``tokenizers`` and nothing downloaded (definitions file, section 21), after checking
every size of ``config.json`` (:func:`check_clip_config`: positive integers, at most :data:`cocos.hf.MAX_LAYERS`
layers a tower, the parameters they imply within the memory available) and the tokenizer files' sizes against
the vocabulary it states; the weights are read completely or not at all (:func:`cocos.hf.read_weights`).

**Captions** (:class:`CLIPCoder`): the folder's own tokenizer (its normaliser, pre-tokeniser, BPE and
post-processor: ``<|startoftext|> ... <|endoftext|>``), cut to the text tower's positions
(``max_position_embeddings``, 77 for OpenAI's models) as ``tokenizer(text, truncation=True, max_length=77)``
cuts. The tokenizer travels whole in the checkpoint (``text.tokenizer``: its JSON), so a checkpoint stands alone.
Captions are padded with id 0 by :func:`cocos.data.text.pad_batch`; the model masks padding by length, and CLIP's
causal text tower pools the end-of-text position, which padding after it cannot change.

**Images** (:func:`clip_eval_transform`, :func:`clip_train_transform`): CLIP's evaluation preprocessing, as
transformers' ``CLIPImageProcessorPil``: the shorter side resized to ``size`` (the longer ``int(size · long /
short)``) with the folder's resampling (BICUBIC for OpenAI's), a centre crop (``top = int((h - c) / 2)``, as
transformers crops, not torchvision's rounding), ``x / 255``, normalised with the folder's mean and std (CLIP's,
not ImageNet's). Training (fine-tuning): open_clip's training transform, a random resized crop of scale
``(0.9, 1.0)`` (ratio ``(3/4, 4/3)``) resized to the crop with the same resampling, no flip, the same
normalisation; every draw from the item's generator (:mod:`cocos.data.transforms`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image

from cocos.data.transforms import (
    MAX_RESIZED_PIXELS,
    MAX_SIDE,
    center_crop,
    normalize,
    random_resized_crop_params,
    resized_size,
    to_tensor,
)
from cocos.errors import CocosError
from cocos.hf import (
    check_file_size,
    check_heads,
    check_layers,
    check_memory,
    check_vocab,
    config_int,
    is_clip_folder,
    read_json,
    weights_files,
)

INSTALL = "CLIP models need transformers and tokenizers: pip install 'cocos[clip]'"
TRAIN_SCALE = (0.9, 1.0)  # open_clip's RandomResizedCrop scale for fine-tuning
CROPS = ("transformers", "torchvision")  # whose centre crop a Preprocess takes
RESAMPLING = {0: Image.NEAREST, 1: Image.LANCZOS, 2: Image.BILINEAR, 3: Image.BICUBIC, 4: Image.BOX, 5: Image.HAMMING}
# transformers' CLIPTextConfig and CLIPVisionConfig defaults, for sizes a config.json leaves out
TEXT_SIZES = {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
              "num_attention_heads": 8, "max_position_embeddings": 77}
VISION_SIZES = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                "num_channels": 3, "image_size": 224, "patch_size": 32}
TOKEN_IDS = ("eos_token_id", "bos_token_id", "pad_token_id")


class CLIPCoder:
    """A CLIP tokenizer as a caption coder (module docstring): ``tokens`` (id -> token, what a checkpoint's
    ``vocab`` records), ``options()`` (its ``text`` record: the tokenizer's JSON and the length), ``encode``."""

    kind = "clip"
    units = "BPE tokens"  # what its tokens are, in words

    def __init__(self, tokenizer_json: str, max_length: int):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise CocosError(INSTALL) from None
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise CocosError(f"a CLIP tokenizer's max_length must be an integer of at least 2, got {max_length!r}")
        try:
            self._tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # noqa: BLE001 - whatever the tokenizers library says of a damaged JSON
            raise CocosError(f"not a tokenizer ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})"
                             ) from None
        self._json, self.max_length = tokenizer_json, int(max_length)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(self.max_length)
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        tokens = [""] * len(vocab)
        for token, i in vocab.items():
            if not 0 <= i < len(vocab) or tokens[i]:
                raise CocosError("a CLIP tokenizer's ids must be 0..n-1, each once")
            tokens[i] = token
        self._tokens = tokens

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, max_length: int, entries: int | None = None) -> CLIPCoder:
        """The folder's ``tokenizer.json``, else its ``vocab.json`` + ``merges.txt`` through transformers'
        ``CLIPTokenizer`` (``local_files_only``); each file at most 64 MiB, and at most 1 KiB per entry of the
        ``entries`` the model's config states (+ 1 MiB), checked before it is parsed."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        names = ("tokenizer.json",) if path.is_file() else ("vocab.json", "merges.txt")
        for name in names:
            if (folder / name).is_file():
                check_file_size(folder / name, entries, "tokenizer")
        if path.is_file():
            try:
                return cls(path.read_text(encoding="utf-8"), max_length)
            except (CocosError, UnicodeDecodeError) as exc:
                raise CocosError(f"{path}: {exc}") from None
        if not (folder / "vocab.json").is_file() or not (folder / "merges.txt").is_file():
            raise CocosError(f"{folder}: no tokenizer (tokenizer.json, or vocab.json and merges.txt)")
        try:
            from transformers import CLIPTokenizer
        except ImportError:
            raise CocosError(INSTALL) from None
        try:
            tok = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True)
            return cls(tok.backend_tokenizer.to_str(), max_length)
        except CocosError:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged vocab.json or merges.txt
            raise CocosError(f"{folder}: its CLIP tokenizer cannot be read ({_first(exc)})") from None

    @property
    def tokens(self) -> list[str]:
        return list(self._tokens)

    def options(self) -> dict:
        """The checkpoint's ``text`` record."""
        return {"kind": self.kind, "tokenizer": self._json, "max_length": self.max_length}

    def __len__(self) -> int:
        return len(self._tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CLIPCoder) and (self._json, self.max_length) == (other._json, other.max_length)

    def __hash__(self) -> int:
        return hash((self._json, self.max_length))

    def __repr__(self) -> str:
        return f"CLIPCoder({len(self)} tokens, max_length {self.max_length})"

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(_text(text)).ids)

    def encode_all(self, captions: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch([_text(c) for c in captions])]


def _text(caption) -> str:
    if not isinstance(caption, str):
        raise CocosError(f"a caption must be text, got {type(caption).__name__}")
    return caption


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


# -- images ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preprocess:
    """CLIP's image preprocessing (``preprocessor_config.json``), as the model's ``preprocess`` record."""

    resize: int = 224  # size.shortest_edge
    crop_size: int = 224  # crop_size.height (= width)
    mean: tuple = (0.48145466, 0.4578275, 0.40821073)
    std: tuple = (0.26862954, 0.26130258, 0.27577711)
    resample: int = 3  # PIL's BICUBIC
    # whose centre crop: "transformers" (``top = int((h - c) / 2)``, a CLIP folder's processor) or "torchvision"
    # (``round((h - c) / 2)``, half to even: open_clip's CenterCrop); recorded only when not transformers'
    crop: str = "transformers"

    def record(self) -> dict:
        out = {"resize": self.resize, "crop_size": self.crop_size, "mean": list(self.mean), "std": list(self.std),
               "resample": self.resample}
        return out if self.crop == "transformers" else {**out, "crop": self.crop}

    @classmethod
    def of(cls, record: dict) -> Preprocess:
        """From a ``preprocess`` record (a checkpoint's), checked: one line for anything wrong."""
        try:
            out = cls(int(record["resize"]), int(record["crop_size"]), tuple(float(x) for x in record["mean"]),
                      tuple(float(x) for x in record["std"]), int(record.get("resample", 3)),
                      record.get("crop", "transformers"))
        except (KeyError, TypeError, ValueError):
            raise CocosError(f"a CLIP preprocess record needs resize, crop_size, mean, std, got {record!r}") from None
        if out.crop not in CROPS:
            raise CocosError(f"a CLIP preprocess record's crop is {' or '.join(CROPS)}, got {str(out.crop)[:40]!r}")
        if min(out.resize, out.crop_size) < 1 or len(out.mean) != 3 or len(out.std) != 3 or min(out.std) <= 0:
            raise CocosError(f"a CLIP preprocess record has sizes >= 1 and 3 means and positive stds, got {record!r}")
        if max(out.resize, out.crop_size) > MAX_SIDE:
            raise CocosError(f"a CLIP preprocess record resizes or crops to at most {MAX_SIDE} pixels, got "
                             f"{max(out.resize, out.crop_size)}")
        if out.resample not in RESAMPLING:
            raise CocosError(f"unknown resampling {out.resample} (PIL's 0..5)")
        return out

    def transform(self, train: bool):
        """The training or evaluation transform (a picklable ``functools.partial``, called ``(img, generator)``)."""
        keywords = {"crop_size": self.crop_size, "mean": self.mean, "std": self.std, "resample": self.resample}
        if train:
            return functools.partial(clip_train_transform, **keywords)
        return functools.partial(clip_eval_transform, resize=self.resize, crop=self.crop, **keywords)


def read_preprocess(path: Path) -> Preprocess:
    """``preprocessor_config.json`` -> :class:`Preprocess` (absent entries: OpenAI CLIP's); given a
    ``processor_config.json``, the settings of its ``image_processor`` entry."""
    cfg = _read_json(path)
    if path.name == "processor_config.json":
        cfg = cfg.get("image_processor")
        if not isinstance(cfg, dict):
            raise CocosError(f"{path}: no image_processor settings (a JSON object)")
    _check_restated(cfg, path)
    size, crop = cfg.get("size", {}), cfg.get("crop_size", {})
    shortest = size.get("shortest_edge") if isinstance(size, dict) else size
    crop = crop.get("height") if isinstance(crop, dict) else crop
    default = Preprocess()
    record = {"resize": shortest or default.resize, "crop_size": crop or default.crop_size,
              "mean": cfg.get("image_mean", default.mean), "std": cfg.get("image_std", default.std),
              "resample": cfg.get("resample", default.resample)}
    try:
        return Preprocess.of(record)
    except CocosError as exc:
        raise CocosError(f"{path}: {exc}") from None


def _check_restated(cfg: dict, path: Path) -> None:
    """Preprocessing that :func:`clip_eval_transform` restates exactly, or one line saying what is not."""
    size, crop = cfg.get("size", {}), cfg.get("crop_size", {})
    if isinstance(size, dict) and "shortest_edge" not in size and size:  # {height, width}: resized to exactly that
        raise CocosError(f"{path}: a resize to a fixed height and width ({size}) is not supported (CLIP resizes the "
                         "shortest edge)")
    if isinstance(crop, dict) and crop.get("height") != crop.get("width"):
        raise CocosError(f"{path}: a crop that is not square ({crop}) is not supported")
    if cfg.get("do_center_crop") is False or cfg.get("do_resize") is False or cfg.get("do_normalize") is False:
        raise CocosError(f"{path}: preprocessing without resize, centre crop or normalisation is not supported")
    factor = cfg.get("rescale_factor", 1 / 255)
    if cfg.get("do_rescale") is False or not isinstance(factor, (int, float)) or abs(factor * 255 - 1) > 1e-6:
        raise CocosError(f"{path}: pixels rescaled other than by 1/255 are not supported")


def _resize(img: Image.Image, size: int, resample: int) -> Image.Image:
    """The shorter side to ``size``, the longer ``int(size * long / short)``, with PIL's ``resample``."""
    w, h = resized_size(img.width, img.height, size)
    if w * h > MAX_RESIZED_PIXELS:
        raise CocosError(f"an image of {img.width} x {img.height} pixels would become {w} x {h} when resized "
                         f"to {size}; its aspect ratio is too extreme")
    return img if (w, h) == img.size else img.resize((w, h), RESAMPLING[resample])


def _crop(img: Image.Image, crop: int) -> Image.Image:
    """transformers' ``center_crop``: zero padding first if a side is short, ``top = int((h - c) / 2)``."""
    if img.width < crop or img.height < crop:
        padded = Image.new("RGB", (max(crop, img.width), max(crop, img.height)), (0, 0, 0))
        padded.paste(img, ((max(crop, img.width) - img.width) // 2, (max(crop, img.height) - img.height) // 2))
        img = padded
    top, left = int((img.height - crop) / 2.0), int((img.width - crop) / 2.0)
    return img.crop((left, top, left + crop, top + crop))


def clip_eval_transform(img: Image.Image, generator: torch.Generator | None = None, *, resize: int = 224,
                        crop_size: int = 224, mean=Preprocess.mean, std=Preprocess.std,
                        resample: int = 3, crop: str = "transformers") -> torch.Tensor:
    """CLIP's evaluation preprocessing (module docstring): ``(3, crop, crop)`` float32; ``generator`` unused;
    ``crop``: transformers' centre crop or torchvision's (open_clip's, :func:`cocos.data.transforms.center_crop`)."""
    img = _resize(img.convert("RGB"), resize, resample)
    return normalize(to_tensor(center_crop(img, crop_size) if crop == "torchvision" else _crop(img, crop_size)),
                     mean, std)


def clip_train_transform(img: Image.Image, generator: torch.Generator, *, crop_size: int = 224,
                         mean=Preprocess.mean, std=Preprocess.std, resample: int = 3) -> torch.Tensor:
    """open_clip's fine-tuning transform (module docstring); all randomness from ``generator``."""
    if not isinstance(generator, torch.Generator):
        raise CocosError("clip_train_transform needs a torch.Generator (every random draw comes from it)")
    img = img.convert("RGB")
    top, left, h, w = random_resized_crop_params(img.width, img.height, generator, scale=TRAIN_SCALE)
    out = img.crop((left, top, left + w, top + h)).resize((crop_size, crop_size), RESAMPLING[resample])
    return normalize(to_tensor(out), mean, std)


# -- the folder -----------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    return read_json(path)


def clip_parameters(text: dict, vision: dict, projection: int) -> int:
    """About how many parameters a CLIP of these (checked) sizes has: per tower its embeddings (words and positions;
    the patch convolution, patch positions and class token) and, per layer, attention (4 h²) and feed-forward
    (2 h·i) weights, and the two projections (biases and norms left out)."""
    def layers(sizes):
        h = sizes["hidden_size"]
        return sizes["num_hidden_layers"] * (4 * h * h + 2 * h * sizes["intermediate_size"])

    th, vh = text["hidden_size"], vision["hidden_size"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2 + 1
    return ((text["vocab_size"] + text["max_position_embeddings"]) * th + layers(text)
            + (vision["num_channels"] * vision["patch_size"] ** 2 + patches + 1) * vh + layers(vision)
            + (th + vh) * projection)


def check_clip_config(config: dict, where: str, copies: int = 2) -> tuple[dict, dict, int]:
    """Every size of a CLIP ``config.json`` (:data:`TEXT_SIZES`, :data:`VISION_SIZES`, ``projection_dim``; absent:
    transformers' defaults) a positive integer, its token ids integers, each tower's ``hidden_size`` a multiple of
    its heads and ``patch_size`` at most ``image_size``, at most :data:`cocos.hf.MAX_LAYERS` layers a tower and
    :data:`cocos.hf.MAX_VOCAB` tokens, and
    ``copies`` float32 copies of the parameters they imply within the memory available (2: the model and the
    weights read into it); one line naming the key, before anything is built. Returns the towers' sizes and the
    projection's."""
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
    for key in TOKEN_IDS:
        config_int(config["text_config"], key, where, 0, minimum=0, prefix="text_config.")
    if vision["patch_size"] > vision["image_size"]:
        raise CocosError(f"{where}: vision_config.patch_size {vision['patch_size']} is larger than its image_size "
                         f"{vision['image_size']}")
    projection = config_int(config, "projection_dim", where, 512)
    check_memory(clip_parameters(text, vision, projection), text["num_hidden_layers"] + vision["num_hidden_layers"],
                 copies, where, "a CLIP model", "to train" if copies > 2 else "")
    return text, vision, projection


@dataclass
class CLIPFolder:
    """A CLIP folder read (module docstring): its ``config`` (``config.json`` as a dict), ``preprocess``, caption
    ``coder`` and ``weights`` file."""

    path: Path
    config: dict
    preprocess: Preprocess
    coder: CLIPCoder
    weights: Path = field(default=Path())

    @classmethod
    def read(cls, folder: str | os.PathLike, copies: int = 2) -> CLIPFolder:
        """The folder, every part checked (module docstring); ``copies``: the float32 copies of its parameters that
        must fit in memory (2 to analyse: the model and the weights read into it; 4 to fine-tune: the weights,
        their gradient and AdamW's two moments)."""
        path = Path(folder)
        if not path.is_dir():
            raise CocosError(f"{path}: no such CLIP folder (a Hugging Face CLIP model saved on disk: config.json, "
                             "model.safetensors, tokenizer files, preprocessor_config.json)")
        config = _read_json(path / "config.json")
        if config.get("model_type") != "clip":
            raise CocosError(f"{path / 'config.json'}: model_type is {str(config.get('model_type'))[:40]!r}, "
                             "not 'clip'")
        text, vision, _ = check_clip_config(config, str(path / "config.json"), copies)
        weights = weights_files(path)[0]
        preprocess = read_preprocess(_preprocessor_file(path))
        if preprocess.crop_size != vision["image_size"]:
            raise CocosError(f"{path}: its preprocessing crops {preprocess.crop_size} pixels but its vision tower "
                             f"takes images of {vision['image_size']}")
        return cls(path, config, preprocess,
                   CLIPCoder.from_folder(path, text["max_position_embeddings"], text["vocab_size"]), weights)


def _preprocessor_file(folder: Path) -> Path:
    """``preprocessor_config.json``, else ``processor_config.json``; one line naming both when neither is there."""
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (folder / name).is_file():
            return folder / name
    raise CocosError(f"{folder}: no image preprocessing (preprocessor_config.json or processor_config.json)")


def coder_options(options: dict | None) -> CLIPCoder | None:
    """The :class:`CLIPCoder` a checkpoint's ``text`` record describes (None: not a CLIP record)."""
    if not options or options.get("kind") != CLIPCoder.kind:
        return None
    tokenizer, max_length = options.get("tokenizer"), options.get("max_length")
    if not isinstance(tokenizer, str):
        raise CocosError("a CLIP text record needs its tokenizer (JSON text)")
    return CLIPCoder(tokenizer, max_length)


__all__ = ["CLIPCoder", "CLIPFolder", "Preprocess", "clip_eval_transform", "clip_train_transform",
           "coder_options", "is_clip_folder", "read_preprocess"]
