"""``cocos demo --model clip``: a tiny CLIP pre-trained on the image world, then fine-tuned with three losses.

The question the demo asks: does the COCOS paper's finding (Triplet SH, whose gradient comes from about one negative
per query, beats losses that spread it over many) hold for a CLIP-style dual encoder and the losses CLIPs are
trained with? It runs, as a user would, on the rendered image world of ``cocos demo --images``
(:mod:`cocos.data.synth_images`, reused when its folder holds it):

1. **the demo's own tiny CLIP** (``CHECKPOINTS/clip_init/``): a Hugging Face ``CLIPConfig`` of two ViT towers
   (:class:`TinyCLIP`: 32-px images in 8-px patches, 64 units, 2 blocks a tower), randomly initialised from the
   seed, with a CLIP byte-level BPE tokenizer learned from the training captions (:func:`learn_bpe`, deterministic)
   and a ``CLIPImageProcessor`` (the whole 64-px image resized to 32: no crop cuts an object at the border), saved
   by ``save_pretrained`` as a CLIP folder. It is the demo's creation, not anyone's model: its ``README.md`` and
   ``cocos_demo.json`` say so, and no user folder is ever re-initialised;
2. **pre-training** (``CHECKPOINTS/clip_pretrain/``): ``cocos train --model clip --clip clip_init --loss ntxent
   --learn-tau`` on the world, CLIP's own objective (InfoNCE at its learned temperature), with the library's
   trainer (AdamW, weight decay 0.1, :data:`PRETRAIN_LR` dropped x0.1 before the last epoch);
3. **the pre-trained folder** (``CHECKPOINTS/clip_pretrained/``): the pre-training's best weights saved back as a
   CLIP folder (:func:`export_clip_folder`), which ``cocos analyze DIR --data IMAGES`` reads as any CLIP folder;
4. **fine-tuning** (``CHECKPOINTS/<loss>/``): ``cocos train --model clip --clip clip_pretrained`` with each loss
   (:data:`CLIP_LOSSES`: NT-Xent with its temperature learned, SigLIP with its ``t`` and ``b`` learned, Triplet SH
   with margin 0.2 and no warm-up: the model is pre-trained), :data:`ClipDemoConfig.epochs` epochs, COCOS tracked;
5. ``cocos analyze`` of each fine-tuned model on the same world, merged into one report (``reports/demo_clip/``:
   README, Tables 1-4, figures) as the other demos.

Every stage is reused when its record matches the settings and the data (a stage redone redoes the stages after
it), deterministic for a seed, and written under a temporary name and moved into place. Folders are checked
before any work as the other demos check theirs (:func:`cocos.io.check_output_dir`, ``by: demo``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict
from math import comb
from pathlib import Path

from cocos.data.images import load_image_split
from cocos.data.synth_images import make_synthetic_images
from cocos.errors import CocosError
from cocos.io import atomic_dir, check_interrupt, check_output_dir, check_writable_dir, sha256_file
from cocos.objectives import get_objective
from cocos.pipelines.analyze import analyze_checkpoint
from cocos.pipelines.demo import (
    DEMO_K,
    _check_data_folder,
    _check_run_folder,
    _fix_report_paths,
    _has_world,
    _run_state,
)
from cocos.pipelines.demo_clip_config import (  # noqa: F401  (re-exported)
    CLIP_DEFAULTS,
    CLIP_LOSSES,
    INIT_DIR,
    LOSS_NAMES,
    PRETRAIN_DIR,
    PRETRAIN_LR,
    PRETRAINED_DIR,
    ClipDemoConfig,
    TinyCLIP,
)
from cocos.pipelines.folder import diagram_points, summary_lines, write_results_folder
from cocos.pipelines.triplets import common_extent
from cocos.report.html import collection_page
from cocos.report.merge import build_report, write_report
from cocos.report.tables import to_markdown
from cocos.training.config import TrainConfig
from cocos.training.trainer import Trainer, with_recipe

RECORD = "cocos_demo.json"  # what the demo wrote into a CLIP folder of its own, and from what
FORMAT = 1
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


# -- the tokenizer and the folder ---------------------------------------------------------------------------------


def byte_alphabet() -> list[str]:
    """GPT-2's and CLIP's ``bytes_to_unicode``: a printable character for each byte, in CLIP's vocabulary order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(keep, keep, strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return [chr(chars[b]) for b in keep] + [chr(chars[b]) for b in range(256) if b not in set(keep)]


