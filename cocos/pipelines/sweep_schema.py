"""The grid file of ``cocos sweep``: its TOML read with bounds, every table and value checked for its type, and
expanded to one run per (model, loss, seed) with the settings ``cocos train`` would validate.

A grid names its data, its models, the loss families with their parameters, the seeds, the shared training
settings ``[train]`` (the flat names of ``cocos train``'s settings, :func:`cocos.training.config.names`) and the
analysis ``[analyze]``. ``models`` is a model name, an array of names, or ``[[models]]`` tables (``name``, and
optionally ``id``: the runs' name prefix, ``data``: the model's own data, ``train``: its own settings), so one
grid holds models on precomputed features and on raw images (GOAL's Table 5: VSE∞ on BUTD regions and on
WSL grids). A run's settings are ``[train]``, then its model's ``train``, then its loss's ``train``, then the
family's recipe for what none of them sets. A pre-trained source (``bert``, ``clip``, or one entry of
``sources``: whatever the model families declare, :attr:`cocos.models.family.ModelFamily.sources`) given in
``[train]`` or a loss's ``train`` goes only to the runs whose model takes it (a grid of VSE∞ and VSE++ shares a
``bert``); one given in a model's own ``train`` stays, so a wrong one is refused as ``cocos train`` refuses it.

Every fault is one :class:`~cocos.errors.CocosError` line naming the file, the table and the key.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from cocos.data.precomp import SPLIT_ALIASES
from cocos.defaults import DEFAULT_EPS
from cocos.errors import CocosError
from cocos.models.registry import families, get_family
from cocos.objectives import get_objective
from cocos.training.config import LOSS_FLAT, TrainConfig, names, record_type
from cocos.training.trainer import with_recipe

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TOP_KEYS = {"name", "data", "models", "seeds", "train", "analyze", "loss", "reports", "checkpoints", "slurm"}
LOSS_KEYS = {"name", "id", "params", "train"}
MODEL_KEYS = {"name", "id", "data", "train"}  # a [[models]] table
RUN_KEYS = {"data", "model", "loss", "out", "seed", "params"}  # set by the grid itself, not by [train]
ANALYZE_KEYS = {"batch_size", "split", "compat", "eps"}
SLURM_KEYS = {"partition", "time", "gpus", "mem_gb", "cpus", "array_parallelism"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
GRID_BYTES = 1 << 20  # a grid file is a few hundred bytes of TOML; anything over 1 MB is not one
INT64 = 2**63  # TOML integers are 64-bit signed (tomllib itself reads any length)
KINDS = {"str": "a string", "int": "an integer", "num": "a finite number", "bool": "true or false",
         "table": "a table"}

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict = 2, 4, 4


@dataclass
class SweepRun:
    """One (model, loss, seed): its name, its cocos train settings and its analysis settings."""

    name: str
    train: dict  # TrainConfig fields
    analyze: dict
    label: str | None = None
    report: str = ""  # its results folder
    fingerprint: str | None = None  # its data's fingerprint, once the sweep's plan has computed it


@dataclass
class Grid:
    """A checked grid: its runs and where they write (``data``: the top-level data, "" when each model has its own)."""

    name: str
    data: str
    runs: list[SweepRun]
    reports: Path
    checkpoints: Path
    slurm: dict = field(default_factory=dict)
    source: str = ""  # the grid file, named in errors

    @property
    def report_dir(self) -> Path:
        return self.reports / self.name

    @property
    def summary(self) -> Path:
        return self.report_dir / "summary"

    @property
    def inputs(self) -> list[str]:
        """Every data path the runs read, each once, in the order of the runs."""
        return list(dict.fromkeys(run.train["data"] for run in self.runs))


@dataclass(frozen=True)
class ModelEntry:
    """One model of a grid: the runs' name prefix, the model family, its own data (None: the grid's) and settings."""

    ident: str
    name: str
    data: str | None = None
    train: dict = field(default_factory=dict)


def _shown(value) -> str:
    """A value for an error line: short, one line, whatever its size or nesting."""
    if isinstance(value, dict):
        return "a table"
    return _REPR.repr(value)


def _is(value, kind: str) -> bool:
    """Whether a TOML value is of a kind (see KINDS): integers are not booleans, numbers are finite, strings
    hold no NUL (no path or name can), integers fit 64 bits."""
    if kind == "str":
        return isinstance(value, str) and "\0" not in value
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value < INT64
    if kind == "num":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return (-INT64 <= value < INT64) if isinstance(value, int) else math.isfinite(value)
    if kind == "bool":
        return isinstance(value, bool)
    return isinstance(value, dict)


def _expect(where: str, value, kind: str, what: str | None = None):
    """``value`` if it is of ``kind``; else one line: ``<where>: expected <what>, got <value>``."""
    if not _is(value, kind):
        raise CocosError(f"{where}: expected {what or KINDS[kind]}, got {_shown(value)}")
    return value


def _unknown(where: str, given, allowed) -> None:
    extra = sorted(set(given) - set(allowed))
    if extra:
        raise CocosError(f"{where}: unknown key{'s' if len(extra) > 1 else ''} {', '.join(extra)} "
                         f"(allowed: {', '.join(sorted(allowed))})")


def _train_kinds() -> dict[str, str | None]:
    """The keys of [train]: every flat name :meth:`TrainConfig.of` takes (:func:`cocos.training.config.names`, and
    the record's spellings of sources, ``bert``, ``clip``: :func:`cocos.training.config.record_type`) but those the
    grid sets itself, each with the kind of its record field, as cocos train's option parses it (``X | None``: the
    key may be left out; a name of another type, or of no record field, is left to ``validate``)."""
    base = {"int": "int", "float": "num", "str": "str", "bool": "bool"}
    typed = {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
             for f in fields(record_type())}
    return {name: base.get(typed.get(name, "").split("|")[0].strip())
            for name in dict.fromkeys([*names(), *typed]) if name not in RUN_KEYS and name not in LOSS_FLAT}


def _train_table(where: str, table) -> dict:
    """A [train] table, or a loss's ``train = {...}``: a table of known keys, each of its option's type."""
    _expect(where, table, "table", "a table of cocos train options")
    kinds = _train_kinds()
    _unknown(where, table, kinds)
    for key, value in table.items():
        if kinds[key] is not None:
            _expect(f"{where} {key}", value, kinds[key])
    return dict(table)


def _analyze_table(where: str, table) -> dict:
    """[analyze] as cocos analyze takes its options: batch_size a positive integer (default: the training one),
    split a split name (whether the data has it: check_inputs), compat true or false, eps a finite number >= 0.
    The split is stored normalised (``val`` -> ``dev``), as the analysis records it."""
    _expect(f"{where}: analyze", table, "table", "a table [analyze] of cocos analyze options")
    _unknown(f"{where}: [analyze]", table, ANALYZE_KEYS)
    what = {"batch_size": ("int", "a positive integer (default: the training batch size)"),
            "split": ("str", "a split name: train, dev or test"), "compat": ("bool", None),
            "eps": ("num", "a finite number >= 0")}
    out = {"batch_size": None, "split": "test", "compat": False, "eps": DEFAULT_EPS}
    for key, value in table.items():
        out[key] = _expect(f"{where}: [analyze] {key}", value, *what[key])
    if out["batch_size"] is not None and out["batch_size"] < 1:
        raise CocosError(f"{where}: [analyze] batch_size: expected {what['batch_size'][1]}, got {out['batch_size']}")
    if out["eps"] < 0:
        raise CocosError(f"{where}: [analyze] eps: expected {what['eps'][1]}, got {out['eps']}")
    split = out["split"]
    if not split or not split.replace("_", "").isalnum():
        raise CocosError(f"{where}: [analyze] split: expected {what['split'][1]}, got {_shown(split)}")
    out["split"] = SPLIT_ALIASES.get(split.lower(), split.lower())
    return out


def check_slurm(values: dict, name: Callable[[str], str]) -> None:
    """Slurm settings (a grid's [slurm] table, or the command line's options; ``None`` = not given): partition a
    string, time ``HH:MM:SS``, ``D-HH:MM:SS`` or minutes (at least one), gpus an integer >= 0, mem_gb, cpus and
    array_parallelism integers >= 1. ``name(key)`` says where a key came from in the error line."""
    for key, value in values.items():
        if value is None:
            continue
        if key == "partition":
            _expect(name(key), value, "str")
        elif key == "time":
            _expect(name(key), value, "int" if isinstance(value, int) else "str", "HH:MM:SS, D-HH:MM:SS or minutes")
            try:
                minutes = _minutes(value)
            except CocosError as exc:
                raise CocosError(f"{name(key)}: {exc}") from None
            if minutes < 1:
                raise CocosError(f"{name(key)}: expected at least one minute, got {_shown(value)}")
        else:
            least = 0 if key == "gpus" else 1
            if not _is(value, "int") or value < least:
                raise CocosError(f"{name(key)}: expected an integer >= {least}, got {_shown(value)}")



def slurm_table(where: str, table) -> dict:
    """The grid's [slurm] table: defaults for --executor slurm (check_slurm)."""
    slurm = dict(_expect(f"{where}: slurm", table, "table", "a table [slurm]"))
    _unknown(f"{where}: [slurm]", slurm, SLURM_KEYS)
    check_slurm(slurm, lambda key: f"{where}: [slurm] {key}")
    return slurm


