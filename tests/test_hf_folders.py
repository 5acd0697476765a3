"""Hugging Face folders are read completely or not at all (issue 37): a missing or integer-stored tensor, a damaged
or code-carrying weights file, sizes that would not fit, deep or huge JSON, a string where an integer belongs, each
one ``error:`` line and exit 2 through the commands that read them (``cocos analyze CLIP_DIR``, ``cocos train
--bert DIR``, ``cocos import``), before anything is allocated; folders saved by the installed transformers
(``BertTokenizer.save_pretrained``: ``tokenizer.json`` only; ``CLIPProcessor.save_pretrained``:
``processor_config.json``) read and embed as transformers' own tokenizer, processor and model (1e-5); VSE∞'s caption
augmentation draws one random piece per piece."""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from cocos.data.clip import CLIPFolder  # noqa: E402
from cocos.data.synth_images import make_synthetic_images  # noqa: E402
from cocos.data.text import pad_batch  # noqa: E402
from cocos.data.wordpiece import BertFolder, WordPieceCoder  # noqa: E402
from cocos.errors import CocosError  # noqa: E402
from cocos.hf import is_clip_folder  # noqa: E402
from cocos.models.clip import CLIPDual  # noqa: E402
from cocos.models.vse_infty import bert_model, load_bert_weights  # noqa: E402
from cocos_cli.main import app  # noqa: E402
from tests import preloaded  # noqa: E402
from tests.helpers import synth_words  # noqa: E402

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MERGES = ["t h", "th e</w>", "a n", "o n</w>", "i n", "e d</w>", "r e"]
CAPTIONS = ["the cat on the mat", "a red square in the corner", "then", "the " * 20, "zebra, 12 apples!"]
BERT_SIZES = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 20,
              "max_position_embeddings": 64}


# -- tiny folders, as the installed transformers saves them --------------------------------------------------------


def clip_folder(folder: Path, image_size: int = 30, positions: int = 16) -> Path:
    """A random tiny CLIP folder saved as the docs say: ``CLIPModel.save_pretrained`` and
    ``CLIPProcessor.save_pretrained`` (transformers 5: ``tokenizer.json`` and ``processor_config.json``, no
    ``vocab.json`` nor ``preprocessor_config.json``)."""
    source = folder.parent / f"{folder.name}-bpe"
    source.mkdir(parents=True)
    tokens = [c for ch in LETTERS for c in (ch, ch + "</w>")] + [a + b for a, b in (m.split() for m in MERGES)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    (source / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (source / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    tok = transformers.CLIPTokenizer(str(source / "vocab.json"), str(source / "merges.txt"))
    images = transformers.CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                                crop_size={"height": image_size, "width": image_size})
    transformers.CLIPProcessor(image_processor=images, tokenizer=tok).save_pretrained(str(folder))
    torch.manual_seed(0)
    text = dict(vocab_size=len(tokens), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=positions, eos_token_id=len(tokens) - 1,
                bos_token_id=len(tokens) - 2, pad_token_id=len(tokens) - 1)
    vision = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                  image_size=image_size, patch_size=6)
    transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision,
                                                   projection_dim=24)).save_pretrained(str(folder))
    shutil.rmtree(source)
    return folder


def bert_folder(folder: Path, words: list[str]) -> Path:
    """A random tiny BERT folder: ``BertModel.save_pretrained`` and ``BertTokenizer.save_pretrained`` (transformers 5:
    ``tokenizer.json``, no ``vocab.txt``)."""
    folder.mkdir(parents=True)
    vocab = folder.parent / f"{folder.name}-vocab.txt"
    vocab.write_text("\n".join(SPECIAL + words) + "\n")
    transformers.BertTokenizer(str(vocab)).save_pretrained(str(folder))
    vocab.unlink()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(SPECIAL) + len(words), **BERT_SIZES)
    transformers.BertModel(config).save_pretrained(str(folder))
    return folder


