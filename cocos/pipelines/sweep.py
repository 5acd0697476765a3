"""``cocos sweep GRID.toml``: losses x seeds x models, trained, analysed and merged into one report.

A grid file (TOML) names the data folder, the model(s), the loss families with their
parameters, the seeds, the shared training settings (the keys of ``cocos train``'s
options) and the analysis settings. It expands to one run per (model, loss, seed) with a
stable name ``<model>_<loss id>_s<seed>``; run ``R`` of sweep ``S`` trains into
``<checkpoints>/S/R`` and is analysed into ``<reports>/S/R``; at the end every run's
``results.json`` is merged with the report library into ``<reports>/S/summary`` (Tables
1-4 with mean ± sample std over seeds, figures, LaTeX).

Example::

    name = "demo_grid"
    data = "data/synth"
    models = ["vsepp"]
    seeds = [0, 1]
    [train]                       # any cocos train option (not data, model, loss, out, seed)
    epochs = 8
    [analyze]                     # batch_size, split, compat, eps
    split = "test"
    [[loss]]
    name = "triplet_sh"
    [[loss]]
    name = "ntxent"
    params = { tau = 0.1 }
    train = { epochs = 12 }       # per-loss overrides of [train] (SmoothAP's longer schedule)

The file is checked whole before anything runs, by ``--dry-run`` and a real sweep alike (one
``error:`` line naming the file, the table and the key, exit 2, nothing written): a regular file of
at most 1 MB, every key known and every value of its type, at most 10,000 runs (counted before
they are built), each run's ``TrainConfig`` validated as ``cocos train`` validates it, ``[analyze]``
as ``cocos analyze`` takes its options, and the data each run reads (its splits, the analysis batch
size against the training split, ``[train]``'s files, the device).

Idempotent: a run whose checkpoint was trained with exactly these settings on exactly this
data (the fingerprint test of ``cocos demo``) is not trained again, and one whose
``results.json`` was computed from that very checkpoint file (its sha256) with the same
analysis settings is not analysed again. A run that fails is reported with its log and the
others go on. Deviation from the issue text: an interrupted run (``last.pt`` of an earlier
epoch with the same settings) continues only with ``--resume``; without it it starts over.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import reprlib
import shlex
import stat
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from cocos.data.precomp import SPLIT_ALIASES, _open_features, data_fingerprint, find_karpathy_json
from cocos.defaults import DEFAULT_EPS
from cocos.device import resolve_device
from cocos.errors import CocosError
from cocos.io import check_output_dir, mark_output, output_kind, output_lock, sha256_file
from cocos.models.registry import get_family
from cocos.objectives import get_objective
from cocos.pipelines.analyze import analyze_checkpoint
from cocos.pipelines.folder import write_results_folder
from cocos.report.merge import build_report, write_report
from cocos.results import Results
from cocos.training.checkpoint import load_checkpoint
from cocos.training.config import LOSS_FLAT, OptimConfig, TrainConfig, default, record_type
from cocos.training.trainer import Trainer, with_recipe

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

TOP_KEYS = {"name", "data", "models", "seeds", "train", "analyze", "loss", "reports", "checkpoints", "slurm"}
LOSS_KEYS = {"name", "id", "params", "train"}
RUN_KEYS = {"data", "model", "loss", "out", "seed", "params"}  # set by the grid itself, not by [train]
ANALYZE_KEYS = {"batch_size", "split", "compat", "eps"}
SLURM_KEYS = {"partition", "time", "gpus", "mem_gb", "cpus", "array_parallelism"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
GRID_BYTES = 1 << 20  # a grid file is a few hundred bytes of TOML; anything over 1 MB is not one
MAX_RUNS = 10_000  # the paper's grid is 40 runs per dataset; the count is checked before any run is built
PATH_KEYS = ("vocab", "ltd_targets", "cnn_weights")  # [train] keys that name a file every run reads
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


@dataclass
class Grid:
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


# -- the grid file's schema ---------------------------------------------------------------------
#
# Every value is checked for its type where it is read (one CocosError line naming the file, the table, the key
# and what was expected), then every run's TrainConfig is built and validated as cocos train validates it, and
# [analyze] as cocos analyze checks its options; check_inputs then looks at the data each run reads (files and
# .npy headers, not the rows: NaN rows, captions that do not match their images or a full disk still fail a run).


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
    """The keys of [train] and the kind of each: the type of its TrainConfig field, as cocos train's option
    parses it (``X | None``: the key may be left out; a field of another type is left to ``validate``)."""
    base = {"int": "int", "float": "num", "str": "str", "bool": "bool"}
    out = {}
    for f in fields(record_type()):  # the flat names of cocos train's settings (cocos.training.config)
        if f.name not in RUN_KEYS and f.name not in LOSS_FLAT:
            annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            out[f.name] = base.get(annotation.split("|")[0].strip())
    return out


def _train_keys() -> set[str]:

    return set(_train_kinds())


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


def load_grid(path: str | os.PathLike, reports: str | None = None, checkpoints: str | None = None) -> Grid:
    """Read and check a grid file whole and expand it to runs; nothing is written.

    Checked here, before any run is built: the file (read_grid), every key and the type of every value (one
    line naming the file, the table and the key), the number of runs (models x losses x seeds, at most
    MAX_RUNS), each loss's parameters (as cocos train -p), [analyze] (as cocos analyze's options) and [slurm];
    then the TrainConfig of every run is validated as cocos train validates it. What the runs read (the data,
    its splits, [train]'s files, the device) is check_inputs', which needs the data on this machine.
    """
    path = Path(path)
    raw = read_grid(path)
    where = str(path)
    _unknown(where, raw, TOP_KEYS)
    for key in ("data", "loss"):
        if key not in raw:
            raise CocosError(f"{where}: '{key}' is missing")
    name = _expect(f"{where}: name", raw.get("name", path.stem), "str")
    if not NAME.fullmatch(name):
        raise CocosError(f"{where}: name '{name}' must be letters, digits, '_', '.', '-'")
    data = _expect(f"{where}: data", raw["data"], "str", "the data folder's path")
    for key in ("reports", "checkpoints"):
        if key in raw:
            _expect(f"{where}: {key}", raw[key], "str", "a folder's path")
    shared = _train_table(f"{where}: [train]", raw.get("train", {}))
    analyze = _analyze_table(where, raw.get("analyze", {}))
    slurm = dict(_expect(f"{where}: slurm", raw.get("slurm", {}), "table", "a table [slurm]"))
    _unknown(f"{where}: [slurm]", slurm, SLURM_KEYS)
    check_slurm(slurm, lambda key: f"{where}: [slurm] {key}")
    models = _as_list(raw, "models", ["vsepp"], "str", "a model name or an array of them", where)
    seeds = _as_list(raw, "seeds", [0], "int", "an integer or an array of integers", where)
    entries = raw["loss"]
    if not isinstance(entries, list):
        raise CocosError(f"{where}: loss: expected an array of tables [[loss]], got {_shown(entries)}")
    if not entries:
        raise CocosError(f"{where}: no [[loss]]: the grid expands to zero runs")
    count = len(models) * len(entries) * len(seeds)
    if count > MAX_RUNS:
        raise CocosError(f"{where}: the grid expands to {count:,} runs ({len(models)} models x {len(entries)} "
                         f"losses x {len(seeds)} seeds); at most {MAX_RUNS:,}: split it into several grids")
    losses = _loss_entries(entries, where)
    reports = Path(reports or raw.get("reports", "reports"))
    checkpoints = Path(checkpoints or raw.get("checkpoints", "checkpoints"))
    runs = _expand(where, name, data, models, losses, seeds, shared, analyze, reports, checkpoints)
    return Grid(name, data, runs, reports, checkpoints, slurm, where)


def _expand(where: str, name: str, data: str, models: list, losses: list, seeds: list, shared: dict,
            analyze: dict, reports: Path, checkpoints: Path) -> list[SweepRun]:
    """One run per (model, loss, seed), each with the TrainConfig cocos train would validate."""
    runs, seen = [], set()
    for model in models:
        for ident, loss, overrides, label in losses:
            for seed in seeds:
                run_name = f"{model}_{ident}_s{seed}"
                if run_name in seen:
                    raise CocosError(f"{where}: two runs are named '{run_name}'; give one loss an id = \"...\"")
                seen.add(run_name)
                if not NAME.fullmatch(run_name):
                    raise CocosError(f"{where}: run name '{run_name}' must be letters, digits, '_', '.', '-'")
                cfg = {**shared, **overrides, **loss, "data": data, "model": model, "seed": seed,
                       "out": str(checkpoints / name / run_name)}
                try:
                    if cfg.get("bert") and get_family(model).text != "wordpiece":
                        cfg.pop("bert")  # [train] bert is the BERT families' (a grid of VSE∞ and VSE++)
                    set_here = {**shared, **overrides, **loss}
                    cfg = with_recipe(cfg, lambda key, _s=set_here: key in _s)  # the family's recipe, where unset
                    TrainConfig.of(**cfg).validate()  # bad settings: one line, before anything is written
                except (CocosError, TypeError) as exc:
                    raise CocosError(f"{where}: run {run_name}: {exc}") from None
                runs.append(SweepRun(run_name, cfg, dict(analyze), label, str(reports / name / run_name)))
    return runs


# -- one run: train (unless reusable), analyse (unless up to date) ------------------------------


def train_state(run: SweepRun, fingerprint: str) -> str:
    """``done`` (finished with these settings on this data), ``partial`` (same settings, earlier epoch) or ``new``."""

    out = Path(run.train["out"])
    last = out / "last.pt"
    if not last.exists():
        return "new"
    try:
        ckpt = load_checkpoint(last)
    except CocosError:
        return "new"
    wanted = TrainConfig.of(**run.train).flat()
    if ckpt["data"]["fingerprint"] != fingerprint or {k: ckpt["train"].get(k) for k in wanted} != wanted:
        return "new"
    if ckpt["epoch"] == wanted["epochs"] and (out / "model_best.pt").exists():
        return "done"
    return "partial"


def analysis_current(run: SweepRun) -> bool:
    """The run's results.json was computed from this very model_best.pt with these analysis settings."""
    results = Path(run.report) / "results.json"
    best = Path(run.train["out"]) / "model_best.pt"
    if not results.is_file() or not best.is_file():
        return False
    try:
        r = run_results(run)
        a, c = run.analyze, r.counting
        return (r.source.sha256 == sha256_file(best) and r.evaluation is not None
                and r.evaluation.split == a["split"] and bool(c.compat) == bool(a["compat"])
                and c.seed == run.train["seed"] and (a["batch_size"] is None or c.batch_size == a["batch_size"]))
    except (CocosError, OSError):
        return False


def run_results(run: SweepRun) -> Results:
    """The run's ``results.json``, read through the results model (:meth:`cocos.results.Results.read`: any format
    version it reads, checked; a bad file is one CocosError line naming it)."""
    return Results.read(Path(run.report) / "results.json")


def run_one(run: SweepRun, *, resume: bool = False, retrain: bool = False, progress: bool = False,
            log_path: str | None = None) -> dict:
    """Train and analyse one run; never raises. Returns {name, status, trained, analysed, rsum, error, log}."""
    lines: list[str] = []

    def log(text: str) -> None:
        lines.append(text)
        if log_path:
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(text + "\n")

    status = {"name": run.name, "trained": "skipped", "analysed": "skipped", "rsum": None, "error": None,
              "log": log_path}
    try:
        _train_and_analyse(run, status, log, resume=resume, retrain=retrain, progress=progress)
        status["status"] = "ok"
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failed run is reported and does not stop the others
        status["status"] = "failed"
        status["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log(traceback.format_exc())
    return status


def _train_and_analyse(run: SweepRun, status: dict, log, *, resume: bool, retrain: bool, progress: bool) -> None:

    state = "new" if retrain else train_state(run, data_fingerprint(run.train["data"]))
    if state != "done":
        cont = state == "partial" and resume
        log(f"[{run.name}] {'resuming' if cont else 'training'} {run.train['model']} {run.train['loss']} "
            f"seed {run.train['seed']}")
        Trainer(TrainConfig.of(**run.train), resume=cont, overwrite=not cont, progress=progress, by="sweep",
                log=lambda s: log(f"[{run.name}] {s}")).fit()
        status["trained"] = "resumed" if cont else "trained"
    if status["trained"] != "skipped" or not analysis_current(run):
        a = run.analyze
        analysis = analyze_checkpoint(Path(run.train["out"]) / "model_best.pt", run.train["data"],
                                      batch_size=a["batch_size"], seed=run.train["seed"], compat=a["compat"],
                                      split=a["split"], eps=a["eps"], device=run.train.get("device", "auto"),
                                      label=run.label, progress=progress)
        write_results_folder(analysis.results, analysis.run, run.report, embeddings=analysis.embeddings,
                             logs=analysis.logs, overwrite=True, by="sweep")
        status["analysed"] = "analysed"
        log(f"[{run.name}] analysed into {run.report}")
    status["rsum"] = run_results(run).evaluation.metrics["rsum"]


# -- executors ----------------------------------------------------------------------------------


def _pin(slots) -> None:
    """Worker initializer: take one slot (cores or a GPU) for the life of this process."""
    kind, value = slots.get()
    if kind == "gpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(value)
    else:

        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, value)
        torch.set_num_threads(len(value))
        os.environ["OMP_NUM_THREADS"] = str(len(value))


def worker_slots(jobs: int, gpus: int | None = None) -> list[tuple[str, object]]:
    """One GPU each when there are at least ``jobs`` GPUs, else an equal share of this process's cores."""
    if gpus is not None and gpus >= jobs:
        return [("gpu", i) for i in range(jobs)]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    share = max(1, len(cores) // jobs)
    return [("cpu", set(cores[(i * share) % len(cores):][:share] or cores[:share])) for i in range(jobs)]


def run_local(runs: list[SweepRun], jobs: int, logs: Path, **kw) -> list[dict]:
    """``jobs`` processes at a time, each pinned to its share of cores (or one GPU); jobs=1 runs here."""
    if jobs <= 1:
        return [run_one(r, log_path=str(logs / f"{r.name}.log"), **kw) for r in runs]


    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    for slot in worker_slots(jobs, torch.cuda.device_count() if torch.cuda.is_available() else None):
        slots.put(slot)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_pin, initargs=(slots,)) as pool:
        futures = [pool.submit(run_one, r, log_path=str(logs / f"{r.name}.log"), **kw) for r in runs]
        return [f.result() for f in futures]


def slurm_params(grid: Grid, options: dict) -> dict:
    """submitit parameters from the grid's [slurm] table, overridden by the command line's options (checked
    here as the grid's are in load_grid)."""
    given = {k: v for k, v in options.items() if v is not None}
    _unknown("slurm options", given, SLURM_KEYS)
    check_slurm(given, lambda key: f"--{key.replace('_', '-')}")
    s = {**grid.slurm, **given}
    params = {"timeout_min": _minutes(s.get("time", "24:00:00")), "slurm_array_parallelism": s.get(
        "array_parallelism", 16)}
    if s.get("partition"):
        params["slurm_partition"] = s["partition"]
    if s.get("gpus"):
        params["gpus_per_node"] = int(s["gpus"])
    if s.get("mem_gb"):
        params["mem_gb"] = int(s["mem_gb"])
    if s.get("cpus"):
        params["cpus_per_task"] = int(s["cpus"])
    return params


def _minutes(text) -> int:
    """``"HH:MM:SS"``, ``"D-HH:MM:SS"`` or minutes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d\d)(?::(\d\d))?", str(text))
    if not m:
        raise CocosError(f"time '{text}': expected HH:MM:SS, D-HH:MM:SS or minutes")
    d, h, mi, _ = (int(x or 0) for x in m.groups())
    return (d * 24 + h) * 60 + mi


def import_submitit():
    try:
        import submitit
    except ModuleNotFoundError:
        raise CocosError("--executor slurm needs submitit: pip install 'cocos[slurm]'") from None
    return submitit


def run_slurm(grid: Grid, runs: list[SweepRun], params: dict, cluster: str | None, log, **kw) -> list[dict]:
    """One array job of one task per run; the merge waits on it (a dependent job on Slurm, here otherwise)."""
    submitit = import_submitit()
    folder = grid.report_dir / "slurm" / "%j"
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(name=f"cocos-{grid.name}", **(params if executor.cluster == "slurm" else {}))
    jobs = executor.map_array(_slurm_task, runs, [kw] * len(runs))
    log(f"submitted {len(jobs)} jobs to {executor.cluster}: {', '.join(str(j.job_id) for j in jobs[:4])}"
        f"{' ...' if len(jobs) > 4 else ''}")
    if executor.cluster == "slurm":
        merge = submitit.AutoExecutor(folder=folder)
        ids = ":".join(str(j.job_id) for j in jobs)
        merge.update_parameters(name=f"cocos-{grid.name}-merge", timeout_min=60,
                                slurm_partition=params.get("slurm_partition"),
                                slurm_additional_parameters={"dependency": f"afterany:{ids}"})
        job = merge.submit(merge_report, grid)
        log(f"merge job {job.job_id} runs after them; the report goes to {grid.summary}")
    return [j.result() for j in jobs]


def _slurm_task(run: SweepRun, kw: dict) -> dict:
    logs = Path(run.report).parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return run_one(run, log_path=str(logs / f"{run.name}.log"), **kw)


# -- the sweep ----------------------------------------------------------------------------------


def check_inputs(grid: Grid, executor: str = "local") -> None:
    """What every run reads, before anything runs (``--dry-run`` and a real sweep alike); nothing is written.

    The data folder holds the splits training reads (train, and dev for validation) and each run's [analyze]
    split, each an .npy array (its header is read) with its captions; the analysis batch size (the training one
    unless [analyze] sets it) fits the training split, as cocos analyze requires; [train]'s files (vocab,
    ltd_targets, cnn_weights) exist; the device is one a run can use (on the local executor: available here).
    """
    where = grid.source or grid.name
    data = Path(grid.data)
    if not (data / "train_ims.npy").exists():
        raise CocosError(f"{where}: data: {data}: no train_ims.npy (make one with cocos data synth)")
    n_images = _split_rows(data, "train", f"{where}: data")
    _split_rows(data, "dev", f"{where}: data (dev: the validation split of training)")
    for split in sorted({run.analyze["split"] for run in grid.runs} - {"train", "dev"}):
        _split_rows(data, split, f"{where}: [analyze] split")
    devices = set()
    for run in grid.runs:
        batch = run.analyze["batch_size"] or run.train.get("batch_size", default(OptimConfig, "batch_size"))
        if batch > n_images:
            key = "[analyze] batch_size" if run.analyze["batch_size"] else \
                "[train] batch_size (the analysis counts at the training batch size unless [analyze] sets one)"
            raise CocosError(f"{where}: run {run.name}: {key}: {batch} is larger than the training split "
                             f"({n_images} images)")
        _check_run_files(where, run)
        devices.add(run.train.get("device", default(TrainConfig, "device")))
    for device in sorted(devices):
        if executor == "local":  # the name itself: TrainConfig.validate (check_device_name)
            try:
                resolve_device(device)
            except CocosError as exc:
                raise CocosError(f"{where}: [train] device: {exc}") from None


def _check_run_files(where: str, run: SweepRun) -> None:
    """A run's [train] files exist (vocab, ltd_targets, cnn_weights), and its BERT folder (bert)."""
    for key in PATH_KEYS:
        if run.train.get(key) and not Path(run.train[key]).is_file():
            raise CocosError(f"{where}: run {run.name}: {key}: {run.train[key]}: no such file")
    if run.train.get("bert") and not Path(run.train["bert"]).is_dir():
        raise CocosError(f"{where}: run {run.name}: bert: {run.train['bert']}: no such BERT folder")


