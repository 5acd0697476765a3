"""The checks split into small helpers (issue 29) keep their behaviour: the same values and the same error line,
first failure first, for the embedding set, the counting arguments, the CSV image lists, vocabulary maps,
results contents, CNN state dicts, torchrun's environment, training logs and ``--param`` items. Every expected
line is written out by hand."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cli.common import parse_params
from cocos import distributed
from cocos.counting import EmbeddingSet, count_embeddings
from cocos.data.images import load_image_split
from cocos.data.text import tokens_from_maps
from cocos.embed.features import write_feature_cache
from cocos.errors import CocosError
from cocos.models.cnn import check_cnn_state
from cocos.results import Results
from cocos.training.logs import read_logs

ROOT = Path(__file__).resolve().parents[1]


def refused(message: str):
    """``pytest.raises`` for a CocosError whose whole line is ``message``."""
    return pytest.raises(CocosError, match=f"^{re.escape(message)}$")


# -- EmbeddingSet.from_arrays -------------------------------------------------------------------

@pytest.mark.parametrize(("images", "captions", "caption_image", "message"), [
    (torch.ones(2, 3, dtype=torch.complex64), np.ones((4, 3)), None,
     "images must hold real numbers, got dtype torch.complex64"),
    (np.ones((2, 3)), np.ones((4, 3), dtype=bool), None, "captions must hold real numbers, got dtype bool"),
    (torch.ones(2, 3, dtype=torch.bool), np.ones((4, 3)), None, "images must hold real numbers, got dtype torch.bool"),
    (np.zeros((0, 3)), np.ones((4, 3)), None, "images is empty (shape (0, 3))"),
    (np.ones((2, 3)), np.ones((4, 0)), None, "captions is empty (shape (4, 0))"),
    # the dtype and emptiness of both come before the shapes
    (np.ones((2, 2, 3)), np.ones((4, 3), dtype=complex), None, "captions must hold real numbers, got dtype complex128"),
    (np.ones((2, 2, 3)), np.ones((4, 3)), None, "expected images (N, d) and captions (M, d), got (2, 2, 3) and (4, 3)"),
    (np.ones((2, 3)), np.ones((5, 3)), None, "5 captions is not a multiple of 2 images; provide a caption_image array"),
    (np.ones((2, 3)), np.ones((4, 3)), [0.0, 0.0, 1.0, 1.0], "caption_image must be 4 integers, got (4,) of float64"),
    (np.ones((2, 3)), np.ones((4, 3)), [0, 1], "caption_image must be 4 integers, got (2,) of int64"),
    (np.ones((2, 3)), np.ones((4, 3)), [0, 1, 2, 1], "caption_image values must lie in [0, 2)"),
    (np.ones((2, 3)), np.ones((4, 3)), [0, -1, 1, 1], "caption_image values must lie in [0, 2)"),
    # the caption map comes before the dimensions
    (np.ones((2, 3)), np.ones((5, 4)), None, "5 captions is not a multiple of 2 images; provide a caption_image array"),
    (np.ones((2, 3)), np.ones((4, 4)), None, "images have dimension 3 but captions have 4"),
])
def test_embedding_set_refusals(images, captions, caption_image, message):
    with refused(message):
        EmbeddingSet.from_arrays(images, captions, caption_image)


def test_embedding_set_values_by_hand():
    images = [[3.0, 4.0], [0.0, 2.0]]  # a list: made an array
    captions = np.array([[1.0, 0.0], [0.0, -5.0], [6.0, 8.0], [1.0, 1.0], [2.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    emb = EmbeddingSet.from_arrays(images, captions)
    assert emb.caption_image.tolist() == [0, 0, 0, 1, 1, 1] and emb.caption_image.dtype == np.int64
    # float64 images with float32 captions: both float64
    assert emb.images.dtype == emb.captions.dtype == torch.float64
    assert emb.images.tolist() == [[0.6, 0.8], [0.0, 1.0]]
    assert torch.allclose(emb.captions[:3], torch.tensor([[1.0, 0.0], [0.0, -1.0], [0.6, 0.8]], dtype=torch.float64))
    given = EmbeddingSet.from_arrays(images, captions, caption_image=np.array([1, 0, 1, 0, 1, 1], dtype=np.int32))
    assert given.caption_image.tolist() == [1, 0, 1, 0, 1, 1] and given.caption_image.dtype == np.int64


# -- count_embeddings' arguments -----------------------------------------------------------------

@pytest.fixture(scope="module")
def small_set() -> EmbeddingSet:
    rng = np.random.default_rng(0)
    return EmbeddingSet.from_arrays(rng.standard_normal((8, 4)), rng.standard_normal((16, 4)))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"losses": ["triplet", "ntxent", "triplet"]}, "two losses share a name (triplet, ntxent, triplet); give each its "
                                                   "own name"),
    ({"modes": ["corrected", "bogus"]}, "unknown counting mode 'bogus' (use corrected, compat)"),
    ({"batch_size": True}, "batch size must be a positive integer, got True"),
    ({"batch_size": 2.0}, "batch size must be a positive integer, got 2.0"),
    ({"batch_size": 0}, "batch size must be a positive integer, got 0"),
    ({"params": {"ntxent": {"tau": 0.1}, "zeta": {}, "alpha": {}}},
     "parameters given for losses not counted: alpha, zeta"),
    # the names come before the modes, the modes before the batch size
    ({"losses": ["triplet", "triplet"], "modes": ["bogus"]}, "two losses share a name (triplet, triplet); give each "
                                                             "its own name"),
    ({"modes": ["bogus"], "batch_size": 0}, "unknown counting mode 'bogus' (use corrected, compat)"),
])
def test_count_arguments_are_refused_in_order(small_set, kwargs, message):
    with refused(message):
        count_embeddings(small_set, **{"losses": ["triplet", "ntxent"], "batch_size": 4, **kwargs})


def test_modes_are_counted_once_each_in_the_order_given(small_set):
    run = count_embeddings(small_set, ["triplet"], batch_size=4, modes=["compat", "corrected", "compat"])
    assert list(dict.fromkeys(run.batches["mode"])) == ["compat", "corrected"]
    # 16 captions in pair batches of 4: 4 batches per (direction, mode, statistic)
    assert run.n_batches == {"pair": 4}
    assert (run.batches.groupby(["direction", "mode", "stat"]).size() == 4).all()


# -- feature cache splits ----------------------------------------------------------------------

@pytest.mark.parametrize(("splits", "message"), [
    (["train", "nope"], "splits must be among train, dev (val), test; got train, nope"),
    ([], "splits must be among train, dev (val), test; got "),
])
def test_feature_cache_splits_are_refused_before_anything_is_read(tmp_path, splits, message):
    with refused(message):
        write_feature_cache(tmp_path / "no-such-data", tmp_path / "out", torch.nn.Identity(), cnn_type="resnet18",
                            splits=splits)
    assert list(tmp_path.iterdir()) == []


# -- CSV image lists ---------------------------------------------------------------------------

def _csv(tmp_path: Path, text: str, images=("a.jpg", "b.jpg")) -> Path:
    for name in images:
        (tmp_path / name).write_bytes(b"\xff\xd8")
    path = tmp_path / "train.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_rows_by_hand(tmp_path):
    path = _csv(tmp_path, "id,Caption , IMAGE\n1,a dog,a.jpg\n, ,\n2,  a cat ,b.jpg\n3,two dogs, a.jpg \n")
    split = load_image_split(path, "train")
    assert split.caption_image.tolist() == [0, 1, 0]
    assert split.names == [str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")]
    assert len(split.captions) == 3 and split.layout == "csv"


@pytest.mark.parametrize(("text", "detail"), [
    ("image,text\na.jpg,a dog\n", "needs a header row with columns image and caption, found image, text"),
    ("", "needs a header row with columns image and caption, found none"),
    ("image,caption\na.jpg,a dog\n\nb.jpg\n", "line 4 lacks an image or a caption"),
    ("image,caption\na.jpg,   \n", "line 2 lacks an image or a caption"),
    ("image,caption\n , a dog\n", "line 2 lacks an image or a caption"),
    ("image,caption\na.jpg,a\0dog\n", "line 2: the caption holds a NUL character (a binary or damaged file?)"),
    ("image,caption\n,\n", "the CSV file lists no images"),
    ("image,caption\nc.jpg,a dog\n", "1 of 1 image files are missing (the first: {root}/c.jpg)"),
])
def test_csv_refusals(tmp_path, text, detail):
    path = _csv(tmp_path, text)
    with refused(f"{path}: {detail.format(root=tmp_path)}"):
        load_image_split(path, "train")


# -- vocabulary maps ---------------------------------------------------------------------------

def test_tokens_from_both_maps_by_hand():
    assert tokens_from_maps("v", {"b": 1, "a": 0}, {"0": "a", 1: "b"}, 2) == ["a", "b"]
    assert tokens_from_maps("v", None, {"1": "y", "0": "x"}) == ["x", "y"]


@pytest.mark.parametrize(("word2idx", "idx2word", "idx", "detail"), [
    (None, None, None, "expected a vocabulary with 'word2idx' and 'idx2word' maps"),
    ({"a": "x"}, {}, None, "'word2idx' holds a non-integer id 'x'"),
    ({"a": True}, {}, None, "'word2idx' holds a non-integer id True"),
    ({"": 0}, {}, None, "'word2idx' holds a word that is not a non-empty string: ''"),
    ({}, {"0": 7}, None, "'idx2word' holds a word that is not a non-empty string: 7"),
    ({"a": 0}, {"0": "b"}, None, "id 0 is given to both 'a' and 'b'"),
    # word2idx is read before idx2word: its fault is the one named
    ({"a": "x"}, {"0": ""}, None, "'word2idx' holds a non-integer id 'x'"),
    ({"a": 0, "b": 2}, {}, None, "vocabulary ids are not 0..1 without gaps"),
    ({"a": 0, "b": 1}, {}, 3, "'idx' says 3 words but the maps hold 2"),
    ({"a": 0, "b": 1}, {}, True, "'idx' says True words but the maps hold 2"),
    ({"a": 0}, {"1": "b", "2": "a", "3": "b"}, None, "vocabulary word 'a' has two ids (0, 2)"),
])
def test_tokens_refusals(word2idx, idx2word, idx, detail):
    with refused(f"v: {detail}"):
        tokens_from_maps("v", word2idx, idx2word, idx)


# -- results contents ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results_v3() -> dict:
    return json.loads((ROOT / "tests" / "fixtures" / "results_v3" / "ntxent" / "results.json").read_text())


def _changed(data: dict, *edits) -> dict:
    data = copy.deepcopy(data)
    for keys, value in edits:
        node = data
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return data


@pytest.mark.parametrize(("edits", "detail"), [
    ([(("source", "kind"), "train")], "source.kind must be one of analyze, count"),
    ([(("counting", "losses"), ["ntxent", 3])], "counting.losses must be names"),
    ([(("counting", "params"), {"ntxent": 0.1})], "counting.params.ntxent must map names to numbers"),
    ([(("counting", "params"), {"a\nb": {"tau": [1]}})], "counting.params.'a\\nb' must map names to numbers"),
    ([(("counting", "params"), {"ntxent": {"eps": "0.01"}})], "counting.params.ntxent.eps must be a number"),
    ([(("counting", "params"), {"ntxent": {"eps": True}})], "counting.params.ntxent.eps must be a number"),
    ([(("counting", "n_batches"), {"pair": "39"})], "counting.n_batches must hold numbers"),
    ([(("counting", "labels"), {"ntxent": 1})], "counting.labels must hold text"),
    ([(("evaluation", "metrics", "rsum"), "high")], "evaluation.metrics must hold numbers"),
    # first failure first
    ([(("evaluation", "metrics", "rsum"), "high"), (("counting", "labels"), {"a": 1})],
     "counting.labels must hold text"),
    ([(("counting", "n_batches"), {"pair": None}), (("counting", "params"), {"ntxent": {"eps": "x"}})],
     "counting.params.ntxent.eps must be a number"),
    ([(("counting", "losses"), [None]), (("source", "kind"), "x")], "source.kind must be one of analyze, count"),
])
def test_results_contents_refusals(results_v3, edits, detail):
    with refused(f"not a cocos results file ({detail})"):
        Results.from_dict(_changed(results_v3, *edits))


def test_results_without_evaluation_pass_the_metrics_check(results_v3):
    r = Results.from_dict(_changed(results_v3, (("evaluation",), None), (("source", "kind"), "count")))
    assert r.evaluation is None and r.source.kind == "count"


# -- CNN state dicts -----------------------------------------------------------------------------

EXPECTED = {"conv.weight": (2, 3), "conv.bias": (2,)}


@pytest.mark.parametrize(("state", "detail"), [
    ({"conv.weight": torch.zeros(2, 3), "conv.bias": [0, 0]}, "'conv.bias' is not a tensor; expected a state dict "
                                                                "of the toy"),
    ({"conv.weight": torch.zeros(2, 3)}, "the toy weights lack conv.bias (1 of 2 tensors missing)"),
    ({}, "the toy weights lack conv.weight (2 of 2 tensors missing)"),
    # a missing tensor is named before an unexpected one
    ({"conv.weight": torch.zeros(2, 3), "fc": torch.zeros(1)}, "the toy weights lack conv.bias (1 of 2 tensors "
                                                                "missing)"),
    ({"conv.weight": torch.zeros(2, 3), "conv.bias": torch.zeros(2), "fc": torch.zeros(1), "fc2": torch.zeros(1)},
     "holds fc, which the toy does not have (2 unexpected)"),
    ({"conv.weight": torch.zeros(3, 2), "conv.bias": torch.zeros(3)}, "conv.weight has shape (3, 2), the toy needs "
                                                                      "(2, 3)"),
])
def test_cnn_state_refusals(state, detail):
    with refused(f"w.pth: {detail}"):
        check_cnn_state(state, EXPECTED, "w.pth", "toy")


def test_cnn_state_of_another_architecture_is_named():
    from cocos.models.cnn import build_cnn

    state = build_cnn("resnet18").state_dict()
    check_cnn_state(state, {k: tuple(v.shape) for k, v in state.items()}, "w.pth", "resnet18")  # its own: passes
    with refused("w.pth: holds resnet18 weights, not resnet34 ones"):
        check_cnn_state(state, {k: tuple(v.shape) for k, v in build_cnn("resnet34").state_dict().items()}, "w.pth",
                        "resnet34")


# -- torchrun's environment ------------------------------------------------------------------

def test_torchrun_environment_is_checked(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.from_env() is distributed.SINGLE
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.from_env() is distributed.SINGLE
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with refused("RANK='2' does not fit WORLD_SIZE=2 (start with torchrun)"):
        distributed.from_env()
    monkeypatch.delenv("RANK")
    with refused("RANK=None does not fit WORLD_SIZE=2 (start with torchrun)"):
        distributed.from_env()


def test_a_local_rank_beyond_the_gpus_is_refused_before_joining(monkeypatch):
    joined = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: joined.append(kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with refused("LOCAL_RANK 3 but this node has 2 GPU(s); start at most one process per GPU (--nproc_per_node), "
                 "or run on the CPU with CUDA_VISIBLE_DEVICES=''"):
        distributed.from_env()
    assert joined == []


# -- training logs ---------------------------------------------------------------------------

GOOD_LOG = "step,epoch,loss,L_con\n1,1,0.5,0.5\n2,1,0.4,0.4\n3,2,0.3,0.3\n"


def test_a_good_log_is_read_and_cut_at_an_epoch(tmp_path):
    (tmp_path / "train_log.csv").write_text(GOOD_LOG)
    logs = read_logs(tmp_path, max_epoch=1)
    assert logs.steps["step"].tolist() == [1, 2] and logs.steps["loss"].tolist() == [0.5, 0.4]
    assert logs.track is None


@pytest.mark.parametrize(("text", "detail"), [
    (GOOD_LOG[:-1], "its last line is cut (a damaged file?)"),
    ("step,epoch,loss\n1,1,0.5\n", "lacks the column(s) L_con"),
    ("step,loss\n1,0.5\n", "lacks the column(s) epoch, L_con"),
    ("step,epoch,loss,L_con\n0,1,0.5,0.5\n", "column step must hold positive integers in every row (a damaged or cut "
                                             "file?)"),
    ("step,epoch,loss,L_con\n1,1.5,0.5,0.5\n", "column epoch must hold positive integers in every row (a damaged or "
                                               "cut file?)"),
    # the step and epoch columns come before the numbers
    ("step,epoch,loss,L_con\n1,x,abc,0.5\n", "column epoch must hold positive integers in every row (a damaged or "
                                             "cut file?)"),
    ("step,epoch,loss,L_con\n1,1,abc,0.5\n", "column loss must hold numbers (a damaged file?)"),
    ("step,epoch,loss,L_con\n1,1,0.5,0.5\n2,1,0.4,\n", "line 3 has no value in column L_con (a cut or damaged "
                                                       "file?)"),
    ("step,epoch,loss,L_con\n1,1,0.5,0.5\n1,1,0.4,0.4\n", "a step appears twice"),
    ("step,epoch,loss,L_con\n2,1,0.5,0.5\n1,1,0.4,0.4\n", "steps and epochs must not decrease from row to row "
                                                          "(foreign rows?)"),
    ("step,epoch,loss,L_con\n1,2,0.5,0.5\n2,1,0.4,0.4\n", "steps and epochs must not decrease from row to row "
                                                          "(foreign rows?)"),
])
def test_log_refusals(tmp_path, text, detail):
    (tmp_path / "train_log.csv").write_text(text)
    with refused(f"{tmp_path / 'train_log.csv'}: {detail}"):
        read_logs(tmp_path)


def test_the_track_may_repeat_steps_and_leave_values_empty(tmp_path):
    (tmp_path / "cocos_track.csv").write_text("step,epoch,loss,direction,stat,value\n1,1,triplet,i2t,C_q,\n"
                                              "1,1,triplet,t2i,C_q,0.25\n")
    track = read_logs(tmp_path).track
    assert track["step"].tolist() == [1, 1] and np.isnan(track["value"][0]) and track["value"][1] == 0.25
    (tmp_path / "cocos_track.csv").write_text("step,epoch,loss,direction,stat,value\n1,1,triplet,,C_q,0.5\n")
    with refused(f"{tmp_path / 'cocos_track.csv'}: line 2 has no value in column direction (a cut or damaged file?)"):
        read_logs(tmp_path)


# -- --param items ---------------------------------------------------------------------------

def test_params_by_hand():
    assert parse_params(["margin=0.3", "ntxent.tau=0.05"], ["triplet", "triplet_sh", "ntxent"]) == {
        "triplet": {"margin": 0.3}, "triplet_sh": {"margin": 0.3}, "ntxent": {"tau": 0.05}}
    # names and switches stay text (the spec types them); numbers are floats; the value is stripped
    assert parse_params(["goal.triplet_weight= sim ", "offset=true", " margin =1"], ["goal"]) == {
        "goal": {"triplet_weight": "sim", "offset": "true", "margin": 1.0}}
    assert parse_params([], ["triplet"]) == {}


@pytest.mark.parametrize(("items", "message"), [
    (["margin"], "--param wants NAME=VALUE or LOSS.NAME=VALUE, got 'margin'"),
    (["=1"], "--param wants NAME=VALUE or LOSS.NAME=VALUE, got '=1'"),
    (["margin= "], "--param wants NAME=VALUE or LOSS.NAME=VALUE, got 'margin= '"),
    (["smoothap.tau=1"], "--param smoothap.tau: 'smoothap' is not among the counted losses (triplet, ntxent)"),
    (["triplet.tau=1"], "--param triplet.tau: no counted loss takes 'tau' (triplet: margin; ntxent: tau)"),
    (["lam=1"], "--param lam: no counted loss takes 'lam' (triplet: margin; ntxent: tau)"),
    (["tau=0.1", "ntxent.tau=0.2"], "--param ntxent.tau: ntxent.tau is given twice"),
    (["margin=big"], "--param margin: 'big' is not a number"),
    ([" margin =big"], "--param  margin : 'big' is not a number"),
])
def test_param_refusals(items, message):
    with refused(message):
        parse_params(items, ["triplet", "ntxent"])
