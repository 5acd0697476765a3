"""``cocos sweep`` grid files under hostile input: one schema, validated whole before anything runs.

Every bad grid (a value of the wrong type in any table, a file that is no grid: a device, a FIFO, a folder,
too large, not UTF-8, nested too deeply; more runs than a sweep takes; [analyze] settings cocos analyze would
refuse; data a run could not read) is refused by ``--dry-run`` and by a real sweep alike, with one ``error:``
line that names what is wrong, exit 2 and nothing created. A good grid still plans the runs it always did.
"""

from __future__ import annotations

import os
import threading

import pytest
from typer.testing import CliRunner

from cocos_cli.main import app
from tests.helpers import one_error_line, snapshot

runner = CliRunner()

TRAIN = 'epochs = 1\nbatch_size = 8\nembed_size = 8\nword_dim = 8\ndevice = "cpu"\n'
LOSSES = '[[loss]]\nname = "triplet_sh"\n[[loss]]\nname = "ntxent"\nparams = { tau = 0.1 }\n'


@pytest.fixture(autouse=True)
def built_once(monkeypatch):
    """The CLI's click command built once for this file's ~80 invocations (typer rebuilds it on each, about
    two thirds of an invocation's time here); the same command object, so the same parsing and output."""
    import typer.testing

    command = typer.testing._get_command(app)
    monkeypatch.setattr(typer.testing, "_get_command", lambda given: command if given is app else
                        typer.main.get_command(given))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from cocos.data.synth import make_synthetic

    return make_synthetic(tmp_path_factory.mktemp("schema") / "data", n_train=24, n_dev=8, n_test=8,
                          feature_dim=8, seed=0)


def grid_text(data, root, *, head="", seeds="[0, 1]", train="", analyze='split = "test"\n', loss=LOSSES,
              tables=True) -> str:
    """The good grid (2 losses x 2 seeds), with ``head`` added at the top level and ``train``/``analyze``
    added to their tables; ``tables=False`` leaves out [train] and [analyze] (for ``train = 5`` and the like)."""
    text = (f'name = "g"\ndata = "{data}"\nreports = "{root}/reports"\ncheckpoints = "{root}/ck"\n'
            f"seeds = {seeds}\n{head}")
    if tables:
        text += f"[train]\n{TRAIN}{train}[analyze]\n{analyze}"
    return text + loss


def many_runs(data, root) -> str:
    """10^6 runs: 100 models x 100 losses x 100 seeds, in a file of 4 kB."""
    losses = "".join(f'[[loss]]\nname = "triplet"\nid = "l{i}"\n' for i in range(100))
    models = ", ".join(f'"m{i}"' for i in range(100))
    return grid_text(data, root, head=f"models = [{models}]\n", seeds=str(list(range(100))), loss=losses)


def nul_in_data(data, root) -> str:
    return grid_text(data, root).replace(f'data = "{data}"', 'data = "a\\u0000b"')


