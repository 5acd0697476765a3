"""The rendered demo world: scenes of coloured shapes as real JPEG files in the VSE++ layout.

The scenes and captions are those of :mod:`cocos.data.synth` (1-4 objects; shape,
colour, size, position; partial compositional captions), here drawn as pixels instead
of region features:

* a ``size x size`` RGB image (default 64 x 64) on a grey background with a random
  tint and pixel noise; each object is drawn at its position (left, right, top, bottom,
  center) with its radius (small, medium, large) and colour, as one of eight outlines
  (sphere: disc with a highlight; cube: square with a lighter top face; cone: triangle
  on an ellipse; cylinder: rectangle with an elliptic top; pyramid: two triangular faces, one lit; torus:
  ring; star: five points; disc: flat ellipse), drawn 4x larger and downsampled (smooth
  edges); saved as JPEG (quality 90);
* **hard near-duplicates**: with probability ``p_near_duplicate`` a scene is an earlier
  scene of the same split with exactly one attribute of one object changed (its shape,
  colour, size or position), so that retrieval must look at every attribute;
* the folder holds ``images/`` and ``dataset_synth.json`` in the Karpathy format
  (``images[i]``: ``filename``, ``imgid``, ``split`` in train/val/test, ``sentences``
  with ``raw``/``tokens``/``sentid``, ``sentids``, and the ground-truth ``scene``), and
  ``synth.json`` with the parameters. :func:`cocos.data.images.load_image_split` reads it
  as layout (a).

**The attribute task** (what ``cocos demo --images`` pre-trains its CNN on; not retrieval: no caption is
read): :func:`read_scenes` gives a split's scene records (the ``scene`` of each JSON entry, in the order
:func:`cocos.data.images.load_image_split` gives the images), :func:`attribute_targets` turns them into
class targets: for each of the five positions (:data:`TARGET_POSITIONS`) and each attribute of
:data:`TARGET_ATTRIBUTES` (shape, colour, size) the class of the object at that position, ``1 + `` the
value's index in :data:`ATTRIBUTE_VALUES`, or ``0`` when no object is there; ``(N, 5, 3)`` int64. A
scene holds at most one object per position (the sampler draws distinct positions, the near-duplicate
step never moves an object onto a taken one), so the targets are well defined; a record with two
objects at one position is refused. :func:`flip_targets` gives the targets of the horizontally mirrored
images (left and right swap).

Deterministic for a seed: every random draw comes from numpy generators spawned from
``SeedSequence(seed)`` (one stream per split and purpose), and Pillow's JPEG encoder is
deterministic, so the same seed gives byte-identical files; dev/test do not depend on
``n_train``. Written into a temporary folder and moved into place at the end.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from cocos.data.synth import (
    _COLOUR_NAMES,
    _POSITION_NAMES,
    _SHAPE_NAMES,
    _SIZE_NAMES,
    SceneObject,
    _captions,
    _check_int,
    _sample_scenes,
    check_world_memory,
)
from cocos.data.text import tokenize
from cocos.errors import CocosError
from cocos.io import atomic_dir, check_output_dir
from cocos.progress import progress_bar

FORMAT_VERSION = 1
JSON_NAME = "dataset_synth.json"
# cocos split -> the Karpathy label written into the JSON
KARPATHY_LABELS = {"train": "train", "dev": "val", "test": "test"}
SUPERSAMPLE = 4
JPEG_QUALITY = 90
RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "blue": (30, 70, 220), "green": (30, 170, 50), "yellow": (240, 220, 30),
    "purple": (140, 40, 180), "orange": (245, 140, 20), "white": (250, 250, 250), "black": (15, 15, 15),
}
# object centre, as fractions of the image side
CENTRES = {"left": (0.2, 0.5), "right": (0.8, 0.5), "top": (0.5, 0.2), "bottom": (0.5, 0.8), "center": (0.5, 0.5)}
# object radius, as a fraction of the image side
RADII = {"small": 0.08, "medium": 0.12, "large": 0.17}
_ATTRIBUTES = ("shape", "colour", "size", "position")
# the attribute task (module docstring): per position, the class of each attribute of its object (0: none)
ATTRIBUTE_VALUES = {"shape": _SHAPE_NAMES, "colour": _COLOUR_NAMES, "size": _SIZE_NAMES, "position": _POSITION_NAMES}
TARGET_POSITIONS = _POSITION_NAMES  # left, right, top, bottom, center
TARGET_ATTRIBUTES = ("shape", "colour", "size")
# Memory of the world while it is generated and written (measured: about 1.2 kB per scene and 1.5 kB per caption
# with its JSON entry), rounded up: checked against the memory available before anything is drawn.
BYTES_PER_IMAGE = 2048
BYTES_PER_CAPTION = 2048


def _near_duplicates(rng: np.random.Generator, scenes: list, p: float) -> list:
    """Replace each scene, with probability ``p``, by an earlier one with one attribute of one object changed."""
    values = ATTRIBUTE_VALUES
    out = list(scenes)
    for i in range(1, len(out)):
        if rng.random() >= p:
            continue
        base = out[int(rng.integers(i))]
        j = int(rng.integers(len(base)))
        attr = _ATTRIBUTES[int(rng.integers(len(_ATTRIBUTES)))]
        taken = {o.position for o in base} if attr == "position" else {getattr(base[j], attr)}
        choices = [v for v in values[attr] if v not in taken]
        if not choices:  # every position is taken (cannot happen with 4 objects and 5 positions)
            continue
        fields = {a: getattr(base[j], a) for a in _ATTRIBUTES}
        fields[attr] = choices[int(rng.integers(len(choices)))]
        out[i] = base[:j] + (SceneObject(**fields),) + base[j + 1:]
    return out


def _lighter(rgb: tuple[int, int, int], amount: float = 0.45) -> tuple[int, int, int]:
    return tuple(int(round(c + (255 - c) * amount)) for c in rgb)


def _star(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        rad = r if k % 2 == 0 else r * 0.45
        a = -math.pi / 2 + k * math.pi / 5
        pts.append((cx + rad * math.cos(a), cy + rad * math.sin(a)))
    return pts


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, side: int) -> None:
    """Draw one object on a ``side x side`` canvas."""
    cx, cy = (f * side for f in CENTRES[obj.position])
    r = RADII[obj.size] * side
    col, light = RGB[obj.colour], _lighter(RGB[obj.colour])
    shape = obj.shape
    if shape == "sphere":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=col)
        draw.ellipse((cx - 0.55 * r, cy - 0.55 * r, cx - 0.1 * r, cy - 0.1 * r), fill=light)
    elif shape == "disc":
        draw.ellipse((cx - r, cy - 0.45 * r, cx + r, cy + 0.45 * r), fill=col)
    elif shape == "cube":
        draw.rectangle((cx - 0.8 * r, cy - 0.6 * r, cx + 0.8 * r, cy + 0.9 * r), fill=col)
        draw.polygon([(cx - 0.8 * r, cy - 0.6 * r), (cx - 0.4 * r, cy - r), (cx + r, cy - r),
                      (cx + 0.8 * r, cy - 0.6 * r)], fill=light)
    elif shape == "cone":
        draw.ellipse((cx - 0.8 * r, cy + 0.6 * r, cx + 0.8 * r, cy + r), fill=col)
        draw.polygon([(cx, cy - r), (cx - 0.8 * r, cy + 0.8 * r), (cx + 0.8 * r, cy + 0.8 * r)], fill=col)
    elif shape == "cylinder":
        draw.rectangle((cx - 0.6 * r, cy - 0.7 * r, cx + 0.6 * r, cy + 0.8 * r), fill=col)
        draw.ellipse((cx - 0.6 * r, cy - r, cx + 0.6 * r, cy - 0.4 * r), fill=light)
    elif shape == "pyramid":  # two faces: the right one lit
        draw.polygon([(cx, cy - r), (cx - r, cy + 0.8 * r), (cx + 0.2 * r, cy + 0.8 * r)], fill=col)
        draw.polygon([(cx, cy - r), (cx + 0.2 * r, cy + 0.8 * r), (cx + r, cy + 0.8 * r)], fill=light)
    elif shape == "torus":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=col, width=max(1, int(round(0.4 * r))))
    elif shape == "star":
        draw.polygon(_star(cx, cy, r), fill=col)
    else:
        raise CocosError(f"no drawing for shape {shape!r}")


def render_scene(scene, rng: np.random.Generator, size: int = 64) -> Image.Image:
    """The RGB image of one scene: tinted grey background with noise, then the objects."""
    side = size * SUPERSAMPLE
    tint = rng.integers(-20, 21, size=3)
    background = tuple(int(v) for v in np.clip(128 + tint, 0, 255))
    canvas = Image.new("RGB", (side, side), background)
    draw = ImageDraw.Draw(canvas)
    for obj in scene:
        _draw_object(draw, obj, side)
    small = canvas.resize((size, size), Image.BOX)
    noise = rng.normal(0.0, 6.0, size=(size, size, 3))
    pixels = np.clip(np.asarray(small, dtype=np.float64) + noise, 0, 255).round().astype(np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def _scene_json(scene) -> list[dict]:
    return [{a: getattr(o, a) for a in _ATTRIBUTES} for o in scene]


def generate_image_world(*, n_train: int = 1000, n_dev: int = 200, n_test: int = 200, k: int = 5,
                         seed: int = 0, p_near_duplicate: float = 0.3) -> dict:
    """Scenes and captions of every split (nothing rendered yet): ``{split: (scenes, captions)}``."""
    sizes = {"train": _check_int("n_train", n_train, 1), "dev": _check_int("n_dev", n_dev, 1),
             "test": _check_int("n_test", n_test, 1)}
    k = _check_int("k", k, 1)
    seed = _check_int("seed", seed, 0)
    if seed >= 2**63:
        raise CocosError(f"seed must be below 2**63, got {seed}")
    if not 0.0 <= float(p_near_duplicate) <= 1.0:
        raise CocosError(f"p_near_duplicate must be in [0, 1], got {p_near_duplicate}")
    n = sum(sizes.values())
    check_world_memory(n * (BYTES_PER_IMAGE + k * BYTES_PER_CAPTION),
                       f"a rendered synthetic world of {n:,} images x {k:,} captions")
    world = {}
    for name, seq in zip(KARPATHY_LABELS, np.random.SeedSequence(seed).spawn(len(KARPATHY_LABELS)), strict=True):
        scene_seq, dup_seq, cap_seq, pix_seq = seq.spawn(4)
        scenes = _sample_scenes(np.random.default_rng(scene_seq), sizes[name])
        scenes = _near_duplicates(np.random.default_rng(dup_seq), scenes, float(p_near_duplicate))
        captions = _captions(np.random.default_rng(cap_seq), scenes, k)
        world[name] = (scenes, captions, pix_seq)
    return world


def make_synthetic_images(out_dir: str | os.PathLike, *, n_train: int = 1000, n_dev: int = 200,
                          n_test: int = 200, k: int = 5, image_size: int = 64, seed: int = 0,
                          p_near_duplicate: float = 0.3, overwrite: bool = False,
                          progress: bool = True, by: str = "data synth") -> Path:
    """Render the world into ``out_dir`` (``images/``, ``dataset_synth.json``, ``synth.json``), atomically.

    An existing non-empty ``out_dir`` is replaced only if it is a cocos dataset and ``overwrite`` (or both it and
    this write are the demo's, ``by="demo"``: :func:`cocos.io.check_output_dir`), and only once the new folder is
    complete.
    """
    out = Path(out_dir)
    image_size = _check_int("image_size", image_size, 8)
    if image_size > 1024:
        raise CocosError(f"image_size must be at most 1024, got {image_size}")
    check_output_dir(out, overwrite=overwrite, kind="dataset", by=by, option="output folder")
    world = generate_image_world(n_train=n_train, n_dev=n_dev, n_test=n_test, k=k, seed=seed,
                                 p_near_duplicate=p_near_duplicate)
    total = sum(len(scenes) for scenes, _, _ in world.values())
    entries, sent_id = [], 0
    with atomic_dir(out, overwrite=overwrite, kind="dataset", by=by, option="output folder") as tmp, \
            progress_bar(total, "rendering images", enabled=progress) as advance:
        (tmp / "images").mkdir()
        for name, (scenes, captions, pix_seq) in world.items():
            rng = np.random.default_rng(pix_seq)
            for i, scene in enumerate(scenes):
                filename = f"synth_{name}_{i:06d}.jpg"
                render_scene(scene, rng, image_size).save(tmp / "images" / filename, "JPEG", quality=JPEG_QUALITY)
                imgid = len(entries)
                sentences = [{"raw": text, "tokens": tokenize(text), "imgid": imgid, "sentid": sent_id + j}
                             for j, text in enumerate(captions[k * i:k * (i + 1)])]
                entries.append({"filename": filename, "imgid": imgid, "split": KARPATHY_LABELS[name],
                                "sentences": sentences, "sentids": [s["sentid"] for s in sentences],
                                "scene": _scene_json(scene)})
                sent_id += len(sentences)
                advance()
        (tmp / JSON_NAME).write_text(json.dumps({"dataset": "cocos-synth-images", "images": entries}) + "\n",
                                     encoding="utf-8")
        params = {"format": "cocos-synth-images", "version": FORMAT_VERSION, "seed": seed, "n_train": n_train,
                  "n_dev": n_dev, "n_test": n_test, "k": k, "image_size": image_size,
                  "p_near_duplicate": p_near_duplicate, "jpeg_quality": JPEG_QUALITY}
        (tmp / "synth.json").write_text(json.dumps(params, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


# -- the attribute task (module docstring) ---------------------------------------------------------

def attribute_classes() -> tuple[int, ...]:
    """The number of classes of each target attribute (its values and "no object"): ``(9, 9, 4)``."""
    return tuple(1 + len(ATTRIBUTE_VALUES[a]) for a in TARGET_ATTRIBUTES)


def _scene_object(record, where: str) -> SceneObject:
    if not isinstance(record, dict):
        raise CocosError(f"{where}: a scene object must be a JSON object, got {type(record).__name__}")
    fields = {}
    for attr in _ATTRIBUTES:
        value = record.get(attr)
        if value not in ATTRIBUTE_VALUES[attr]:
            raise CocosError(f"{where}: {attr} {value!r} is not one of {', '.join(ATTRIBUTE_VALUES[attr])}")
        fields[attr] = value
    return SceneObject(**fields)


def read_scenes(folder: str | os.PathLike, split: str) -> list[tuple[SceneObject, ...]]:
    """The scene records of ``split`` (``train``, ``dev`` or ``test``) of a rendered world, in the order of its
    images (:func:`cocos.data.images.load_image_split`: the JSON's entries of that split, in file order).

    A folder without ``dataset_synth.json``, or whose entries lack a well-formed ``scene`` (a raw-image
    dataset that cocos did not render), is one :class:`CocosError` line."""
    if split not in KARPATHY_LABELS:
        raise CocosError(f"unknown split {split!r} (choose from {', '.join(KARPATHY_LABELS)})")
    path = Path(folder) / JSON_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise CocosError(f"{path}: cannot read the rendered world's scene records ({reason}); the attribute "
                         "task needs a world made by cocos data synth --images") from None
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CocosError(f"{path}: expected a JSON object with an 'images' list")
    scenes = []
    for pos, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("split") != KARPATHY_LABELS[split]:
            continue
        objects = entry.get("scene")
        if not isinstance(objects, list) or not objects:
            raise CocosError(f"{path}: image {pos} has no scene record (a world made by cocos data synth --images "
                             "has one per image)")
        scenes.append(tuple(_scene_object(o, f"{path}: image {pos}") for o in objects))
    if not scenes:
        raise CocosError(f"{path}: no images of split {split}")
    return scenes


def attribute_targets(scenes) -> np.ndarray:
    """``(N, 5, 3)`` int64 class targets of the attribute task (module docstring): ``[i, p, a]`` is ``1 +`` the
    index of attribute ``TARGET_ATTRIBUTES[a]`` of scene ``i``'s object at position ``TARGET_POSITIONS[p]``,
    ``0`` where there is none."""
    out = np.zeros((len(scenes), len(TARGET_POSITIONS), len(TARGET_ATTRIBUTES)), dtype=np.int64)
    for i, scene in enumerate(scenes):
        for obj in scene:
            p = TARGET_POSITIONS.index(obj.position)
            if out[i, p].any():
                raise CocosError(f"scene {i}: two objects at position {obj.position}; the attribute task needs "
                                 "at most one per position")
            out[i, p] = [1 + ATTRIBUTE_VALUES[a].index(getattr(obj, a)) for a in TARGET_ATTRIBUTES]
    return out


def flip_targets(targets: np.ndarray) -> np.ndarray:
    """The targets of the horizontally mirrored images: the rows of ``left`` and ``right`` swapped (works on a
    torch tensor too)."""
    order = [TARGET_POSITIONS.index({"left": "right", "right": "left"}.get(p, p)) for p in TARGET_POSITIONS]
    return targets[:, order]
