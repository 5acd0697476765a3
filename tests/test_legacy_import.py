"""Checkpoints of the original VSE++ / VSRN code: imported faithfully, safely, or refused in one line.

The original encoders are re-stated below in plain torch the way fartashf/vsepp and
KunpengLi1994/VSRN compute them (``l2norm`` without eps, Conv1d graph reasoning with
``R / N``, ``pack_padded_sequence`` on length-sorted captions and a ``gather`` of the last
real step); their state dicts are saved as ``model_best.pth.tar`` with an
``argparse.Namespace`` ``opt``, the vocabulary as a pickle of a ``vocab.Vocabulary``. The
embeddings cocos saves must equal that independent forward pass.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from typer.testing import CliRunner

from cli.main import app
from cocos.data.synth import make_synthetic
from cocos.data.text import tokenize
from cocos.embed import FrozenModel
from cocos.errors import CocosError
from cocos.io import load_npz
from tests.helpers import empty_figures

runner = CliRunner()
EMBED, WORD, DIM = 12, 6, 10


# -- the original code, re-stated ------------------------------------------------------------------

def orig_l2norm(x):
    return torch.div(x, torch.pow(x, 2).sum(dim=1, keepdim=True).sqrt())


class OrigEncoderImagePrecomp(nn.Module):
    def __init__(self, img_dim, embed_size, use_abs=False):
        super().__init__()
        self.use_abs = use_abs
        self.fc = nn.Linear(img_dim, embed_size)

    def forward(self, images):
        features = orig_l2norm(self.fc(images))
        return torch.abs(features) if self.use_abs else features


class OrigEncoderText(nn.Module):
    def __init__(self, vocab_size, word_dim, embed_size, num_layers, use_abs=False, bidirectional=False):
        super().__init__()
        self.use_abs, self.embed_size = use_abs, embed_size
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(word_dim, embed_size, num_layers, batch_first=True, bidirectional=bidirectional)

    def forward(self, x, lengths):
        x = self.embed(x)
        packed = pack_padded_sequence(x, lengths, batch_first=True)
        out, _ = self.rnn(packed)
        padded = pad_packed_sequence(out, batch_first=True)
        index = (torch.LongTensor(lengths).view(-1, 1, 1).expand(x.size(0), 1, self.embed_size) - 1)
        out = orig_l2norm(torch.gather(padded[0], 1, index).squeeze(1))
        return torch.abs(out) if self.use_abs else out


class OrigRsGCN(nn.Module):
    def __init__(self, in_channels, inter_channels):
        super().__init__()
        self.inter_channels = inter_channels
        self.g = nn.Conv1d(in_channels, inter_channels, kernel_size=1)
        self.W = nn.Sequential(nn.Conv1d(inter_channels, in_channels, kernel_size=1), nn.BatchNorm1d(in_channels))
        self.theta = nn.Conv1d(in_channels, inter_channels, kernel_size=1)
        self.phi = nn.Conv1d(in_channels, inter_channels, kernel_size=1)

    def forward(self, v):
        b = v.size(0)
        g_v = self.g(v).view(b, self.inter_channels, -1).permute(0, 2, 1)
        theta_v = self.theta(v).view(b, self.inter_channels, -1).permute(0, 2, 1)
        phi_v = self.phi(v).view(b, self.inter_channels, -1)
        r = torch.matmul(theta_v, phi_v)
        y = torch.matmul(r / r.size(-1), g_v).permute(0, 2, 1).contiguous()
        y = y.view(b, self.inter_channels, *v.size()[2:])
        return self.W(y) + v


class OrigEncoderImagePrecompAttn(nn.Module):
    """KunpengLi1994/VSRN (latest): final BatchNorm and no l2norm after fc for 'f30k_precomp' only."""

    def __init__(self, img_dim, embed_size, data_name):
        super().__init__()
        self.data_name = data_name
        self.fc = nn.Linear(img_dim, embed_size)
        self.img_rnn = nn.GRU(embed_size, embed_size, 1, batch_first=True)
        for i in range(1, 5):
            setattr(self, f"Rs_GCN_{i}", OrigRsGCN(embed_size, embed_size))
        if data_name == "f30k_precomp":
            self.bn = nn.BatchNorm1d(embed_size)

    def forward(self, images):
        fc_img_emd = self.fc(images)
        if self.data_name != "f30k_precomp":
            fc_img_emd = orig_l2norm(fc_img_emd)
        x = fc_img_emd.permute(0, 2, 1)
        for i in range(1, 5):
            x = getattr(self, f"Rs_GCN_{i}")(x)
        x = orig_l2norm(x.permute(0, 2, 1))
        _, hidden_state = self.img_rnn(x)
        features = hidden_state[0]
        if self.data_name == "f30k_precomp":
            features = self.bn(features)
        return orig_l2norm(features)


def randomise(module: nn.Module, seed: int) -> nn.Module:
    """Non-trivial weights everywhere, BatchNorm statistics included (VSRN starts them at identity)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if tensor.dtype.is_floating_point:
                values = torch.rand(tensor.shape, generator=gen)
                tensor.copy_(0.5 + values if "running_var" in name else values - 0.5)
    return module.eval()