CASES = {  # name: (the grid's text from (data, root), or a special file; what the error line must say)
    # values of the wrong type, in every table
    "params a string": (dict(loss='[[loss]]\nname = "ntxent"\nparams = "tau"\n'),
                        "[[loss]] 1 (ntxent) params: expected a table"),
    "params a number": (dict(loss='[[loss]]\nname = "ntxent"\nparams = 5\n'),
                        "[[loss]] 1 (ntxent) params: expected a table"),
    "params value a table": (dict(loss='[[loss]]\nname = "ntxent"\nparams = { tau = { a = 1 } }\n'),
                             "params tau: expected a number"),
    "train a number": (dict(head="train = 5\n", tables=False), "[train]: expected a table"),
    "train an array": (dict(head="train = [1]\n", tables=False), "[train]: expected a table"),
    "loss train a number": (dict(loss='[[loss]]\nname = "ntxent"\ntrain = 5\n'),
                            "[[loss]] 1 (ntxent) train: expected a table"),
    "analyze a number": (dict(head="analyze = 5\n", tables=False), "analyze: expected a table"),
    "slurm a number": (dict(head="slurm = 5\n"), "slurm: expected a table"),
    "loss a number": (dict(head="loss = 5\n", loss=""), "loss: expected an array of tables"),
    "loss an array of numbers": (dict(head="loss = [1]\n", loss=""), "[[loss]] 1: expected a table"),
    "loss name a number": (dict(loss="[[loss]]\nname = 5\n"), "[[loss]] 1 name: expected a loss name"),
    "models a number": (dict(head="models = 5\n"), "models: expected a model name"),
    "seeds of strings": (dict(seeds="['a']"), "seeds: expected an integer"),
    "train epochs a string": (dict(train='lr_update = "x"\n'), "[train] lr_update: expected an integer"),
    "train flag a boolean number": (dict(train="k = true\n"), "[train] k: expected an integer"),
    "train lr not finite": (dict(train="lr = nan\n"), "[train] lr: expected a finite number"),
    "train grad_clip not finite": (dict(train="grad_clip = inf\n"), "[train] grad_clip: expected a finite number"),
    "data with a NUL": (nul_in_data, "data: expected the data folder's path, got 'a\\x00b'"),
    "data missing": (lambda data, root: grid_text(root / "nodata", root), "data: "),
    "slurm gpus a string": (dict(head='[slurm]\ngpus = "x"\n', tables=False), "[slurm] gpus: expected an integer"),
    "slurm time": (dict(head='[slurm]\ntime = "soon"\n', tables=False), "[slurm] time: time 'soon'"),
    "slurm option": (dict(), "--gpus: expected an integer >= 0", ["--gpus", "-1"]),
    # [analyze] as cocos analyze takes it (item 7: these passed --dry-run and failed after all the training)
    "analyze split": (dict(analyze='split = "bogus"\n'), "[analyze] split: "),
    "analyze eps a string": (dict(analyze='eps = "x"\n'), "[analyze] eps: expected a finite number >= 0"),
    "analyze eps negative": (dict(analyze="eps = -0.5\n"), "[analyze] eps: expected a finite number >= 0"),
    "analyze batch_size a string": (dict(analyze='batch_size = "x"\n'), "[analyze] batch_size: expected a positive"),
    "analyze batch_size zero": (dict(analyze="batch_size = 0\n"), "[analyze] batch_size: expected a positive"),
    "analyze batch_size past the data": (dict(analyze="batch_size = 25\n"),
                                         "[analyze] batch_size: 25 is larger than the training split (24 images)"),
    "analyze compat": (dict(analyze='compat = "yes"\n'), "[analyze] compat: expected true or false"),
    # [train] as cocos train validates it, for every run, and what the runs read
    "per-loss override": (dict(loss='[[loss]]\nname = "ntxent"\ntrain = { epochs = 2, warmup_epochs = 1 }\n'),
                          "run vsepp_ntxent_s0: --warmup-epochs applies to"),
    "train vocab missing": (dict(train='vocab = "no/such/vocab.json"\n'), "vocab: no/such/vocab.json: no such file"),
    "train device": (lambda data, root: grid_text(data, root).replace('"cpu"', '"tpu"'), "unknown device 'tpu'"),
    # the file itself, and the size of what it asks for
    "nested too deeply": ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    "too large": ("# " + "x" * (1 << 20) + "\n", "a grid file is at most 1,048,576 bytes"),
    "not UTF-8": (b"name = '\xff'\n", "not UTF-8"),
    "a folder": ("folder", "is a folder"),
    "a device": ("/dev/zero", "not a regular file"),
    "a FIFO": ("fifo", "not a regular file"),
    "10^6 runs": (many_runs, "expands to 1,000,000 runs (100 models x 100 losses x 100 seeds); at most 10,000"),
}


def _grid_file(case, data, root):
    """The path of the case's grid file, made under root (a device is given by its path)."""
    spec = CASES[case][0]
    path = root / "g.toml"
    if spec == "/dev/zero":
        return "/dev/zero"
    if spec == "folder":
        path.mkdir()
    elif spec == "fifo":
        os.mkfifo(path)
    elif isinstance(spec, dict):
        path.write_text(grid_text(data, root, **spec))
    elif callable(spec):
        path.write_text(spec(data, root))
    elif isinstance(spec, bytes):
        path.write_bytes(spec)
    else:
        path.write_text(spec)
    return str(path)


