"""One spec per model family: everything cocos knows about a retrieval model, in one object.

A :class:`ModelFamily` is to a model what :class:`cocos.losses.spec.Objective` is to a loss: its
name and label, the input it reads (``features``: precomputed ``(n, d)`` or region ``(n, R, d)``
features; ``images``: raw pixels through a CNN), the caption input it takes (``vocab``: word ids of a
cocos :class:`~cocos.data.text.Vocabulary`, padded; ``wordpiece``: a BERT's word pieces,
:class:`~cocos.data.wordpiece.WordPieceCoder`, the BERT's ``config.json`` passed as ``bert_config``; ``clip``: a
CLIP or SigLIP folder's tokenizer, :class:`~cocos.data.clip.CLIPCoder`), its
training hyper-parameters with their
defaults and checks, how its module is built (``module(**hparams)``; the module records ``kind`` and
``hparams``, enough to rebuild it), and how the original code's checkpoints map onto it
(:class:`OriginalImage`). The trainer, the checkpoint validator, the importer, the analysis and the
CLI loop over the registered families (:mod:`cocos.models.registry`) and never name one.

A family's module exposes ``encode_images(x)``, ``encode_captions(tokens, lengths)`` and
``forward(x, tokens, lengths) -> (img_emb, cap_emb)``, L2-normalised. ``x`` is the family's input:
precomputed features, or normalised pixels ``(n, 3, H, W)`` for an ``images`` family, whose module
also offers ``pooled(pixels)`` (the CNN's feature), ``encode_pooled(features)`` and
``load_cnn_weights(path)`` (what ``cocos data features`` and ``--cnn-weights`` use).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cocos.errors import CocosError

INPUTS = ("features", "images")  # precomputed (n, d) / (n, R, d) features; raw pixels through a CNN
# word ids of a cocos Vocabulary (the GRU caption encoders of VSE++ and VSRN); BERT word pieces of a BERT folder
# (VSE∞: cocos.data.wordpiece, the folder given as --bert, its config.json passed to the module as bert_config)
# a Hugging Face folder's own tokenizer (its tokenizers JSON, cut to the text tower's positions: cocos.data.clip's
# CLIPCoder): the byte-level BPE of a CLIP folder (the folder given as --clip), a SigLIP folder's (--siglip;
# cocos.data.siglip: its module pads the ids to the tower's length)
TEXTS = ("vocab", "wordpiece", "clip")


@dataclass(frozen=True)
class OriginalImage:
    """How an image encoder of the original VSE++/VSRN code (``model_best.pth.tar``, :mod:`cocos.legacy`) maps onto
    the family: ``matches(state_dict, opt)`` tells whether the original image encoder's weights are this family's;
    ``convert(state_dict, path, opt) -> (state, hparams)`` renames them to the module's and reads its sizes."""

    matches: Callable[[dict, dict], bool]
    convert: Callable[..., tuple[dict, dict]]
    encoder: str = ""  # the original encoder's name, for messages ("VSE++ EncoderImagePrecomp")
    code: str = ""  # the original repository's code name recorded in the checkpoint ("vsepp", "vsrn")
    feature_rank: int | None = None  # precomputed features it took per image: 1 (d,), 2 (R, d); None: raw images


@dataclass(frozen=True)
class Source:
    """A pre-trained source a family starts from: a folder or file the user names with ``--source NAME=PATH`` (or
    ``--NAME PATH``: ``--bert DIR``, ``--clip DIR``), recorded as ``train.sources.NAME``.

    ``read(path)`` opens it for training, checked whole before anything is built (one :class:`CocosError` line
    otherwise), and returns an object with ``coder`` (the caption coder it brings, or None) and ``path``;
    ``records(opened)`` is what the module records of it among its constructor arguments (``bert_config``;
    ``clip_config`` and ``preprocess``), so that a checkpoint stands alone, and ``recorded`` names those arguments;
    ``load(model, opened)`` puts its weights into a new model (a resumed run takes them from its checkpoint).
    ``what`` says what it is, ``coder_words`` what codes the captions and ``metavar`` what the path is (``DIR``,
    ``FILE``), for messages. The trainer, the run's checks and the CLI loop over a family's sources and never name
    one."""

    name: str
    what: str
    read: Callable[[str], Any]
    records: Callable[[Any], dict]
    recorded: tuple[str, ...]
    load: Callable[[Any, Any], Any]
    coder_words: str = ""
    metavar: str = "DIR"  # what the path is, in messages (``--bert DIR``; a file's source: ``FILE``)