def _split_rows(data: Path, split: str, where: str) -> int:
    """The number of images of a split of a precomputed-feature folder (its .npy header), or one line."""
    path = data / f"{split}_ims.npy"
    if not path.is_file():
        have = sorted(p.name[:-len("_ims.npy")] for p in data.glob("*_ims.npy"))
        raise CocosError(f"{where}: {data} has no split '{split}' (no {path.name}; its splits: "
                         f"{', '.join(have) or 'none'})")
    try:
        rows = int(_open_features(path).shape[0])
    except CocosError as exc:
        raise CocosError(f"{where}: {exc}") from None
    if not (data / f"{split}_caps.txt").is_file() and find_karpathy_json(data) is None:
        raise CocosError(f"{where}: {data / f'{split}_caps.txt'}: no such caption file (and no dataset_*.json)")
    return rows


def check_outputs(grid: Grid) -> None:
    """Every folder the sweep writes can be written, and none holds its data; nothing is created here.

    The sweep's two folders (``<reports>/S``, ``<checkpoints>/S``) are absent, empty or a sweep's own (a rerun
    continues them: :func:`cocos.io.check_output_dir`, kind ``sweep``); any other folder is refused in one line.
    """

    data = Path(grid.data)
    for folder, option in ((grid.report_dir, "--reports"), (grid.checkpoints / grid.name, "--checkpoints")):
        check_output_dir(folder, inputs=[data], kind="sweep", by="sweep", option=f"{option} or grid name")
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not os.access(probe, os.W_OK | os.X_OK):
            raise CocosError(f"{folder}: cannot write here ({probe} is not writable)")


