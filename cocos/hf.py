"""Hugging Face model folders on disk: told apart without importing torch (what a command asks of its arguments
before anything heavy is loaded: a folder's ``config.json`` names its ``model_type``), and read completely or not
at all.

**JSON** (:func:`read_json`): a file of at most ``max_bytes`` (1 MiB for a ``config.json``, 64 MiB for a tokenizer
file), UTF-8, one JSON object nested at most :data:`MAX_JSON_DEPTH` deep; anything else is one line.

**Sizes** (:func:`config_int`, :func:`check_layers`, :func:`check_memory`): every size a model's ``config.json``
states is a positive integer (``"seventy"`` is one line naming the key), a tower has at most :data:`MAX_LAYERS`
layers, and the parameters the sizes imply (a count each model family estimates) fit in the memory available
(:func:`cocos.io.available_memory`), with :data:`LAYER_BYTES` of Python objects per layer on top: all checked
before anything is built.

**Weights** (:func:`read_weights`): ``model.safetensors`` or ``pytorch_model.bin`` (or their sharded index) read by
cocos itself, never by code from the file: safetensors' header (names, dtypes, shapes) is checked before any tensor
is read; a torch file is loaded with ``weights_only`` (:func:`cocos.safeload.load_torch_file`). Every tensor the
model built from ``config.json`` expects must be there (under its own name, behind the model's
``base_prefix`` such as ``bert.``, or with a ``LayerNorm.gamma``/``beta`` name of older files), of its shape,
floating point where the model's is (int64 zeros are not weights), finite; tensors the model does not have (a
pre-training head, old ``position_ids`` buffers) are left out. Anything else is one line naming the file and the
tensor: nothing is initialised at random.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from cocos.errors import CocosError

MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20  # tokenizer.json, vocab.json, merges.txt, vocab.txt
TOKEN_BYTES = 1 << 10  # a tokenizer file holds at most this many bytes per entry of the vocabulary (+ 1 MiB)
MAX_JSON_DEPTH = 64
MAX_LAYERS = 1000  # no published transformer has more; building a million empty layers takes hours
MAX_VOCAB = 1 << 20  # entries of a vocabulary (the largest published ones have about 256,000)
LAYER_BYTES = 1 << 16  # the Python objects of one transformer layer (its modules, parameters, dicts), about
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SAFE_NAME = re.compile(r"[\w.-]+")


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]


def json_depth(obj, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a parsed JSON value (a scalar 0, ``[]`` 1), counted without recursion and stopping
    once it exceeds ``limit``."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(path: str | os.PathLike, what: str = "configuration", max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON object of at most ``max_bytes`` bytes nested at most :data:`MAX_JSON_DEPTH` deep; one line for a
    missing, large, non-UTF-8, non-JSON, deeper or non-object file."""
    path = Path(path)
    if not path.is_file():
        raise CocosError(f"{path}: missing")
    size = path.stat().st_size
    if size > max_bytes:
        raise CocosError(f"{path}: {size:,} bytes, too large for a {what} (at most {max_bytes:,})")
    try:
        out = json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError:
        raise CocosError(f"{path}: nested too deeply for a {what}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CocosError(f"{path}: not JSON ({_first(exc)})") from None
    if not isinstance(out, dict):
        raise CocosError(f"{path}: not a JSON object")
    if json_depth(out) > MAX_JSON_DEPTH:
        raise CocosError(f"{path}: nested more than {MAX_JSON_DEPTH} deep, too deep for a {what}")
    return out


def check_file_size(path: Path, entries: int | None, what: str) -> None:
    """A tokenizer file of at most :data:`MAX_TOKENIZER_BYTES`, and of at most :data:`TOKEN_BYTES` per entry of the
    ``entries`` its model's config states (+ 1 MiB; None: no config to read them from): one line before it is
    parsed."""
    size = path.stat().st_size
    if entries is None:
        if size > MAX_TOKENIZER_BYTES:
            raise CocosError(f"{path}: {size:,} bytes, too large for a {what} (at most {MAX_TOKENIZER_BYTES:,})")
        return
    limit = min(MAX_TOKENIZER_BYTES, (1 << 20) + TOKEN_BYTES * entries)
    if size > limit:
        raise CocosError(f"{path}: {size:,} bytes, too large for the {what} of a vocabulary of {entries:,} entries "
                         f"(at most {limit:,})")


def config_int(config: Mapping, key: str, where: str, default: int | None = None, minimum: int = 1,
               prefix: str = "") -> int:
    """``config[key]``, an integer of at least ``minimum`` (``default`` where absent or null); one line naming
    ``where`` and the key (behind ``prefix``, ``text_config.``) otherwise: a string, a float, a bool, an integer of
    5,000 digits."""
    value = config.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < 2**53:
        shown = repr(value)[:80] if not isinstance(value, int) or abs(value) < 10**20 else "a huge integer"
        raise CocosError(f"{where}: {prefix}{key} must be an integer of at least {minimum}, got {shown}")
    return value


def check_layers(layers: int, where: str, key: str = "num_hidden_layers") -> None:
    """At most :data:`MAX_LAYERS` layers (building a module per layer takes time no memory check sees)."""
    if layers > MAX_LAYERS:
        raise CocosError(f"{where}: {key} {layers:,} is more than the {MAX_LAYERS:,} layers cocos builds")


def check_vocab(entries: int, where: str, key: str = "vocab_size") -> None:
    """At most :data:`MAX_VOCAB` entries (a tokenizer's own tables cost far more per entry than the embedding)."""
    if entries > MAX_VOCAB:
        raise CocosError(f"{where}: {key} {entries:,} is more than the {MAX_VOCAB:,} entries of a vocabulary cocos "
                         "reads")


def check_heads(hidden: int, heads: int, where: str, prefix: str = "") -> None:
    """``hidden`` a multiple of ``heads`` (each attention head takes an equal slice)."""
    if hidden % heads:
        raise CocosError(f"{where}: {prefix}hidden_size {hidden} is not a multiple of {prefix}num_attention_heads "
                         f"{heads}")


def check_memory(parameters: int, layers: int, copies: int, where: str, what: str, purpose: str = "") -> None:
    """``copies`` float32 copies of ``parameters`` weights and :data:`LAYER_BYTES` per layer fit in the memory
    available; one line before anything is built, not an allocation failure (or the OOM killer) later."""
    from cocos.io import available_memory

    need = 4 * copies * parameters + LAYER_BYTES * layers
    available = available_memory()
    if need > available:
        purpose = f" {purpose}" if purpose else ""
        raise CocosError(f"{where}: {what} of about {parameters / 1e6:,.0f}M parameters and {layers:,} layers needs "
                         f"at least {need / 2**30:,.1f} GB{purpose}, more than the {available / 2**30:,.1f} GB of "
                         "memory available")


def model_type(folder: str | os.PathLike) -> str | None:
    """The ``model_type`` of a folder's ``config.json``; None for anything else (not a folder, no ``config.json``, no
    ``model_type`` string in it). A folder whose ``config.json`` cannot be read as one (too large, nested too deeply,
    not a JSON object) is one line (:func:`read_json`): it was meant as a model folder."""
    folder = Path(folder)
    try:
        if not folder.is_dir() or not (folder / "config.json").is_file():
            return None
    except OSError:
        return None
    value = read_json(folder / "config.json").get("model_type")
    return value if isinstance(value, str) else None


def is_clip_folder(folder: str | os.PathLike) -> bool:
    """A folder whose ``config.json`` says ``model_type: clip`` (a Hugging Face ``CLIPModel``)."""
    return model_type(folder) == "clip"


def is_siglip_folder(folder: str | os.PathLike) -> bool:
    """A folder whose ``config.json`` says ``model_type: siglip`` (a Hugging Face ``SiglipModel``)."""
    return model_type(folder) == "siglip"


# -- weights --------------------------------------------------------------------------------------------------


def weights_files(folder: Path) -> list[Path]:
    """The folder's weights: ``model.safetensors`` or ``pytorch_model.bin``, else the shards its index names."""
    for name in WEIGHTS:
        if (folder / name).is_file():
            return [folder / name]
    for name in INDEXES:
        if (folder / name).is_file():
            return _index_shards(folder, name)
    raise CocosError(f"{folder}: no weights ({' or '.join(WEIGHTS)})")


def _index_shards(folder: Path, name: str) -> list[Path]:
    """The shards a sharded index ``name`` (``weight_map``: tensor -> file) names, each a plain file of the folder
    (no path, no hidden name: an index is read as data, never as a pointer elsewhere); one line otherwise."""
    weight_map = read_json(folder / name, "weights index", MAX_TOKENIZER_BYTES).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CocosError(f"{folder / name}: no weight_map")
    shards = sorted(set(weight_map.values()), key=str)
    bad = [s for s in shards if not isinstance(s, str) or not SAFE_NAME.fullmatch(s) or s.startswith(".")]
    if bad:
        raise CocosError(f"{folder / name}: names {bad[0]!r}, not a file of the folder")
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise CocosError(f"{folder / missing[0]}: missing (named by {name})")
    return [folder / s for s in shards]


def _target(key: str, expected: Mapping, base_prefix: str) -> str | None:
    """The model's name for a stored tensor ``key``: itself, without ``base_prefix``, or with an older file's
    ``LayerNorm.gamma``/``.beta``; None for a tensor the model does not have."""
    names = [key, key[len(base_prefix):]] if base_prefix and key.startswith(base_prefix) else [key]
    for name in names:
        for candidate in (name, name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                                            "LayerNorm.bias")):
            if candidate in expected:
                return candidate
    return None