@dataclass(frozen=True)
class ModelFamily:
    """A model family (see the module docstring)."""

    name: str
    label: str  # how tables name it ("VSE++")
    module: type  # the nn.Module class; its constructor takes the hyper-parameters a checkpoint records
    input: str = "features"
    text: str = "vocab"
    defaults: Mapping[str, Any] = field(default_factory=dict)  # training hyper-parameters (flags of cocos train)
    check: Callable[[dict], None] | None = None  # validates a set of training hyper-parameters: CocosError
    min_batch: int = 1  # the least batch a training step takes (a BatchNorm in training mode needs 2)
    images_family: str | None = None  # the family that trains in its place on raw-image data (vsepp -> vsepp_full)
    original: OriginalImage | None = None  # original-code checkpoints it imports (cocos import / analyze)
    describe: Callable[[dict], str] | None = None  # a checkpoint's model in words (the CNN: "VSE++ (ResNet-152)")
    description: str = ""  # one line for `cocos models`
    imports: str = ""  # the original checkpoints a whole-model importer of cocos.legacy reads (for `cocos models`)
    recipe: Mapping[str, Any] = field(default_factory=dict)  # the paper's training settings (flat names of cocos
    # train: {"optimizer": "adamw", "lr": 5e-4, ...}), used where the run does not set them (trainer.with_recipe)
    sources: tuple[Source, ...] = ()  # the pre-trained sources a run starts from (a BERT folder, a CLIP folder)
    # Hugging Face folders that are whole models of the family, by their config.json's model_type, each with the
    # function that makes a cocos checkpoint of one in memory, (folder, data, log=...) -> dict: cocos analyze DIR
    folders: Mapping[str, Callable[..., dict]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str) or any(c in self.name for c in " ,/="):
            raise CocosError(f"a model name must be a word without spaces, commas, '/' or '=', got {self.name!r}")
        if self.input not in INPUTS:
            raise CocosError(f"model '{self.name}': unknown input '{self.input}' (use {' or '.join(INPUTS)})")
        if self.text not in TEXTS:
            raise CocosError(f"model '{self.name}': unknown caption input '{self.text}' (use {', '.join(TEXTS)})")
        if not callable(self.module):
            raise CocosError(f"model '{self.name}': module must be an nn.Module class")
        unknown = [k for k in self.defaults if k not in self.arguments()]
        if unknown:
            raise CocosError(f"model '{self.name}': defaults {', '.join(unknown)} are not arguments of "
                             f"{getattr(self.module, '__name__', self.module)}")

    def arguments(self) -> dict[str, inspect.Parameter]:
        """The module constructor's named arguments (what ``hparams`` may hold)."""
        return constructor_arguments(self.module)

    def params(self, **given) -> dict[str, Any]:
        """The training hyper-parameters: defaults overridden by ``given`` (``None`` = default), each of its
        default's type, then the family's ``check``. A name the family does not take is one line."""
        unknown = [k for k, v in given.items() if v is not None and k not in self.defaults]
        if unknown:
            takes = ", ".join(self.defaults) or "no parameters"
            raise CocosError(f"model '{self.name}' takes no parameter {', '.join(unknown)} (it takes {takes})")
        out = {k: _typed(k, d if given.get(k) is None else given[k], d) for k, d in self.defaults.items()}
        if self.check is not None:
            try:
                self.check(out)
            except CocosError:
                raise
            except Exception as exc:  # noqa: BLE001 - a plugin's check may raise anything: one line naming it
                raise CocosError(f"model '{self.name}': {exc}") from None
        return out

    def hparams(self, params: Mapping[str, Any], vocab_size: int, feature_dim: int | None = None,
                records: Mapping[str, Any] | None = None) -> dict:
        """The module's constructor arguments for training: the hyper-parameters, the vocabulary's size, for a
        family that reads precomputed features their dimension (``img_dim``), and what its pre-trained sources
        record (``records``, :attr:`Source.records`: a BERT's ``config.json`` as ``bert_config``, a CLIP folder's
        ``clip_config`` and ``preprocess``)."""
        out = {**params, **{k: v for k, v in (records or {}).items() if k in self.arguments()},
               "vocab_size": int(vocab_size)}
        if "img_dim" in self.arguments() and feature_dim is not None:
            out["img_dim"] = int(feature_dim)
        return out

    def source_records(self, hparams: Mapping[str, Any]) -> dict:
        """What a checkpoint's ``hparams`` record of the family's sources (a resumed run rebuilds from them)."""
        return {k: hparams[k] for s in self.sources for k in s.recorded if k in hparams}

    def build(self, **hparams):
        """The module with constructor arguments ``hparams`` (a checkpoint's ``model.hparams``)."""
        try:
            return self.module(**hparams)
        except TypeError as exc:  # a setting the model does not take (vsepp_full reads pixels: no img_dim)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CocosError(f"model '{self.name}' cannot be built with {', '.join(sorted(hparams))} "
                             f"({first})") from None

    def words(self, hparams: Mapping[str, Any]) -> str:
        """The model in words, for reports."""
        return self.describe(dict(hparams)) if self.describe is not None else self.label


def constructor_arguments(cls) -> dict[str, inspect.Parameter]:
    """A class's constructor arguments that can be named (a checkpoint's ``hparams`` may hold only these)."""
    return {n: p for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _typed(name: str, value, default):
    """``value`` as the type of ``default`` (bool, int, str or float); one line otherwise."""
    if default is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, bool):
            return value
        raise CocosError(f"--{name.replace('_', '-')} must be true or false, got {value!r}")
    if isinstance(default, str):
        return str(value)
    kind = int if isinstance(default, int) else float
    try:
        if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise CocosError(f"--{name.replace('_', '-')} must be {what}, got {value!r}") from None
