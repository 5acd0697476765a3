"""Fuzzed files against every reader of user input: one CocosError line or a valid result, nothing else.

Readers: embeddings ``.npz`` (``cocos count``), feature ``.npy`` and caption files of a data folder,
Karpathy JSON, ``results.json`` (``cocos report``), LTD targets ``.npy``, training logs (CSV).
Checkpoints and vocabularies have their own fuzz tests next to their hardening tests.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cocos.errors import CocosError
from cocos_cli.main import app

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
runner = CliRunner()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
dtypes = st.sampled_from(["f4", "f8", "f2", "i4", "u1", "?", "S3", "U2", "c8", "O"])


def _one_line(exc: CocosError) -> None:
    text = str(exc)
    assert text and "\n" not in text, text


def _expect(call):
    """Run a reader: a CocosError must be one line; anything but CocosError fails the test."""
    try:
        return call()
    except CocosError as exc:
        _one_line(exc)
        return None


def _array(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == "O":
        return np.array([object()] * int(np.prod(shape)), dtype=object).reshape(shape)
    if dtype in ("S3", "U2"):
        return np.full(shape, "ab", dtype=dtype)
    values = rng.normal(size=shape) * 3
    if dtype in ("f4", "f8", "f2") and values.size:
        values.flat[rng.integers(values.size)] = rng.choice([np.nan, np.inf, 0.0, 1e300])
    return values.astype(dtype)


def _npz_bytes(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


# --------------------------------------------------------------------------- embeddings .npz


@FUZZ
@given(
    names=st.lists(st.sampled_from(["images", "captions", "caption_image", "other"]), max_size=4, unique=True),
    dtype=dtypes,
    n=st.integers(0, 4), k=st.integers(0, 3), d=st.integers(0, 3), ndim=st.integers(1, 3), seed=st.integers(0, 9),
    cut=st.one_of(st.none(), st.integers(0, 400)),
)
@example(names=["images", "captions"], dtype="f4", n=2, k=2, d=3, ndim=2, seed=0, cut=None)  # NaN/inf values
@example(names=["images", "captions", "caption_image"], dtype="f8", n=3, k=1, d=2, ndim=2, seed=3, cut=None)
def test_embeddings_npz(tmp_path, names, dtype, n, k, d, ndim, seed, cut):
    from cocos.pipelines.count import read_embeddings

    rng = np.random.default_rng(seed)
    shapes = {"images": (n, d), "captions": (n * k, d), "caption_image": (n * k,), "other": (2,)}
    arrays = {}
    for name in names:
        shape = shapes[name][:ndim] if ndim < len(shapes[name]) else shapes[name] + (1,) * (ndim - len(shapes[name]))
        arrays[name] = _array(dtype if name != "caption_image" else rng.choice(["i8", dtype]), shape, rng)
    try:
        data = _npz_bytes(arrays)
    except ValueError:  # numpy itself refuses some object arrays without pickle
        return
    path = tmp_path / "e.npz"
    path.write_bytes(data[:cut] if cut is not None else data)
    emb = _expect(lambda: read_embeddings(path))
    if emb is not None:  # accepted: then it is a real, finite, consistent set
        assert emb.n_images >= 1 and emb.n_captions >= 1
        assert np.isfinite(np.asarray(emb.images)).all() and np.isfinite(np.asarray(emb.captions)).all()


@FUZZ
@given(data=st.binary(max_size=300))
def test_embeddings_random_bytes(tmp_path, data):
    from cocos.pipelines.count import read_embeddings

    path = tmp_path / "r.npz"
    path.write_bytes(data)
    assert _expect(lambda: read_embeddings(path)) is None


def test_npz_with_a_pickled_member_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    class Evil:
        def __reduce__(self):
            return (exec, ("open('PWNED', 'w').write('x')",))

    path = tmp_path / "evil.npz"
    with zipfile.ZipFile(path, "w") as zf:  # an .npy member holding a pickled object array
        buffer = io.BytesIO()
        np.save(buffer, np.array([Evil()], dtype=object), allow_pickle=True)
        zf.writestr("images.npy", buffer.getvalue())
        zf.writestr("captions.npy", buffer.getvalue())
    res = runner.invoke(app, ["count", str(path)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "PWNED").exists()


# --------------------------------------------------------------------------- data folders


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from cocos.data.synth import make_synthetic

    return make_synthetic(tmp_path_factory.mktemp("fz") / "d", n_train=6, n_dev=3, n_test=3, feature_dim=4, seed=0)


@FUZZ
@given(dtype=dtypes, shape=st.tuples(st.sampled_from([3, 3, 0, 1, 4]), st.lists(st.integers(0, 7), max_size=3))
       .map(lambda t: [t[0], *t[1]]) | st.lists(st.integers(0, 7), max_size=4), seed=st.integers(0, 9),
       damage=st.sampled_from(["none", "none", "none", "cut", "garbage"]), cut=st.integers(0, 200),
       garbage=st.binary(max_size=64))
@example(dtype="f4", shape=[3, 4], seed=1, damage="none", cut=0, garbage=b"")  # inf in a valid array
@example(dtype="f8", shape=[3, 2, 4], seed=2, damage="none", cut=0, garbage=b"")
def test_feature_npy(folder, tmp_path, dtype, shape, seed, damage, cut, garbage):
    import shutil

    from cocos.data.precomp import PrecompSplit

    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(folder, work)
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    try:
        np.save(buffer, _array(dtype, tuple(shape), rng), allow_pickle=dtype == "O")
    except ValueError:
        return
    data = garbage if damage == "garbage" else buffer.getvalue()
    (work / "test_ims.npy").write_bytes(data[:cut] if damage == "cut" else data)
    split = _expect(lambda: PrecompSplit(work, "test", k=5))
    if split is not None:
        assert split.n_captions == 5 * split.n_images
        assert np.isfinite(split.features_for(np.arange(split.n_images)).numpy()).all()


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(lambda t: t.encode("utf-8")))
def test_caption_file(folder, tmp_path, data):
    import shutil

    from cocos.data.precomp import PrecompSplit

    work = tmp_path / "c"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(folder, work)
    (work / "test_caps.txt").write_bytes(data)
    split = _expect(lambda: PrecompSplit(work, "test", k=5))
    if split is not None:
        assert len(split.captions) == 15 and all(isinstance(c, str) for c in split.captions)


@FUZZ
@given(doc=json_values)
def test_karpathy_json(tmp_path, doc):
    from cocos.data.precomp import read_karpathy_captions

    path = tmp_path / "dataset_x.json"
    path.write_text(json.dumps(doc))
    captions = _expect(lambda: read_karpathy_captions(path, "train", k=1))
    if captions is not None:
        assert captions and all(isinstance(c, str) for c in captions)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"images": [' + "1" * 5000 + "]}", "\ud800"])
def test_karpathy_json_that_breaks_the_parser(tmp_path, text):
    from cocos.data.precomp import read_karpathy_captions

    path = tmp_path / "dataset_x.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(CocosError) as info:
        read_karpathy_captions(path, "train")
    _one_line(info.value)


# --------------------------------------------------------------------------- results.json, targets, logs


@FUZZ
@given(doc=json_values, base=st.booleans(), key=st.sampled_from(["source", "data", "model", "counting", "stats",
                                                                "training", "evaluation", "format_version"]))
def test_results_json(tmp_path, doc, base, key):
    from cocos.results import Results

    good = json.loads((Path(__file__).parents[1] / "reports/example/triplet/results.json").read_text())
    data = {**good, key: doc} if base else doc
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    results = _expect(lambda: Results.read(path))
    if results is not None:  # accepted: its tables can be built
        from cocos.report.merge import build_tables, group_results

        groups, _ = group_results([results])
        build_tables(groups)


@pytest.mark.parametrize("text", ["[" * 100_000, '{"format_version": ' + "9" * 5000 + "}", "", "\x00\x01"])
def test_results_json_that_breaks_the_parser(tmp_path, text):
    path = tmp_path / "results.json"
    path.write_text(text)
    res = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "out")])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert not (tmp_path / "out").exists()


@FUZZ
@given(dtype=dtypes, shape=st.lists(st.integers(0, 6), max_size=3), seed=st.integers(0, 9))
def test_ltd_targets(tmp_path, dtype, shape, seed):
    from cocos.data.targets import read_targets

    path = tmp_path / "t.npy"
    buffer = io.BytesIO()
    try:
        np.save(buffer, _array(dtype, tuple(shape), np.random.default_rng(seed)), allow_pickle=dtype == "O")
    except ValueError:
        return
    path.write_bytes(buffer.getvalue())
    targets = _expect(lambda: read_targets(path, 6))
    if targets is not None:
        assert targets.shape[0] == 6 and np.isfinite(targets).all() and (np.abs(targets).sum(1) > 0).all()


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_training_logs(tmp_path, data):
    from cocos.training.logs import read_logs

    (tmp_path / "train_log.csv").write_bytes(data)
    (tmp_path / "cocos_track.csv").write_bytes(data)
    _expect(lambda: read_logs(tmp_path))
