"""``cocos analyze``: checkpoint -> frozen encoding of the training set -> all counts -> report.

What section 5 of the COCOS paper did by hand: freeze the model at its best
validation checkpoint, walk the training set in random batches (pair batches for
Triplet, Triplet SH and NT-Xent, ranking batches for SmoothAP), count per loss
and direction, and put the counts next to the retrieval scores they explain.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cocos import __version__
from cocos.counting import COUNTERS
from cocos.counting.engine import DEFAULT_SWEEP, CountRun, EmbeddingSet, count_embeddings
from cocos.embed import FrozenModel, save_embeddings
from cocos.errors import CocosError


@dataclass
class Analysis:
    results: dict  # the results.json content (see cocos/report/SCHEMA.md)
    run: CountRun  # per-batch and per-query values of the shown mode
    embeddings: EmbeddingSet  # the training split's frozen embeddings
    timings: dict  # seconds per stage (not part of results.json, which must be reproducible)


def counter_params(checkpoint: dict, losses) -> dict:
    """Counter parameters: the paper's defaults, except the training loss's own.

    A margin the model was trained with applies to both triplet counters (Table 2
    compares them at one margin); a temperature only to its own loss (NT-Xent and
    SmoothAP use different ones).
    """
    trained = checkpoint["loss"]["name"]
    own = {k: v for k, v in checkpoint["loss"].get("params", {}).items() if k in ("margin", "tau")}
    params = {name: {} for name in losses}
    for name in losses:
        if "margin" in own and name in ("triplet", "triplet_sh") and trained in ("triplet", "triplet_sh"):
            params[name]["margin"] = own["margin"]
        if "tau" in own and name == trained:
            params[name]["tau"] = own["tau"]
    return params


def _clean(tree):
    """NaN -> None so that JSON stays valid; numpy scalars -> Python."""
    if isinstance(tree, dict):
        return {str(k): _clean(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_clean(v) for v in tree]
    if isinstance(tree, (np.floating, float)):
        return None if math.isnan(float(tree)) else float(tree)
    if isinstance(tree, np.integer):
        return int(tree)
    return tree


def analyze_checkpoint(
    checkpoint: str | os.PathLike,
    data: str | os.PathLike | None = None,
    *,
    losses=tuple(COUNTERS),
    batch_size: int = 128,
    seed: int = 0,
    compat: bool = False,
    split: str = "test",
    device: str = "auto",
    eps: float = 0.01,
    sweep_eps=DEFAULT_SWEEP,
    save_embeddings_to: str | os.PathLike | None = None,
    progress: bool = False,
) -> Analysis:
    """Encode the training split once, count every loss both ways (and in the other mode), evaluate."""
    losses = list(losses)
    clock = time.perf_counter()
    timings = {}
    frozen = FrozenModel.load(checkpoint, data, device)
    ckpt = frozen.checkpoint
    train = frozen.open_split("train")
    _check_batch_size(batch_size, train, losses)  # before minutes of encoding
    timings["load"] = time.perf_counter() - clock
    emb = frozen.encode(train, progress=progress)
    timings["encode"] = time.perf_counter() - clock - timings["load"]
    params = counter_params(ckpt, losses)
    for name in losses:
        if COUNTERS[name].uses_eps:
            params[name]["eps"] = eps
    run = count_embeddings(emb, losses, batch_size=batch_size, seed=seed, compat=compat, params=params,
                           sweep_eps=sweep_eps, progress=progress)
    alt = count_embeddings(emb, losses, batch_size=batch_size, seed=seed, compat=not compat,
                           params=params, keep_per_query=False)
    timings["count"] = time.perf_counter() - clock - timings["load"] - timings["encode"]
    eval_split = frozen.open_split(split)
    metrics = frozen.evaluate(eval_split, progress=progress)
    timings["evaluate"] = time.perf_counter() - clock - sum(timings.values())
    if save_embeddings_to is not None:  # last: a failed analysis leaves no partial output
        save_embeddings(save_embeddings_to, emb)
    data_info = ckpt["data"]
    results = {
        "cocos_version": __version__,
        "checkpoint": {"path": str(checkpoint), "sha256": frozen.sha256(), "epoch": int(ckpt["epoch"])},
        "data": {"path": str(frozen.data_folder), "name": _dataset_name(frozen.data_folder),
                 "fingerprint": data_info["fingerprint"], "k": frozen.k, "split_counted": "train",
                 "n_images": train.n_images, "n_captions": train.n_captions},
        "model": {"kind": ckpt["model"]["kind"], "hparams": ckpt["model"]["hparams"]},
        "training": {"loss": ckpt["loss"]["name"], "params": ckpt["loss"].get("params", {}),
                     "seed": int(ckpt.get("train", {}).get("seed", 0))},
        "counting": {"compat": compat, "seed": seed, "batch_size": batch_size, "n_batches": run.n_batches,
                     "losses": losses, "params": run.params, "eps_sweep": [float(e) for e in sweep_eps]},
        "stats": run.summary(),
        "alt_stats": alt.summary(),
        "sweep": run.sweep_summary(),
        "evaluation": {"split": eval_split.split, "metrics": metrics},
    }
    return Analysis(results=_clean(results), run=run, embeddings=emb, timings=timings)


def _check_batch_size(batch_size: int, split, losses) -> None:
    from cocos.losses import LOSSES

    if batch_size < 1:
        raise CocosError(f"batch size must be positive, got {batch_size}")
    if any(LOSSES[n].batch_layout == "ranking" for n in losses) and batch_size > split.n_images:
        raise CocosError(f"batch size {batch_size} is larger than the training split ({split.n_images} images)")
    if batch_size > split.n_captions:
        raise CocosError(f"batch size {batch_size} is larger than the training split ({split.n_captions} captions)")


def _dataset_name(folder: Path) -> str:
    """The dataset's name: ``name`` in a ``synth.json``/``dataset.json`` if present, else the folder name."""
    import json

    for meta in ("dataset.json", "synth.json"):
        path = folder / meta
        if path.is_file():
            try:
                name = json.loads(path.read_text()).get("name")
            except (ValueError, OSError, AttributeError):
                name = None
            if isinstance(name, str) and name:
                return name
    return folder.resolve().name


