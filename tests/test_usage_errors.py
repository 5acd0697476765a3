"""Usage errors of the console script (a value of the wrong type, an unknown option or command, a missing
argument): one ``error:`` line and exit code 2, as every other bad input; help and version as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["data", "features", "--resize", "x", "IMG"], "--resize"),
    (["count", "--eps", "x", "emb.npz"], "--eps"),
    (["report", "r", "--no-such-flag"], "--no-such-flag"),
    (["nosuch"], "nosuch"),
    (["count"], "embeddings"),
]


def _cocos(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from cocos_cli.main import run; sys.argv = ['cocos', *sys.argv[1:]]; run()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, names", CASES)
def test_a_usage_error_is_one_line(args, names, tmp_path):
    res = _cocos(*args)
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], res


def test_help_and_version_are_unchanged():
    bare, helped, version = _cocos(), _cocos("--help"), _cocos("--version")
    assert bare.returncode == helped.returncode == version.returncode == 0
    assert bare.stdout.startswith("Usage: cocos") and bare.stdout == helped.stdout
    assert version.stdout.startswith("cocos ")
