"""The SigLIP family (issue 39): a tiny random SigLIP folder saved as transformers 5 saves one
(``SiglipModel.save_pretrained``, ``SiglipProcessor.save_pretrained``: ``tokenizer.json``, ``tokenizer_config.json``,
``processor_config.json``), its tokenizer (padded to the text tower's length, on the tokenizer's side) and
preprocessing against transformers' own, embeddings against ``get_image_features`` / ``get_text_features`` (1e-5),
``cocos analyze`` and ``cocos import`` of the folder (its loss SigLIP's at its own ``t = exp(logit_scale)`` and
``b = logit_bias``), ``cocos train --model siglip`` (SigLIP's loss by default, ``t`` and ``b`` learned as the model's
parameters, the checkpoint analysed without the folder), and the refusals of incomplete folders."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")

from cocos.data.images import load_image_split  # noqa: E402
from cocos.data.siglip import SiglipFolder, TextPadding, pad_ids, read_tokenizer  # noqa: E402
from cocos.data.synth_images import make_synthetic_images  # noqa: E402
from cocos.data.text import pad_batch  # noqa: E402
from cocos.data.wordpiece import coder_of  # noqa: E402
from cocos.embed import FrozenModel  # noqa: E402
from cocos.errors import CocosError  # noqa: E402
from cocos.models.siglip import SiglipDual  # noqa: E402
from cocos_cli.main import app  # noqa: E402

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
MERGES = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("a", "n"), ("o", "n"), ("i", "n"), ("r", "e")]
POSITIONS = 12  # the text tower's max_position_embeddings: every caption is padded (and cut) to it
IMAGE = 16
SCALE, BIAS = math.log(7.0), -3.0  # the folder's own t = 7 and b = -3 (SigLIP initialises them at 10 and -10)
CAPTIONS = ["the cat on the mat", "an onion in a tree", "", "the " * 20, "Zebra, 12 apples!"]


def siglip_folder(folder: Path, side: str = "right") -> Path:
    """A random tiny SigLIP folder as transformers 5 saves it: a Gemma-style BPE tokenizer (``GemmaTokenizer``, an
    end-of-text token added, padded on ``side``) and ``SiglipImageProcessorPil`` through ``SiglipProcessor``, then
    ``SiglipModel`` (one block a tower, 16-px images of 8-px patches, 12 text positions), its ``logit_scale`` and
    ``logit_bias`` other than SigLIP's initial ones."""
    vocab = SPECIAL + ["▁"] + list(LETTERS) + [a + b for a, b in MERGES]
    vocab = {t: i for i, t in enumerate(vocab)}
    tok = transformers.GemmaTokenizer(vocab=vocab, merges=MERGES, padding_side=side, add_eos_token=True)
    images = transformers.SiglipImageProcessorPil(size={"height": IMAGE, "width": IMAGE})
    transformers.SiglipProcessor(image_processor=images, tokenizer=tok).save_pretrained(str(folder))
    torch.manual_seed(0)
    text = dict(vocab_size=len(vocab) + 3, hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=POSITIONS)
    vision = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2,
                  image_size=IMAGE, patch_size=8)
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision))
    with torch.no_grad():
        model.logit_scale.fill_(SCALE)
        model.logit_bias.fill_(BIAS)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("siglip")
    folder = siglip_folder(root / "siglip")
    data = make_synthetic_images(root / "images", n_train=16, n_dev=8, n_test=8, image_size=24, seed=0,
                                 progress=False)
    return root, folder, Path(data)


def reference(folder: Path):
    """transformers' own model and processor of the folder."""
    model = transformers.SiglipModel.from_pretrained(str(folder), local_files_only=True).eval()
    return model, transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True)


