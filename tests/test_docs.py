"""The documentation: the MkDocs site builds with ``--strict``, and the README's and the tutorial pages' examples
print what the pages say they print.

The convention of a tested page (``TESTED``), in the order the page shows its blocks, in one fresh folder and one
Python namespace per page:

* a ```` ```python ```` block runs; what it prints must equal the ```` ```text ```` block right after it (a block
  with no ```` ```text ```` after it must print nothing);
* a ```` ```console ```` block holds commands (``$ cocos ...``, a trailing ``\\`` continues a line) each followed
  by its output; every command must exit 0, and its standard output must equal the lines shown. The page's first
  ``cocos`` command, and every command with shell syntax, runs in a shell with the installed ``cocos`` script; the
  page's other plain ``cocos ARGS`` commands run the script's app in this process (CliRunner), the same command
  line without a fresh interpreter importing torch again (about 3 s a command);
* a ```` ```bash ```` block runs whole and must exit 0;
* ``<!-- skip-test: why -->`` on the line before a block skips it (installs, the 4-minute demo): a reason is
  required, and skips are few (``MAX_SKIPS``).

Outputs compare as doctest does with ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE``: ``...`` stands for any text
(timings, speeds, a trained model's numbers), runs of whitespace are one space.

Every ``cocos`` command in a ```` ```bash ```` or ```` ```console ```` block of every page, skipped or not, must
parse against the real command line (the command exists, its options do), so a renamed option breaks the test.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import empty_figures

ROOT = Path(__file__).resolve().parents[1]
TESTED = ["README.md", "docs/getting-started.md", "docs/python-api.md", "docs/plugins.md"]
MAX_SKIPS = 6  # over all tested pages: the two install commands, the demo, and few more
FENCE = re.compile(
    r"^(?:<!--\s*skip-test(?P<skip>[^>]*)-->[ \t]*\n)?(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    lang: str
    body: str
    line: int
    skip: str | None  # the reason, "" when the marker has none; None when the block runs


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        indent = len(m["indent"])
        body = "".join(line[indent:] + "\n" for line in m["body"].splitlines())
        skip = None if m["skip"] is None else m["skip"].strip().lstrip(":").strip()
        out.append(Block(m["lang"], body, text.count("\n", 0, m.start("body")), skip))
    return out


def same(want: str, got: str) -> bool:
    return CHECKER.check_output(want, got, FLAGS)


def commands(block: Block) -> list[tuple[str, str]]:
    """A console block's (command, expected output) pairs."""
    pairs: list[list[str]] = []
    lines = block.body.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            cmd = lines[i][2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            pairs.append([cmd, ""])
        elif pairs:
            pairs[-1][1] += lines[i] + "\n"
        else:
            raise AssertionError(f"line {block.line + i + 1}: output before any $ command")
        i += 1
    return [(c, o) for c, o in pairs]


def script_env() -> dict[str, str]:
    """The environment of the pages' commands: the ``cocos`` script of this Python first on PATH, plain output."""
    env = dict(os.environ, NO_COLOR="1", TERM="dumb", COLUMNS="100", PYTHONWARNINGS="ignore")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_python(block: Block, output: Block | None, ns: dict, where: str) -> None:
    """A python block in the page's namespace; it prints the ``text`` block after it, or nothing."""
    want = output.body if output is not None and output.lang == "text" else ""
    got = io.StringIO()
    with contextlib.redirect_stdout(got):
        exec(compile(block.body, where, "exec"), ns)  # noqa: S102  (the page's own example)
    assert same(want, got.getvalue()), f"{where}: printed\n{got.getvalue()}\ninstead of\n{want}"


def plain_cocos(cmd: str) -> list[str] | None:
    """The arguments of a ``cocos ARGS`` command with no shell syntax (pipes, redirections, variables, globs, quotes
    that a shell would treat otherwise), else ``None``."""
    if any(c in cmd for c in "|&;<>$`*?~(){}[]\\'\"#"):
        return None
    tokens = cmd.split()
    return tokens[1:] if tokens and tokens[0] == "cocos" else None


def run_console(block: Block, env: dict, where: str, shelled: set | None = None) -> None:
    """Each ``$`` command of a console block: exit 0 and the output shown. ``shelled``: the page's state, empty
    until its first ``cocos`` command has run in a shell (see the module doc)."""
    from typer.testing import CliRunner

    from cocos_cli.main import app

    shelled = set() if shelled is None else shelled
    for cmd, want in commands(block):
        argv = plain_cocos(cmd)
        if argv is not None and "cocos" in shelled:
            res = CliRunner().invoke(app, argv, env={k: env[k] for k in ("NO_COLOR", "TERM", "COLUMNS")})
            assert res.exit_code == 0, f"{where}: $ {cmd}\nexit {res.exit_code}\n{res.output}{res.exception!r}"
            assert same(want, res.stdout), f"{where}: $ {cmd}\nprinted\n{res.stdout}\ninstead of\n{want}"
            continue
        res = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, f"{where}: $ {cmd}\nexit {res.returncode}\n{res.stdout}{res.stderr}"
        assert same(want, res.stdout), f"{where}: $ {cmd}\nprinted\n{res.stdout}\ninstead of\n{want}"
        if argv is not None:
            shelled.add("cocos")


def run_bash(block: Block, env: dict, where: str) -> None:
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block.body], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, f"{where}: exit {res.returncode}\n{res.stdout}{res.stderr}"


