"""``cocos sweep`` of every family (issue 38): a tiny CLIP folder on a tiny raw-image dataset with two losses (two
analyses and the merged report), VSE++ on raw images through a frozen CNN with its weights file, idempotent reruns
(nothing trained again; the images fingerprinted once per dataset, not per run), a missing source folder refused
before anything runs, and GOAL's Table 5 as one grid (features and raw images, one model table each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers")

from cocos_cli.main import app  # noqa: E402
from tests.helpers import make_clip_folder, one_error_line, snapshot  # noqa: E402

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]

CLIP_GRID = """\
name = "clip"
data = "{data}"
reports = "{root}/reports"
checkpoints = "{root}/ck"
seeds = [0]
[train]
clip = "{clip}"        # a source of the CLIP family: the runs of a model that takes no CLIP folder leave it out
epochs = 1
batch_size = 8
device = "cpu"
[[models]]
name = "clip"
[[loss]]
name = "ntxent"
[[loss]]
name = "triplet_sh"
"""

VSEPP_GRID = """\
name = "vsepp_images"
reports = "{root}/reports"
checkpoints = "{root}/ck"
[train]
epochs = 1
batch_size = 8
embed_size = 8
word_dim = 8
device = "cpu"
[[models]]
name = "vsepp"            # on raw images: vsepp_full, its CNN frozen with the weights file
id = "frozen"
data = "{data}"
train = {{ cnn = "resnet18", cnn_weights = "{weights}", crop_size = 16 }}
[[loss]]
name = "triplet"
"""


@pytest.fixture(scope="module")
def quick_figures():
    """Figures are tested elsewhere; here each one's files are placeholders (most of a tiny run's time otherwise),
    for the module's sweeps."""
    from cocos.report import style

    def save(fig, stem):
        import matplotlib.pyplot as plt

        plt.close(fig)
        paths = [Path(f"{stem}.{ext}") for ext in ("png", "pdf")]
        for p in paths:
            p.write_bytes(b"figure")
        return paths

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(style, "save", save)
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory, quick_figures):
    import torch

    from cocos.data.synth_images import make_synthetic_images
    from cocos.models.cnn import build_cnn

    root = tmp_path_factory.mktemp("families")
    data = make_synthetic_images(root / "images", n_train=16, n_dev=4, n_test=4, image_size=32, seed=0,
                                 progress=False)
    clip = make_clip_folder(root / "clip")
    torch.manual_seed(0)
    torch.save(build_cnn("resnet18").state_dict(), root / "resnet18.pth")
    return {"root": root, "data": data, "clip": clip, "weights": root / "resnet18.pth"}


def _grid(world, text: str, folder: str) -> Path:
    root = world["root"] / folder
    root.mkdir(exist_ok=True)
    path = root / "grid.toml"
    path.write_text(text.format(data=world["data"], clip=world["clip"], weights=world["weights"], root=root))
    return path


@pytest.fixture(scope="module")
def clip_sweep(world):
    """The acceptance sweep, once for the module: (grid file, the command's output)."""
    grid = _grid(world, CLIP_GRID, "clip_sweep")
    return grid, runner.invoke(app, ["sweep", str(grid)])


@pytest.fixture(scope="module")
def vsepp_sweep(world):
    """The frozen CNN's feature cache written first (cocos data features, where cocos analyze finds it), then the
    sweep: (grid file, the command's output, whether each split the analysis read came from a matching cache)."""
    from cocos.embed import images

    built = runner.invoke(app, ["data", "features", str(world["data"]), "--cnn", "resnet18", "--cnn-weights",
                                str(world["weights"]), "--resize", "18", "--crop-size", "16", "--workers", "0",
                                "--device", "cpu"])
    assert built.exit_code == 0, built.output
    grid, cached, real = _grid(world, VSEPP_GRID, "vsepp_sweep"), [], images.cached_features

    def spy(*a, **kw):
        found = real(*a, **kw)
        cached.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(images, "cached_features", spy)
        return grid, runner.invoke(app, ["sweep", str(grid)]), cached


def results(folder: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(folder.glob("*/results.json"))}


def test_clip_folder_on_raw_images_two_losses_two_analyses_and_the_report(world, clip_sweep):
    grid, res = clip_sweep
    assert res.exit_code == 0, res.output
    reports = grid.parent / "reports" / "clip"
    found = results(reports)
    assert sorted(found) == ["clip_ntxent_s0", "clip_triplet_sh_s0"]
    assert {r["training"]["loss"] for r in found.values()} == {"ntxent", "triplet_sh"}
    assert all(r["model"]["kind"] == "clip" and r["data"]["image_transform"] for r in found.values())
    assert "2 of 2 runs ok, 0 failed" in res.output and res.output.count(": trained, analysed") == 2
    assert "Table 1" in (reports / "summary" / "tables.md").read_text()
    ckpt = grid.parent / "ck" / "clip" / "clip_ntxent_s0" / "last.pt"
    from cocos.training.checkpoint import load_checkpoint

    train = load_checkpoint(ckpt)["train"]
    assert train["model"]["sources"] == {"clip": str(world["clip"])} and train["loss"]["learn_tau"] is True  # the CLIP recipe's learned temperature


def test_raw_image_vsepp_with_a_frozen_cnn_through_the_feature_cache(vsepp_sweep):
    grid, res, cached = vsepp_sweep
    assert res.exit_code == 0, res.output
    found = results(grid.parent / "reports" / "vsepp_images")
    assert list(found) == ["frozen_triplet_s0"]
    run = found["frozen_triplet_s0"]
    assert run["model"]["kind"] == "vsepp_full" and run["model"]["hparams"]["finetune"] is False
    assert "frozen" in run["model"]["label"] and "bert" not in json.dumps(run["model"]["hparams"])
    assert (grid.parent / "reports" / "vsepp_images" / "summary" / "tables.md").is_file()
    assert cached == [True, True]  # the training and the test split: the frozen CNN's features from the cache