def normed(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def reference_embeddings(model, processor, images, captions):
    """transformers' embeddings: SigLIP's processor (``padding="max_length"``, as SigLIP was trained) and
    ``get_image_features`` / ``get_text_features`` on the padded ids, no attention mask (SigLIP's text tower
    takes none), normalised."""
    with torch.no_grad():
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        ids = processor(text=captions, padding="max_length", max_length=POSITIONS, truncation=True,
                        return_tensors="pt")["input_ids"]
        return (normed(model.get_image_features(pixel_values=pixels).pooler_output),
                normed(model.get_text_features(input_ids=ids).pooler_output))


def test_tokenizer_and_padding_are_transformers_own(world):
    _, folder, _ = world
    siglip = SiglipFolder.read(folder)
    tok = reference(folder)[1].tokenizer
    cut = tok(CAPTIONS, truncation=True, max_length=POSITIONS).input_ids
    assert siglip.coder.encode_all(CAPTIONS) == cut and [siglip.coder.encode(c) for c in CAPTIONS] == cut
    assert cut[3][-1] == tok.eos_token_id and len(cut[3]) == POSITIONS  # the long caption cut, its end kept
    assert siglip.padding == TextPadding(tok.pad_token_id, "right")
    for side in ("right", "left"):  # the model pads the coder's ids as padding="max_length" pads them
        tok.padding_side = side
        want = tok(CAPTIONS, padding="max_length", max_length=POSITIONS, truncation=True,
                   return_tensors="pt").input_ids
        padded = pad_ids(*pad_batch(siglip.coder.encode_all(CAPTIONS)), TextPadding(tok.pad_token_id, side),
                         POSITIONS)
        assert torch.equal(padded, want), side
    again = coder_of(siglip.coder.tokens, siglip.coder.options())  # the checkpoint's record stands alone
    assert again == siglip.coder and again.encode_all(CAPTIONS) == cut


def test_a_word_level_tokenizer_and_one_without_a_pad_token(tmp_path):
    """A ``tokenizers`` WordLevel tokenizer saved by ``PreTrainedTokenizerFast`` reads as transformers reads it;
    without a pad token it is one line (SigLIP pads every caption)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "the", "cat", "a", "red"]
    for name, pad in (("with", "[PAD]"), ("without", None)):
        inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        inner.pre_tokenizer = pre_tokenizers.Whitespace()
        tok = transformers.PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]",
                                                   **({"pad_token": pad} if pad else {}))
        tok.save_pretrained(str(tmp_path / name))
    coder, padding = read_tokenizer(tmp_path / "with", 6)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "with"), local_files_only=True)
    text = ["the cat", "a red dog", "the the the the the the the"]
    assert coder.encode_all(text) == tok(text, truncation=True, max_length=6).input_ids
    assert padding == TextPadding(0, "right")
    with pytest.raises(CocosError, match="no pad token"):
        read_tokenizer(tmp_path / "without", 6)


@pytest.mark.parametrize("size", [(64, 48), (16, 16), (9, 31), (101, 37)])
def test_preprocessing_is_the_processors(world, size):
    _, folder, _ = world
    rng = np.random.default_rng(sum(size))
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    ours = SiglipFolder.read(folder).preprocess.transform(False)(img)
    assert torch.equal(ours, reference(folder)[1](images=img, return_tensors="pt")["pixel_values"][0])


def test_embeddings_equal_siglipmodel_features(world):
    _, folder, _ = world
    siglip = SiglipFolder.read(folder)
    model = SiglipDual(len(siglip.coder), siglip.config, siglip.preprocess.record(),
                       siglip.padding.record()).load_pretrained(folder).eval()
    ref, processor = reference(folder)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (20 + 5 * i, 30, 3), dtype=np.uint8)) for i in range(4)]
    want_img, want_cap = reference_embeddings(ref, processor, images, CAPTIONS)
    with torch.no_grad():
        img = model.encode_images(torch.stack([model.image_transform(False)(i) for i in images]))
        cap = model.encode_captions(*pad_batch(siglip.coder.encode_all(CAPTIONS)))
    assert torch.allclose(img, want_img, atol=1e-5) and torch.allclose(cap, want_cap, atol=1e-5)
    # the HF model's own parameters, t = exp(logit_scale) and b = logit_bias
    assert model.logit_scale is model.siglip.logit_scale and model.logit_bias is model.siglip.logit_bias
    assert isinstance(model.logit_scale, torch.nn.Parameter) and isinstance(model.logit_bias, torch.nn.Parameter)
    assert model.loss_params() == pytest.approx({"t": 7.0, "b": BIAS}, rel=1e-6)


def split_reference(folder: Path, data: Path, split: str = "train"):
    """transformers' embeddings of a split's images (in order) and captions (image-major, as cocos encodes them)."""
    images = load_image_split(data, split)
    pil = [images.image(i).convert("RGB") for i in range(images.n_images)]
    order = images.image_captions().reshape(-1)
    return reference_embeddings(*reference(folder), pil, [images.captions[c] for c in order])


def test_cocos_analyze_and_import_of_a_siglip_folder(world, tmp_path):
    _, folder, data = world
    out = tmp_path / "report"
    result = runner.invoke(app, ["analyze", str(folder), "--data", str(data), "--out", str(out), "--batch-size", "8",
                                 "--loss", "siglip", "--no-progress"])  # its own loss alone: fewer figures
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["kind"] == "siglip" and results["training"]["loss"] == "siglip"
    assert results["training"]["params"] == pytest.approx({"t": 7.0, "b": BIAS}, rel=1e-6)
    assert "siglip" in result.output and "C_qv-" in result.output
    size = results["model"]["hparams"]["preprocess"]["resize"]  # SigLIP resizes the whole image: no crop to report
    assert f"own preprocessing (resized to {size} × {size}, no crop," in (out / "tables.md").read_text()
    imported = tmp_path / "siglip.pt"
    result = runner.invoke(app, ["import", str(folder), "--data", str(data), "--out", str(imported)])
    assert result.exit_code == 0, result.output
    frozen = FrozenModel.load(imported)  # the written checkpoint: the coder rebuilt from its text record
    emb = frozen.encode(frozen.open_split("test"))
    want_img, want_cap = split_reference(folder, data, "test")
    assert torch.allclose(emb.images.cpu(), want_img, atol=1e-5)
    assert torch.allclose(emb.captions.cpu(), want_cap, atol=1e-5)
    bad = runner.invoke(app, ["analyze", str(folder), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "pass --data" in bad.output and "Traceback" not in bad.output


def test_fine_tuning_learns_t_and_b_with_siglips_loss(world, tmp_path):
    _, folder, data = world
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", "--model", "siglip", "--siglip", str(folder), "--data", str(data),
                                 "--out", str(run), "--epochs", "1", "--batch-size", "8", "--no-progress",
                                 "--lr", "1e-2"])
    assert result.exit_code == 0, result.output
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["train"]["loss"]["name"] == "siglip"  # the family's default loss (its recipe)
    optim = ckpt["train"]["optim"]
    assert (optim["optimizer"], optim["weight_decay"], optim["grad_clip"]) == ("adamw", 0.1, 0.0)
    assert ckpt["train"]["model"]["sources"] == {"siglip": str(folder)}
    scale, bias = (float(ckpt["state_dict"][f"siglip.logit_{k}"]) for k in ("scale", "bias"))
    assert scale != pytest.approx(SCALE, abs=1e-6) and bias != pytest.approx(BIAS, abs=1e-6)  # both learned
    assert ckpt["loss"]["name"] == "siglip"
    assert ckpt["loss"]["params"] == pytest.approx({"t": math.exp(scale), "b": bias}, rel=1e-6)
    assert ckpt["text"]["kind"] == "clip" and ckpt["model"]["hparams"]["text_padding"] == {"pad_id": 0,
                                                                                           "side": "right"}
    # the checkpoint stands alone: the fine-tuned weights as a folder embed as transformers' own
    tuned = tmp_path / "tuned"
    shutil.copytree(folder, tuned)
    model = transformers.SiglipModel.from_pretrained(str(folder), local_files_only=True)
    model.load_state_dict({k.removeprefix("siglip."): v for k, v in ckpt["state_dict"].items()})
    model.save_pretrained(str(tuned))
    frozen = FrozenModel.load(run / "last.pt")
    emb = frozen.encode(frozen.open_split("dev"))
    want_img, want_cap = split_reference(tuned, data, "dev")
    assert torch.allclose(emb.images.cpu(), want_img, atol=1e-5)
    assert torch.allclose(emb.captions.cpu(), want_cap, atol=1e-5)


def refused(args: list) -> str:
    """``cocos ARGS``: exit 2, one ``error:`` line, no traceback."""
    result = runner.invoke(app, [str(a) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_incomplete_folders_are_one_line(world, tmp_path):
    root, folder, data = world

    def broken(name: str, change) -> Path:
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        change(copy)
        return copy

    def edit(file: str, change):
        def apply(copy):
            path = copy / file
            config = json.loads(path.read_text())
            change(config)
            path.write_text(json.dumps(config))
        return apply

    def spiece(copy):
        (copy / "tokenizer.json").unlink()
        (copy / "spiece.model").write_bytes(b"\x00")

    cases = {
        "no-weights": (lambda c: (c / "model.safetensors").unlink(), "no weights"),
        "no-tokenizer": (lambda c: (c / "tokenizer.json").unlink(), "no tokenizer"),
        "spiece-only": (spiece, "spiece.model"),
        "no-preprocessing": (lambda c: (c / "processor_config.json").unlink(), "no image preprocessing"),
        "crop": (edit("processor_config.json", lambda p: p["image_processor"].update(do_center_crop=True)),
                 "centre crop"),
        "no-head": (edit("config.json", lambda c: c["vision_config"].update(vision_use_head=False)),
                    "vision_use_head"),
        "string-size": (edit("config.json", lambda c: c["text_config"].update(hidden_size="wide")),
                        "text_config.hidden_size"),
    }
    for name, (change, words) in cases.items():
        line = refused(["analyze", broken(name, change), "--data", data, "--out", tmp_path / f"{name}-out",
                        "--no-progress"])
        assert words in line, (name, line)
        assert not (tmp_path / f"{name}-out").exists()
    no_source = refused(["train", "--model", "siglip", "--data", data, "--out", tmp_path / "nosource"])
    assert "--siglip DIR" in no_source
