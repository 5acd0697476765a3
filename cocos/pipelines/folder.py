"""One report folder for any counting run: ``cocos analyze`` (a checkpoint) and ``cocos count`` (embeddings).

The folder holds ``results.json`` (the :class:`~cocos.results.Results` record),
``batches.csv`` (the tidy batch-level table, one row per loss, direction, mode, eps,
batch and statistic), ``queries.csv`` on request (one row per query, with the
dataset row of its image or caption), ``tables.md``/``tables.tex`` (built by
:mod:`cocos.report.merge`, the one table builder, as a group of one), and the
figures: per-query count distributions, the ε sweep and, when the embeddings are
given, the triplet diagram of the run's (s+, hardest s−) pairs; ``index.html``, a static page of all of it, with
the query explorer (``explorer.json``, ``thumbs/``) when the embeddings are given (:mod:`cocos.report.html`,
:mod:`cocos.pipelines.explorer`). The folder is written under a temporary name and moved into place whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from cocos.counting.engine import CountRun, EmbeddingSet
from cocos.defaults import DEFAULT_EPS, DEFAULT_MARGIN, DEFAULT_TAU_NTXENT
from cocos.io import atomic_dir, write_json
from cocos.losses.spec import format_value
from cocos.objectives import OBJECTIVES
from cocos.pipelines.explorer import explore, thumbnail_items, write_thumbnails
from cocos.pipelines.triplets import plot_triplet_diagram, triplet_points
from cocos.report.diagram import DIRECTION_STYLE
from cocos.report.figures import plot_count_distributions, plot_eps_sweep, plot_query_distributions
from cocos.report.html import folder_page
from cocos.report.merge import build_tables, group_results, loss_label, mode_name
from cocos.report.tables import MANY_TABLES, to_latex, to_markdown
from cocos.report.training import write_logs
from cocos.results import Results, cnn_name, lookup

CSV_FLOAT = "%.10g"


def describe(results: Results) -> list[str]:
    """The header lines of ``tables.md``: what was counted, how."""
    src, data, c = results.source, results.data, results.counting
    what = (f"checkpoint `{src.path}` (epoch {src.epoch})" if src.kind == "analyze" else f"embeddings `{src.path}`")
    lines = [f"# COCOS of {results.model.label} on {data.name}", "", f"- source: {what}, sha256 `{src.sha256[:16]}`"]
    if results.training is not None:
        t = results.training
        lines.append(f"- model: {results.model.label} ({results.model.kind}), trained with `{t.loss}` "
                     f"{_params(t.params)} (seed {t.seed})")
    lines.append(f"- data: {data.name} ({data.n_images} images, {data.n_captions} captions"
                 f"{', split ' + data.split_counted if data.split_counted else ''}), fingerprint "
                 f"`{data.fingerprint[:16]}`")
    images = image_transform_text(results)
    if images:
        lines.append(f"- images: {images}")
    batches = ", ".join(f"{n} {kind} batches" for kind, n in c.n_batches.items())
    lines.append(f"- counting: {'compat (published counter)' if c.compat else 'corrected'} shown, batch size "
                 f"{c.batch_size}, seed {c.seed}, {batches}")
    lines += [f"- **caution**: {note}" for note in results.honesty_notes()]
    return lines + [""]


def describe_transform(cnn_type: str | None, resize: int, crop_size: int, weights: str | None = None) -> str:
    """A raw-image model's CNN and evaluation transform as reports show it, e.g. ``ResNet-50 (torchvision
    ResNet50_Weights.IMAGENET1K_V2; eval Resize 232, CenterCrop 224)`` (``weights``: the readable name of a known
    weights file, :mod:`cocos.models.weights`)."""
    head = cnn_name(str(cnn_type)) if cnn_type else "CNN"
    return f"{head} ({f'{weights}; ' if weights else ''}eval Resize {int(resize)}, CenterCrop {int(crop_size)})"


def image_transform_text(results: Results) -> str | None:
    """:func:`describe_transform` of a raw-image analysis: the evaluation transform its ``data.image_transform``
    records (``{"resize", "crop_size", "weights"}``, :meth:`cocos.embed.images.ImageSource.transform_record`) with
    the model's ``cnn_type``; None for a model on precomputed features or a record without it."""
    record = getattr(results.data, "image_transform", None)
    if not isinstance(record, dict) or record.get("resize") is None or record.get("crop_size") is None:
        return None
    own = results.model.hparams.get("preprocess")
    if isinstance(own, dict):  # a model with its own preprocessing (CLIP)
        size = (f"resized to {int(own['resize'])} × {int(own['resize'])}, no crop" if own.get("squash") else
                f"Resize {int(own['resize'])}, CenterCrop {int(own['crop_size'])}")  # SigLIP's squash, CLIP's crop
        return (f"the model's own preprocessing ({size}, "
                f"{RESAMPLING_NAMES.get(own.get('resample'), 'PIL resampling ' + str(own.get('resample')))}, "
                f"mean {_triple(own['mean'])}, std {_triple(own['std'])})")
    return describe_transform(results.model.hparams.get("cnn_type"), record["resize"], record["crop_size"],
                              record.get("weights"))


