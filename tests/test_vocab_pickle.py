"""Vocabulary files of the original code: pickles read without running code, JSON hardened, captions capped."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
import types
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cocos.data.text import (
    MAX_CAPTION_TOKENS,
    CaptionTruncatedWarning,
    Vocabulary,
    read_vocab_tokens,
    tokenize,
)
from cocos.errors import CocosError

WORDS = ["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "runs", "café"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def vocab_pickle(words=WORDS, module: str = "vocab", protocol: int = 2, **extra) -> bytes:
    """What VSE++'s vocab.py writes: a pickled ``module.Vocabulary`` with word2idx, idx2word, idx."""
    cls = type("Vocabulary", (), {"__module__": module})
    fake = types.ModuleType(module)
    fake.Vocabulary = cls
    saved = sys.modules.get(module)
    sys.modules[module] = fake
    try:
        obj = cls()
        obj.word2idx = {w: i for i, w in enumerate(words)}
        obj.idx2word = {i: w for i, w in enumerate(words)}
        obj.idx = len(words)
        obj.__dict__.update(extra)
        return pickle.dumps(obj, protocol=protocol)
    finally:
        if saved is None:
            del sys.modules[module]
        else:
            sys.modules[module] = saved


def py2_pickle(words=WORDS) -> bytes:
    """A Python 2 ``pickle.dump(vocab, f, 2)``: NEWOBJ, byte strings (``U``) for str, ``X`` for unicode."""
    def s(text: str) -> bytes:
        raw = text.encode("utf-8")
        return (b"U" + bytes([len(raw)]) + raw) if text.isascii() else (b"X" + struct.pack("<I", len(raw)) + raw)

    out = b"\x80\x02cvocab\nVocabulary\nq\x00)\x81q\x01}q\x02(" + s("word2idx") + b"}("
    out += b"".join(s(w) + b"K" + bytes([i]) for i, w in enumerate(words)) + b"u"
    out += s("idx2word") + b"}(" + b"".join(b"K" + bytes([i]) + s(w) for i, w in enumerate(words)) + b"u"
    out += s("idx") + b"K" + bytes([len(words)]) + b"ub."
    return out


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def one_line_error(func, *args) -> str:
    with pytest.raises(CocosError) as info:
        func(*args)
    message = str(info.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


# -- reading the original pickles --------------------------------------------------------------

@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("module", ["vocab", "__main__"])
def test_pickles_of_every_protocol_and_module_name_load(tmp_path, protocol, module):
    path = write(tmp_path, "f30k_precomp_vocab.pkl", vocab_pickle(module=module, protocol=protocol))
    vocab = Vocabulary.from_pickle(path)
    assert vocab.tokens == WORDS
    assert vocab.encode("A dog runs fast") == [1, 4, 5, 6, 3, 2]
    assert Vocabulary.from_file(path) == vocab


def test_python2_pickle_with_byte_strings_loads(tmp_path):
    assert Vocabulary.from_pickle(write(tmp_path, "v.pkl", py2_pickle())).tokens == WORDS


def test_specials_elsewhere_are_read_as_they_are_then_refused_by_the_cocos_vocabulary(tmp_path):
    moved = ["a", "dog", "<pad>", "<start>", "<end>", "<unk>"]
    path = write(tmp_path, "v.pkl", vocab_pickle(moved))
    assert read_vocab_tokens(path) == moved  # the legacy import moves them (with the embedding rows)
    assert "must start with <pad>" in one_line_error(Vocabulary.from_pickle, path)


@pytest.mark.parametrize("change, words", [
    ({"idx": 99}, "'idx' says 99"),
    ({"idx2word": {0: "<pad>", 1: "<start>", 2: "<end>", 3: "<unk>", 4: "cat"}}, "given to both"),
    ({"word2idx": {"<pad>": 0, "<start>": 1, "<end>": 2, "<unk>": 3, "a": 9}}, "without gaps"),
    ({"word2idx": {"<pad>": "zero"}}, "non-integer id"),
    ({"idx2word": {0: 7}}, "not a non-empty string"),
])
def test_inconsistent_maps_are_refused(tmp_path, change, words):
    path = write(tmp_path, "v.pkl", vocab_pickle(WORDS[:5], **change))
    assert words in one_line_error(Vocabulary.from_pickle, path)


class _Run:
    """Unpickling this calls ``func(*args)``."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def test_crafted_pickles_are_refused_and_run_nothing(tmp_path):
    marker = tmp_path / "PWNED"
    crafted = {
        "os.system": pickle.dumps(_Run(os.system, f"touch {marker}")),
        "builtins.exec": pickle.dumps(_Run(exec, f"open({str(marker)!r}, 'w').close()")),
        "subprocess.Popen": pickle.dumps(_Run(subprocess.Popen, ["touch", str(marker)])),
        "inside the vocabulary": vocab_pickle(WORDS, note=_Run(os.system, f"touch {marker}")),
        "eval in word2idx": pickle.dumps({"word2idx": _Run(eval, f"open({str(marker)!r}, 'w')")}),
        "getattr": pickle.dumps(_Run(getattr, "text", "upper")),
        # protocol 0's reconstructor, allowed for the Vocabulary class only, with nothing but object.__new__
        "reconstructor state": b"ccopy_reg\n_reconstructor\n(cvocab\nVocabulary\nc__builtin__\nobject\nS'x'\ntR.",
        "reconstructor class": b"ccopy_reg\n_reconstructor\n(c__builtin__\nobject\nc__builtin__\nobject\nNtR.",
        "reconstructor base": b"ccopy_reg\n_reconstructor\n(cvocab\nVocabulary\nc__builtin__\ndict\nNtR.",
    }
    for name, data in crafted.items():
        path = write(tmp_path, f"{name}.pkl", data)
        message = one_line_error(Vocabulary.from_pickle, path)
        assert str(path) in message, name
        assert "cocos does not load" in message or "not a readable vocabulary" in message, (name, message)
        assert not marker.exists(), name


def test_non_vocabulary_pickles_and_odd_files_are_refused(tmp_path):
    cases = {
        "list": (pickle.dumps([1, 2, 3]), "not a vocabulary"),
        "empty": (b"", "empty"),
        "truncated": (vocab_pickle()[:-7], "not a readable vocabulary pickle"),
        "no maps": (pickle.dumps({"idx": 3}), "word2idx"),
        "persistent id": (b"\x80\x02P0\n.", "not a readable vocabulary pickle"),
    }
    for name, (data, words) in cases.items():
        assert words in one_line_error(Vocabulary.from_pickle, write(tmp_path, f"{name}.pkl", data)), name
    assert "no such vocabulary file" in one_line_error(Vocabulary.from_file, tmp_path / "missing.pkl")
    assert "no such vocabulary file" in one_line_error(Vocabulary.from_file, tmp_path)
    huge = tmp_path / "huge.pkl"
    with open(huge, "wb") as fh:
        fh.truncate(65 << 20)  # sparse: refused by size before it is read
    assert "too large" in one_line_error(Vocabulary.from_file, huge)


# -- the JSON reader, hardened -----------------------------------------------------------------

def scan_json(words=WORDS) -> dict:
    return {"word2idx": {w: i for i, w in enumerate(words)}, "idx2word": {str(i): w for i, w in enumerate(words)},
            "idx": len(words)}


def test_json_vocabulary_is_read_by_from_file_whatever_its_name(tmp_path):
    text = json.dumps(scan_json())
    assert Vocabulary.from_file(write(tmp_path, "f30k_precomp_vocab.json", text)).tokens == WORDS
    assert Vocabulary.from_file(write(tmp_path, "vocab.pkl", "  \n" + text)).tokens == WORDS


@pytest.mark.parametrize("text, words", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"word2idx": {"<pad>": ' + "9" * 5000 + "}}", "not a readable vocabulary JSON"),
    ('{"idx2word": {"' + "9" * 5000 + '": "<pad>"}}', "non-integer id"),
    ('{"idx2word": {"\u00b2": "<pad>"}}', "non-integer id"),  # a digit to str.isdigit, not to int()
    ('{"word2idx": [1, 2]}', "expected a JSON object"),
    ('{"word2idx": {"<pad>": 0}, "idx": "1"}', "'idx' says '1'"),
    ('{"idx2word": {"0": {"nested": "word"}}}', "not a non-empty string"),
    ('{"idx2word": {"0": "<pad>\\nerror: injected"}}', "must start with"),
    ("{", "not a readable vocabulary JSON"),
], ids=["deep", "5000-digit value", "5000-digit key", "superscript digit", "list map", "string idx", "dict word",
        "newline word", "truncated"])
def test_bad_json_gives_one_line(tmp_path, text, words):
    path = write(tmp_path, "v.json", text)
    assert words in one_line_error(Vocabulary.from_scan_json, path)
    assert words in one_line_error(Vocabulary.from_file, path)


def test_json_that_is_not_utf8_gives_one_line(tmp_path):
    path = write(tmp_path, "v.json", b'{"idx2word": {"0": "caf\xe9"}}')
    assert "not UTF-8" in one_line_error(Vocabulary.from_scan_json, path)


# -- fuzzing: a vocabulary or one CocosError line, never another exception -----------------------

def check_reader(func, path: Path) -> None:
    try:
        vocab = func(path)
    except CocosError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert isinstance(vocab, Vocabulary) and vocab.tokens[:4] == WORDS[:4]


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzz_random_bytes(tmp_path, data):
    path = write(tmp_path, "v.pkl", data)
    check_reader(Vocabulary.from_pickle, path)
    check_reader(Vocabulary.from_file, path)


@FUZZ
@given(protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), cut=st.integers(0, 10_000),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
def test_fuzz_truncated_and_corrupted_pickles(tmp_path, protocol, cut, flips):
    data = bytearray(vocab_pickle(protocol=protocol) if protocol else py2_pickle())
    for pos, value in flips:
        data[pos % len(data)] = value
    path = write(tmp_path, "v.pkl", bytes(data[: cut % (len(data) + 1)]))
    check_reader(Vocabulary.from_pickle, path)


_scalars = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=8)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                                            inner, max_size=4),
                     max_leaves=20)
_maps = st.fixed_dictionaries({}, optional={
    "word2idx": st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=4), st.integers(-1, 9) | _scalars,
                                max_size=9),
    "idx2word": st.dictionaries(st.integers(0, 9).map(str) | st.text(max_size=3),
                                st.sampled_from(WORDS) | _scalars, max_size=9),
    "idx": st.integers(-1, 10) | _scalars,
})


@FUZZ
@given(obj=_json | _maps)
def test_fuzz_json_structures(tmp_path, obj):
    path = write(tmp_path, "v.json", json.dumps(obj))
    check_reader(Vocabulary.from_scan_json, path)
    check_reader(Vocabulary.from_file, path)


@FUZZ
@given(obj=_maps)
def test_fuzz_pickled_maps(tmp_path, obj):
    check_reader(Vocabulary.from_pickle, write(tmp_path, "v.pkl", vocab_pickle(**obj)))


# -- the caption cap -------------------------------------------------------------------------------

def test_a_huge_caption_is_cut_to_the_cap_with_one_warning_and_little_memory():
    vocab = Vocabulary(WORDS)
    caption = " ".join(["a dog runs"] * 133_334)  # 400,002 words, 2.2 MB
    tracemalloc.start()
    with pytest.warns(CaptionTruncatedWarning, match="cut"):
        ids = vocab.encode(caption)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(ids) == MAX_CAPTION_TOKENS == 512
    assert ids[0] == 1 and ids[-1] == 2 and ids[1:4] == [4, 5, 6] and len(set(ids[1:-1])) == 3
    assert peak < 12 * 2**20  # the lower-cased copy and 510 ids, not 400,000 tokens (about 30 MB)
    exact = " ".join(["dog"] * (MAX_CAPTION_TOKENS - 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a caption of exactly 510 words is kept whole, silently
        assert vocab.encode(exact) == [1] + [5] * 510 + [2]
    assert vocab.encode("A dog's café!") == [1, 4, 5, 3, 7, 3, 2]
    assert len(tokenize(caption)) == 400_002  # tokenize itself is not capped (vocabulary building)


def test_one_warning_per_caption_file():
    from cocos.training.evaluate import tokenize_split

    class Split:  # tokenize_split needs only the captions
        captions = ["a dog"] * 3 + ["dog " * 1000] * 50

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        ids = tokenize_split(Split(), Vocabulary(WORDS))
    assert [len(x) for x in ids] == [4] * 3 + [512] * 50
    assert sum(issubclass(w.category, CaptionTruncatedWarning) for w in caught) == 1


MEMO_READERS = ["cocos.data.text:Vocabulary.from_pickle", "cocos.data.images:read_data_pickle"]


@pytest.fixture(scope="module")
def memo_growth(tmp_path_factory) -> dict[str, int]:
    """Each reader of :data:`MEMO_READERS` on 12 bytes naming memo slot 10^8, one after the other in one fresh
    process (one interpreter and torch to start): {reader: how far it raised the process's peak memory, in kB}."""
    path = tmp_path_factory.mktemp("memo") / "memo.p"
    path.write_bytes(b"\x80\x02}r" + struct.pack("<I", 100_000_000) + b".")
    code = ("import importlib, json, resource, sys\n"
            "readers = json.loads(sys.argv[2])\n"
            "for reader in readers:\n"
            "    importlib.import_module(reader.partition(':')[0])\n"
            "grown = {}\n"
            "for reader in readers:\n"
            "    module, _, attr = reader.partition(':')\n"
            "    obj = importlib.import_module(module)\n"
            "    for part in attr.split('.'):\n        obj = getattr(obj, part)\n"
            "    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "    try:\n        obj(__import__('pathlib').Path(sys.argv[1]))\n    except Exception:\n        pass\n"
            "    grown[reader] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
            "print(json.dumps(grown))")
    out = subprocess.run([sys.executable, "-c", code, str(path), json.dumps(MEMO_READERS)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("reader", MEMO_READERS)
def test_a_huge_memo_index_allocates_nothing(memo_growth, reader):
    """12 bytes naming memo slot 10^8: CPython's C unpickler grew its memo table to it (1.7 GB, seconds). (A peak
    is a high-water mark: the reader before this one in the same process raised it by as little as it is allowed.)"""
    grown_kb = memo_growth[reader]
    assert grown_kb < 100_000, f"unpickling 12 bytes grew the process by {grown_kb // 1024} MB"