def test_rerun_trains_nothing_and_fingerprints_each_dataset_once(clip_sweep, vsepp_sweep, monkeypatch):
    from cocos.data.images import ImageSplit

    calls = []
    real = ImageSplit.fingerprint

    def counted(self, *a, **kw):
        calls.append(self.source)
        return real(self, *a, **kw)

    monkeypatch.setattr(ImageSplit, "fingerprint", counted)
    for grid, first, *_ in (clip_sweep, vsepp_sweep):
        assert first.exit_code == 0, first.output
        folders = [grid.parent / "reports", grid.parent / "ck"]
        before = snapshot(*folders)
        calls.clear()
        again = runner.invoke(app, ["sweep", str(grid)])
        assert again.exit_code == 0, again.output
        assert "nothing to do" in again.output and "training" not in again.output
        assert snapshot(*folders) == before
        assert len(calls) == 1  # one dataset: its images read once for all its runs
        dry = runner.invoke(app, ["sweep", str(grid), "--dry-run"])
        assert dry.exit_code == 0 and "cocos train" not in dry.output and ": skip" in dry.output


def test_a_missing_source_folder_is_one_line_before_anything_runs(world, tmp_path):
    text = CLIP_GRID.format(data=world["data"], clip=tmp_path / "no_clip", root=tmp_path)
    (tmp_path / "g.toml").write_text(text)
    before = snapshot(tmp_path)
    for dry in (["--dry-run"], []):
        line = one_error_line(runner.invoke(app, ["sweep", str(tmp_path / "g.toml"), *dry]))
        assert "run clip_ntxent_s0: clip:" in line and "no_clip: no such folder" in line, line
    assert snapshot(tmp_path) == before


def test_goal_table5_is_one_grid_of_both_halves(tmp_path, monkeypatch):
    """The example's two halves: VSE∞ on BUTD region features and on raw images (WSL grids, fine-tuned), 15
    combinations x 3 seeds each, in one file; the data folders stand in as empty ones."""
    from cocos.pipelines.sweep import load_grid, train_command

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "coco" / "images").mkdir(parents=True)  # a raw-image dataset, as far as the grid looks
    grid = load_grid(ROOT / "examples" / "goal_table5.toml")
    assert len(grid.runs) == 2 * 15 * 3 and len({r.name for r in grid.runs}) == 90
    halves = {r.name.split("_")[0]: r.train for r in grid.runs if r.name.endswith("_con_con_s0")}
    assert sorted(halves) == ["butd", "wsl"]
    assert halves["butd"]["data"] == "data/coco_precomp" and "cnn" not in halves["butd"]
    assert halves["wsl"]["data"] == "data/coco" and halves["wsl"]["finetune"] is True
    assert halves["wsl"]["lr_groups"] == {"txt_enc.bert": 0.1, "img_enc.backbone": 0.01}  # vse_infty_full's recipe
    assert all(r.train["bert"] == "bert-base-uncased" and r.train["loss"] == "goal" for r in grid.runs)
    assert "--embedding-warmup-epochs 1" in train_command(grid.runs[-1]) and grid.inputs == ["data/coco_precomp",
                                                                                               "data/coco"]


MODELS = {  # [[models]] tables and sources: (the grid's models, what the error line says, or None: loads)
    "unknown key": ('[[models]]\nname = "vsepp"\ncolour = "red"\n', "[[models]] 1 (vsepp): unknown key colour"),
    "no name": ('[[models]]\nid = "x"\n', "[[models]] 1: needs a name"),
    "data a number": ('[[models]]\nname = "vsepp"\ndata = 5\n', "[[models]] 1 (vsepp) data: expected"),
    "train a number": ('[[models]]\nname = "vsepp"\ntrain = 5\n', "[[models]] 1 (vsepp) train: expected a table"),
    "train sets data": ('[[models]]\nname = "vsepp"\ntrain = { data = "x" }\n', "unknown key data"),
    "one id twice": ('[[models]]\nname = "vsepp"\nid = "m"\n[[models]]\nname = "vsrn"\nid = "m"\n',
                     "two runs are named 'm_triplet_s0'"),
    "no data anywhere": ('[[models]]\nname = "vsepp"\n', "'data' is missing"),
    "a source its model does not take": ('[[models]]\nname = "vsepp"\ntrain = { bert = "b" }\n',
                                         "run vsepp_triplet_s0: --bert applies to"),
    "a shared source": ('models = ["vsepp", "vse_infty"]\n[train]\nbert = "b"\n', None),
}


@pytest.mark.parametrize("case", sorted(MODELS))
def test_model_tables_are_checked_and_shared_sources_go_where_they_apply(tmp_path, case):
    from cocos.errors import CocosError
    from cocos.pipelines.sweep import load_grid

    models, message = MODELS[case]
    data = "" if case == "no data anywhere" else f'data = "{tmp_path / "data"}"\n'
    loss = '[[loss]]\nname = "triplet"\n'
    (tmp_path / "g.toml").write_text(f'name = "g"\n{data}{models}{loss}')  # top-level keys, then the tables
    if message is not None:
        with pytest.raises(CocosError) as err:
            load_grid(tmp_path / "g.toml")
        assert message in str(err.value) and "g.toml" in str(err.value)
        return
    runs = {r.name: r.train for r in load_grid(tmp_path / "g.toml").runs}
    assert "bert" not in runs["vsepp_triplet_s0"] and runs["vse_infty_triplet_s0"]["bert"] == "b"
