"""cocos.track.Tracker at its edges (issue 37): one writer per folder (two real processes), rows appended not
rewritten, big batches counted in blocks of queries (the same values, bounded memory), every argument checked
before the folder exists, the kinds of folder it writes into, and a due batch of another caption count skipped."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

import cocos.counting.blocks as blocks_module
import cocos.training.track as track_module
from cocos.counting import count_batch
from cocos.errors import CocosError
from cocos.io import lock_path, mark_output, output_kind, write_csv
from cocos.track import Tracker
from cocos.training.logs import read_logs
from tests import preloaded

ROOT = Path(__file__).resolve().parents[1]


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def _python(code: str, real: bool = False, **kw) -> subprocess.Popen:
    """``python -c code``: forked from the tests' preloaded interpreter, or a real one (``real``: a test that reads
    the process's peak memory, which a fork starts at its server's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return (subprocess.Popen if real else preloaded.Popen)([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


# --------------------------------------------------------------------------- one writer per folder


HOLDER = """
    import sys, torch
    from cocos.track import Tracker
    torch.manual_seed(0)
    with Tracker(sys.argv[1] if len(sys.argv) > 1 else {folder!r}, every=1, losses="triplet_sh,ntxent") as t:
        for step in range(1, 4):
            t.observe(step, torch.randn(6, 4), torch.randn(6, 4))
        print("ready", flush=True)
        sys.stdin.readline()  # the other writer tries meanwhile
        for step in range(4, 7):
            t.observe(step, torch.randn(6, 4), torch.randn(6, 4))
    print("done", flush=True)
"""


def test_a_second_writer_is_refused_while_the_first_keeps_every_row(tmp_path):
    folder = tmp_path / "run"
    holder = _python(HOLDER.format(folder=str(folder)))
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        for overwrite in (False, True):  # in this process: refused, even with overwrite
            with pytest.raises(CocosError) as exc:
                Tracker(folder, every=1, overwrite=overwrite)
            assert "another cocos process is writing" in _one_line(exc)
        other = _python(f"""
            import torch
            from cocos.errors import CocosError
            from cocos.track import Tracker
            try:
                Tracker({str(folder)!r}, every=1, overwrite=True)
            except CocosError as exc:
                print("refused:", exc)
        """)
        out, err = other.communicate(timeout=120)
        assert other.returncode == 0 and out.startswith("refused:") and "another cocos process" in out, err
        out, err = holder.communicate("go\n", timeout=120)
        assert holder.returncode == 0 and out.strip() == "done", err
    finally:
        if holder.poll() is None:
            holder.kill()
    track = read_logs(folder).track
    assert sorted(set(track["step"])) == [1, 2, 3, 4, 5, 6]
    assert len(track) == 6 * 2 * (3 + 4)  # every step: two counters, both directions, each of their stats
    assert not lock_path(folder).exists()  # released at close
    Tracker(folder, every=1, overwrite=True).close()  # free again


def test_a_killed_writer_leaves_the_folder_free(tmp_path):
    folder = tmp_path / "run"
    holder = _python(HOLDER.format(folder=str(folder)))
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert sorted(set(read_logs(folder).track["step"])) == [1, 2, 3]  # its rows so far, each line whole
    with Tracker(folder, every=1, overwrite=True) as again:
        again.observe(1, torch.randn(4, 3), torch.randn(4, 3))


def test_a_dropped_tracker_is_flushed_and_unlocked(tmp_path):
    t = Tracker(tmp_path / "a", every=1, losses="triplet", autoflush=False)
    t.observe(1, torch.randn(4, 3), torch.randn(4, 3))
    t.observe(2, torch.randn(4, 3), torch.randn(4, 3))
    assert len(pd.read_csv(tmp_path / "a" / "cocos_track.csv")) == 0  # not flushed yet
    del t
    gc.collect()
    assert sorted(set(pd.read_csv(tmp_path / "a" / "cocos_track.csv")["step"])) == [1, 2]
    Tracker(tmp_path / "a", every=1, overwrite=True).close()  # the lock went with it


# --------------------------------------------------------------------------- appended rows


def test_rows_are_appended_and_read_back_as_a_whole_rewrite(tmp_path, monkeypatch):
    torch.manual_seed(4)
    aligned = torch.nn.functional.normalize(torch.randn(6, 5), dim=-1)
    t = Tracker(tmp_path / "t", every=2, losses=["triplet_sh", "ntxent"], params={"triplet_sh": {"margin": 0.0}})
    t.observe(1, aligned, aligned)  # no violation at margin 0: C_q is NaN
    monkeypatch.setattr(track_module, "write_csv", None)  # from here on the CSV is never rewritten
    writes = []
    monkeypatch.setattr(track_module, "write_json", lambda path, obj: writes.append(obj))
    for step in range(2, 12):
        t.observe(step, torch.randn(6, 5), torch.randn(6, 5), epoch=1 + step // 5)
    assert not writes  # the settings did not change: cocos_track.json is not rewritten either
    t.observe(12, torch.randn(4, 5), torch.randn(4, 5))  # not due
    t.observe(13, torch.randn(4, 5), torch.randn(4, 5))  # due, another shape: skipped, which the json records
    assert [w["skipped"] for w in writes] == [1]
    monkeypatch.undo()
    t.close()
    frame = t.frame()
    assert frame.loc[(frame["step"] == 1) & (frame["stat"] == "C_q"), "value"].isna().all()
    write_csv(tmp_path / "whole.csv", frame, float_format="%.10g")
    assert (tmp_path / "t" / "cocos_track.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    pd.testing.assert_frame_equal(read_logs(tmp_path / "t").track, pd.read_csv(tmp_path / "whole.csv"))
    # restored rows (a resumed run) are written whole once, then appended to
    earlier = read_logs(tmp_path / "t").track
    again = Tracker(tmp_path / "t", every=2, losses=["triplet_sh", "ntxent"], overwrite=True)
    again.restore(earlier)
    again.observe(15, torch.randn(6, 5), torch.randn(6, 5))
    again.close()
    write_csv(tmp_path / "whole.csv", again.frame(), float_format="%.10g")
    assert (tmp_path / "t" / "cocos_track.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    assert read_logs(tmp_path / "t").track["step"].iloc[-1] == 15


def test_the_csv_lines_quote_and_format_as_pandas_does():
    rows = [(1, 1, "a,b", "i2t", 'q"x', 0.1), (2, 1, "l", "t2i", "C_qv-", float("nan")), (3, 2, "l", "t2i", "s", 1.0),
            (4, 2, "l", "t2i", "s", -0.0), (5, 2, "l", "t2i", "s", 1e-300), (6, 2, "l", "t2i", "s", float("inf")),
            (7, 3, "l", "t2i", "s", 123456789.123456)]
    frame = pd.DataFrame(rows, columns=track_module.COLUMNS)
    assert track_module.csv_lines(rows) == frame.to_csv(index=False, header=False, float_format="%.10g")


# --------------------------------------------------------------------------- big batches


def test_counting_in_blocks_gives_the_values_of_the_whole_batch(monkeypatch):
    torch.manual_seed(5)
    images, captions = torch.randn(24, 8), torch.randn(72, 8)
    ids = torch.arange(24) // 2  # same-image rows: excluded pairs (and negatives in compat mode)
    for compat in (False, True):
        whole = Tracker(every=1, losses="paper", compat=compat)
        whole.observe(1, images, captions)
        whole.observe(2, images, captions[::3], image_ids=ids)  # another shape: skipped
        pair = Tracker(every=1, losses="triplet,triplet_sh,ntxent", compat=compat)
        pair.observe(1, images, captions[::3], image_ids=ids)
        monkeypatch.setattr(blocks_module, "BLOCK_BUDGET", 2000)  # a few query rows per block
        blocked = Tracker(every=1, losses="paper", compat=compat)
        blocked.observe(1, images, captions)
        blocked_pair = Tracker(every=1, losses="triplet,triplet_sh,ntxent", compat=compat)
        blocked_pair.observe(1, images, captions[::3], image_ids=ids)
        monkeypatch.undo()
        pd.testing.assert_frame_equal(blocked.frame(), whole.frame(), check_exact=True)
        pd.testing.assert_frame_equal(blocked_pair.frame(), pair.frame(), check_exact=True)
        want = count_batch(images, captions[::3], "triplet", compat=compat, image_ids=ids)
        got = pair.frame().set_index(["loss", "direction", "stat"])["value"]
        assert got[("triplet", "t2i", "C_q")] == want["t2i"]["C_q"]
        assert got[("triplet", "i2t", "C_B")] == want["i2t"]["C_B"]
    rows = {}  # and the blocks were many: every block's rows against all candidates
    original = blocks_module.QueryView
    monkeypatch.setattr(blocks_module, "BLOCK_BUDGET", 2000)
    monkeypatch.setattr(blocks_module, "QueryView", lambda **kw: rows.setdefault(kw["direction"], []).append(
        tuple(kw["scores"].shape)) or original(**kw))
    Tracker(every=1, losses="ntxent").observe(1, images, captions[::3])
    assert len(rows["i2t"]) > 3 and all(k == 24 for _, k in rows["i2t"])
    assert sum(q for q, _ in rows["t2i"]) == 24


def test_a_big_batch_stays_within_its_memory_budget():
    # 4096 x 4096 (a quarter of 8192 x 8192) under a quarter of the default budget: the whole count of this batch
    # takes about 515 MB of temporaries (measured), blocks under a quarter of 1 GB
    child = _python(real=True, code="""
        import resource, torch
        import cocos.counting.blocks as blocks
        from cocos.track import Tracker
        blocks.BLOCK_BUDGET //= 4
        images, captions = torch.randn(4096, 64), torch.randn(4096, 64)
        Tracker(every=1, losses="triplet_sh").observe(1, images[:8], captions[:8])  # imports, first allocations
        t = Tracker(every=1, losses="triplet_sh")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert t.observe(1, images, captions)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    assert int(out.strip()) < 2**30 // 4


# --------------------------------------------------------------------------- checks first, folders and kinds


def test_every_argument_is_checked_before_the_folder_is_made(tmp_path, monkeypatch):
    out = tmp_path / "new" / "track"
    for kwargs, words in (({"every": 0}, "every"), ({"losses": "nosuch"}, "unknown loss"),
                          ({"params": {"ntxent": {"tau": -1.0}}}, "tau"), ({"batch_size": 0}, "batch_size"),
                          ({"tensorboard": object()}, "add_scalar")):
        with pytest.raises(CocosError) as exc:
            Tracker(out, **kwargs)
        assert words in _one_line(exc)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(CocosError) as exc:
        Tracker(out, tensorboard=True)
    assert "pip install tensorboard" in _one_line(exc)
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []  # no folder, no lock file


def test_an_empty_batch_is_one_line_naming_it():
    t = Tracker(every=1)
    for images, captions, what in ((torch.randn(4, 3), torch.randn(0, 3), "0 captions"),
                                   (torch.randn(0, 3), torch.randn(4, 3), "0 images")):
        with pytest.raises(CocosError) as exc:
            t.observe(1, images, captions)
        assert what in _one_line(exc) and "step 1" in str(exc.value)
    assert t.observe(1, torch.randn(4, 3), torch.randn(4, 3))


def test_a_due_batch_with_another_number_of_captions_is_skipped():
    torch.manual_seed(6)
    ranking = Tracker(every=1, losses="triplet,smoothap")
    assert ranking.observe(1, torch.randn(4, 3), torch.randn(8, 3))  # 2 captions per image: fixes (4, 8)
    assert not ranking.observe(2, torch.randn(4, 3), torch.randn(12, 3))  # 3 per image: same images, skipped
    assert ranking.skipped == 1 and ranking.shape == (4, 8) and set(ranking.frame()["step"]) == {1}
    assert ranking.observe(3, torch.randn(4, 3), torch.randn(8, 3))
    pair = Tracker(every=1, losses="ntxent")
    assert pair.observe(1, torch.randn(5, 3), torch.randn(5, 3))
    assert not pair.observe(2, torch.randn(5, 3), torch.randn(10, 3)) and pair.skipped == 1


def test_the_folders_a_tracker_writes_into(tmp_path):
    with Tracker(tmp_path / "new", every=1):  # a new folder: marked a tracking folder
        pass
    assert output_kind(tmp_path / "new") == "track"
    with pytest.raises(CocosError) as exc:  # it holds a track: overwrite=True replaces it
        Tracker(tmp_path / "new", every=1)
    assert "overwrite=True" in _one_line(exc)
    Tracker(tmp_path / "new", every=1, overwrite=True).close()
    for kind in ("dataset", "features", "report", "sweep"):  # another kind of cocos folder: never, even overwrite
        folder = tmp_path / kind
        folder.mkdir()
        mark_output(folder, kind)
        (folder / "data.npy").write_bytes(b"x")
        with pytest.raises(CocosError) as exc:
            Tracker(folder, every=1, overwrite=True)
        assert "choose another out_dir" in _one_line(exc)
        assert sorted(p.name for p in folder.iterdir()) == [".cocos-output", "data.npy"]
    run = tmp_path / "train_run"
    run.mkdir()
    (run / ".cocos-train").write_text("written by cocos train\n")
    with pytest.raises(CocosError) as exc:
        Tracker(run, every=1, overwrite=True)
    assert "training run" in _one_line(exc)
    Tracker.for_training(5, "triplet_sh", {}, "pair", out_dir=run).close()  # cocos train's own tracker may
    assert output_kind(run) == "run"
    # a folder of the user's own (open_clip's run folder): allowed, unmarked, nothing of it touched
    own = tmp_path / "open_clip_run"
    own.mkdir()
    (own / "out.log").write_text("epoch 1\n")
    (own / "events.out.tfevents.1.host").write_bytes(b"\x00events")
    with Tracker(own, every=1, losses="triplet") as t:
        t.observe(1, torch.randn(4, 3), torch.randn(4, 3))
    assert output_kind(own) is None
    assert sorted(p.name for p in own.iterdir()) == ["cocos_track.csv", "cocos_track.json",
                                                     "events.out.tfevents.1.host", "out.log"]
    assert (own / "out.log").read_text() == "epoch 1\n"
    with Tracker(own, every=1, losses="triplet", overwrite=True):  # its own two files replaced, nothing else
        pass
    assert len(pd.read_csv(own / "cocos_track.csv")) == 0 and (own / "out.log").read_text() == "epoch 1\n"


def test_a_track_with_no_counted_step_is_reported(tmp_path):
    """A Tracker that opened (its CSV is the header alone) but counted nothing: `cocos report` lists it as such,
    where the log reader refused the header-only file before ("column step must hold positive integers")."""
    from typer.testing import CliRunner

    from cocos_cli.main import app

    with Tracker(tmp_path / "track", every=5) as tracker:
        assert not tracker.observe(2, torch.randn(4, 8), torch.randn(4, 8))  # not due: nothing counted
    assert (tmp_path / "track" / "cocos_track.csv").read_text().splitlines() == [",".join(track_module.COLUMNS)]
    assert read_logs(tmp_path / "track").track.empty
    res = CliRunner().invoke(app, ["report", str(tmp_path / "track"), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert "- `" + str(tmp_path / "track") + "` (no counted step yet)" in (tmp_path / "rep" / "tables.md").read_text()
    assert not (tmp_path / "rep" / "cocos_track.png").exists()