def plan(grid: Grid, resume: bool = False, retrain: bool = False) -> list[tuple[SweepRun, str]]:
    """What each run needs: ``skip`` (trained and analysed), ``analyse``, ``resume`` or ``train``."""

    fingerprint = data_fingerprint(grid.data)
    out = []
    for run in grid.runs:
        state = "new" if retrain else train_state(run, fingerprint)
        if state == "done":
            out.append((run, "skip" if analysis_current(run) else "analyse"))
        else:
            out.append((run, "resume" if state == "partial" and resume else "train"))
    return out


def train_command(run: SweepRun) -> str:
    """The cocos train command line equivalent of a run (for --dry-run)."""

    defaults = TrainConfig.of(data="").flat()
    parts = ["cocos train"]
    for key, value in run.train.items():
        if key == "params":
            parts += [f"-p {k}={v}" for k, v in (value or {}).items()]
        elif key == "lr_groups":
            parts += [f"--lr-group {k}={v}" for k, v in (value or {}).items()]
        elif value != defaults.get(key) or key in ("data", "out", "model", "loss", "seed"):
            if isinstance(value, bool):
                parts.append(f"--{key.replace('_', '-')}")
            else:
                parts.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


def analyze_command(run: SweepRun) -> str:
    """The cocos analyze command line equivalent of a run's analysis (for --dry-run)."""
    a = run.analyze
    parts = [f"cocos analyze {run.train['out']}/model_best.pt --out {run.report} --split {a['split']}",
             f"--eps {a['eps']:g}", f"--seed {run.train['seed']}"]
    if a["batch_size"] is not None:
        parts.append(f"--batch-size {a['batch_size']}")
    if a["compat"]:
        parts.append("--compat")
    if run.label is not None:
        parts.append(f"--label {shlex.quote(run.label)}")
    return " ".join(parts)


