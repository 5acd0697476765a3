"""Raw images: safe reading (modes, EXIF, bombs, corrupt data), the three dataset layouts, and the Dataset."""

from __future__ import annotations

import collections
import io
import json
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from cocos.data.images import (
    ImageCaptionDataset,
    ImageDataError,
    item_generator,
    load_image_split,
    open_image,
)
from cocos.data.transforms import eval_transform, train_transform
from cocos.errors import CocosError


def _png(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG", **kw)
    return buf.getvalue()


def _jpeg(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=95)
    return buf.getvalue()


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


# -- open_image: modes --------------------------------------------------------------------------


def test_modes_converted_to_rgb():
    grey = open_image(_png(Image.new("L", (2, 1), 77)), "g.png")
    assert grey.mode == "RGB" and grey.getpixel((1, 0)) == (77, 77, 77)
    pal = Image.new("P", (2, 1))
    pal.putpalette([10, 20, 30, 200, 100, 50] + [0] * 762)
    pal.putpixel((1, 0), 1)
    got = open_image(_png(pal), "p.png")
    assert got.getpixel((0, 0)) == (10, 20, 30) and got.getpixel((1, 0)) == (200, 100, 50)
    buf = io.BytesIO()
    Image.new("CMYK", (2, 2), (0, 255, 255, 0)).save(buf, "TIFF")  # no cyan, full magenta+yellow: red
    assert open_image(buf.getvalue(), "c.tif").getpixel((0, 0)) == (255, 0, 0)
    rgba = open_image(_png(Image.new("RGBA", (1, 1), (1, 2, 3, 0))), "a.png")
    assert rgba.getpixel((0, 0)) == (1, 2, 3)  # alpha dropped, as convert('RGB')


def test_sixteen_bit_scaled_not_clipped():
    values = np.array([[0, 128, 129, 1000, 65535]], dtype=np.uint16)
    data = _png(Image.fromarray(values))
    got = np.asarray(open_image(data, "deep.png"))[0, :, 0]
    # round(v / 257): 0, 0.498 -> 0, 0.502 -> 1, 3.89 -> 4, 255
    assert got.tolist() == [0, 0, 1, 4, 255]
    naive = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[0, :, 0]
    assert naive[3] == 255  # what plain convert('RGB') does: clips
    buf = io.BytesIO()
    Image.fromarray(values.astype(np.int32), "I").save(buf, "TIFF")  # 32-bit integer pixels, mode I
    assert Image.open(io.BytesIO(buf.getvalue())).mode == "I"
    assert np.asarray(open_image(buf.getvalue(), "deep.tif"))[0, :, 1].tolist() == [0, 0, 1, 4, 255]


def test_exif_orientation_not_applied():
    pixels = np.zeros((2, 4, 3), np.uint8)
    pixels[:, :2] = (255, 0, 0)
    img = Image.fromarray(pixels, "RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when displayed
    data = _png(img, exif=exif.tobytes())
    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == (2, 4)  # the tag is there
    got = open_image(data, "rot.png")
    assert got.size == (4, 2)
    np.testing.assert_array_equal(np.asarray(got), pixels)


def test_one_pixel_image_works():
    img = open_image(_jpeg(Image.new("RGB", (1, 1), (0, 128, 255))), "one.jpg")
    assert img.size == (1, 1)
    assert eval_transform(img).shape == (3, 224, 224)
    assert train_transform(img, torch.Generator().manual_seed(1)).shape == (3, 224, 224)


# -- open_image: bad input --------------------------------------------------------------------------


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims its size and holds no pixel data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IEND", b"")


def test_decompression_bomb_refused_from_the_header():
    with pytest.raises(CocosError) as err:
        open_image(_png_header(50_000, 50_000), "bomb.png")
    assert "bomb.png" in _one_line(err) and "bomb" in str(err.value)
    # below Pillow's limit but above ours: refused before decoding (decoding would say "truncated")
    with pytest.raises(CocosError, match=r"small.png: 100 x 100 pixels is above the limit of 5,000"):
        open_image(_png_header(100, 100), "small.png", max_pixels=5000)


@pytest.mark.parametrize("kind", ["truncated", "text", "empty", "missing", "folder", "eps"])
def test_unreadable_images_refused(tmp_path, kind):
    path = tmp_path / "x.jpg"
    if kind == "truncated":
        noise = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
        path.write_bytes(_jpeg(Image.fromarray(noise))[:400])
    elif kind == "text":
        path.write_text("not an image\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder":
        path.mkdir()
    elif kind == "eps":  # Pillow would run Ghostscript to decode it
        Image.new("RGB", (2, 2)).save(path, "EPS")
    with pytest.raises(CocosError) as err:
        open_image(path, str(path))
    assert str(path) in _one_line(err)


# -- layouts -------------------------------------------------------------------------------


COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (90, 90, 90), (200, 100, 0)]


def _caps(i: int, n: int = 5) -> list[str]:
    return [f"image {i} caption {j}" for j in range(n)]


def _karpathy_folder(root: Path, splits=("train", "val", "test", "restval", "train"), coco=False,
                     name="dataset_flickr30k.json") -> list[bytes]:
    (root / "images").mkdir(parents=True)
    entries, blobs = [], []
    for i, split in enumerate(splits):
        blob = _png(Image.new("RGB", (3, 2), COLOURS[i % len(COLOURS)]))
        sub = "train2014" if coco else ""
        (root / "images" / sub).mkdir(exist_ok=True)
        (root / "images" / sub / f"im{i}.png").write_bytes(blob)
        entry = {"filename": f"im{i}.png", "split": split, "imgid": i,
                 "sentences": [{"raw": c, "tokens": c.split()} for c in _caps(i, 6)]}
        if coco:
            entry["filepath"] = sub
        entries.append(entry)
        blobs.append(blob)
    (root / name).write_text(json.dumps({"images": entries}))
    return blobs


def test_karpathy_layout_splits_and_restval(tmp_path):
    blobs = _karpathy_folder(tmp_path)
    train = load_image_split(tmp_path, "train")
    assert train.n_images == 2 and train.captions == _caps(0) + _caps(4)  # first k=5 of 6, JSON order
    assert train.caption_image.tolist() == [0] * 5 + [1] * 5
    assert train.image_bytes(1) == blobs[4] and train.image(1).getpixel((0, 0)) == COLOURS[4]
    with_restval = load_image_split(tmp_path, "train", use_restval=True)
    assert with_restval.captions == _caps(0) + _caps(3) + _caps(4)
    dev = load_image_split(tmp_path, "val")
    assert dev.split == "dev" and dev.captions == _caps(1) and dev.image_captions().tolist() == [[0, 1, 2, 3, 4]]
    assert load_image_split(tmp_path, "test").image_name(0).endswith("images/im2.png")


def test_coco_filepath_subfolder(tmp_path):
    _karpathy_folder(tmp_path, coco=True, name="dataset_coco.json")
    split = load_image_split(tmp_path, "test")
    assert split.image_name(0).endswith("images/train2014/im2.png") and split.image(0).getpixel((0, 0)) == COLOURS[2]


def test_karpathy_json_naming_missing_files(tmp_path):
    _karpathy_folder(tmp_path)
    (tmp_path / "images" / "im0.png").unlink()
    (tmp_path / "images" / "im4.png").unlink()
    with pytest.raises(CocosError) as err:
        load_image_split(tmp_path, "train")
    line = _one_line(err)
    assert "dataset_flickr30k.json" in line and "2 of 2" in line and "im0.png" in line


def test_image_path_escaping_the_folder_refused(tmp_path):
    _karpathy_folder(tmp_path)
    data = json.loads((tmp_path / "dataset_flickr30k.json").read_text())
    data["images"][2]["filename"] = "../../etc/passwd"
    (tmp_path / "dataset_flickr30k.json").write_text(json.dumps(data))
    with pytest.raises(CocosError, match="not a relative path inside"):
        load_image_split(tmp_path, "test")


def _repro_pickle(blobs: list[bytes], protocol: int = 3) -> bytes:
    """As the reproducibility repository's notebook writes it: defaultdict(dict), ids from the JSON."""
    out = collections.defaultdict(dict)
    for i, blob in enumerate(blobs):
        img_id = 100 + i
        out["images"][img_id] = {"image": blob, "filename": f"im{i}.png", "caption_ids": [10 * i + j for j in range(5)],
                                 "cocoid": img_id}
        for j, text in enumerate(_caps(i)):
            out["captions"][10 * i + j] = {"caption": text, "imgid": img_id, "tokens": text.split(),
                                           "filename": f"im{i}.png", "cocoid": img_id}
    return pickle.dumps(out, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 3, 5])
def test_reproducibility_pickle_equals_the_folder(tmp_path, protocol):
    blobs = _karpathy_folder(tmp_path / "folder", splits=("train", "train", "val"))
    (tmp_path / "train_set.p").write_bytes(_repro_pickle(blobs[:2], protocol))
    from_pickle = load_image_split(tmp_path, "train")
    from_folder = load_image_split(tmp_path / "folder", "train")
    assert from_pickle.layout == "pickle" and from_pickle.captions == from_folder.captions
    assert from_pickle.caption_image.tolist() == from_folder.caption_image.tolist()
    assert from_pickle.image(1).getpixel((0, 0)) == COLOURS[1] and "image 101 (im1.png)" in from_pickle.image_name(1)
    assert from_pickle.fingerprint() == from_folder.fingerprint()
    (tmp_path / "folder" / "images" / "im1.png").write_bytes(blobs[0])
    assert load_image_split(tmp_path / "folder", "train").fingerprint() != from_pickle.fingerprint()


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_pickle_with_a_class_reference_refused_and_not_run(tmp_path):
    victim = tmp_path / "pwned"
    payload = {"images": {1: {"image": b"x"}}, "captions": {}, "evil": _Touch(victim)}
    (tmp_path / "test_set.p").write_bytes(pickle.dumps(payload, protocol=3))
    with pytest.raises(CocosError) as err:
        load_image_split(tmp_path, "test")
    assert "test_set.p" in _one_line(err) and "the pickle refers to builtins.getattr" in str(err.value)
    assert not victim.exists()
    (tmp_path / "test_set.p").write_bytes(pickle.dumps(collections.defaultdict(list), protocol=3))
    with pytest.raises(CocosError, match="refers to builtins.list"):
        load_image_split(tmp_path, "test")
    (tmp_path / "test_set.p").write_bytes(b"\x80\x03not a pickle")
    with pytest.raises(CocosError, match="not a readable image pickle"):
        load_image_split(tmp_path, "test")


def test_csv_layout(tmp_path):
    (tmp_path / "pics").mkdir()
    for i in range(2):
        (tmp_path / "pics" / f"{i}.png").write_bytes(_png(Image.new("RGB", (2, 2), COLOURS[i])))
    (tmp_path / "train.csv").write_text('image,caption\npics/1.png,"one, first"\npics/0.png,zero a\n'
                                        "pics/1.png,one b\n\npics/0.png,zero b\n")
    split = load_image_split(tmp_path, "train")
    assert split.captions == ["one, first", "zero a", "one b", "zero b"]
    assert split.caption_image.tolist() == [0, 1, 0, 1] and split.image(0).getpixel((0, 0)) == COLOURS[1]
    assert split.image_captions().tolist() == [[0, 2], [1, 3]]
    (tmp_path / "dev.csv").write_text("image,caption\npics/1.png,a\npics/0.png,b\npics/0.png,c\n")
    with pytest.raises(CocosError, match="between 1 and 2 captions per image"):
        load_image_split(tmp_path / "dev.csv", "dev").image_captions()


@pytest.mark.parametrize("text", ["img,text\na.png,x\n", "", "image,caption\n,x\n", "image,caption\nnope.png,x\n"])
def test_bad_csv_refused(tmp_path, text):
    path = tmp_path / "list.csv"
    path.write_text(text)
    with pytest.raises(CocosError) as err:
        load_image_split(path, "train")
    assert "list.csv" in _one_line(err)


def test_not_an_image_dataset(tmp_path):
    with pytest.raises(CocosError, match="not an image dataset folder"):
        load_image_split(tmp_path, "train")
    with pytest.raises(CocosError, match="bad split name"):
        load_image_split(tmp_path, "holdout")


# -- the Dataset ---------------------------------------------------------------------------


def test_dataset_deterministic_regardless_of_workers(tmp_path):
    _karpathy_folder(tmp_path, splits=("train",) * 5)
    for i in range(5):  # textured images, so that different crops and flips differ
        noise = np.random.default_rng(i).integers(0, 255, (5, 6, 3), dtype=np.uint8)
        (tmp_path / "images" / f"im{i}.png").write_bytes(_png(Image.fromarray(noise)))
    split = load_image_split(tmp_path, "train")
    from functools import partial

    ds = ImageCaptionDataset(split, partial(train_transform, crop_size=2), seed=7, by="caption")
    assert pickle.loads(pickle.dumps(ds)).split.captions == split.captions

    def run(workers: int, epoch: int = 0):
        ds.set_epoch(epoch)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers, shuffle=False)
        return [tuple(t.clone() for t in batch) for batch in loader]

    serial, parallel = run(0), run(2)
    assert len(serial) == 7 and all(
        all(torch.equal(a, b) for a, b in zip(x, y, strict=True)) for x, y in zip(serial, parallel, strict=True))
    images = torch.cat([b[0] for b in serial])
    assert torch.equal(torch.cat([b[2] for b in serial]), torch.as_tensor(split.caption_image))
    assert not torch.equal(images, torch.cat([b[0] for b in run(0, epoch=1)]))
    # item c is the transform of its image with the generator of (seed, epoch, c)
    expected = train_transform(split.image(split.caption_image[6]), item_generator(7, 0, 6), crop_size=2)
    assert torch.equal(images[6], expected)