class OrigVocabulary:
    """vocab.py of VSE++: the class the pickle names (as vocab.Vocabulary)."""

    def __init__(self):
        self.word2idx, self.idx2word, self.idx = {}, {}, 0

    def add_word(self, word):
        if word not in self.word2idx:
            self.word2idx[word] = self.idx
            self.idx2word[self.idx] = word
            self.idx += 1

    def __call__(self, word):
        return self.word2idx.get(word, self.word2idx["<unk>"])

    def __len__(self):
        return len(self.word2idx)


def pickle_vocab(vocab: OrigVocabulary, path: Path, module: str = "vocab", protocol: int = 2) -> None:
    """Pickle ``vocab`` so that the file names ``module.Vocabulary``, as the original repositories' files do."""
    cls = type("Vocabulary", (OrigVocabulary,), {"__module__": module})
    fake = types.ModuleType(module)
    fake.Vocabulary = cls
    saved = sys.modules.get(module)
    sys.modules[module] = fake
    try:
        obj = cls.__new__(cls)
        obj.__dict__.update(vars(vocab))
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
    finally:
        if saved is None:
            del sys.modules[module]
        else:
            sys.modules[module] = saved


def original_vocab(captions: list[str], specials=("<pad>", "<start>", "<end>", "<unk>"), drop: int = 3):
    """VSE++'s build_vocab on the test's tokens, leaving out the ``drop`` rarest words (they become <unk>)."""
    counts: dict[str, int] = {}
    for caption in captions:
        for tok in tokenize(caption):
            counts[tok] = counts.get(tok, 0) + 1
    words = sorted(counts, key=lambda w: (-counts[w], w))[: len(counts) - drop]
    vocab = OrigVocabulary()
    for word in specials:
        vocab.add_word(word)
    for word in words:
        vocab.add_word(word)
    return vocab


def original_caption_ids(vocab: OrigVocabulary, caption: str) -> list[int]:
    """The data loader of VSE++: <start>, the tokens' ids (unknown -> <unk>), <end>."""
    return [vocab("<start>")] + [vocab(t) for t in tokenize(caption)] + [vocab("<end>")]


