"""COCOS of the global batch (issue 39): ``cocos.track.Tracker`` on two processes (Gloo on CPU) counts the batch the
loss sees — the global batch, or with ``batch="local"`` (open_clip's ``local_loss``) each rank's queries against
every rank's candidates — and its ``cocos_track.csv`` is the one one process writes for the same queries and
candidates.

One launch of two processes for the whole module (:func:`two`: each runs :func:`_worker`, every scenario in turn,
and writes what it saw to ``rank{r}.json``; rank 0 alone writes the tracking folders); the tests compare that with
one process, here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cocos.errors import CocosError
from cocos.track import Tracker
from cocos.training.track import FLOAT_FORMAT
from tests import preloaded

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
# the tests of the launch (marked slow: several processes, a few seconds, most of it two interpreters importing torch)
needs_dist = pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch build has no torch.distributed")


# --------------------------------------------------------------------------- the batches, alike in every process


def _pair_parts(seed: int, n: int, d: int = 6) -> list[dict]:
    """A pair batch of ``n`` images and captions (caption ``c`` of image ``c``) cut into the ranks' blocks (3 + 4
    rows for 7: unequal), with dataset ids that repeat across the ranks (same-image rows)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, d, generator=g)
    captions = images + 0.8 * torch.randn(n, d, generator=g)
    ids = torch.randint(0, max(2, n - 2), (n,), generator=g)
    cut = [n * r // WORLD for r in range(WORLD + 1)]
    return [{"images": images[a:b], "captions": captions[a:b], "caption_image": None, "image_ids": ids[a:b]}
            for a, b in zip(cut[:-1], cut[1:], strict=True)]


def _ranking_parts(seed: int, n: int, k: int, d: int = 6, shuffle: bool = True) -> list[dict]:
    """A ranking batch of ``n`` images, ``k`` captions each, cut by images; each rank's captions in an order of
    their own, ``caption_image`` the rows of the rank's own images (``shuffle=False``: ``c // k``, not given)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, d, generator=g)
    cut = [n * r // WORLD for r in range(WORLD + 1)]
    parts = []
    for a, b in zip(cut[:-1], cut[1:], strict=True):
        ci = torch.arange(b - a).repeat_interleave(k)
        if shuffle:
            ci = ci[torch.randperm(len(ci), generator=g)]
        captions = images[a:b][ci] + 0.9 * torch.randn(len(ci), d, generator=g)
        parts.append({"images": images[a:b], "captions": captions, "caption_image": ci if shuffle else None,
                      "image_ids": None})
    return parts


def _whole(parts: list[dict]) -> dict:
    """The global batch of the ranks' parts: concatenated in rank order, caption rows offset."""
    offsets = np.cumsum([0, *(len(p["images"]) for p in parts)])
    given = [p["caption_image"] is not None for p in parts]
    return {"images": torch.cat([p["images"] for p in parts]), "captions": torch.cat([p["captions"] for p in parts]),
            "caption_image": torch.cat([p["caption_image"] + int(o) for p, o in zip(parts, offsets, strict=False)])
            if any(given) else None,
            "image_ids": torch.cat([p["image_ids"] for p in parts]) if parts[0]["image_ids"] is not None else None}


# each scenario: tracker arguments, then one batch per step (None: not observed)
SCENARIOS = {
    # pair batches of 7 (3 + 4 rows), same-image rows across ranks, every 2 steps; step 5 is a short batch (skipped)
    "global_pair": ({"every": 2}, [_pair_parts(s, 7) for s in range(1, 5)] + [_pair_parts(9, 5)]),
    # ranking batches of 7 images (3 + 4), 3 captions each in shuffled order, every counter of the paper
    "global_ranking": ({"losses": "paper"}, [_ranking_parts(s, 7, 3) for s in range(11, 14)]),
    # open_clip's local_loss: pair batches of 4 + 4
    "local_pair": ({"batch": "local", "losses": "triplet,triplet_sh,ntxent"},
                   [_pair_parts(s, 8) for s in range(21, 24)]),
    # local_loss on ranking batches of 5 images (2 + 3), 2 captions each (c // k): SmoothAP and pair counters
    "local_ranking": ({"batch": "local", "losses": "triplet_sh,ntxent,smoothap"},
                      [_ranking_parts(s, 5, 2, shuffle=False) for s in range(31, 34)]),
}


class Sink:
    """A TensorBoard stand-in: the number of values it was given."""

    def __init__(self) -> None:
        self.calls = 0

    def add_scalar(self, tag, value, step) -> None:
        self.calls += 1


# --------------------------------------------------------------------------- the two processes


def _attempt(fn) -> str | None:
    """``fn()``'s CocosError line, None if it returned."""
    try:
        fn()
    except CocosError as exc:
        return str(exc)
    return None


def _worker(rank: int, store: str, out: str) -> None:
    """Every scenario on this rank (its part of each batch), then the refusals; what it saw to rank{rank}.json."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    out = Path(out)
    early = Tracker(None, losses="triplet_sh")  # made before the group: counts one process's batch
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    seen: dict = {"scenarios": {}, "errors": {}}
    seen["errors"]["made_before_the_group"] = _attempt(
        lambda: early.observe(1, torch.randn(3, 4), torch.randn(3, 4)))
    for name, (kw, steps) in SCENARIOS.items():
        sink = Sink()
        with Tracker(out / name, tensorboard=sink, **kw) as t:
            counted = [t.observe(step, p[rank]["images"], p[rank]["captions"], p[rank]["caption_image"],
                                 image_ids=p[rank]["image_ids"], epoch=1 + step // 3)
                       for step, p in enumerate(steps, start=1)]
        seen["scenarios"][name] = {"counted": counted, "skipped": t.skipped, "rows": len(t.rows),
                                   "values": [r[-1] for r in t.rows], "sink": sink.calls, "shape": t.shape}
    errors = seen["errors"]
    errors["folder"] = _attempt(lambda: Tracker(out / "global_pair"))  # holds a track already: rank 0 refuses
    t = Tracker(None, losses="triplet_sh,ntxent")
    parts = _pair_parts(41, 6)
    mine = parts[rank]
    images = mine["images"][:, :5] if rank == 1 else mine["images"]  # rank 1's widths differ
    errors["width"] = _attempt(lambda: t.observe(1, images, mine["captions"]))
    nan = mine["images"].clone()
    nan[0, 0] = float("nan") if rank == 0 else nan[0, 0]
    errors["nan"] = _attempt(lambda: t.observe(1, nan, mine["captions"]))
    errors["ids_on_one_rank"] = _attempt(
        lambda: t.observe(1, mine["images"], mine["captions"], image_ids=mine["image_ids"] if rank == 0 else None))
    # a refused observation leaves the tracker as it was: step 1 counted now
    seen["after_refusals"] = {"counted": t.observe(1, mine["images"], mine["captions"]), "rows": len(t.rows),
                              "values": [r[-1] for r in t.rows]}
    # batch="given": no collective; rank 0 alone observes (rank 1 would wait forever in a collective)
    given = Tracker(None, losses="triplet_sh,ntxent", batch="given")
    if rank == 0:
        given.observe(1, mine["images"], mine["captions"])
    seen["given"] = {"rows": len(given.rows), "values": [r[-1] for r in given.rows], "collective": given.collective}
    trained = Tracker.for_training(1, "triplet_sh", {}, "pair")
    seen["for_training"] = {"batch": trained.batch, "collective": trained.collective}
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


LAUNCH = """
import sys
sys.path.insert(0, sys.argv[1])
from tests.test_track_global import _worker
_worker(int(sys.argv[2]), sys.argv[3], sys.argv[4])
"""


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The one launch of two processes: the folder they wrote, and what each rank saw."""
    root = tmp_path_factory.mktemp("global")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [preloaded.Popen([sys.executable, "-c", textwrap.dedent(LAUNCH), str(ROOT), str(rank),
                              str(root / "store"), str(root)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(WORLD)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=120))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outputs]
    return root, [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]


def _one_process(folder: Path, name: str) -> Tracker:
    """The scenario in this process, observing the global batches."""
    kw, steps = SCENARIOS[name]
    with Tracker(folder, **kw) as t:
        for step, parts in enumerate(steps, start=1):
            w = _whole(parts)
            t.observe(step, w["images"], w["captions"], w["caption_image"], image_ids=w["image_ids"],
                      epoch=1 + step // 3)
    return t


def _meta(folder: Path) -> dict:
    meta = json.loads((folder / "cocos_track.json").read_text())
    return {k: v for k, v in meta.items() if k not in ("counted", "ranks")}


@pytest.mark.slow
@needs_dist
@pytest.mark.parametrize("name", ["global_pair", "global_ranking"])
def test_the_global_batch_on_two_processes_is_the_csv_of_one(two, tmp_path, name):
    root, seen = two
    one = _one_process(tmp_path / name, name)
    # the CSV rank 0 wrote is the one one process writes for the concatenated batches, byte for byte
    assert (root / name / "cocos_track.csv").read_bytes() == (tmp_path / name / "cocos_track.csv").read_bytes()
    assert _meta(root / name) == _meta(tmp_path / name)
    meta = json.loads((root / name / "cocos_track.json").read_text())
    assert (meta["counted"], meta["ranks"]) == ("global", 2)
    assert json.loads((tmp_path / name / "cocos_track.json").read_text())["ranks"] == 1
    # every rank holds the same rows, the same skip count and the global shape; rank 0 alone logs
    a, b = seen[0]["scenarios"][name], seen[1]["scenarios"][name]
    assert a["values"] == b["values"] and a["counted"] == b["counted"] and a["skipped"] == b["skipped"] == one.skipped
    assert tuple(a["shape"]) == tuple(b["shape"]) == one.shape
    assert a["sink"] == a["rows"] == len(one.rows) and b["sink"] == 0
    assert not (root / name / "rank1").exists()


@pytest.mark.slow
@needs_dist
def test_the_short_last_batch_is_skipped_on_every_rank_alike(two):
    _, seen = two
    for rank in range(WORLD):
        s = seen[rank]["scenarios"]["global_pair"]
        assert s["counted"] == [True, False, True, False, False] and s["skipped"] == 1  # step 5: 5 of 7 images
        assert s["shape"] == [7, 7]


def _local_reference(name: str) -> list[float]:
    """Each half's queries against all candidates, counted in this process from the counting primitives: each
    counter's per-query values of the two halves, reduced together (the rows of the scenario's CSV, in order)."""
    from cocos.counting import get_counter
    from cocos.counting.engine import counter_settings, resolve_losses
    from cocos.data.layout import QueryView, batch_similarity

    kw, steps = SCENARIOS[name]
    objectives = resolve_losses(kw["losses"])
    settings = counter_settings(objectives, {}, None)
    values = []
    for parts in steps:
        w = _whole(parts)
        n_img = [len(p["images"]) for p in parts]
        n_cap = [len(p["captions"]) for p in parts]
        for objective in objectives:
            counter = get_counter(objective, **settings[objective.name])
            images, captions, ci, halves = w["images"], w["captions"], w["caption_image"], (n_img, n_cap)
            if objective.layout == "pair" and len(captions) != len(images):  # each image with its first caption
                k = len(captions) // len(images)
                captions, ci, halves = captions[::k], None, (n_img, n_img)
            scores, layout = batch_similarity(images, captions, ci, w["image_ids"])
            for direction, sizes in zip(("i2t", "t2i"), halves, strict=True):
                pos, neg = layout.masks(direction)
                oriented = scores if direction == "i2t" else scores.T
                per_query, lo = [], 0
                for size in sizes:  # one half's queries against every candidate
                    view = QueryView(scores=oriented[lo:lo + size], pos=pos[lo:lo + size], neg=neg[lo:lo + size],
                                     direction=direction, group_size=layout.group_size)
                    per_query.append(counter.count(view).per_query)
                    lo += size
                batch = counter.batch_of({k: torch.cat([q[k] for q in per_query]) for k in per_query[0]}, False)
                values.extend(float(batch[stat]) for stat in objective.stats)
    return values


@pytest.mark.slow
@needs_dist
@pytest.mark.parametrize("name", ["local_pair", "local_ranking"])
def test_local_loss_counts_each_ranks_queries_against_all_candidates(two, tmp_path, name):
    root, seen = two
    track = pd.read_csv(root / name / "cocos_track.csv")
    reference = _local_reference(name)
    np.testing.assert_array_equal(seen[0]["scenarios"][name]["values"], reference)  # bit for bit
    np.testing.assert_array_equal(track["value"], [float(FLOAT_FORMAT % v) for v in reference])  # as written
    assert json.loads((root / name / "cocos_track.json").read_text())["counted"] == "local"
    assert seen[0]["scenarios"][name]["values"] == seen[1]["scenarios"][name]["values"]
    # the counters count rows: each query's values are the global batch's, and so are their means
    one = _one_process(tmp_path / name, name)
    np.testing.assert_allclose(track["value"], [r[-1] for r in one.rows], rtol=1e-6, atol=0)
    assert (track["step"].tolist(), track["stat"].tolist()) == ([r[0] for r in one.rows], [r[4] for r in one.rows])


@pytest.mark.slow
@needs_dist
def test_a_refused_part_is_one_line_on_every_rank(two):
    _, seen = two
    for key, words in (("folder", "holds cocos_track.csv"), ("width", "rank 1"), ("nan", "NaN"),
                       ("ids_on_one_rank", "image_ids given on rank(s) 0 only"),
                       ("made_before_the_group", "before torch.distributed.init_process_group")):
        lines = [seen[rank]["errors"][key] for rank in range(WORLD)]
        assert lines[0] is not None and words in lines[0] and "\n" not in lines[0], (key, lines)
        if key != "folder":
            assert lines[0] == lines[1], key
        else:
            assert lines[1] == f"{lines[0]} (rank 0 could not open the tracker)"
    after = [seen[rank]["after_refusals"] for rank in range(WORLD)]
    assert after[0]["counted"] and after[0] == after[1] and after[0]["rows"] > 0


@pytest.mark.slow
@needs_dist
def test_refusals_leave_the_tracker_counting_the_whole_batch(two):
    _, seen = two
    whole = _whole(_pair_parts(41, 6))
    one = Tracker(None, losses="triplet_sh,ntxent")
    one.observe(1, whole["images"], whole["captions"])
    assert seen[0]["after_refusals"]["values"] == [r[-1] for r in one.rows]


@pytest.mark.slow
@needs_dist
def test_given_counts_the_batch_as_given_without_collectives(two):
    _, seen = two
    mine = _pair_parts(41, 6)[0]
    one = Tracker(None, losses="triplet_sh,ntxent")
    one.observe(1, mine["images"], mine["captions"])
    assert seen[0]["given"]["values"] == [r[-1] for r in one.rows] and not seen[0]["given"]["collective"]
    assert seen[1]["given"]["rows"] == 0  # rank 1 observed nothing and waited for no one
    # cocos train hands rank 0 the global batch it gathered for its loss: counted as given
    assert seen[0]["for_training"] == seen[1]["for_training"] == {"batch": "given", "collective": False}


# --------------------------------------------------------------------------- one process


def test_batch_option_is_checked_and_local_refuses_counters_that_couple_queries(tmp_path):
    with pytest.raises(CocosError, match="batch must be 'global'") as exc:
        Tracker(tmp_path / "a", batch="world")
    assert "\n" not in str(exc.value)
    with pytest.raises(CocosError, match=r"batch='local'.*triplet \(t2i in compat mode\)") as exc:
        Tracker(tmp_path / "b", losses="triplet", compat=True, batch="local")
    assert "\n" not in str(exc.value) and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(CocosError, match="imc"):
        Tracker(None, losses="imc", batch="local")


@pytest.mark.parametrize("batch", ["global", "local", "given"])
def test_in_one_process_every_batch_option_counts_the_batch_given(batch):
    w = _whole(_ranking_parts(51, 6, 3))
    default, chosen = Tracker(None), Tracker(None, batch=batch)
    for t in (default, chosen):
        t.observe(1, w["images"], w["captions"], w["caption_image"])
    assert not chosen.collective and default.batch == "global"
    np.testing.assert_allclose([r[-1] for r in chosen.rows], [r[-1] for r in default.rows], rtol=1e-6)
    assert chosen.meta()["counted"] == batch and chosen.meta()["ranks"] == 1