def _safetensors(path: Path, expected: Mapping, base_prefix: str) -> dict:
    """``{model name: (stored dtype is floating, shape, loader)}`` from a safetensors header (no tensor read)."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise CocosError("reading model.safetensors needs the safetensors library: pip install safetensors") from None
    try:
        handle = safe_open(str(path), framework="pt")
        found = {}
        for key in handle.keys():  # noqa: SIM118 - a safetensors handle is not a mapping
            target = _target(key, expected, base_prefix)
            if target is None or (target in found and target != key):
                continue
            piece = handle.get_slice(key)
            floating = piece.get_dtype().startswith(("F", "BF"))
            found[target] = (floating, piece.get_dtype(), tuple(piece.get_shape()),
                             lambda key=key: handle.get_tensor(key))
    except CocosError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' SafetensorError and whatever else a damaged file raises
        raise CocosError(f"{path}: is damaged, not a safetensors file ({_first(exc)})") from None
    return found


def _torch_file(path: Path, expected: Mapping, base_prefix: str, budget: int) -> dict:
    """The same from a ``weights_only`` torch file (the whole file is read: at most ``budget`` bytes)."""
    from cocos.safeload import UnsafeCheckpointError, load_torch_file

    if path.stat().st_size > budget:
        raise CocosError(f"{path}: {path.stat().st_size:,} bytes, more than a model of its config.json's sizes "
                         f"holds (at most {budget:,})")
    try:
        obj = load_torch_file(path, what="weights file", advice="cocos never runs code from a file")
    except UnsafeCheckpointError as exc:
        named = re.search(r"refers to (\S+),", str(exc))
        raise CocosError(f"{path}: holds code or objects that cocos does not load"
                         f"{f' ({named.group(1)})' if named else ''}; cocos never runs code from a file") from None
    import torch

    if not isinstance(obj, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                               for k, v in obj.items()):
        raise CocosError(f"{path}: not a state dict (names and tensors)")
    found = {}
    for key, tensor in obj.items():
        target = _target(key, expected, base_prefix)
        if target is not None and (target not in found or target == key):
            found[target] = (tensor.dtype.is_floating_point, str(tensor.dtype).removeprefix("torch."),
                             tuple(tensor.shape), lambda tensor=tensor: tensor)
    return found


def read_weights(folder: str | os.PathLike, expected: Mapping, *, what: str, base_prefix: str = "",
                 unused: tuple[str, ...] = ()) -> dict:
    """The state dict of a Hugging Face folder for a model whose own state dict is ``expected`` (module
    docstring): every tensor present, of its shape and dtype kind, finite, cast to the model's dtype; one line
    naming the file and the tensor otherwise. ``unused``: name prefixes of tensors no output of the model reads
    (BERT's pooler in VSE∞, which reads the last hidden states): where the folder has none they are zeros, never
    left at a random initialisation."""
    import torch

    folder = Path(folder)
    found = _stored(weights_files(folder), expected, base_prefix)
    zeros = {k: torch.zeros_like(v) for k, v in expected.items() if k not in found and unused and k.startswith(unused)}
    missing = [k for k in expected if k not in found and k not in zeros]
    if missing:
        raise CocosError(f"{folder}: its {what} weights lack {missing[0]} ({len(missing)} of {len(expected)} tensors "
                         "missing); cocos loads a model completely or not at all")
    wanted = {k: v for k, v in expected.items() if k not in zeros}
    for key, want in wanted.items():
        _check_stored(key, found[key], want)
    state = dict(zeros)
    for key, want in wanted.items():
        state[key] = _load_stored(key, found[key], want)
    return state


def _stored(files: list[Path], expected: Mapping, base_prefix: str) -> dict:
    """``{model name: (file, stored dtype is floating, dtype, shape, loader)}`` over every weights file (a later
    shard's tensor replaces an earlier one's). A torch file is read whole, so it may hold at most 8 bytes per weight
    of ``expected`` (float64) and 64 MiB beside (a pre-training head the model does not have)."""
    numel = sum(int(t.numel()) for t in expected.values())
    budget = 8 * numel + (64 << 20)
    found: dict = {}
    for path in files:
        part = (_safetensors(path, expected, base_prefix) if path.suffix == ".safetensors"
                else _torch_file(path, expected, base_prefix, budget))
        found.update({k: (path, *v) for k, v in part.items()})
    return found


def _check_stored(key: str, stored: tuple, want) -> None:
    """A stored tensor of the model's shape and dtype kind (floating point or integer: int64 zeros are not weights),
    checked from the header before any tensor is read; one line naming the file and the tensor otherwise."""
    path, floating, dtype, shape, _ = stored
    if shape != tuple(want.shape):
        raise CocosError(f"{path}: {key} has shape {shape}, its config.json says {tuple(want.shape)}")
    if floating != want.dtype.is_floating_point:
        kind = "floating point" if want.dtype.is_floating_point else "integer"
        raise CocosError(f"{path}: {key} is stored as {dtype}; the model's is {kind} "
                         f"({str(want.dtype).removeprefix('torch.')})")


def _load_stored(key: str, stored: tuple, want):
    """A stored tensor read, finite where floating point, and cast to the model's dtype; one line naming the file
    and the tensor for a damaged payload or a NaN or Inf."""
    import torch

    path, load = stored[0], stored[-1]
    try:
        tensor = load()
    except Exception as exc:  # noqa: BLE001 - a damaged tensor payload
        raise CocosError(f"{path}: is damaged ({key}: {_first(exc)})") from None
    if tensor.dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
        raise CocosError(f"{path}: {key} holds NaN or Inf")
    return tensor.to(want.dtype)


__all__ = ["MAX_CONFIG_BYTES", "MAX_LAYERS", "MAX_TOKENIZER_BYTES", "MAX_VOCAB", "check_file_size", "check_heads",
           "check_layers", "check_memory", "check_vocab", "config_int", "is_clip_folder", "is_siglip_folder",
           "json_depth", "model_type", "quiet_transformers", "read_json", "read_weights", "weights_files"]


def quiet_transformers(install: str):
    """``transformers``, its warnings and progress bars off (a Hub config's out-of-vocabulary ``bos_token_id`` is
    a warning of every load), or the one line ``install`` naming the extra to install."""
    try:
        import transformers
    except ImportError:
        raise CocosError(install) from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers
