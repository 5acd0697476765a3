"""A small, deterministic synthetic image-caption world in the precomputed-feature layout.

Each image is a *scene* of 1-4 objects; an object has a shape (8), a colour (8), a
size (3) and a position (5, distinct within a scene). Its features are what a
region detector would give:

* one region vector per object: a fixed random projection (the "detector", seeded)
  of the object's attribute one-hots, plus a projection of the shape x colour outer
  product (so that the *combination* red+ball has its own direction and a bag of
  attributes cannot bind colours to shapes), plus Gaussian noise;
* background regions of random clutter (random mixes of clutter prototypes, with
  noise) filling the remaining ``R - n_objects`` slots; the region order is shuffled;
* a per-image offset shared by all its regions (lighting/style).

``regions=True`` stores ``(N, R, D)`` region features; ``regions=False`` (default)
stores ``(N, D)`` global features, the mean over the ``R`` regions.

Each image has ``k`` captions drawn from a small grammar with synonyms ("a red
ball", "there is a small crimson sphere on the left", "two objects: ...",
"on the left, a ..."). Captions are partial, as real ones are: size, position,
colour and whole objects are often left out. Shapes and colours follow a skewed
(Zipf-like) distribution, so many scenes share objects and a partial caption
matches many images: retrieval is learnable but not trivially perfect.

Everything is drawn from numpy Generators seeded by ``seed`` only (one
``SeedSequence`` spawned into independent streams for the detector and for the
scenes, features and captions of each split), so the same seed gives
byte-identical files, and the dev/test worlds do not depend on ``n_train``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cocos.data.text import tokenize
from cocos.errors import CocosError
from cocos.io import atomic_dir, available_memory, check_output_dir

FORMAT_VERSION = 1
SPLIT_NAMES = ("train", "dev", "test")
MAX_OBJECTS = 4

# canonical value -> surface words (first = canonical). No word appears twice.
SHAPES: dict[str, tuple[str, ...]] = {
    "sphere": ("sphere", "ball", "orb"),
    "cube": ("cube", "box", "block"),
    "cone": ("cone", "funnel"),
    "cylinder": ("cylinder", "tube", "pipe"),
    "pyramid": ("pyramid", "tetrahedron"),
    "torus": ("torus", "ring", "donut"),
    "star": ("star",),
    "disc": ("disc", "disk", "plate"),
}
COLOURS: dict[str, tuple[str, ...]] = {
    "red": ("red", "crimson", "scarlet"),
    "blue": ("blue", "azure", "navy"),
    "green": ("green", "emerald", "lime"),
    "yellow": ("yellow", "golden"),
    "purple": ("purple", "violet"),
    "orange": ("orange", "amber"),
    "white": ("white", "ivory"),
    "black": ("black", "dark"),
}
SIZES: dict[str, tuple[str, ...]] = {
    "small": ("small", "little", "tiny"),
    "medium": ("medium", "average"),
    "large": ("large", "big", "huge"),
}
POSITIONS: dict[str, tuple[str, ...]] = {
    "left": ("on the left", "to the left", "at the left side"),
    "right": ("on the right", "to the right", "at the right side"),
    "top": ("at the top", "near the top", "in the upper part"),
    "bottom": ("at the bottom", "near the bottom", "in the lower part"),
    "center": ("in the center", "in the middle", "at the centre"),
}
# The one word of each position phrase that names the position.
POSITION_KEYWORDS: dict[str, tuple[str, ...]] = {
    "left": ("left",),
    "right": ("right",),
    "top": ("top", "upper"),
    "bottom": ("bottom", "lower"),
    "center": ("center", "middle", "centre"),
}
_SHAPE_NAMES = tuple(SHAPES)
_COLOUR_NAMES = tuple(COLOURS)
_SIZE_NAMES = tuple(SIZES)
_POSITION_NAMES = tuple(POSITIONS)

_GENERIC_NOUNS = ("object", "thing", "shape")
_COUNT_WORDS = ("one", "two", "three", "four")
_PLURAL_NOUNS = ("objects", "things", "shapes", "items")
_LEADS = ("", "", "", "there is ", "i see ", "a picture of ", "an image with ", "this shows ")
_JOINERS = (" and ", " and ", " next to ", " with ", " as well as ")

# Probabilities that a mention of an object names each attribute.
P_SIZE, P_COLOUR, P_SHAPE, P_POSITION = 0.45, 0.85, 0.92, 0.4
# Probability of each number of objects (1..4) in a scene.
P_N_OBJECTS = (0.25, 0.35, 0.25, 0.15)

# Feature weights of the detector.
W_SHAPE, W_COLOUR, W_SIZE, W_POSITION, W_SHAPE_COLOUR = 1.0, 1.0, 0.6, 0.6, 0.8
OBJECT_NOISE, CLUTTER_NOISE, IMAGE_OFFSET = 0.6, 0.8, 0.3
N_CLUTTER_PROTOTYPES = 12


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    position: str


Scene = tuple[SceneObject, ...]


@dataclass
class SynthSplit:
    scenes: list[Scene]
    regions: np.ndarray  # (N, R, D) float32
    captions: list[str]  # k * N, captions k*i .. k*i+k-1 of image i

    @property
    def global_features(self) -> np.ndarray:
        """``(N, D)`` mean-pooled region features."""
        return self.regions.mean(axis=1, dtype=np.float64).astype(np.float32)


@dataclass
class SynthWorld:
    params: dict
    splits: dict[str, SynthSplit] = field(default_factory=dict)

    def features(self, split: str) -> np.ndarray:
        s = self.splits[split]
        return s.regions if self.params["regions"] else s.global_features


# -- scenes -------------------------------------------------------------------------------


def _zipf(n: int, a: float = 0.6) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** a
    return p / p.sum()


def _sample_scenes(rng: np.random.Generator, n: int) -> list[Scene]:
    p_shape, p_colour = _zipf(len(SHAPES)), _zipf(len(COLOURS))
    n_objects = rng.choice(np.arange(1, MAX_OBJECTS + 1), size=n, p=np.array(P_N_OBJECTS))
    scenes: list[Scene] = []
    for m in n_objects:
        shapes = rng.choice(len(SHAPES), size=m, p=p_shape)
        colours = rng.choice(len(COLOURS), size=m, p=p_colour)
        sizes = rng.integers(0, len(SIZES), size=m)
        positions = rng.permutation(len(POSITIONS))[:m]
        scenes.append(
            tuple(
                SceneObject(
                    _SHAPE_NAMES[s], _COLOUR_NAMES[c], _SIZE_NAMES[z], _POSITION_NAMES[p]
                )
                for s, c, z, p in zip(shapes, colours, sizes, positions, strict=True)
            )
        )
    return scenes


# -- features -----------------------------------------------------------------------------


def _detector(rng: np.random.Generator, dim: int) -> dict[str, np.ndarray]:
    """The fixed random projections of the "detector", shared by all splits."""
    return {
        "shape": rng.standard_normal((len(SHAPES), dim)),
        "colour": rng.standard_normal((len(COLOURS), dim)),
        "size": rng.standard_normal((len(SIZES), dim)),
        "position": rng.standard_normal((len(POSITIONS), dim)),
        "shape_colour": rng.standard_normal((len(SHAPES) * len(COLOURS), dim)),
        "clutter": rng.standard_normal((N_CLUTTER_PROTOTYPES, dim)),
    }


def _render(
    rng: np.random.Generator, scenes: list[Scene], det: dict[str, np.ndarray], n_regions: int
) -> np.ndarray:
    """``(N, R, D)`` float32 region features of the scenes."""
    n, dim = len(scenes), det["shape"].shape[1]
    # Clutter in every slot first (vectorised); object regions then take their slots.
    mix = rng.dirichlet(np.full(N_CLUTTER_PROTOTYPES, 0.3), size=(n, n_regions))
    out = mix @ det["clutter"] * 1.5 + rng.standard_normal((n, n_regions, dim)) * CLUTTER_NOISE
    offset = rng.standard_normal((n, 1, dim)) * IMAGE_OFFSET
    slots = np.argsort(rng.random((n, n_regions)), axis=1)
    obj_noise = rng.standard_normal((n, MAX_OBJECTS, dim)) * OBJECT_NOISE
    for i, scene in enumerate(scenes):
        for j, obj in enumerate(scene):
            s, c = _SHAPE_NAMES.index(obj.shape), _COLOUR_NAMES.index(obj.colour)
            out[i, slots[i, j]] = (
                W_SHAPE * det["shape"][s]
                + W_COLOUR * det["colour"][c]
                + W_SIZE * det["size"][_SIZE_NAMES.index(obj.size)]
                + W_POSITION * det["position"][_POSITION_NAMES.index(obj.position)]
                + W_SHAPE_COLOUR * det["shape_colour"][s * len(COLOURS) + c]
                + obj_noise[i, j]
            )
    out += offset
    return out.astype(np.float32)


# -- captions -----------------------------------------------------------------------------


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def _article(next_word: str) -> str:
    return "an" if next_word[:1] in "aeiou" else "a"


def _mention(rng: np.random.Generator, obj: SceneObject, allow_position: bool = True) -> str:
    """A noun phrase for one object; attributes are left out at random."""
    size = _pick(rng, SIZES[obj.size]) if rng.random() < P_SIZE else None
    colour = _pick(rng, COLOURS[obj.colour]) if rng.random() < P_COLOUR else None
    shape_named = colour is None or rng.random() < P_SHAPE
    noun = _pick(rng, SHAPES[obj.shape]) if shape_named else _pick(rng, _GENERIC_NOUNS)
    position = (
        _pick(rng, POSITIONS[obj.position])
        if allow_position and rng.random() < P_POSITION
        else None
    )
    form = rng.random()
    if colour is not None and form < 0.2:
        # noun first: "a ball that is red", "a small cube colored blue"
        head = " ".join(w for w in (size, noun) if w)
        tail = _pick(rng, ("that is", "colored", "painted", "in"))
        phrase = f"{_article(head)} {head} {tail} {colour}"
    else:
        head = " ".join(w for w in (size, colour, noun) if w)
        phrase = f"{_article(head)} {head}"
    if position is not None:
        phrase = f"{phrase} {position}"
    return phrase


def _caption(rng: np.random.Generator, scene: Scene) -> str:
    m = len(scene)
    mode = rng.random()
    if m == 1 or mode < 0.35:
        # one object (of possibly several)
        obj = scene[int(rng.integers(m))]
        if rng.random() < 0.2:
            where = _pick(rng, POSITIONS[obj.position])
            text = f"{where}, {_pick(rng, ('there is ', 'we see ', ''))}{_mention(rng, obj, False)}"
        else:
            text = _pick(rng, _LEADS) + _mention(rng, obj)
    elif mode < 0.8:
        # a list of some (at least two) of the objects, in random order
        n_said = int(rng.integers(2, m + 1))
        said = [scene[i] for i in rng.permutation(m)[:n_said]]
        parts = [_mention(rng, o) for o in said]
        text = parts[0]
        for part in parts[1:]:
            text += _pick(rng, _JOINERS) + part
        text = _pick(rng, _LEADS) + text
    else:
        # the count, then all or some of the objects
        count = f"{_COUNT_WORDS[m - 1]} {_pick(rng, _PLURAL_NOUNS)}"
        n_said = int(rng.integers(1, m + 1))
        said = [scene[i] for i in rng.permutation(m)[:n_said]]
        parts = [_mention(rng, o) for o in said]
        if n_said == m and n_said > 1:
            text = f"{count}: " + ", ".join(parts[:-1]) + " and " + parts[-1]
        else:
            text = f"{count}, {_pick(rng, ('including', 'among them', 'one of them'))} " + (
                " and ".join(parts)
            )
    if rng.random() < 0.5:
        text = text[:1].upper() + text[1:] + "."
    return text


def _captions(rng: np.random.Generator, scenes: list[Scene], k: int) -> list[str]:
    out: list[str] = []
    for scene in scenes:
        seen: set[str] = set()
        for _ in range(k):
            # prefer k distinct captions; a few tries, then accept a repeat
            for _try in range(5):
                text = _caption(rng, scene)
                if text not in seen:
                    break
            seen.add(text)
            out.append(text)
    return out


# -- the world ----------------------------------------------------------------------------


MAX_WORLD_BYTES = 8 * 2**30  # the largest synthetic world cocos generates in memory


def check_world_memory(need: int, what: str) -> None:
    """Refuse a world that needs more than ``MAX_WORLD_BYTES`` or the memory available, in one line naming it."""
    limit = min(MAX_WORLD_BYTES, available_memory())
    if need > limit:
        raise CocosError(f"{what} needs about {need / 2**30:,.1f} GiB of memory (at most {limit / 2**30:,.1f} GiB: "
                         f"{MAX_WORLD_BYTES / 2**30:.0f} GiB or the memory available); make it smaller")


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise CocosError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def generate_world(
    *,
    n_train: int = 3000,
    n_dev: int = 500,
    n_test: int = 500,
    k: int = 5,
    feature_dim: int = 256,
    n_regions: int = 6,
    regions: bool = False,
    seed: int = 0,
) -> SynthWorld:
    """Generate the synthetic world in memory (scenes, region features, captions per split)."""
    sizes = {
        "train": _check_int("n_train", n_train, 1),
        "dev": _check_int("n_dev", n_dev, 1),
        "test": _check_int("n_test", n_test, 1),
    }
    k = _check_int("k", k, 1)
    feature_dim = _check_int("feature_dim", feature_dim, 1)
    n_regions = _check_int("n_regions", n_regions, MAX_OBJECTS)
    seed = _check_int("seed", seed, 0)
    if seed >= 2**63:
        raise CocosError(f"seed must be below 2**63, got {seed}")
    # the world is built in memory (region features, float64 while generated): refuse sizes that cannot fit
    n_values = sum(sizes.values()) * n_regions * feature_dim + sum(sizes.values()) * k * 64
    check_world_memory(n_values * 8, f"a synthetic world of {sum(sizes.values()):,} images x {k:,} captions x "
                                     f"{n_regions:,} regions x {feature_dim:,} dimensions")
    params = {
        "format": "cocos-synth",
        "version": FORMAT_VERSION,
        "seed": seed,
        "n_train": sizes["train"],
        "n_dev": sizes["dev"],
        "n_test": sizes["test"],
        "k": k,
        "feature_dim": feature_dim,
        "n_regions": n_regions,
        "regions": bool(regions),
        "feature_layout": "(N, R, D) regions" if regions else "(N, D) mean of regions",
        "lexicon": {
            "shapes": list(SHAPES),
            "colours": list(COLOURS),
            "sizes": list(SIZES),
            "positions": list(POSITIONS),
        },
        "p_n_objects": list(P_N_OBJECTS),
    }
    root = np.random.SeedSequence(seed)
    det_seq, *split_seqs = root.spawn(1 + len(SPLIT_NAMES))
    det = _detector(np.random.default_rng(det_seq), feature_dim)
    world = SynthWorld(params=params)
    for name, seq in zip(SPLIT_NAMES, split_seqs, strict=True):
        scene_seq, feat_seq, cap_seq = seq.spawn(3)
        scenes = _sample_scenes(np.random.default_rng(scene_seq), sizes[name])
        feats = _render(np.random.default_rng(feat_seq), scenes, det, n_regions)
        caps = _captions(np.random.default_rng(cap_seq), scenes, k)
        world.splits[name] = SynthSplit(scenes=scenes, regions=feats, captions=caps)
    return world


def make_synthetic(
    out_dir: str | os.PathLike,
    *,
    n_train: int = 3000,
    n_dev: int = 500,
    n_test: int = 500,
    k: int = 5,
    feature_dim: int = 256,
    n_regions: int = 6,
    regions: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    by: str = "data synth",
) -> Path:
    """Write the synthetic world to ``out_dir`` in the precomputed-feature layout.

    Writes ``{train,dev,test}_ims.npy`` (float32; ``(N, R, D)`` if ``regions`` else
    ``(N, D)``), ``{train,dev,test}_caps.txt`` and ``synth.json`` (the parameters).
    The folder is built under a temporary name and moved into place at the end.
    An existing non-empty ``out_dir`` is replaced only if it is a cocos dataset and ``overwrite`` (or both it and
    this write are the demo's, ``by="demo"``): :func:`cocos.io.check_output_dir`, before the world is generated.
    """
    out = check_output_dir(out_dir, overwrite=overwrite, kind="dataset", by=by, option="output folder")
    world = generate_world(
        n_train=n_train,
        n_dev=n_dev,
        n_test=n_test,
        k=k,
        feature_dim=feature_dim,
        n_regions=n_regions,
        regions=regions,
        seed=seed,
    )
    write_world(world, out, overwrite=overwrite, by=by)
    return out


def write_world(world: SynthWorld, out_dir: str | os.PathLike, *, overwrite: bool = True,
                by: str = "data synth") -> None:
    """Write a generated world as one dataset folder, atomically (replaces a cocos dataset at ``out_dir`` with
    ``overwrite``; any other folder is refused: :func:`cocos.io.check_output_dir`)."""
    with atomic_dir(out_dir, overwrite=overwrite, kind="dataset", by=by, option="output folder") as tmp:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700; give it a normal folder's mode
        for name in SPLIT_NAMES:
            with open(tmp / f"{name}_ims.npy", "wb") as fh:
                np.save(fh, np.ascontiguousarray(world.features(name)), allow_pickle=False)
            text = "\n".join(world.splits[name].captions) + "\n"
            (tmp / f"{name}_caps.txt").write_text(text, encoding="utf-8")
        (tmp / "synth.json").write_text(
            json.dumps(world.params, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )


def mentioned_attributes(caption: str) -> dict[str, set[str]]:
    """Canonical shapes, colours, sizes and positions that a caption's words name."""

    words = set(tokenize(caption))
    found: dict[str, set[str]] = {"shape": set(), "colour": set(), "size": set(), "position": set()}
    for key, table in (("shape", SHAPES), ("colour", COLOURS), ("size", SIZES),
                       ("position", POSITION_KEYWORDS)):
        for canon, surface in table.items():
            if words.intersection(surface):
                found[key].add(canon)
    return found
