"""``cocos import CHECKPOINT --vocab VOCAB --data DIR --out model.pt``: an original checkpoint into cocos's format
(VSE∞'s: ``--bert DIR`` instead of ``--vocab``)."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import check_input_dir, check_input_file, check_open_clip_args, handle_errors
from .main import app


def _check_paths(args: dict) -> None:
    """The paths, before the heavy imports: the checkpoint and --vocab are files, --bert and --data folders, --out
    allowed."""
    from cocos.hf import model_type
    from cocos.io import check_output_file

    checkpoint, vocab, bert, data, out = (args.get(k) for k in ("checkpoint", "vocab", "bert", "data", "out"))
    config, tokenizer = args.get("open_clip_config"), args.get("tokenizer")
    if model_type(checkpoint) is None:  # a checkpoint file, or a Hugging Face model folder (CLIP's)
        check_input_file(checkpoint, "checkpoint")
    check_open_clip_args(config, tokenizer, vocab, bert)
    if vocab is not None:
        check_input_file(vocab, "vocabulary file")
    if bert is not None:
        check_input_dir(bert, "BERT folder")
    if data is not None:
        check_input_dir(data, "data folder")
    if out is not None:
        check_output_file(out, [p for p in (checkpoint, vocab, bert, data, config, tokenizer) if p is not None],
                          overwrite=bool(args.get("overwrite")), runs=_runs(checkpoint))


@app.command("import")
@handle_errors(check=_check_paths)
def import_checkpoint(
    checkpoint: Path = typer.Argument(..., help="model_best.pth.tar of the original VSE++ (fartashf/vsepp), VSRN "
                                                "(KunpengLi1994/VSRN) or COCOS reproducibility code; model_best.pth "
                                                "of VSE∞ (woodfrog/vse_infty, microsoft/VSE_Gradient); a Hugging "
                                                "Face CLIP folder (with --data only); open_clip's epoch_K.pt (with "
                                                "--open-clip-config and --tokenizer)."),
    vocab: Path = typer.Option(None, "--vocab", metavar="PATH",
                               help="The run's vocabulary: its *_vocab.pkl (read without running code) or a "
                                    "vocabulary JSON (SCAN/VSRN). Required, except for VSE∞ (--bert)."),
    bert: Path = typer.Option(None, "--bert", metavar="DIR",
                              help="VSE∞ checkpoint of the original code: the BERT folder it was trained with "
                                   "(config.json, vocab.txt)"),
    data: Path = typer.Option(None, "--data", metavar="DIR",
                              help="The data folder the model is counted on (recorded in the new checkpoint): "
                                   "precomputed features, or for a raw-image checkpoint (data_name f30k/coco, "
                                   "EncoderImageFull) the image dataset (images/ + its Karpathy dataset_*.json, "
                                   "or the {train,val,test}_set.p pickles). Required."),
    out: Path = typer.Option(None, "--out", metavar="PATH", help="The cocos checkpoint to write (e.g. model.pt). "
                                                                 "Required."),
    open_clip_config: Path = typer.Option(None, "--open-clip-config", metavar="CONFIG.json",
                                          help="The checkpoint is open_clip's (epoch_K.pt of its trainer): its model "
                                               "config (open_clip's ViT-B-32.json, ..., or a hub "
                                               "open_clip_config.json); needs --tokenizer."),
    tokenizer: Path = typer.Option(None, "--tokenizer", metavar="DIR",
                                   help="open_clip checkpoints: the tokenizer, a Hugging Face CLIP tokenizer folder "
                                        "(tokenizer.json, or vocab.json and merges.txt; OpenAI's BPE)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
    trust_checkpoint: bool = typer.Option(False, "--trust-checkpoint",
                                          help="Load the checkpoint with full pickle (weights_only=False): code in "
                                               "the file may run. Only for files you trust."),
) -> None:
    """Convert a checkpoint of the original code into a cocos checkpoint (then analyze/evaluate need no --vocab)."""
    from cocos.errors import CocosError
    from cocos.io import check_output_file, output_lock
    from cocos.training.checkpoint import save_checkpoint
    from cocos.training.trainer import build_from_checkpoint

    inputs = _check_inputs(checkpoint, vocab, bert, data, out)
    inputs += [p for p in (open_clip_config, tokenizer) if p is not None]
    with output_lock(out):  # one writer of --out: a second import into it is refused in one line
        check_output_file(out, inputs, overwrite=overwrite, runs=_runs(checkpoint))
        if trust_checkpoint:
            typer.echo("warning: --trust-checkpoint: the checkpoint is loaded with full pickle, code in it may run",
                       err=True)
        if open_clip_config is not None:
            from cocos.models.open_clip import open_clip_checkpoint

            ckpt = open_clip_checkpoint(checkpoint, open_clip_config, tokenizer, data, trust=trust_checkpoint)
            converted = True
        else:
            ckpt, converted = _read(checkpoint, vocab, bert, data, trust_checkpoint)
        if not converted:  # a cocos checkpoint refuses --vocab and --bert
            raise CocosError(f"{checkpoint}: already a cocos checkpoint")
        if ckpt["data"].get("input") == "images":
            from cocos.data.images import is_image_dataset

            if not is_image_dataset(data):
                raise CocosError(f"{data}: not an image dataset (images/ and a dataset_*.json, or {{split}}_set.p); "
                                 f"{checkpoint} encodes raw images (EncoderImageFull)")
        build_from_checkpoint(ckpt)  # the converted weights rebuild the model before anything is written
        save_checkpoint(out, ckpt)
    hp = ckpt["model"]["hparams"]
    params = ", ".join(f"{k}={v:g}" for k, v in ckpt["loss"]["params"].items())
    typer.echo(f"wrote {out}: {ckpt['model']['kind']} (embed {hp['embed_size']}, {hp['vocab_size']} {_words(ckpt)}), "
               f"trained with {ckpt['loss']['name']} ({params}), epoch {ckpt['epoch']}, data {data}")


def _runs(checkpoint: Path) -> list[Path]:
    """The run whose folder's files an import never replaces: a checkpoint file's (a CLIP folder is an input
    itself, not a file of a run folder)."""
    return [] if Path(checkpoint).is_dir() else [checkpoint]


def _read(checkpoint: Path, vocab: Path | None, bert: Path | None, data: Path, trust: bool) -> tuple[dict, bool]:
    """The checkpoint to write: a model folder's that a family reads whole (a CLIP folder's,
    :attr:`cocos.models.family.ModelFamily.folders`), or an original one converted."""
    from cocos.errors import CocosError
    from cocos.legacy import load_any_checkpoint
    from cocos.models.registry import folder_checkpoint

    whole = folder_checkpoint(checkpoint)
    if whole is None:
        return load_any_checkpoint(checkpoint, vocab=vocab, data=data, trust=trust, bert=bert)
    if vocab is not None or bert is not None:
        raise CocosError(f"{checkpoint}: a model folder carries its tokenizer; --vocab and --bert do not apply")
    return whole(checkpoint, data), True


def _check_inputs(checkpoint: Path, vocab: Path | None, bert: Path | None, data: Path | None,
                  out: Path | None) -> list[Path]:
    """--data and --out given, every input there: the paths the import reads (the file decides between --vocab and
    --bert, and says which it needs)."""
    from cocos.errors import CocosError

    for name, value in (("--data", data), ("--out", out)):
        if value is None:
            raise CocosError(f"{name} is required (cocos import CHECKPOINT --vocab VOCAB --data DIR --out model.pt; "
                             "VSE∞: --bert DIR instead of --vocab)")
    if not checkpoint.exists():
        raise CocosError(f"{checkpoint}: no such checkpoint")
    if vocab is not None and not vocab.is_file():
        raise CocosError(f"{vocab}: no such vocabulary file")
    if bert is not None and not bert.is_dir():
        raise CocosError(f"{bert}: no such BERT folder")
    if not data.is_dir():
        raise CocosError(f"{data}: no such data folder")
    return [p for p in (checkpoint, vocab, bert, data) if p is not None]


def _words(ckpt: dict) -> str:
    """What the checkpoint's caption tokens are ("words", "word pieces", ...): its coder says."""
    from cocos.data.wordpiece import coder_of

    return coder_of(ckpt["vocab"], ckpt.get("text")).units
