"""The classes of the adversarial run's findings (issue 16), one parametrised test per class.

Each bad input: exit code 2, exactly one ``error:`` line, and every file that was there before is
byte-identical afterwards (nothing replaced, nothing half-written).
"""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cocos.data.synth import make_synthetic
from cocos.errors import CocosError
from cocos.training.trainer import TrainConfig, Trainer
from cocos_cli.main import app
from tests import preloaded
from tests.helpers import one_error_line, snapshot
from tests.test_legacy_import import (
    DIM,
    EMBED,
    WORD,
    OrigEncoderImagePrecomp,
    OrigEncoderText,
    opt_namespace,
    original_vocab,
    pickle_vocab,
    randomise,
    save_original,
)

EMPTY_FIGURES = True  # no test here reads a figure: written as empty files (tests/conftest.py)
runner = CliRunner()
TINY = dict(model="vsepp", epochs=1, lr=2e-3, lr_update=10, batch_size=16, embed_size=16, word_dim=8, device="cpu")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A data folder, a cocos run folder ``ck/`` with both logs, an embeddings file, an original checkpoint."""
    root = tmp_path_factory.mktemp("rel")
    data = make_synthetic(root / "data", n_train=48, n_dev=16, n_test=16, feature_dim=DIM, seed=1)
    Trainer(TrainConfig.of(data=str(data), out=str(root / "ck"), loss="triplet", track_cocos=1, **TINY),
            progress=False, log=lambda *a: None).fit()
    (root / "ck" / "training.png").write_bytes(b"the figure cocos train draws")  # the CLI's, not the library's
    rng = np.random.default_rng(0)
    np.savez(root / "emb.npz", images=rng.normal(size=(16, 8)).astype(np.float32),
             captions=rng.normal(size=(80, 8)).astype(np.float32))
    vocab = original_vocab((data / "train_caps.txt").read_text().splitlines())
    pickle_vocab(vocab, root / "vocab.pkl")
    save_original(root / "orig.pth.tar", randomise(OrigEncoderImagePrecomp(DIM, EMBED), 1),
                  randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 2), opt_namespace())
    return root


def _commands(w: Path, target: Path) -> dict[str, list[str]]:
    """Every command with a single-file output option, writing to ``target``."""
    ck = w / "ck" / "model_best.pt"
    return {
        "analyze --save-embeddings": ["analyze", str(ck), "--out", str(w / "rep_a"), "--save-embeddings",
                                      str(target), "--loss", "triplet", "--no-progress"],
        "evaluate --json": ["evaluate", str(ck), "--json", str(target), "--no-progress"],
        "count --json": ["count", str(w / "emb.npz"), "--batch-size", "8", "--json", str(target), "--no-progress"],
        "train --json": ["train", "--data", str(w / "data"), "--out", str(w / "new_run"), "--json", str(target),
                         "--epochs", "1", "--batch-size", "16", "--embed-size", "16", "--word-dim", "8",
                         "--no-progress"],
        "import --out": ["import", str(w / "orig.pth.tar"), "--vocab", str(w / "vocab.pkl"), "--data",
                         str(w / "data"), "--out", str(target)],
        "diagram --out": ["diagram", "--out", str(target.with_suffix("")), "--no-progress"],
    }


@pytest.mark.parametrize("command", ["analyze --save-embeddings", "evaluate --json", "count --json",
                                     "train --json", "import --out", "diagram --out"])
def test_no_output_option_replaces_an_existing_file_without_overwrite(world, tmp_path, command):
    target = tmp_path / "mine.png"  # a file of the user's (diagram writes STEM.png)
    target.write_bytes(b"the user's own file")
    before = snapshot(world, tmp_path)
    line = one_error_line(runner.invoke(app, _commands(world, target)[command]))
    assert "exists" in line and "--overwrite" in line, line
    assert snapshot(world, tmp_path) == before


@pytest.mark.parametrize("command,victim", [("analyze --save-embeddings", "train_log.csv"),
                                            ("evaluate --json", "cocos_track.csv"),
                                            ("import --out", "last.pt"),
                                            ("diagram --out", "training.png")])
def test_files_of_an_input_checkpoints_run_folder_are_never_replaced_even_with_overwrite(world, command, victim):
    target = world / "ck" / victim
    assert target.is_file()
    args = _commands(world, target)[command]
    if command == "import --out":  # the input checkpoint's own folder: put the original checkpoint into ck/
        shutil.copy(world / "orig.pth.tar", world / "ck" / "orig.pth.tar")
        args[1] = str(world / "ck" / "orig.pth.tar")
    if command == "diagram --out":
        args += ["--checkpoint", str(world / "ck" / "model_best.pt")]
    before = snapshot(world)
    line = one_error_line(runner.invoke(app, [*args, "--overwrite"]))
    assert "run folder" in line or "input" in line, line
    assert snapshot(world) == before
    (world / "ck" / "orig.pth.tar").unlink(missing_ok=True)


def test_overwrite_replaces_a_users_file_when_asked(world, tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text("old")
    res = runner.invoke(app, [*_commands(world, target)["evaluate --json"], "--overwrite"])
    assert res.exit_code == 0, res.output
    assert '"rsum"' in target.read_text()


# -- corrupt checkpoints of every format: the zip CRC of every member ------------------------------------

def _flip(path: Path, out: Path) -> Path:
    """Flip 64 bytes in the middle of the largest stored member's data (its CRC no longer matches)."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.file_size // 2
    for i in range(start, start + 64):
        raw[i] ^= 0xFF
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("fmt", ["cocos", "original"])
def test_a_checkpoint_with_flipped_bytes_is_refused_in_every_format(world, tmp_path, fmt):
    source = world / "ck" / "model_best.pt" if fmt == "cocos" else world / "orig.pth.tar"
    bad = _flip(source, tmp_path / source.name)
    extra = [] if fmt == "cocos" else ["--vocab", str(world / "vocab.pkl"), "--data", str(world / "data")]
    before = snapshot(world, tmp_path)
    line = one_error_line(runner.invoke(app, ["analyze", str(bad), "--out", str(tmp_path / "rep"), "--no-progress",
                                              *extra]))
    assert "fails its CRC check" in line, line
    if fmt == "original":
        line = one_error_line(runner.invoke(app, ["import", str(bad), *extra, "--out", str(tmp_path / "m.pt")]))
        assert "fails its CRC check" in line, line
    assert snapshot(world, tmp_path) == before


