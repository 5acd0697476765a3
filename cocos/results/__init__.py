"""``results.json``: one typed record of a counting run, read and written through :class:`Results`.

``cocos analyze`` (a checkpoint) and ``cocos count`` (anyone's embeddings) write the
same record; ``cocos report`` reads any number of them. The statistics are one tidy
table, ``statistics``: one record per (loss, direction, mode, eps, stat) with its
``mean``, ``std``, ``n`` and ``n_skipped`` over batches, both counting modes and the
ε sweep (``eps`` null for counters without a threshold). It is the engine's
summary (:func:`cocos.counting.engine.summarise`) as written, and
:meth:`Results.frame` gives it back as a DataFrame to the report; the views the report
needs (:meth:`Results.main`, :meth:`Results.sweep_frame`) are selections of it. Files
of versions 1-3 held the statistics as nested objects (``stats``, ``alt_stats``,
``sweep``); they are read into the same table (:func:`records_from_trees`). The
metadata around the statistics are dataclasses with a format version. The layout is
documented in ``cocos/results/SCHEMA.md`` (a test checks it against a written file).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cocos import typed
from cocos.errors import CocosError
from cocos.io import write_json
from cocos.presentation import Presentation

FORMAT = "cocos-results"
# 4: the statistics are one list of records (``statistics``); 3: each loss's presentation is stored
# (``presentation``); 1-3 are still read
FORMAT_VERSION = 4
# Presentations of the built-in families as cocos 0.1 showed them: for files of versions 1 and 2, which lack them.
BUILTIN_PRESENTATION = Path(__file__).with_name("builtin_presentation.json")
KINDS = ("analyze", "count")
MODEL_NAMES = {"vsepp": "VSE++", "vsrn": "VSRN", "vsepp_full": "VSE++", "vse_infty": "VSE∞", "vse_infty_full": "VSE∞"}
FULL_MODELS = ("vsepp_full", "vse_infty_full")  # raw-image families: their label names the CNN and whether trained
MODES = ("corrected", "compat")
STAT_KEYS = ("loss", "direction", "mode", "eps", "stat")  # one record per key
STAT_COLUMNS = (*STAT_KEYS, "mean", "std", "n", "n_skipped")
_DTYPE = {"loss": object, "direction": object, "mode": object, "stat": object, "n": np.int64, "n_skipped": np.int64}


def cnn_name(cnn_type: str) -> str:
    """``resnet18`` -> ``ResNet-18``, ``vgg19`` -> ``VGG-19``, ``resnext101_32x8d`` -> ``ResNeXt-101 32x8d`` (other
    names as they are)."""
    if cnn_type.startswith("resnext") and "_" in cnn_type:
        depth, width = cnn_type[len("resnext"):].split("_", 1)
        return f"ResNeXt-{depth} {width}"
    for prefix, shown in (("resnet", "ResNet-"), ("vgg", "VGG-")):
        if cnn_type.startswith(prefix) and cnn_type[len(prefix):].isdigit():
            return shown + cnn_type[len(prefix):]
    return cnn_type


def model_label(kind: str, hparams: dict | None = None) -> str:
    """How reports name a model: ``VSE++``, ``VSRN``; a raw-image VSE++ with its CNN and whether it was
    trained, e.g. ``VSE++ (ResNet-18, fine-tuned)`` or ``VSE++ (ResNet-50, frozen)``."""
    name = MODEL_NAMES.get(kind, kind)
    hparams = hparams or {}
    if kind in FULL_MODELS and hparams.get("cnn_type"):
        name += f" ({cnn_name(str(hparams['cnn_type']))}, {'fine-tuned' if hparams.get('finetune') else 'frozen'})"
    return name


def mode_of(compat: bool) -> str:
    return "compat" if compat else "corrected"


@dataclass
class Source:
    """Where the embeddings came from: a checkpoint (``analyze``) or an embeddings file (``count``)."""

    kind: str  # "analyze" or "count"
    path: str
    sha256: str
    epoch: int | None = None  # analyze: the checkpoint's last finished epoch


@dataclass
class DataInfo:
    name: str  # the dataset's name (grouping key)
    path: str
    fingerprint: str
    n_images: int
    n_captions: int
    k: int | None = None  # captions per image, when every image has the same number
    split_counted: str | None = None  # "train" for analyze
    # raw images: the evaluation transform the counted embeddings were made with ({"resize", "crop_size", "weights"}:
    # the known weights file's readable name, or None)
    image_transform: dict | None = None


@dataclass
class ModelInfo:
    label: str  # what the embeddings are, e.g. "VSE++" or "CLIP ViT-B/32" (grouping key)
    kind: str | None = None  # "vsepp" / "vsrn" for checkpoints
    hparams: dict = field(default_factory=dict)


@dataclass
class TrainingInfo:
    loss: str
    params: dict = field(default_factory=dict)
    seed: int = 0
    ltd: dict | None = None  # latent target decoding: {"mode", "eta", "beta"} when trained with cocos train --ltd
    warmup_epochs: int = 0  # epochs 1..warmup_epochs were trained with warmup_loss (cocos train --warmup-epochs)
    warmup_loss: str | None = None  # the family trained during the warm-up (Triplet SH: triplet), None without one


@dataclass
class CountingInfo:
    compat: bool  # the mode reports show by default (the statistics hold both)
    seed: int
    batch_size: int
    n_batches: dict  # layout -> number of batches
    losses: list  # counted losses, in order
    params: dict  # loss -> counter parameters
    eps_sweep: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # loss -> label, for losses outside the registry


@dataclass
class Evaluation:
    split: str
    metrics: dict
    n_images: int | None = None  # images of the evaluated split (None in files before cocos 0.2: chance unknown)
    n_captions: int | None = None  # its captions


CHANCE_NOISE_SD = 3.0  # "within noise of chance": rsum below chance + 3 standard deviations of a random ranking
RECALL_KS = (1, 5, 10)


def _recall_moments(p_below) -> tuple[float, float]:
    """Mean and variance of one query's ``X = sum_K 1[rank < K]`` over K in 1, 5, 10, where ``p_below(K)`` is
    ``P(rank < K)`` (nested events: ``E[X^2] = sum_{K,K'} P(rank < min(K, K'))``)."""
    p = {k: p_below(k) for k in RECALL_KS}
    mean = sum(p.values())
    second = sum(p[min(a, b)] for a in RECALL_KS for b in RECALL_KS)
    return mean, max(second - mean * mean, 0.0)


def chance_rsum(n_images: int, n_captions: int) -> tuple[float, float]:
    """The rsum of a model that ranks at random, and its standard deviation (definitions file, "Chance").

    t2i: a caption's one image is at a uniform rank among ``N`` images, ``P(rank < K) = K / N``. i2t: an image's
    best rank among its ``k = n_captions // n_images`` captions in ``M = n_captions`` candidates,
    ``P(rank < K) = 1 - C(M - k, K) / C(M, K)`` (no positive in the top K). The expected rsum is 100 times the sum
    of these six probabilities. The standard deviation is bounded by ``100 * (sqrt(Var_i2t(X) / N) +
    sqrt(Var_t2i(X) / M))``, ``X`` a query's number of recalls hit: queries of one direction are independent
    under random scores, but the two directions share the score matrix (an image and its captions succeed
    together), and ``sd(A + B) <= sd(A) + sd(B)`` holds for any correlation (N = 100, k = 5: chance 31.6,
    bound 7.6; simulated: 31.8 and 7.0)."""
    n, m = int(n_images), int(n_captions)
    if n < 1 or m < n:
        raise ValueError(f"chance rsum needs at least one image and a caption per image, got {n} and {m}")
    k = m // n

    def miss(K: int) -> float:  # C(m - k, K) / C(m, K) as a product (no huge integers)
        out = 1.0
        for j in range(min(K, m)):
            out *= max(m - k - j, 0) / (m - j)
        return out

    i2t_mean, i2t_var = _recall_moments(lambda K: 1.0 - miss(K))
    t2i_mean, t2i_var = _recall_moments(lambda K: min(K, n) / n)
    return 100.0 * (i2t_mean + t2i_mean), 100.0 * (math.sqrt(i2t_var / n) + math.sqrt(t2i_var / m))


@dataclass
class Results:
    """One ``results.json``. ``training`` and ``evaluation`` are ``None`` for ``cocos count``."""

    source: Source
    data: DataInfo
    model: ModelInfo
    counting: CountingInfo
    statistics: list = field(default_factory=list)  # records of STAT_COLUMNS, in record_order
    training: TrainingInfo | None = None
    evaluation: Evaluation | None = None
    cocos_version: str = ""
    presentation: dict = field(default_factory=dict)  # loss -> Presentation: how reports show it
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    path: str | None = field(default=None, compare=False)  # the file it was read from (not written)

    # -- what cocos report groups by -------------------------------------------------------

    @property
    def replicate(self) -> int:
        """The seed that tells replicates apart: the training seed of a checkpoint, else the counting seed."""
        return self.training.seed if self.training is not None else self.counting.seed

    @property
    def where(self) -> str:
        return self.path or self.source.path

    @property
    def chance(self) -> tuple[float, float] | None:
        """``(chance rsum, its standard deviation)`` on the evaluated split (:func:`chance_rsum`); None where the
        file does not record the split's size."""
        e = self.evaluation
        if e is None or not e.n_images or not e.n_captions or e.n_captions < e.n_images:
            return None
        return chance_rsum(e.n_images, e.n_captions)

    @property
    def at_chance(self) -> bool:
        """Whether the test rsum is within noise of chance: below ``chance + CHANCE_NOISE_SD`` standard deviations
        (definitions file, "Chance"). False where unknown."""
        chance, rsum = self.chance, (self.evaluation.metrics.get("rsum") if self.evaluation else None)
        return chance is not None and _is_number(rsum) and rsum < chance[0] + CHANCE_NOISE_SD * chance[1]

    @property
    def warmup_selected(self) -> bool:
        """Whether the analysed checkpoint's last epoch is a warm-up epoch: the model was trained only with the
        warm-up loss (Triplet SH's all-triplet warm-up), so its rows are not its loss's."""
        t = self.training
        return (t is not None and bool(t.warmup_loss) and t.warmup_epochs > 0 and self.source.epoch is not None
                and self.source.epoch <= t.warmup_epochs)

    def honesty_notes(self) -> list[str]:
        """One sentence per reason a reader could be misled by this model's numbers (warm-up, chance)."""
        notes = []
        if self.warmup_selected:
            notes.append(f"the selected checkpoint (epoch {self.source.epoch}) is a warm-up epoch: the model was "
                         f"trained only with the {self.training.warmup_loss} loss so far")
        if self.at_chance:
            chance, sd = self.chance
            notes.append(f"test rsum {self.evaluation.metrics['rsum']:.1f} is within noise of chance ({chance:.1f}, "
                         f"+{CHANCE_NOISE_SD:g} sd = {chance + CHANCE_NOISE_SD * sd:.1f}): the model retrieves no "
                         "better than a random ranking")
        return notes

    def look(self, loss: str) -> Presentation:
        """How ``loss`` is shown, as this file says (a loss it does not describe: its name, grey)."""
        return self.presentation.get(loss) or Presentation(label=loss)

    # -- the statistics: one table, and the views the report reads --------------------------------

    @property
    def mode(self) -> str:
        """The counting mode shown by default: the one the file was counted in."""
        return mode_of(self.counting.compat)

    def frame(self) -> pd.DataFrame:
        """The statistics as a DataFrame (STAT_COLUMNS): ``eps``, ``mean`` and ``std`` NaN where null."""
        rows = self.statistics
        return pd.DataFrame({k: np.array([np.nan if r[k] is None else r[k] for r in rows], dtype=float)
                             if k in ("eps", "mean", "std") else np.array([r[k] for r in rows], dtype=_DTYPE[k])
                             for k in STAT_COLUMNS})

    def own_eps(self) -> dict:
        """Each counter's own threshold (NaN for counters without one), as ``counting.params`` records it."""
        params = self.counting.params
        return {name: float(p["eps"]) if _is_number(p.get("eps")) else np.nan for name, p in params.items()}

    def modes(self) -> set[str]:
        return {r["mode"] for r in self.statistics}

    def main(self, mode: str | None = None) -> pd.DataFrame:
        """The rows of one mode (default :attr:`mode`; ``"all"``: every mode) at each counter's own threshold: what
        the tables show."""
        f = self.frame()
        own = f["eps"].isna() | (f["eps"] == f["loss"].map(self.own_eps()))
        return f[own & ((mode == "all") | (f["mode"] == (mode or self.mode)))].reset_index(drop=True)

    def sweep_frame(self, mode: str | None = None) -> pd.DataFrame:
        """The ε sweep of one mode (default :attr:`mode`): the rows with a threshold of the statistics counted at
        more than one, by increasing eps."""
        f = self.frame()
        f = f[(f["mode"] == (mode or self.mode)) & f["eps"].notna()]
        swept = set(f.loc[f["eps"] != f["loss"].map(self.own_eps()), "stat"])
        return f[f["stat"].isin(swept)].sort_values("eps", kind="stable").reset_index(drop=True)

    # -- files of format 3 and earlier: their nested statistics, as views of the table ----------------

    @property
    def stats(self) -> dict:
        """``{loss: {direction: {stat: {mean, std, n, n_skipped}}}}`` of :attr:`mode` (the format-3 ``stats``)."""
        return _nest(self.main(), ["loss", "direction", "stat"])

    @property
    def alt_stats(self) -> dict | None:
        """The same for the other mode (the format-3 ``alt_stats``), ``None`` if it was not counted."""
        other = mode_of(not self.counting.compat)
        return _nest(self.main(other), ["loss", "direction", "stat"]) if other in self.modes() else None

    @property
    def sweep(self) -> dict:
        """``{loss: {direction: {eps: {stat: {...}}}}}`` of :attr:`mode`, eps as text (the format-3 ``sweep``)."""
        f = self.sweep_frame()
        return _nest(f.assign(eps=f["eps"].map(lambda e: f"{e:g}")), ["loss", "direction", "eps", "stat"])

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("path")
        out["presentation"] = {name: look.to_dict() for name, look in self.presentation.items()}
        return _clean(out)

    def write(self, path: str | os.PathLike) -> None:

        write_json(path, self.to_dict())

    @classmethod
    def read(cls, path: str | os.PathLike) -> Results:
        """Load and validate one file; a bad file is one CocosError line naming it."""
        path = Path(path)
        if not path.exists():
            raise CocosError(f"{path}: no such file")
        if path.is_dir():
            raise CocosError(f"{path}: is a folder, not a results.json file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CocosError(f"{path}: cannot be read ({type(exc).__name__})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CocosError(f"{path}: invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
        except RecursionError:
            raise CocosError(f"{path}: invalid JSON (nested too deeply)") from None
        except ValueError as exc:  # e.g. an integer past Python's digit limit
            raise CocosError(f"{path}: invalid JSON ({(str(exc).splitlines() or ['?'])[0][:120]})") from None
        try:
            results = cls.from_dict(data)
        except CocosError as exc:
            raise CocosError(f"{path}: {exc}") from None
        results.path = str(path)
        return results

    @classmethod
    def from_dict(cls, data: Any) -> Results:
        if not isinstance(data, dict):
            raise CocosError(f"not a cocos results file (top level is a {type(data).__name__}, expected an object)")
        if "format" not in data and "checkpoint" in data:
            data = _from_v1(data)
        if data.get("format") != FORMAT:
            raise CocosError(f"not a cocos results file (format is {data.get('format')!r}, expected {FORMAT!r})")
        version = data.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
            raise CocosError(f"results format version {version!r} is not supported (this cocos reads up to "
                             f"{FORMAT_VERSION}; update cocos)")
        try:
            results = cls(
                source=_typed(Source, data, "source"),
                data=_typed(DataInfo, data, "data"),
                model=_typed(ModelInfo, data, "model"),
                counting=_typed(CountingInfo, data, "counting"),
                statistics=_statistics(data, version),
                training=_typed(TrainingInfo, data, "training") if data.get("training") is not None else None,
                evaluation=_typed(Evaluation, data, "evaluation") if data.get("evaluation") is not None else None,
                cocos_version=str(data.get("cocos_version", "")),
                presentation=_presentation(data, version),
                format_version=FORMAT_VERSION,  # read in any supported version, held (and written) in the current one
            )
        except CocosError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise CocosError(f"not a cocos results file ({str(exc).splitlines()[0]})") from None
        _check_contents(results)
        return results


def record_order(record: dict) -> tuple:
    """The order of the records in a file: by loss, direction, mode, eps (null first) and statistic."""
    eps = record["eps"]
    return (record["loss"], record["direction"], record["mode"], eps is not None, eps or 0.0, record["stat"])


def _number(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _record(key: dict, mean, std, n, n_skipped) -> dict:
    """One record; ``std`` is null where no batch entered (as ``mean``)."""
    return {**key, "eps": _number(key["eps"]), "mean": _number(mean), "std": _number(std) if n else None,
            "n": int(n), "n_skipped": int(n_skipped)}


def records(summary: pd.DataFrame) -> list[dict]:
    """The records of a summary frame (:func:`cocos.counting.engine.summarise`: STAT_COLUMNS), in record order."""
    out = [_record({k: row[k] for k in STAT_KEYS} | {"loss": str(row["loss"]), "direction": str(row["direction"]),
                                                     "mode": str(row["mode"]), "stat": str(row["stat"])},
                   row["mean"], row["std"], row["n"], row["n_skipped"])
           for row in summary[list(STAT_COLUMNS)].to_dict("records")]
    return sorted(out, key=record_order)


def records_from_trees(stats: dict, alt_stats: dict | None, sweep: dict, compat: bool, params: dict) -> list[dict]:
    """The records of a format-3 (or older) file: ``stats`` (the file's mode) and ``alt_stats`` (the other) at each
    counter's own threshold (``params[loss]["eps"]``, null without one) and the ``sweep`` of the file's mode at its
    thresholds (its row at the own threshold is the ``stats`` entry again)."""
    own = {name: p["eps"] for name, p in params.items() if isinstance(p, dict) and _is_number(p.get("eps"))}
    out: dict[tuple, dict] = {}

    def add(loss, d, mode, eps, stat, e):
        key = (loss, d, mode, eps, stat)
        if key not in out:
            out[key] = _record(dict(zip(STAT_KEYS, key, strict=True)), e.get("mean"), e.get("std"), e.get("n", 0),
                               e.get("n_skipped", 0))

    for mode, tree in ((mode_of(compat), stats), (mode_of(not compat), alt_stats or {})):
        for loss, by_dir in tree.items():
            for d, by_stat in by_dir.items():
                for stat, e in by_stat.items():
                    add(loss, d, mode, own.get(loss), stat, e)
    for loss, by_dir in sweep.items():
        mine = own.get(loss)
        for d, by_eps in by_dir.items():
            for eps, by_stat in by_eps.items():
                value = mine if mine is not None and eps == f"{mine:g}" else float(eps)
                for stat, e in by_stat.items():
                    add(loss, d, mode_of(compat), value, stat, e)
    return sorted(out.values(), key=record_order)


def _nest(frame: pd.DataFrame, keys: list[str]) -> dict:
    """Rows of the table as nested dicts ``{k1: {k2: ... {stat: {mean, std, n, n_skipped}}}}`` (format 3)."""
    out: dict = {}
    for row in frame.to_dict("records"):
        node = out
        for k in keys[:-1]:
            node = node.setdefault(str(row[k]), {})
        node[str(row[keys[-1]])] = {"mean": _number(row["mean"]), "std": _number(row["std"]), "n": int(row["n"]),
                                    "n_skipped": int(row["n_skipped"])}
    return out


def _presentation(data: dict, version: int) -> dict:
    """``presentation`` of a version-3 file; for older files, the built-in families as cocos 0.1 showed them and
    the labels the file recorded for other losses."""
    if version >= 3:
        node = data.get("presentation")
        if not isinstance(node, dict):
            raise CocosError("not a cocos results file ('presentation' must be an object)")
        return {str(k): Presentation.from_dict(v) for k, v in node.items()}
    builtin = builtin_presentations()
    counting, training = data.get("counting") or {}, data.get("training") or {}
    labels = counting.get("labels") or {}
    wanted = [*(counting.get("losses") or []), *([training["loss"]] if training.get("loss") else [])]
    return {str(n): builtin[n] if n in builtin else Presentation(label=str(labels.get(n, n)))
            for n in wanted if isinstance(n, str)}


def builtin_presentations() -> dict[str, Presentation]:
    """The built-in families as cocos 0.1 showed them (what files of versions 1 and 2 are read with)."""
    data = json.loads(BUILTIN_PRESENTATION.read_text(encoding="utf-8"))
    return {name: Presentation.from_dict(look) for name, look in data.items()}


def lookup(tree, *keys):
    """``tree[k1][k2]...``, or None where a level is missing (one reader instead of ``.get().get()`` chains)."""
    for key in keys:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


# -- validation -------------------------------------------------------------------------------

def _typed(cls, data: dict, key: str):
    """Build dataclass ``cls`` from ``data[key]``, its fields checked by :mod:`cocos.typed` (one line otherwise)."""
    node = data.get(key)
    if not isinstance(node, dict):
        raise CocosError(f"not a cocos results file ('{key}' must be an object)")
    found = typed.problem(cls, node, lambda v: type(v).__name__)
    if found is not None:
        field_name, message = found
        detail = f"missing {key}.{field_name}" if message == "is missing" else f"{key}.{field_name} {message}"
        raise CocosError(f"not a cocos results file ({detail})")
    return typed.build(cls, node)


def _shown(name) -> str:
    """A name from a file as an error message shows it: as written, or quoted if it holds line breaks and the like."""
    return str(name) if str(name).isprintable() else repr(name)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# The checks of _check_contents, in order: (what must hold of the results, the error's detail); the counters'
# parameters are checked by _check_params, which names the counter in its own line.
_CONTENT_CHECKS = (
    (lambda r: r.source.kind in KINDS, f"source.kind must be one of {', '.join(KINDS)}"),
    (lambda r: all(isinstance(x, str) for x in r.counting.losses), "counting.losses must be names"),
    (lambda r: _check_params(r.counting.params), None),
    (lambda r: all(_is_number(v) for v in r.counting.n_batches.values()), "counting.n_batches must hold numbers"),
    (lambda r: all(isinstance(v, str) for v in r.counting.labels.values()), "counting.labels must hold text"),
    (lambda r: r.evaluation is None or all(_is_number(v) for v in r.evaluation.metrics.values()),
     "evaluation.metrics must hold numbers"),
)


def _check_contents(r: Results) -> None:
    """The nested values the reports read: counter names and parameters, batch counts, metrics
    (:data:`_CONTENT_CHECKS`, in order; the first that fails is one line)."""
    for holds, detail in _CONTENT_CHECKS:
        if not holds(r):
            raise CocosError(f"not a cocos results file ({detail})")


def _check_params(params: dict) -> bool:
    """Each counter's parameters map names to numbers or text, and ``eps``, where given, is a number; True, or one
    line naming the counter."""
    for name, p in params.items():
        if not isinstance(p, dict) or not all(isinstance(v, (int, float, str)) for v in p.values()):
            raise CocosError(f"not a cocos results file (counting.params.{_shown(name)} must map names to numbers)")
        if "eps" in p and not _is_number(p["eps"]):
            raise CocosError(f"not a cocos results file (counting.params.{_shown(name)}.eps must be a number)")
    return True


def _statistics(data: dict, version: int) -> list[dict]:
    """The records of a file: ``statistics`` (version 4), else the nested trees of older versions, checked."""
    if version < 4:
        counting = data.get("counting") if isinstance(data.get("counting"), dict) else {}
        sweep = data.get("sweep") or {}
        if not isinstance(sweep, dict) or not all(isinstance(v, dict) for v in sweep.values()):
            raise CocosError("not a cocos results file ('sweep' must be an object)")
        for loss, by_dir in sweep.items():
            _stats({f"sweep.{_shown(loss)}": by_dir}, f"sweep.{_shown(loss)}")
        return records_from_trees(_stats(data, "stats"),
                                  _stats(data, "alt_stats") if data.get("alt_stats") is not None else None,
                                  sweep, bool(counting.get("compat")), counting.get("params") or {})
    rows = data.get("statistics")
    if not isinstance(rows, list):
        raise CocosError("not a cocos results file ('statistics' must be a list of records)")
    seen: dict[tuple, int] = {}
    for i, row in enumerate(rows):
        _check_record(row, f"statistics[{i}]")
        key = tuple(row[k] for k in STAT_KEYS)
        if key in seen:
            raise CocosError(f"not a cocos results file (statistics[{i}] repeats statistics[{seen[key]}]: "
                             f"{', '.join(map(_shown, key))})")
        seen[key] = i
    return sorted((dict(row) for row in rows), key=record_order)


def _check_record(row, where: str) -> None:
    if not isinstance(row, dict):
        raise CocosError(f"not a cocos results file ({where} must be an object)")
    missing = [k for k in STAT_COLUMNS if k not in row]
    if missing:
        raise CocosError(f"not a cocos results file ({where} has no {', '.join(missing)})")
    for key in ("loss", "direction", "stat"):
        if not isinstance(row[key], str):
            raise CocosError(f"not a cocos results file ({where}.{key} must be text)")
    if row["mode"] not in MODES:
        raise CocosError(f"not a cocos results file ({where}.mode must be one of {', '.join(MODES)})")
    for key in ("eps", "mean", "std"):
        v = row[key]
        if v is not None and not _is_number(v):
            raise CocosError(f"not a cocos results file ({where}.{key} must be a number or null)")
    for key in ("n", "n_skipped"):
        v = row[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CocosError(f"not a cocos results file ({where}.{key} must be a count)")


def _stats(data: dict, key: str) -> dict:
    """A nested statistics tree of versions 1-3, ``{loss: {direction: {stat: {mean, std, n, n_skipped}}}}``, checked."""
    tree = data.get(key)
    if not isinstance(tree, dict):
        raise CocosError(f"not a cocos results file ('{key}' must be an object)")
    for loss, by_dir in tree.items():
        if not isinstance(by_dir, dict):
            raise CocosError(f"not a cocos results file ({key}.{_shown(loss)} must be an object)")
        for d, stats in by_dir.items():
            if not isinstance(stats, dict) or not all(isinstance(e, dict) for e in stats.values()):
                raise CocosError(f"not a cocos results file ({key}.{_shown(loss)}.{_shown(d)} must map statistics to "
                                 "{mean, std, n, n_skipped})")
            for stat, e in stats.items():
                _check_entry(e, ".".join(_shown(x) for x in (key, loss, d, stat)))
    return tree


def _check_entry(e: dict, where: str) -> None:
    for part in ("mean", "std"):
        v = e.get(part)
        if v is not None and not _is_number(v):
            raise CocosError(f"not a cocos results file ({where}.{part} must be a number or null)")
    for part in ("n", "n_skipped"):
        v = e.get(part, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CocosError(f"not a cocos results file ({where}.{part} must be a count)")


def _from_v1(data: dict) -> dict:
    """A results.json of format version 1 (cocos 0.1 analyze) in the version-2 shape."""
    try:
        ck, d, m, tr, c = (data[k] for k in ("checkpoint", "data", "model", "training", "counting"))
        return {
            "format": FORMAT, "format_version": 1, "cocos_version": data.get("cocos_version", ""),
            "source": {"kind": "analyze", "path": ck["path"], "sha256": ck.get("sha256", ""),
                       "epoch": ck.get("epoch")},
            "data": {k: d.get(k) for k in ("name", "path", "fingerprint", "n_images", "n_captions", "k",
                                           "split_counted")},
            "model": {"label": MODEL_NAMES.get(m.get("kind"), m.get("kind")), "kind": m.get("kind"),
                      "hparams": m.get("hparams", {})},
            "training": tr,
            "counting": {k: c.get(k) for k in ("compat", "seed", "batch_size", "n_batches", "losses", "params")}
            | {"eps_sweep": c.get("eps_sweep", [])},
            "stats": data.get("stats"), "alt_stats": data.get("alt_stats"), "sweep": data.get("sweep") or {},
            "evaluation": data.get("evaluation"),
        }
    except (KeyError, TypeError, AttributeError):
        raise CocosError("not a cocos results file (an old format with missing parts)") from None


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
    if isinstance(tree, np.bool_):
        return bool(tree)
    return tree