def run_page(page: str, folder: Path) -> None:
    """Run every block of a tested page in ``folder``, one namespace, and compare outputs (see the module doc)."""
    from cocos import objectives

    registered = set(objectives.names())
    ns: dict = {"__name__": "__docs__"}
    items = blocks(ROOT / page)
    env = script_env()
    shelled: set = set()  # the page's first cocos command runs in a shell (run_console)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for i, block in enumerate(items):
            where = f"{page}:{block.line + 1}"
            if block.skip is not None:
                continue
            if block.lang == "python":
                run_python(block, items[i + 1] if i + 1 < len(items) else None, ns, where)
            elif block.lang == "console":
                run_console(block, env, where, shelled)
            elif block.lang in ("bash", "sh"):
                run_bash(block, env, where)
    finally:
        os.chdir(cwd)
        for name in set(objectives.names()) - registered:  # a page that registers a loss family
            objectives.unregister(name)


# -- the site ------------------------------------------------------------------------------------------------------


def test_site_builds_strict_and_offline(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed: pip install -e '.[docs]'")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "WARNING" not in res.stderr
    # the API reference is rendered from the docstrings, the included files are in, the figures come along
    counting = (site / "reference" / "counting" / "index.html").read_text(encoding="utf-8")
    assert "count_embeddings" in counting and "EmbeddingSet" in counting
    assert "COCOS statistics of one batch, both directions." in counting  # count_batch's docstring
    assert "cocos-results" in (site / "results-schema" / "index.html").read_text(encoding="utf-8")
    png = ROOT / "reports" / "example" / "summary" / "cocos_vs_rsum.png"
    assert (site / "repo" / "reports" / "example" / "summary" / "cocos_vs_rsum.png").read_bytes() == png.read_bytes()


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert "definitions.md" in pages and "model-families.md" in pages
    assert [p for p in pages if f": {p}" not in nav] == []


# -- the examples --------------------------------------------------------------------------------------------------


def test_fence_parser_on_a_known_page(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("x\n<!-- skip-test: slow -->\n```bash\ncocos demo\n```\n\n```python\nprint(1)\n```\n"
                    "```text\n1\n```\n  ```console\n  $ cocos a \\\n    --b 1\n  out\n  ```\n")
    got = blocks(page)
    assert [(b.lang, b.skip) for b in got] == [("bash", "slow"), ("python", None), ("text", None), ("console", None)]
    assert got[0].body == "cocos demo\n" and got[0].line == 3
    assert commands(got[3]) == [("cocos a  --b 1", "out\n")]
    assert same("wrote x (... s)\n", "wrote x (0.1 s)\n") and not same("C_q 1.00\n", "C_q 1.01\n")


@pytest.mark.parametrize("page", TESTED)
def test_skips_are_few_and_say_why(page):
    skipped = [b for p in TESTED for b in blocks(ROOT / p) if b.skip is not None]
    assert len(skipped) <= MAX_SKIPS
    assert all(b.skip for b in blocks(ROOT / page) if b.skip is not None), f"{page}: a skip-test without a reason"
    assert any(b.skip is None and b.lang in ("python", "console") for b in blocks(ROOT / page)), page


class TestReadme:  # classes: pytest-xdist's loadscope gives the slow pages to different workers
    def test_readme_examples_print_what_it_says(self, tmp_path, monkeypatch):
        empty_figures(monkeypatch)  # the commands run in this process write their figures as empty files: the
        run_page("README.md", tmp_path)  # pages show what commands print (drawing: tests/test_report_figures.py)

    def test_readme_is_short_with_the_two_fresh_machine_commands(self):
        text = (ROOT / "README.md").read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 250
        section = text.split("## On a fresh machine", 1)[1].split("\n## ", 1)[0]
        fresh = [b.body.strip() for b in blocks(ROOT / "README.md") if b.lang == "bash" and b.body.strip() in section]
        assert fresh == ["pip install -e . && cocos demo", "pip install -e '.[test]' && python -m pytest -q"]
        ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
        assert ci[-1] == fresh[1]  # CI runs exactly the README's test command

    def test_readme_demo_table_is_the_docs_one(self):
        def rows(text):
            return re.findall(r"^\| (?:Triplet|NT-Xent|SmoothAP).*\|$", text, re.M)

        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        demo = readme.split("## What the demo shows", 1)[1].split("\n## ", 1)[0]  # the section of the VSE++ demo
        assert len(rows(demo)) == 4 and rows(demo) == rows((ROOT / "docs" / "analysis.md").read_text(encoding="utf-8"))


class TestTutorial:
    def test_getting_started_prints_what_it_says(self, tmp_path, monkeypatch):
        empty_figures(monkeypatch)  # as in TestReadme
        run_page("docs/getting-started.md", tmp_path)

    @pytest.mark.parametrize("page", ["docs/python-api.md", "docs/plugins.md"])
    def test_api_pages_print_what_they_say(self, page, tmp_path):
        run_page(page, tmp_path)


# -- every command on every page exists ---------------------------------------------------------------------------


def cocos_argv(block: Block) -> list[list[str]]:
    """The arguments of every ``cocos`` command of a bash or console block (``torchrun ... cocos`` included)."""
    if block.lang == "console":
        lines = [cmd for cmd, _ in commands(block)]
    else:
        lines = re.sub(r"\\\n\s*", " ", block.body).splitlines()
    out = []
    for line in lines:
        tokens = shlex.split(line, comments=True)
        if "cocos" in tokens:
            args = tokens[tokens.index("cocos") + 1:]
            cut = [i for i, t in enumerate(args) if t in ("&&", "||", "|", ";", ">", "2>&1")]
            out.append(args[: cut[0]] if cut else args)
    return out


class Drift(Exception):
    """A command of the docs that the real command line refuses."""


def parse(argv: list[str]) -> None:
    """Parse ``cocos ARGV`` with the real command line, without running it (typer vendors its own click: its
    classes are told apart by their methods and names)."""
    from typer.main import get_command

    from cocos_cli.main import app

    try:
        ctx = get_command(app).make_context("cocos", list(argv))
        while hasattr(ctx.command, "resolve_command"):  # a group: on to the subcommand
            _, sub, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
            ctx = sub.make_context(sub.name, rest, parent=ctx)
    except Exception as exc:
        if any(c.__name__ == "UsageError" for c in type(exc).__mro__):
            raise Drift(f"cocos {' '.join(argv)}: {exc}") from exc
        raise
    # the commands with loss flags (train, count, ...) take options they do not declare: a loss parameter's
    unknown = [a[2:].split("=")[0].replace("-", "_") for a in ctx.args if a.startswith("--")]
    if unknown:
        from cocos.models.registry import families
        from cocos.objectives import get_objective, names

        known = {k for n in names() for k in get_objective(n).defaults} | {"eps"}
        known |= {k for f in families() for k in f.defaults}  # a model family's own flags (--freeze, --region-drop)
        flags = {k.removeprefix("no_") for k in unknown} - known
        if flags:
            raise Drift(f"cocos {' '.join(argv)}: no such option or loss parameter {sorted(flags)}")


def test_parse_rejects_a_drifted_command():
    parse(["count", "emb.npz", "--loss", "triplet_sh", "--no-progress"])
    with pytest.raises(Drift):
        parse(["count", "emb.npz", "--no-such-option"])
    with pytest.raises(Drift):
        parse(["no-such-command"])
    with pytest.raises(Drift):
        parse(["data", "synth", "out", "--n-images", "5"])
    parse(["train", "--data", "d", "--loss", "goal", "--triplet-weight", "cir", "--tau", "10", "--out", "o"])


@pytest.mark.parametrize("page", ["README.md"] + sorted(p.relative_to(ROOT).as_posix()
                                                          for p in (ROOT / "docs").rglob("*.md")))
def test_every_cocos_command_on_the_page_parses(page):
    argvs = [argv for b in blocks(ROOT / page) if b.lang in ("bash", "console", "sh") for argv in cocos_argv(b)]
    for argv in argvs:
        parse(argv)