# -- writing the report --------------------------------------------------------------

def default_out(checkpoint: str | os.PathLike) -> Path:
    """``reports/<name>/``; for ``checkpoints/NAME/model_best.pt`` the name is ``NAME``."""
    path = Path(checkpoint)
    name = path.parent.name if path.stem in ("model_best", "last") and path.parent.name else path.stem
    return Path("reports") / name


def diagram_params(results: dict) -> dict:
    margin = results["training"]["params"].get("margin", 0.2)
    tau = results["counting"]["params"].get("ntxent", {}).get("tau", 0.1)
    return {"margin": margin, "tau": 1.0 / tau}


def markdown_report(results: dict, tables) -> str:
    from cocos.report.tables import to_markdown

    ck, model, train = results["checkpoint"], results["model"], results["training"]
    counting = results["counting"]
    head = [
        f"# COCOS analysis of `{ck['path']}`",
        "",
        f"- model: {model['kind']}, trained with `{train['loss']}` {train['params']} (seed {train['seed']}), "
        f"epoch {ck['epoch']}",
        f"- data: {results['data']['name']} ({results['data']['n_images']} training images, "
        f"{results['data']['n_captions']} captions), fingerprint `{results['data']['fingerprint']}`",
        f"- counting: {'compat (published counter)' if counting['compat'] else 'corrected'}, batch size "
        f"{counting['batch_size']}, seed {counting['seed']}, {counting['n_batches']} batches",
        "",
    ]
    return "\n".join(head) + "\n" + "\n\n".join(to_markdown(t) for t in tables) + "\n"


def latex_report(tables) -> str:
    from cocos.report.tables import to_latex

    return "% Generated by cocos analyze; needs \\usepackage{booktabs}\n" + "\n\n".join(
        to_latex(t) for t in tables) + "\n"


def write_analysis(analysis: Analysis, out: str | os.PathLike, inputs=(), overwrite: bool = False) -> list[Path]:
    """Write results.json, tables.md/.tex and the figures into ``out``, atomically as a folder.

    ``out`` may be replaced only if cocos wrote it (or with ``overwrite``); never if it holds one of ``inputs``.
    """
    from cocos.io import atomic_dir, write_json, write_text
    from cocos.report.diagram import plot_triplet_diagram, triplet_points
    from cocos.report.figures import plot_count_distributions, plot_eps_sweep
    from cocos.report.tables import MAIN_STAT, cocos_tables, retrieval_table

    results = analysis.results
    tables = [retrieval_table(results), *cocos_tables(results)]
    out = Path(out)
    with atomic_dir(out, inputs, overwrite) as tmp:
        write_json(tmp / "results.json", results)
        write_text(tmp / "tables.md", markdown_report(results, tables))
        write_text(tmp / "tables.tex", latex_report(tables))
        per_query = {
            loss: {d: {MAIN_STAT[loss]: v[MAIN_STAT[loss]]} for d, v in by_dir.items()}
            for loss, by_dir in analysis.run.per_query.items()
        }
        plot_count_distributions(per_query, tmp / "counts")
        if results["sweep"]:
            plot_eps_sweep(results["sweep"], tmp / "eps_sweep")
        counting = results["counting"]
        points = triplet_points(analysis.embeddings, batch_size=counting["batch_size"], seed=counting["seed"],
                                compat=counting["compat"])
        plot_triplet_diagram(["T_con", "T_nca"], params=diagram_params(results), points=points,
                             path_stem=tmp / "triplet_diagram",
                             title=f"{results['model']['kind']} / {results['training']['loss']}: training triplets")
    return sorted(p for p in out.iterdir() if not p.name.startswith("."))


def summary_lines(results: dict) -> list[str]:
    """The terminal summary: the evaluation line and the headline counts."""
    m = results["evaluation"]["metrics"]
    lines = [f"{results['evaluation']['split']}: rsum {m['rsum']:.1f}  i2t R@1/5/10 "
             f"{m['i2t_R@1']:.1f}/{m['i2t_R@5']:.1f}/{m['i2t_R@10']:.1f}  t2i "
             f"{m['t2i_R@1']:.1f}/{m['t2i_R@5']:.1f}/{m['t2i_R@10']:.1f}  mAP@5 {m['mAP@5']:.3f}"]

    def cell(loss, d, stat):
        e = results["stats"].get(loss, {}).get(d, {}).get(stat)
        return "n/a" if not e or e["mean"] is None else f"{e['mean']:.2f}"

    for loss in results["stats"]:
        stats = ("C_qv-", "W_qv-", "W_qv+") if loss == "ntxent" else ("C_q", "C_0")
        parts = [f"{d} " + " ".join(f"{s} {cell(loss, d, s)}" for s in stats) for d in ("i2t", "t2i")]
        lines.append(f"  {loss:<10} " + " | ".join(parts))
    return lines
