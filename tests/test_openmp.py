"""OpenMP's wait policy (cocos.openmp): chosen from the command and the load before torch loads, never the
thread count, and a user's own setting kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cocos import openmp


@pytest.mark.parametrize("command", sorted(openmp.LONG_COMMANDS))
def test_long_commands_wait_passively_whatever_the_load(command, monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: pytest.fail("a long command reads no load"))
    env = {}
    assert openmp.configure(command, env) == "PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("others, expected", [(0, None), (1, "PASSIVE"), (8, "PASSIVE")])
def test_short_commands_spin_only_on_an_idle_machine(others, expected, monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: others)
    env = {"PATH": "/bin"}
    assert openmp.configure("count", env) == expected
    assert env.get("OMP_WAIT_POLICY") == expected and env["PATH"] == "/bin"


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "100"}])
def test_a_users_own_wait_setting_is_kept(user, monkeypatch):
    env = dict(user)
    openmp.configure("train", env)
    assert env == user


def test_the_runnable_count_leaves_out_the_reader(tmp_path, monkeypatch):
    readings = iter(["0.5 0.4 0.3 3/100 7\n", "0.5 0.4 0.3 1/100 7\n", "0.5 0.4 0.3 2/100 7\n"])
    real_open = open

    def fake_open(path, *a, **kw):
        if path == "/proc/loadavg":
            f = tmp_path / "loadavg"
            f.write_text(next(readings))
            return real_open(f, *a, **kw)
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", fake_open)
    assert openmp.other_runnable(samples=3, interval=0) == 1  # median 2, less this process


def test_the_console_script_sets_the_policy_before_torch_loads():
    code = ("import os, sys; from cocos_cli.main import configure_process; "
            "print('torch' in sys.modules, configure_process(['train', '--threads', '1']), "
            "os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in openmp.USER_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False", "PASSIVE", "PASSIVE"]
