"""The CLIP family: a tiny random CLIP folder (save_pretrained), its tokenizer and preprocessing against transformers'
own, embeddings against CLIPModel's forward (1e-5), cocos analyze of the folder and of a fine-tuned model, freezing,
the learned temperature, resume, and the refusals."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")

from cocos.data.clip import CLIPCoder, CLIPFolder, clip_train_transform  # noqa: E402
from cocos.data.images import load_image_split  # noqa: E402
from cocos.data.synth_images import make_synthetic_images  # noqa: E402
from cocos.data.text import pad_batch  # noqa: E402
from cocos.data.wordpiece import coder_of  # noqa: E402
from cocos.embed import FrozenModel  # noqa: E402
from cocos.losses.base import LearnedTemperature  # noqa: E402
from cocos.models.clip import CLIPDual  # noqa: E402
from cocos.objectives import get_loss  # noqa: E402
from cocos_cli.main import app  # noqa: E402
from tests.helpers import make_clip_folder  # noqa: E402

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    clip = make_clip_folder(root / "clip")
    data = make_synthetic_images(root / "images", n_train=24, n_dev=8, n_test=8, image_size=40, seed=0,
                                 progress=False)
    return root, clip, data


def reference(folder):
    model = transformers.CLIPModel.from_pretrained(str(folder), local_files_only=True).eval()
    return model, transformers.CLIPTokenizer.from_pretrained(str(folder)), \
        transformers.CLIPImageProcessorPil.from_pretrained(str(folder))


def features(out):
    out = out.pooler_output if hasattr(out, "pooler_output") else out
    return out / out.norm(dim=-1, keepdim=True)


def reference_embeddings(model, tok, proc, images, captions, max_length=16):
    with torch.no_grad():
        img = features(model.get_image_features(**proc(images=images, return_tensors="pt")))
        ids = tok(captions, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        cap = features(model.get_text_features(**ids))
    return img, cap


CAPTIONS = ["the cat on the mat", "a red square in the corner", "then", "the " * 20, "zebra, 12 apples!"]


def test_tokenizer_is_transformers_own(world):
    _, clip, _ = world
    folder = CLIPFolder.read(clip)
    _, tok, _ = reference(clip)
    expected = tok(CAPTIONS, truncation=True, max_length=16).input_ids
    assert folder.coder.encode_all(CAPTIONS) == expected
    assert [folder.coder.encode(c) for c in CAPTIONS] == expected
    assert max(map(len, expected)) == 16  # the long caption was cut, its end-of-text kept
    assert expected[3][-1] == tok.eos_token_id
    # the checkpoint's record stands alone
    again = coder_of(folder.coder.tokens, folder.coder.options())
    assert again == folder.coder and again.encode_all(CAPTIONS) == expected


def test_tokenizer_from_vocab_and_merges_alone(world, tmp_path):
    _, clip, _ = world
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(clip / name, bare / name)
    assert CLIPCoder.from_folder(bare, 16).encode_all(CAPTIONS) == CLIPFolder.read(clip).coder.encode_all(CAPTIONS)


@pytest.mark.parametrize("size", [(64, 48), (33, 50), (30, 30), (20, 41), (101, 37), (17, 12)])
def test_preprocessing_is_the_processors(world, size):
    _, clip, _ = world
    _, _, proc = reference(clip)
    rng = np.random.default_rng(sum(size))
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ours = CLIPFolder.read(clip).preprocess.transform(False)(img)
    assert torch.equal(ours, proc(images=img, return_tensors="pt")["pixel_values"][0])


def test_training_transform_is_seeded_and_of_the_crop(world):
    _, clip, _ = world
    pre = CLIPFolder.read(clip).preprocess
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    a = clip_train_transform(img, torch.Generator().manual_seed(3), crop_size=30, mean=pre.mean, std=pre.std)
    b = pre.transform(True)(img, torch.Generator().manual_seed(3))
    c = pre.transform(True)(img, torch.Generator().manual_seed(4))
    assert a.shape == (3, 30, 30) and torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("legacy_eos", [False, True])
def test_embeddings_equal_clipmodel_forward(world, tmp_path, legacy_eos):
    clip = world[1] if not legacy_eos else make_clip_folder(tmp_path / "legacy", legacy_eos=True)
    folder = CLIPFolder.read(clip)
    model = CLIPDual(len(folder.coder), folder.config, folder.preprocess.record()).load_pretrained(clip).eval()
    ref, tok, proc = reference(clip)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (40 + i, 50, 3), dtype=np.uint8)) for i in range(4)]
    want_img, want_cap = reference_embeddings(ref, tok, proc, images, CAPTIONS)
    with torch.no_grad():
        img = model.encode_images(torch.stack([model.image_transform(False)(i) for i in images]))
        cap = model.encode_captions(*pad_batch(folder.coder.encode_all(CAPTIONS)))
    assert torch.allclose(img, want_img, atol=1e-5) and torch.allclose(cap, want_cap, atol=1e-5)
    assert model.temperature() == pytest.approx(math.exp(-ref.logit_scale.item()), rel=1e-6)


def split_reference(model, tok, proc, data, split="train"):
    """transformers' embeddings of a split's images (in order) and captions (image-major, as cocos encodes them)."""
    images = load_image_split(data, split)
    pil = [images.image(i).convert("RGB") for i in range(images.n_images)]
    order = images.image_captions().reshape(-1)
    return reference_embeddings(model, tok, proc, pil, [images.captions[c] for c in order])


def test_analyzed_folder_embeds_as_transformers(world):
    _, clip, data = world
    frozen = FrozenModel.load(clip, data)
    emb = frozen.encode(frozen.open_split("train"))
    want_img, want_cap = split_reference(*reference(clip), data)
    assert torch.allclose(emb.images.cpu(), want_img, atol=1e-5)
    assert torch.allclose(emb.captions.cpu(), want_cap, atol=1e-5)
    ref, _, _ = reference(clip)
    assert frozen.checkpoint["loss"]["name"] == "ntxent"
    assert frozen.checkpoint["loss"]["params"]["tau"] == pytest.approx(math.exp(-ref.logit_scale.item()), rel=1e-6)


def test_cocos_analyze_of_a_clip_folder(world, tmp_path, monkeypatch):
    _, clip, data = world
    out = tmp_path / "report"
    result = runner.invoke(app, ["analyze", str(clip), "--data", str(data), "--out", str(out), "--batch-size", "8",
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["kind"] == "clip"
    tau = math.exp(-reference(clip)[0].logit_scale.item())
    assert results["training"]["loss"] == "ntxent"
    assert results["training"]["params"]["tau"] == pytest.approx(tau, rel=1e-6)
    assert "NT-Xent" in (out / "tables.md").read_text()
    bad = runner.invoke(app, ["analyze", str(clip), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "pass --data" in bad.output and "Traceback" not in bad.output


def train(world, out, *extra):
    _, clip, data = world
    return runner.invoke(app, ["train", "--model", "clip", "--clip", str(clip), "--data", str(data), "--out", str(out),
                               "--epochs", "1", "--batch-size", "8", "--no-progress", "--lr", "1e-3", *extra])


def saved_clip(ckpt_path, folder, tmp_path):
    """The fine-tuned weights as a CLIP folder (save_pretrained of transformers' own model)."""
    ckpt = torch.load(ckpt_path, weights_only=True)
    model = transformers.CLIPModel.from_pretrained(str(folder), local_files_only=True)
    model.load_state_dict({k.removeprefix("clip."): v for k, v in ckpt["state_dict"].items()})
    target = tmp_path / "tuned"
    shutil.copytree(folder, target)
    model.save_pretrained(str(target))
    return ckpt, target


def test_fine_tuned_model_analyzes_as_transformers(world, tmp_path, monkeypatch):
    _, clip, data = world
    result = train(world, tmp_path / "run", "--loss", "ntxent", "--track-cocos", "1")
    assert result.exit_code == 0, result.output
    ckpt, tuned = saved_clip(tmp_path / "run" / "model_best.pt", clip, tmp_path)
    start = reference(clip)[0].logit_scale.item()
    learned = float(ckpt["state_dict"]["clip.logit_scale"])
    assert learned != start  # the temperature was learned (recipe: learn_tau)
    assert ckpt["train"]["loss"]["learn_tau"] is True and ckpt["train"]["optim"]["optimizer"] == "adamw"
    assert ckpt["loss"]["params"]["tau"] == pytest.approx(math.exp(-learned), rel=1e-6)
    assert ckpt["train"]["model"]["sources"] == {"clip": str(clip)}  # the checkpoint still names its base folder
    frozen = FrozenModel.load(tmp_path / "run" / "model_best.pt")
    emb = frozen.encode(frozen.open_split("train"))
    want_img, want_cap = split_reference(*reference(tuned), data)
    assert torch.allclose(emb.images.cpu(), want_img, atol=1e-5)
    assert torch.allclose(emb.captions.cpu(), want_cap, atol=1e-5)
    report = runner.invoke(app, ["analyze", str(tmp_path / "run" / "model_best.pt"), "--out", str(tmp_path / "rep"),
                                 "--batch-size", "8", "--no-progress"])
    assert report.exit_code == 0, report.output
    assert (tmp_path / "rep" / "cocos_track.png").is_file()


def changed(before: dict, after: dict, prefix: str) -> set[str]:
    return {k for k in before if k.startswith(prefix) and not torch.equal(before[k], after[k])}


def test_freezing_a_tower_and_all_but_the_last_block(world, tmp_path):
    _, clip, _ = world
    start = {f"clip.{k}": v for k, v in reference(clip)[0].state_dict().items()}
    assert train(world, tmp_path / "a", "--loss", "triplet_sh", "--freeze", "image").exit_code == 0
    after = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["state_dict"]
    assert not changed(start, after, "clip.vision_model") and not changed(start, after, "clip.visual_projection")
    assert changed(start, after, "clip.text_model.encoder.layers.0")
    assert train(world, tmp_path / "b", "--loss", "triplet_sh", "--unfrozen-blocks", "1").exit_code == 0
    after = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state_dict"]
    for tower in ("clip.vision_model", "clip.text_model"):
        assert not changed(start, after, f"{tower}.encoder.layers.0")
        assert not changed(start, after, f"{tower}.embeddings")
        assert changed(start, after, f"{tower}.encoder.layers.1")
    assert float(after["clip.logit_scale"]) == float(start["clip.logit_scale"])  # Triplet SH has no temperature


def test_resume_continues_as_one_run(world, tmp_path, monkeypatch):
    whole = train(world, tmp_path / "whole", "--loss", "ntxent", "--epochs", "2", "--track-cocos", "1")
    assert whole.exit_code == 0, whole.output
    assert train(world, tmp_path / "part", "--loss", "ntxent", "--epochs", "1", "--track-cocos", "1").exit_code == 0
    resumed = train(world, tmp_path / "part", "--loss", "ntxent", "--epochs", "2", "--track-cocos", "1", "--resume")
    assert resumed.exit_code == 0, resumed.output
    a = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "part" / "last.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the tracked NT-Xent counts at each step's learned temperature, before and after the resume
    track = [(f / "cocos_track.csv").read_text() for f in (tmp_path / "whole", tmp_path / "part")]
    assert track[0] == track[1]


def test_learned_temperature_is_ntxent_at_exp_minus_logit_scale():
    torch.manual_seed(0)
    images = torch.nn.functional.normalize(torch.randn(6, 8), dim=-1)
    captions = torch.nn.functional.normalize(torch.randn(6, 8), dim=-1)
    scale = torch.nn.Parameter(torch.tensor(2.0))
    loss = LearnedTemperature(get_loss("ntxent"), scale)
    value = loss(images, captions)
    assert float(value.detach()) == pytest.approx(float(get_loss("ntxent", tau=math.exp(-2.0))(images, captions)), rel=1e-6)
    value.backward()
    # d/ds of the loss at tau = exp(-s), by central differences of the fixed-temperature loss
    h = 1e-3
    numeric = (float(get_loss("ntxent", tau=math.exp(-(2.0 + h)))(images, captions))
               - float(get_loss("ntxent", tau=math.exp(-(2.0 - h)))(images, captions))) / (2 * h)
    assert float(scale.grad) == pytest.approx(numeric, rel=1e-3)
    assert loss.params()["tau"] == pytest.approx(math.exp(-2.0))
    big = LearnedTemperature(get_loss("ntxent"), torch.nn.Parameter(torch.tensor(9.0)))
    assert big.params()["tau"] == pytest.approx(math.exp(-9.0), rel=1e-6)  # the forward pass does not clamp
    big.project_()  # the parameter does, after each step (open_clip)
    assert big.params()["tau"] == pytest.approx(0.01, rel=1e-6)  # CLIP's clamp at a scale of 100


@pytest.mark.parametrize("args, words", [
    (["--loss", "triplet_sh", "--learn-tau"], "no softmax temperature"),
    (["--loss", "ntxent", "--learn-tau", "--tau", "0.05"], "give one or the other"),
    (["--loss", "ntxent", "--freeze", "sideways"], "unknown --freeze"),
    (["--loss", "ntxent", "--unfrozen-blocks", "5"], "has 2 blocks"),
    (["--loss", "ntxent", "--vocab", "x.json"], "--vocab does not apply"),
    (["--loss", "triplet_sh", "--freeze", "both"], "nothing to train"),
    (["--loss", "ntxent", "--cnn-weights", "w.pth"], "--cnn-weights do not apply"),
    (["--loss", "ntxent", "--resize", "40"], "--resize do not apply"),
])
def test_bad_clip_runs_are_one_line(world, tmp_path, args, words):
    result = train(world, tmp_path / "bad", *args)
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert not (tmp_path / "bad" / "last.pt").exists()


def test_clip_needs_its_folder_and_others_refuse_it(world, tmp_path):
    _, clip, data = world
    none = runner.invoke(app, ["train", "--model", "clip", "--data", str(data), "--out", str(tmp_path / "a")])
    assert none.exit_code == 2 and "--clip DIR" in none.output
    other = runner.invoke(app, ["train", "--model", "vsepp", "--clip", str(clip), "--data", str(data), "--finetune",
                                "--out", str(tmp_path / "b")])
    assert other.exit_code == 2 and "--clip applies to clip, not to --model vsepp" in other.output
    learn = runner.invoke(app, ["train", "--model", "vsepp", "--learn-tau", "--loss", "ntxent", "--finetune",
                                "--data", str(data), "--out", str(tmp_path / "c")])
    assert learn.exit_code == 2 and "no logit_scale" in learn.output


def test_broken_folders_are_one_line(world, tmp_path):
    _, clip, data = world
    for name, damage in (("config.json", "{not json"), ("preprocessor_config.json", '{"image_std": [0, 1, 1]}'),
                         ("preprocessor_config.json", '{"size": {"height": 30, "width": 40}}'),
                         ("preprocessor_config.json", '{"rescale_factor": "x"}'), ("model.safetensors", "garbage")):
        broken = tmp_path / f"{name}-{len(damage)}"
        shutil.copytree(clip, broken)
        (broken / name).write_text(damage)
        result = runner.invoke(app, ["analyze", str(broken), "--data", str(data), "--out", str(tmp_path / "o"),
                                     "--batch-size", "8"])
        assert result.exit_code == 2 and "Traceback" not in result.output, (name, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_import_of_a_clip_folder_is_the_folder(world, tmp_path):
    _, clip, data = world
    out = tmp_path / "clip.pt"
    result = runner.invoke(app, ["import", str(clip), "--data", str(data), "--out", str(out)])
    assert result.exit_code == 0 and "BPE tokens" in result.output, result.output
    again = runner.invoke(app, ["import", str(clip), "--data", str(data), "--out", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output
    inside = runner.invoke(app, ["import", str(clip), "--data", str(data), "--out", str(clip / "x.pt")])
    assert inside.exit_code == 2 and not (clip / "x.pt").exists()
    a, b = FrozenModel.load(out), FrozenModel.load(clip, data)
    ea, eb = (f.encode(f.open_split("test")) for f in (a, b))
    assert torch.equal(ea.images, eb.images) and torch.equal(ea.captions, eb.captions)


def test_per_group_learning_rates_reach_the_optimiser(world, tmp_path):
    result = train(world, tmp_path / "g", "--loss", "ntxent", "--lr-group", "clip.text_model=0.5",
                   "--freeze", "image")
    assert result.exit_code == 0, result.output
    ckpt = torch.load(tmp_path / "g" / "last.pt", weights_only=True)
    groups = ckpt["optimizer"]["param_groups"]
    assert [g["lr"] for g in groups] == [pytest.approx(1e-3), pytest.approx(5e-4)]
    text = [k for k in ckpt["state_dict"] if k.startswith("clip.text_model.")]
    assert len(groups[1]["params"]) == len(text)  # every text-tower weight, nothing of the frozen image tower
    assert len(groups[0]["params"]) == 2  # the text projection and logit_scale (learned: NT-Xent's temperature)
