"""Test configuration: one torch thread; PDF font subsets made once per session.

The tests use tiny tensors, for which one thread is fastest; with two threads on
a 2-core machine that also runs other work, OpenMP spin-waiting can make a tiny
training epoch ten times slower. ``OMP_NUM_THREADS=1`` makes every command run in
this process (their default thread count, ``cocos.device.default_threads``) and
every subprocess use one thread too.

Figures are most of the suite's time, and most of a PDF's time is matplotlib
subsetting the same font for the same glyphs again: :func:`tests.helpers.memoise_pdf_font_subsets`
does it once per (font, glyphs) for the session, with byte-identical files.
"""

import os
import signal

os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _pdf_font_subsets_once():
    from tests.helpers import memoise_pdf_font_subsets

    undo = memoise_pdf_font_subsets()
    yield
    if undo is not None:
        undo()


@pytest.fixture(autouse=True, scope="session")
def _sigint_as_from_a_terminal():
    """Tests send themselves SIGINT; under nohup or a batch system pytest starts with SIGINT ignored, which the CLI
    (as Python itself) keeps ignored. The session gets a terminal's handler; its child processes start with the
    default then."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
