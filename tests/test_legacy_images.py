"""Raw-image checkpoints of the original VSE++ / COCOS reproducibility code (``EncoderImageFull``).

A checkpoint is written the way their ``train.py`` writes it: ``{'model': [img_enc.state_dict(),
txt_enc.state_dict()], 'opt': Namespace(data_name='f30k', cnn_type=..., ...), 'epoch', 'best_rsum',
'Eiters'}``, the image encoder's keys ``cnn.module.*`` (VSE++ wraps a ResNet in DataParallel and
replaces its ``fc`` by an empty Sequential) and ``fc.*``. The imported model's image embeddings
must equal the original forward pass, restated below with ``torch.nn.functional`` calls over the
original state dict (ResNet-18 for speed: the same code path as the paper's ResNet-50).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from cli.main import app
from cocos.legacy import _cnn_key, load_any_checkpoint
from cocos.models.cnn import build_cnn, strip_classifier
from cocos.training.checkpoint import load_checkpoint
from cocos.training.trainer import build_from_checkpoint
from tests.test_legacy_import import (
    OrigEncoderText,
    one_error_line,
    opt_namespace,
    orig_l2norm,
    original_vocab,
    pickle_vocab,
    randomise,
    save_original,
)

runner = CliRunner()
EMBED, WORD = 12, 6
CAPTIONS = ["a dog runs on the grass", "a black cat sits on a mat", "two dogs play with a red ball",
            "a man rides a bike", "a woman reads a book on a bench", "a dog and a cat"]


# -- the original forward pass, restated over the original state dict -----------------------------------

def _bn(x, sd, p):
    return F.batch_norm(x, sd[p + "running_mean"], sd[p + "running_var"], sd[p + "weight"], sd[p + "bias"],
                        training=False, eps=1e-5)


def _block(x, sd, b, stride):
    """BasicBlock (resnet18/34: the stride on conv1) or, where conv3 exists, torchvision's v1.5 Bottleneck
    (1x1, 3x3 carrying the stride, 1x1)."""
    if b + "conv3.weight" not in sd:
        out = F.relu(_bn(F.conv2d(x, sd[b + "conv1.weight"], stride=stride, padding=1), sd, b + "bn1."))
        return _bn(F.conv2d(out, sd[b + "conv2.weight"], padding=1), sd, b + "bn2.")
    out = F.relu(_bn(F.conv2d(x, sd[b + "conv1.weight"]), sd, b + "bn1."))
    out = F.relu(_bn(F.conv2d(out, sd[b + "conv2.weight"], stride=stride, padding=1), sd, b + "bn2."))
    return _bn(F.conv2d(out, sd[b + "conv3.weight"]), sd, b + "bn3.")


def original_resnet(x, sd, pre="cnn.module."):
    """torchvision's ResNet with ``fc`` an empty Sequential: stem, stages 1-4 (stride 2 in the first block of
    stages 2-4, a downsample where its weights exist), global average pool."""
    x = F.relu(_bn(F.conv2d(x, sd[pre + "conv1.weight"], stride=2, padding=3), sd, pre + "bn1."))
    x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    for stage in range(1, 5):
        i = 0
        while f"{pre}layer{stage}.{i}.conv1.weight" in sd:
            b = f"{pre}layer{stage}.{i}."
            stride = 2 if stage > 1 and i == 0 else 1
            out = _block(x, sd, b, stride)
            if b + "downsample.0.weight" in sd:
                x = _bn(F.conv2d(x, sd[b + "downsample.0.weight"], stride=stride), sd, b + "downsample.1.")
            x = F.relu(out + x)
            i += 1
    return x.mean(dim=(2, 3))  # AdaptiveAvgPool2d(1) + flatten; fc is an empty Sequential


def original_image_embeddings(pixels, sd, use_abs=False):
    """EncoderImageFull.forward: cnn -> l2norm -> fc -> l2norm -> abs (use_abs)."""
    features = orig_l2norm(original_resnet(pixels, sd))
    features = orig_l2norm(F.linear(features, sd["fc.weight"], sd["fc.bias"]))
    return features.abs() if use_abs else features


# -- the checkpoint --------------------------------------------------------------------------------------

def randomised_state(trunk: torch.nn.Module, gen: torch.Generator) -> dict:
    """The trunk's state with BatchNorm affine parameters and running statistics away from their initial values."""
    state = {}
    for key, value in trunk.state_dict().items():
        if key.endswith(("running_var", ".weight")) and value.dim() == 1:  # BN scale / variance in [0.5, 1.5)
            value = 0.5 + torch.rand(value.shape, generator=gen)
        elif key.endswith(("running_mean", ".bias")) and value.dim() == 1:
            value = (torch.rand(value.shape, generator=gen) - 0.5) * 0.2
        state[key] = value.clone()
    return state


