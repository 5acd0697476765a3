"""The plain-torch CNNs carry torchvision's names and shapes; weights files load by name or are refused in
one line; the raw-image VSE++ model keeps a frozen CNN frozen and in eval mode.

torchvision's layouts are restated here from its definitions (not from cocos's code): the key-count
rules, a few hand-checked names and shapes, and the published parameter totals.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cocos.errors import CocosError
from cocos.models import build_model
from cocos.models.cnn import build_cnn, load_cnn_weights, strip_classifier

# torchvision's published parameter totals (torchvision.models documentation, "Params")
TOTALS = {"resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032, "resnet101": 44_549_160,
          "resnet152": 60_192_808, "vgg19": 143_667_240, "resnext50_32x4d": 25_028_904,
          "resnext101_32x8d": 88_791_336}
BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet34": (3, 4, 6, 3), "resnet50": (3, 4, 6, 3),
          "resnet101": (3, 4, 23, 3), "resnet152": (3, 8, 36, 3), "resnext50_32x4d": (3, 4, 6, 3),
          "resnext101_32x8d": (3, 4, 23, 3)}
BOTTLENECK = ("resnet50", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d")
VOCAB = ["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "cat"]


def meta(name: str) -> nn.Module:
    with torch.device("meta"):
        return build_cnn(name)


def expected_resnet_keys(name: str) -> int:
    """State-dict entries of a torchvision ResNet: a conv has 1, a BatchNorm 5 (weight, bias, running mean/var,
    num_batches_tracked), fc 2; BasicBlock = 2 conv + 2 BN, Bottleneck = 3 + 3; a downsample (conv + BN) on the
    first block of every stage whose stride or width changes (all four for Bottleneck, stages 2-4 for Basic)."""
    blocks = BLOCKS[name]
    bottleneck = name in BOTTLENECK
    per_block = 3 * 6 if bottleneck else 2 * 6
    downsamples = 4 if bottleneck else 3
    return 1 + 5 + sum(blocks) * per_block + downsamples * 6 + 2


@pytest.mark.parametrize("name", list(TOTALS))
def test_parameter_totals_and_key_counts_are_torchvisions(name):
    model = meta(name)
    assert sum(p.numel() for p in model.parameters()) == TOTALS[name]
    keys = model.state_dict()
    assert len(keys) == (expected_resnet_keys(name) if name != "vgg19" else 16 * 2 + 3 * 2)


def test_hand_checked_names_shapes_and_v15_strides():
    r50 = meta("resnet50")
    shapes = {k: tuple(v.shape) for k, v in r50.state_dict().items()}
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer1.0.downsample.1.running_var"] == (256,)
    assert shapes["layer2.0.conv2.weight"] == (128, 128, 3, 3)
    assert shapes["layer3.5.conv3.weight"] == (1024, 256, 1, 1)
    assert shapes["layer4.2.bn3.num_batches_tracked"] == ()
    assert shapes["fc.weight"] == (1000, 2048)
    assert "layer3.6.conv1.weight" not in shapes  # resnet50 has 6 blocks in layer3
    # v1.5: the stride of a Bottleneck is on its 3x3 conv2, the downsample conv strides too
    assert r50.layer2[0].conv1.stride == (1, 1) and r50.layer2[0].conv2.stride == (2, 2)
    assert r50.layer2[0].downsample[0].stride == (2, 2) and r50.layer2[1].conv2.stride == (1, 1)

    r18 = {k: tuple(v.shape) for k, v in meta("resnet18").state_dict().items()}
    assert r18["layer1.0.conv1.weight"] == (64, 64, 3, 3)
    assert not any(k.startswith("layer1.0.downsample") for k in r18)  # same width and stride: no downsample
    assert r18["layer2.0.downsample.0.weight"] == (128, 64, 1, 1)
    assert r18["fc.weight"] == (1000, 512)

    vgg = {k: tuple(v.shape) for k, v in meta("vgg19").state_dict().items()}
    convs = [0, 2, 5, 7, 10, 12, 14, 16, 19, 21, 23, 25, 28, 30, 32, 34]  # ReLU after each, 5 max pools between
    assert sorted(int(k.split(".")[1]) for k in vgg if k.startswith("features.") and k.endswith("weight")) == convs
    assert vgg["features.0.weight"] == (64, 3, 3, 3) and vgg["features.34.weight"] == (512, 512, 3, 3)
    assert vgg["classifier.0.weight"] == (4096, 25088) and vgg["classifier.3.weight"] == (4096, 4096)
    assert vgg["classifier.6.weight"] == (1000, 4096)


def test_bottleneck_resnet_computes_torchvisions_v15_forward():
    """A few-block Bottleneck ResNet (resnet50's blocks, 1 or 2 per stage) against the functional restatement of
    the test of legacy imports: the stride on conv2, downsample convs striding too."""
    from cocos.models.cnn import Bottleneck, ResNet
    from tests.test_legacy_images import original_resnet, randomised_state

    torch.manual_seed(4)
    trunk = strip_classifier(ResNet(Bottleneck, (1, 2, 1, 1)))
    trunk.load_state_dict(randomised_state(trunk, torch.Generator().manual_seed(4)))
    sd = {f"cnn.module.{k}": v for k, v in trunk.state_dict().items()}
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        want = original_resnet(x, sd)
        assert want.shape == (2, 2048)
        torch.testing.assert_close(trunk.eval()(x), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_stripped_trunks_give_the_pooled_features():
    """ResNet: fc -> empty Sequential, output = mean of layer4 over the positions; VGG: the classifier
    loses its last Linear (its output: the 4096-d second fully connected layer)."""
    torch.manual_seed(0)
    trunk = strip_classifier(build_cnn("resnet18")).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        stem = trunk.maxpool(trunk.relu(trunk.bn1(trunk.conv1(x))))
        grid = trunk.layer4(trunk.layer3(trunk.layer2(trunk.layer1(stem))))
        assert grid.shape == (2, 512, 2, 2)  # 64 px / 32
        torch.testing.assert_close(trunk(x), grid.mean(dim=(2, 3)))
    assert not list(trunk.fc.parameters())
    vgg = strip_classifier(meta("vgg19"))
    assert vgg.out_dim == vgg.classifier[3].out_features == 4096
    assert [type(m).__name__ for m in vgg.classifier] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout"]


@pytest.fixture(scope="module")
def r18_file(tmp_path_factory):
    """A torchvision-format resnet18 file (its classifier included), saved with torch.save, keys unchanged."""
    torch.manual_seed(1)
    net = build_cnn("resnet18")
    path = tmp_path_factory.mktemp("w") / "resnet18-f37072fd.pth"
    torch.save(net.state_dict(), path)
    return path, net.state_dict()


def test_torchvision_state_dict_loads_by_name_into_the_trunk_and_the_model(r18_file):
    path, state = r18_file
    full = load_cnn_weights(build_cnn("resnet18"), path)
    for key, value in state.items():
        torch.testing.assert_close(full.state_dict()[key], value, rtol=0, atol=0)
    model = build_model("vsepp_full", vocab_size=len(VOCAB), cnn_type="resnet18", embed_size=8, word_dim=4)
    model.load_cnn_weights(path)
    loaded = model.cnn.state_dict()
    assert "fc.weight" not in loaded  # the ImageNet classifier is not used
    for key, value in loaded.items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)


def _one_line(excinfo, *words):
    text = str(excinfo.value)
    assert "\n" not in text
    for word in words:
        assert word in text, text
    return text


def test_bad_weights_files_are_one_line_naming_the_file_and_change_nothing(r18_file, tmp_path):
    path, state = r18_file
    torch.manual_seed(2)
    target = build_cnn("resnet18")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    cases = {
        "missing.pth": ({k: v for k, v in state.items() if k != "layer3.1.bn2.running_mean"},
                        ("missing.pth", "layer3.1.bn2.running_mean")),
        "extra.pth": ({**state, "layer5.0.conv1.weight": torch.zeros(1)}, ("extra.pth", "layer5.0.conv1.weight")),
        "shape.pth": ({**state, "conv1.weight": torch.zeros(64, 3, 5, 5)}, ("shape.pth", "conv1.weight",
                                                                            "(64, 3, 5, 5)")),
        "nan.pth": ({**state, "bn1.weight": torch.full((64,), float("nan"))}, ("nan.pth", "bn1.weight", "NaN")),
        "list.pth": ([1, 2, 3], ("list.pth", "not a CNN weights file")),
    }
    for name, (obj, words) in cases.items():
        torch.save(obj, tmp_path / name)
        with pytest.raises(CocosError) as excinfo:
            load_cnn_weights(target, tmp_path / name)
        _one_line(excinfo, *words)
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(target, tmp_path / "absent.pth")
    _one_line(excinfo, "absent.pth")
    for key, value in target.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_weights_of_another_architecture_are_named(r18_file):
    path, _ = r18_file
    with torch.device("meta"):  # loading is refused before any tensor is copied: a meta target suffices
        r34 = build_cnn("resnet34")
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(r34, path)
    _one_line(excinfo, "resnet18-f37072fd.pth", "holds resnet18 weights, not resnet34")


def test_a_weights_file_that_would_run_code_is_refused(tmp_path):
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo hacked",))

    torch.save({"conv1.weight": Evil()}, tmp_path / "evil.pth")
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(build_cnn("resnet18"), tmp_path / "evil.pth")
    _one_line(excinfo, "evil.pth", "system")


def small(**kw):
    torch.manual_seed(3)
    return build_model("vsepp_full", vocab_size=len(VOCAB), cnn_type="resnet18", embed_size=8, word_dim=4, **kw)


def test_frozen_cnn_stays_in_eval_and_gets_no_gradient():
    model = small()
    model.train()
    assert not model.cnn.training and model.fc.training and model.txt_enc.training
    assert not any(m.training for m in model.cnn.modules())
    stats = model.cnn.bn1.running_mean.clone()
    x = torch.randn(4, 3, 32, 32)
    emb = model.encode_images(x)
    emb.sum().backward()
    assert torch.equal(model.cnn.bn1.running_mean, stats)  # eval BatchNorm: statistics untouched
    assert all(p.grad is None and not p.requires_grad for p in model.cnn.parameters())
    assert model.fc.weight.grad is not None and model.fc.weight.grad.abs().sum() > 0
    model.eval()
    torch.testing.assert_close(model.encode_images(x), emb.detach())  # the same function in both modes


def test_finetune_trains_the_cnn_with_batch_statistics():
    model = small(finetune=True)
    model.train()
    assert model.cnn.training and all(p.requires_grad for p in model.cnn.parameters())
    stats = model.cnn.bn1.running_mean.clone()
    model.encode_images(torch.randn(4, 3, 32, 32)).sum().backward()
    assert not torch.equal(model.cnn.bn1.running_mean, stats)
    assert model.cnn.conv1.weight.grad is not None
    model.eval()
    assert not model.cnn.training


def test_encode_images_is_encode_pooled_of_pooled_with_vsepp_normalisation():
    model = small().eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        feats = model.pooled(x)
        assert feats.shape == (3, 512)
        unit = feats / feats.norm(dim=1, keepdim=True)
        proj = unit @ model.fc.weight.T + model.fc.bias
        want = proj / proj.norm(dim=1, keepdim=True)
        torch.testing.assert_close(model.encode_pooled(feats), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.encode_images(x), want, rtol=1e-5, atol=1e-6)
    # fc: Xavier-uniform bound sqrt(6 / (in + out)), zero bias (VSE++'s init_weights)
    bound = (6.0 / (512 + 8)) ** 0.5
    assert model.fc.weight.abs().max() <= bound and model.fc.weight.abs().max() > 0.9 * bound
    assert torch.equal(model.fc.bias, torch.zeros(8))


def test_ltd_mlp_head_and_options():
    model = build_model("vsepp_full", vocab_size=len(VOCAB), cnn_type="resnet18", embed_size=8, word_dim=4,
                        head="mlp", hidden=16, use_abs=True).eval()
    assert [type(m).__name__ for m in model.fc] == ["Linear", "ReLU", "Linear"]
    assert model.hparams["hidden"] == 16 and model.hparams["head"] == "mlp"
    feats = torch.randn(5, 512)
    a, b = model.fc[0], model.fc[2]
    hidden = torch.clamp(feats @ a.weight.T + a.bias, min=0)  # on the pooled features, no first l2norm
    out = hidden @ b.weight.T + b.bias
    want = (out / out.norm(dim=1, keepdim=True)).abs()
    with torch.no_grad():
        torch.testing.assert_close(model.encode_pooled(feats), want, rtol=1e-5, atol=1e-6)
    noimg = small(no_imgnorm=True).eval()
    with torch.no_grad():
        out = noimg.encode_pooled(feats)
        unit = feats / feats.norm(dim=1, keepdim=True)
        torch.testing.assert_close(out, unit @ noimg.fc.weight.T + noimg.fc.bias, rtol=1e-5, atol=1e-6)
    with pytest.raises(CocosError, match="unknown CNN 'resnet19'"):
        build_model("vsepp_full", vocab_size=7, cnn_type="resnet19")
    with pytest.raises(CocosError, match="unknown image head"):
        build_model("vsepp_full", vocab_size=7, head="conv")
    with pytest.raises(CocosError, match=r"images must be pixels \(n, 3, H, W\)"):
        model.encode_images(torch.zeros(2, 32, 32))
    with pytest.raises(CocosError, match="model 'vsepp_full' cannot be built with .*img_dim"):
        build_model("vsepp_full", vocab_size=7, img_dim=256)  # cocos train's precomputed-feature settings


def test_checkpoint_validator_accepts_the_model_and_refuses_bad_names():
    from cocos.training.checkpoint import validate_model

    model = small()
    ckpt = {"model": {"kind": "vsepp_full", "hparams": dict(model.hparams)}, "vocab": VOCAB,
            "state_dict": model.state_dict()}
    meta_model = validate_model(ckpt, "m.pt")
    assert meta_model.hparams == model.hparams
    for change, words in (({"cnn_type": "resnet19"}, ("m.pt", "model.hparams", "resnet19")),
                          ({"cnn_type": 50}, ("m.pt", "model.hparams.cnn_type", "string")),
                          ({"cnn_type": "resnet34"}, ("m.pt", "state_dict", "layer1.2")),
                          ({"head": "mlp"}, ("m.pt", "state_dict", "fc.0.weight"))):
        bad = {**ckpt, "model": {"kind": "vsepp_full", "hparams": {**model.hparams, **change}}}
        with pytest.raises(CocosError) as excinfo:
            validate_model(bad, "m.pt")
        _one_line(excinfo, *words)


def _moments(x: torch.Tensor) -> tuple[float, float, float]:
    """Mean, standard deviation and kurtosis ``E[(x - m)^4] / var^2`` (normal: 3, uniform: 1.8)."""
    x = x.detach().reshape(-1)
    centred = x - x.mean()
    square = centred.square()
    var = float(square.mean())
    return float(x.mean()), var ** 0.5, float(square.square_().mean()) / var ** 2


def test_resnet_initialisation_is_torchvisions():
    """torchvision's ``ResNet.__init__`` (restated; torchvision does not import here): every ``Conv2d`` weight is
    ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``, normal with mean 0 and std ``sqrt(2 / fan_out)``,
    ``fan_out = out_channels * kh * kw``; every ``BatchNorm2d`` weight 1 and bias 0 (``zero_init_residual``
    defaults to False: the last BatchNorm of each residual branch stays 1 too), running mean 0 and variance 1;
    ``fc`` keeps torch's ``Linear`` default, weight and bias uniform on ``±1 / sqrt(in_features)``.

    Each conv's empirical std must be within 7% of ``sqrt(2 / fan_out)`` (at least 4,096 weights: a standard
    error under 1.2%); where ``fan_in`` differs, ``sqrt(2 / fan_in)`` is checked to be at least 25% away, so a
    ``fan_in`` rule fails (the stem: 4.6 times larger; a stage's first conv: sqrt(2); a Bottleneck's 1x1: 2).
    Kurtosis near 3 (standard error under 0.08) tells the normal from a uniform (1.8) or truncated init of the
    same std. ResNet-18 (BasicBlock) and a one-block-per-stage Bottleneck ResNet."""
    from cocos.models.cnn import Bottleneck, ResNet

    torch.manual_seed(0)
    told_apart = 0
    for model in (build_cnn("resnet18"), ResNet(Bottleneck, (1, 1, 1, 1), num_classes=10)):
        convs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
        norms = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
        assert len(convs) == len(norms) and convs
        for name, conv in convs:
            out_c, in_c, kh, kw = conv.weight.shape
            fan_out, fan_in = out_c * kh * kw, in_c * kh * kw
            want = (2.0 / fan_out) ** 0.5
            assert conv.weight.numel() >= 4096 and conv.bias is None
            mean, std, kurt = _moments(conv.weight)
            assert abs(std / want - 1) < 0.07, (name, std, want)
            assert abs(mean) < 5 * want / conv.weight.numel() ** 0.5, name
            assert abs(kurt - 3) < 0.4, (name, kurt)
            if fan_in != fan_out:
                assert abs((2.0 / fan_in) ** 0.5 / want - 1) > 0.25, name  # the fan_in rule would fail above
                told_apart += 1
        for name, bn in norms:
            assert torch.equal(bn.weight, torch.ones_like(bn.weight)), name  # zero_init_residual=False
            assert torch.equal(bn.bias, torch.zeros_like(bn.bias)), name
            assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean)), name
            assert torch.equal(bn.running_var, torch.ones_like(bn.running_var)), name
        bound = 1 / model.fc.in_features ** 0.5  # Linear's reset_parameters: kaiming_uniform_(a=sqrt(5)), the bias alike
        mean, std, kurt = _moments(model.fc.weight)
        assert float(model.fc.weight.abs().max()) <= bound and abs(std / (bound / 3 ** 0.5) - 1) < 0.03
        assert abs(kurt - 1.8) < 0.1  # uniform, not normal
        assert float(model.fc.bias.abs().max()) <= bound and float(model.fc.bias.abs().max()) > bound / 2  # not zeroed
    assert told_apart >= 4


# -- ResNeXt (torchvision's ResNet with groups and width_per_group) ------------------------------------------

def _shapes(name: str) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in meta(name).state_dict().items()}


def test_resnext_names_and_grouped_shapes_are_torchvisions():
    """torchvision's Bottleneck: ``width = int(planes * (width_per_group / 64)) * groups``; conv1 1x1 in -> width,
    conv2 3x3 width -> width with ``groups`` (its weight: (width, width / groups, 3, 3)), conv3 1x1 width -> 4 planes.
    ResNeXt-50 32x4d, planes 64/128/256/512: widths 128/256/512/1024 (ResNet-50's: 64/128/256/512);
    ResNeXt-101 32x8d: widths 256/512/1024/2048. The stage outputs (256 ... 2048) are ResNet's."""
    x50 = _shapes("resnext50_32x4d")
    assert x50["conv1.weight"] == (64, 3, 7, 7) and x50["bn1.weight"] == (64,)
    assert x50["layer1.0.conv1.weight"] == (128, 64, 1, 1)
    assert x50["layer1.0.bn1.running_mean"] == (128,)
    assert x50["layer1.0.conv2.weight"] == (128, 4, 3, 3)  # 128 / 32 groups = 4 input channels per group
    assert x50["layer1.0.conv3.weight"] == (256, 128, 1, 1)
    assert x50["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert x50["layer1.1.conv1.weight"] == (128, 256, 1, 1)
    assert x50["layer2.0.conv2.weight"] == (256, 8, 3, 3)
    assert x50["layer3.5.conv2.weight"] == (512, 16, 3, 3)
    assert x50["layer4.0.conv1.weight"] == (1024, 1024, 1, 1)
    assert x50["layer4.0.conv2.weight"] == (1024, 32, 3, 3)
    assert x50["layer4.2.conv3.weight"] == (2048, 1024, 1, 1)
    assert x50["layer4.0.downsample.1.num_batches_tracked"] == ()
    assert x50["fc.weight"] == (1000, 2048) and "layer3.6.conv1.weight" not in x50
    assert _shapes("resnet50")["layer1.0.conv2.weight"] == (64, 64, 3, 3)  # the plain ResNet is unchanged

    x101 = _shapes("resnext101_32x8d")
    assert x101["layer1.0.conv1.weight"] == (256, 64, 1, 1)
    assert x101["layer1.0.conv2.weight"] == (256, 8, 3, 3)
    assert x101["layer1.0.conv3.weight"] == (256, 256, 1, 1)
    assert x101["layer2.0.conv2.weight"] == (512, 16, 3, 3)
    assert x101["layer3.22.conv1.weight"] == (1024, 1024, 1, 1)  # 23 blocks in layer3
    assert x101["layer3.22.conv2.weight"] == (1024, 32, 3, 3)
    assert "layer3.23.conv1.weight" not in x101
    assert x101["layer4.0.conv2.weight"] == (2048, 64, 3, 3)
    assert x101["layer4.2.conv3.weight"] == (2048, 2048, 1, 1)
    assert x101["fc.weight"] == (1000, 2048)

    net = meta("resnext50_32x4d")
    for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
        for block in stage:
            assert block.conv2.groups == 32 and block.conv1.groups == block.conv3.groups == 1
    # v1.5 as the ResNets: the stride sits on the grouped 3x3
    assert net.layer3[0].conv1.stride == (1, 1) and net.layer3[0].conv2.stride == (2, 2)
    assert net.layer3[0].downsample[0].stride == (2, 2)


def test_resnext_is_in_the_cnn_tables_and_told_apart_from_resnet():
    from cocos.models import CNN_TYPES
    from cocos.models.cnn import cnn_family, guess_architecture

    assert {"resnext50_32x4d", "resnext101_32x8d"} <= set(CNN_TYPES)
    assert cnn_family("resnext101_32x8d") == "resnet"  # its classifier is fc, as a ResNet's
    for name in ("resnext50_32x4d", "resnext101_32x8d", "resnet50", "resnet101"):
        shapes = _shapes(name)
        assert guess_architecture(shapes) == name
        assert guess_architecture({k: v for k, v in shapes.items() if not k.startswith("fc.")}) == name
    with torch.device("meta"):
        model = build_model("vsepp_full", vocab_size=len(VOCAB), cnn_type="resnext101_32x8d", embed_size=8,
                            word_dim=4)
    assert model.img_dim == 2048 and model.fc.weight.shape == (8, 2048)
    assert model.state_dict()["cnn.layer1.0.conv2.weight"].shape == (256, 8, 3, 3)
    assert "cnn.fc.weight" not in model.state_dict()
    with pytest.raises(CocosError, match="unknown CNN 'resnext50'"):
        build_cnn("resnext50")


def _bn_eval(x, sd, p):
    return F.batch_norm(x, sd[p + "running_mean"], sd[p + "running_var"], sd[p + "weight"], sd[p + "bias"],
                        training=False, eps=1e-5)


def _grouped_conv(x, weight, groups, stride=1, padding=0):
    """A grouped convolution restated: the input and output channels cut into ``groups`` equal slices, slice g of
    the output the ungrouped convolution of slice g of the input (F.conv2d's ``groups`` is not used)."""
    cin, cout = x.shape[1] // groups, weight.shape[0] // groups
    assert weight.shape[1] == cin
    return torch.cat([F.conv2d(x[:, g * cin:(g + 1) * cin], weight[g * cout:(g + 1) * cout], stride=stride,
                               padding=padding) for g in range(groups)], dim=1)


def _resnext_layer4(x, sd, groups):
    """torchvision's ResNeXt up to layer4 (v1.5: stride on the grouped 3x3 of each stage's first block,
    downsample on each stage's first block), restated with functional calls on the state dict."""
    x = F.relu(_bn_eval(F.conv2d(x, sd["conv1.weight"], stride=2, padding=3), sd, "bn1."))
    x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    for stage in range(1, 5):
        i = 0
        while f"layer{stage}.{i}.conv1.weight" in sd:
            b = f"layer{stage}.{i}."
            stride = 2 if stage > 1 and i == 0 else 1
            out = F.relu(_bn_eval(F.conv2d(x, sd[b + "conv1.weight"]), sd, b + "bn1."))
            out = F.relu(_bn_eval(_grouped_conv(out, sd[b + "conv2.weight"], groups, stride, 1), sd, b + "bn2."))
            out = _bn_eval(F.conv2d(out, sd[b + "conv3.weight"]), sd, b + "bn3.")
            if b + "downsample.0.weight" in sd:
                x = _bn_eval(F.conv2d(x, sd[b + "downsample.0.weight"], stride=stride), sd, b + "downsample.1.")
            x = F.relu(out + x)
            i += 1
    return x


def test_grid_is_layer4_flattened_over_space():
    """``grid(x)`` = layer4's (B, C, h, w) map as (B, h*w, C), position i*w + j = row i, column j (vse_infty's
    ``top_feat.view(b, c, -1).permute(0, 2, 1)``): against the trunk's own stem and stages called by hand, and
    against a functional restatement with the grouped convolutions cut into slices. A one-block-per-stage
    ResNeXt 32x4d with BatchNorm statistics away from their initial values, on 64 x 96 pixels (a 2 x 3 grid)."""
    from cocos.models.cnn import Bottleneck, ResNet
    from tests.test_legacy_images import randomised_state

    torch.manual_seed(6)
    net = ResNet(Bottleneck, (1, 1, 1, 1), groups=32, width_per_group=4)
    net.load_state_dict(randomised_state(net, torch.Generator().manual_seed(6)))
    net.eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        grid = net.grid(x)
        stem = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        fmap = net.layer4(net.layer3(net.layer2(net.layer1(stem))))
        assert fmap.shape == (2, 2048, 2, 3) and grid.shape == (2, 6, 2048)
        for i in range(2):
            for j in range(3):
                assert torch.equal(grid[:, i * 3 + j], fmap[:, :, i, j])
        want = _resnext_layer4(x, net.state_dict(), groups=32)
        torch.testing.assert_close(fmap, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        # the pooled feature (forward without the classifier) is the mean over the grid
        torch.testing.assert_close(strip_classifier(net)(x), grid.mean(dim=1), rtol=1e-5, atol=1e-6)


def test_grid_shape_on_the_meta_device():
    net = meta("resnext50_32x4d")
    assert net.grid(torch.empty(2, 3, 224, 224, device="meta")).shape == (2, 49, 2048)  # 224 / 32 = 7
    assert net.grid(torch.empty(1, 3, 256, 320, device="meta")).shape == (1, 80, 2048)  # 8 x 10
    assert meta("resnet18").grid(torch.empty(3, 3, 224, 224, device="meta")).shape == (3, 49, 512)


def test_a_wsl_like_resnext101_state_dict_loads_by_name(tmp_path):
    """Facebook's WSL ``ig_resnext101_32x8-c38310e5.pth`` is a torchvision-format resnext101_32x8d state dict
    (its ImageNet ``fc`` included): a file of tensors of those names and shapes loads into the CNN, every tensor
    under its own name (each filled with its own number; a few random, compared exactly), and into the stripped
    trunk."""
    with torch.device("meta"):
        names = {k: (tuple(v.shape), v.dtype) for k, v in build_cnn("resnext101_32x8d").state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    random = ("conv1.weight", "layer1.0.conv2.weight", "layer3.22.conv2.weight", "layer4.2.bn3.running_var", "fc.bias")
    number = {k: float(i + 1) for i, k in enumerate(names)}
    state = {k: (torch.randn(shape, generator=gen) if k in random else torch.full(shape, number[k]))
             if dtype.is_floating_point else torch.tensor(11) for k, (shape, dtype) in names.items()}
    path = tmp_path / "ig_resnext101_32x8-c38310e5.pth"
    torch.save(state, path)
    exact = {k: state[k] for k in random}
    del state
    with torch.device("meta"):
        net = build_cnn("resnext101_32x8d")
    net = net.to_empty(device="cpu")  # no initialisation: every value comes from the file
    load_cnn_weights(net, path)
    loaded = net.state_dict()
    assert set(loaded) == set(names)
    for key, value in loaded.items():
        if key in exact:
            assert torch.equal(value, exact[key]), key
        elif value.is_floating_point():
            assert bool((value == number[key]).all()), key
    assert int(loaded["layer2.3.bn2.num_batches_tracked"]) == 11
    del loaded
    trunk = strip_classifier(net)  # the headless trunk takes the same file: its fc.* is not used
    for p in trunk.parameters():
        p.data.zero_()
    load_cnn_weights(trunk, path, "resnext101_32x8d")
    assert "fc.weight" not in trunk.state_dict()
    assert torch.equal(trunk.layer3[22].conv2.weight, exact["layer3.22.conv2.weight"])


def test_a_resnext_file_is_refused_by_a_resnet_and_the_other_way(tmp_path):
    torch.manual_seed(8)
    path = tmp_path / "resnext50_32x4d-7cdf4587.pth"
    torch.save(build_cnn("resnext50_32x4d").state_dict(), path)
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(meta("resnet50"), path)
    _one_line(excinfo, "resnext50_32x4d-7cdf4587.pth", "holds resnext50_32x4d weights, not resnet50")
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(meta("resnext101_32x8d"), path)
    _one_line(excinfo, "holds resnext50_32x4d weights, not resnext101_32x8d")
    path50 = tmp_path / "resnet50.pth"
    torch.save(meta("resnet50").to_empty(device="cpu").state_dict(), path50)
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(meta("resnext50_32x4d"), path50)
    _one_line(excinfo, "resnet50.pth", "holds resnet50 weights, not resnext50_32x4d")


def test_a_file_without_batch_counters_gets_zero_ones(r18_file, tmp_path):
    """torch < 0.4.1 saved BatchNorm without ``num_batches_tracked`` (torchvision's 2017 files): every counter
    missing loads with zero counters, as torch's load_state_dict does; one counter missing is a damaged file."""
    _, state = r18_file
    legacy = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    assert len(state) - len(legacy) == 20  # stem + 8 blocks x 2 + 3 downsamples
    torch.save(legacy, tmp_path / "resnet18-5c106cde.pth")
    torch.manual_seed(9)
    net = build_cnn("resnet18")
    net.layer1[0].bn1.num_batches_tracked.fill_(5)
    load_cnn_weights(net, tmp_path / "resnet18-5c106cde.pth")
    for key, value in net.state_dict().items():
        want = torch.tensor(0) if key.endswith("num_batches_tracked") else state[key]
        assert torch.equal(value, want), key
    with pytest.raises(CocosError) as excinfo:  # the legacy file of another architecture is still named
        load_cnn_weights(meta("resnet34"), tmp_path / "resnet18-5c106cde.pth")
    _one_line(excinfo, "holds resnet18 weights, not resnet34")
    torch.save({k: v for k, v in state.items() if k != "layer2.1.bn1.num_batches_tracked"}, tmp_path / "one.pth")
    with pytest.raises(CocosError) as excinfo:
        load_cnn_weights(net, tmp_path / "one.pth")
    _one_line(excinfo, "one.pth", "layer2.1.bn1.num_batches_tracked")