def merge_report(grid: Grid) -> Path:
    """Tables 1-4 (mean ± sample std over seeds), figures and LaTeX of every finished run."""

    paths = [Path(r.report) / "results.json" for r in grid.runs if (Path(r.report) / "results.json").is_file()]
    if not paths:
        raise CocosError("no run finished: nothing to merge")
    report = build_report(paths)
    write_report(report, grid.summary, readme=None, overwrite=True, by="sweep")  # in the sweep's own folder
    return grid.summary


def summary_lines(results: list[dict], seconds: float) -> list[str]:
    lines = []
    for s in results:
        if s["status"] == "ok":
            what = ", ".join(f"{w}" for w in (s["trained"], s["analysed"]) if w != "skipped") or "up to date"
            lines.append(f"  {s['name']}: {what}; test rsum {s['rsum']:.1f}")
        else:
            lines.append(f"  {s['name']}: FAILED: {s['error']} (log: {s['log']})")
    failed = sum(s["status"] != "ok" for s in results)
    lines.append(f"{len(results) - failed} of {len(results)} runs ok, {failed} failed, in {seconds:.0f} s")
    return lines


def run_sweep(grid: Grid, *, executor: str = "local", jobs: int = 1, resume: bool = False, retrain: bool = False,
              progress: bool = False, slurm: dict | None = None, cluster: str | None = None,
              log: Callable[[str], None] = print) -> list[dict]:
    """Run what is missing, then merge; returns one status per run (failed runs included)."""
    if executor not in ("local", "slurm"):
        raise CocosError(f"unknown executor '{executor}' (choose from local, slurm)")
    if jobs < 1:
        raise CocosError(f"--jobs must be at least 1, got {jobs}")
    params = slurm_params(grid, slurm or {})
    if executor == "slurm":
        import_submitit()
    check_inputs(grid, executor)
    with output_lock(grid.checkpoints / grid.name):  # one sweep of a grid at a time: a second is refused in one line
        return _run_sweep(grid, executor, jobs, params, resume, retrain, progress, cluster, log)


