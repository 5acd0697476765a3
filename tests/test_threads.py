"""The torch thread count of a command: the default against a mocked affinity, and ``--threads`` on every command."""

from __future__ import annotations

import os

import pytest
import torch
import typer
from typer.testing import CliRunner

from cocos import device


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_default_is_the_affinity_unless_omp_num_threads_says_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert device.available_cores() == 3
    assert device.default_threads() == 3  # the affinity, not the machine's 64 cores
    for ignored in ("", "0", "-2", "two", "1.5"):
        monkeypatch.setenv("OMP_NUM_THREADS", ignored)
        assert device.default_threads() == 3, ignored
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert device.default_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # no affinity (macOS, Windows): the cpu count
    assert device.default_threads() == 64
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert device.default_threads() == 1


def test_set_threads_sets_torch_and_refuses_zero(monkeypatch, restore_threads):
    from cocos.errors import CocosError

    torch.set_num_threads(1)
    assert device.set_threads(2) == 2 and torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert device.set_threads(None) == 1 and torch.get_num_threads() == 1
    with pytest.raises(CocosError, match="at least 1"):
        device.set_threads(0)


def _commands(group, prefix: str = ""):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer's own, not necessarily click.Group)
            yield from _commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def test_every_command_has_threads():
    from cocos_cli.main import app

    commands = dict(_commands(typer.main.get_command(app)))
    assert {"count", "analyze", "train", "evaluate", "data synth", "demo", "sweep", "losses"} <= set(commands)
    missing = [name for name, cmd in commands.items() if not any("--threads" in p.opts for p in cmd.params)]
    assert not missing


def test_threads_reach_torch_while_the_command_runs(monkeypatch, restore_threads):
    """``cocos losses`` records torch's thread count from inside the command: ``--threads`` and the default."""
    from cocos.losses import spec as spec_module
    from cocos_cli.main import app

    seen = []
    format_value = spec_module.format_value
    monkeypatch.setattr(spec_module, "format_value", lambda v: (seen.append(torch.get_num_threads()), format_value(v))[1])
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(3)
    runner = CliRunner()
    res = runner.invoke(app, ["losses", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert seen and set(seen) == {1}
    seen.clear()
    res = runner.invoke(app, ["losses"])  # the default: OMP_NUM_THREADS here
    assert res.exit_code == 0, res.output
    assert seen and set(seen) == {2}
    res = runner.invoke(app, ["losses", "--threads", "0"])
    assert res.exit_code == 2