def original_image_state(cnn_type="resnet18", seed=5) -> dict:
    """An ``EncoderImageFull`` state dict: the CNN under ``cnn.module.`` (classifier replaced), ``fc``."""
    torch.manual_seed(seed)
    trunk = strip_classifier(build_cnn(cnn_type))
    gen = torch.Generator().manual_seed(seed)
    state = {f"cnn.module.{k}": v for k, v in randomised_state(trunk, gen).items()}
    r = (6.0 / (trunk.out_dim + EMBED)) ** 0.5
    state["fc.weight"] = (torch.rand(EMBED, trunk.out_dim, generator=gen) * 2 - 1) * r
    state["fc.bias"] = torch.rand(EMBED, generator=gen) - 0.5
    return state


class _ImgEnc:  # what save_original needs of an encoder
    def __init__(self, state):
        self._state = state

    def state_dict(self):
        return self._state


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy_images")
    data = root / "f30k"
    (data / "images").mkdir(parents=True)
    karpathy = {"images": [{"filename": f"{i}.jpg", "split": "train", "sentences": [{"raw": c}]}
                           for i, c in enumerate(CAPTIONS)], "dataset": "flickr30k"}
    (data / "dataset_flickr30k.json").write_text(json.dumps(karpathy))
    vocab = original_vocab(CAPTIONS, drop=2)
    pickle_vocab(vocab, root / "f30k_vocab.pkl")
    img_state = original_image_state()
    txt_enc = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 2)
    opt = opt_namespace(data_name="f30k", cnn_type="resnet18", img_dim=4096, crop_size=224, batch_size=128,
                        criterion="triplet")
    ckpt = save_original(root / "model_best.pth.tar", _ImgEnc(img_state), txt_enc, opt)
    return ckpt, root / "f30k_vocab.pkl", data, img_state, txt_enc, vocab


