"""OpenMP's wait policy (cocos.openmp): chosen from the load and the command before torch loads, never the
thread count, and a user's own setting kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cocos import openmp


@pytest.mark.parametrize("command", ["train", "count", "analyze", "demo"])
@pytest.mark.parametrize("others", [1, 8])
def test_beside_other_work_every_command_waits_passively(command, others, monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: others)
    monkeypatch.setattr(openmp, "cores", lambda: 2)
    env = {"PATH": "/bin"}
    assert openmp.configure(command, env) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("cores, threads, others, passive", [
    (16, None, 1, True),  # every core in use by default: one more process oversubscribes
    (16, 4, 12, False), (16, 4, 13, True),  # 4 threads fit beside 12 others on 16 cores, not beside 13
    (2, 1, 1, False), (2, 1, 2, True),
])
def test_passive_only_when_the_free_cores_do_not_cover_the_threads(cores, threads, others, passive, monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: others)
    monkeypatch.setattr(openmp, "cores", lambda: cores)
    env = {} if threads is None else {"OMP_NUM_THREADS": str(threads)}
    assert ("OMP_WAIT_POLICY" in openmp.configure("count", env)) is passive
    from cocos_cli.main import configure_process  # --threads N counts as the command's threads too

    monkeypatch.setattr("os.environ", {})
    assert ("OMP_WAIT_POLICY" in configure_process(["count", "x", *(["--threads", str(threads)] if threads else
                                                                   [])])) is passive


@pytest.mark.parametrize("command, expected", [("train", {"GOMP_SPINCOUNT": "1000"}), ("data", {"GOMP_SPINCOUNT":
                                               "1000"}), ("count", {}), ("analyze", {})])
def test_on_an_idle_machine_long_commands_spin_briefly_short_ones_as_openmp_does(command, expected, monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: 0)
    env = {}
    assert openmp.configure(command, env) == expected and env == expected


@pytest.mark.parametrize("user", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "100"}])
def test_a_users_own_wait_setting_is_kept(user, monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: 8)
    env = dict(user)
    assert openmp.configure("train", env) == {} and env == user


def test_no_command_reads_and_sets_nothing(monkeypatch):
    monkeypatch.setattr(openmp, "other_runnable", lambda: pytest.fail("read without a command"))
    env = {}
    assert openmp.configure(None, env) == {} and env == {}


def test_the_runnable_count_is_a_median_and_leaves_out_the_reader(tmp_path, monkeypatch):
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
    """Beside a busy process (started here), ``cocos train`` gets the passive policy, and torch is not loaded yet
    when it is set (libgomp reads it once, when torch loads)."""
    code = ("import os, sys; from cocos_cli.main import configure_process; "
            "print('torch' in sys.modules, configure_process(['train', '--threads', '1']).get('OMP_WAIT_POLICY'), "
            "os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k not in openmp.USER_VARIABLES}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert out.stdout.split() == ["False", "PASSIVE", "PASSIVE"]