def _run_sweep(grid: Grid, executor: str, jobs: int, params: dict, resume: bool, retrain: bool, progress: bool,
               cluster: str | None, log: Callable[[str], None]) -> list[dict]:
    check_outputs(grid)
    start = time.perf_counter()
    steps = plan(grid, resume, retrain)
    todo = [run for run, step in steps if step != "skip"]
    if not todo and (grid.summary / "tables.md").is_file():
        log(f"nothing to do: all {len(grid.runs)} runs of {grid.name} are trained and analysed with these "
            f"settings; the report is {grid.summary}")
        return [{"name": r.name, "status": "ok", "trained": "skipped", "analysed": "skipped", "rsum": None,
                 "error": None, "log": None} for r in grid.runs]
    for run, step in steps:
        log(f"  {run.name}: {step}")

    for folder in (grid.report_dir, grid.checkpoints / grid.name):  # a sweep's: a later sweep continues it
        folder.mkdir(parents=True, exist_ok=True)
        if output_kind(folder) is None:
            mark_output(folder, "sweep", by="sweep")
    logs = grid.report_dir / "logs"
    logs.mkdir(exist_ok=True)
    kw = {"resume": resume, "retrain": retrain, "progress": progress}
    if executor == "local":
        done = run_local(todo, jobs, logs, **kw)
    else:
        done = run_slurm(grid, todo, params, cluster, log, **kw)
    by_name = {s["name"]: s for s in done}
    results = [by_name.get(r.name) or {"name": r.name, "status": "ok", "trained": "skipped",
                                       "analysed": "skipped", "rsum": _rsum(r), "error": None, "log": None}
               for r in grid.runs]
    summary = merge_report(grid)
    for line in summary_lines(results, time.perf_counter() - start):
        log(line)
    log(f"wrote {summary}/ (tables.md, tables.tex, figures)")
    return results


def _rsum(run: SweepRun) -> float | None:
    """The test rsum of a run's results.json; None where the file is missing, unreadable or has none."""
    try:
        evaluation = run_results(run).evaluation
    except CocosError:
        return None
    return None if evaluation is None else evaluation.metrics.get("rsum")