@torch.no_grad()
def original_embeddings(img_enc, txt_enc, folder: Path, vocab: OrigVocabulary):
    """Embeddings of the training split by the original encoders (captions sorted by length, as collate_fn)."""
    images = img_enc(torch.from_numpy(np.load(folder / "train_ims.npy")).float())
    captions = (folder / "train_caps.txt").read_text().splitlines()
    ids = [original_caption_ids(vocab, c) for c in captions]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    lengths = [len(ids[i]) for i in order]
    tokens = torch.zeros(len(ids), max(lengths), dtype=torch.long)
    for row, i in enumerate(order):
        tokens[row, : len(ids[i])] = torch.tensor(ids[i])
    out = torch.empty(len(ids), txt_enc.embed_size)
    out[torch.tensor(order)] = txt_enc(tokens, lengths)
    return images.numpy(), out.numpy()


def opt_namespace(**overrides) -> argparse.Namespace:
    """The hyper-parameters VSE++'s train.py records (and the reproducibility repository's additions)."""
    opt = dict(data_path="/data", data_name="f30k_precomp", vocab_path="./vocab/", margin=0.2, num_epochs=30,
               batch_size=16, word_dim=WORD, embed_size=EMBED, grad_clip=2.0, crop_size=224, num_layers=1,
               learning_rate=2e-4, lr_update=15, workers=10, log_step=10, val_step=500, logger_name="runs/runX",
               resume="", max_violation=True, img_dim=DIM, finetune=False, cnn_type="vgg19", use_restval=False,
               measure="cosine", use_abs=False, no_imgnorm=False, reset_train=False)
    opt.update(overrides)
    return argparse.Namespace(**opt)


def save_original(path: Path, img_enc, txt_enc, opt, extra_states=()) -> Path:
    opt.vocab_size = txt_enc.embed.num_embeddings
    torch.save({"epoch": 7, "model": [img_enc.state_dict(), txt_enc.state_dict(), *extra_states],
                "best_rsum": 412.5, "opt": opt, "Eiters": 1234}, path)
    return path


# -- fixtures --------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _figures_not_rendered(monkeypatch):
    """The report's figures are not under test here: write empty files instead of rendering (2 s an analysis)."""
    empty_figures(monkeypatch)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy")
    glob_dir = make_synthetic(root / "global", n_train=24, n_dev=8, n_test=8, feature_dim=DIM, seed=3)
    reg_dir = make_synthetic(root / "regions", n_train=24, n_dev=8, n_test=8, feature_dim=DIM, n_regions=4,
                             regions=True, seed=4)
    return root, glob_dir, reg_dir


@pytest.fixture(scope="module")
def vsepp_run(worlds):
    """A VSE++ run of the original code: checkpoint, vocabulary pickle, expected embeddings."""
    root, folder, _ = worlds
    vocab = original_vocab((folder / "train_caps.txt").read_text().splitlines())
    pickle_vocab(vocab, root / "f30k_precomp_vocab.pkl")
    img_enc = randomise(OrigEncoderImagePrecomp(DIM, EMBED), 1)
    txt_enc = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 2)
    ckpt = save_original(root / "model_best.pth.tar", img_enc, txt_enc, opt_namespace())
    return ckpt, root / "f30k_precomp_vocab.pkl", folder, original_embeddings(img_enc, txt_enc, folder, vocab)


def analyze(ckpt, out, *extra):
    return runner.invoke(app, ["analyze", str(ckpt), "--out", str(out), "--loss", "triplet_sh", "--no-progress",
                               *map(str, extra)])


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


# -- faithful import -------------------------------------------------------------------------------

