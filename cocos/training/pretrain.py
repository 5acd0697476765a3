"""Pre-training a CNN on the rendered image world's attribute task (``cocos demo --images``): not retrieval.

The COCOS paper (as VSE++) trains on a CNN pre-trained elsewhere (ImageNet) and then frozen. Nothing is
downloaded here, so the image demo makes its own pre-trained CNN, on a task of the image world that reads
no caption: name the object at each position.

* **Task.** :func:`cocos.data.synth_images.attribute_targets` of the training split's scene records: for
  each of the 5 positions and each of shape, colour and size, the class of the object there (its value, or
  "no object"; 9, 9 and 4 classes). 15 softmax heads.
* **Model.** ``build_cnn(cnn, num_classes=5 * 22)``: torchvision's architecture with its classifier ``fc``
  as the heads' one linear layer (logits viewed as ``(B, 5, 22)`` and cut into 9 + 9 + 4 per position),
  initialised as torchvision after ``torch.manual_seed(seed)`` (in a forked RNG: the caller's random state
  is left alone). The loss is the mean over the 15 heads of the batch's mean cross-entropy.
* **Inputs.** Each training image once through the evaluation transform ``Resize(resize)`` +
  ``CenterCrop(crop_size)`` (:func:`cocos.data.transforms.eval_transform`: what ``cocos data features``
  gives the frozen CNN afterwards), held in memory. Augmentation on those tensors, per image: a horizontal
  flip with probability 1/2 (left and right swap their targets: :func:`cocos.data.synth_images.flip_targets`;
  the mirrored pyramid, cube and sphere are lit from the other side) and a shift of up to ``shift`` pixels
  each way (replicate padding, then a crop at a random offset). No random resized crop: it would cut
  objects out and move them across positions.
* **Schedule.** Adam with a one-cycle learning rate (``torch.optim.lr_scheduler.OneCycleLR``, peak ``lr``)
  over ``epochs`` epochs of shuffled batches of ``batch_size`` (the last one smaller). Every random draw
  (order, flips, shifts) comes from one ``torch.Generator`` seeded with ``seed``: the same seed on the
  same machine and thread count gives the same weights.
* **Output.** ``out/<cnn>-<sha256[:8]>.pth``, the model's ``state_dict()`` (torchvision's format: the
  trunk loads by name with :func:`cocos.models.cnn.load_cnn_weights`, the classifier ``fc`` of 110
  classes is dropped by it, as an ImageNet one is; ``cocos data features --cnn-weights`` reads it), named
  as torchvision names its files, so another CNN has another path; and ``out/pretrain.json``: the settings,
  the training split's fingerprint, the file's sha256, the per-epoch loss and the per-attribute accuracy
  on the dev split. Written atomically (:func:`cocos.io.atomic_dir`): a killed run leaves the previous
  folder as it was. :func:`find_pretrained` reuses a folder whose record matches the settings and the data
  and whose file still has its sha256.

Deviation from the paper's setting: the CNN is pre-trained on the demo world's own training images (3,000
rendered scenes in the demo), not on ImageNet's 1.28 million photographs; the retrieval model never sees its
labels, and the test split is never read.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from cocos.data.images import load_image_split
from cocos.data.synth_images import (
    TARGET_ATTRIBUTES,
    TARGET_POSITIONS,
    attribute_classes,
    attribute_targets,
    flip_targets,
    read_scenes,
)
from cocos.data.transforms import batch_pixel_bytes, check_image_sizes, eval_transform
from cocos.errors import CocosError
from cocos.io import atomic_dir, available_memory, check_interrupt, check_output_dir, sha256_file
from cocos.models.cnn import build_cnn, cnn_family
from cocos.progress import draws_bar, progress_bar

FORMAT = "cocos-pretrain/1"
RECORD = "pretrain.json"


@dataclass(frozen=True)
class PretrainConfig:
    """The attribute pre-training's settings (module docstring); ``device`` does not change what is recorded."""

    cnn: str = "resnet18"
    epochs: int = 30
    lr: float = 2e-3
    batch_size: int = 64
    resize: int = 37
    crop_size: int = 32
    shift: int = 2
    seed: int = 0
    device: str = field(default="cpu", compare=False)

    def settings(self) -> dict:
        """What the record keeps and reuse compares (everything but the device)."""
        return {k: v for k, v in asdict(self).items() if k != "device"}

    def validate(self) -> None:
        """One line for a setting no run could use (before anything is read or written)."""
        cnn_family(self.cnn)  # an unknown CNN
        for name, low in (("epochs", 1), ("batch_size", 1), ("shift", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise CocosError(f"pre-training: {name.replace('_', ' ')} must be an integer of at least {low}, "
                                 f"got {value!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise CocosError(f"pre-training: the learning rate must be a positive number, got {self.lr!r}")
        check_image_sizes(self.resize, self.crop_size, self.batch_size)


@dataclass
class Pretrained:
    """A pre-trained CNN on disk: its weights file and its record."""

    path: Path
    record: dict


def n_outputs() -> int:
    """The classifier's outputs: every position's classes of every attribute (5 x 22 = 110)."""
    return len(TARGET_POSITIONS) * sum(attribute_classes())


def attribute_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean over the (position, attribute) heads of the batch's mean cross-entropy (module docstring);
    ``logits`` ``(B, 110)``, ``targets`` ``(B, 5, 3)``."""
    per_position = logits.view(len(logits), len(TARGET_POSITIONS), -1)
    losses, start = [], 0
    for a, n in enumerate(attribute_classes()):
        head = per_position[:, :, start:start + n]
        losses.append(F.cross_entropy(head.reshape(-1, n), targets[:, :, a].reshape(-1), reduction="none")
                      .view(len(logits), -1).mean(0))
        start += n
    return torch.stack(losses).mean()


def attribute_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Per attribute, the share of (image, position) heads whose argmax is the target."""
    per_position = logits.view(len(logits), len(TARGET_POSITIONS), -1)
    out, start = {}, 0
    for a, n in enumerate(attribute_classes()):
        pred = per_position[:, :, start:start + n].argmax(-1)
        out[TARGET_ATTRIBUTES[a]] = float((pred == targets[:, :, a]).float().mean())
        start += n
    return out


def _pixels(data, split: str, cfg: PretrainConfig, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A split's images through the evaluation transform, ``(N, 3, c, c)``, and its targets ``(N, 5, 3)``."""
    images = load_image_split(data, split)
    targets = attribute_targets(read_scenes(data, split))
    if len(targets) != images.n_images:
        raise CocosError(f"{data}: split {split} has {images.n_images} images but {len(targets)} scene records")
    need = batch_pixel_bytes(images.n_images, cfg.crop_size)
    if need > available_memory():
        raise CocosError(f"pre-training holds the {images.n_images:,} images of split {split} at crop size "
                         f"{cfg.crop_size} in memory ({need / 2**30:,.1f} GiB), more than is available: use a "
                         "smaller crop size")
    rows = []
    with progress_bar(images.n_images, f"reading the {split} images", enabled=progress) as advance:
        for i in range(images.n_images):
            rows.append(eval_transform(images.image(i), resize=cfg.resize, crop_size=cfg.crop_size))
            advance()
    return torch.stack(rows), torch.from_numpy(targets)


def _augment(x: torch.Tensor, y: torch.Tensor, shift: int, gen: torch.Generator):
    """Flip (targets' left and right swapped) and shift each image of a batch (module docstring)."""
    flip = torch.rand(len(x), generator=gen) < 0.5
    x, y = x.clone(), y.clone()
    x[flip] = x[flip].flip(-1)
    y[flip] = flip_targets(y[flip])
    if shift:
        side = x.shape[-1]
        padded = F.pad(x, (shift,) * 4, mode="replicate")
        offsets = torch.randint(0, 2 * shift + 1, (len(x), 2), generator=gen).tolist()
        x = torch.stack([padded[i, :, dy:dy + side, dx:dx + side] for i, (dy, dx) in enumerate(offsets)])
    return x, y


def build_model(cfg: PretrainConfig) -> torch.nn.Module:
    """torchvision's ``cfg.cnn`` with a 110-class ``fc``, initialised from ``cfg.seed`` (caller's RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return build_cnn(cfg.cnn, num_classes=n_outputs())


def train_attributes(data, cfg: PretrainConfig, *, progress: bool = True,
                     log: Callable[[str], None] | None = None) -> tuple[torch.nn.Module, dict]:
    """Train the CNN on the attribute task of ``data``'s training split (module docstring); returns the model
    (eval mode, on the CPU) and what its record holds besides the settings. Where no bar is drawn
    (:func:`cocos.progress.draws_bar`: ``progress`` off, or stderr not a terminal), each epoch is a line to
    ``log`` (``epoch 3/30: loss 0.8123 (45 s)``), and a long epoch a line a minute."""
    cfg.validate()
    device = torch.device(cfg.device)
    x, y = _pixels(data, "train", cfg, progress)
    model = build_model(cfg).to(device)
    steps = -(-len(x) // cfg.batch_size)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps)
    gen = torch.Generator().manual_seed(cfg.seed)
    losses, start_time = [], time.perf_counter()
    lines = log if log is not None and not draws_bar(progress) else None
    model.train()
    with progress_bar(cfg.epochs * steps, f"pre-training {cfg.cnn} on attributes", enabled=progress,
                      fields=True, log=log) as advance:
        for epoch in range(1, cfg.epochs + 1):
            order, total = torch.randperm(len(x), generator=gen), 0.0
            for start in range(0, len(x), cfg.batch_size):
                check_interrupt()
                rows = order[start:start + cfg.batch_size]
                xb, yb = _augment(x[rows], y[rows], cfg.shift, gen)
                loss = attribute_loss(model(xb.to(device)), yb.to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                value = float(loss.detach())
                total += value * len(rows)
                advance(status=f"loss {value:.3f}")
            losses.append(round(total / len(x), 6))
            if lines is not None:
                lines(f"epoch {epoch}/{cfg.epochs}: loss {losses[-1]:.4f} ({time.perf_counter() - start_time:.0f} s)")
    model.eval().cpu()
    return model, {"epoch_loss": losses, "n_images": len(x)}


def evaluate_attributes(model: torch.nn.Module, data, cfg: PretrainConfig, split: str = "dev") -> dict[str, float]:
    """The per-attribute accuracy of ``model`` on ``split`` (evaluation transform, no augmentation)."""
    x, y = _pixels(data, split, cfg)
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(x[i:i + 256]) for i in range(0, len(x), 256)])
    model.train(was)
    return {k: round(v, 4) for k, v in attribute_accuracy(logits, y).items()}


def weights_name(cnn: str, digest: str) -> str:
    """torchvision's naming: ``<arch>-<first 8 hex digits of the file's sha256>.pth``."""
    return f"{cnn}-{digest[:8]}.pth"


def pretrain_cnn(data, out, cfg: PretrainConfig, *, progress: bool = True, log: Callable[[str], None] = print,
                 overwrite: bool = True, by: str | None = None) -> Pretrained:
    """Pre-train, evaluate on the dev split and write ``out`` atomically (module docstring).

    ``out`` is a folder of kind ``pretrain`` (:func:`cocos.io.check_output_dir`, checked before the training and
    again when it is written): absent, empty, or a pre-trained CNN folder, replaced with ``overwrite`` (or when
    ``by`` is the demo and the demo wrote it); any other folder is refused."""
    cfg.validate()
    check_output_dir(out, [data], overwrite, kind="pretrain", by=by)
    start = time.perf_counter()
    fingerprint = load_image_split(data, "train").fingerprint()
    model, info = train_attributes(data, cfg, progress=progress, log=log)
    accuracy = evaluate_attributes(model, data, cfg, "dev")
    with atomic_dir(out, [data], overwrite, kind="pretrain", by=by) as tmp:
        staged = tmp / "weights.pth"
        torch.save(model.state_dict(), staged)
        digest = sha256_file(staged)
        name = weights_name(cfg.cnn, digest)
        os.replace(staged, tmp / name)
        record = {"format": FORMAT, "settings": cfg.settings(), "train_fingerprint": fingerprint,
                  "weights": name, "sha256": digest, "classes": n_outputs(), **info, "dev_accuracy": accuracy,
                  "seconds": round(time.perf_counter() - start, 1)}
        (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    log(f"pre-trained {cfg.cnn} on the attribute task in {record['seconds']:.0f} s: dev accuracy "
        + ", ".join(f"{k} {v:.1%}" for k, v in accuracy.items()))
    return Pretrained(Path(out) / name, record)


def find_pretrained(out, cfg: PretrainConfig, fingerprint: str) -> Pretrained | None:
    """The pre-trained CNN in ``out`` when its record has exactly ``cfg``'s settings and the training split's
    ``fingerprint``, and its weights file still has the recorded sha256; else None (pre-train again)."""
    try:
        record = json.loads((Path(out) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    if record.get("settings") != cfg.settings() or record.get("train_fingerprint") != fingerprint:
        return None
    name = record.get("weights")
    if not isinstance(name, str) or name != weights_name(cfg.cnn, str(record.get("sha256"))):
        return None
    path = Path(out) / name
    try:
        if not path.is_file() or sha256_file(path) != record["sha256"]:
            return None
    except OSError:
        return None
    return Pretrained(path, record)


__all__ = ["PretrainConfig", "Pretrained", "attribute_accuracy", "attribute_loss", "build_model",
           "evaluate_attributes", "find_pretrained", "n_outputs", "pretrain_cnn", "train_attributes", "weights_name"]
