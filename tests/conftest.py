"""Test configuration: one torch thread; PDF font subsets made once per session.

The tests use tiny tensors, for which one thread is fastest; with two threads on
a 2-core machine that also runs other work, OpenMP spin-waiting can make a tiny
training epoch ten times slower. ``OMP_NUM_THREADS=1`` makes every command run in
this process (their default thread count, ``cocos.device.default_threads``) and
every subprocess use one thread too.

A module that sets ``EMPTY_FIGURES = True`` (its tests read no figure) gets every figure written as an empty file
instead of drawn (:func:`tests.helpers.empty_figures`), its module fixtures included; figures are drawn and checked
in tests/test_report_figures.py, tests/test_figure_print.py and the tests that read them.

Two xdist workers (``-n 2 --dist loadscope``, pyproject.toml) take whole modules from one queue; the suite ends
when the later worker does. xdist's own order (most tests first) would leave the long modules of few tests, the
plugin and multi-process ones, to the end, where one of them runs alone: :data:`LONG_FIRST` (measured, longest
first) go first, the others follow in xdist's order (``--no-loadscope-reorder`` keeps this one).

Figures are most of the suite's time, and most of a PDF's time is matplotlib
subsetting the same font for the same glyphs again: :func:`tests.helpers.memoise_pdf_font_subsets`
does it once per (font, glyphs) for the session, with byte-identical files.

Also per test process: the heap frozen out of the cyclic collector's way after collection and at each module's start
(:func:`_freeze_heap`), the click command of ``cocos``'s app built once for ``CliRunner``
(:func:`_cocos_command_built_once`; both checked to change no output in tests/test_suite_speed.py), and fresh
``python -c`` processes forked from a preloaded interpreter (tests/preloaded.py).
"""

import os
import signal

os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402


def pytest_configure(config):
    """One torch thread in each process that runs tests; xdist's controller, which runs none, does not import torch
    (a second before it starts the workers)."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no":
        import torch

        torch.set_num_threads(1)


def pytest_unconfigure(config):
    """An xdist worker at its end, its report sent: everything left is frozen, so that pytest's last search for
    unraisable exceptions (five full collections of this heap, about two seconds while the run waits for the
    worker to exit) and the exit pass it by. What that search found (a ``__del__`` raising in garbage left at the
    end) would only be printed raw on the worker's stderr, outside the report; a test's own unraisable exceptions
    are still reported with it (``-n 0`` keeps the search)."""
    if hasattr(config, "workerinput"):
        import gc

        gc.freeze()


# the modules (xdist scopes) of longest run time on the 2-core machine, longest first (measured with both workers
# busy: the first about 12 s, the last about 5 s; most other modules take under 4 s)
LONG_FIRST = [
    "tests/test_distributed.py",  # a torchrun launch
    "tests/test_train_images.py",
    "tests/test_model_plugins.py",  # fresh processes, each training
    "tests/test_figure_print.py",
    "tests/test_analyze.py",
    "tests/test_html_report.py",  # Chromium
    "tests/test_vse_infty.py",
    "tests/test_demo_images.py",
    "tests/test_cnn.py",
    "tests/test_clip.py",
    "tests/test_plugins.py",  # fresh processes
    "tests/test_checkpoint_hardening.py",
    "tests/test_goal_objective.py",
    "tests/test_sweep.py",
    "tests/test_demo_clip.py",
    "tests/test_demo.py",
    "tests/test_training.py",
    "tests/test_docs.py::TestTutorial",
    "tests/test_reliability.py",
]


def _scope(nodeid: str) -> str:
    """The xdist loadscope unit of a test: its class, else its module (as xdist splits it)."""
    return nodeid.rsplit("::", 1)[0]


def _freeze_heap():
    """Everything the process holds now moved out of the cyclic collector's way, after one full collection (so
    that no garbage is frozen): Python's full collections then pass it by. Objects frozen still die by reference
    counting; only a frozen object that later becomes part of an unreachable cycle stays. The collector's
    thresholds raised (below)."""
    import gc

    gc.collect()
    gc.freeze()
    # young collections every 10,000 allocations (not 700) and a full one after 100 of the middle generation's (not
    # 10): the tests allocate fast and keep little; each module's start collects what they left (measured: a
    # worker's collector time 6.5 -> 4.8 s)
    gc.set_threshold(10_000, 10, 100)


def pytest_collection_finish(session):
    """The heap collection built (torch, transformers, matplotlib, every test module: most of the objects a worker
    ever holds) frozen: each full collection walked all of it, about 0.4 s on the 2-core machine, some 30 times per
    worker (measured: 11-13 s of a worker's run)."""
    _freeze_heap()


_last_module: list = [None]


def pytest_runtest_setup(item):
    """At the first test of each module, the previous module's fixtures gone: what the module imported lazily or
    cached for the session frozen as well (:func:`_freeze_heap`)."""
    if item.module is not _last_module[0]:
        _last_module[0] = item.module
        _freeze_heap()


def pytest_collection_modifyitems(config, items):
    """Under xdist (a worker's collection; every worker sorts the same way): the :data:`LONG_FIRST` scopes first,
    then the others by their number of tests, most first (xdist's own reordering, which this replaces); the
    tests of a scope keep their order."""
    if not hasattr(config, "workerinput"):
        return
    counts: dict[str, int] = {}
    for item in items:
        counts[_scope(item.nodeid)] = counts.get(_scope(item.nodeid), 0) + 1
    rank = {scope: i for i, scope in enumerate(LONG_FIRST)}
    order = {scope: i for i, scope in enumerate(counts)}
    items.sort(key=lambda item: (rank.get(_scope(item.nodeid), len(rank)), -counts[_scope(item.nodeid)],
                                 order[_scope(item.nodeid)]))


@pytest.fixture(scope="session", autouse=True)
def _pdf_font_subsets_once():
    from tests.helpers import memoise_pdf_font_subsets

    undo = memoise_pdf_font_subsets()
    yield
    if undo is not None:
        undo()


@pytest.fixture(autouse=True, scope="module")
def _empty_figures_where_asked(request):
    if getattr(request.module, "EMPTY_FIGURES", False):
        from tests.helpers import figures_empty

        with figures_empty():
            yield
    else:
        yield


@pytest.fixture(autouse=True, scope="session")
def _sigint_as_from_a_terminal():
    """Tests send themselves SIGINT; under nohup or a batch system pytest starts with SIGINT ignored, which the CLI
    (as Python itself) keeps ignored. The session gets a terminal's handler; its child processes start with the
    default then."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True, scope="session")
def _cocos_command_built_once():
    """``CliRunner().invoke(app, ...)`` builds the click command of the whole ``cocos`` app (every command's
    parameters from its signature and annotations) at each call: about 12 ms, some 900 times in the suite. The
    app's commands and parameters are fixed at import, so the command of :data:`cocos_cli.main.app` is built once per
    process and reused (as click's own tests reuse a command); any other app is built as before."""
    import typer.testing

    from cocos_cli.main import app

    build = getattr(typer.testing, "_get_command", None)
    if build is None:  # a typer that builds elsewhere: nothing to share
        yield
        return
    built = build(app)
    typer.testing._get_command = lambda typer_app: built if typer_app is app else build(typer_app)
    yield
    typer.testing._get_command = build
