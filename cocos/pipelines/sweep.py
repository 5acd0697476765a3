"""``cocos sweep GRID.toml``: models x losses x seeds, trained, analysed and merged into one report.

A grid file (TOML, :mod:`cocos.pipelines.sweep_schema`) names the data, the model(s), the loss families with
their parameters, the seeds, the shared training settings (the flat names of ``cocos train``'s settings) and
the analysis settings. It expands to one run per (model, loss, seed) with a stable name
``<model>_<loss id>_s<seed>``; run ``R`` of sweep ``S`` trains into ``<checkpoints>/S/R`` and is analysed into
``<reports>/S/R``; at the end every run's ``results.json`` is merged with the report library into
``<reports>/S/summary`` (Tables 1-4 with mean ± sample std over seeds, figures, LaTeX).

Example::

    name = "demo_grid"
    data = "data/synth"           # precomputed features, or a raw-image dataset
    models = ["vsepp"]            # or [[models]] tables: name, id, data, train
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

Every model family trains as ``cocos train`` trains it: on raw images a family that reads precomputed features
gives way to its images family (``vsepp`` -> ``vsepp_full``, a frozen CNN with ``cnn_weights`` or
``finetune = true``; a frozen run's analysis reads a matching feature cache under the dataset's ``features/``),
and a family's pre-trained sources (a BERT folder, a CLIP folder) are named by their flat names (``bert``,
``clip``) in ``[train]`` or a model's ``train``.

The file is checked whole before anything runs, by ``--dry-run`` and a real sweep alike (one ``error:`` line
naming the file, the table and the key, exit 2, nothing written): a regular file of at most 1 MB, every key
known and every value of its type, at most 10,000 runs (counted before they are built), each run's
``TrainConfig`` validated as ``cocos train`` validates it, ``[analyze]`` as ``cocos analyze`` takes its options,
and what each run reads (:mod:`cocos.pipelines.sweep_data`: its data's splits, the analysis batch size against
the training split, its files and source folders, the device).

Idempotent: a run whose checkpoint was trained with exactly these settings on exactly this data (the
fingerprint ``cocos train`` records: of the feature folder, or of the training images' content) is not trained
again, and one whose ``results.json`` was computed from that very checkpoint file (its sha256) with the same
analysis settings is not analysed again. A run that fails is reported with its log and the others go on.
Deviation from the issue text: an interrupted run (``last.pt`` of an earlier epoch with the same settings)
continues only with ``--resume``; without it it starts over.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shlex
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from cocos.errors import CocosError
from cocos.io import check_output_dir, mark_output, output_kind, output_lock, sha256_file, write_text
from cocos.pipelines.analyze import analyze_checkpoint
from cocos.pipelines.folder import write_results_folder
from cocos.pipelines.sweep_data import PATH_KEYS, check_inputs, check_run_files, fingerprint
from cocos.pipelines.sweep_exec import _pin, import_submitit, slurm_params, worker_slots
from cocos.pipelines.sweep_schema import (
    NAME,
    TOP_KEYS,
    Grid,
    SweepRun,
    _analyze_table,
    _as_list,
    _expect,
    _loss_entries,
    _train_table,
    _unknown,
    expand,
    loss_tables,
    model_entries,
    read_grid,
    slurm_table,
)
from cocos.report.html import collection_page
from cocos.report.merge import build_report, write_report
from cocos.results import Results, lookup
from cocos.training.checkpoint import load_checkpoint
from cocos.training.config import TrainConfig, record_flat
from cocos.training.trainer import Trainer

MAX_RUNS = 10_000  # the paper's grid is 40 runs per dataset; the count is checked before any run is built

__all__ = ["MAX_RUNS", "PATH_KEYS", "CocosError", "Grid", "SweepRun", "analysis_current", "analyze_command",
           "check_inputs", "check_outputs", "check_run_files", "load_grid", "merge_report", "plan", "read_grid",
           "run_one", "run_results", "run_sweep", "slurm_params", "train_command", "train_state", "worker_slots"]


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
    if "loss" not in raw:
        raise CocosError(f"{where}: 'loss' is missing")
    name = _expect(f"{where}: name", raw.get("name", path.stem), "str")
    if not NAME.fullmatch(name):
        raise CocosError(f"{where}: name '{name}' must be letters, digits, '_', '.', '-'")
    data = raw.get("data")
    if data is not None:
        _expect(f"{where}: data", data, "str", "the data folder's path")
    for key in ("reports", "checkpoints"):
        if key in raw:
            _expect(f"{where}: {key}", raw[key], "str", "a folder's path")
    shared = _train_table(f"{where}: [train]", raw.get("train", {}))
    analyze = _analyze_table(where, raw.get("analyze", {}))
    slurm = slurm_table(where, raw.get("slurm", {}))
    models = model_entries(raw, where)
    seeds = _as_list(raw, "seeds", [0], "int", "an integer or an array of integers", where)
    entries = loss_tables(where, raw["loss"])
    count = len(models) * len(entries) * len(seeds)
    if count > MAX_RUNS:
        raise CocosError(f"{where}: the grid expands to {count:,} runs ({len(models)} models x {len(entries)} "
                         f"losses x {len(seeds)} seeds); at most {MAX_RUNS:,}: split it into several grids")
    losses = _loss_entries(entries, where)
    reports = Path(reports or raw.get("reports", "reports"))
    checkpoints = Path(checkpoints or raw.get("checkpoints", "checkpoints"))
    runs = expand(where, name, data, models, losses, seeds, shared, analyze, reports, checkpoints)
    return Grid(name, data or "", runs, reports, checkpoints, slurm, where)


# -- one run: train (unless reusable), analyse (unless up to date) ------------------------------


def train_state(run: SweepRun, memo: dict | None = None) -> str:
    """``done`` (finished with these settings on this data), ``partial`` (same settings, earlier epoch) or ``new``.

    The settings are those ``cocos train`` records (:func:`recorded_settings`); the data's fingerprint is
    computed only for a checkpoint of these settings, once per data path with ``memo`` (it reads every image of
    a raw-image dataset), and kept on the run for its worker."""
    out = Path(run.train["out"])
    last = out / "last.pt"
    if not last.exists():
        return "new"
    try:
        ckpt = load_checkpoint(last)
        wanted = recorded_settings(run)
    except CocosError:
        return "new"
    if not isinstance(ckpt.get("train"), dict):
        return "new"
    recorded = record_flat(ckpt["train"])  # this version's sections, or an earlier version's flat names
    if {k: recorded.get(k) for k in wanted} != wanted:
        return "new"
    run.fingerprint = run.fingerprint or fingerprint(run.train, memo)
    if lookup(ckpt, "data", "fingerprint") != run.fingerprint:
        return "new"
    if ckpt["epoch"] == wanted["epochs"] and (out / "model_best.pt").exists():
        return "done"
    return "partial"


def recorded_settings(run: SweepRun) -> dict:
    """A run's settings as its checkpoint records them (``train``): validated as the trainer validates them (on
    raw images the family that trains, ``vsepp`` -> ``vsepp_full``; the family's parameters filled in), the
    decoding workers left out (they do not change the run)."""
    cfg = TrainConfig.of(**run.train)
    cfg.validate()
    flat = cfg.flat()
    flat.pop("workers", None)
    return flat


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
    state = "new" if retrain else train_state(run)
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
                                      label=run.label, progress=progress,
                                      image_options={"workers": run.train.get("workers", 0)})  # raw images
        write_results_folder(analysis.results, analysis.run, run.report, embeddings=analysis.embeddings,
                             logs=analysis.logs, overwrite=True, by="sweep")
        status["analysed"] = "analysed"
        log(f"[{run.name}] analysed into {run.report}")
    status["rsum"] = run_results(run).evaluation.metrics["rsum"]


# -- executors ----------------------------------------------------------------------------------


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
    """Every folder the sweep writes can be written, and none holds its data; nothing is created here.

    The sweep's two folders (``<reports>/S``, ``<checkpoints>/S``) are absent, empty or a sweep's own (a rerun
    continues them: :func:`cocos.io.check_output_dir`, kind ``sweep``); any other folder is refused in one line.
    """
    inputs = [Path(data) for data in grid.inputs]
    for folder, option in ((grid.report_dir, "--reports"), (grid.checkpoints / grid.name, "--checkpoints")):
        check_output_dir(folder, inputs=inputs, kind="sweep", by="sweep", option=f"{option} or grid name")
        probe = folder
        while not probe.exists():
            probe = probe.parent
        if not os.access(probe, os.W_OK | os.X_OK):
            raise CocosError(f"{folder}: cannot write here ({probe} is not writable)")


def plan(grid: Grid, resume: bool = False, retrain: bool = False) -> list[tuple[SweepRun, str]]:
    """What each run needs: ``skip`` (trained and analysed), ``analyse``, ``resume`` or ``train``. Each data
    path is fingerprinted once (and only if a run has a checkpoint to compare)."""
    memo: dict = {}
    out = []
    for run in grid.runs:
        state = "new" if retrain else train_state(run, memo)
        if state == "done":
            out.append((run, "skip" if analysis_current(run) else "analyse"))
        else:
            out.append((run, "resume" if state == "partial" and resume else "train"))
    return out


ENTRY_FLAGS = {"params": "-p {}={}", "lr_groups": "--lr-group {}={}"}  # table settings: one flag per entry
NAMED = ("model_params", "sources")  # tables of settings whose flags are their names (--region-drop, --bert)
ALWAYS = ("data", "out", "model", "loss", "seed")  # shown even at their defaults


def train_command(run: SweepRun) -> str:
    """The cocos train command line equivalent of a run (for --dry-run)."""
    defaults = TrainConfig.of(data="").flat()
    return " ".join(["cocos train", *(flag for key, value in run.train.items()
                                      for flag in _flags(key, value, defaults))])


def _flags(key: str, value, defaults: dict) -> list[str]:
    """The cocos train flags of one flat setting."""
    if key in ENTRY_FLAGS:
        return [ENTRY_FLAGS[key].format(k, v) for k, v in (value or {}).items()]
    if key in NAMED:
        return [flag for k, v in (value or {}).items() for flag in _flags(k, v, {})]
    if value == defaults.get(key) and key not in ALWAYS or value is False or value is None:
        return []
    flag = f"--{key.replace('_', '-')}"
    return [flag] if value is True else [f"{flag} {shlex.quote(str(value))}"]


def analyze_command(run: SweepRun) -> str:
    """The cocos analyze command line equivalent of a run's analysis (for --dry-run)."""
    a = run.analyze
    parts = [f"cocos analyze {run.train['out']}/model_best.pt --out {run.report} --split {a['split']}",
             f"--eps {a['eps']:g}", f"--seed {run.train['seed']}"]
    if a["batch_size"] is not None:
        parts.append(f"--batch-size {a['batch_size']}")
    if a["compat"]:
        parts.append("--compat")
    if run.train.get("workers"):  # raw images: the processes decoding them
        parts.append(f"--workers {run.train['workers']}")
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
    write_text(grid.report_dir / "index.html", collection_page(grid.report_dir, f"cocos sweep {grid.name}",
                                                               f"{len(grid.runs)} runs"))  # each run's page, summary
    for line in summary_lines(results, time.perf_counter() - start):
        log(line)
    log(f"wrote {summary}/ (tables.md, tables.tex, figures) and {grid.report_dir / 'index.html'}")
    return results


def _rsum(run: SweepRun) -> float | None:
    """The test rsum of a run's results.json; None where the file is missing, unreadable or has none."""
    try:
        evaluation = run_results(run).evaluation
    except CocosError:
        return None
    return None if evaluation is None else evaluation.metrics.get("rsum")