def _merge(symbols: tuple, pair: tuple) -> tuple:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def learn_bpe(words: Counter, min_count: int = 2) -> list[tuple[str, str]]:
    """Byte-pair merges learned from word counts (Sennrich et al.; CLIP's end-of-word ``</w>``): the most frequent
    adjacent pair merged until none occurs ``min_count`` times; ties broken by the pair itself, so the merges depend
    on the counts alone (deterministic)."""
    seqs = {w: (*w[:-1], w[-1] + "</w>") for w in words if w}
    merges: list[tuple[str, str]] = []
    while True:
        pairs: Counter = Counter()
        for w, n in words.items():
            s = seqs.get(w, ())
            for pair in zip(s, s[1:], strict=False):
                pairs[pair] += n
        if not pairs:
            return merges
        pair, n = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if n < min_count:
            return merges
        merges.append(pair)
        seqs = {w: _merge(s, pair) for w, s in seqs.items()}


def write_tokenizer(folder: Path, captions: Iterable[str]):
    """A CLIP tokenizer learned from ``captions`` in ``folder`` (``vocab.json``, ``merges.txt``): CLIP's vocabulary
    layout (the 256 byte characters, each with ``</w>``, the merges, then ``<|startoftext|>``, ``<|endoftext|>``),
    words split by CLIP's own normaliser and pre-tokeniser. Returns transformers' ``CLIPTokenizer`` of it."""
    import transformers

    alphabet = byte_alphabet()
    base = alphabet + [c + "</w>" for c in alphabet]
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    vocab.write_text(json.dumps({t: i for i, t in enumerate([*base, BOS, EOS])}), encoding="utf-8")
    merges.write_text("#version: 0.2\n", encoding="utf-8")
    backend = transformers.CLIPTokenizer(str(vocab), str(merges)).backend_tokenizer  # CLIP's word splitting
    words = Counter(w for c in captions
                    for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(c)))
    learned = learn_bpe(words)
    tokens: dict[str, int] = {}
    for token in [*base, *("".join(p) for p in learned), BOS, EOS]:
        tokens.setdefault(token, len(tokens))
    vocab.write_text(json.dumps(tokens, ensure_ascii=False), encoding="utf-8")
    merges.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in learned), encoding="utf-8")
    return transformers.CLIPTokenizer(str(vocab), str(merges))


def init_settings(cfg: ClipDemoConfig) -> dict:
    """What the random CLIP folder is made of (its record: reused when equal)."""
    return {"tower": asdict(cfg.tower), "seed": cfg.seed, "tokenizer": "byte-level BPE of the training captions"}


INIT_README = """# A tiny CLIP of cocos demo --model clip (random initialisation)

Written by `cocos demo --model clip`: a Hugging Face CLIP folder the demo made itself, not a released model. Two ViT
towers of {width} units and {layers} blocks ({image}-px images in {patch}-px patches, joint embedding {proj}),
**randomly initialised** from seed {seed}; its tokenizer is a CLIP byte-level BPE learned from the training captions
of `{data}`, its image processor resizes the whole image to {image} px. It is the starting point of the demo's
pre-training (`{pretrain}/`), whose result is saved as `{pretrained}/`.
"""

PRETRAINED_README = """# A tiny CLIP pre-trained by cocos demo --model clip

Written by `cocos demo --model clip`: the demo's own tiny CLIP (`{init}/`, random initialisation), pre-trained on
the synthetic image world `{data}` with CLIP's loss (InfoNCE at a learned temperature: `cocos train --model clip
--loss ntxent --learn-tau`, run folder `{pretrain}/`), its best epoch saved as a Hugging Face CLIP folder. Not a
released model; `cocos analyze {pretrained} --data {data}` reads it as any CLIP folder.
"""


def _quiet_transformers():
    from cocos.models.clip import _transformers

    return _transformers()  # its logging and progress bars off, one line if it is not installed


