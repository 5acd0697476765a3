"""The test suite's own speed-ups change no output: PDFs with memoised font subsets (as every test of the session
has them, tests/conftest.py) are byte-identical to the PDFs matplotlib writes without them."""

from __future__ import annotations

import io

import numpy as np


def _pdf(labels: tuple[str, str]) -> bytes:
    from cocos.report import style

    with style.paper_style():
        fig = style.figure(1.5)
        ax = fig.subplots()
        ax.plot(np.arange(5), np.arange(5) ** 2, marker="o", label=labels[0])
        ax.set_xlabel(labels[1])
        ax.legend()
        out = io.BytesIO()
        fig.savefig(out, format="pdf", metadata={"Creator": "t", "Producer": "t", "CreationDate": None})
        return out.getvalue()


def _unwrapped(function):
    while hasattr(function, "original"):
        function = function.original
    return function


def test_memoised_font_subsets_give_the_same_pdf_bytes():
    from matplotlib.backends import _backend_pdf_ps as pdfps

    from tests.helpers import memoise_pdf_font_subsets

    first, second = ("Triplet $C^q$", "$\\epsilon$"), ("SmoothAP", "rsum (%)")  # two glyph sets
    session = pdfps.get_glyphs_subset, pdfps.font_as_file
    try:
        pdfps.get_glyphs_subset, pdfps.font_as_file = _unwrapped(session[0]), _unwrapped(session[1])
        plain = [_pdf(first), _pdf(second)]  # matplotlib's own subsetting
        assert memoise_pdf_font_subsets() is not None
        cached = [_pdf(first), _pdf(second), _pdf(first)]  # the third one's subsets from the memo
        memo = pdfps.get_glyphs_subset.cache
    finally:
        pdfps.get_glyphs_subset, pdfps.font_as_file = session
    assert plain[0] != plain[1]  # the two glyph sets give different files
    assert cached == [plain[0], plain[1], plain[0]]
    assert 2 <= len(memo) <= 4  # one subset per font and glyph set: the third PDF made none


def test_the_cocos_command_built_once_answers_as_one_built_for_each_call(tmp_path, monkeypatch):
    """tests/conftest.py builds the click command of ``cocos_cli.main.app`` once per process for ``CliRunner``: its
    answers are those of a command built for the call."""
    import typer.main
    import typer.testing

    from cocos_cli.main import app

    runner = typer.testing.CliRunner()
    assert typer.testing._get_command(app) is typer.testing._get_command(app)  # shared
    commands = (["--help"], ["losses"], ["count", "--help"], ["count", "--no-such-flag"],
                ["analyze", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "out")])
    shared = [runner.invoke(app, args) for args in commands]
    monkeypatch.setattr(typer.testing, "_get_command", typer.main.get_command)  # typer's own: built at each call
    assert typer.testing._get_command(app) is not typer.testing._get_command(app)
    built = [runner.invoke(app, args) for args in commands]
    for args, a, b in zip(commands, shared, built, strict=True):
        assert (a.exit_code, a.output) == (b.exit_code, b.output), args
    assert {a.exit_code for a in shared} == {0, 2}
