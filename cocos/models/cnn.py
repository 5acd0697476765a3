"""ImageNet CNNs in plain torch, with torchvision's module and parameter names.

``build_cnn(name)`` makes ResNet-18/34/50/101/152, ResNeXt-50 (32x4d), ResNeXt-101 (32x8d)
or VGG-19 exactly as ``torchvision.models.<name>()`` does (same modules, same names, same
shapes), so a torchvision state dict (``resnet50-0676ba61.pth``, ``vgg19-dcbb9e9d.pth``,
``resnext101_32x8d-8ba56ff5.pth``, or Facebook's WSL ``ig_resnext101_32x8-c38310e5.pth``, a
torchvision-format ``resnext101_32x8d``) loads by name with :func:`load_cnn_weights`; cocos
has no torchvision dependency (there is no CPU build of it for the pinned torch) and
downloads nothing. The definitions file, section 17, says how the VSE++ full-image encoder
uses them. Which evaluation transform a weights file was made for (torchvision's V2 files:
``Resize(232)``, not 256) is :mod:`cocos.models.weights`'s table, by the file's content.

* ResNet: torchvision's v1.5 layout (the stride of a Bottleneck sits on its 3x3 ``conv2``,
  not on ``conv1`` as in the original paper's v1); ``downsample = Sequential(conv1x1, BN)``
  where the stride or the width changes. ResNeXt is the same ResNet with grouped 3x3 convolutions
  (torchvision's ``groups`` and ``width_per_group``): a Bottleneck of ``planes`` is
  ``width = int(planes * width_per_group / 64) * groups`` wide (``conv1`` 1x1 in -> width,
  ``conv2`` 3x3 width -> width with the stride and ``groups``, ``conv3`` 1x1 width -> planes x 4),
  so ResNeXt-50 32x4d's first block is 128 wide where ResNet-50's is 64. Initialisation as
  torchvision: Kaiming-normal (``fan_out``) convolutions, BatchNorm weight 1 and bias 0, the
  classifier ``fc`` torch's default ``Linear`` init. ``ResNet.grid`` gives ``layer4``'s map as
  one feature per grid cell (VSE infinity's backbone features).
* VGG-19 (configuration "E", no BatchNorm): ``features`` (16 convolutions with ReLU, 5 max
  pools), ``avgpool`` (adaptive, 7x7), ``classifier`` = Linear(25088, 4096), ReLU, Dropout,
  Linear(4096, 4096), ReLU, Dropout, Linear(4096, 1000). Init as torchvision: Kaiming-normal
  convolutions with zero bias, ``Linear`` normal(0, 0.01) with zero bias.

Tensors on the meta device are not initialised (no memory, no time: checkpoints are
validated against a meta model).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from cocos.errors import CocosError
from cocos.safeload import load_torch_file

# name -> (block, blocks per stage)
RESNETS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet34": ("basic", (3, 4, 6, 3)),
           "resnet50": ("bottleneck", (3, 4, 6, 3)), "resnet101": ("bottleneck", (3, 4, 23, 3)),
           "resnet152": ("bottleneck", (3, 8, 36, 3))}
# name -> (Bottleneck blocks per stage, groups, width_per_group): torchvision's ResNeXt
RESNEXTS = {"resnext50_32x4d": ((3, 4, 6, 3), 32, 4), "resnext101_32x8d": ((3, 4, 23, 3), 32, 8)}
VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
             512, 512, 512, 512, "M")
CNN_TYPES = (*RESNETS, *RESNEXTS, "vgg19")
# where the ImageNet classifier sits: the part of a torchvision state dict a headless trunk does not use
_CLASSIFIER = {"resnet": ("fc.weight", "fc.bias"), "vgg": ("classifier.6.weight", "classifier.6.bias")}


def _conv3x3(inp: int, out: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inp, out, kernel_size=3, stride=stride, padding=1, groups=groups, bias=False)


def _conv1x1(inp: int, out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inp, out, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64):
        super().__init__()
        if groups != 1 or base_width != 64:  # as torchvision's BasicBlock
            raise CocosError("BasicBlock only supports groups=1 and base_width=64")
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1, 3x3 (carrying the stride: torchvision's v1.5; grouped for ResNeXt), 1x1 x4 with a residual
    connection. The inner width is ``int(planes * base_width / 64) * groups`` (``planes`` for a ResNet)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64):
        super().__init__()
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = _conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride, groups)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ``ResNet``: stem, four stages, global average pool, ``fc`` classifier; ``groups`` and
    ``width_per_group`` (Bottleneck only) make it a ResNeXt."""

    def __init__(self, block: type[nn.Module], layers: tuple[int, ...], num_classes: int = 1000,
                 groups: int = 1, width_per_group: int = 64):
        super().__init__()
        self.inplanes = 64
        self.groups, self.base_width = int(groups), int(width_per_group)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        self.out_dim = 512 * block.expansion
        for m in self.modules():
            if m is not self.fc:
                _init_like_torchvision(m, linear_std=None)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, self.groups, self.base_width)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, groups=self.groups, base_width=self.base_width)
                   for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` pixels -> ``layer4``'s ``(B, C, h, w)`` map (before the average pool; ``h = H / 32``
        rounded up, for the stem's stride 2 convolution and max pool and three stride 2 stages)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def grid(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` pixels -> ``(B, h * w, C)``: ``layer4``'s map flattened over space, row-major
        (position ``i * w + j`` is row ``i``, column ``j``), one ``C``-d feature per grid cell (2048 for a
        Bottleneck net; 7 x 7 = 49 cells for 224 x 224 pixels). VSE infinity's backbone features
        (``ResnetFeatureExtractor.forward``)."""
        fmap = self.feature_map(x)
        return fmap.flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(self.feature_map(x)), 1))


class VGG(nn.Module):
    """torchvision's ``VGG``: ``features``, ``avgpool`` (7x7), ``classifier``."""

    def __init__(self, cfg: tuple = VGG19_CFG, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(4096, num_classes))
        self.out_dim = 4096
        for m in self.modules():
            _init_like_torchvision(m, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def _init_like_torchvision(m: nn.Module, linear_std: float | None) -> None:
    """torchvision's initialisation of one module (meta tensors are left alone)."""
    weight = getattr(m, "weight", None)
    if weight is None or weight.is_meta:
        return
    with torch.no_grad():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                m.bias.zero_()
        elif isinstance(m, nn.BatchNorm2d):
            m.weight.fill_(1.0)
            m.bias.zero_()
        elif isinstance(m, nn.Linear) and linear_std is not None:
            m.weight.normal_(0.0, linear_std)
            m.bias.zero_()


def build_cnn(name: str, num_classes: int = 1000) -> nn.Module:
    """``torchvision.models.<name>(num_classes=...)`` in plain torch, randomly initialised (module docstring)."""
    if name in RESNETS:
        block, layers = RESNETS[name]
        return ResNet(BasicBlock if block == "basic" else Bottleneck, layers, num_classes)
    if name in RESNEXTS:
        layers, groups, width = RESNEXTS[name]
        return ResNet(Bottleneck, layers, num_classes, groups=groups, width_per_group=width)
    if name == "vgg19":
        return VGG(VGG19_CFG, num_classes)
    raise CocosError(f"unknown CNN '{name}' (choose from {', '.join(CNN_TYPES)})")


def cnn_family(name: str) -> str:
    """``resnet`` (ResNeXt included: the same classifier ``fc``) or ``vgg``."""
    if name not in CNN_TYPES:
        raise CocosError(f"unknown CNN '{name}' (choose from {', '.join(CNN_TYPES)})")
    return "vgg" if name.startswith("vgg") else "resnet"


def strip_classifier(cnn: nn.Module) -> nn.Module:
    """Drop the ImageNet classifier in place, as VSE++'s ``EncoderImageFull``: a ResNet's ``fc`` becomes an
    empty ``Sequential`` (the output is the pooled 512/2048-d feature), a VGG's ``classifier`` loses its last
    ``Linear`` (the output is the 4096-d second fully connected layer after its ReLU and Dropout)."""
    if isinstance(cnn, ResNet):
        cnn.fc = nn.Sequential()
    elif isinstance(cnn, VGG):
        cnn.classifier = nn.Sequential(*list(cnn.classifier.children())[:-1])
    else:
        raise CocosError(f"cannot strip the classifier of a {type(cnn).__name__}")
    return cnn


@functools.lru_cache(maxsize=1)
def _reference_states() -> dict[str, dict[str, tuple]]:
    """Every architecture's parameter and buffer shapes (built on the meta device: no memory; do not modify)."""
    with torch.device("meta"):
        return {name: {k: tuple(v.shape) for k, v in build_cnn(name).state_dict().items()} for name in CNN_TYPES}


def guess_architecture(shapes: dict[str, tuple]) -> str | None:
    """The architecture whose torchvision state dict (with or without its classifier) has exactly these
    names and shapes; ``None`` if none has."""
    for name, ref in _reference_states().items():
        head = _CLASSIFIER[cnn_family(name)]
        if shapes == ref or shapes == {k: v for k, v in ref.items() if k not in head}:
            return name
    return None


def check_cnn_state(state: dict, expected: dict[str, tuple], where, what: str = "CNN") -> None:
    """``state`` has exactly the names and shapes of ``expected``; else one line naming ``where``, and the
    architecture the weights belong to when they are another one's."""
    shapes = _tensor_shapes(state, where, what)
    if shapes == expected:
        return
    other = guess_architecture(shapes)
    if other is not None and other != what:
        raise CocosError(f"{where}: holds {other} weights, not {what} ones")
    raise CocosError(f"{where}: {_state_mismatch(shapes, expected, what)}")


def _tensor_shapes(state: dict, where, what: str) -> dict[str, tuple]:
    """The shape of every entry of ``state``; each must be a tensor (else one line naming the first that is not)."""
    shapes = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    if len(shapes) != len(state):
        bad = next(k for k, v in state.items() if not isinstance(v, torch.Tensor))
        raise CocosError(f"{where}: {bad!r} is not a tensor; expected a state dict of the {what}")
    return shapes


def _state_mismatch(shapes: dict[str, tuple], expected: dict[str, tuple], what: str) -> str:
    """How ``shapes`` (not equal to ``expected``) differs, first found first: a missing tensor, an unexpected one,
    else the first tensor of another shape."""
    missing = [k for k in expected if k not in shapes]
    if missing:
        return f"the {what} weights lack {missing[0]} ({len(missing)} of {len(expected)} tensors missing)"
    extra = [k for k in shapes if k not in expected]
    if extra:
        return f"holds {extra[0]}, which the {what} does not have ({len(extra)} unexpected)"
    key = next(k for k in expected if shapes[k] != expected[k])
    return f"{key} has shape {shapes[key]}, the {what} needs {expected[key]}"


# What the refusal of a CNN weights file that names a class says to do (the commands reading --cnn-weights have no
# --trust-checkpoint: a plain state dict is all they need).
CNN_WEIGHTS_ADVICE = ("save its weights as a plain state dict and pass that file: torch.save(model.state_dict(), "
                      "'weights.pth')")


def read_cnn_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A CNN weights file as a state dict of float tensors: read with ``weights_only=True``
    (:func:`cocos.safeload.load_torch_file`); a DataParallel ``module.`` prefix is dropped. A file that names
    a class or function (a pickled model) is refused with :data:`CNN_WEIGHTS_ADVICE`."""

    obj = load_torch_file(path, what="CNN weights file", advice=CNN_WEIGHTS_ADVICE)
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):  # {'state_dict': ..., 'epoch': ...}
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) for k in obj):
        raise CocosError(f"{path}: not a CNN weights file (expected a state dict of named tensors)")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _add_batch_counters(state: dict) -> dict:
    """A state dict with no ``num_batches_tracked`` at all (torch < 0.4.1): a zero counter beside every
    ``running_mean`` (what BatchNorm's ``_load_from_state_dict`` adds to a state dict of that age); else as it is."""
    if any(k.endswith(".num_batches_tracked") for k in state):
        return state
    out = {}
    for key, value in state.items():
        out[key] = value
        if key.endswith(".running_mean"):
            out[key.removesuffix("running_mean") + "num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
    return out


def load_cnn_weights(cnn: nn.Module, path: str | os.PathLike, name: str | None = None) -> nn.Module:
    """Load a torchvision-format weights file into ``cnn`` (by name; in place) and return it.

    ``name`` is the architecture for messages (default: the one the module's shapes match).
    A file with the ImageNet classifier loads into a trunk whose classifier was stripped
    (:func:`strip_classifier`): the classifier's weights are not used. A file saved by torch < 0.4.1
    (torchvision's 2017 files, such as ``resnet50-19c8e357.pth``) has no BatchNorm ``num_batches_tracked``
    at all: each gets a zero counter, as torch's own ``load_state_dict`` gives it. Another architecture,
    a missing or unexpected tensor, a wrong shape, a non-floating or non-finite value: one
    :class:`CocosError` line naming the file; ``cnn`` is left as it was.
    """
    state = _add_batch_counters(read_cnn_state(path))
    expected = {k: tuple(v.shape) for k, v in cnn.state_dict().items()}
    name = name or guess_architecture(expected) or type(cnn).__name__
    for key in _CLASSIFIER["vgg" if isinstance(cnn, VGG) else "resnet"]:
        if key not in expected:
            state.pop(key, None)
    check_cnn_state(state, expected, path, name)
    for key, value in state.items():
        if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
            raise CocosError(f"{path}: {key} holds NaN or Inf")
        if expected[key] and not value.dtype.is_floating_point:
            raise CocosError(f"{path}: {key} holds {value.dtype} values, expected floating point")
    cnn.load_state_dict(state)
    return cnn


__all__ = ["CNN_TYPES", "RESNETS", "RESNEXTS", "BasicBlock", "Bottleneck", "ResNet", "VGG", "build_cnn",
           "check_cnn_state", "cnn_family", "guess_architecture", "load_cnn_weights", "read_cnn_state",
           "strip_classifier"]