def test_dataset_by_image_eval(tmp_path):
    _karpathy_folder(tmp_path, splits=("test",) * 2)
    split = load_image_split(tmp_path, "test")
    ds = ImageCaptionDataset(split, eval_transform, by="image")
    tensor, index = ds[1]
    assert len(ds) == 2 and index == 1 and tensor.shape == (3, 224, 224)
    colour = np.array(COLOURS[1]) / 255
    np.testing.assert_allclose(tensor[:, 100, 100].numpy(), (colour - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225],
                               atol=1e-5)
    assert len({item_generator(s, e, i).initial_seed() for s in (0, 1) for e in (0, 1) for i in (0, 1)}) == 8
    with pytest.raises(CocosError, match="seed"):
        ImageCaptionDataset(split, eval_transform, seed=-1)


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_image_in_a_worker_is_one_line(tmp_path, workers):
    _karpathy_folder(tmp_path, splits=("test",) * 3)
    (tmp_path / "images" / "im1.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    ds = ImageCaptionDataset(load_image_split(tmp_path, "test"), eval_transform)
    batches = iter(torch.utils.data.DataLoader(ds, batch_size=3, num_workers=workers))
    try:
        with pytest.raises(ImageDataError) as err:
            list(batches)
        assert _one_line(err).startswith(str(tmp_path / "images" / "im1.png") + ": ")
        assert isinstance(err.value, CocosError)
    finally:  # the failed iterator's worker never gets its stop signal: torch's shutdown of it (at garbage
        for worker in getattr(batches, "_workers", []):  # collection, in whichever later test) waits 5 s for it
            worker.terminate()
