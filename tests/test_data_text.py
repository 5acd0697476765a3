"""Tokenizer, vocabulary (build, order, round trips, SCAN JSON) and batch padding."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cocos.data.text import SPECIALS, Vocabulary, pad_batch, tokenize
from cocos.errors import CocosError

# -- tokenize ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("A man's red Ball, on the LEFT!", ["a", "man", "'s", "red", "ball", ",", "on", "the", "left", "!"]),
        ("  two\tdogs\n running ", ["two", "dogs", "running"]),
        ("", []),
        ("   ", []),
        ("'quoted' word.", ["'", "quoted", "'", "word", "."]),
        ("don't", ["don", "'t"]),
        ("t-shirt (blue)", ["t", "-", "shirt", "(", "blue", ")"]),
        ("3.5 kg", ["3", ".", "5", "kg"]),
        ("...", [".", ".", "."]),
        ("Café NOËL", ["café", "noël"]),
    ],
)
def test_tokenize_hand_written(text, tokens):
    assert tokenize(text) == tokens


def test_tokenize_refuses_non_strings():
    with pytest.raises(CocosError):
        tokenize(None)  # type: ignore[arg-type]


@given(st.text(max_size=60))
def test_tokens_have_no_whitespace_and_lose_no_visible_character(text):
    tokens = tokenize(text)
    assert all(t and not any(ch.isspace() for ch in t) for t in tokens)
    assert "".join(tokens) == "".join(text.lower().split())


# -- vocabulary --------------------------------------------------------------------------

CAPTIONS = [
    "a dog and a cat",  # a:2 dog:1 and:1 cat:1
    "A dog runs.",  # a:3 dog:2 runs:1 .:1
    "the cat, the dog",  # the:2 cat:2 ,:1 dog:3
    "a cat",  # a:4 cat:3
]


def test_vocab_threshold_and_order():
    # counts: a 4, dog 3, cat 3, the 2, and 1, runs 1, . 1, , 1
    assert Vocabulary.build(CAPTIONS, threshold=3).tokens == [*SPECIALS, "a", "cat", "dog"]
    assert Vocabulary.build(CAPTIONS, threshold=4).tokens == [*SPECIALS, "a"]
    assert Vocabulary.build(CAPTIONS, threshold=2).tokens == [*SPECIALS, "a", "cat", "dog", "the"]
    v1 = Vocabulary.build(CAPTIONS, threshold=1)
    assert v1.tokens == [*SPECIALS, "a", "cat", "dog", "the", ",", ".", "and", "runs"]
    assert len(v1) == 12
    assert Vocabulary.build(CAPTIONS).tokens == [*SPECIALS, "a"]  # default threshold 4
    with pytest.raises(CocosError):
        Vocabulary.build(CAPTIONS, threshold=0)


def test_vocab_ignores_special_tokens_in_text_and_order_is_input_independent():
    caps = ["<unk> x y", "y x", "x"]
    v = Vocabulary.build(caps, threshold=1)
    assert v.tokens == [*SPECIALS, "x", "y", "<", ">", "unk"]
    assert Vocabulary.build(list(reversed(caps)), threshold=1) == v


def test_encode_and_decode():
    v = Vocabulary.build(CAPTIONS, threshold=3)  # a=4 cat=5 dog=6
    assert v.encode("A Dog chases a CAT!") == [1, 4, 6, 3, 4, 5, 3, 2]
    assert v.encode("") == [1, 2]
    assert v.decode([1, 4, 6, 3, 2, 0]) == ["a", "dog", "<unk>"]
    assert v.decode([1, 4, 2], skip_special=False) == ["<start>", "a", "<end>"]
    assert v.id("cat") == 5 and v.id("zebra") == 3
    assert "dog" in v and "zebra" not in v
    with pytest.raises(CocosError):
        v.word(len(v))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="abcde ,.", max_size=20), max_size=30), st.integers(1, 3))
def test_from_tokens_round_trip(captions, threshold):
    v = Vocabulary.build(captions, threshold=threshold)
    stored = json.loads(json.dumps(v.tokens))  # as a checkpoint would keep it
    w = Vocabulary.from_tokens(stored)
    assert w == v and w.tokens == v.tokens
    for cap in captions:
        assert w.encode(cap) == v.encode(cap)
        ids = v.encode(cap)
        assert ids[0] == 1 and ids[-1] == 2 and all(0 <= i < len(v) for i in ids)


@pytest.mark.parametrize(
    "tokens",
    [
        ["<pad>", "<start>", "<end>"],
        ["<start>", "<pad>", "<end>", "<unk>", "a"],
        [*SPECIALS, "a", "a"],
        [*SPECIALS, ""],
        [*SPECIALS, 5],
    ],
)
def test_from_tokens_refuses_bad_lists(tokens):
    with pytest.raises(CocosError):
        Vocabulary.from_tokens(tokens)


# -- SCAN vocabulary JSON ----------------------------------------------------------------


def _scan_json(path, words, **override):
    word2idx = {w: i for i, w in enumerate(words)}
    d = {"word2idx": word2idx, "idx2word": {str(i): w for w, i in word2idx.items()},
         "idx": len(words)}
    d.update(override)
    path.write_text(json.dumps(d))
    return path


def test_scan_json_load(tmp_path):
    words = [*SPECIALS, "a", "dog", "runs"]
    v = Vocabulary.from_scan_json(_scan_json(tmp_path / "f30k_precomp_vocab.json", words))
    assert v.tokens == words
    assert v.encode("A dog flies") == [1, 4, 5, 3, 2]
    # only one of the two maps is enough
    only_idx2word = _scan_json(tmp_path / "b.json", words, word2idx=None)
    assert Vocabulary.from_scan_json(only_idx2word).tokens == words


@pytest.mark.parametrize(
    ("words", "override"),
    [
        ([*SPECIALS, "a"], {"idx": 7}),  # count disagrees
        ([*SPECIALS, "a"], {"idx2word": {"0": "<pad>", "1": "<start>", "2": "<end>",
                                         "3": "<unk>", "4": "b"}}),  # maps disagree
        ([*SPECIALS, "a"], {"word2idx": {"<pad>": 0, "<start>": 1, "<end>": 2, "<unk>": 3,
                                         "a": 5}, "idx2word": None, "idx": 5}),  # gap
        (["a", *SPECIALS], {}),  # specials not first
        ([*SPECIALS, "a"], {"word2idx": {"<pad>": "x"}}),  # non-integer id
        ([*SPECIALS], {"word2idx": None, "idx2word": None}),
    ],
)
def test_scan_json_bad(tmp_path, words, override):
    path = _scan_json(tmp_path / "v.json", words, **override)
    with pytest.raises(CocosError, match="v.json") as info:
        Vocabulary.from_scan_json(path)
    assert "\n" not in str(info.value)


def test_scan_json_unreadable(tmp_path):
    with pytest.raises(CocosError, match="no such"):
        Vocabulary.from_scan_json(tmp_path / "missing.json")
    bad = tmp_path / "pickle.json"
    bad.write_bytes(b"\x80\x04\x95")  # a pickle header is refused, never unpickled
    with pytest.raises(CocosError, match="pickle.json"):
        Vocabulary.from_scan_json(bad)


# -- pad_batch ---------------------------------------------------------------------------


def test_pad_batch_hand():
    ids, lengths = pad_batch([[1, 7, 2], [1, 2], [1, 5, 6, 8, 2]])
    assert ids.dtype == torch.long and lengths.dtype == torch.long
    assert ids.tolist() == [[1, 7, 2, 0, 0], [1, 2, 0, 0, 0], [1, 5, 6, 8, 2]]
    assert lengths.tolist() == [3, 2, 5]
    ids, lengths = pad_batch([[4], []], pad_id=9)
    assert ids.tolist() == [[4], [9]] and lengths.tolist() == [1, 0]
    with pytest.raises(CocosError):
        pad_batch([])


@given(st.lists(st.lists(st.integers(1, 50), max_size=8), min_size=1, max_size=10))
def test_pad_batch_round_trip(seqs):
    ids, lengths = pad_batch(seqs)
    assert ids.shape == (len(seqs), max(len(s) for s in seqs))
    for row, seq in enumerate(seqs):
        assert ids[row, : lengths[row]].tolist() == seq
        assert (ids[row, lengths[row]:] == 0).all()
