"""``cocos data ...``: make and inspect data folders in the precomputed-feature layout."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from cocos.training.config import DataConfig, default

from .common import fail, handle_errors
from .main import app

data_app = typer.Typer(
    help="Data folders in the precomputed-feature layout ({split}_ims.npy, {split}_caps.txt), raw-image datasets, "
         "and the frozen-CNN feature cache between them.",
    no_args_is_help=True,
)


@data_app.command("synth")
@handle_errors
def synth(
    out_dir: Path = typer.Argument(..., help="Folder to write (absent or empty; a dataset with --overwrite)."),
    n_train: int = typer.Option(None, "--n-train", help="Training images, k captions each (default 3000; "
                                "1000 with --images)."),
    n_dev: int = typer.Option(None, "--n-dev", help="Validation images (default 500; 200 with --images)."),
    n_test: int = typer.Option(None, "--n-test", help="Test images (default 500; 200 with --images)."),
    k: int = typer.Option(default(DataConfig, "k"), "--k", help="Captions per image."),
    feature_dim: int = typer.Option(256, "--feature-dim", help="Feature dimension D."),
    n_regions: int = typer.Option(6, "--n-regions", help="Regions per image R (at least 4)."),
    regions: bool = typer.Option(
        False, "--regions/--global", help="Store (N, R, D) region features instead of (N, D)."
    ),
    seed: int = typer.Option(0, help="Seed; the same seed gives byte-identical files."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing dataset at OUT_DIR (never "
                                   "another folder)."),
    images: bool = typer.Option(
        False, "--images", help="Render the scenes as JPEG files in the VSE++ layout (images/ + "
        "dataset_synth.json) instead of writing features; --feature-dim, --n-regions, --regions do not apply."
    ),
    image_size: int = typer.Option(64, "--image-size", help="With --images: side of the square images in pixels."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="With --images: show a progress bar."),
) -> None:
    """Write a small deterministic synthetic image-caption world (scenes of coloured shapes)."""
    from cocos.data.synth import make_synthetic

    if out_dir.exists() and not out_dir.is_dir():
        fail(f"{out_dir}: exists and is not a folder")
    start = time.perf_counter()
    if images:
        from cocos.data.synth_images import make_synthetic_images

        n_train, n_dev, n_test = (1000 if n_train is None else n_train, 200 if n_dev is None else n_dev,
                                  200 if n_test is None else n_test)
        make_synthetic_images(out_dir, n_train=n_train, n_dev=n_dev, n_test=n_test, k=k, image_size=image_size,
                              seed=seed, overwrite=overwrite, progress=progress)
        typer.echo(f"wrote {out_dir}: {n_train}/{n_dev}/{n_test} train/dev/test JPEG images of {image_size} x "
                   f"{image_size} px in images/, k={k} captions each in dataset_synth.json, seed {seed} "
                   f"({time.perf_counter() - start:.1f} s)")
        return
    n_train, n_dev, n_test = (3000 if n_train is None else n_train, 500 if n_dev is None else n_dev,
                              500 if n_test is None else n_test)
    make_synthetic(
        out_dir,
        n_train=n_train,
        n_dev=n_dev,
        n_test=n_test,
        k=k,
        feature_dim=feature_dim,
        n_regions=n_regions,
        regions=regions,
        seed=seed,
        overwrite=overwrite,
    )
    shape = f"(N, {n_regions}, {feature_dim})" if regions else f"(N, {feature_dim})"
    typer.echo(
        f"wrote {out_dir}: {n_train}/{n_dev}/{n_test} train/dev/test images, k={k}, "
        f"features {shape}, seed {seed} ({time.perf_counter() - start:.1f} s)"
    )


@data_app.command("info")
@handle_errors
def info(
    folder: Path = typer.Argument(..., help="A data folder in the precomputed-feature layout, or a raw-image "
                                  "dataset (images/ + dataset_*.json, {split}_set.p, or a CSV file list)."),
    k: int = typer.Option(default(DataConfig, "k"), "--k", help="Captions per image."),
    use_restval: bool = typer.Option(False, "--use-restval", help="Raw images: Karpathy restval joins train."),
    decode: bool = typer.Option(False, "--decode", help="Raw images: decode every image (finds corrupt ones)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar (--decode)."),
) -> None:
    """Validate a data folder and print each split's sizes and the data fingerprint."""
    from cocos.data.images import is_image_dataset
    from cocos.data.precomp import SPLITS, data_fingerprint, find_karpathy_json, load_split

    if is_image_dataset(folder):
        _image_info(folder, use_restval, decode, progress)
        return
    if not folder.is_dir():
        fail(f"{folder}: no such data folder")
    karpathy = find_karpathy_json(folder)
    missing = [name for split in SPLITS for name in (f"{split}_ims.npy", f"{split}_caps.txt")
               if not (folder / name).is_file() and not (name.endswith("_caps.txt") and karpathy is not None)]
    if missing:  # cocos train needs train and dev, cocos analyze train and test
        fail(f"{folder}: missing {', '.join(missing)} (a data folder holds {{train,dev,test}}_ims.npy and "
             "{train,dev,test}_caps.txt or one dataset_*.json)")
    for split in SPLITS:
        s = load_split(folder, split, k=k)
        kind = "regions" if s.is_regions else "global"
        typer.echo(
            f"{split}: {s.n_images} images, {s.n_captions} captions, "
            f"features {s.feature_shape} {s.features.dtype} ({kind}), captions from "
            f"{s.captions_path.name}"
        )
    typer.echo(f"fingerprint: {data_fingerprint(folder)}")