def test_vsepp_checkpoint_analyzes_to_the_original_embeddings_and_imports_once(vsepp_run, tmp_path):
    ckpt, vocab, folder, (img, cap) = vsepp_run
    assert len(set(np.round(cap[:, 0], 6))) > 10  # captions differ: the test can tell them apart
    res = analyze(ckpt, tmp_path / "r", "--vocab", vocab, "--data", folder, "--save-embeddings", tmp_path / "e.npz")
    assert res.exit_code == 0, res.output
    saved = load_npz(tmp_path / "e.npz")
    np.testing.assert_allclose(saved["images"], img, atol=1e-5)
    np.testing.assert_allclose(saved["captions"], cap, atol=1e-5)
    np.testing.assert_array_equal(saved["caption_image"], np.repeat(np.arange(len(img)), 5))

    # once into the cocos format: then analyze (and evaluate) need no --vocab and give the same embeddings
    res = runner.invoke(app, ["import", str(ckpt), "--vocab", str(vocab), "--data", str(folder), "--out",
                              str(tmp_path / "model.pt")])
    assert res.exit_code == 0, res.output
    assert "triplet_sh" in res.output
    written = (tmp_path / "model.pt").read_bytes()
    res = runner.invoke(app, ["import", str(ckpt), "--vocab", str(vocab), "--data", str(folder), "--out",
                              str(tmp_path / "model.pt")])
    assert res.exit_code == 2 and "--overwrite" in res.output  # an existing file is replaced only when asked
    assert (tmp_path / "model.pt").read_bytes() == written
    res = analyze(tmp_path / "model.pt", tmp_path / "r2", "--save-embeddings", tmp_path / "e2.npz")
    assert res.exit_code == 0, res.output
    again = load_npz(tmp_path / "e2.npz")
    for key in ("images", "captions", "caption_image"):
        np.testing.assert_array_equal(again[key], saved[key])
    res = runner.invoke(app, ["evaluate", str(tmp_path / "model.pt"), "--split", "dev", "--no-progress"])
    assert res.exit_code == 0, res.output

    from cocos.training.checkpoint import load_checkpoint

    converted = load_checkpoint(tmp_path / "model.pt")  # loads with weights_only=True: plain types only
    assert converted["loss"] == {"name": "triplet_sh", "params": {"margin": 0.2}, "compat": True}
    assert converted["epoch"] == 7 and converted["train"]["batch_size"] == 16
    assert converted["model"]["hparams"] == {"img_dim": DIM, "vocab_size": len(converted["vocab"]),
                                             "word_dim": WORD, "embed_size": EMBED}


def test_vsrn_checkpoint_with_its_caption_decoder_matches_the_original(worlds, tmp_path):
    root, _, folder = worlds
    vocab = original_vocab((folder / "train_caps.txt").read_text().splitlines())
    pickle_vocab(vocab, tmp_path / "vocab.pkl", module="__main__", protocol=0)  # vocab.py run as a script
    img_enc = randomise(OrigEncoderImagePrecompAttn(DIM, EMBED, "f30k_precomp"), 5)
    txt_enc = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 6)
    decoder = {"decoder.weight": torch.randn(3, 3)}  # VSRN's caption model: ignored
    opt = opt_namespace(criterion="ranking", tau=0.01, dim_vid=2048, dim_hidden=512, bidirectional=0)
    ckpt = save_original(tmp_path / "model_best.pth.tar", img_enc, txt_enc, opt, [decoder])
    img, cap = original_embeddings(img_enc, txt_enc, folder, vocab)
    res = analyze(ckpt, tmp_path / "r", "--vocab", tmp_path / "vocab.pkl", "--data", folder, "--save-embeddings",
                  tmp_path / "e.npz")
    assert res.exit_code == 0, res.output
    saved = load_npz(tmp_path / "e.npz")
    np.testing.assert_allclose(saved["images"], img, atol=1e-5)
    np.testing.assert_allclose(saved["captions"], cap, atol=1e-5)
    frozen = FrozenModel.load(ckpt, folder, "cpu", vocab=tmp_path / "vocab.pkl")
    assert frozen.checkpoint["loss"]["name"] == "smoothap" and frozen.checkpoint["loss"]["params"] == {"tau": 0.01}
    assert frozen.checkpoint["model"]["hparams"]["fc_norm"] is False  # f30k_precomp with the final BatchNorm


def _encode(ckpt, folder, vocab):
    frozen = FrozenModel.load(ckpt, folder, "cpu", vocab=vocab)
    emb = frozen.encode(frozen.open_split("train"))
    return emb.images.numpy(), emb.captions.numpy(), frozen