def copy_of(folder: Path, to: Path) -> Path:
    """A copy of ``folder`` that also holds the files older transformers wrote (``preprocessor_config.json``,
    ``vocab.txt``), so that each refusal below is of what it changes, whichever files a reader prefers."""
    shutil.copytree(folder, to)
    if (to / "processor_config.json").is_file():
        nested = json.loads((to / "processor_config.json").read_text())["image_processor"]
        (to / "preprocessor_config.json").write_text(json.dumps(nested))
    if json.loads((to / "config.json").read_text()).get("model_type") == "bert":
        vocab = json.loads((to / "tokenizer.json").read_text())["model"]["vocab"]
        (to / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
    return to


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    images = make_synthetic_images(root / "images", n_train=8, n_dev=4, n_test=4, image_size=40, seed=0,
                                   progress=False)
    regions = root / "regions"
    result = runner.invoke(app, ["data", "synth", str(regions), "--regions", "--n-regions", "4", "--feature-dim",
                                 "8", "--n-train", "20", "--n-dev", "10", "--n-test", "10"])
    assert result.exit_code == 0, result.output
    clip = clip_folder(root / "clip")
    bert = bert_folder(root / "bert", synth_words(regions) + ["##s"])
    return root, Path(images), regions, clip, bert


def refused(args: list, out: Path | None, *words: str) -> str:
    """``cocos ARGS``: exit 2, one ``error:`` line naming ``words``, no traceback, no ``out`` left."""
    result = runner.invoke(app, [str(a) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output and all(w in lines[0] for w in words), lines[0]
    assert out is None or not out.exists()
    return lines[0]


def analyze(world, clip: Path, *words: str) -> str:
    out = clip.parent / f"{clip.name}-report"
    return refused(["analyze", clip, "--data", world[1], "--out", out, "--batch-size", 4, "--no-progress"], out,
                   *words)


def train(world, bert: Path, *words: str) -> str:
    regions, out = world[2], bert.parent / f"{bert.name}-run"
    return refused(["train", "--data", regions, "--model", "vse_infty", "--bert", bert, "--out", out, "--epochs", 1,
                    "--embed-size", 8, "--batch-size", 10, "--no-progress", "--device", "cpu"], out, *words)


def rewrite_weights(folder: Path, change) -> None:
    path = folder / "model.safetensors"
    state = change(load_file(str(path)))
    save_file(state, str(path), metadata={"format": "pt"})


# -- item 3: folders the installed transformers writes ---------------------------------------------------------


def test_a_clip_processor_folder_embeds_as_transformers(world):
    clip = world[3]
    assert not (clip / "preprocessor_config.json").exists() and (clip / "processor_config.json").is_file()
    assert not (clip / "vocab.json").exists()
    folder = CLIPFolder.read(clip)
    model = CLIPDual(len(folder.coder), folder.config, folder.preprocess.record()).load_pretrained(clip).eval()
    ref = transformers.CLIPModel.from_pretrained(str(clip), local_files_only=True).eval()
    processor = transformers.CLIPProcessor.from_pretrained(str(clip), local_files_only=True)
    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 256, (40 + i, 50 - 3 * i, 3), dtype=np.uint8)) for i in range(4)]
    with torch.no_grad():
        want_img = ref.get_image_features(**processor(images=images, return_tensors="pt"))
        ids = processor.tokenizer(CAPTIONS, padding=True, truncation=True, max_length=16, return_tensors="pt")
        want_cap = ref.get_text_features(**ids)
        img = model.encode_images(torch.stack([model.image_transform(False)(i) for i in images]))
        cap = model.encode_captions(*pad_batch(folder.coder.encode_all(CAPTIONS)))
    want_img, want_cap = (getattr(w, "pooler_output", w) for w in (want_img, want_cap))
    assert torch.allclose(img, want_img / want_img.norm(dim=-1, keepdim=True), atol=1e-5)
    assert torch.allclose(cap, want_cap / want_cap.norm(dim=-1, keepdim=True), atol=1e-5)