def _unblock(path):
    """Open a FIFO's write end and close it (a reader blocked in open or read then sees the end of the file):
    a FIFO read without a bound fails this test instead of hanging it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader: the FIFO was not opened, as it should be
        pass


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_grid_one_line_nothing_created(tmp_path, data, case):
    """Each class of bad grid: exit 2, one error line naming the table and key (or the file's fault), nothing
    created, in a dry run and in a real sweep (so item 7's cases fail before any training, not after)."""
    message = CASES[case][1]
    extra = CASES[case][2] if len(CASES[case]) > 2 else []
    root = tmp_path / "root"
    root.mkdir()
    path = _grid_file(case, data, root)
    before = snapshot(tmp_path)
    for dry in (["--dry-run"], []):
        timer = threading.Timer(3.0, _unblock, [path]) if CASES[case][0] == "fifo" else None
        if timer:
            timer.start()
        try:
            line = one_error_line(runner.invoke(app, ["sweep", path, *dry, *extra]))
        finally:
            if timer:
                timer.cancel()
        assert message in line, (dry, line)
        if path != "/dev/zero" and CASES[case][0] not in ("folder", "fifo") and not extra:
            assert "g.toml" in line, line  # the grid file is named
        assert snapshot(tmp_path) == before


def test_bad_analyze_is_refused_before_any_training(tmp_path, data, monkeypatch):
    """A grid whose [analyze] cocos analyze would refuse: refused by --dry-run and by the real sweep before the
    first run trains (no Trainer built, no checkpoint or report folder), not after training every run."""
    from cocos.pipelines import sweep

    built = []

    class Recorder:
        def __init__(self, *a, **kw):
            built.append(a)
            raise AssertionError("a run was trained")

    monkeypatch.setattr(sweep, "Trainer", Recorder)
    for analyze in ('split = "bogus"\n', 'eps = "x"\n', 'batch_size = "x"\n'):
        (tmp_path / "g.toml").write_text(grid_text(data, tmp_path, analyze=analyze))
        for dry in (["--dry-run"], []):
            line = one_error_line(runner.invoke(app, ["sweep", str(tmp_path / "g.toml"), *dry]))
            assert "[analyze]" in line
        assert built == [] and not (tmp_path / "ck").exists() and not (tmp_path / "reports").exists()


def test_good_grid_plans_the_same_runs(tmp_path, data, monkeypatch):
    """The good grid expands to the runs it always did (hand-written here), the dry run prints them and their
    commands, and the run count is checked as models x losses x seeds (4 runs: refused at a bound of 3)."""
    from cocos.defaults import DEFAULT_EPS
    from cocos.pipelines import sweep

    (tmp_path / "g.toml").write_text(grid_text(data, tmp_path, analyze='split = "Val"\n'))
    grid = sweep.load_grid(tmp_path / "g.toml")
    train = {"epochs": 1, "batch_size": 8, "embed_size": 8, "word_dim": 8, "device": "cpu", "data": str(data),
             "model": "vsepp"}
    expected = [(f"vsepp_{ident}_s{seed}", {**train, "loss": loss, "params": params, "seed": seed,
                                            "out": str(tmp_path / "ck" / "g" / f"vsepp_{ident}_s{seed}")})
                for ident, loss, params in (("triplet_sh", "triplet_sh", None), ("ntxent_0.1", "ntxent",
                                                                                 {"tau": 0.1}))
                for seed in (0, 1)]
    assert [(r.name, r.train) for r in grid.runs] == expected
    assert all(r.analyze == {"batch_size": None, "split": "dev", "compat": False, "eps": DEFAULT_EPS}
               for r in grid.runs)  # "Val" is the dev split, as cocos analyze reads it
    assert [r.report for r in grid.runs] == [str(tmp_path / "reports" / "g" / name) for name, _ in expected]
    before = snapshot(tmp_path)
    res = runner.invoke(app, ["sweep", str(tmp_path / "g.toml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert [line.split(":")[0].strip() for line in res.output.splitlines() if line.endswith(": train")] == \
        [name for name, _ in expected]
    assert res.output.count("cocos train ") == 4 and res.output.count("--split dev --eps") == 4
    assert "--seed 1" in res.output and snapshot(tmp_path) == before
    monkeypatch.setattr(sweep, "MAX_RUNS", 4)
    assert len(sweep.load_grid(tmp_path / "g.toml").runs) == 4
    monkeypatch.setattr(sweep, "MAX_RUNS", 3)
    with pytest.raises(sweep.CocosError, match="expands to 4 runs"):
        sweep.load_grid(tmp_path / "g.toml")


def test_a_second_sweep_of_a_grid_is_refused_while_one_runs(tmp_path, data, monkeypatch):
    """One sweep of a grid at a time: with the grid's checkpoint folder locked by another sweep, a sweep is one
    line and trains nothing; the lock gone, it would start (its first run is reached)."""
    from cocos.io import output_lock
    from cocos.pipelines import sweep

    class Reached(Exception):
        pass

    def first_run(*a, **kw):
        raise Reached

    monkeypatch.setattr(sweep, "run_local", first_run)
    (tmp_path / "g.toml").write_text(grid_text(data, tmp_path))
    with output_lock(tmp_path / "ck" / "g"):
        line = one_error_line(runner.invoke(app, ["sweep", str(tmp_path / "g.toml")]))
    assert "another cocos process" in line and not (tmp_path / "reports").exists()
    res = runner.invoke(app, ["sweep", str(tmp_path / "g.toml")])
    assert isinstance(res.exception, Reached)