def test_variants_coco_vsrn_two_layer_gru_use_abs_and_moved_specials(worlds, tmp_path):
    root, glob_dir, reg_dir = worlds
    # VSRN without the final BatchNorm (coco_precomp): l2norm after fc
    # (its vocabulary as SCAN's JSON: idx2word keys are strings there)
    vocab = original_vocab((reg_dir / "train_caps.txt").read_text().splitlines())
    (tmp_path / "v.json").write_text(json.dumps({"word2idx": vocab.word2idx, "idx": vocab.idx,
                                                 "idx2word": {str(i): w for i, w in vocab.idx2word.items()}}))
    img_enc = randomise(OrigEncoderImagePrecompAttn(DIM, EMBED, "coco_precomp"), 7)
    txt_enc = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 8)
    ckpt = save_original(tmp_path / "vsrn.pth.tar", img_enc, txt_enc, opt_namespace(data_name="coco_precomp"))
    img, cap, frozen = _encode(ckpt, reg_dir, tmp_path / "v.json")
    exp_img, exp_cap = original_embeddings(img_enc, txt_enc, reg_dir, vocab)
    np.testing.assert_allclose(img, exp_img, atol=1e-5)
    np.testing.assert_allclose(cap, exp_cap, atol=1e-5)
    assert frozen.checkpoint["model"]["hparams"]["final_bn"] is False

    # VSE++ with a two-layer caption GRU, use_abs, sum of violations, and the specials at other ids
    captions = (glob_dir / "train_caps.txt").read_text().splitlines()
    vocab = original_vocab(captions, specials=())
    for special in ("<end>", "<unk>", "<start>", "<pad>"):  # appended last, in another order
        vocab.add_word(special)
    pickle_vocab(vocab, tmp_path / "moved.pkl")
    img_enc = randomise(OrigEncoderImagePrecomp(DIM, EMBED, use_abs=True), 9)
    txt_enc = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 2, use_abs=True), 10)
    opt = opt_namespace(num_layers=2, use_abs=True, max_violation=False, margin=0.1)
    ckpt = save_original(tmp_path / "vse.pth.tar", img_enc, txt_enc, opt)
    img, cap, frozen = _encode(ckpt, glob_dir, tmp_path / "moved.pkl")
    exp_img, exp_cap = original_embeddings(img_enc, txt_enc, glob_dir, vocab)
    assert (exp_img >= 0).all() and (exp_cap >= 0).all()
    np.testing.assert_allclose(img, exp_img, atol=1e-5)
    np.testing.assert_allclose(cap, exp_cap, atol=1e-5)
    ckpt_dict = frozen.checkpoint
    assert ckpt_dict["vocab"][:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert ckpt_dict["model"]["hparams"]["num_layers"] == 2 and ckpt_dict["model"]["hparams"]["use_abs"] is True
    assert ckpt_dict["loss"] == {"name": "triplet", "params": {"margin": 0.1}, "compat": True}


# -- safety ----------------------------------------------------------------------------------------

class _Command:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_checkpoint_and_vocabulary_run_nothing(vsepp_run, tmp_path):
    ckpt, vocab, folder, _ = vsepp_run
    good = torch.load(ckpt, weights_only=False)
    marker = tmp_path / "PWNED"
    bad = tmp_path / "bad.pth.tar"
    torch.save({**good, "opt": _Command(marker)}, bad)
    for args in (["analyze", str(bad), "--vocab", str(vocab), "--data", str(folder), "--out", str(tmp_path / "r")],
                 ["import", str(bad), "--vocab", str(vocab), "--data", str(folder), "--out", str(tmp_path / "m.pt")]):
        line = one_error_line(runner.invoke(app, args))
        assert "system" in line and "--trust-checkpoint" in line
    res = analyze(bad, tmp_path / "r")  # without --vocab: the cocos loader fails first, the message stays clean
    assert "system" in one_error_line(res)
    assert not marker.exists()

    bad_vocab = tmp_path / "bad_vocab.pkl"
    bad_vocab.write_bytes(pickle.dumps({"word2idx": _Command(marker)}))
    res = runner.invoke(app, ["import", str(ckpt), "--vocab", str(bad_vocab), "--data", str(folder), "--out",
                              str(tmp_path / "m.pt")])
    assert "system" in one_error_line(res)
    assert not marker.exists() and not (tmp_path / "m.pt").exists()


def test_trust_checkpoint_loads_with_full_pickle_and_warns(vsepp_run, tmp_path):
    ckpt, vocab, folder, _ = vsepp_run
    res = runner.invoke(app, ["import", str(ckpt), "--vocab", str(vocab), "--data", str(folder), "--out",
                              str(tmp_path / "m.pt"), "--trust-checkpoint"])
    assert res.exit_code == 0, res.output
    assert "warning: --trust-checkpoint" in res.output and "code in it may run" in res.output


# -- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"measure": "order"}, "order"),
    ({"no_imgnorm": True}, "no_imgnorm"),
    ({"criterion": "infonce"}, "infonce"),
    ({"data_name": "f30k"}, "raw images"),
    ({"img_dim": DIM + 1}, "img_dim"),
    ({"margin": float("nan")}, "opt.margin"),  # present but not a number: never silently the default
    ({"margin": "abc"}, "opt.margin"),
])
def test_what_cocos_cannot_represent_is_refused(vsepp_run, tmp_path, change, words):
    ckpt, vocab, folder, _ = vsepp_run
    good = torch.load(ckpt, weights_only=False)
    opt = argparse.Namespace(**{**vars(good["opt"]), **change})
    torch.save({**good, "opt": opt}, tmp_path / "c.pth.tar")
    line = one_error_line(analyze(tmp_path / "c.pth.tar", tmp_path / "r", "--vocab", vocab, "--data", folder))
    assert words in line and "c.pth.tar" in line