def test_a_tokenizer_json_bert_embeds_as_transformers(world):
    bert = world[4]
    assert not (bert / "vocab.txt").exists() and (bert / "tokenizer.json").is_file()
    folder = BertFolder.read(bert)
    tok = transformers.BertTokenizer.from_pretrained(str(bert), local_files_only=True)
    captions = ["A man rides a red horses.", "Two SQUARES, left of the circle!", "Café zebra", ""]
    assert [list(c) for c in folder.coder.encode_all(captions)] == tok(captions).input_ids
    assert folder.coder.lowercase
    ours = load_bert_weights(bert_model(folder.config), bert).eval()
    ref = transformers.BertModel.from_pretrained(str(bert), local_files_only=True).eval()
    batch = tok(captions, padding=True, return_tensors="pt")
    with torch.no_grad():
        got = ours(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[0]
        want = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[0]
    assert torch.allclose(got, want, atol=1e-5)


def test_cocos_train_takes_a_tokenizer_json_bert(world):
    root, regions, bert = world[0], world[2], world[4]
    out = root / "run"
    result = runner.invoke(app, ["train", "--data", str(regions), "--model", "vse_infty", "--bert", str(bert),
                                 "--out", str(out), "--epochs", "1", "--embed-size", "8", "--batch-size", "10",
                                 "--no-progress", "--device", "cpu", "--warmup-epochs", "0"])
    assert result.exit_code == 0, result.output
    assert (out / "model_best.pt").is_file()


@pytest.mark.parametrize("change, words", [
    (lambda spec: spec["normalizer"].update(lowercase=True, strip_accents=False), "strip_accents"),
    (lambda spec: spec.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
    (lambda spec: spec["model"]["vocab"].update({"zzz": 10**6}), "ids must be"),
    (lambda spec: spec["added_tokens"].append({"id": 999, "content": "<new>"}), "added token"),
])
def test_a_tokenizer_json_cocos_does_not_restate_is_one_line(world, tmp_path, change, words):
    bert = Path(shutil.copytree(world[4], tmp_path / "bert"))
    spec = json.loads((bert / "tokenizer.json").read_text())
    change(spec)
    (bert / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(CocosError, match=words):
        WordPieceCoder.from_folder(bert)


# -- item 2: every tensor, of its kind ----------------------------------------------------------------------------


def test_a_clip_without_a_tensor_is_refused(world, tmp_path):
    clip = copy_of(world[3], tmp_path / "clip")
    key = "text_model.embeddings.position_embedding.weight"
    rewrite_weights(clip, lambda state: {k: v for k, v in state.items() if k != key})
    analyze(world, clip, "lack", key, "completely or not at all")


def test_a_clip_with_integer_weights_is_refused(world, tmp_path):
    clip = copy_of(world[3], tmp_path / "clip")
    rewrite_weights(clip, lambda state: {k: v.to(torch.int64) for k, v in state.items()})
    analyze(world, clip, "stored as I64")


def test_a_bert_without_a_tensor_is_refused(world, tmp_path):
    bert = copy_of(world[4], tmp_path / "bert")
    key = "encoder.layer.1.output.dense.weight"
    rewrite_weights(bert, lambda state: {k: v for k, v in state.items() if k != key})
    train(world, bert, "lack", key)


def test_a_bert_stored_as_int64_is_refused(world, tmp_path):
    bert = copy_of(world[4], tmp_path / "bert")
    rewrite_weights(bert, lambda state: {k: v.to(torch.int64) for k, v in state.items()})
    train(world, bert, "stored as I64", "floating point")


def test_older_names_and_a_pretraining_prefix_still_load(world, tmp_path):
    """``bert.``-prefixed keys with ``LayerNorm.gamma``/``beta`` and a head (bert-base-uncased's own file) load as
    transformers loads them; the head is left out."""
    bert = copy_of(world[4], tmp_path / "bert")
    state = load_file(str(bert / "model.safetensors"))
    old = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in state.items()}
    old["cls.predictions.bias"] = torch.zeros(3)
    (bert / "model.safetensors").unlink()
    torch.save(old, bert / "pytorch_model.bin")
    loaded = load_bert_weights(bert_model(BertFolder.read(bert).config), bert).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_sharded_weights_load_and_a_missing_shard_is_one_line(world, tmp_path):
    bert = Path(shutil.copytree(world[4], tmp_path / "bert"))
    (bert / "model.safetensors").unlink()
    model = transformers.BertModel.from_pretrained(str(world[4]), local_files_only=True)
    model.save_pretrained(str(bert), max_shard_size="20KB")
    shards = sorted(bert.glob("model-*.safetensors"))
    assert len(shards) > 1 and (bert / "model.safetensors.index.json").is_file()
    loaded = load_bert_weights(bert_model(BertFolder.read(bert).config), bert).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    shards[-1].unlink()
    with pytest.raises(CocosError, match=f"{shards[-1].name}: missing"):
        load_bert_weights(bert_model(BertFolder.read(bert).config), bert)


# -- item 4: damaged or code-carrying weights ----------------------------------------------------------------------


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_payload_is_one_line_and_never_runs(world, tmp_path):
    bert = copy_of(world[4], tmp_path / "bert")
    marker = tmp_path / "ran"
    (bert / "model.safetensors").unlink()
    (bert / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": _Payload(marker)}, protocol=2))
    line = train(world, bert, "holds code or objects that cocos does not load", "cocos never runs code from a file")
    assert "weights_only" not in line and not marker.exists()


@pytest.mark.parametrize("family", ["clip", "bert"])
@pytest.mark.parametrize("damage", ["truncated", "header"])
def test_a_damaged_safetensors_is_one_line(world, tmp_path, family, damage):
    folder = copy_of(world[3] if family == "clip" else world[4], tmp_path / family)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100] if damage == "truncated" else data[:8] + b"{garbage" + data[16:])
    (analyze if family == "clip" else train)(world, folder, "model.safetensors: is damaged")


# -- item 4: sizes, types and depth, refused before anything is built --------------------------------------------


def edit_config(folder: Path, change) -> None:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_a_string_where_an_integer_belongs_is_one_line_naming_the_key(world, tmp_path):
    clip = copy_of(world[3], tmp_path / "clip")
    edit_config(clip, lambda c: c["text_config"].update(max_position_embeddings="seventy"))
    analyze(world, clip, "text_config.max_position_embeddings", "'seventy'")
    bert = copy_of(world[4], tmp_path / "bert")
    edit_config(bert, lambda c: c.update(intermediate_size="seventy"))
    train(world, bert, "intermediate_size", "'seventy'")


def test_deep_json_is_one_line(world, tmp_path):
    clip = copy_of(world[3], tmp_path / "clip")
    (clip / "config.json").write_text('{"model_type": "clip", "x": ' + "[" * 400_000 + "]" * 400_000 + "}")
    analyze(world, clip, "nested")
    with pytest.raises(CocosError, match="nested"):
        is_clip_folder(clip)
    shallow = copy_of(world[3], tmp_path / "shallow")  # under the parser's limit, over cocos's
    edit_config(shallow, lambda c: c.update(x=json.loads("[" * 200 + "]" * 200)))
    analyze(world, shallow, "nested more than 64 deep")
    bert = Path(shutil.copytree(world[4], tmp_path / "bert"))
    (bert / "tokenizer.json").write_text('{"a": ' + "[" * 400_000 + "]" * 400_000 + "}")
    train(world, bert, "nested")


def test_a_huge_vocab_json_is_refused_before_it_is_parsed(world, tmp_path):
    clip = copy_of(world[3], tmp_path / "clip")
    (clip / "tokenizer.json").unlink()
    (clip / "merges.txt").write_text("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    tokens = [c for ch in LETTERS for c in (ch, ch + "</w>")] + [a + b for a, b in (m.split() for m in MERGES)]
    tokens += [f"t{i}" for i in range(200_000)] + ["<|startoftext|>", "<|endoftext|>"]
    (clip / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    analyze(world, clip, "vocab.json", "too large")


BOMBS = {  # name -> (family, what to change in config.json, the line's words)
    "clip hidden 1e9": ("clip", {"text_config": {"hidden_size": 10**9}}, "needs at least"),
    "clip 1e6 layers": ("clip", {"vision_config": {"num_hidden_layers": 10**6}}, "vision_config.num_hidden_layers"),
    "clip vocab 1e7": ("clip", {"text_config": {"vocab_size": 10**7}}, "text_config.vocab_size"),
    "bert 1e6 layers of width 4": ("bert", {"hidden_size": 4, "num_attention_heads": 1, "intermediate_size": 4,
                                            "num_hidden_layers": 10**6}, "num_hidden_layers"),
    "bert hidden 1e6": ("bert", {"hidden_size": 10**6, "num_attention_heads": 1}, "needs at least"),
}
BOMB_SCRIPT = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from typer.testing import CliRunner
from cocos_cli.main import app
out = {}
for name, args in json.loads(sys.argv[1]).items():
    start = time.perf_counter()
    result = CliRunner().invoke(app, args)
    out[name] = [result.exit_code, result.stderr, time.perf_counter() - start]
print(json.dumps(out))
"""


def test_memory_bombs_are_refused_before_allocation(world, tmp_path):
    """Each under a 3 GB address-space limit (torch itself takes about 1 GB of it), in one process: refused in one
    line, with nothing allocated (an allocation of the model would pass the limit: MemoryError, not the line)."""
    images, regions = world[1], world[2]
    runs = {}
    for i, (name, (family, change, _)) in enumerate(BOMBS.items()):
        folder = copy_of(world[3] if family == "clip" else world[4], tmp_path / f"bomb{i}")

        def merge(config, change=change):
            for key, value in change.items():
                config[key].update(value) if isinstance(value, dict) else config.update({key: value})

        edit_config(folder, merge)
        out = str(tmp_path / f"out{i}")
        runs[name] = (["analyze", str(folder), "--data", str(images), "--out", out, "--no-progress"] if family == "clip"
                      else ["train", "--data", str(regions), "--model", "vse_infty", "--bert", str(folder), "--out",
                            out, "--epochs", "1", "--no-progress", "--device", "cpu"])
    proc = preloaded.run([sys.executable, "-c", BOMB_SCRIPT, json.dumps(runs)], capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for i, (name, (_, _, words)) in enumerate(BOMBS.items()):
        code, stderr, seconds = results[name]
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (name, stderr)
        assert not (tmp_path / f"out{i}").exists(), (name, seconds)


# -- item 4: vse_infty's opt nested 5,000 deep -------------------------------------------------------------------


def test_a_deeply_nested_opt_is_one_line(world, tmp_path):
    regions, bert = world[2], world[4]
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    raw = {"epoch": 1, "model": [{"fc.weight": torch.zeros(8, 8)}, {"bert.embeddings.word_embeddings.weight":
                                                                    torch.zeros(3, 16)}],
           "best_rsum": 0.0, "opt": {"precomp_enc_type": "basic", "no_imgnorm": deep}, "Eiters": 1}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(30_000)
    try:
        torch.save(raw, tmp_path / "model_best.pth")
    finally:
        sys.setrecursionlimit(limit)
    common = ["--bert", bert, "--data", regions]
    refused(["import", tmp_path / "model_best.pth", *common, "--out", tmp_path / "x.pt"], tmp_path / "x.pt",
            "opt.no_imgnorm is nested more than")
    refused(["analyze", tmp_path / "model_best.pth", *common, "--out", tmp_path / "rep", "--no-progress"],
            tmp_path / "rep", "opt.no_imgnorm is nested more than")


# -- 8a: VSE∞'s augmentation draws a random piece for each piece ---------------------------------------------------


def test_a_replaced_word_gets_an_independent_random_piece_per_piece(monkeypatch):
    """The reference (``process_caption`` in tests/reference_vse_infty.py) draws ``rng.choice(vocab)`` for each
    sub-token of a replaced word: a four-piece word replaced becomes four pieces, drawn independently (all four
    equal has probability 1e-9 in a vocabulary of 1,000)."""
    coder = WordPieceCoder(SPECIAL + ["un", "##bel", "##iev", "##able"] + [f"w{i}" for i in range(995)])
    coded = coder.encode("unbelievable")
    assert coded.words == (4,)
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda n, generator=None: torch.full((n,), 0.11))  # 0.55: replaced
    seen = set()
    for seed in range(5):
        out = coder.augment(coded, torch.Generator().manual_seed(seed))
        assert len(out) == 6 and out[0] == coder.cls_id and out[-1] == coder.sep_id
        assert len(set(out[1:-1])) > 1, out
        seen.update(out[1:-1])
    assert len(seen) > 10 and real_rand is not torch.rand


def test_fine_tuning_a_clip_checks_the_memory_of_training_not_of_analysis(world, monkeypatch):
    """A CLIP whose weights fit twice in memory but not four times (weights, gradient, AdamW's two moments) is
    analysed by ``cocos analyze`` and refused by ``cocos train`` in one line, before anything is built."""
    import cocos.io
    from cocos.data.clip import TEXT_SIZES, VISION_SIZES, CLIPFolder, clip_parameters
    from cocos.hf import LAYER_BYTES

    clip = world[3]
    folder = CLIPFolder.read(clip)
    text = {**TEXT_SIZES, **folder.config["text_config"]}  # transformers' defaults where the config is silent
    vision = {**VISION_SIZES, **folder.config["vision_config"]}
    parameters = clip_parameters(text, vision, folder.config.get("projection_dim", 512))
    layers = text["num_hidden_layers"] + vision["num_hidden_layers"]
    monkeypatch.setattr(cocos.io, "available_memory", lambda: 4 * 3 * parameters + LAYER_BYTES * layers)
    assert CLIPFolder.read(clip).path == clip  # two copies fit
    out = clip.parent / "clip-run"
    refused(["train", "--model", "clip", "--clip", clip, "--data", world[1], "--out", out, "--epochs", 1,
             "--batch-size", 4, "--no-progress"], out, "to train", "more than")


def test_a_bert_saved_without_its_pooler_loads_with_the_pooler_zeroed(world, tmp_path):
    """A masked-LM BERT (``BertForMaskedLM.save_pretrained``: ``bert.*`` without ``bert.pooler.*``) reads as
    transformers' own encoder (VSE∞ reads the last hidden states, never the pooler), its pooler zeros; any other
    tensor missing is still refused."""
    bert = copy_of(world[4], tmp_path / "mlm")
    config = transformers.BertConfig.from_pretrained(str(bert), local_files_only=True)
    torch.manual_seed(1)
    mlm = transformers.BertForMaskedLM(config).eval()
    for name in ("model.safetensors", "pytorch_model.bin"):
        (bert / name).unlink(missing_ok=True)
    mlm.save_pretrained(str(bert))
    folder = BertFolder.read(bert)
    ours = load_bert_weights(bert_model(folder.config), bert).eval()
    assert all(float(p.abs().sum()) == 0 for n, p in ours.named_parameters() if n.startswith("pooler."))
    tok = transformers.BertTokenizer.from_pretrained(str(bert), local_files_only=True)
    batch = tok(["A man rides a red horses.", "Two squares"], padding=True, return_tensors="pt")
    with torch.no_grad():
        got = ours(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[0]
        want = mlm.bert(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[0]
    assert torch.allclose(got, want, atol=1e-5)
    key = "bert.encoder.layer.0.output.dense.weight"
    rewrite_weights(bert, lambda state: {k: v for k, v in state.items() if k != key})
    train(world, bert, "lack", "encoder.layer.0.output.dense.weight")
