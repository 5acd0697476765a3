"""Packaging and docs: the CLI installs as cocos_cli, --help needs no torch, README links resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [[], ["count"], ["analyze"], ["report"], ["train"], ["evaluate"], ["diagram"], ["demo"], ["losses"],
            ["data", "synth"], ["data", "info"]]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_no_top_level_cli_module_outside_the_repo(tmp_path):
    res = _python("import cli", tmp_path)
    assert res.returncode != 0 and "No module named 'cli'" in res.stderr
    res = _python("import cocos_cli.main, pathlib; print(pathlib.Path(cocos_cli.__file__).parent.name)", tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "cli"  # the top-level folder cli/, installed as the package cocos_cli


def test_every_help_answers_without_importing_torch(tmp_path):
    code = (f"import sys\nfrom cocos_cli.main import app\nfor args in {COMMANDS!r}:\n"
            "    try:\n        app(args + ['--help'])\n    except SystemExit as e:\n"
            "        assert e.code in (0, None), (args, e.code)\n"
            "print('torch' in sys.modules, 'pandas' in sys.modules)")
    res = _python(code, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "False False"


def test_readme_links_resolve_in_the_repository():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert local, "the README links to files of the repository"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
    for doc in ("docs/definitions.md", "cocos/results/SCHEMA.md"):
        assert doc in text


@pytest.mark.parametrize("doc", ["docs/definitions.md"])
def test_definitions_file_is_in_the_repo_and_cited_by_the_code(doc):
    assert (ROOT / doc).is_file()
    cited = subprocess.run(["grep", "-rl", "definitions file", str(ROOT / "cocos")], capture_output=True, text=True)
    assert cited.stdout.strip()
    assert "docs/definitions.md" in (ROOT / "cocos" / "__init__.py").read_text()


def test_readme_python_examples_run_and_give_meaningful_values():
    from cocos.objectives import unregister

    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) >= 2
    ns: dict = {}
    try:
        for block in blocks:
            exec(block, ns)  # noqa: S102  (the README's own examples)
    finally:
        unregister("sqhinge")
    smooth = ns["count_batch"](ns["images"][:128], ns["captions"][:640], "smoothap")["t2i"]
    assert smooth["C_q"] > 0 and 0 < smooth["C_0"] < 640  # not NaN and zeros
    stats = ns["run"].stats()
    assert stats["my_loss"]["i2t"]["C_q"]["mean"] > 0 and stats["triplet"]["i2t"]["C_q"]["mean"] > 1
    s = ns["s"]
    assert not s[s.stat == "C_q"]["mean"].isna().any()


def test_cocos_demo_writes_only_where_git_ignores():
    """A rerun of ``cocos demo`` must not dirty a clone: its default folders are ignored, the example is elsewhere."""
    from cocos.pipelines.demo import DemoConfig

    cfg = DemoConfig()
    ignored = subprocess.run(["git", "check-ignore", cfg.out + "/x", cfg.data + "/x", cfg.checkpoints + "/x/last.pt"],
                             cwd=ROOT, capture_output=True, text=True)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.stdout.split() == [cfg.out + "/x", cfg.data + "/x", cfg.checkpoints + "/x/last.pt"]
    assert (ROOT / "reports" / "example" / "README.md").is_file() and not cfg.out.startswith("reports/example")
