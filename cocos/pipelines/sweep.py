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

Idempotent: a run whose checkpoint was trained with exactly these settings on exactly this
data (the fingerprint test of ``cocos demo``) is not trained again, and one whose
``results.json`` was computed from that very checkpoint file (its sha256) with the same
analysis settings is not analysed again. A run that fails is reported with its log and the
others go on. Deviation from the issue text: an interrupted run (``last.pt`` of an earlier
epoch with the same settings) continues only with ``--resume``; without it it starts over.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from cocos.data.precomp import data_fingerprint
from cocos.defaults import DEFAULT_EPS
from cocos.errors import CocosError
from cocos.io import MARKER, check_output_dir, sha256_file
from cocos.objectives import get_objective
from cocos.pipelines.analyze import analyze_checkpoint
from cocos.pipelines.folder import write_results_folder
from cocos.report.merge import build_report, write_report
from cocos.training.checkpoint import load_checkpoint
from cocos.training.trainer import TrainConfig, Trainer

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

    @property
    def report_dir(self) -> Path:
        return self.reports / self.name

    @property
    def summary(self) -> Path:
        return self.report_dir / "summary"


def _unknown(where: str, given, allowed) -> None:
    extra = sorted(set(given) - set(allowed))
    if extra:
        raise CocosError(f"{where}: unknown key{'s' if len(extra) > 1 else ''} {', '.join(extra)} "
                         f"(allowed: {', '.join(sorted(allowed))})")


def _train_keys() -> set[str]:

    return {f.name for f in fields(TrainConfig)} - RUN_KEYS


def _loss_entries(raw: dict, where: str) -> list[tuple[str, dict, dict, str | None]]:
    """(id, loss name + params, per-loss train overrides, label) for each [[loss]]."""

    entries = raw.get("loss", [])
    if not isinstance(entries, list):
        raise CocosError(f"{where}: [[loss]] must be an array of tables")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry:
            raise CocosError(f"{where}: loss {i + 1} needs a name")
        _unknown(f"{where}: loss {entry['name']}", entry, LOSS_KEYS)
        spec = get_objective(str(entry["name"]))  # unknown losses: one line naming the registered ones
        params = dict(entry.get("params", {}))
        spec.params(**params)  # the family's typed parameters: unknown names and bad values fail here
        overrides = dict(entry.get("train", {}))
        _unknown(f"{where}: loss {spec.name} train", overrides, _train_keys())
        ident = str(entry.get("id") or "_".join([spec.name, *(str(v) for v in params.values())]))
        label = " x ".join(str(v) for v in params.values()) or ident
        out.append((ident, {"loss": spec.name, "params": params or None}, overrides, label))
    families = [loss["loss"] for _, loss, _, _ in out]
    # a label tells runs of one family apart in reports (else they would be taken for replicates)
    return [(i, loss, o, label if families.count(loss["loss"]) > 1 else None) for i, loss, o, label in out]


def _as_list(value, what: str, where: str) -> list:
    value = value if isinstance(value, list) else [value]
    if not value:
        raise CocosError(f"{where}: '{what}' is empty: the grid expands to zero runs")
    return value