# -- invalid settings of an imported checkpoint: refused by name -------------------------------------------

@pytest.mark.parametrize("field,value", [("batch_size", -5), ("batch_size", "sixteen"), ("batch_size", 2.5),
                                         ("num_epochs", float("nan")), ("learning_rate", "fast"),
                                         ("lr_update", 0), ("embed_size", "sixteen")])
def test_invalid_settings_of_an_imported_checkpoint_are_refused_naming_the_field(world, tmp_path, field, value):
    vocab = original_vocab((world / "data" / "train_caps.txt").read_text().splitlines())
    path = save_original(tmp_path / "bad.pth.tar", randomise(OrigEncoderImagePrecomp(DIM, EMBED), 1),
                         randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 2), opt_namespace(**{field: value}))
    line = one_error_line(runner.invoke(app, ["import", str(path), "--vocab", str(world / "vocab.pkl"), "--data",
                                              str(world / "data"), "--out", str(tmp_path / "m.pt")]))
    assert f"opt.{field} = {value!r}" in line, line
    assert not (tmp_path / "m.pt").exists()


# -- --resume reads nothing damaged: every file it keeps is checked before the first step ------------------

def _cut(text: str) -> str:
    return text[: len(text) - len(text.splitlines()[-1]) // 2 - 1]


def _foreign(text: str) -> str:
    last = text.splitlines()[-1].split(",")
    last[0] = "999999"
    return text + ",".join(last) + "\n"


def _text_in_numbers(text: str) -> str:
    lines = text.splitlines()
    cells = lines[1].split(",")
    cells[-1] = "oops"
    return "\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n"


@pytest.mark.parametrize("name", ["train_log.csv", "cocos_track.csv"])
@pytest.mark.parametrize("damage", [_cut, _foreign, _text_in_numbers])
def test_resume_refuses_damaged_logs_before_the_first_step(world, tmp_path, name, damage):
    run = tmp_path / "ck"
    shutil.copytree(world / "ck", run)
    (run / name).write_text(damage((run / name).read_text()))
    before = snapshot(run)
    res = runner.invoke(app, ["train", "--data", str(world / "data"), "--out", str(run), "--resume", "--epochs", "2",
                              "--loss", "triplet", "--batch-size", "16", "--embed-size", "16", "--word-dim", "8",
                              "--lr", "2e-3", "--lr-update", "10", "--track-cocos", "1", "--no-progress"])
    line = one_error_line(res)
    assert name in line, line
    assert snapshot(run) == before  # no epoch ran: last.pt and the logs are untouched


def test_resume_refuses_an_unreadable_model_best_before_the_first_step(world, tmp_path):
    run = tmp_path / "ck"
    shutil.copytree(world / "ck", run)
    (run / "model_best.pt").write_bytes(b"PK\x03\x04 not a checkpoint")
    before = snapshot(run)
    res = runner.invoke(app, ["train", "--data", str(world / "data"), "--out", str(run), "--resume", "--epochs", "2",
                              "--loss", "triplet", "--batch-size", "16", "--embed-size", "16", "--word-dim", "8",
                              "--lr", "2e-3", "--lr-update", "10", "--track-cocos", "1", "--no-progress"])
    line = one_error_line(res)
    assert "model_best.pt" in line and "weights_only" not in line, line
    assert snapshot(run) == before


# -- declared-size bombs: a header may not claim more than the file holds ------------------------------------

def _npy_bomb(shape=(400_000_000_000, 1024)) -> bytes:
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1), np.float32))
    header["shape"] = shape
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + b"\0" * 64