RESAMPLING_NAMES = {0: "nearest", 1: "Lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "Hamming"}  # PIL's


def _triple(values) -> str:
    return "(" + ", ".join(f"{float(v):.3f}" for v in values) + ")"


def _params(params: dict) -> str:

    return "(" + ", ".join(f"{k} {format_value(v)}" for k, v in params.items()) + ")"


def result_tables(results: Results, label_prefix: str | None = None) -> list:
    """The folder's tables: the one table builder of :mod:`cocos.report.merge` over a group of one, every counter;
    their LaTeX labels start with ``label_prefix`` (``--label-prefix``)."""
    groups, _ = group_results([results])
    return build_tables(groups, counters="all", label_prefix=label_prefix)


def folder_tables(results: Results, latex_width: str = "column", tables=None) -> tuple[str, str]:
    """The contents of the folder's ``tables.md`` (with :func:`describe`'s header) and ``tables.tex``:
    :func:`result_tables` (or the ``tables`` already built from them)."""

    tables = result_tables(results) if tables is None else tables
    md = "\n".join(describe(results)) + "\n" + "\n\n".join(to_markdown(t) for t in tables) + "\n"
    tex = (f"% Generated by cocos; needs only \\usepackage{{booktabs}} and \\usepackage{{amsmath}}; set to fit "
           f"{'one LNCS column (12.2 cm)' if latex_width == 'column' else 'a page (table*, 12.2 cm in LNCS)'}\n"
           + "".join(f"% {line}\n" for line in MANY_TABLES)
           + "".join(f"% CAUTION: {note}\n" for note in results.honesty_notes())
           + "\n\n".join(to_latex(t, width=latex_width) for t in tables) + "\n")
    return md, tex


def write_results_folder(
    results: Results,
    run: CountRun,
    out: str | os.PathLike,
    inputs=(),
    overwrite: bool = False,
    *,
    per_query: bool = False,
    embeddings: EmbeddingSet | None = None,
    latex_width: str = "column",
    diagram_extent: tuple[float, float] | None = None,
    triplets: dict | None = None,
    logs=None,
    by: str | None = None,
    label_prefix: str | None = None,
) -> list[Path]:
    """Write the folder (see the module docstring) as a cocos report written ``by`` a command (``analyze``,
    ``count``, ``demo``, ``sweep``): ``out`` may be absent or empty, and an existing report is replaced only with
    ``overwrite`` (the demo's and a sweep's own without it); any other folder is refused
    (:func:`cocos.io.check_output_dir`).

    ``diagram_extent`` and ``triplets`` (the run's training triplets, if already computed) are for callers that
    draw several models on one square, as the demo does. ``logs`` (:class:`~cocos.report.training.TrainingLogs`)
    adds the run's ``train_log.csv`` and ``cocos_track.csv`` with their figures. ``label_prefix`` starts every
    LaTeX label of ``tables.tex`` (``--label-prefix``).
    """

    tables = result_tables(results, label_prefix)
    md, tex = folder_tables(results, latex_width, tables)
    shown = "compat" if results.counting.compat else "corrected"
    name = f"{results.model.label} on {results.data.name}"
    out = Path(out)
    with atomic_dir(out, inputs, overwrite, kind="report", by=by) as tmp:
        results.write(tmp / "results.json")
        run.to_frame().to_csv(tmp / "batches.csv", index=False, float_format=CSV_FLOAT)
        if per_query:
            run.to_frame("query").to_csv(tmp / "queries.csv", index=False, float_format=CSV_FLOAT)
        (tmp / "tables.md").write_text(md, encoding="utf-8")
        (tmp / "tables.tex").write_text(tex, encoding="utf-8")
        if run.queries is not None:
            queries = run.to_frame("query")
            plot_count_distributions(queries[queries["mode"] == shown], tmp / "counts",
                                     looks=results.presentation,
                                     title=f"{name}: contributing candidates per query ({shown} counting)")
        sweep = results.sweep_frame()
        if len(sweep):
            used = [p["eps"] for p in results.counting.params.values() if "eps" in p]
            plot_eps_sweep(sweep, tmp / "eps_sweep", looks=results.presentation,
                           eps=used[0] if used else DEFAULT_EPS,
                           title=f"{name}: COCOS vs threshold ε ({shown} counting)")
        if run.queries is not None:
            _distributions(results, run, shown, tmp, name)
        if embeddings is not None:
            _diagram(results, embeddings, tmp / "triplet_diagram", diagram_extent, triplets)
        if logs:

            trained = f" trained with {loss_label(results.training.loss, results)}" if results.training else ""
            write_logs(logs, tmp, title=f"{results.model.label}{trained} on {results.data.name}, "
                                        f"to epoch {results.source.epoch}", looks=results.presentation,
                       loss=results.training.loss if results.training else None, history=logs.history)
        write_page(tmp, results, tables, run, embeddings)
    return sorted(p for p in out.iterdir() if not p.name.startswith("."))


def write_page(folder: Path, results: Results, tables, run: CountRun | None = None,
               embeddings: EmbeddingSet | None = None) -> None:
    """``index.html`` of a written folder (:func:`cocos.report.html.folder_page`: its tables, its PNG figures, the
    run's record, its files) with, where the run kept per-query values and the embeddings are given, the query
    explorer (``explorer.json``, and ``thumbs/`` for a dataset with raw images: :mod:`cocos.pipelines.explorer`)."""
    explorer, thumbs = None, []
    if embeddings is not None and run is not None and run.queries is not None:
        explorer = explore(run, embeddings, results.counting.compat)
        write_json(folder / "explorer.json", explorer)
        pictures = getattr(embeddings, "pictures", None)
        if pictures is not None:
            thumbs = write_thumbnails(pictures, thumbnail_items(explorer), folder)
    figures = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.png")
                     if p.relative_to(folder).parts[0] != "thumbs")
    files = sorted([p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
                   + ["index.html"])
    images = image_transform_text(results)
    page = folder_page(results, tables, figures, files, explorer=explorer, thumbs=thumbs,
                       extra=[("Images", images)] if images else [])
    (folder / "index.html").write_text(page, encoding="utf-8")


def diagram_points(results: Results, embeddings: EmbeddingSet) -> dict:
    """The run's (s+, hardest s-) training triplets, from the same seeded pair batches as the counts."""

    c = results.counting
    return triplet_points(embeddings, batch_size=c.batch_size, seed=c.seed, compat=c.compat)


def _distributions(results: Results, run: CountRun, mode: str, folder: Path, name: str) -> None:
    """``<loss>_distributions.png``: the per-query statistics a family's spec asks to see (GOAL's T, P+, P-)."""

    q = run.to_frame("query")
    for loss in run.losses:
        spec = OBJECTIVES.get(loss)
        if spec is None or not spec.distributions:
            continue
        part = q[(q["loss"] == loss) & (q["mode"] == mode)]
        plot_query_distributions(part, spec.distributions, folder / f"{loss}_distributions",
                                 title=f"{name}: per-query {spec.label} statistics ({mode} counting)",
                                 color=spec.color)


def _diagram(results: Results, embeddings: EmbeddingSet, stem: Path, extent=None, triplets=None) -> None:
    """The triplet diagram with the run's training triplets: the model's own weights when its loss has a diagram
    (GOAL: its T and T*P+-), else T_con and T_nca (the paper's Figure 2)."""

    c = results.counting
    trained = results.training.params if results.training else {}
    spec = OBJECTIVES.get(results.training.loss) if results.training else None
    if spec is not None and spec.diagram is not None:
        own = spec.params(**trained)
        weights = spec.diagram(own)
        params = {k: v for k, v in own.items() if k not in ("triplet_weight", "pair_weight")}
    else:
        tau = lookup(c.params, "ntxent", "tau") or DEFAULT_TAU_NTXENT
        weights, params = ["T_con", "T_nca"], {"margin": trained.get("margin", DEFAULT_MARGIN), "tau": 1.0 / tau}
    by = f" trained with the {loss_label(results.training.loss, results)}" if results.training else ""
    which = "training triplets" if results.data.split_counted == "train" else "triplets"
    title = f"{results.model.label}{by} on {results.data.name}: {which} ({mode_name(c.compat)} counting)"
    points = triplets if triplets is not None else diagram_points(results, embeddings)
    color = results.look(results.training.loss).color if results.training else DIRECTION_STYLE["i2t"][0]
    plot_triplet_diagram(weights, params=params, points=points, path_stem=stem, extent=extent, title=title,
                         color=color, points_label=which)


def summary_lines(results: Results) -> list[str]:
    """The terminal summary: the evaluation line (if any) and each counter's paper statistics."""

    lines = []
    if results.evaluation is not None:
        m = results.evaluation.metrics
        lines.append(f"{results.evaluation.split}: rsum {m['rsum']:.1f}  i2t R@1/5/10 "
                     f"{m['i2t_R@1']:.1f}/{m['i2t_R@5']:.1f}/{m['i2t_R@10']:.1f}  t2i "
                     f"{m['t2i_R@1']:.1f}/{m['t2i_R@5']:.1f}/{m['t2i_R@10']:.1f}  mAP@5 {m['mAP@5']:.3f}")

    means = results.main().set_index(["loss", "direction", "stat"])["mean"]

    def cell(loss, d, stat):
        mean = means.get((loss, d, stat), np.nan)
        return "n/a" if np.isnan(mean) else f"{mean:.2f}"

    for loss in [n for n in results.counting.losses if n in set(means.index.get_level_values("loss"))]:
        spec = OBJECTIVES.get(loss)
        stats = spec.stats[:3] if spec is not None else ("C_q", "C_0")
        parts = [f"{d} " + " ".join(f"{s} {cell(loss, d, s)}" for s in stats) for d in ("i2t", "t2i")]
        lines.append(f"  {loss:<10} " + " | ".join(parts))
    return lines


def default_out(source: str | os.PathLike) -> Path:
    """``reports/NAME/`` for ``checkpoints/NAME/model_best.pt``; ``reports/NAME_last/`` for ``.../NAME/last.pt``
    (any other checkpoint of a run keeps its file name, so it never replaces the best one's analysis);
    ``reports/STEM/`` for a file outside a run folder."""
    path = Path(source)
    run = path.parent.name
    if not run or path.parent == Path("."):
        return Path("reports") / path.stem
    return Path("reports") / (run if path.stem == "model_best" else f"{run}_{path.stem}")