def test_imported_checkpoint_embeds_images_and_captions_as_the_original(run, tmp_path):
    ckpt_path, vocab_path, data, img_state, txt_enc, vocab = run
    ckpt, converted = load_any_checkpoint(ckpt_path, vocab=vocab_path, data=data)
    assert converted and ckpt["model"]["kind"] == "vsepp_full"
    hp = ckpt["model"]["hparams"]
    assert (hp["cnn_type"], hp["embed_size"], hp["finetune"], hp["head"]) == ("resnet18", EMBED, False, "linear")
    assert ckpt["data"]["feature_shape"] == [512] and ckpt["loss"]["name"] == "triplet_sh"
    model, _ = build_from_checkpoint(ckpt)

    pixels = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want = original_image_embeddings(pixels, img_state)
        got = model.encode_images(pixels)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        assert (got - want).abs().max() < 1e-4 and want.std() > 0.05  # not a degenerate comparison
        # the captions: the original EncoderText (lengths sorted, as its collate_fn)
        ids = [[vocab("<start>")] + [vocab(w) for w in c.split()] + [vocab("<end>")] for c in CAPTIONS[:3]]
        order = sorted(range(3), key=lambda i: -len(ids[i]))
        tokens = torch.zeros(3, max(map(len, ids)), dtype=torch.long)
        for row, i in enumerate(order):
            tokens[row, : len(ids[i])] = torch.tensor(ids[i])
        lengths = [len(ids[i]) for i in order]
        torch.testing.assert_close(model.encode_captions(tokens, torch.tensor(lengths)), txt_enc(tokens, lengths),
                                   rtol=0, atol=1e-5)

    # frozen: after .train() the CNN (and its BatchNorm) stays in eval, embeddings unchanged
    model.train()
    assert not model.cnn.training and not any(m.training for m in model.cnn.modules())
    with torch.no_grad():
        torch.testing.assert_close(model.encode_images(pixels), want, rtol=0, atol=1e-4)
    assert torch.equal(model.cnn.bn1.running_mean, img_state["cnn.module.bn1.running_mean"])

    # cocos import writes a cocos checkpoint that loads (validated, hashed) to the same model
    out = tmp_path / "model.pt"
    res = runner.invoke(app, ["import", str(ckpt_path), "--vocab", str(vocab_path), "--data", str(data),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "vsepp_full" in res.output
    again, _ = build_from_checkpoint(load_checkpoint(out))
    with torch.no_grad():
        torch.testing.assert_close(again.encode_images(pixels), want, rtol=0, atol=1e-4)


def test_old_torch_batchnorm_and_finetune_runs(run, tmp_path):
    """State dicts of torch < 0.4.1 lack num_batches_tracked; a --finetune run trains the CNN when trained on."""
    ckpt_path, vocab_path, data, img_state, _, _ = run
    raw = torch.load(ckpt_path, weights_only=False)
    old = {k: v for k, v in raw["model"][0].items() if not k.endswith("num_batches_tracked")}
    assert len(old) < len(raw["model"][0])
    raw["model"][0] = old
    raw["opt"].finetune = True
    torch.save(raw, tmp_path / "old.pth.tar")
    ckpt, _ = load_any_checkpoint(tmp_path / "old.pth.tar", vocab=vocab_path, data=data)
    assert ckpt["model"]["hparams"]["finetune"] is True
    model, _ = build_from_checkpoint(ckpt)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(model.encode_images(pixels), original_image_embeddings(pixels, img_state),
                                   rtol=0, atol=1e-4)
    model.train()
    assert model.cnn.training and model.cnn.conv1.weight.requires_grad


def _variant(run, tmp_path, name, opt=None, img=None):
    ckpt_path = run[0]
    raw = torch.load(ckpt_path, weights_only=False)
    for key, value in (opt or {}).items():
        setattr(raw["opt"], key, value)
    if img is not None:
        raw["model"][0] = img(dict(raw["model"][0]))
    torch.save(raw, tmp_path / name)
    return tmp_path / name


def _import(path, run, tmp_path):
    return runner.invoke(app, ["import", str(path), "--vocab", str(run[1]), "--data", str(run[2]),
                               "--out", str(tmp_path / "out.pt")])


@pytest.mark.parametrize("name, opt, img, words", [
    ("inception.pth.tar", {"cnn_type": "inception_v3"}, None, ("cnn_type 'inception_v3'", "not support")),
    ("r34.pth.tar", {"cnn_type": "resnet34"}, None, ("holds resnet18 weights, not resnet34",)),
    ("precomp.pth.tar", {"data_name": "f30k_precomp"}, None, ("other than fc", "cnn.module.")),
    ("noimgnorm.pth.tar", {"no_imgnorm": True}, None, ("no_imgnorm",)),
    ("extra.pth.tar", None, lambda sd: {**sd, "attn.weight": torch.zeros(3)}, ("attn.weight",)),
    ("missing.pth.tar", None, lambda sd: {k: v for k, v in sd.items() if "layer4.1.bn2.weight" not in k},
     ("layer4.1.bn2.weight",)),
    ("fcshape.pth.tar", None, lambda sd: {**sd, "fc.weight": torch.zeros(EMBED, 100)}, ("fc.weight", "(12, 100)")),
])
def test_what_cannot_be_imported_is_one_line_naming_the_file(run, tmp_path, name, opt, img, words):
    res = _import(_variant(run, tmp_path, name, opt, img), run, tmp_path)
    line = one_error_line(res)
    assert name in line, line
    for word in words:
        assert word in line, line
    assert not (tmp_path / "out.pt").exists()


def test_original_key_names_map_onto_torchvisions():
    """VSE++ wraps a ResNet in DataParallel (``cnn.module.*``) but only a VGG's ``features``
    (``cnn.features.module.*``, ``cnn.classifier.*`` unwrapped)."""
    assert _cnn_key("cnn.module.layer1.0.conv1.weight") == "layer1.0.conv1.weight"
    assert _cnn_key("cnn.module.bn1.running_var") == "bn1.running_var"
    assert _cnn_key("cnn.features.module.34.weight") == "features.34.weight"
    assert _cnn_key("cnn.classifier.3.bias") == "classifier.3.bias"
    with torch.device("meta"):
        vgg = strip_classifier(build_cnn("vgg19"))
    original = ([f"cnn.features.module.{k.removeprefix('features.')}" for k in vgg.state_dict()
                 if k.startswith("features.")] + [f"cnn.{k}" for k in vgg.state_dict() if k.startswith("classifier.")])
    assert sorted(map(_cnn_key, original)) == sorted(vgg.state_dict())
    assert "classifier.6.weight" not in vgg.state_dict()


def test_old_vgg_classifier_names_are_renamed(tmp_path):
    """torchvision before pytorch/vision@989d52a numbered VGG's classifier 1 and 4 (Dropout first): renamed to 0 and
    3 as VSE++'s load_state_dict does; checked on the mapping alone (a VGG-19 holds 143M parameters)."""
    from cocos.legacy import map_full_image

    with torch.device("meta"):
        vgg = strip_classifier(build_cnn("vgg19"))
    sd = {}
    for key, value in vgg.state_dict().items():
        name = key.replace("features.", "features.module.").replace("classifier.0.", "classifier.1.")
        sd["cnn." + name.replace("classifier.3.", "classifier.4.")] = torch.empty(value.shape, device="meta")
    sd["fc.weight"], sd["fc.bias"] = torch.empty(EMBED, 4096, device="meta"), torch.empty(EMBED, device="meta")
    state, hparams = map_full_image(sd, Path("vgg.pth.tar"), {"cnn_type": "vgg19"})
    assert hparams == {"cnn_type": "vgg19", "embed_size": EMBED, "finetune": False}
    assert tuple(state["cnn.classifier.0.weight"].shape) == (4096, 25088)
    assert tuple(state["cnn.classifier.3.weight"].shape) == (4096, 4096)
    assert not any(".module." in k or "classifier.1." in k or "classifier.4." in k for k in state)
