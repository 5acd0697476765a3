"""Checkpoints of the original VSE∞ code (woodfrog/vse_infty's ``model_best.pth``): imported faithfully, safely, or
refused in one line.

The file is made exactly as vse_infty's ``train.py`` saves it: ``torch.save({'epoch', 'model': [img_enc.state_dict(),
txt_enc.state_dict()], 'best_rsum', 'opt': argparse.Namespace, 'Eiters'})`` with the encoders of
``tests/reference_vse_infty.py`` (the reference restated), every tensor random (BatchNorm statistics included), the
BERT's ``position_ids`` buffer that transformers < 4.31 saved, and a DataParallel variant (``module.`` keys). The
BERT folder holds *other* (freshly initialised) weights than the file: the import must take the file's. The expected
embeddings are the reference forward pass, captions tokenised by transformers' ``BertTokenizer`` (as vse_infty
tokenises them), not by cocos.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.data.synth import make_synthetic
from cocos.embed import FrozenModel
from cocos.errors import CocosError
from cocos.io import load_npz
from cocos_cli.main import app
from tests import reference_vse_infty as ref
from tests.helpers import empty_figures

runner = CliRunner()
DIM, REGIONS, EMBED = 24, 8, 16
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# -- the original run ------------------------------------------------------------------------------

def word_pieces(captions: list[str]) -> list[str]:
    """A small uncased vocab.txt: the specials, then the captions' words; words of 8+ letters only as two pieces
    (``tetr`` ``##ahedron``), and ``amber`` left out (``[UNK]``), so both WordPiece paths are taken."""
    words = sorted({w for c in captions for w in re.findall(r"\w+|[^\w\s]", c.lower())} - {"amber"})
    pieces = []
    for w in words:
        pieces += [w[:4], "##" + w[4:]] if len(w) >= 8 else [w]
    return list(dict.fromkeys(SPECIALS + pieces))


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every float tensor of the state random (running variances positive): an unused or misplaced one shows."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, value in module.state_dict().items():
        if not value.is_floating_point():
            state[key] = value
        elif key.endswith("running_var"):
            state[key] = torch.rand(value.shape, generator=gen) + 0.5
        else:
            state[key] = torch.randn(value.shape, generator=gen) * 0.3
    module.load_state_dict(state)
    return module.eval()


def opt_namespace(**overrides) -> argparse.Namespace:
    """vse_infty's arguments.py as train_region.sh sets them; ``max_violation`` True as train.py leaves it after the
    warm-up epoch; ``vocab_size`` the GloVe vocabulary's (train.py sets it; unused by the BERT model)."""
    opt = dict(data_path="/data", data_name="f30k_precomp", vocab_path="./vocab/", margin=0.2, num_epochs=25,
               batch_size=16, word_dim=300, embed_size=EMBED, grad_clip=2.0, learning_rate=5e-4, lr_update=15,
               optim="adam", workers=10, log_step=200, val_step=500, logger_name="runs/f30k/log",
               model_name="runs/f30k", resume="", max_violation=True, img_dim=DIM, no_imgnorm=False,
               no_txtnorm=False, precomp_enc_type="basic", backbone_path="", backbone_source="detector",
               vse_mean_warmup_epochs=1, reset_start_epoch=False, backbone_warmup_epochs=5,
               embedding_warmup_epochs=2, backbone_lr_factor=0.01, input_scale_factor=1, drop=True,
               vocab_size=11543)
    opt.update(overrides)
    return argparse.Namespace(**opt)


def save_like_train_py(path: Path, img_state: dict, txt_state: dict, opt, prefix: str = "") -> Path:
    torch.save({"epoch": 12, "model": [OrderedDict((prefix + k, v) for k, v in img_state.items()),
                                       OrderedDict((prefix + k, v) for k, v in txt_state.items())],
                "best_rsum": 401.5, "opt": opt, "Eiters": 9876}, path)
    return path


@pytest.fixture(autouse=True)
def _figures_not_rendered(monkeypatch):
    """The report's figures are not under test here: empty files instead of rendering."""
    empty_figures(monkeypatch)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A VSE∞ run of the original code: data, BERT folder, model_best.pth (plain and DataParallel), the reference
    embeddings of the training split."""
    from transformers import BertConfig, BertModel, BertTokenizer

    root = tmp_path_factory.mktemp("vse_infty")
    data = make_synthetic(root / "regions", n_train=60, n_dev=20, n_test=20, feature_dim=DIM, n_regions=REGIONS,
                          regions=True, seed=5)
    captions = (data / "train_caps.txt").read_text().splitlines()
    bert = root / "bert"
    vocab = word_pieces(captions)
    config = dict(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=37)
    torch.manual_seed(0)
    BertModel(BertConfig(**config)).save_pretrained(bert)
    (bert / "vocab.txt").write_text("\n".join(vocab) + "\n")

    torch.manual_seed(1)
    img_enc = perturbed(ref.EncoderImageAggr(DIM, EMBED, "basic"), 11)
    txt_enc = perturbed(ref.EncoderText(config, EMBED), 12)
    txt_state = OrderedDict(txt_enc.state_dict())
    assert "bert.embeddings.position_ids" not in txt_state  # transformers 5: not a state; older ones saved it
    txt_state["bert.embeddings.position_ids"] = torch.arange(512).unsqueeze(0)
    plain = save_like_train_py(root / "model_best.pth", img_enc.state_dict(), txt_state, opt_namespace())
    parallel = save_like_train_py(root / "checkpoint.pth", img_enc.state_dict(), txt_state, opt_namespace(),
                                  prefix="module.")

    with torch.no_grad():  # the reference forward pass, captions tokenised as vse_infty does (transformers)
        ims = torch.from_numpy(np.load(data / "train_ims.npy")).float()
        img = img_enc(ims, torch.full((len(ims),), float(REGIONS)))
        tokenizer = BertTokenizer.from_pretrained(str(bert), local_files_only=True)  # as vse_infty's from_pretrained
        ids = [tokenizer(c)["input_ids"] for c in captions]
        tokens, lengths = ref.collate_captions(ids)
        cap = txt_enc(tokens, torch.tensor(lengths))
    assert all(i[0] == 2 and i[-1] == 3 for i in ids)  # [CLS] ... [SEP]
    assert any(1 in i for i in ids) and any(vocab[t].startswith("##") for i in ids for t in i)  # [UNK], pieces
    assert len(set(np.round(cap[:, 0].numpy(), 5))) > 20  # captions differ: the test can tell them apart
    return {"root": root, "data": data, "bert": bert, "vocab": vocab, "config": config, "plain": plain,
            "parallel": parallel, "img": img.numpy(), "cap": cap.numpy(), "img_enc": img_enc, "txt_enc": txt_enc}


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


def encoded(ckpt, data, **kwargs):
    frozen = FrozenModel.load(ckpt, data, "cpu", **kwargs)
    emb = frozen.encode(frozen.open_split("train"))
    return emb.images.numpy(), emb.captions.numpy(), frozen


# -- faithful import -------------------------------------------------------------------------------

def test_model_best_pth_analyzes_and_imports_to_the_reference_embeddings(run, tmp_path):
    data, bert, plain = run["data"], run["bert"], run["plain"]
    res = runner.invoke(app, ["analyze", str(plain), "--bert", str(bert), "--data", str(data), "--out",
                              str(tmp_path / "r"), "--loss", "triplet_sh", "--no-progress", "--save-embeddings",
                              str(tmp_path / "e.npz")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r" / "results.json").is_file()
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["model"]["kind"] == "vse_infty" and results["training"]["loss"] == "triplet_sh"
    saved = load_npz(tmp_path / "e.npz")
    np.testing.assert_allclose(saved["images"], run["img"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(saved["captions"], run["cap"], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(saved["caption_image"], np.repeat(np.arange(60), 5))

    res = runner.invoke(app, ["import", str(plain), "--bert", str(bert), "--data", str(data), "--out",
                              str(tmp_path / "model.pt")])
    assert res.exit_code == 0, res.output
    assert "vse_infty" in res.output and "triplet_sh" in res.output and "word pieces" in res.output
    from cocos.training.checkpoint import load_checkpoint

    ckpt = load_checkpoint(tmp_path / "model.pt")  # weights_only=True: plain types only
    assert ckpt["model"]["kind"] == "vse_infty"
    assert ckpt["model"]["hparams"] == {"vocab_size": len(run["vocab"]), "img_dim": DIM,
                                        "bert_config": json.loads((bert / "config.json").read_text()),
                                        "embed_size": EMBED, "region_drop": 0.2}
    assert ckpt["vocab"] == run["vocab"] and ckpt["text"] == {"kind": "wordpiece", "lowercase": True}
    assert ckpt["loss"] == {"name": "triplet_sh", "params": {"margin": 0.2}, "compat": True}
    assert (ckpt["epoch"], ckpt["step"], ckpt["best_rsum"]) == (12, 9876, 401.5)
    train = ckpt["train"]
    assert (train["batch_size"], train["warmup_epochs"], train["epochs"], train["lr_update"]) == (16, 1, 25, 15)
    assert train["optimizer"] == "adamw" and train["lr_groups"] == {"txt_enc.bert": 0.1}
    assert "bert.embeddings.position_ids" not in {k.removeprefix("txt_enc.") for k in ckpt["state_dict"]}
    # the file's weights, not the folder's BERT
    word = run["txt_enc"].state_dict()["bert.embeddings.word_embeddings.weight"]
    assert torch.equal(ckpt["state_dict"]["txt_enc.bert.embeddings.word_embeddings.weight"], word)

    res = runner.invoke(app, ["analyze", str(tmp_path / "model.pt"), "--bert", str(bert), "--out", str(tmp_path / "x")])
    assert "carries its BERT" in one_error_line(res)

    # the imported checkpoint needs no --bert, and the DataParallel file (checkpoint.pth) is the same model
    for source, kwargs in ((tmp_path / "model.pt", {}), (run["parallel"], {"bert": bert})):
        img, cap, _ = encoded(source, data, **kwargs)
        np.testing.assert_allclose(img, run["img"], atol=1e-5, rtol=0)
        np.testing.assert_allclose(cap, run["cap"], atol=1e-5, rtol=0)


def test_sum_of_violations_and_an_embedding_size_that_differs_from_opt(run, tmp_path):
    from cocos.legacy import load_any_checkpoint

    good = torch.load(run["plain"], weights_only=False)
    torch.save({**good, "opt": opt_namespace(max_violation=False, margin=0.1)}, tmp_path / "a.pth")
    ckpt, converted = load_any_checkpoint(tmp_path / "a.pth", bert=run["bert"], data=run["data"])
    assert converted and ckpt["loss"] == {"name": "triplet", "params": {"margin": 0.1}, "compat": True}
    assert "warmup_epochs" not in ckpt["train"]  # no warm-up into a loss that has none
    torch.save({**good, "opt": opt_namespace(embed_size=EMBED * 2)}, tmp_path / "b.pth")
    with pytest.raises(CocosError, match="embed_size 32 but the weights have 16"):
        load_any_checkpoint(tmp_path / "b.pth", bert=run["bert"], data=run["data"])


# -- safety ----------------------------------------------------------------------------------------

class _Command:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_file_whose_pickle_would_run_code_is_refused_without_running_it(run, tmp_path):
    good = torch.load(run["plain"], weights_only=False)
    marker = tmp_path / "PWNED"
    bad = tmp_path / "bad.pth"
    torch.save({**good, "opt": _Command(marker)}, bad)
    common = ["--bert", str(run["bert"]), "--data", str(run["data"])]
    for args in (["analyze", str(bad), *common, "--out", str(tmp_path / "r")],
                 ["import", str(bad), *common, "--out", str(tmp_path / "m.pt")]):
        line = one_error_line(runner.invoke(app, args))
        assert "system" in line and "--trust-checkpoint" in line
    assert "system" in one_error_line(runner.invoke(app, ["analyze", str(bad), "--out", str(tmp_path / "r")]))
    assert not marker.exists() and not (tmp_path / "m.pt").exists()


# -- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"no_txtnorm": True}, "no_txtnorm"),
    ({"no_imgnorm": True}, "no_imgnorm"),
    ({"precomp_enc_type": "backbone", "backbone_source": "wsl"}, "no backbone"),  # region weights, a grid's opt
    ({"precomp_enc_type": "transformer"}, "opt.precomp_enc_type"),
    ({"img_dim": DIM + 1}, "img_dim"),
    ({"margin": "abc"}, "opt.margin"),
])
def test_what_cocos_cannot_represent_is_refused_in_one_line(run, tmp_path, change, words):
    good = torch.load(run["plain"], weights_only=False)
    torch.save({**good, "opt": opt_namespace(**change)}, tmp_path / "c.pth")
    line = one_error_line(runner.invoke(app, ["import", str(tmp_path / "c.pth"), "--bert", str(run["bert"]),
                                              "--data", str(run["data"]), "--out", str(tmp_path / "m.pt")]))
    assert words in line and "c.pth" in line
    assert not (tmp_path / "m.pt").exists()


def test_the_bert_folder_is_required_and_must_be_the_runs(run, tmp_path):
    plain, bert, data = str(run["plain"]), str(run["bert"]), str(run["data"])
    out = ["--out", str(tmp_path / "m.pt")]
    line = one_error_line(runner.invoke(app, ["import", plain, "--data", data, *out]))
    assert "pass --bert DIR" in line and "model_best.pth" in line
    line = one_error_line(runner.invoke(app, ["analyze", plain, "--data", data, "--out", str(tmp_path / "r")]))
    assert "pass --bert DIR" in line
    line = one_error_line(runner.invoke(app, ["import", plain, "--bert", str(tmp_path / "nope"), "--data", data,
                                              *out]))
    assert "nope" in line and "BERT folder" in line
    (tmp_path / "vocab.pkl").write_bytes(b"x")
    line = one_error_line(runner.invoke(app, ["import", plain, "--vocab", str(tmp_path / "vocab.pkl"), "--bert",
                                              bert, "--data", data, *out]))
    assert "--vocab" in line and "--bert" in line

    # another BERT: more word pieces than the file's embedding has rows, or another hidden size
    for name, change in (("rows", {"vocab_size": len(run["vocab"]) + 1}), ("hidden", {"hidden_size": 64})):
        other = tmp_path / f"bert_{name}"
        other.mkdir()
        config = {**run["config"], "model_type": "bert", **change}
        (other / "config.json").write_text(json.dumps(config))
        (other / "vocab.txt").write_text("\n".join(run["vocab"] + ["extra"] * (config["vocab_size"]
                                                                                - len(run["vocab"]))) + "\n")
        line = one_error_line(runner.invoke(app, ["import", plain, "--bert", str(other), "--data", data, *out]))
        assert "model_best.pth" in line and ("vocab_size" if name == "rows" else "hidden_size") in line
    assert not (tmp_path / "m.pt").exists()


def test_a_vsepp_file_refuses_bert_and_unknown_text_weights_are_named(run, tmp_path):
    vsepp = {"epoch": 1, "model": [{"fc.weight": torch.zeros(EMBED, DIM), "fc.bias": torch.zeros(EMBED)},
                                   {"embed.weight": torch.zeros(9, 4)}],
             "best_rsum": 0.0, "opt": argparse.Namespace(data_name="f30k_precomp"), "Eiters": 1}
    torch.save(vsepp, tmp_path / "vsepp.pth.tar")
    line = one_error_line(runner.invoke(app, ["import", str(tmp_path / "vsepp.pth.tar"), "--bert", str(run["bert"]),
                                              "--data", str(run["data"]), "--out", str(tmp_path / "m.pt")]))
    assert "VSE++" in line and "--bert" in line and "--vocab" in line

    good = torch.load(run["plain"], weights_only=False)
    for key in ("cls.predictions.bias", "bert.encoder.layer.7.output.dense.weight"):
        txt = OrderedDict(good["model"][1])
        txt[key] = torch.zeros(3)
        torch.save({**good, "model": [good["model"][0], txt]}, tmp_path / "x.pth")
        line = one_error_line(runner.invoke(app, ["analyze", str(tmp_path / "x.pth"), "--bert", str(run["bert"]),
                                                  "--data", str(run["data"]), "--out", str(tmp_path / "r")]))
        assert key in line and "x.pth" in line


# -- the grid variant (precomp_enc_type backbone) ----------------------------------------------------

def test_a_backbone_run_maps_onto_vse_infty_full_without_the_duplicate_views(run, tmp_path):
    """Each tensor filled with its own number, so where each one lands is checked; built from shapes (no forward
    pass: a ResNeXt-101 is too slow for this suite)."""
    from cocos.legacy.vse_infty import convert_checkpoint
    from cocos.models.cnn import build_cnn
    from cocos.training.checkpoint import validate_model

    with torch.device("meta"):
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in build_cnn("resnext101_32x8d").state_dict().items()}
    resnet = {k: torch.full(s, float(i), dtype=d) if d.is_floating_point else torch.tensor(0, dtype=d)
              for i, (k, (s, d)) in enumerate(shapes.items())}
    img = OrderedDict(("backbone.resnet." + k, v) for k, v in resnet.items())
    views = {"conv1.": "base.0.", "bn1.": "base.1.", "layer1.": "base.4.", "layer2.": "base.5.",
             "layer3.": "base.6.", "layer4.": "top.0."}  # vse_infty's nn.Sequential views: the same tensors
    for k, v in resnet.items():
        for name, view in views.items():
            if k.startswith(name):
                img["backbone." + view + k.removeprefix(name)] = v
    grid_enc = perturbed(ref.EncoderImageAggr(2048, EMBED, "backbone"), 13)
    img.update(("image_encoder." + k, v) for k, v in grid_enc.state_dict().items())
    raw = {"epoch": 3, "model": [OrderedDict(("module." + k, v) for k, v in img.items()),
                                 run["txt_enc"].state_dict()], "best_rsum": 300.0, "Eiters": 5,
           "opt": vars(opt_namespace(precomp_enc_type="backbone", backbone_source="wsl", img_dim=2048,
                                     embedding_warmup_epochs=1, backbone_warmup_epochs=0))}  # train_grid.sh's
    ckpt = convert_checkpoint(raw, tmp_path / "wsl.pth", run["bert"], run["data"])
    assert ckpt["model"]["kind"] == "vse_infty_full" and ckpt["data"]["input"] == "images"
    assert ckpt["model"]["hparams"]["cnn_type"] == "resnext101_32x8d" and ckpt["model"]["hparams"]["finetune"]
    assert (ckpt["model"]["hparams"]["embedding_warmup_epochs"], ckpt["model"]["hparams"]["backbone_warmup_epochs"]) \
        == (1, 0)
    assert ckpt["train"]["lr_groups"] == {"txt_enc.bert": 0.1, "img_enc.backbone": 0.01}
    state = ckpt["state_dict"]
    for i, key in enumerate(shapes):
        if key.startswith("fc."):  # the classifier: not part of the trunk
            assert "img_enc.backbone." + key not in state
        elif shapes[key][1].is_floating_point:
            assert state["img_enc.backbone." + key].flatten()[0].item() == float(i), key
    for key, value in grid_enc.state_dict().items():
        assert torch.equal(state["img_enc.image_encoder." + key], value)
    validate_model(ckpt)

    for source, words in (("detector", "own ResNet-101"), ("imagenet_res50", "own ResNet-50"),
                          ("hub", "'hub'")):
        raw["opt"]["backbone_source"] = source
        with pytest.raises(CocosError, match=words):
            convert_checkpoint(raw, tmp_path / "x.pth", run["bert"], run["data"])
