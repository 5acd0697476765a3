"""Captions as token ids: a small tokenizer, the vocabulary, and batch padding.

No downloads and no nltk: :func:`tokenize` lowercases, splits on whitespace and
splits punctuation off as separate tokens (``"A dog's ball."`` ->
``["a", "dog", "'s", "ball", "."]``). It is close to, but not the same as, nltk's
``word_tokenize`` used by VSE++/SCAN; a vocabulary loaded from SCAN's JSON works
with it, words it splits differently simply map to ``<unk>`` more often.

The special tokens sit at fixed ids, as in VSE++/SCAN: ``<pad>`` = 0,
``<start>`` = 1, ``<end>`` = 2, ``<unk>`` = 3.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from cocos.errors import CocosError

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS: tuple[str, ...] = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3

# A word (letters, digits, underscore), a clitic glued to a word ("'s" in "dog's"),
# or any other single non-space character (punctuation).
_TOKEN_RE = re.compile(r"(?<=\w)'\w+|\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Lowercase, split punctuation off as separate tokens, split on whitespace."""
    if not isinstance(text, str):
        raise CocosError(f"a caption must be a string, got {type(text).__name__}")
    return _TOKEN_RE.findall(text.lower())


class Vocabulary:
    """Word <-> id map with the four special tokens at ids 0..3."""

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
        path = Path(path)
        if not path.is_file():
            raise CocosError(f"{path}: no such vocabulary file")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            first = str(exc).splitlines()[0]
            raise CocosError(f"{path}: not a readable vocabulary JSON ({first})") from None
        if not isinstance(data, dict) or not (
            isinstance(data.get("word2idx"), dict) or isinstance(data.get("idx2word"), dict)
        ):
            raise CocosError(f"{path}: expected a JSON object with 'word2idx' and 'idx2word'")
        by_id: dict[int, str] = {}
        for key, pairs in (
            ("word2idx", [(i, w) for w, i in _dict(data.get("word2idx")).items()]),
            ("idx2word", list(_dict(data.get("idx2word")).items())),
        ):
            for raw_id, word in pairs:
                idx = _as_id(raw_id)
                if idx is None:
                    raise CocosError(f"{path}: '{key}' holds a non-integer id {raw_id!r}")
                if by_id.setdefault(idx, word) != word:
                    raise CocosError(f"{path}: id {idx} is given to both {by_id[idx]!r} and {word!r}")
        n = len(by_id)
        if sorted(by_id) != list(range(n)):
            raise CocosError(f"{path}: vocabulary ids are not 0..{n - 1} without gaps")
        if "idx" in data and data["idx"] != n:
            raise CocosError(f"{path}: 'idx' says {data['idx']} words but the maps hold {n}")
        tokens = [by_id[i] for i in range(n)]
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
        """``[<start>] + ids of tokenize(text) + [<end>]``; unknown words become ``<unk>``."""
        return [START_ID] + [self._index.get(t, UNK_ID) for t in tokenize(text)] + [END_ID]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> list[str]:
        """Tokens of ``ids``; ``<pad>``, ``<start>`` and ``<end>`` dropped unless asked for."""
        drop = {PAD_ID, START_ID, END_ID} if skip_special else set()
        return [self.word(int(i)) for i in ids if int(i) not in drop]


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _as_id(value: object) -> int | None:
    """An id from JSON: an int, or a string of digits (JSON object keys); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


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
