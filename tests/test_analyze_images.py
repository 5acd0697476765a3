"""``cocos analyze`` of raw-image checkpoints (``vsepp_full``), with and without a feature cache.

The checkpoint is written the way the COCOS authors' ``vsepp/train.py`` writes it (``{'model':
[img_enc_state, txt_enc_state], 'opt': Namespace(data_name='f30k', cnn_type='resnet18', ...), ...}``;
ResNet-18 for speed, the same code path as their ResNet-50) beside a raw-image folder with its Karpathy
JSON (``images/`` + ``dataset_flickr30k.json``: the rendered world, 32 px). Its embeddings must equal
the original model's forward pass (restated over the original state dict in ``tests.test_legacy_images``)
on the original evaluation transform, restated with Pillow and numpy in ``tests.test_features``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from cocos.data.synth_images import make_synthetic_images
from tests.test_features import eval_pixels
from tests.test_legacy_images import EMBED, WORD, _ImgEnc, original_image_embeddings, original_image_state
from tests.test_legacy_import import (  # noqa: F401 - _figures_not_rendered: an autouse fixture, used by import
    OrigEncoderText,
    _figures_not_rendered,
    one_error_line,
    opt_namespace,
    original_caption_ids,
    original_vocab,
    pickle_vocab,
    randomise,
    save_original,
)

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
SMALL = ["--resize", "32", "--crop-size", "28"]  # every run but the acceptance one: tiny transform sizes


@pytest.fixture(scope="module")
def authors(tmp_path_factory):
    root = tmp_path_factory.mktemp("authors")
    make_synthetic_images(root / "w", n_train=8, n_dev=2, n_test=4, image_size=32, seed=5)
    data = root / "f30k"
    shutil.copytree(root / "w", data)
    (data / "dataset_synth.json").rename(data / "dataset_flickr30k.json")
    entries = json.loads((data / "dataset_flickr30k.json").read_text())["images"]
    train = [e for e in entries if e["split"] == "train"]
    captions = [" ".join(s["raw"].split()) for e in train for s in e["sentences"][:5]]
    vocab = original_vocab(captions, drop=2)
    pickle_vocab(vocab, root / "f30k_vocab.pkl")
    img_state = original_image_state("resnet18", seed=7)
    txt_enc = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 3)
    opt = opt_namespace(data_name="f30k", cnn_type="resnet18", img_dim=4096, crop_size=224, batch_size=128,
                        criterion="triplet")
    ckpt = save_original(root / "model_best.pth.tar", _ImgEnc(img_state), txt_enc, opt)
    # the checkpoint's CNN as a torchvision-format weights file (what `cocos data features` takes)
    cnn = {k.removeprefix("cnn.module."): v for k, v in img_state.items() if k.startswith("cnn.module.")}
    torch.save(cnn, root / "ckpt_cnn.pth")
    return {"root": root, "ckpt": ckpt, "vocab": root / "f30k_vocab.pkl", "data": data, "train": train,
            "captions": captions, "img_state": img_state, "txt_enc": txt_enc, "orig_vocab": vocab}


def analyze(a, out, *extra):
    return runner.invoke(app, ["analyze", str(a["ckpt"]), "--vocab", str(a["vocab"]), "--data", str(a["data"]),
                               "--out", str(out), "--loss", "triplet_sh", "--batch-size", "4", "--no-progress",
                               *map(str, extra)])


@torch.no_grad()
def original_caption_embeddings(a) -> np.ndarray:
    ids = [original_caption_ids(a["orig_vocab"], c) for c in a["captions"]]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    lengths = [len(ids[i]) for i in order]
    tokens = torch.zeros(len(ids), max(lengths), dtype=torch.long)
    for row, i in enumerate(order):
        tokens[row, : len(ids[i])] = torch.tensor(ids[i])
    out = torch.empty(len(ids), EMBED)
    out[torch.tensor(order)] = a["txt_enc"](tokens, lengths)
    return out.numpy()


def test_authors_checkpoint_is_counted_with_the_original_forward_pass(authors, tmp_path):
    """The acceptance item: Resize(256) + CenterCrop(224), one frozen encoding, the original's embeddings."""
    a = authors
    res = analyze(a, tmp_path / "r", "--save-embeddings", tmp_path / "e.npz")
    assert res.exit_code == 0, res.output
    assert "from the cache" not in res.output
    emb = np.load(tmp_path / "e.npz")
    some = [0, 3, 7]  # the original forward pass at 224 px on three of the eight images (each is encoded alone)
    pixels = torch.stack([eval_pixels(a["data"] / "images" / a["train"][i]["filename"], 256, 224) for i in some])
    with torch.no_grad():
        want = original_image_embeddings(pixels, a["img_state"]).numpy()
    assert emb["images"].shape == (8, EMBED) and want.std() > 0.05
    np.testing.assert_allclose(emb["images"][some], want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(emb["captions"], original_caption_embeddings(a), rtol=0, atol=1e-5)
    assert emb["caption_image"].tolist() == [c // 5 for c in range(40)]
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["model"]["kind"] == "vsepp_full" and results["data"]["n_images"] == 8
    assert results["counting"]["batch_size"] == 4 and results["evaluation"]["split"] == "test"
    assert "triplet_sh" in {r["loss"] for r in results["statistics"]}


def _same_analysis(dir_a, dir_b):
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (dir_a, dir_b))
    for key in ("statistics", "evaluation", "counting", "data"):
        assert ra[key] == rb[key], key


@pytest.fixture(scope="module")
def plain(authors, tmp_path_factory):
    """The uncached analysis at the small sizes (before any cache exists)."""
    out = tmp_path_factory.mktemp("plain")
    res = analyze(authors, out / "r", *SMALL, "--save-embeddings", out / "e.npz")
    assert res.exit_code == 0 and "from the cache" not in res.output, res.output
    return out / "r", out / "e.npz"


def test_a_matching_cache_gives_the_uncached_analysis_and_other_weights_do_not_match(authors, plain, tmp_path):
    from cocos.data.images import load_image_split
    from cocos.embed.features import cache_key, cached_features, cnn_state_hash
    from cocos.models.cnn import build_cnn, load_cnn_weights, strip_classifier

    a = authors
    # a cache of other CNN weights (as a fine-tuned CNN has) does not match the checkpoint's CNN
    other = {k: v.clone() for k, v in torch.load(a["root"] / "ckpt_cnn.pth").items()}
    other["layer4.1.bn2.running_var"][0] += 0.5
    torch.save(other, tmp_path / "other.pth")
    built = runner.invoke(app, ["data", "features", str(a["data"]), "--cnn", "resnet18", "--cnn-weights",
                                str(tmp_path / "other.pth"), "--out", str(tmp_path / "other_cache"), *SMALL,
                                "--workers", "0", "--no-progress", "--split", "train"])
    assert built.exit_code == 0, built.output
    train = load_image_split(a["data"], "train")
    own = load_cnn_weights(strip_classifier(build_cnn("resnet18")), a["root"] / "ckpt_cnn.pth")
    key = cache_key(train.fingerprint(), "resnet18", cnn_state_hash(own), 32, 28)
    assert cached_features([tmp_path / "other_cache"], train, key) is None
    line = one_error_line(runner.invoke(app, ["data", "features", str(a["data"]), "--cnn", "resnet34",
                                              "--cnn-weights", str(a["ckpt"]), "--out", str(tmp_path / "x")]))
    assert "model_best.pth.tar" in line and "resnet18, not a resnet34" in line, line
    assert cached_features([tmp_path / "other_cache"], train, {**key, "cnn_hash": cnn_state_hash(
        load_cnn_weights(own, tmp_path / "other.pth"))}) is not None  # (the key is the only difference)

    # the checkpoint's own CNN (--cnn-weights takes the checkpoint itself), written to the default location
    # IMAGE_DATA/features/: found and used
    built = runner.invoke(app, ["data", "features", str(a["data"]), "--cnn", "resnet18", "--cnn-weights",
                                str(a["ckpt"]), *SMALL, "--workers", "0", "--no-progress"])
    assert built.exit_code == 0 and "/features/resnet18-" in built.output, built.output
    try:
        cached = analyze(a, tmp_path / "cached", *SMALL, "--save-embeddings", tmp_path / "cached.npz",
                         "--features", tmp_path / "other_cache")  # looked at first, does not match
        assert cached.exit_code == 0, cached.output
        used = [ln for ln in cached.output.splitlines() if "from the cache" in ln]
        assert len(used) == 2 and "split train" in used[0] and "split test" in used[1], cached.output
        assert "/features/resnet18-" in used[0] and "other_cache" not in cached.output
        for name in ("images", "captions", "caption_image"):
            np.testing.assert_allclose(np.load(tmp_path / "cached.npz")[name], np.load(plain[1])[name],
                                       rtol=0, atol=1e-6)
        _same_analysis(plain[0], tmp_path / "cached")
        assert cached_features([a["data"] / "features" / p.name for p in (a["data"] / "features").iterdir()],
                               train, {**key, "crop_size": 24}) is None  # other transform sizes: no match
    finally:
        shutil.rmtree(a["data"] / "features")


def test_imported_checkpoint_analyzes_like_the_original_file(authors, plain, tmp_path):
    a = authors
    imported = runner.invoke(app, ["import", str(a["ckpt"]), "--vocab", str(a["vocab"]), "--data", str(a["data"]),
                                   "--out", str(tmp_path / "model.pt")])
    assert imported.exit_code == 0 and "vsepp_full" in imported.output, imported.output
    res = runner.invoke(app, ["analyze", str(tmp_path / "model.pt"), "--out", str(tmp_path / "r"), "--loss",
                              "triplet_sh", "--batch-size", "4", "--no-progress", *SMALL, "--save-embeddings",
                              str(tmp_path / "mine.npz")])  # no --vocab, no --data: both recorded
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "mine.npz")["images"], np.load(plain[1])["images"],
                               rtol=0, atol=1e-6)
    _same_analysis(tmp_path / "r", plain[0])


