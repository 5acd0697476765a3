"""Captions as BERT word pieces, with VSE∞'s caption augmentation; a BERT folder on disk.

A caption is split as a BERT tokenizer splits it (the ``tokenizers`` library's ``BertNormalizer`` and
``BertPreTokenizer``: clean, lowercase and strip accents when the model is uncased, split punctuation off; then
WordPiece over each word), and coded ``[CLS] pieces [SEP]`` (ids of the BERT's ``vocab.txt``; ``[PAD]`` must be
id 0, which VSE∞'s attention mask ``tokens != 0`` assumes). A folder without ``vocab.txt`` (what transformers 5's
``BertTokenizer.save_pretrained`` writes) is read from its ``tokenizer.json``: the WordPiece vocabulary of its
``model.vocab`` and ``lowercase`` of its ``BertNormalizer``; a ``tokenizer.json`` that splits otherwise than this
restatement (another normaliser, pre-tokeniser or model, accents kept while lowercasing, added tokens beyond the
vocabulary) is refused in one line.

**Augmentation** (training only; VSE∞'s ``process_caption``, definitions file section 20): each *word* is, with
probability 0.2, changed: with probability 0.5 of that every piece becomes ``[MASK]``, with 0.1 every piece a
random word piece of the vocabulary (an independent draw per piece), with 0.4 the word is dropped. The draws use
torch's RNG (seeded with the run; theirs used Python's ``random`` in the data loader workers).

A :class:`WordPieceCoder` is to a BERT family what :class:`cocos.data.text.Vocabulary` is to a GRU one: ``tokens``
(the id -> piece table a checkpoint records), ``encode(text)`` (what evaluation and counting feed the model) and
``augment(encoded)`` (what a training step feeds it). ``encode`` returns :class:`Pieces`, the ids with the number
of pieces of each word, so a batch is augmented without tokenising again.

``transformers``/``tokenizers`` are imported when a coder is built; a missing one is one line naming the extra.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cocos.errors import CocosError
from cocos.hf import (
    MAX_TOKENIZER_BYTES,
    check_file_size,
    check_heads,
    check_layers,
    check_memory,
    check_vocab,
    config_int,
    read_json,
)

INSTALL = "BERT captions need the tokenizers library: pip install 'cocos[bert]'"
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
AUGMENT_P = 0.2  # a word is changed with this probability while training (VSE∞)
MASK_P, RANDOM_P = 0.5, 0.6  # of a changed word: [MASK] below 0.5, a random piece below 0.6, else dropped
MAX_PIECES = 512  # BERT's positions: longer captions are cut (the [CLS] and [SEP] included)
MAX_VOCAB_BYTES = 16 << 20


class Pieces(list):
    """A caption's ids (``[CLS] ... [SEP]``) and ``words``: the number of pieces of each word, in order."""

    __slots__ = ("words",)

    def __init__(self, ids: Sequence[int], words: Sequence[int]):
        super().__init__(ids)
        self.words = tuple(words)