def test_a_stride_bomb_in_a_checkpoint_is_refused_before_anything_is_allocated(world, tmp_path):
    vocab = original_vocab((world / "data" / "train_caps.txt").read_text().splitlines())
    img = randomise(OrigEncoderImagePrecomp(DIM, EMBED), 1)
    txt = randomise(OrigEncoderText(len(vocab), WORD, EMBED, 1), 2)
    path = save_original(tmp_path / "bomb.pth.tar", img, txt, opt_namespace())
    raw = torch.load(path, weights_only=False)
    raw["model"][1]["embed.weight"] = torch.zeros(WORD).as_strided((10**9, WORD), (0, 1))  # 64 GB on the first copy
    torch.save(raw, path)
    line = one_error_line(runner.invoke(app, ["import", str(path), "--vocab", str(world / "vocab.pkl"), "--data",
                                              str(world / "data"), "--out", str(tmp_path / "m.pt")]))
    assert "declares" in line and f"1000000000x{WORD}" in line, line


@pytest.mark.parametrize("where", ["ltd-targets", "count npz"])
def test_an_array_header_claiming_more_than_the_file_holds_is_refused(world, tmp_path, where):
    if where == "ltd-targets":
        (tmp_path / "t.npy").write_bytes(_npy_bomb())
        args = ["train", "--data", str(world / "data"), "--out", str(tmp_path / "run"), "--ltd", "--ltd-targets",
                str(tmp_path / "t.npy"), "--epochs", "1", "--batch-size", "16", "--no-progress"]
    else:
        with zipfile.ZipFile(tmp_path / "e.npz", "w") as archive:
            archive.writestr("images.npy", _npy_bomb())
            archive.writestr("captions.npy", _npy_bomb())
        args = ["count", str(tmp_path / "e.npz"), "--no-progress"]
    line = one_error_line(runner.invoke(app, args))
    assert "header declares" in line, line
    assert not (tmp_path / "run").exists()


def test_declared_sizes_beyond_memory_are_refused(tmp_path, monkeypatch):
    from cocos import io as cio

    arr = np.zeros((64, 64), np.float32)
    np.save(tmp_path / "a.npy", arr)
    assert cio.load_npy(tmp_path / "a.npy").shape == (64, 64)
    monkeypatch.setattr(cio, "available_memory", lambda: 1024)
    with pytest.raises(CocosError, match="more than the 0.0 MB of memory available"):
        cio.load_npy(tmp_path / "a.npy")


# -- partial output after a failure: a full disk, a read-only folder, a file in the way ------------------------