def load_grid(path: str | os.PathLike, reports: str | None = None, checkpoints: str | None = None) -> Grid:
    """Read and check a grid file and expand it to runs; nothing is written."""

    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CocosError(f"{path}: no such grid file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CocosError(f"{path}: not a readable TOML grid ({exc})") from None
    where = str(path)
    _unknown(where, raw, TOP_KEYS)
    for key in ("data", "loss"):
        if key not in raw:
            raise CocosError(f"{where}: '{key}' is missing")
    name = str(raw.get("name", path.stem))
    if not NAME.fullmatch(name):
        raise CocosError(f"{where}: name '{name}' must be letters, digits, '_', '.', '-'")
    shared = dict(raw.get("train", {}))
    _unknown(f"{where}: [train]", shared, _train_keys())
    analyze = {"batch_size": None, "split": "test", "compat": False, "eps": DEFAULT_EPS, **raw.get("analyze", {})}
    _unknown(f"{where}: [analyze]", analyze, ANALYZE_KEYS)
    slurm = dict(raw.get("slurm", {}))
    _unknown(f"{where}: [slurm]", slurm, SLURM_KEYS)
    losses = _loss_entries(raw, where)
    models = _as_list(raw.get("models", ["vsepp"]), "models", where)
    seeds = _as_list(raw.get("seeds", [0]), "seeds", where)
    if not losses:
        raise CocosError(f"{where}: no [[loss]]: the grid expands to zero runs")
    reports = Path(reports or raw.get("reports", "reports"))
    checkpoints = Path(checkpoints or raw.get("checkpoints", "checkpoints"))
    runs, seen = [], {}
    for model in models:
        for ident, loss, overrides, label in losses:
            for seed in seeds:
                run_name = f"{model}_{ident}_s{seed}"
                if run_name in seen:
                    raise CocosError(f"{where}: two runs are named '{run_name}'; give one loss an id = \"...\"")
                seen[run_name] = True
                if not NAME.fullmatch(run_name):
                    raise CocosError(f"{where}: run name '{run_name}' must be letters, digits, '_', '.', '-'")
                cfg = {**shared, **overrides, **loss, "data": str(raw["data"]), "model": model, "seed": seed,
                       "out": str(checkpoints / name / run_name)}
                try:
                    TrainConfig(**cfg).validate()  # bad settings: one line, before anything is written
                except TypeError as exc:
                    raise CocosError(f"{where}: run {run_name}: {exc}") from None
                runs.append(SweepRun(run_name, cfg, dict(analyze), label, str(reports / name / run_name)))
    return Grid(name, str(raw["data"]), runs, reports, checkpoints, slurm)


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
    wanted = asdict(TrainConfig(**run.train))
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
        r = json.loads(results.read_text(encoding="utf-8"))
        a = run.analyze
        return (r["source"]["sha256"] == sha256_file(best) and r["evaluation"]["split"] == a["split"]
                and bool(r["counting"]["compat"]) == bool(a["compat"])
                and r["counting"]["seed"] == run.train["seed"]
                and (a["batch_size"] is None or r["counting"]["batch_size"] == a["batch_size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


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
        Trainer(TrainConfig(**run.train), resume=cont, overwrite=not cont, progress=progress,
                log=lambda s: log(f"[{run.name}] {s}")).fit()
        status["trained"] = "resumed" if cont else "trained"
    if status["trained"] != "skipped" or not analysis_current(run):
        a = run.analyze
        analysis = analyze_checkpoint(Path(run.train["out"]) / "model_best.pt", run.train["data"],
                                      batch_size=a["batch_size"], seed=run.train["seed"], compat=a["compat"],
                                      split=a["split"], eps=a["eps"], device=run.train.get("device", "auto"),
                                      label=run.label, progress=progress)
        write_results_folder(analysis.results, analysis.run, run.report, embeddings=analysis.embeddings,
                             logs=analysis.logs, overwrite=True)
        status["analysed"] = "analysed"
        log(f"[{run.name}] analysed into {run.report}")
    r = json.loads((Path(run.report) / "results.json").read_text(encoding="utf-8"))
    status["rsum"] = r["evaluation"]["metrics"]["rsum"]


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
    """submitit parameters from the grid's [slurm] table, overridden by the command line's options."""
    s = {**grid.slurm, **{k: v for k, v in options.items() if v is not None}}
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


def check_outputs(grid: Grid) -> None:
    """Every folder the sweep writes can be written, and none holds its data; nothing is created here."""

    data = Path(grid.data)
    if not (data / "train_ims.npy").exists():
        raise CocosError(f"{data}: no train_ims.npy (make one with cocos data synth)")
    for folder in (grid.report_dir, grid.checkpoints / grid.name):
        check_output_dir(folder, inputs=[data])
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

    defaults = asdict(TrainConfig(data=""))
    parts = ["cocos train"]
    for key, value in run.train.items():
        if key == "params":
            parts += [f"-p {k}={v}" for k, v in (value or {}).items()]
        elif value != defaults.get(key) or key in ("data", "out", "model", "loss", "seed"):
            if isinstance(value, bool):
                parts.append(f"--{key.replace('_', '-')}")
            else:
                parts.append(f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


def merge_report(grid: Grid) -> Path:
    """Tables 1-4 (mean ± sample std over seeds), figures and LaTeX of every finished run."""

    paths = [Path(r.report) / "results.json" for r in grid.runs if (Path(r.report) / "results.json").is_file()]
    if not paths:
        raise CocosError("no run finished: nothing to merge")
    report = build_report(paths)
    write_report(report, grid.summary, readme=None)
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

    for folder in (grid.report_dir, grid.checkpoints / grid.name):  # cocos's: a later sweep may write here
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARKER).write_text("written by cocos sweep; cocos may replace this folder\n")
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
    try:
        return json.loads((Path(run.report) / "results.json").read_text())["evaluation"]["metrics"]["rsum"]
    except (OSError, ValueError, KeyError):
        return None