def write_init_folder(cfg: ClipDemoConfig, data: Path, folder: Path, fingerprint: str) -> None:
    """The demo's random tiny CLIP (module docstring, step 1), written atomically (kind ``pretrain``, by the demo)."""
    import torch

    transformers = _quiet_transformers()
    captions = load_image_split(data, "train").captions
    t = cfg.tower
    with atomic_dir(folder, [cfg.data], cfg.overwrite, kind="pretrain", by="demo", option="--checkpoints") as tmp:
        tok = write_tokenizer(tmp, captions)
        proc = transformers.CLIPImageProcessorPil(size={"shortest_edge": t.image_size},
                                                  crop_size={"height": t.image_size, "width": t.image_size})
        transformers.CLIPProcessor(image_processor=proc, tokenizer=tok).save_pretrained(str(tmp))
        config = transformers.CLIPConfig(**t.config(len(tok)))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            model = transformers.CLIPModel(config)
        model.save_pretrained(str(tmp))
        (tmp / "README.md").write_text(INIT_README.format(
            width=t.width, layers=t.layers, image=t.image_size, patch=t.patch_size, proj=t.projection_dim,
            seed=cfg.seed, data=cfg.data, pretrain=Path(cfg.checkpoints) / PRETRAIN_DIR,
            pretrained=Path(cfg.checkpoints) / PRETRAINED_DIR), encoding="utf-8")
        _write_record(tmp, {"made": "random initialisation", "settings": init_settings(cfg),
                            "train_fingerprint": fingerprint, "weights_sha256": sha256_file(tmp / "model.safetensors")})


def export_clip_folder(checkpoint: Path, init: Path, folder: Path, cfg: ClipDemoConfig) -> None:
    """A CLIP checkpoint of the trainer (``model_best.pt``) saved as a Hugging Face CLIP folder: transformers'
    ``CLIPModel`` with its weights, and the tokenizer and processor of the folder it started from (``init``)."""
    import torch

    from cocos.training.checkpoint import load_checkpoint

    transformers = _quiet_transformers()
    ckpt = load_checkpoint(checkpoint)
    state = {k.removeprefix("clip."): v for k, v in ckpt["state_dict"].items() if k.startswith("clip.")}
    with torch.random.fork_rng(devices=[]):  # its random initialisation, replaced, draws nothing from the run's
        model = transformers.CLIPModel(transformers.CLIPConfig.from_dict(dict(ckpt["model"]["hparams"]["clip_config"])))
    model.load_state_dict(state)
    with atomic_dir(folder, [cfg.data], cfg.overwrite, kind="pretrain", by="demo", option="--checkpoints") as tmp:
        for item in sorted(init.iterdir()):
            if item.is_file() and item.name not in ("config.json", "model.safetensors", RECORD, "README.md") \
                    and not item.name.startswith("."):
                shutil.copy2(item, tmp / item.name)
        with torch.no_grad():
            model.save_pretrained(str(tmp))
        (tmp / "README.md").write_text(PRETRAINED_README.format(
            init=init, data=cfg.data, pretrain=checkpoint.parent, pretrained=folder), encoding="utf-8")
        _write_record(tmp, {"made": "pre-trained", "from": _sha(checkpoint),
                            "epoch": ckpt.get("epoch"), "dev_rsum": (ckpt.get("metrics") or {}).get("rsum"),
                            "tau": (ckpt.get("loss") or {}).get("params", {}).get("tau")})


