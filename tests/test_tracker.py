"""cocos.track.Tracker: COCOS in anyone's training loop (docs/tracking.md, run verbatim), no effect on training,
the batch rules, the TensorBoard sink and one-line errors."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cocos.counting import count_batch
from cocos.errors import CocosError
from cocos.track import COLUMNS, Tracker, tensorboard_tag
from cocos.training.logs import read_logs
from cocos_cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tracking.md"


def _first_python_block(path: Path) -> str:
    match = re.search(r"^```python\n(.*?)^```$", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    assert match, f"{path}: no python block"
    return match[1]


def _by_key(frame: pd.DataFrame) -> dict:
    return {(s, lo, d, st): v for s, lo, d, st, v in
            zip(frame["step"], frame["loss"], frame["direction"], frame["stat"], frame["value"], strict=True)}


@pytest.fixture(scope="module")
def docs_run(tmp_path_factory):
    """The page's loop, run as printed, with the embeddings of every counted step kept aside."""
    folder = tmp_path_factory.mktemp("docs")
    seen: dict[int, tuple] = {}
    original = Tracker.observe

    def spy(self, step, image_emb, caption_emb, caption_image=None, epoch=None, image_ids=None):
        counted = original(self, step, image_emb, caption_emb, caption_image, epoch, image_ids)
        if counted:
            seen[step] = (image_emb.detach().clone(), caption_emb.detach().clone(), epoch)
        return counted

    mp = pytest.MonkeyPatch()
    mp.chdir(folder)
    mp.setattr(Tracker, "observe", spy)
    try:
        exec(compile(_first_python_block(PAGE), str(PAGE), "exec"), {"__name__": "__docs__"})
    finally:
        mp.undo()
    return folder, seen


def test_docs_loop_writes_the_counts_of_its_own_batches(docs_run):
    folder, seen = docs_run
    run = folder / "runs" / "mine"
    track = pd.read_csv(run / "cocos_track.csv")
    assert list(track.columns) == COLUMNS
    # 512 pairs in batches of 64: 8 steps per epoch, 3 epochs; every 5 steps from step 1
    assert sorted(seen) == sorted(set(track["step"])) == [1, 6, 11, 16, 21]
    assert dict(zip(track["step"], track["epoch"], strict=True)) == {1: 1, 6: 1, 11: 2, 16: 2, 21: 3}
    # pair batches: the paper's counters but SmoothAP, each with its family's statistics, both directions
    assert list(dict.fromkeys(track["loss"])) == ["triplet", "triplet_sh", "ntxent"]
    assert len(track) == 5 * 2 * (3 + 3 + 4)
    got = _by_key(track)
    for step, (img, cap, _) in seen.items():  # an independent count of the same embeddings
        for loss in ("triplet", "triplet_sh", "ntxent"):
            expected = count_batch(img, cap, loss)
            for direction, stats in expected.items():
                for stat in {"triplet": ("C_q", "C_B", "C_0"), "triplet_sh": ("C_q", "C_B", "C_0"),
                             "ntxent": ("C_qv-", "W_qv-", "W_qv+", "W_low")}[loss]:
                    assert got[(step, loss, direction, stat)] == pytest.approx(stats[stat], rel=1e-9, abs=1e-12)
    assert read_logs(run).track is not None  # the readers of cocos train's logs accept it