def test_bad_image_input_is_one_line_and_nothing_is_written(authors, tmp_path):
    a = authors
    broken = tmp_path / "broken"
    shutil.copytree(a["data"], broken)
    victim = broken / "images" / a["train"][3]["filename"]
    victim.write_bytes(b"\xff\xd8\xff\xe0 not a JPEG at all")
    run = {**a, "data": broken}
    line = one_error_line(analyze(run, tmp_path / "r1", *SMALL, "--save-embeddings", tmp_path / "e1.npz"))
    assert victim.name in line, line
    victim.unlink()
    line = one_error_line(analyze(run, tmp_path / "r2", *SMALL, "--save-embeddings", tmp_path / "e2.npz"))
    assert "missing" in line and victim.name in line, line
    line = one_error_line(analyze(a, tmp_path / "r3", "--features", tmp_path / "nowhere"))
    assert "nowhere" in line, line

    raw = torch.load(a["ckpt"], weights_only=False)
    raw["opt"].cnn_type = "inception_v3"
    torch.save(raw, tmp_path / "inception.pth.tar")
    line = one_error_line(analyze({**a, "ckpt": tmp_path / "inception.pth.tar"}, tmp_path / "r4"))
    assert "inception.pth.tar" in line and "inception_v3" in line, line
    assert not any((tmp_path / n).exists() for n in ("r1", "r2", "r3", "r4", "e1.npz", "e2.npz"))

    features_only = tmp_path / "precomp"  # cocos import of a raw-image checkpoint needs the image dataset
    features_only.mkdir()
    (features_only / "train_ims.npy").write_bytes(b"")
    line = one_error_line(runner.invoke(app, ["import", str(a["ckpt"]), "--vocab", str(a["vocab"]), "--data",
                                              str(features_only), "--out", str(tmp_path / "m.pt")]))
    assert "not an image dataset" in line and not (tmp_path / "m.pt").exists(), line


def test_a_batch_larger_than_the_training_split_is_refused_before_any_image_is_decoded(authors, tmp_path,
                                                                                        monkeypatch):
    import cocos.embed.images as images

    def no_cnn(*args, **kwargs):
        raise AssertionError("the CNN ran before the batch size was checked")

    monkeypatch.setattr(images, "pooled_features", no_cnn)
    res = runner.invoke(app, ["analyze", str(authors["ckpt"]), "--vocab", str(authors["vocab"]), "--data",
                              str(authors["data"]), "--out", str(tmp_path / "r"), "--no-progress"])
    line = one_error_line(res)  # the checkpoint's batch size, 128, against 8 images
    assert "batch size 128" in line and "8 images" in line, line
    assert not (tmp_path / "r").exists()