def loss_tables(where: str, entries) -> list:
    """The grid's [[loss]] tables, at least one (each is checked by _loss_entry)."""
    if not isinstance(entries, list):
        raise CocosError(f"{where}: loss: expected an array of tables [[loss]], got {_shown(entries)}")
    if not entries:
        raise CocosError(f"{where}: no [[loss]]: the grid expands to zero runs")
    return entries


def _minutes(text) -> int:
    """``"HH:MM:SS"``, ``"D-HH:MM:SS"`` or minutes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d\d)(?::(\d\d))?", str(text))
    if not m:
        raise CocosError(f"time '{text}': expected HH:MM:SS, D-HH:MM:SS or minutes")
    d, h, mi, _ = (int(x or 0) for x in m.groups())
    return (d * 24 + h) * 60 + mi



def _loss_entry(entry, where: str) -> tuple[str, dict, dict, str]:
    """(id, loss name + params, train overrides, label) of one [[loss]] table."""
    _expect(where, entry, "table", 'a table with a name = "..." (see cocos losses)')
    if "name" not in entry:
        raise CocosError(f"{where}: needs a name")
    name = _expect(f"{where} name", entry["name"], "str", "a loss name (see cocos losses)")
    where = f"{where} ({name})"
    _unknown(where, entry, LOSS_KEYS)
    try:
        spec = get_objective(name)  # unknown losses: one line naming the registered ones
    except CocosError as exc:
        raise CocosError(f"{where} name: {exc}") from None
    params = dict(_expect(f"{where} params", entry.get("params", {}), "table",
                          "a table of the loss's parameters, e.g. params = { tau = 0.1 }"))
    for key, value in params.items():
        if not (_is(value, "str") or _is(value, "num") or _is(value, "bool")):
            raise CocosError(f"{where} params {key}: expected a number, a name or true/false, got {_shown(value)}")
    try:
        spec.params(**params)  # the family's typed parameters: unknown names and bad values fail here
    except CocosError as exc:
        raise CocosError(f"{where} params: {exc}") from None
    overrides = _train_table(f"{where} train", entry.get("train", {}))
    ident = entry.get("id")
    if ident is not None:
        _expect(f"{where} id", ident, "str")
    ident = str(ident or "_".join([spec.name, *(str(v) for v in params.values())]))
    label = " x ".join(str(v) for v in params.values()) or ident
    return ident, {"loss": spec.name, "params": params or None}, overrides, label


def _loss_entries(entries: list, where: str) -> list[tuple[str, dict, dict, str | None]]:
    """(id, loss name + params, per-loss train overrides, label) for each [[loss]]."""

    out = [_loss_entry(entry, f"{where}: [[loss]] {i}") for i, entry in enumerate(entries, 1)]
    families = [loss["loss"] for _, loss, _, _ in out]
    # a label tells runs of one family apart in reports (else they would be taken for replicates)
    return [(i, loss, o, label if families.count(loss["loss"]) > 1 else None) for i, loss, o, label in out]


def _as_list(raw: dict, key: str, default, kind: str, what: str, where: str) -> list:
    """A value or an array of values, each of ``kind``; never empty."""
    value = raw.get(key, default)
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not _is(item, kind):
            raise CocosError(f"{where}: {key}: expected {what}, got {_shown(value)}")
    if not items:
        raise CocosError(f"{where}: '{key}' is empty: the grid expands to zero runs")
    return items



def read_grid(path: str | os.PathLike) -> dict:
    """A grid file's TOML, read with a bound: a regular file of at most GRID_BYTES (a device, a FIFO or a folder
    is refused before a byte is read; at most GRID_BYTES + 1 bytes are ever read), UTF-8 (a BOM is skipped),
    nested no deeper than the parser's recursion allows. Every failure is one CocosError line."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without a writer
    except FileNotFoundError:
        raise CocosError(f"{path}: no such grid file") from None
    except OSError as exc:
        raise CocosError(f"{path}: cannot read the grid file ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise CocosError(f"{path}: is a folder, not a grid file")
        if not stat.S_ISREG(info.st_mode):
            raise CocosError(f"{path}: not a regular file (a device, FIFO or socket); a grid is a TOML file")
        if info.st_size > GRID_BYTES:
            raise CocosError(f"{path}: {info.st_size:,} bytes; a grid file is at most {GRID_BYTES:,} bytes of TOML")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(GRID_BYTES + 1)
    except OSError as exc:
        raise CocosError(f"{path}: cannot read the grid file ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > GRID_BYTES:  # it grew since fstat
        raise CocosError(f"{path}: more than {GRID_BYTES:,} bytes; a grid file is at most that much TOML")
    try:
        return tomllib.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise CocosError(f"{path}: not a readable TOML grid (not UTF-8 text: {exc.reason} at byte {exc.start})") \
            from None
    except RecursionError:
        raise CocosError(f"{path}: not a readable TOML grid (nested too deeply)") from None
    except tomllib.TOMLDecodeError as exc:
        raise CocosError(f"{path}: not a readable TOML grid ({exc})") from None



def model_entries(raw: dict, where: str) -> list[ModelEntry]:
    """The grid's models: ``models`` a name, an array of names and ``[[models]]`` tables (default: vsepp)."""
    value = raw.get("models", ["vsepp"])
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not (_is(item, "str") or _is(item, "table")):
            raise CocosError(f"{where}: models: expected a model name, an array of them or [[models]] tables, "
                             f"got {_shown(value)}")
    if not items:
        raise CocosError(f"{where}: 'models' is empty: the grid expands to zero runs")
    return [_model_entry(item, f"{where}: [[models]] {i}") for i, item in enumerate(items, 1)]


def _model_entry(item, where: str) -> ModelEntry:
    """One model: a name, or a table of ``name`` (a model family, see cocos models), ``id`` (its runs' name prefix,
    default the name), ``data`` (its own data folder or image dataset) and ``train`` (its own cocos train settings)."""
    if isinstance(item, str):
        return ModelEntry(item, item)
    if "name" not in item:
        raise CocosError(f'{where}: needs a name = "..." (a model, see cocos models)')
    name = _expect(f"{where} name", item["name"], "str", "a model name (see cocos models)")
    where = f"{where} ({name})"
    _unknown(where, item, MODEL_KEYS)
    ident = _expect(f"{where} id", item.get("id", name), "str")
    data = item.get("data")
    if data is not None:
        _expect(f"{where} data", data, "str", "the model's data folder or image dataset")
    return ModelEntry(ident, name, data, _train_table(f"{where} train", item.get("train", {})))


def expand(where: str, name: str, data: str | None, models: list[ModelEntry], losses: list, seeds: list,
           shared: dict, analyze: dict, reports: Path, checkpoints: Path) -> list[SweepRun]:
    """One run per (model, loss, seed), named ``<model id>_<loss id>_s<seed>``, each with the TrainConfig cocos
    train would validate."""
    runs, seen = [], set()
    for model in models:
        if not (model.data or data):
            raise CocosError(f"{where}: 'data' is missing (the grid's data = \"...\", or a data in every "
                             "[[models]] table)")
        for ident, loss, overrides, label in losses:
            for seed in seeds:
                run_name = f"{model.ident}_{ident}_s{seed}"
                if run_name in seen:
                    raise CocosError(f"{where}: two runs are named '{run_name}'; give one loss (or model) an "
                                     'id = "..."')
                seen.add(run_name)
                if not NAME.fullmatch(run_name):
                    raise CocosError(f"{where}: run name '{run_name}' must be letters, digits, '_', '.', '-'")
                cfg = {**shared, **model.train, **overrides, **loss, "data": model.data or data,
                       "model": model.name, "seed": seed, "out": str(checkpoints / name / run_name)}
                try:
                    cfg = run_config(cfg, {**shared, **overrides}, model.train)
                except (CocosError, TypeError) as exc:
                    raise CocosError(f"{where}: run {run_name}: {exc}") from None
                runs.append(SweepRun(run_name, cfg, dict(analyze), label, str(reports / name / run_name)))
    return runs


def run_config(cfg: dict, common: dict, own: dict) -> dict:
    """A run's flat settings, validated as cocos train validates them: the pre-trained sources of ``common``
    (``[train]`` and the loss's) that its model does not take left out, the family's recipe for every setting
    the grid leaves unset."""
    takes = source_names(cfg["model"])
    for key in {s.name for f in families() for s in f.sources} - takes:
        if key in common and key not in own:
            cfg.pop(key, None)
    if isinstance(cfg.get("sources"), dict) and "sources" not in own:
        kept = {k: v for k, v in cfg["sources"].items() if k in takes}
        cfg = {**cfg, "sources": kept} if kept else {k: v for k, v in cfg.items() if k != "sources"}
    given = {*common, *own, "loss", "params"}  # what the grid sets (data, model, seed and out are in no recipe)
    cfg = with_recipe(cfg, lambda key: key in given)  # the family's recipe, where unset
    TrainConfig.of(**cfg).validate()  # bad settings: one line, before anything is written
    return cfg


def sources_of(model: str) -> list:
    """The pre-trained sources (:class:`cocos.models.family.Source`) a model takes: its family's and, on raw
    images, its images family's, each name once."""
    family = get_family(model)
    extra = get_family(family.images_family).sources if family.images_family else ()
    return list({s.name: s for s in (*extra, *family.sources)}.values())


def source_names(model: str) -> set[str]:
    return {s.name for s in sources_of(model)}
