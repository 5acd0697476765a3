"""Captions as token ids: a small tokenizer, the vocabulary, and batch padding.

No downloads and no nltk: :func:`tokenize` lowercases, splits on whitespace and
splits punctuation off as separate tokens (``"A dog's ball."`` ->
``["a", "dog", "'s", "ball", "."]``). It is close to, but not the same as, nltk's
``word_tokenize`` used by VSE++/SCAN; a vocabulary loaded from SCAN's JSON works
with it, words it splits differently simply map to ``<unk>`` more often.

The special tokens sit at fixed ids, as in VSE++/SCAN: ``<pad>`` = 0,
``<start>`` = 1, ``<end>`` = 2, ``<unk>`` = 3.

**Caption length cap.** :meth:`Vocabulary.encode` keeps at most
:data:`MAX_CAPTION_TOKENS` = 512 ids per caption, ``<start>`` and ``<end>`` included
(510 words): a longer caption (one 2 MB line of 400,000 words in a caption file) is cut
and a :class:`CaptionTruncatedWarning` is issued (Python shows it once per place it
comes from, so once per caption file in practice). Real captions are far shorter (VSRN
pads to 60).

**Vocabulary files.** :meth:`Vocabulary.from_file` reads a SCAN/VSRN JSON
(:meth:`Vocabulary.from_scan_json`) or a pickled ``Vocabulary`` of the original
VSE++/VSRN code (:meth:`Vocabulary.from_pickle`), the latter with a restricted
unpickler that builds nothing but plain dicts, ints and strings: a pickle that names
any other class or function (``os.system``, ``builtins.exec``, ``subprocess.Popen``, ...)
is refused before anything of it runs. Either reader turns every problem with the file
into one :class:`CocosError` line naming it.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

from cocos.errors import CocosError
from cocos.safeload import BudgetedUnpickler

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS: tuple[str, ...] = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
# At most this many ids per encoded caption, <start> and <end> included (longer ones are cut).
MAX_CAPTION_TOKENS = 512
# Vocabulary files larger than this are refused (Flickr30k's pickle is about 0.3 MB, COCO's JSON 1 MB).
MAX_VOCAB_FILE_BYTES = 64 << 20
TRUNCATION_MESSAGE = (f"a caption longer than {MAX_CAPTION_TOKENS - 2} words was cut to its first "
                      f"{MAX_CAPTION_TOKENS - 2} (cocos keeps at most {MAX_CAPTION_TOKENS} tokens per caption)")


class CaptionTruncatedWarning(UserWarning):
    """A caption had more than ``MAX_CAPTION_TOKENS - 2`` words and was cut."""

# A word (letters, digits, underscore), a clitic glued to a word ("'s" in "dog's"),
# or any other single non-space character (punctuation).
_TOKEN_RE = re.compile(r"(?<=\w)'\w+|\w+|[^\w\s]")


def iter_tokens(text: str) -> Iterator[str]:
    """The tokens of :func:`tokenize`, one at a time (a huge caption is never split whole)."""
    if not isinstance(text, str):
        raise CocosError(f"a caption must be a string, got {type(text).__name__}")
    return (m.group() for m in _TOKEN_RE.finditer(text.lower()))


def tokenize(text: str) -> list[str]:
    """Lowercase, split punctuation off as separate tokens, split on whitespace."""
    return list(iter_tokens(text))


class Vocabulary:
    """Word <-> id map with the four special tokens at ids 0..3."""

    units = "words"  # what its tokens are, in words

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        if tuple(tokens[: len(SPECIALS)]) != SPECIALS:
            raise CocosError(
                f"a vocabulary must start with {', '.join(SPECIALS)} (ids 0..3), "
                f"got {tokens[: len(SPECIALS)]}"
            )
        index: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str) or not tok:
                raise CocosError(f"vocabulary token {i} is not a non-empty string: {tok!r}")
            if tok in index:
                raise CocosError(f"vocabulary token {tok!r} appears twice (ids {index[tok]}, {i})")
            index[tok] = i
        self._tokens = tokens
        self._index = index

    # -- construction ---------------------------------------------------------------

    @classmethod
    def build(cls, captions: Iterable[str], threshold: int = 4) -> Vocabulary:
        """Words occurring at least ``threshold`` times, ordered by (-count, word)."""
        if threshold < 1:
            raise CocosError(f"vocabulary threshold must be at least 1, got {threshold}")
        counts: Counter[str] = Counter()
        for caption in captions:
            counts.update(tokenize(caption))
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((w for w, c in counts.items() if c >= threshold), key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + kept)

    @classmethod
    def from_tokens(cls, tokens: Sequence[str]) -> Vocabulary:
        """Rebuild from :attr:`tokens` (e.g. as stored in a checkpoint)."""
        return cls(tokens)

    @classmethod
    def from_scan_json(cls, path: str | os.PathLike) -> Vocabulary:
        """Load a SCAN/VSRN vocabulary JSON: ``{"word2idx": {...}, "idx2word": {...}, "idx": N}``.

        Read with :mod:`json` only (never pickle). Ids must be ``0..N-1`` without
        gaps, with the special tokens at 0..3.
        """
        return cls._checked(path, read_scan_json_tokens(path))

    @classmethod
    def from_pickle(cls, path: str | os.PathLike) -> Vocabulary:
        """Load a pickled ``Vocabulary`` of VSE++/VSRN (``*_vocab.pkl``) without running code from it.

        The pickle may refer to the class as ``vocab.Vocabulary`` or ``__main__.Vocabulary``
        (protocols 0-5, Python 2 or 3); it becomes a plain stand-in whose ``word2idx``,
        ``idx2word`` and ``idx`` are read as in :meth:`from_scan_json`. Any other class or
        function named in the pickle is refused (one :class:`CocosError` line) before it runs.
        """
        return cls._checked(path, read_pickle_tokens(path))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Vocabulary:
        """A vocabulary JSON (first non-blank byte ``{``) or a vocabulary pickle (anything else)."""
        return cls._checked(path, read_vocab_tokens(path))

    @classmethod
    def _checked(cls, path: str | os.PathLike, tokens: list[str]) -> Vocabulary:
        try:
            return cls(tokens)
        except CocosError as exc:
            raise CocosError(f"{path}: {exc}") from None

    # -- use ------------------------------------------------------------------------

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order, a plain list of str (store it in a checkpoint)."""
        return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, word: object) -> bool:
        return word in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._tokens == other._tokens

    def __hash__(self) -> int:
        return hash(tuple(self._tokens))

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens)"

    def id(self, word: str) -> int:
        """Id of ``word``; ``<unk>`` (3) if unknown."""
        return self._index.get(word, UNK_ID)

    def word(self, idx: int) -> str:
        if not 0 <= idx < len(self._tokens):
            raise CocosError(f"token id {idx} is outside the vocabulary (size {len(self)})")
        return self._tokens[idx]

    def encode(self, text: str) -> list[int]:
        """``[<start>] + ids of tokenize(text) + [<end>]``; unknown words become ``<unk>``.

        At most :data:`MAX_CAPTION_TOKENS` (512) ids, ``<start>`` and ``<end>`` included: the
        words after the first 510 are dropped with a :class:`CaptionTruncatedWarning`. The
        text is tokenised lazily, so a huge caption costs no more memory than its first
        510 words.
        """
        words = iter_tokens(text)
        ids = [START_ID] + [self._index.get(w, UNK_ID) for w in itertools.islice(words, MAX_CAPTION_TOKENS - 2)]
        if next(words, None) is not None:
            warnings.warn(TRUNCATION_MESSAGE, CaptionTruncatedWarning, stacklevel=2)
        ids.append(END_ID)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> list[str]:
        """Tokens of ``ids``; ``<pad>``, ``<start>`` and ``<end>`` dropped unless asked for."""
        drop = {PAD_ID, START_ID, END_ID} if skip_special else set()
        return [self.word(int(i)) for i in ids if int(i) not in drop]


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _as_id(value: object) -> int | None:
    """An id: an int, or a string of at most 18 ASCII digits (JSON object keys); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and 0 < len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)
    return None


def _short(value: object, limit: int = 40) -> str:
    """A value from a file for a message: one line, at most about ``limit`` characters.

    Only strings and numbers are shown (``repr`` of a string escapes newlines); anything
    else by its type, since the repr of a crafted nested object could be huge or recurse.
    """
    if isinstance(value, str):
        text = repr(value[:limit])
    elif isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) < 10**18):
        text = repr(value)
    elif isinstance(value, int):
        text = "a huge integer"
    else:
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]


def _read_vocab_bytes(path: str | os.PathLike) -> tuple[Path, bytes]:
    path = Path(path)
    if not path.is_file():
        raise CocosError(f"{path}: no such vocabulary file")
    try:
        size = path.stat().st_size
        if size > MAX_VOCAB_FILE_BYTES:
            raise CocosError(f"{path}: {size:,} bytes is too large for a vocabulary file "
                             f"(at most {MAX_VOCAB_FILE_BYTES >> 20} MiB)")
        data = path.read_bytes()
    except OSError as exc:
        raise CocosError(f"{path}: cannot read the vocabulary ({exc.strerror or exc})") from None
    if not data:
        raise CocosError(f"{path}: the vocabulary file is empty")
    return path, data


def tokens_from_maps(path: str | os.PathLike, word2idx: object, idx2word: object, idx: object = None) -> list[str]:
    """Tokens in id order from a ``word2idx`` and/or ``idx2word`` map (both are checked if both are there).

    Ids must be ints (or strings of digits: JSON object keys) covering ``0..N-1`` without
    gaps, words non-empty strings, the two maps must agree, each word must have one id, and
    ``idx`` (if given) must equal ``N``. The special tokens are not checked here.
    """
    if not isinstance(word2idx, dict) and not isinstance(idx2word, dict):
        raise CocosError(f"{path}: expected a vocabulary with 'word2idx' and 'idx2word' maps")
    by_id: dict[int, str] = {}
    for key, pairs in (("word2idx", [(i, w) for w, i in _dict(word2idx).items()]),
                       ("idx2word", list(_dict(idx2word).items()))):
        for raw_id, word in pairs:
            _add_entry(path, key, by_id, raw_id, word)
    n = len(by_id)
    if sorted(by_id) != list(range(n)):
        raise CocosError(f"{path}: vocabulary ids are not 0..{n - 1} without gaps")
    if idx is not None and (isinstance(idx, bool) or idx != n):
        raise CocosError(f"{path}: 'idx' says {_short(idx)} words but the maps hold {n}")
    tokens = [by_id[i] for i in range(n)]
    _check_unique(path, tokens)
    return tokens


def _add_entry(path, key: str, by_id: dict[int, str], raw_id: object, word: object) -> None:
    """Record ``word`` under the id ``raw_id`` of the map ``key`` in ``by_id``: the id must be an id
    (:func:`_as_id`), the word a non-empty string, and an id already recorded must have the same word."""
    idx_ = _as_id(raw_id)
    if idx_ is None:
        raise CocosError(f"{path}: '{key}' holds a non-integer id {_short(raw_id)}")
    if not isinstance(word, str) or not word:
        raise CocosError(f"{path}: '{key}' holds a word that is not a non-empty string: {_short(word)}")
    if by_id.setdefault(idx_, word) != word:
        raise CocosError(f"{path}: id {_short(idx_)} is given to both {_short(by_id[idx_])} and {_short(word)}")


def _check_unique(path, tokens: list[str]) -> None:
    """Each word of ``tokens`` (in id order) once; the first repeated word is named with its first two ids."""
    if len(set(tokens)) == len(tokens):
        return
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in seen:
            raise CocosError(f"{path}: vocabulary word {_short(tok)} has two ids ({seen[tok]}, {i})")
        seen[tok] = i


def read_scan_json_tokens(path: str | os.PathLike, data: bytes | None = None) -> list[str]:
    """Tokens in id order of a SCAN/VSRN vocabulary JSON (see :meth:`Vocabulary.from_scan_json`)."""
    if data is None:
        path, data = _read_vocab_bytes(path)
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CocosError(f"{path}: not UTF-8 text ({_first_line(exc)})") from None
    except RecursionError:
        raise CocosError(f"{path}: not a readable vocabulary JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, and integers longer than Python's digit limit
        raise CocosError(f"{path}: not a readable vocabulary JSON ({_first_line(exc)})") from None
    if not isinstance(obj, dict) or not any(isinstance(obj.get(k), dict) for k in ("word2idx", "idx2word")):
        raise CocosError(f"{path}: expected a JSON object with 'word2idx' and 'idx2word'")
    return tokens_from_maps(path, obj.get("word2idx"), obj.get("idx2word"), obj.get("idx"))


class _PickledVocabulary:
    """What a pickled ``vocab.Vocabulary`` becomes: a bare holder of its attributes (no methods run)."""


def _reconstructor(cls, base, state):
    """``copyreg._reconstructor`` (pickle protocols 0 and 1) for the stand-in class only."""
    if cls is not _PickledVocabulary or base is not object or state is not None:
        raise pickle.UnpicklingError("copyreg._reconstructor is allowed for the Vocabulary class only")
    return object.__new__(cls)


# Modules the original repositories pickle their Vocabulary class from: vocab.py imported
# (``vocab``) or run as a script (``__main__``), or a package's ``...vocab`` module.
_VOCAB_MODULES = ("vocab", "__main__", "vocabulary", "data", "utils")


class _VocabularyUnpickler(BudgetedUnpickler):
    """Resolves only the Vocabulary class (to a plain stand-in) and what plain objects need.

    A :class:`cocos.safeload.BudgetedUnpickler` (the pure-Python unpickler, as for image pickles): a damaged memo
    index cannot make it allocate more than the file holds, nor can memo references expand it beyond its budget
    (8 x the file's size + 64 MiB).
    """

    def find_class(self, module: str, name: str):
        if name == "Vocabulary" and (module in _VOCAB_MODULES or module.endswith((".vocab", ".vocabulary"))):
            return _PickledVocabulary
        if (module, name) in (("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor")):
            return _reconstructor
        if (module, name) in (("builtins", "object"), ("__builtin__", "object")):
            return object
        raise pickle.UnpicklingError(f"the pickle refers to {module}.{name}")


def read_pickle_tokens(path: str | os.PathLike, data: bytes | None = None) -> list[str]:
    """Tokens in id order of a pickled VSE++/VSRN ``Vocabulary`` (see :meth:`Vocabulary.from_pickle`)."""
    if data is None:
        path, data = _read_vocab_bytes(path)
    try:
        obj = _VocabularyUnpickler(io.BytesIO(data), len(data), encoding="utf-8").load()
    except pickle.UnpicklingError as exc:
        message = _first_line(exc)
        if message.startswith("the pickle refers to"):
            raise CocosError(f"{path}: {message}, which cocos does not load (a vocabulary pickle may hold "
                             "only a Vocabulary with word2idx, idx2word and idx)") from None
        raise CocosError(f"{path}: not a readable vocabulary pickle ({message})") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a foreign pickle is bad input
        raise CocosError(f"{path}: not a readable vocabulary pickle ({type(exc).__name__}: "
                         f"{_first_line(exc)})") from None
    if isinstance(obj, _PickledVocabulary):
        attrs = obj.__dict__ if isinstance(getattr(obj, "__dict__", None), dict) else {}
    elif isinstance(obj, dict):
        attrs = obj
    else:
        raise CocosError(f"{path}: the pickle holds a {type(obj).__name__}, not a vocabulary")
    return tokens_from_maps(path, attrs.get("word2idx"), attrs.get("idx2word"), attrs.get("idx"))


def read_vocab_tokens(path: str | os.PathLike) -> list[str]:
    """Tokens in id order of a vocabulary JSON (first non-blank byte ``{``) or pickle, specials not checked."""
    path, data = _read_vocab_bytes(path)
    if data.lstrip()[:1] == b"{" or path.suffix.lower() == ".json":
        return read_scan_json_tokens(path, data)
    return read_pickle_tokens(path, data)


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists: ``(LongTensor (n, Lmax), LongTensor (n,) lengths)``, order kept."""
    if len(sequences) == 0:
        raise CocosError("cannot pad an empty batch of captions")
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    out = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            out[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    return out, lengths