def test_an_opt_nested_5000_deep_is_one_line(vsepp_run, tmp_path):
    """An original VSE++ checkpoint whose ``opt`` holds a list nested 5,000 deep: one line naming the field (before,
    a RecursionError traceback from the converter's copy of ``opt``), from ``analyze`` and ``import`` alike."""
    import sys

    ckpt, vocab, folder, _ = vsepp_run
    good = torch.load(ckpt, weights_only=False)
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(30_000)
    try:
        torch.save({**good, "opt": argparse.Namespace(**{**vars(good["opt"]), "lr_update": deep})},
                   tmp_path / "c.pth.tar")
    finally:
        sys.setrecursionlimit(limit)
    line = one_error_line(analyze(tmp_path / "c.pth.tar", tmp_path / "r", "--vocab", vocab, "--data", folder))
    assert "opt.lr_update is nested more than 16 deep" in line and not (tmp_path / "r").exists()
    imported = runner.invoke(app, ["import", str(tmp_path / "c.pth.tar"), "--vocab", str(vocab), "--data",
                                   str(folder), "--out", str(tmp_path / "x.pt")])
    assert "opt.lr_update is nested more than 16 deep" in one_error_line(imported)
    assert not (tmp_path / "x.pt").exists()


def test_bad_weights_are_refused_naming_the_file(vsepp_run, tmp_path):
    ckpt, vocab, folder, _ = vsepp_run
    good = torch.load(ckpt, weights_only=False)
    img_sd, txt_sd = good["model"]
    cases = {
        "bidirectional": [img_sd, randomise(OrigEncoderText(txt_sd["embed.weight"].shape[0], WORD, EMBED, 1,
                                                            bidirectional=True), 0).state_dict()],
        "lacks": [img_sd, {k: v for k, v in txt_sd.items() if k != "embed.weight"}],
        "other than fc": [{**img_sd, "cnn.conv.weight": torch.zeros(2)}, txt_sd],
        "dimensions": [{"fc.weight": torch.zeros(EMBED + 1, DIM), "fc.bias": torch.zeros(EMBED + 1)}, txt_sd],
    }
    for words, model in cases.items():
        torch.save({**good, "model": model}, tmp_path / "w.pth.tar")
        with pytest.raises(CocosError, match=words) as info:
            FrozenModel.load(tmp_path / "w.pth.tar", folder, "cpu", vocab=vocab)
        assert "w.pth.tar" in str(info.value) and "\n" not in str(info.value)
    torch.save({"model": good["model"], "epoch": 1}, tmp_path / "noopt.pth.tar")
    with pytest.raises(CocosError, match="lacks 'opt'"):
        FrozenModel.load(tmp_path / "noopt.pth.tar", folder, "cpu", vocab=vocab)