def _sha(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def _write_record(folder: Path, record: dict) -> None:
    (folder / RECORD).write_text(json.dumps({"format": FORMAT, **record}, indent=2, sort_keys=True) + "\n",
                                 encoding="utf-8")


def _read_record(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and record.get("format") == FORMAT else None


def _init_matches(cfg: ClipDemoConfig, folder: Path, fingerprint: str) -> bool:
    record = _read_record(folder)
    return (record is not None and record.get("settings") == init_settings(cfg)
            and record.get("train_fingerprint") == fingerprint
            and _sha(folder / "model.safetensors") == record.get("weights_sha256"))


def _export_matches(folder: Path, checkpoint: Path) -> bool:
    record = _read_record(folder)
    return record is not None and record.get("from") is not None and record.get("from") == _sha(checkpoint) \
        and (folder / "model.safetensors").is_file()


# -- the runs -----------------------------------------------------------------------------------------------------


def pretrain_config(cfg: ClipDemoConfig) -> TrainConfig:
    """Step 2: CLIP's loss (NT-Xent, temperature learned) from the random folder, CLIP's recipe at
    :data:`PRETRAIN_LR`, dropped x0.1 before the last epoch."""
    ck = Path(cfg.checkpoints)
    flat = dict(data=cfg.data, model="clip", sources={"clip": str(ck / INIT_DIR)}, loss="ntxent",
                out=str(ck / PRETRAIN_DIR), epochs=cfg.pretrain_epochs, lr=PRETRAIN_LR,
                lr_update=max(cfg.pretrain_epochs - 1, 1), batch_size=cfg.batch_size, seed=cfg.seed,
                device=cfg.device, track_cocos=None, workers=cfg.workers, learn_tau=True)
    return TrainConfig.of(**with_recipe(flat, lambda key: key in flat))


def finetune_config(cfg: ClipDemoConfig, loss: str) -> TrainConfig:
    """Step 4: the pre-trained folder fine-tuned with ``loss`` on CLIP's recipe (AdamW, weight decay 0.1, no
    gradient clipping; NT-Xent's temperature learned, SigLIP's t and b learned) at ``lr``, no warm-up."""
    ck = Path(cfg.checkpoints)
    flat = dict(data=cfg.data, model="clip", sources={"clip": str(ck / PRETRAINED_DIR)}, loss=loss,
                out=str(ck / loss), epochs=cfg.epochs, lr=cfg.lr, lr_update=cfg.epochs, batch_size=cfg.batch_size,
                seed=cfg.seed, device=cfg.device, track_cocos=cfg.track_cocos, workers=cfg.workers,
                warmup_epochs=0)
    return TrainConfig.of(**with_recipe(flat, lambda key: key in flat))


def chance_rsum(n_images: int, k: int = DEMO_K) -> float:
    """The expected rsum of a random ranking of ``n_images`` images with ``k`` captions each: image to text, R@K
    is the chance that one of ``k`` relevant captions of ``n_images * k`` is in the top K; text to image, K /
    ``n_images``."""
    n = n_images * k
    i2t = sum(1 - comb(n - k, min(r, n)) / comb(n, min(r, n)) for r in (1, 5, 10))
    t2i = sum(min(r / n_images, 1.0) for r in (1, 5, 10))
    return 100 * (i2t + t2i)


def _train(cfg: ClipDemoConfig, train_cfg: TrainConfig, fingerprint: str, forced: bool, name: str, progress: bool,
           log: Callable[[str], None]) -> bool:
    """Train one run with the library's trainer, or reuse it when it finished with exactly these settings on this
    data (resume one interrupted); ``forced``: an earlier stage was redone, train anew. Returns whether it trained."""
    train_cfg.validate()  # the family's defaults filled in, as the checkpoint records them
    state = "none" if cfg.retrain or forced else _run_state(train_cfg, fingerprint)
    if state == "done":
        log(f"[{name}] reusing {train_cfg.out}/model_best.pt")
        return False
    resume = state == "interrupted"
    log(f"[{name}] " + (f"resuming the interrupted run in {train_cfg.out} (last.pt)" if resume else
                        f"training CLIP with {get_objective(train_cfg.loss.name).label} for {train_cfg.optim.epochs} "
                        f"epochs (lr {train_cfg.optim.lr:g})"))
    Trainer(train_cfg, resume=resume, overwrite=not resume, progress=progress, by="demo",
            log=lambda s: log(f"[{name}] {s}")).fit()
    return True


# -- the demo -----------------------------------------------------------------------------------------------------


def check_settings(cfg: ClipDemoConfig) -> None:
    """The settings, before anything is read or written: known losses, positive sizes and epochs."""
    for loss in cfg.losses:
        get_objective(loss)  # one line listing the registered losses
    for name, low in (("pretrain_epochs", 1), ("epochs", 1), ("batch_size", 2), ("n_train", 1), ("n_dev", 1),
                      ("n_test", 1), ("image_size", 8), ("workers", 0)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise CocosError(f"--{name.replace('_', '-')} must be an integer of at least {low}, got {value}")
    if not (isinstance(cfg.lr, (int, float)) and 0 < cfg.lr < 1):
        raise CocosError(f"--lr must be a number in (0, 1), got {cfg.lr}")
    if cfg.track_cocos is not None and (isinstance(cfg.track_cocos, bool) or cfg.track_cocos < 1):
        raise CocosError(f"--track-cocos must be a positive integer, got {cfg.track_cocos}")
    if len(set(cfg.losses)) != len(cfg.losses) or not cfg.losses:
        raise CocosError("--loss: give each loss once")


def _check_folders(cfg: ClipDemoConfig, data: Path, generate: bool) -> list[Path]:
    """The data folder (when generated), the report, ``--checkpoints`` and every folder the demo writes in it."""
    if generate:
        _check_data_folder(data, cfg.overwrite, images=True)
        check_writable_dir(data, "--data")
        if cfg.batch_size > cfg.n_train * DEMO_K:
            raise CocosError(f"--batch-size {cfg.batch_size} is larger than the training split the demo would "
                             f"generate ({cfg.n_train * DEMO_K} captions)")
    check_writable_dir(cfg.checkpoints, "--checkpoints")
    ck = Path(cfg.checkpoints)
    for name in (INIT_DIR, PRETRAINED_DIR):
        check_output_dir(ck / name, [cfg.data], cfg.overwrite, kind="pretrain", by="demo", option="--checkpoints")
        check_writable_dir(ck / name, "--checkpoints")
    runs = [ck / PRETRAIN_DIR, *(ck / loss for loss in cfg.losses)]
    for folder in runs:
        _check_run_folder(folder, cfg.overwrite, [cfg.data])
        check_writable_dir(folder, "--checkpoints")
    return [ck / INIT_DIR, ck / PRETRAINED_DIR, *runs]


def run_clip_demo(cfg: ClipDemoConfig, *, progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """Run the whole CLIP demo (module docstring); returns the report folder. Everything is checked before anything
    is written; a demo that fails removes the folders it made (Ctrl-C keeps them: finished stages are reused)."""
    check_settings(cfg)
    _quiet_transformers()  # one line if the [clip] extra is missing, before any work
    data = Path(cfg.data)
    generate = not _has_world(data, True)
    out = check_output_dir(cfg.out, inputs=[cfg.data, cfg.checkpoints], overwrite=cfg.overwrite, kind="report",
                           by="demo")
    check_writable_dir(out.parent if out.exists() else out, "--out")
    folders = _check_folders(cfg, data, generate)
    fresh = [p for p in (data, Path(cfg.checkpoints), *folders) if not p.exists()]
    try:
        return _run(cfg, out, data, generate, progress, log)
    except Exception:
        for path in fresh:
            shutil.rmtree(path, ignore_errors=True)
        raise


def _pretrain(cfg: ClipDemoConfig, data: Path, fingerprint: str, progress: bool,
              log: Callable[[str], None]) -> tuple[bool, list[str]]:
    """The demo's tiny CLIP built (unless its folder matches the settings), pre-trained (unless its run matches)
    and saved as a CLIP folder; returns whether later stages must be redone and the stages reused."""
    ck = Path(cfg.checkpoints)
    init = ck / INIT_DIR
    redo = cfg.retrain or not _init_matches(cfg, init, fingerprint)
    if redo:
        log(f"[clip] building the demo's tiny CLIP in {init} (random initialisation, seed {cfg.seed}; a BPE "
            "tokenizer of the training captions)")
        write_init_folder(cfg, data, init, fingerprint)
    else:
        log(f"[clip] reusing {init}")
    check_interrupt()
    trained = _train(cfg, pretrain_config(cfg), fingerprint, redo, "pre-training", progress, log)
    reused = [] if trained else ["pre-training"]
    redo = trained or redo
    best = ck / PRETRAIN_DIR / "model_best.pt"
    pretrained = ck / PRETRAINED_DIR
    if redo or not _export_matches(pretrained, best):  # the same checkpoint saves the same folder
        export_clip_folder(best, init, pretrained, cfg)
        log(f"[pre-training] saved the pre-trained CLIP as a CLIP folder: {pretrained}")
    return redo, reused


def _run(cfg: ClipDemoConfig, out: Path, data: Path, generate: bool, progress: bool,
         log: Callable[[str], None]) -> Path:
    start = time.perf_counter()
    if generate:
        log(f"generating the synthetic image world in {data} ...")
        make_synthetic_images(data, n_train=cfg.n_train, n_dev=cfg.n_dev, n_test=cfg.n_test, seed=cfg.seed,
                              image_size=cfg.image_size, overwrite=cfg.overwrite, by="demo", progress=progress)
    fingerprint = load_image_split(data, "train").fingerprint()
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    redo, reused = _pretrain(cfg, data, fingerprint, progress, log)
    times["pre-training"] = time.perf_counter() - t0
    pre = _read_record(Path(cfg.checkpoints) / PRETRAINED_DIR) or {}
    analyses, timings = {}, {}
    for loss in cfg.losses:
        check_interrupt()
        t0 = time.perf_counter()
        train_cfg = finetune_config(cfg, loss)
        if not _train(cfg, train_cfg, fingerprint, redo, loss, progress, log):
            reused.append(loss)
        t1 = time.perf_counter()
        check_interrupt()
        analyses[loss] = analyze_checkpoint(Path(train_cfg.out) / "model_best.pt", data, batch_size=cfg.batch_size,
                                            seed=cfg.seed, device=cfg.device, label="tiny, pre-trained",
                                            progress=False, image_options={"workers": cfg.workers})
        timings[loss] = (t1 - t0, time.perf_counter() - t1)
        own = [line.strip() for line in summary_lines(analyses[loss].results)[1:] if line.split()[0] == loss]
        log(f"[{loss}] test rsum {analyses[loss].results.evaluation.metrics['rsum']:.1f}"
            f"{'; ' + own[0] if own else ''} (analysis {timings[loss][1]:.1f} s)")
    check_interrupt()
    triplets = {loss: diagram_points(a.results, a.embeddings) for loss, a in analyses.items()}
    extent = common_extent(list(triplets.values()))
    with atomic_dir(out, inputs=[cfg.data, cfg.checkpoints], overwrite=cfg.overwrite, kind="report",
                    by="demo") as tmp:
        paths = []
        for loss, analysis in analyses.items():
            check_interrupt()
            write_results_folder(analysis.results, analysis.run, tmp / loss, embeddings=analysis.embeddings,
                                 diagram_extent=extent, triplets=triplets[loss], logs=analysis.logs, by="demo")
            paths.append(tmp / loss / "results.json")
        report = build_report(paths)
        write_report(report, tmp / "summary", readme=None, by="demo")
        _fix_report_paths(tmp / "summary", tmp, out)
        n_test = load_image_split(data, "test").n_images
        text = clip_readme(cfg, report, analyses, pre, times["pre-training"], timings,
                           time.perf_counter() - start, n_test, reused)
        (tmp / "README.md").write_text(text, encoding="utf-8")
        page = collection_page(tmp, "cocos demo --model clip", text.splitlines()[0].lstrip("# "))
        (tmp / "index.html").write_text(page, encoding="utf-8")  # the merged report's and each model's page
    log(f"wrote {out}/ (README.md, index.html, summary/, one folder per loss) in {time.perf_counter() - start:.0f} s; "
        f"chance rsum {chance_rsum(n_test):.1f} ({n_test} test images, k = {DEMO_K})")
    return out


def clip_readme(cfg: ClipDemoConfig, report, analyses: dict, pre: dict, pretrain_s: float, timings: dict,
                total: float, n_test: int, reused=()) -> str:
    """The report's README.md: what was trained, the rsums against chance, Tables 1-4 and the figures."""
    t, ck = cfg.tower, Path(cfg.checkpoints)
    chance = chance_rsum(n_test)
    rows = ["| Fine-tuning loss | test rsum | × chance | i2t R@1 | t2i R@1 |", "| :-- | --: | --: | --: | --: |"]
    for loss, a in analyses.items():
        m = a.results.evaluation.metrics
        rows.append(f"| {LOSS_NAMES.get(loss, loss)} | {m['rsum']:.1f} | {m['rsum'] / chance:.1f} | "
                    f"{m['i2t_R@1']:.1f} | {m['t2i_R@1']:.1f} |")
    dev = f"dev rsum {pre['dev_rsum']:.1f}" if isinstance(pre.get("dev_rsum"), (int, float)) else "dev rsum n/a"
    tau = f", learned τ {pre['tau']:.3f}" if isinstance(pre.get("tau"), (int, float)) else ""
    lines = [
        "# cocos demo --model clip: COCOS of a tiny CLIP fine-tuned with three losses",
        "",
        f"Generated by `cocos demo --model clip`. The demo's own tiny CLIP (`{ck / INIT_DIR}`: a Hugging Face "
        f"CLIPConfig of two ViT towers, {t.width} units and {t.layers} blocks each, {t.image_size}-px images in "
        f"{t.patch_size}-px patches, joint embedding {t.projection_dim}; **randomly initialised** from seed "
        f"{cfg.seed}, with a byte-level BPE tokenizer learned from the training captions; not a released model) is "
        "pre-trained "
        f"on the rendered image world `{cfg.data}` with CLIP's loss, InfoNCE at a learned temperature "
        f"(`{ck / PRETRAIN_DIR}`: {cfg.pretrain_epochs} epochs, AdamW lr {PRETRAIN_LR:g} dropped x0.1 before the "
        f"last; {dev}{tau}) and saved as a CLIP folder (`{ck / PRETRAINED_DIR}`). That folder is then fine-tuned "
        f"with each loss for {cfg.epochs} epochs (AdamW lr {cfg.lr:g}, weight decay 0.1, batch {cfg.batch_size}, "
        "no warm-up; NT-Xent's τ and SigLIP's t and b learned) and analysed with `cocos analyze` (frozen model, "
        f"the whole training split in random batches of {cfg.batch_size}, both counting modes, the corrected one "
        "shown), merged with `cocos report`.",
        "",
        f"Wall time {total:.0f} s: pre-training stage {pretrain_s:.0f} s, fine-tuning "
        f"{sum(a for a, _ in timings.values()):.0f} s, analysis {sum(b for _, b in timings.values()):.0f} s"
        + (f" (reusing the trained runs of {', '.join(reused)})." if reused else "."),
        "",
        f"Test retrieval ({n_test} images, k = {DEMO_K} captions each). Chance rsum is {chance:.1f}: a random "
        f"ranking finds one of an image's {DEMO_K} captions among {n_test * DEMO_K} in the top K with probability "
        f"1 - C({n_test * DEMO_K - DEMO_K}, K) / C({n_test * DEMO_K}, K), and a caption's image in the top K with "
        f"K / {n_test}, summed over K = 1, 5, 10 both ways.",
        "",
        *rows,
        "",
        "Per-loss folders hold each model's full analysis (`results.json`, `batches.csv`, `tables.md`, `counts.png`, "
        "`eps_sweep.png`, `triplet_diagram.png`, `cocos_track.csv`/`.png` and `train_log.csv`); `summary/` holds "
        "the merged tables (also as LaTeX).",
        "",
        *[to_markdown(table) + "\n" for table in report.tables],
        "## Figures",
        "",
        "COCOS of each model's own loss against its retrieval score:",
        "",
        "![COCOS vs rsum](summary/cocos_vs_rsum.png)",
        "",
    ]
    if cfg.track_cocos:
        lines += [f"COCOS while each model fine-tunes (every {cfg.track_cocos} steps, its own loss on its training "
                  "batch):", "", "![COCOS during training](summary/cocos_track.png)", ""]
    for loss in analyses:
        lines += [f"Per-query counts on the {LOSS_NAMES.get(loss, loss)} model:", "", f"![counts]({loss}/counts.png)",
                  ""]
    return "\n".join(lines)


__all__ = ["CLIP_DEFAULTS", "CLIP_LOSSES", "ClipDemoConfig", "TinyCLIP", "byte_alphabet", "chance_rsum",
           "export_clip_folder", "finetune_config", "learn_bpe", "pretrain_config", "run_clip_demo",
           "write_init_folder", "write_tokenizer"]
