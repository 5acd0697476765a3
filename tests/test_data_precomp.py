"""The precomputed-feature loader on small folders in the real layout, and every bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cocos.data import precomp
from cocos.data.precomp import PrecompSplit, data_fingerprint, load_split
from cocos.errors import CocosError


def _write(folder, split="train", n=3, k=2, shape=(4,), dtype=np.float32, captions=None, feats=None):
    folder.mkdir(parents=True, exist_ok=True)
    if feats is None:
        feats = np.arange(n * int(np.prod(shape)), dtype=np.float64).reshape(n, *shape) / 10
    np.save(folder / f"{split}_ims.npy", np.asarray(feats).astype(dtype))
    if captions is None:
        captions = [f"caption {c} of image {c // k}" for c in range(n * k)]
    if captions is not False:
        (folder / f"{split}_caps.txt").write_text("".join(c + "\n" for c in captions))
    return feats


def _one_line_error(match, fn, *args, **kwargs):
    with pytest.raises(CocosError, match=match) as info:
        fn(*args, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


# -- the good path ------------------------------------------------------------------------


def test_global_features_and_captions(tmp_path):
    feats = _write(tmp_path, "test", n=3, k=2, shape=(4,), dtype=np.float64)
    s = PrecompSplit(tmp_path, "test", k=2)
    assert isinstance(s.features, np.memmap)
    assert s.features.dtype == np.float64 and not s.features.flags.writeable
    assert s.n_images == 3 and s.k == 2 and s.n_captions == 6 and len(s) == 6
    assert s.feature_shape == (4,) and s.feature_dim == 4 and not s.is_regions
    assert s.captions[0] == "caption 0 of image 0" and s.captions[5] == "caption 5 of image 2"
    assert s.caption_image.tolist() == [0, 0, 1, 1, 2, 2]
    assert s.image_captions.tolist() == [[0, 1], [2, 3], [4, 5]]
    rows = s.features_for([2, 0, 2])
    assert rows.dtype == torch.float32 and rows.shape == (3, 4)
    assert torch.equal(rows, torch.tensor(feats[[2, 0, 2]], dtype=torch.float32))
    one = s.features_for(1)
    assert one.shape == (4,) and torch.equal(one, torch.tensor(feats[1], dtype=torch.float32))
    assert s.features_for(torch.tensor([1])).shape == (1, 4)
    assert s.features_for(np.array([], dtype=np.int64)).shape == (0, 4)


def test_region_features_default_k_and_val_alias(tmp_path):
    import warnings

    feats = _write(tmp_path, "dev", n=2, k=5, shape=(3, 4), dtype=np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float16 features: no numpy overflow warning from the finite check
        s = load_split(tmp_path, "val")  # val is read as dev, k defaults to 5
    assert s.split == "dev" and s.k == 5 and s.n_captions == 10
    assert s.is_regions and s.feature_shape == (3, 4) and s.feature_dim == 4
    assert isinstance(s.features, np.memmap)
    out = s.features_for([1])
    assert out.shape == (1, 3, 4) and out.dtype == torch.float32
    assert torch.equal(out[0], torch.tensor(feats[1].astype(np.float16), dtype=torch.float32))


def test_caption_lines_are_stripped(tmp_path):
    _write(tmp_path, n=1, k=3, captions=False)
    (tmp_path / "train_caps.txt").write_text("  A dog. \r\n\nlast one")  # no final newline
    s = PrecompSplit(tmp_path, "train", k=3)
    assert s.captions == ["A dog.", "", "last one"]


# -- bad input ----------------------------------------------------------------------------


def test_missing_folder_and_files(tmp_path):
    _one_line_error("no such data folder", PrecompSplit, tmp_path / "nope", "train")
    tmp_path.joinpath("d").mkdir()
    _one_line_error("train_ims.npy", PrecompSplit, tmp_path / "d", "train")
    _write(tmp_path / "d", n=2, k=2, captions=False)
    _one_line_error("train_caps.txt", PrecompSplit, tmp_path / "d", "train", k=2)


def test_caption_count_mismatch(tmp_path):
    _write(tmp_path, n=3, k=2, captions=["x"] * 5)
    msg = _one_line_error("train_caps.txt", PrecompSplit, tmp_path, "train", k=2)
    assert "5 captions for 3 images" in msg and "6" in msg
    # one feature row per caption (the rkiros/10-crop layout) gets a hint
    _write(tmp_path, n=4, k=2, captions=["x"] * 4)
    assert "one row per" in _one_line_error("captions", PrecompSplit, tmp_path, "train", k=2)


def test_empty_split(tmp_path):
    _write(tmp_path, n=0, k=2, captions=[])
    _one_line_error("train_ims.npy.*empty", PrecompSplit, tmp_path, "train", k=2)
    _write(tmp_path, "dev", n=2, k=2, captions=[])
    (tmp_path / "dev_caps.txt").write_text("")
    _one_line_error("dev_caps.txt.*empty", PrecompSplit, tmp_path, "dev", k=2)
    (tmp_path / "test_ims.npy").write_bytes(b"")
    _one_line_error("test_ims.npy.*empty", PrecompSplit, tmp_path, "test")


@pytest.mark.parametrize("shape", [(6,), (2, 2, 3, 4)])
def test_wrong_ndim(tmp_path, shape):
    np.save(tmp_path / "train_ims.npy", np.zeros(shape, dtype=np.float32))
    (tmp_path / "train_caps.txt").write_text("x\n" * 10)
    _one_line_error("train_ims.npy.*shape", PrecompSplit, tmp_path, "train")


def test_non_float_and_unreadable_features(tmp_path):
    np.save(tmp_path / "train_ims.npy", np.zeros((2, 3), dtype=np.int32))
    (tmp_path / "train_caps.txt").write_text("x\n" * 10)
    _one_line_error("train_ims.npy.*dtype", PrecompSplit, tmp_path, "train")
    (tmp_path / "train_ims.npy").write_bytes(b"not an npy file at all")
    _one_line_error("train_ims.npy", PrecompSplit, tmp_path, "train")
    np.save(tmp_path / "train_ims.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    _one_line_error("train_ims.npy", PrecompSplit, tmp_path, "train")  # pickle refused


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_found_at_load_in_any_chunk(tmp_path, monkeypatch, bad):
    monkeypatch.setattr(precomp, "CHECK_CHUNK_ROWS", 2)  # 7 rows: chunks 0-1, 2-3, 4-5, 6
    feats = np.ones((7, 2, 3), dtype=np.float32)
    feats[6, 1, 2] = bad
    _write(tmp_path, n=7, k=1, feats=feats)
    msg = _one_line_error("train_ims.npy.*NaN, Inf", PrecompSplit, tmp_path, "train", k=1)
    assert "row 6" in msg
    feats[6, 1, 2] = 0
    feats[3, 0, 0] = bad
    _write(tmp_path, n=7, k=1, feats=feats)
    assert "row 3" in _one_line_error("NaN", PrecompSplit, tmp_path, "train", k=1)


def test_features_for_checks_rows_and_indices(tmp_path):
    feats = np.ones((4, 3), dtype=np.float32)
    feats[2, 1] = np.nan
    _write(tmp_path, "test", n=4, k=1, feats=feats)
    s = PrecompSplit(tmp_path, "test", k=1, check_finite=False)
    assert torch.equal(s.features_for([0, 3]), torch.ones(2, 3))
    _one_line_error("split 'test'.*NaN or Inf", s.features_for, [1, 2])
    _one_line_error("out of range", s.features_for, [4])
    _one_line_error("out of range", s.features_for, -1)
    _one_line_error("integers", s.features_for, [0.5])
    _one_line_error("integers", s.features_for, np.array([True, False]))


def test_bad_split_name_and_k(tmp_path):
    _write(tmp_path, n=2, k=2)
    _one_line_error("split", PrecompSplit, tmp_path, "../train")
    _one_line_error("k", PrecompSplit, tmp_path, "train", k=0)


# -- Karpathy JSON ------------------------------------------------------------------------


def _karpathy(path, images):
    path.write_text(json.dumps({"images": images, "dataset": "flickr30k"}))


def _image(split, n_sent, name, raw=True):
    sents = []
    for j in range(n_sent):
        text = f"{name} sentence {j}"
        sent = {"tokens": text.lower().split(), "imgid": 0, "sentid": j}
        if raw:
            sent["raw"] = f"  {text.capitalize()} . "
        sents.append(sent)
    return {"split": split, "filename": f"{name}.jpg", "sentences": sents}


def test_karpathy_json_captions(tmp_path):
    _karpathy(tmp_path / "dataset_flickr30k.json", [
        _image("train", 5, "t0"), _image("val", 5, "v0"), _image("test", 6, "s0"),
        _image("restval", 5, "r0"), _image("train", 7, "t1", raw=False), _image("test", 5, "s1"),
    ])
    for split, n in (("train", 3), ("dev", 1), ("test", 2)):
        _write(tmp_path, split, n=n, k=5, captions=False)
    train = PrecompSplit(tmp_path, "train")
    assert train.captions_path.name == "dataset_flickr30k.json"
    # train + restval in JSON order; first k sentences; raw (whitespace-collapsed) or tokens
    assert train.captions[0] == "T0 sentence 0 ." and train.captions[4] == "T0 sentence 4 ."
    assert train.captions[5] == "R0 sentence 0 ."
    assert train.captions[10:] == [f"t1 sentence {j}" for j in range(5)]
    dev = PrecompSplit(tmp_path, "dev")
    assert dev.captions == [f"V0 sentence {j} ." for j in range(5)]
    test = PrecompSplit(tmp_path, "test")
    assert test.captions[4] == "S0 sentence 4 ." and test.captions[5] == "S1 sentence 0 ."
    assert test.caption_image.tolist() == [0] * 5 + [1] * 5
    # a caption file, where present, wins over the JSON
    (tmp_path / "dev_caps.txt").write_text("x\n" * 5)
    assert PrecompSplit(tmp_path, "dev").captions == ["x"] * 5


def test_karpathy_json_errors(tmp_path):
    _karpathy(tmp_path / "dataset_coco.json", [_image("train", 4, "t0"), _image("test", 5, "s0")])
    _write(tmp_path, "train", n=1, k=5, captions=False)
    _write(tmp_path, "test", n=2, k=5, captions=False)
    _write(tmp_path, "dev", n=1, k=5, captions=False)
    _one_line_error("dataset_coco.json.*fewer than k=5", PrecompSplit, tmp_path, "train")
    assert PrecompSplit(tmp_path, "train", k=4).n_captions == 4
    _one_line_error("dataset_coco.json.*5 captions for 2 images", PrecompSplit, tmp_path, "test")
    _one_line_error("dataset_coco.json.*no images with split val", PrecompSplit, tmp_path, "dev")
    _karpathy(tmp_path / "dataset_f30k.json", [])
    _one_line_error("several", PrecompSplit, tmp_path, "test")
    (tmp_path / "dataset_f30k.json").unlink()
    (tmp_path / "dataset_coco.json").write_text("{not json")
    _one_line_error("dataset_coco.json", PrecompSplit, tmp_path, "test")


# -- fingerprint --------------------------------------------------------------------------


def test_data_fingerprint(tmp_path):
    _write(tmp_path, n=2, k=2)
    fp = data_fingerprint(tmp_path)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert data_fingerprint(tmp_path) == fp
    (tmp_path / ".hidden.tmp").write_text("scratch")
    assert data_fingerprint(tmp_path) == fp
    caps = tmp_path / "train_caps.txt"
    text = caps.read_text()
    caps.write_text(text.replace("caption 0", "caption 9"))  # same size, other bytes
    fp2 = data_fingerprint(tmp_path)
    assert fp2 != fp
    caps.rename(tmp_path / "other_caps.txt")  # same bytes, other name
    assert data_fingerprint(tmp_path) not in (fp, fp2)
    big = tmp_path / "big.bin"
    data = bytearray(3 << 20)
    big.write_bytes(bytes(data))
    fp3 = data_fingerprint(tmp_path)
    data[-1] = 1  # the last MiB is hashed
    big.write_bytes(bytes(data))
    assert data_fingerprint(tmp_path) != fp3
    _one_line_error("no such data folder", data_fingerprint, tmp_path / "nope")