class WordPieceCoder:
    """A BERT's word-piece vocabulary as a caption coder (module docstring)."""

    kind = "wordpiece"
    units = "word pieces"  # what its tokens are, in words

    def __init__(self, tokens: Sequence[str], lowercase: bool = True):
        tokens = list(tokens)
        index: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str) or not tok:
                raise CocosError(f"word piece {i} is not a non-empty string: {tok!r}")
            index[tok] = i  # a piece listed twice takes its last id, as Hugging Face's tokenizers do
        missing = [s for s in SPECIAL if s not in index]
        if missing:
            raise CocosError(f"a BERT vocabulary needs {', '.join(SPECIAL)}; it lacks {', '.join(missing)}")
        if index["[PAD]"] != 0:
            raise CocosError(f"a BERT vocabulary must have [PAD] at id 0 (VSE∞ masks id 0), not {index['[PAD]']}")
        self._tokens, self.lowercase = tokens, bool(lowercase)
        self.cls_id, self.sep_id, self.mask_id = index["[CLS]"], index["[SEP]"], index["[MASK]"]
        self.unk_id = index["[UNK]"]
        self._tokenizer = _tokenizer(index, self.lowercase)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, entries: int | None = None) -> WordPieceCoder:
        """The coder of a Hugging Face BERT folder: its ``vocab.txt`` and, where given, ``tokenizer_config.json``'s
        ``do_lower_case`` (default: lowercase, as bert-base-uncased); without ``vocab.txt``, its ``tokenizer.json``
        (module docstring). ``entries``: the vocabulary size its ``config.json`` states (bounds the files' sizes)."""
        return cls(*read_pieces(Path(folder), entries))

    @property
    def tokens(self) -> list[str]:
        return list(self._tokens)

    def options(self) -> dict:
        """What a checkpoint records beside ``tokens`` to rebuild the coder."""
        return {"kind": self.kind, "lowercase": self.lowercase}

    def __len__(self) -> int:
        return len(self._tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordPieceCoder) and (self._tokens, self.lowercase) == (other._tokens, other.lowercase)

    def __hash__(self) -> int:
        return hash((len(self._tokens), self.lowercase))

    def __repr__(self) -> str:
        return f"WordPieceCoder({len(self)} word pieces, lowercase={self.lowercase})"

    def pieces(self, text: str) -> list[str]:
        """The word pieces of ``text`` (no ``[CLS]``/``[SEP]``)."""
        return self._tokenizer.encode(_text(text), add_special_tokens=False).tokens

    def encode(self, text: str) -> Pieces:
        """``[CLS] pieces [SEP]`` (at most :data:`MAX_PIECES` ids), with the pieces per word."""
        return self._coded(self._tokenizer.encode(_text(text), add_special_tokens=False))

    def encode_all(self, captions: Sequence[str]) -> list[Pieces]:
        """:meth:`encode` of every caption, in order (one batched call of the Rust tokenizer)."""
        return [self._coded(e) for e in self._tokenizer.encode_batch([_text(c) for c in captions],
                                                                     add_special_tokens=False)]

    def _coded(self, encoding) -> Pieces:
        ids, word_ids = encoding.ids[: MAX_PIECES - 2], encoding.word_ids[: MAX_PIECES - 2]
        words: list[int] = []
        last = object()
        for w in word_ids:
            if w != last:
                words.append(0)
                last = w
            words[-1] += 1
        return Pieces([self.cls_id, *ids, self.sep_id], words)

    def augment(self, coded: Pieces, generator: torch.Generator | None = None) -> list[int]:
        """VSE∞'s training augmentation of one encoded caption (module docstring)."""
        words = coded.words
        if not words:
            return list(coded)
        draws = torch.rand(len(words), generator=generator).tolist()
        out, pos = [self.cls_id], 1
        for n, u in zip(words, draws, strict=True):
            piece = coded[pos:pos + n]
            pos += n
            if u >= AUGMENT_P:
                out += piece
                continue
            u /= AUGMENT_P
            if u < MASK_P:
                out += [self.mask_id] * n
            elif u < RANDOM_P:
                out += torch.randint(len(self._tokens), (n,), generator=generator).tolist()
            # else: the word is dropped
        out.append(self.sep_id)
        return out


def _text(caption) -> str:
    if not isinstance(caption, str):
        raise CocosError(f"a caption must be a string, got {type(caption).__name__}")
    return caption