def test_docs_loop_renders_with_cocos_report(docs_run):
    folder, _ = docs_run
    out = folder / "reports" / "mine"
    res = CliRunner().invoke(app, ["report", str(folder / "runs" / "mine"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 tracked runs" in res.output
    assert (out / "cocos_track.png").stat().st_size > 0


def test_docs_loop_sends_the_same_values_to_tensorboard(docs_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, _ = docs_run
    run = folder / "runs" / "mine"
    assert list(run.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(run))
    acc.Reload()
    track = pd.read_csv(run / "cocos_track.csv")
    tags = {tensorboard_tag(lo, d, st) for lo, d, st in zip(track["loss"], track["direction"], track["stat"],
                                                             strict=True)}
    assert set(acc.Tags()["scalars"]) == tags
    assert "cocos/ntxent/i2t/C_qv_neg" in tags and "cocos/ntxent/t2i/W_qv_pos" in tags
    for (step, loss, direction, stat), value in _by_key(track).items():
        events = {e.step: e.value for e in acc.Scalars(tensorboard_tag(loss, direction, stat))}
        assert events[step] == pytest.approx(value, rel=1e-6)  # TensorBoard stores float32


# --------------------------------------------------------------------------- no effect on training


def _train(steps: int, tracker: Tracker | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(3)
    enc_i, enc_t = torch.nn.Linear(12, 8), torch.nn.Linear(10, 8)
    opt = torch.optim.SGD([*enc_i.parameters(), *enc_t.parameters()], lr=0.5)
    for step in range(1, steps + 1):
        x, t = torch.randn(16, 12), torch.randn(16, 10)
        img, cap = enc_i(x), enc_t(t)
        if tracker is not None:
            assert tracker.observe(step, img, cap, epoch=1)
            assert torch.is_grad_enabled() and img.requires_grad
        logits = torch.nn.functional.normalize(img, dim=-1) @ torch.nn.functional.normalize(cap, dim=-1).T
        loss = torch.nn.functional.cross_entropy(logits / 0.2, torch.arange(16))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in (*enc_i.parameters(), *enc_t.parameters())], torch.get_rng_state()


def test_observing_changes_nothing_in_the_callers_training(tmp_path):
    plain, plain_rng = _train(6, None)
    tracked, tracked_rng = _train(6, Tracker(tmp_path, every=1))
    assert all(torch.equal(a, b) for a, b in zip(plain, tracked, strict=True))
    assert torch.equal(plain_rng, tracked_rng)
    assert len(set(pd.read_csv(tmp_path / "cocos_track.csv")["step"])) == 6
    with torch.no_grad():  # the caller's grad mode is kept either way
        Tracker(every=1).observe(1, torch.randn(4, 3), torch.randn(4, 3))
        assert not torch.is_grad_enabled()


# --------------------------------------------------------------------------- batches


def test_a_ranking_batch_serves_all_four_and_the_pair_counters_see_first_captions():
    torch.manual_seed(0)
    images, captions = torch.randn(6, 8), torch.randn(30, 8)
    tracker = Tracker(every=1)
    assert tracker.observe(1, images, captions)
    frame = tracker.frame()
    assert list(dict.fromkeys(frame["loss"])) == ["triplet", "triplet_sh", "ntxent", "smoothap"]
    got = _by_key(frame)
    assert got[(1, "ntxent", "i2t", "C_qv-")] == pytest.approx(count_batch(images, captions[::5], "ntxent")["i2t"]
                                                               ["C_qv-"], rel=1e-9)
    assert got[(1, "smoothap", "t2i", "C_0")] == pytest.approx(count_batch(images, captions, "smoothap")["t2i"]
                                                               ["C_0"], rel=1e-9)
    # the same batch with its captions shuffled and caption_image given: the same counts
    perm = torch.randperm(30)
    shuffled = Tracker(every=1)
    shuffled.observe(1, images, captions[perm], caption_image=(torch.arange(30) // 5)[perm])
    for key, value in _by_key(shuffled.frame()).items():
        if key[1] != "smoothap":  # first captions differ after shuffling; pair counters hand-checked below
            continue
        assert value == pytest.approx(got[key], rel=1e-9, nan_ok=True), key
    first = [int(np.flatnonzero((torch.arange(30) // 5)[perm].numpy() == i)[0]) for i in range(6)]
    assert _by_key(shuffled.frame())[(1, "triplet", "i2t", "C_B")] == pytest.approx(
        count_batch(images, captions[perm][first], "triplet")["i2t"]["C_B"], rel=1e-9)


def test_only_batches_of_the_first_shape_are_counted_and_steps_once():
    torch.manual_seed(1)
    t = Tracker(every=2, losses="ntxent")
    assert t.observe(1, torch.randn(8, 4), torch.randn(8, 4), epoch=1)
    assert not t.observe(2, torch.randn(8, 4), torch.randn(8, 4))  # not due
    assert not t.observe(3, torch.randn(5, 4), torch.randn(5, 4))  # due, short: skipped
    assert not t.observe(4, torch.randn(5, 4), torch.randn(5, 4))  # not due: not a skip
    assert t.observe(5, torch.randn(8, 4), torch.randn(8, 4), epoch=2)
    assert not t.observe(5, torch.randn(8, 4), torch.randn(8, 4))  # a second micro-batch of step 5
    assert t.observe(7, torch.randn(8, 4), torch.randn(8, 4))  # epoch=None: the last one given
    assert t.skipped == 1
    frame = t.frame()
    assert sorted(set(frame["step"])) == [1, 5, 7]
    assert dict(zip(frame["step"], frame["epoch"], strict=True)) == {1: 1, 5: 2, 7: 2}
    sized = Tracker(every=1, batch_size=8, losses="triplet")
    assert not sized.observe(1, torch.randn(4, 4), torch.randn(4, 4)) and sized.skipped == 1
    assert sized.observe(2, torch.randn(8, 4), torch.randn(8, 4)) and sized.shape == (8, 8)


def test_named_losses_with_parameters_and_a_callable():
    torch.manual_seed(2)
    img, cap = torch.randn(10, 6), torch.randn(10, 6)

    def my_infonce(images, captions, caption_image=None):
        logits = images @ captions.T / 0.1
        return torch.nn.functional.cross_entropy(logits, torch.arange(len(images)))

    t = Tracker(every=1, losses=["triplet_sh,ntxent", my_infonce], params={"ntxent": {"tau": 0.05}}, compat=True)
    t.observe(1, img, cap)
    got = _by_key(t.frame())
    assert list(t.losses) == ["triplet_sh", "ntxent", "my_infonce"]
    want = count_batch(img, cap, "ntxent", tau=0.05, compat=True)
    assert got[(1, "ntxent", "t2i", "W_qv-")] == pytest.approx(want["t2i"]["W_qv-"], rel=1e-9)
    assert got[(1, "ntxent", "t2i", "W_qv-")] != pytest.approx(count_batch(img, cap, "ntxent")["t2i"]["W_qv-"])
    assert got[(1, "my_infonce", "i2t", "C_q")] == pytest.approx(count_batch(img, cap, my_infonce)["i2t"]["C_q"])


def test_a_sink_gets_every_value_with_its_tag(tmp_path):
    calls = []

    class Sink:
        def add_scalar(self, tag, value, global_step):
            calls.append((tag, value, global_step))

    t = Tracker(tmp_path, every=3, losses="ntxent", tensorboard=Sink())
    for step in range(1, 5):
        t.observe(step, torch.randn(6, 4), torch.randn(6, 4))
    t.close()
    frame = t.frame()
    assert [(c[0], c[2]) for c in calls] == [(tensorboard_tag(lo, d, st), s) for s, lo, d, st in
                                             zip(frame["step"], frame["loss"], frame["direction"], frame["stat"],
                                                 strict=True)]
    assert [c[1] for c in calls] == frame["value"].tolist()
    assert tensorboard_tag("ntxent", "i2t", "W_qv+") == "cocos/ntxent/i2t/W_qv_pos"
    assert tensorboard_tag("triplet", "t2i", "C_q") == "cocos/triplet/t2i/C_q"


def test_the_trainer_tracks_with_the_same_class():
    trained = Tracker.for_training(5, "triplet_sh", {"margin": 0.1}, "pair")
    assert type(trained) is Tracker and trained.layout == "pair"
    assert trained.losses == {"triplet": {"margin": 0.1}, "triplet_sh": {"margin": 0.1}, "ntxent": {}}
    source = (ROOT / "cocos" / "training" / "setup.py").read_text(encoding="utf-8")  # the run's hooks
    assert "Tracker.for_training(" in source and "CocosTracker(" not in source


# --------------------------------------------------------------------------- errors


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_bad_input_is_one_line(tmp_path, monkeypatch):
    t = Tracker(every=1)
    with pytest.raises(CocosError) as exc:
        t.observe(1, torch.randn(4, 3), torch.randn(4, 5))
    assert "same d" in _one_line(exc)
    with pytest.raises(CocosError) as exc:
        t.observe(1, torch.full((4, 3), math.nan), torch.randn(4, 3))
    assert "step 1" in _one_line(exc)
    with pytest.raises(CocosError) as exc:
        t.observe(0, torch.randn(4, 3), torch.randn(4, 3))
    assert "step" in _one_line(exc)
    t.observe(3, torch.randn(4, 3), torch.randn(4, 3))
    with pytest.raises(CocosError) as exc:
        t.observe(2, torch.randn(4, 3), torch.randn(4, 3))
    assert "must not decrease" in _one_line(exc)
    with pytest.raises(CocosError) as exc:
        Tracker(every=1, losses="smoothap").observe(1, torch.randn(4, 3), torch.randn(4, 3))
    assert "ranking batch" in _one_line(exc)
    for kwargs, words in (({"losses": "nosuch"}, "unknown loss"), ({"params": {"goal": {}}}, "not counted"),
                          ({"params": {"ntxent": {"tau": -1.0}}}, "tau"), ({"every": 0}, "every"),
                          ({"tensorboard": object()}, "add_scalar")):
        with pytest.raises(CocosError) as exc:
            Tracker(**kwargs)
        assert words in _one_line(exc)
    with Tracker(tmp_path / "x", tensorboard=True, every=1) as t, pytest.raises(CocosError) as exc:
        t.observe(1, torch.randn(4, 3), torch.randn(8, 3), caption_image=torch.tensor([0, 1, 2, 3, 0, 1, 2, 9]))
    assert "caption_image" in _one_line(exc)

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(CocosError) as exc:
        Tracker(tmp_path / "y", tensorboard=True)
    assert "pip install tensorboard" in _one_line(exc)


def test_a_refused_batch_fixes_nothing_and_a_held_folder_needs_overwrite(tmp_path):
    t = Tracker(every=1, losses="triplet")
    with pytest.raises(CocosError):
        t.observe(1, torch.full((4, 3), math.nan), torch.randn(4, 3))
    assert t.shape is None and not t.rows  # the refused batch fixed no shape
    assert t.observe(1, torch.randn(6, 3), torch.randn(6, 3)) is True and t.shape == (6, 6)
    with Tracker(tmp_path, every=1, losses="triplet") as first:
        first.observe(1, torch.randn(4, 3), torch.randn(4, 3))
    before = (tmp_path / "cocos_track.csv").read_bytes()
    with pytest.raises(CocosError) as exc:
        Tracker(tmp_path, every=1)
    assert "overwrite=True" in _one_line(exc)
    assert (tmp_path / "cocos_track.csv").read_bytes() == before  # nothing replaced
    with Tracker(tmp_path, every=1, losses="triplet", overwrite=True) as again:
        again.observe(1, torch.randn(5, 3), torch.randn(5, 3))
    assert (tmp_path / "cocos_track.csv").read_bytes() != before
