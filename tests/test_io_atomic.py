"""The atomic-write helpers of ``cocos.io`` on their own: ``atomic_path``, ``write_text``, ``write_json``,
``atomic_dir`` and ``output_lock``.

The contract (module docstring of ``cocos.io``): every file goes through a temporary in the same folder and one
``os.replace``, so a reader sees the old file or the new one, never a part; a failure leaves the old file byte
for byte and no temporary; files get ``0o666`` less the umask (folders ``0o777``); temporaries a killed process
left are removed, those of a live process kept. ``output_lock`` holds an exclusive lock on ``.NAME.lock`` beside
an output: a second locker is refused in one line, the lock file and the parent folders made for it go again,
and a lock file that is a link is never followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from cocos import io
from cocos.errors import CocosError


def _entries(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


class _Boom(Exception):
    pass


@pytest.fixture
def umask():
    """Set a umask for one test, restored after."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@contextlib.contextmanager
def _within(seconds: int):
    """Fail instead of hanging (a lock that follows a link to another file never sees its own inode there)."""
    def expired(*_):
        raise AssertionError(f"did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: the pid names no process (until reused, which a fresh pid is not at once)
    return child.pid


# -- atomic_path, write_text, write_json -----------------------------------------------------------------------

@pytest.mark.parametrize("write", ["atomic_path", "write_text", "write_json"])
def test_a_failure_inside_the_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, write):
    target = tmp_path / "out.json"
    target.write_bytes(b'{"old": [1, 2, 3]}\n\x00tail')
    before = target.read_bytes()
    real = pathlib.Path.write_text

    def half_then_fail(self, text, *a, **kw):  # half of the text reaches the disk, then the writer dies
        real(self, text[: len(text) // 2], *a, **kw)
        raise _Boom

    monkeypatch.setattr(pathlib.Path, "write_text", half_then_fail)
    with pytest.raises(_Boom):
        if write == "atomic_path":
            with io.atomic_path(target) as tmp:
                tmp.write_text("x" * 1000)
        elif write == "write_text":
            io.write_text(target, "new " * 1000)
        else:
            io.write_json(target, {"new": list(range(1000))})
    assert target.read_bytes() == before
    assert _entries(tmp_path) == ["out.json"]


@pytest.mark.parametrize("write", ["write_text", "write_json"])
def test_the_target_changes_only_by_one_rename_of_a_complete_file(tmp_path, monkeypatch, write):
    """Until the rename the target holds the old bytes; at the rename the temporary (hidden, in the target's
    folder: the same file system, so the rename is atomic) holds the complete new content."""
    target = tmp_path / "out.json"
    target.write_text("old\n")
    payload = {"a": list(range(500)), "b": "é" * 100}
    text = "new é\n" * 2000 if write == "write_text" else json.dumps(payload, indent=2, sort_keys=True) + "\n"
    seen = []
    real_replace, real_write = os.replace, pathlib.Path.write_text

    def spy_write(self, data, *a, **kw):
        assert target.read_text() == "old\n"  # nothing written to the target itself
        return real_write(self, data, *a, **kw)

    def spy_replace(src, dst, *a, **kw):
        src, dst = pathlib.Path(src), pathlib.Path(dst)
        seen.append((src, dst, src.read_text(encoding="utf-8"), dst.read_text()))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", spy_write)
    monkeypatch.setattr(os, "replace", spy_replace)
    if write == "write_text":
        io.write_text(target, text)
    else:
        io.write_json(target, payload)
    assert len(seen) == 1, seen
    src, dst, new, old = seen[0]
    assert dst == target and old == "old\n" and new == text
    assert src.parent == target.parent and src.name.startswith(".out.json.") and src.name.endswith(".tmp")
    assert target.read_text(encoding="utf-8") == text and _entries(tmp_path) == ["out.json"]
    if write == "write_json":  # deterministic: sorted keys, indent 2, a final newline
        assert json.loads(target.read_text(encoding="utf-8")) == payload


def test_files_and_folders_get_the_usual_permissions(tmp_path, umask):
    for mask in (0o022, 0o077, 0o002):
        umask(mask)
        path = tmp_path / f"f{mask:o}.txt"
        io.write_text(path, "x")
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, oct(mask)
        with io.atomic_path(tmp_path / f"p{mask:o}.bin") as tmp:
            tmp.write_bytes(b"y")
        assert (tmp_path / f"p{mask:o}.bin").stat().st_mode & 0o777 == 0o666 & ~mask
        with io.atomic_dir(tmp_path / f"d{mask:o}", kind="report") as tmp:
            (tmp / "a").write_text("z")
        assert (tmp_path / f"d{mask:o}").stat().st_mode & 0o777 == 0o777 & ~mask


def test_stale_temporaries_of_dead_writers_go_those_of_live_ones_stay(tmp_path):
    dead, live = _dead_pid(), os.getppid()
    target = tmp_path / "out.json"
    stale = [f".out.json.{dead}.k2j4h7.tmp", f".out.json.{dead}.q1w2e3.npz.tmp"]
    kept = [f".out.json.{live}.a8b9c0.tmp", f".out.json.{os.getpid()}.zz11yy.tmp",  # live writers: this one too
            f".other.json.{dead}.a1b2c3.tmp", f"out.json.{dead}.abc.tmp"]  # another output's; not hidden
    for name in stale + kept:
        (tmp_path / name).write_text("partial")
    io.write_text(target, "new")
    assert _entries(tmp_path) == sorted(["out.json", *kept])
    # a killed atomic_dir's folder goes too, a live one's stays
    for name in (f".run.{dead}.x1y2z3.tmp", f".run.{live}.x1y2z3.tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "part").write_text("partial")
    with io.atomic_dir(tmp_path / "run", kind="report") as tmp:
        (tmp / "done").write_text("ok")
    assert not (tmp_path / f".run.{dead}.x1y2z3.tmp").exists() and (tmp_path / f".run.{live}.x1y2z3.tmp").is_dir()
    assert (tmp_path / "run" / "done").read_text() == "ok"


def test_a_temporary_that_is_a_link_is_not_followed_when_stale(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    (tmp_path / f".out.json.{_dead_pid()}.abc123.tmp").symlink_to(victim)
    io.write_text(tmp_path / "out.json", "new")
    assert (victim / "keep").read_text() == "keep"


# -- atomic_dir ------------------------------------------------------------------------------------------------

def test_atomic_dir_replaces_a_folder_only_once_complete(tmp_path):
    out = tmp_path / "run"
    with io.atomic_dir(out, overwrite=True, kind="report") as tmp:
        (tmp / "a.txt").write_text("first")
        assert not out.exists() and tmp.parent == tmp_path and tmp.name.startswith(".run.")
    assert (out / "a.txt").read_text() == "first" and (out / io.MARKER).is_file()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(_Boom), io.atomic_dir(out, overwrite=True, kind="report") as tmp:
        (tmp / "a.txt").write_text("second")
        (tmp / "b.txt").write_text("second")
        raise _Boom
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _entries(tmp_path) == ["run"]  # no temporary folder, no lock file
    with io.atomic_dir(out, overwrite=True, kind="report") as tmp:
        (tmp / "b.txt").write_text("third")
    assert _entries(out) == sorted([io.MARKER, "b.txt"]) and _entries(tmp_path) == ["run"]


def test_atomic_dir_keeps_the_old_folder_until_the_new_one_moves_in(tmp_path, monkeypatch):
    """The old folder is moved aside, not deleted, until the complete new one is renamed into place (a folder
    cannot be swapped by one rename: the old one is deleted only after)."""
    out = tmp_path / "run"
    with io.atomic_dir(out, overwrite=True, kind="report") as tmp:
        (tmp / "a.txt").write_text("old")
    seen, real_replace = [], os.replace

    def spy_replace(src, dst, *a, **kw):
        src, dst = pathlib.Path(src), pathlib.Path(dst)
        if dst == out:  # the new folder moving in: complete, and the old content still on disk beside it
            aside = [p for p in tmp_path.iterdir() if p.is_dir() and (p / "a.txt").is_file()
                     and (p / "a.txt").read_text() == "old"]
            seen.append((sorted(q.name for q in src.iterdir()), len(aside)))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", spy_replace)
    with io.atomic_dir(out, overwrite=True, kind="report") as tmp:
        (tmp / "b.txt").write_text("new")
    assert seen == [(sorted([io.MARKER, "b.txt"]), 1)]
    assert _entries(out) == sorted([io.MARKER, "b.txt"]) and _entries(tmp_path) == ["run"]


def test_atomic_dir_puts_the_old_folder_back_when_the_new_one_cannot_move_in(tmp_path, monkeypatch):
    """A full disk at the last rename: one CocosError line, the old folder back in place byte for byte, no
    temporary (before, it was left only as ``.run.PID.xxxx.old``, which a later run's clean-up deletes)."""
    import errno

    out = tmp_path / "run"
    with io.atomic_dir(out, overwrite=True, kind="report") as tmp:
        (tmp / "a.txt").write_text("old")
    real_replace = os.replace

    def full_disk(src, dst, *a, **kw):
        if pathlib.Path(dst) == out and pathlib.Path(src).name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(CocosError, match="cannot write"):
        with io.atomic_dir(out, overwrite=True, kind="report") as tmp:
            (tmp / "b.txt").write_text("new")
    assert _entries(tmp_path) == ["run"] and _entries(out) == sorted([io.MARKER, "a.txt"])
    assert (out / "a.txt").read_text() == "old"


def test_atomic_dir_holds_the_output_lock(tmp_path):
    out = tmp_path / "run"
    with io.output_lock(out):
        with pytest.raises(CocosError) as err, io.atomic_dir(out, overwrite=True, kind="report") as tmp:
            (tmp / "a.txt").write_text("second writer")
    assert "another cocos process" in str(err.value) and "\n" not in str(err.value)
    assert _entries(tmp_path) == []


# -- output_lock -----------------------------------------------------------------------------------------------

def test_a_second_locker_is_refused_in_one_line_and_the_lock_goes_after(tmp_path):
    out = tmp_path / "out"
    lock = tmp_path / ".out.lock"
    with io.output_lock(out) as held:
        assert held == lock and lock.is_file()
        with pytest.raises(CocosError) as err, io.output_lock(out):
            pass
        line = str(err.value)
        assert "\n" not in line and str(out) in line and "another cocos process" in line
        assert lock.is_file()  # the refused locker leaves the holder's lock alone
    assert not lock.exists() and _entries(tmp_path) == []
    with pytest.raises(_Boom), io.output_lock(out):  # released on an exception too
        raise _Boom
    assert not lock.exists()
    with io.output_lock(out):  # and free again
        pass


def test_a_second_process_is_refused(tmp_path):
    out = tmp_path / "out"
    code = ("import sys\nfrom cocos import io\nfrom cocos.errors import CocosError\n"
            "try:\n    io.output_lock(sys.argv[1]).__enter__()\nexcept CocosError as e:\n    print(e)\n    sys.exit(3)\n")
    with io.output_lock(out):
        other = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    assert other.returncode == 3 and "another cocos process" in other.stdout, (other.stdout, other.stderr)
    assert len(other.stdout.strip().splitlines()) == 1


def test_parent_folders_made_for_the_lock_go_again_unless_written_into(tmp_path):
    with io.output_lock(tmp_path / "a" / "b" / "out"):
        assert (tmp_path / "a" / "b" / ".out.lock").is_file()
    assert _entries(tmp_path) == []
    with io.output_lock(tmp_path / "a" / "b" / "out"):
        io.write_text(tmp_path / "a" / "b" / "out", "kept")
    assert (tmp_path / "a" / "b" / "out").read_text() == "kept"
    assert _entries(tmp_path / "a" / "b") == ["out"]


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock = tmp_path / ".out.lock"
    lock.symlink_to(victim)
    with _within(10), pytest.raises(CocosError) as err, io.output_lock(tmp_path / "out"):
        pass
    assert "\n" not in str(err.value) and "lock" in str(err.value)
    assert victim.read_text() == "precious" and lock.is_symlink() and os.readlink(lock) == str(victim)
    dangling = tmp_path / ".new.lock"
    dangling.symlink_to(tmp_path / "created-through-the-link")
    with _within(10), pytest.raises(CocosError), io.output_lock(tmp_path / "new"):
        pass
    assert not (tmp_path / "created-through-the-link").exists()