def _tokenizer(index: dict[str, int], lowercase: bool):
    try:
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    except ImportError:
        raise CocosError(INSTALL) from None
    tokenizer = Tokenizer(models.WordPiece(index, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                      lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def read_pieces(folder: Path, entries: int | None = None) -> tuple[list[str], bool]:
    """A BERT folder's word pieces (id -> piece) and whether it lowercases: ``vocab.txt`` (and
    ``tokenizer_config.json``), else ``tokenizer.json``; one line for neither."""
    if (folder / "vocab.txt").is_file() or not (folder / "tokenizer.json").is_file():
        if entries is not None and (folder / "vocab.txt").is_file():
            check_file_size(folder / "vocab.txt", entries, "vocab.txt")
        return read_vocab_txt(folder / "vocab.txt"), _lowercase(folder)
    return read_tokenizer_json(folder / "tokenizer.json", entries)


def read_vocab_txt(path: Path) -> list[str]:
    """A BERT ``vocab.txt``: one word piece per line, the line number its id; one line for a bad file."""
    if not path.is_file():
        raise CocosError(f"{path}: no such file (a BERT folder holds its vocab.txt or tokenizer.json)")
    if path.stat().st_size > MAX_VOCAB_BYTES:
        raise CocosError(f"{path}: {path.stat().st_size:,} bytes is too large for a vocab.txt")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CocosError(f"{path}: cannot read it as UTF-8 text ({type(exc).__name__})") from None
    if lines and lines[-1] == "":
        lines.pop()
    tokens = [line.rstrip("\r") for line in lines]
    empty = next((i for i, t in enumerate(tokens) if not t.strip()), None)
    if empty is not None:
        raise CocosError(f"{path}: line {empty + 1} is empty (one word piece per line)")
    return tokens


# what cocos's own tokenizer (:func:`_tokenizer`) does; a tokenizer.json must say the same
RESTATED = {"normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100}}


def read_tokenizer_json(path: Path, entries: int | None = None) -> tuple[list[str], bool]:
    """A BERT ``tokenizer.json``: the word pieces of its WordPiece ``model.vocab`` (ids 0..n-1, each once) and its
    ``BertNormalizer``'s ``lowercase``; one line for a file that is not such a tokenizer (module docstring)."""
    if entries is not None and path.is_file():
        check_file_size(path, entries, "tokenizer.json")
    spec = read_json(path, "tokenizer", MAX_TOKENIZER_BYTES)
    for part, settings in RESTATED.items():
        _check_restated(path, part, spec.get(part), settings)
    lowercase = _normalizer_lowercase(path, spec["normalizer"])
    vocab = spec["model"].get("vocab")
    tokens = _vocab_tokens(path, vocab)
    for added in spec.get("added_tokens") or []:
        if not isinstance(added, dict) or vocab.get(added.get("content")) != added.get("id"):
            raise CocosError(f"{path}: added token {str(added)[:80]} is not a word piece of its vocab with that id")
    return tokens, lowercase


def _check_restated(path: Path, part: str, given, settings: dict) -> None:
    """A ``tokenizer.json``'s ``part`` (a JSON object) with every setting of :data:`RESTATED`'s: it splits as
    :func:`_tokenizer` does; one line naming the first setting that differs otherwise."""
    wrong = [k for k, v in settings.items() if not isinstance(given, dict) or given.get(k) != v]
    if wrong:
        shown = given.get(wrong[0]) if isinstance(given, dict) else given
        raise CocosError(f"{path}: its {part} has {wrong[0]} {str(shown)[:60]!r}; cocos reads BERT tokenizers "
                         f"with {part} {settings[wrong[0]]!r} ({settings['type']})")


def _normalizer_lowercase(path: Path, normalizer: dict) -> bool:
    """A ``BertNormalizer``'s ``lowercase`` (default true), a bool whose ``strip_accents`` is null or the same:
    :func:`_tokenizer` strips accents exactly when it lowercases; one line otherwise."""
    lowercase, accents = normalizer.get("lowercase", True), normalizer.get("strip_accents")
    if not isinstance(lowercase, bool) or accents not in (None, lowercase):
        raise CocosError(f"{path}: its normalizer has lowercase {lowercase!r} and strip_accents {accents!r}; cocos "
                         "strips accents exactly when it lowercases (strip_accents null)")
    return lowercase


def _vocab_tokens(path: Path, vocab) -> list[str]:
    """A WordPiece ``vocab`` (piece -> id) as the id -> piece table: a non-empty object whose ids are 0..n-1, each
    once (a gap would leave an id without a piece); one line otherwise."""
    if not isinstance(vocab, dict) or not vocab:
        raise CocosError(f"{path}: its model has no vocab (piece -> id)")
    tokens = [""] * len(vocab)
    for piece, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(vocab) or tokens[i]:
            raise CocosError(f"{path}: its vocab's ids must be 0..{len(vocab) - 1}, each once ({piece[:40]!r}: {i!r})")
        tokens[i] = piece
    return tokens


def _lowercase(folder: Path) -> bool:
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return True
    return bool(read_json(config, "tokenizer configuration").get("do_lower_case", True))


@dataclass(frozen=True)
class BertFolder:
    """A Hugging Face BERT folder on disk: its ``config.json`` (as a dict) and its word-piece coder."""

    path: Path
    config: dict
    coder: WordPieceCoder

    @classmethod
    def read(cls, folder: str | os.PathLike) -> BertFolder:
        """Read and check the folder (nothing is fetched): a BERT's ``config.json`` whose ``vocab_size`` is the
        ``vocab.txt``'s; one line naming what is wrong."""
        path = Path(folder)
        if not path.is_dir():
            raise CocosError(f"{path}: no such BERT folder (a Hugging Face model folder: config.json, weights, "
                             "vocab.txt or tokenizer.json)")
        config_path = path / "config.json"
        if not config_path.is_file():
            raise CocosError(f"{config_path}: no such file (a BERT folder holds its config.json)")
        config = read_json(config_path)
        if config.get("model_type", "bert") != "bert":
            raise CocosError(f"{config_path}: a {str(config.get('model_type'))[:40]!r} model; VSE∞ takes a BERT "
                             "(model_type 'bert')")
        check_bert_config(config, config_path)
        coder = WordPieceCoder.from_folder(path, config["vocab_size"])  # its files' sizes bounded by vocab_size
        if config["vocab_size"] != len(coder):
            source = "vocab.txt" if (path / "vocab.txt").is_file() else "tokenizer.json"
            raise CocosError(f"{path}: config.json has vocab_size {config['vocab_size']} but {source} "
                             f"{len(coder)} word pieces")
        return cls(path, config, coder)


BERT_SIZES = {"hidden_size": None, "vocab_size": None, "num_hidden_layers": None, "num_attention_heads": None,
              "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2}  # None: required


def check_bert_config(config: dict, where: Path | str, memory: bool = True) -> None:
    """Every size of a BERT ``config.json`` a positive integer (the four of :data:`BERT_SIZES` without a default
    required), ``hidden_size`` a multiple of the heads, at most :data:`cocos.hf.MAX_LAYERS` layers and
    :data:`cocos.hf.MAX_VOCAB` word pieces, and (``memory``) the model within the memory available to train it
    (:func:`_check_size`): one line naming the key, before anything is built."""
    for key, default in BERT_SIZES.items():
        config_int(config, key, str(where), default)
    check_heads(config["hidden_size"], config["num_attention_heads"], str(where))
    check_layers(config["num_hidden_layers"], str(where))
    check_vocab(config["vocab_size"], str(where))
    if memory:
        _check_size(config, where)


def bert_parameters(config: dict) -> int:
    """About how many parameters a BERT of ``config`` has: the embeddings (words, positions, types) and, per layer,
    attention (4 h²) and feed-forward (2 h·i) weights (biases and norms left out; ``intermediate_size`` 3072 where
    absent, as ``BertConfig``)."""
    h = int(config["hidden_size"])
    inner = int(config.get("intermediate_size") or 3072)
    embeddings = (int(config["vocab_size"]) + int(config.get("max_position_embeddings") or 512)
                  + int(config.get("type_vocab_size") or 2)) * h
    return embeddings + int(config["num_hidden_layers"]) * (4 * h * h + 2 * h * inner)


def _check_size(config: dict, where: Path | str) -> None:
    """A BERT that fits in memory as it trains (float32 weights, their gradient and AdamW's two moments: 4 copies,
    and the Python objects of each layer, :func:`cocos.hf.check_memory`): one line before it is built, not an
    allocation failure (or the OOM killer) later."""
    check_memory(bert_parameters(config), int(config["num_hidden_layers"]), 4, str(where), "a BERT", "to train")


def coder_of(tokens: Sequence[str], options: dict | None):
    """The caption coder a checkpoint records: ``vocab`` tokens and its ``text`` options (absent: a
    :class:`cocos.data.text.Vocabulary`)."""
    if options and options.get("kind") == WordPieceCoder.kind:
        return WordPieceCoder(tokens, lowercase=bool(options.get("lowercase", True)))
    if options and options.get("kind") == "clip":
        from cocos.data.clip import coder_options

        coder = coder_options(options)
        if coder.tokens != list(tokens):
            raise CocosError("the recorded CLIP tokenizer's tokens are not the checkpoint's vocab")
        return coder
    from cocos.data.text import Vocabulary

    return Vocabulary.from_tokens(tokens)


__all__ = ["AUGMENT_P", "BertFolder", "Pieces", "WordPieceCoder", "check_bert_config", "coder_of", "read_pieces",
           "read_tokenizer_json", "read_vocab_txt"]