@pytest.fixture
def mount(tmp_path):
    """``mount(size, ro)``: a small tmpfs folder (root only; skipped elsewhere), unmounted afterwards."""
    import os
    import subprocess

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    mounted = []

    def make(size: str, ro: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        opts = f"size={size}" + (",ro" if ro else "")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", str(point)], capture_output=True)


def test_training_on_a_full_disk_leaves_nothing(world, mount):
    disk = mount("48k")
    res = runner.invoke(app, ["train", "--data", str(world / "data"), "--out", str(disk), "--loss", "triplet",
                              "--epochs", "1", "--batch-size", "16", "--embed-size", "16", "--word-dim", "8",
                              "--track-cocos", "1", "--no-progress"])
    line = one_error_line(res)
    assert "No space left" in line or "cannot write" in line, line
    assert list(disk.iterdir()) == []  # the mount point existed: only what the run wrote into it is gone


@pytest.mark.parametrize("where", ["--out", "--checkpoints", "--data"])
def test_demo_refuses_a_read_only_folder_before_any_work(world, mount, tmp_path, where):
    ro = mount("64k", ro=True)
    paths = {"--out": tmp_path / "rep", "--checkpoints": tmp_path / "cks", "--data": tmp_path / "synth"}
    paths[where] = ro / "x"
    before = snapshot(tmp_path)
    line = one_error_line(runner.invoke(app, ["demo", *[a for k, v in paths.items() for a in (k, str(v))],
                                              "--epochs", "1", "--n-train", "40", "--batch-size", "16", "--no-progress"]))
    assert "read-only" in line, line
    assert snapshot(tmp_path) == before


def test_demo_refuses_a_file_as_its_checkpoints_folder(tmp_path):
    (tmp_path / "cks").write_text("a file")
    before = snapshot(tmp_path)
    line = one_error_line(runner.invoke(app, ["demo", "--out", str(tmp_path / "rep"), "--data",
                                              str(tmp_path / "synth"), "--checkpoints", str(tmp_path / "cks"),
                                              "--epochs", "1", "--no-progress"]))
    assert "not a folder" in line, line
    assert snapshot(tmp_path) == before


def test_a_failing_demo_removes_the_folders_it_made(tmp_path, monkeypatch):
    from cocos.pipelines import demo

    def broken(*args, **kwargs):
        raise CocosError("the disk filled up")

    monkeypatch.setattr(demo, "analyze_checkpoint", broken, raising=False)
    monkeypatch.setattr("cocos.pipelines.analyze.analyze_checkpoint", broken)
    res = runner.invoke(app, ["demo", "--out", str(tmp_path / "rep"), "--data", str(tmp_path / "synth"),
                              "--checkpoints", str(tmp_path / "cks"), "--epochs", "1", "--n-train", "40",
                              "--batch-size", "16", "--embed-size", "16", "--word-dim", "8", "--no-progress"])
    assert res.exit_code == 2 and res.output.splitlines()[-1] == "error: the disk filled up", res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- signals outside a command's own handling, warnings before an error ----------------------------------------

def _python(code: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_ctrl_c_while_the_console_script_shuts_down_is_not_death_by_signal():
    res = _python("import atexit, os, signal, sys\n"
                  "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))  # during Python's shutdown\n"
                  "sys.argv = ['cocos', '--version']\n"
                  "from cocos_cli.main import run\nrun()")
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr, res.stderr


def test_ctrl_c_before_a_command_starts_is_one_line_and_130():
    res = _python("import os, signal, time\n"
                  "from cocos_cli.common import install_late_interrupt\n"
                  "install_late_interrupt()\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)")
    assert res.returncode == 130 and res.stderr.strip() == "interrupted", (res.returncode, res.stderr)


def test_library_warnings_never_precede_an_error_line(tmp_path):
    import warnings

    from cocos_cli.common import handle_errors

    @handle_errors
    def command():
        warnings.warn("numpy: overflow encountered in cast", RuntimeWarning, stacklevel=1)
        raise CocosError("the real problem")

    import typer

    app_ = typer.Typer()
    app_.command()(command)
    line = one_error_line(runner.invoke(app_, []))
    assert line == "error: the real problem"


def test_library_warnings_of_a_successful_command_are_one_line_each():
    import warnings

    import typer

    from cocos_cli.common import handle_errors

    @handle_errors
    def command():
        for _ in range(3):
            warnings.warn("torch: something\nwith a second line", UserWarning, stacklevel=1)
        typer.echo("done")

    app_ = typer.Typer()
    app_.command()(command)
    res = runner.invoke(app_, [])
    assert res.exit_code == 0
    assert res.output.splitlines() == ["done", "warning: torch: something"]


@pytest.mark.slow
def test_other_ranks_wait_for_rank_0s_writing_beyond_the_collective_timeout(tmp_path):
    """torchrun: rank 0 writes alone after the last collective; the others wait with the writing budget."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import time\nfrom cocos.distributed import context\n"
            "with context() as group:\n"
            "    if group.is_main:\n        time.sleep(3)  # writing the report: longer than COCOS_DIST_TIMEOUT (2 s)\n"
            "print('left', group.rank)\n")
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "COCOS_DIST_TIMEOUT": "2", "CUDA_VISIBLE_DEVICES": ""}
        procs.append(preloaded.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert [out.strip() for out, _ in results] == ["left 0", "left 1"]


# -- cocos count: memory bounded by the input (uncompressed members mapped, rows normalised block by block) ------

def test_uncompressed_npz_members_are_memory_mapped_and_equal_the_arrays(tmp_path):
    from cocos.io import load_npz

    rng = np.random.default_rng(3)
    arrays = {"images": rng.normal(size=(7, 5)).astype(np.float32),
              "captions": np.asfortranarray(rng.normal(size=(35, 5))),
              "caption_image": np.repeat(np.arange(7), 5)}
    np.savez(tmp_path / "e.npz", **arrays)
    loaded = load_npz(tmp_path / "e.npz", mmap=True)
    assert all(isinstance(loaded[k], np.memmap) for k in arrays)
    for k, v in arrays.items():
        assert loaded[k].dtype == v.dtype and np.array_equal(loaded[k], v)
    np.savez_compressed(tmp_path / "c.npz", **arrays)  # small compressed members are read as usual
    assert all(np.array_equal(load_npz(tmp_path / "c.npz", mmap=True)[k], v) for k, v in arrays.items())


def test_large_compressed_members_are_refused_with_how_to_save_them(tmp_path, monkeypatch):
    from cocos import io as cio

    np.savez_compressed(tmp_path / "c.npz", images=np.ones((64, 16), np.float32), captions=np.ones((320, 16), "f4"))
    monkeypatch.setattr(cio, "COMPRESSED_LIMIT", 1000)
    line = one_error_line(runner.invoke(app, ["count", str(tmp_path / "c.npz"), "--no-progress"]))
    assert "compressed" in line and "numpy.savez" in line, line


def test_blockwise_normalisation_equals_the_whole_and_names_the_row(monkeypatch):
    from cocos.counting import engine

    rng = np.random.default_rng(4)
    x = rng.normal(size=(50, 6)).astype(np.float32)
    monkeypatch.setattr(engine, "BLOCK_BYTES", 6 * 8 * 7)  # blocks of 7 rows
    assert torch.equal(engine.normalised("images", x), torch.nn.functional.normalize(torch.from_numpy(x), dim=-1))
    x[23, 2] = np.nan
    with pytest.raises(CocosError, match="images row 23 holds NaN"):
        engine.normalised("images", x)
    x[23, 2], x[40] = 1.0, 0.0
    with pytest.raises(CocosError, match="images row 40 is a zero vector"):
        engine.normalised("images", x)


def test_undefined_statistics_in_the_track_are_kept_not_refused(world, tmp_path):
    """A statistic undefined in a batch (C_q when no query counts) is NaN in cocos_track.csv: a valid log, which
    resume and analyze read; only a row without its labels, or a cut last line, is damage."""
    from cocos.training.logs import read_logs

    run = tmp_path / "ck"
    shutil.copytree(world / "ck", run)
    lines = (run / "cocos_track.csv").read_text().splitlines()
    cells = lines[1].split(",")
    cells[-1] = ""  # value NaN
    (run / "cocos_track.csv").write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    logs = read_logs(run)
    assert logs.track["value"].isna().sum() == 1
    res = runner.invoke(app, ["analyze", str(run / "model_best.pt"), "--out", str(tmp_path / "rep"), "--loss",
                              "triplet", "--no-progress"])
    assert res.exit_code == 0, res.output
    cells[-2] = ""  # and no statistic name: damage
    (run / "cocos_track.csv").write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    with pytest.raises(CocosError, match="no value in column stat"):
        read_logs(run)


def test_an_interrupt_while_an_error_is_handled_is_one_interrupted_line_and_exit_130(monkeypatch):
    """torchrun's SIGTERM can arrive just as a rank handles the error of a lost peer: the signal's
    KeyboardInterrupt, raised inside the error handling, still gives the interrupted line and 130."""
    import typer

    import cocos.io
    from cocos_cli.common import INTERRUPTED, handle_errors

    calls = []

    def pending():  # the signal lands during the first check, inside the CocosError handler
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return True

    monkeypatch.setattr(cocos.io, "interrupt_pending", pending)

    @handle_errors
    def command():
        raise CocosError("rank 0: another process stopped")

    app_ = typer.Typer()
    app_.command()(command)
    res = runner.invoke(app_, [])
    assert res.exit_code == 130 and res.output.strip().splitlines() == [INTERRUPTED], (res.exit_code, res.output)