def _image_info(path: Path, use_restval: bool, decode: bool, progress: bool) -> None:
    """``cocos data info`` of a raw-image dataset: every split it has, with its content fingerprint."""
    from cocos.data.images import load_image_split
    from cocos.progress import progress_bar

    splits = [load_image_split(path, split, use_restval=use_restval)
              for split in (["train"] if path.is_file() else ["train", "dev", "test"])]
    for s in splits:
        if decode:
            with progress_bar(s.n_images, f"decoding {s.split}", enabled=progress) as advance:
                for i in range(s.n_images):
                    s.image(i)
                    advance()
        s.fingerprint()
    for s in splits:
        typer.echo(f"{s.split}: {s.n_images} images, {s.n_captions} captions ({s.layout} layout, from "
                   f"{s.source.name}), fingerprint {s.fingerprint()}")


@data_app.command("features")
@handle_errors
def features(
    image_data: Path = typer.Argument(..., help="A raw-image dataset (images/ + dataset_*.json, {split}_set.p, or a "
                                      "CSV file list)."),
    cnn: str = typer.Option(..., "--cnn", help="CNN type: resnet18, resnet34, resnet50, resnet101, resnet152, "
                                                    "resnext50_32x4d, resnext101_32x8d, vgg19."),
    cnn_weights: Path = typer.Option(..., "--cnn-weights", metavar="FILE",
                                     help="Its torchvision ImageNet weights file (e.g. resnet50-0676ba61.pth), or a "
                                          "raw-image checkpoint (cocos, or the original code's model_best.pth.tar) "
                                          "whose own CNN to use; read without running code, never downloaded."),
    out: Path = typer.Option(None, "--out", metavar="DIR",
                             help="Folder to write (default IMAGE_DATA/features/<cnn>-<weights hash>-<resize>-<crop>/, "
                                  "where cocos analyze finds it)."),
    split: str = typer.Option("train,val,test", "--split", help="Splits, comma-separated (val is written as dev)."),
    workers: int = typer.Option(2, "--workers", help="DataLoader processes decoding images."),
    batch_size: int = typer.Option(64, "--batch-size", help="Images per CNN batch (and per resume record)."),
    resize: int = typer.Option(None, "--resize", help="Evaluation transform: Resize (shorter side). Default: the "
                               "weights file's own when cocos knows it (232 for torchvision's V2 ResNets), else 256."),
    crop_size: int = typer.Option(None, "--crop-size", help="Evaluation transform: CenterCrop. Default: the weights "
                                  "file's own when cocos knows it, else 224."),
    use_restval: bool = typer.Option(False, "--use-restval", help="Karpathy restval joins train."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --out feature cache (never another folder)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Pooled frozen-CNN features of an image dataset as a precomputed folder ({split}_ims.npy, {split}_caps.txt).

    Resumable: a killed run continues where it stopped when run again with the same inputs.
    """
    from cocos.data.transforms import check_image_sizes
    from cocos.device import resolve_device
    from cocos.embed.features import cnn_state_hash, default_cache_dir, load_cnn, write_feature_cache
    from cocos.models.cnn import cnn_family
    from cocos.models.weights import evaluation_transform

    cnn_family(cnn)  # an unknown name: one line, before anything is read
    # the sizes given: one line, before anything is read or written
    check_image_sizes(resize, default(DataConfig, "crop_size") if crop_size is None else crop_size, batch_size, workers)
    if not cnn_weights.is_file():
        fail(f"{cnn_weights}: no such CNN weights file")
    if not image_data.exists():
        fail(f"{image_data}: no such image dataset")
    if out is not None:  # its kind, before the weights are read (again under the lock when the cache is written)
        from cocos.io import check_output_dir

        check_output_dir(out, [image_data, cnn_weights], overwrite, kind="features", by="data features",
                         may_lie_in=[image_data])
    start = time.perf_counter()
    sizes = evaluation_transform(cnn_weights, resize, crop_size, cnn=cnn)  # a known file's own transform
    resize, crop_size = sizes.resize, sizes.crop_size
    check_image_sizes(resize, crop_size, batch_size, workers)
    if sizes.warning:
        typer.echo(f"warning: {sizes.warning}", err=True)
    trunk = load_cnn(cnn_weights, cnn)
    out = out or default_cache_dir(image_data, cnn, cnn_state_hash(trunk), resize, crop_size)
    manifest = write_feature_cache(image_data, out, trunk, cnn_type=cnn, splits=split.split(","),
                                   weights_file=cnn_weights, resize=resize, crop_size=crop_size,
                                   batch_size=batch_size, workers=workers, device=resolve_device(device),
                                   use_restval=use_restval, overwrite=overwrite, progress=progress)
    seconds = time.perf_counter() - start
    n = sum(entry["n_images"] for entry in manifest["splits"].values())
    known = f"{sizes.weights.name}, " if sizes.weights is not None else ""
    counts = ", ".join(f"{name} {entry['n_images']}" for name, entry in manifest["splits"].items())
    typer.echo(f"wrote {out}: {cnn} features ({known}{manifest['dim']}-d, Resize {resize} + CenterCrop {crop_size}) "
               f"of {counts} images ({seconds:.1f} s, {n / max(seconds, 1e-9):.1f} images/s)")


app.add_typer(data_app, name="data", help="Make and check data folders (synthetic world, layout).")