def test_vocabulary_must_fit_the_embedding_table_and_inputs_are_required(vsepp_run, tmp_path):
    ckpt, vocab, folder, _ = vsepp_run
    short = OrigVocabulary()
    for word in ("<pad>", "<start>", "<end>", "<unk>", "a", "dog"):
        short.add_word(word)
    pickle_vocab(short, tmp_path / "short.pkl")
    line = one_error_line(analyze(ckpt, tmp_path / "r", "--vocab", tmp_path / "short.pkl", "--data", folder))
    assert "6 words" in line and "rows" in line

    assert "--vocab" in one_error_line(analyze(ckpt, tmp_path / "r", "--data", folder))
    assert "--data" in one_error_line(analyze(ckpt, tmp_path / "r", "--vocab", vocab))
    for missing in ("--vocab", "--data", "--out"):
        args = {"--vocab": str(vocab), "--data": str(folder), "--out": str(tmp_path / "m.pt")}
        del args[missing]
        res = runner.invoke(app, ["import", str(ckpt), *[x for kv in args.items() for x in kv]])
        assert missing in one_error_line(res)
    # --out must not replace an input; a cocos checkpoint is not imported again
    before = vocab.read_bytes()
    res = runner.invoke(app, ["import", str(ckpt), "--vocab", str(vocab), "--data", str(folder), "--out", str(vocab)])
    assert "input" in one_error_line(res)
    assert vocab.read_bytes() == before
    res = runner.invoke(app, ["import", str(ckpt), "--vocab", str(vocab), "--data", str(folder), "--out",
                              str(tmp_path / "m.pt")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["import", str(tmp_path / "m.pt"), "--vocab", str(vocab), "--data", str(folder),
                              "--out", str(tmp_path / "m2.pt")])
    assert "carries its vocabulary" in one_error_line(res)


def test_the_new_model_options_leave_default_models_as_they_were():
    from cocos.models import VSEPP, VSRN

    torch.manual_seed(0)
    vsepp, vsrn = VSEPP(DIM, 20, WORD, EMBED), VSRN(DIM, 20, WORD, EMBED, n_gcn=1)
    assert vsepp.hparams == {"img_dim": DIM, "vocab_size": 20, "word_dim": WORD, "embed_size": EMBED}
    assert vsrn.hparams == {**vsepp.hparams, "n_gcn": 1, "final_bn": True}
    assert "txt_enc.rnn.weight_ih_l1" not in vsepp.state_dict()
    # norm_over_regions changes the region l2norms only: same weights, other embeddings
    other = VSRN(DIM, 20, WORD, EMBED, n_gcn=1, norm_over_regions=True)
    assert other.hparams["norm_over_regions"] is True
    other.load_state_dict(vsrn.state_dict())
    feats = torch.randn(3, 4, DIM)
    with torch.no_grad():
        assert not torch.allclose(other.eval().encode_images(feats), vsrn.eval().encode_images(feats), atol=1e-3)
