"""Memory bounded by what is read (issue 28, items 5 and 9): pickle bombs, images one at a time, size flags checked
up front, one-line usage errors, CSV oddities (a byte-order mark, a NUL in a caption)."""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
import types
import weakref
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from cocos.data import images as images_mod
from cocos.data.images import MAX_CAPTION_CHARS, ImageBatches, item_generator, load_image_split, open_image
from cocos.data.text import CaptionTruncatedWarning, Vocabulary, _VocabularyUnpickler
from cocos.data.transforms import batch_pixel_bytes, check_image_sizes, train_transform
from cocos.errors import CocosError
from cocos.safeload import BudgetedUnpickler, PickleBombError
from cocos_cli.main import app
from tests.helpers import one_error_line, snapshot

runner = CliRunner()
PAYLOAD = 64 << 10  # 64 kB referred to 2,000 times: 128 MB if every reference were a copy, budget ~64.5 MB


def _png(colour=(10, 20, 30), size=(3, 2)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert text and "\n" not in text and "Traceback" not in text
    return text


# -- pickle bombs: memo references charged; refused before the budget is passed --------------------------------


def _data_bomb(kind: str) -> bytes:
    png = _png()
    blob = png + b"\0" * PAYLOAD
    if kind == "bytearray":  # protocol 5: BYTEARRAY8, then 1,999 memo GETs of it
        images = {i: {"image": bytearray(blob), "filename": f"{i}.png"} for i in range(1)}
        shared = images[0]["image"]
        images = {i: {"image": shared, "filename": f"{i}.png"} for i in range(2000)}
        captions = {i: {"caption": "a dog", "imgid": i} for i in range(2000)}
    elif kind == "entry":  # one image entry (a dict holding the bytes) shared by 2,000 images: weighed whole
        entry = {"image": blob, "filename": "0.png"}
        images = {i: entry for i in range(2000)}
        captions = {i: {"caption": "a dog", "imgid": i} for i in range(2000)}
    else:  # one long caption string shared by 2,000 captions
        text = "a dog " * (PAYLOAD // 6)
        images = {i: {"image": png, "filename": f"{i}.png"} for i in range(400)}
        captions = {i: {"caption": text, "imgid": i // 5} for i in range(2000)}
    out = collections.defaultdict(dict)
    out["images"], out["captions"] = images, captions
    return pickle.dumps(out, protocol=5)


def _vocab_bomb(kind: str) -> bytes:
    cls = type("Vocabulary", (), {"__module__": "vocab"})
    sys.modules["vocab"] = types.SimpleNamespace(Vocabulary=cls)
    try:
        obj = cls()
        shared = "w" * PAYLOAD if kind == "str" else bytearray(PAYLOAD)
        obj.word2idx, obj.idx2word, obj.idx = {"<pad>": 0}, {i: shared for i in range(2000)}, 2000
        return pickle.dumps(obj, protocol=5)
    finally:
        del sys.modules["vocab"]


@pytest.mark.parametrize("case", ["data-bytearray", "data-entry", "data-caption", "vocab-str", "vocab-bytearray"])
def test_a_memo_bomb_is_refused_in_one_line_before_its_budget_is_spent(tmp_path, case):
    reader, kind = case.split("-")
    data = _data_bomb(kind) if reader == "data" else _vocab_bomb(kind)
    assert len(data) < 4 * PAYLOAD  # the file holds the payload once
    path = tmp_path / ("train_set.p" if reader == "data" else "vocab.pkl")
    path.write_bytes(data)
    with pytest.raises(CocosError) as err:
        load_image_split(path, "train") if reader == "data" else Vocabulary.from_file(path)
    line = _one_line(err)
    assert line.startswith(str(path) + ": ") and "pickle bomb" in line
    # counted, not allocated: the unpickler stops at the first reference that passes the budget
    unpickler_cls = images_mod._DataUnpickler if reader == "data" else _VocabularyUnpickler
    unpickler = unpickler_cls(io.BytesIO(data), len(data), encoding="bytes" if reader == "data" else "utf-8")
    with pytest.raises(PickleBombError):
        unpickler.load()
    assert unpickler.budget == 8 * len(data) + (64 << 20)
    assert unpickler.budget < unpickler.produced <= unpickler.budget + 2 * PAYLOAD


def test_weights_count_every_reference_and_legit_sharing_passes():
    class Plain(BudgetedUnpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"the pickle refers to {module}.{name}")

    word = "x" * 1000
    inner = [word, word]  # 2 references to one 1,000-char string
    data = pickle.dumps([inner, inner, inner], protocol=4)
    u = Plain(io.BytesIO(data), len(data), budget=10**9)
    assert u.load() == [[word, word]] * 3
    # charged: the second `word` in inner (one string), then inner twice more (a list of two strings each)
    s, lst = sys.getsizeof(word), sys.getsizeof(inner)
    assert u.charged == s + 2 * (lst + 2 * s)
    assert u.produced == len(data) + u.charged
    # the same pickle under a budget it passes: refused at the reference that passes it
    with pytest.raises(PickleBombError):
        Plain(io.BytesIO(data), len(data), budget=len(data) + s + lst).load()
    # a container referred to again cannot be added to afterwards (its weight would go stale)
    crafted = b"\x80\x04]\x94h\x00" + b"\x8c\x01a" + b"a0."  # EMPTY_LIST MEMOIZE BINGET0 'a' APPEND POP STOP
    with pytest.raises(pickle.UnpicklingError, match="changes a container after referring to it"):
        Plain(io.BytesIO(crafted), len(crafted), budget=10**9).load()
    # a length claim beyond the file allocates nothing: 2**40 bytes claimed by BYTEARRAY8 in 20 bytes
    claim = b"\x80\x05\x96" + struct.pack("<Q", 2**40) + b"abc."
    with pytest.raises(pickle.UnpicklingError, match="truncated"):
        Plain(io.BytesIO(claim), len(claim), budget=10**9).load()


def test_a_huge_caption_costs_no_more_than_the_cap(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    words = "dog " * (MAX_CAPTION_CHARS // 2)  # 131,072 characters
    (tmp_path / "train.csv").write_text(f"image,caption\na.png,{words}\na.png,a cat\n")
    with pytest.warns(CaptionTruncatedWarning, match="cut to its first 65,536"):
        split = load_image_split(tmp_path / "train.csv", "train")
    assert split.captions[0] == ("dog " * (MAX_CAPTION_CHARS // 4)).strip() and split.captions[1] == "a cat"


# -- images decoded one at a time -------------------------------------------------------------------------------


def test_a_batch_holds_one_decoded_image_at_a_time(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    (tmp_path / "pics").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (9, 7 + i, 3), dtype=np.uint8)).save(tmp_path / "pics" / f"{i}.png")
    (tmp_path / "train.csv").write_text("image,caption\n" + "".join(f"pics/{i}.png,c{i}\n" for i in range(4)))
    split = load_image_split(tmp_path / "train.csv", "train")
    rows, keys = [2, 0, 2, 3, 1, 0], [10, 11, 12, 13, 14, 15]  # a pair batch: images repeat, not adjacent
    transform = partial(train_transform, crop_size=4)
    expected = torch.stack([transform(split.image(i), item_generator(5, 1, k)) for i, k in zip(rows, keys, strict=True)])

    alive, peak, decoded = set(), [0], []
    original = type(split).image

    def counting_image(self, i):
        img = original(self, i)
        decoded.append(i)
        alive.add(id(img))
        peak[0] = max(peak[0], len(alive))
        weakref.finalize(img, alive.discard, id(img))
        return img

    monkeypatch.setattr(type(split), "image", counting_image)
    got = ImageBatches(split, transform, [(np.array(rows), np.array(keys))], seed=5, epoch=1)[0]
    assert torch.equal(got, expected)  # the same pixels as row by row
    assert sorted(decoded) == [0, 1, 2, 3]  # each distinct image decoded once
    assert peak[0] == 1  # and never two of them held at once


def test_running_out_of_memory_while_decoding_is_not_called_corrupt(monkeypatch):
    from PIL import ImageFile

    def no_memory(self):
        raise MemoryError

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_memory)
    with pytest.raises(CocosError) as err:
        open_image(_png(size=(5, 4)), "big.png")
    line = _one_line(err)
    assert line.startswith("big.png: not enough memory to decode its 5 x 4 pixels") and "corrupt" not in line


# -- sizes checked up front -------------------------------------------------------------------------------------


def test_check_image_sizes_by_hand():
    need = 3 * batch_pixel_bytes(10, 100)  # 1 + 2 x 1 worker batches of 10 x 3 x 100 x 100 x 4 bytes
    assert need == 3_600_000
    check_image_sizes(110, 100, 10, 1, memory=need)
    with pytest.raises(CocosError, match="more than the"):
        check_image_sizes(110, 100, 10, 1, memory=need - 1)
    check_image_sizes(None, 8192, 1, 0, memory=10**12)
    for bad in [(8193, 224, 1, 0), (256, 8193, 1, 0), (0, 224, 1, 0), (256, 224, 0, 0), (256, 224, 1, -1),
                (256, True, 1, 0), (256, 2.5, 1, 0)]:
        with pytest.raises(CocosError) as err:
            check_image_sizes(*bad, memory=10**12)
        _one_line(err)


@pytest.mark.parametrize("flags", [["--crop-size", "100000"], ["--resize", "0"], ["--batch-size", "0"],
                                   ["--workers", "-1"], ["--resize", "9000"], ["--batch-size", "10000000"]])
def test_features_size_flags_are_one_line_and_write_nothing(tmp_path, flags):
    (tmp_path / "data").mkdir()
    (tmp_path / "w.pth").write_bytes(b"not read")
    before = snapshot(tmp_path)
    res = runner.invoke(app, ["data", "features", str(tmp_path / "data"), "--cnn", "resnet18", "--cnn-weights",
                              str(tmp_path / "w.pth"), "--out", str(tmp_path / "out"), "--no-progress", *flags])
    line = one_error_line(res)
    assert "Usage" not in line and snapshot(tmp_path) == before


@pytest.mark.parametrize("flags", [["--images", "--n-train", "10000000000"], ["--images", "--k", "1000000000"],
                                   ["--n-train", "10000000000"], ["--k", "1000000000"],
                                   ["--images", "--image-size", "100000"]])
def test_synth_sizes_are_one_line_and_write_nothing(tmp_path, flags):
    res = runner.invoke(app, ["data", "synth", str(tmp_path / "out"), "--no-progress", *flags])
    assert "memory" in one_error_line(res) or "image_size" in res.output
    assert list(tmp_path.iterdir()) == []


class PickledNet(torch.nn.Module):
    """A whole model pickled into a weights file (``torch.save(model)``), which a safe load refuses."""


def test_pickled_cnn_weights_refusal_says_what_to_do(tmp_path):
    torch.save({"conv1.weight": torch.zeros(1), "net": PickledNet()}, tmp_path / "w.pth")
    (tmp_path / "data").mkdir()
    line = one_error_line(runner.invoke(app, ["data", "features", str(tmp_path / "data"), "--cnn", "resnet18",
                                              "--cnn-weights", str(tmp_path / "w.pth"), "--no-progress"]))
    assert "PickledNet" in line and "--trust-checkpoint" not in line and "state_dict()" in line


# -- CSV oddities -----------------------------------------------------------------------------------------------


def test_a_byte_order_mark_changes_nothing(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    (tmp_path / "b.png").write_bytes(_png((1, 2, 3)))
    text = "Image,Caption\r\na.png,a dog\r\nb.png,a cat\r\n"
    (tmp_path / "plain.csv").write_bytes(text.encode("utf-8"))
    (tmp_path / "bom.csv").write_bytes(text.encode("utf-8-sig"))
    plain, bom = (load_image_split(tmp_path / name, "train") for name in ("plain.csv", "bom.csv"))
    assert bom.captions == plain.captions == ["a dog", "a cat"] and bom.names == plain.names
    assert bom.fingerprint() == plain.fingerprint()
    (tmp_path / "odd.csv").write_bytes("im\u200bage,caption\na.png,x\n".encode())  # what cannot be seen is shown
    with pytest.raises(CocosError, match=r"found 'im\\u200bage', caption"):
        load_image_split(tmp_path / "odd.csv", "train")


def test_a_nul_in_a_caption_is_refused_naming_its_place(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    (tmp_path / "train.csv").write_bytes(b"image,caption\na.png,a dog\na.png,a c\x00t\n")
    res = runner.invoke(app, ["data", "info", str(tmp_path / "train.csv")])
    assert "line 3" in one_error_line(res) and "NUL" in res.output
    blob = {"images": {7: {"image": _png()}}, "captions": {40: {"caption": "a\x00b", "imgid": 7}}}
    (tmp_path / "train_set.p").write_bytes(pickle.dumps(blob, protocol=3))
    with pytest.raises(CocosError, match="caption 40 holds a NUL"):
        load_image_split(tmp_path / "train_set.p", "train")
    with pytest.raises(CocosError, match="caption 1 of split 'train' holds a NUL"):  # any layout
        images_mod.ImageSplit(source=tmp_path, split="train", layout="csv", captions=["a", "b\x00"],
                              caption_image=np.array([0, 0]), names=["a"], paths=[tmp_path / "a.png"])


class _Plain(BudgetedUnpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the pickle refers to {module}.{name}")


def test_dup_references_are_charged_like_memo_gets():
    """``DUP`` copies a reference to the top of the stack as ``GET`` does: each is charged the object's weight.
    Python's pickler never writes DUP; a crafted pickle does: MARK, a 1,000-char string, DUP, DUP, LIST."""
    word = "x" * 1000
    data = (b"\x80\x04(" + b"X" + struct.pack("<I", len(word)) + word.encode() + pickle.DUP + pickle.DUP
            + pickle.LIST + pickle.STOP)
    u = _Plain(io.BytesIO(data), len(data), budget=10**9)
    assert u.load() == [word] * 3
    assert u.charged == 2 * sys.getsizeof(word)
    many = (b"\x80\x04(" + b"X" + struct.pack("<I", len(word)) + word.encode() + pickle.DUP * 200
            + pickle.LIST + pickle.STOP)
    with pytest.raises(PickleBombError):  # 200 copies of 1 kB against a budget of the file plus 10 kB
        _Plain(io.BytesIO(many), len(many), budget=len(many) + 10_000).load()


def test_a_container_is_weighed_with_everything_below_it():
    """The weight of a container referred to again counts its whole tree, not only its own children: ``mid`` holds
    ``inner`` which holds a 1,000-char string, and the second reference to ``mid`` is charged all three."""
    word = "x" * 1000
    inner = [word]
    mid = [inner]
    data = pickle.dumps([mid, mid], protocol=4)
    u = _Plain(io.BytesIO(data), len(data), budget=10**9)
    loaded = u.load()
    assert loaded == [[[word]], [[word]]] and loaded[0] is loaded[1]
    got_mid = loaded[0]  # sizes of the objects as the unpickler built them (a list's spare capacity included)
    assert u.charged == sys.getsizeof(got_mid) + sys.getsizeof(got_mid[0]) + sys.getsizeof(got_mid[0][0])
    deep = [[[[["y" * 10_000]]]]]  # 10 kB four containers down, referred to 100 times
    bomb = pickle.dumps([deep] * 100, protocol=4)
    with pytest.raises(PickleBombError):
        _Plain(io.BytesIO(bomb), len(bomb), budget=len(bomb) + 100_000).load()
