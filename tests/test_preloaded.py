"""The tests' preloaded interpreter (tests/preloaded.py): a forked child is ``python -c`` of a real interpreter —
the same exit code, output and error output for the same script — in its own process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import preloaded

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork: the real processes are used")

SCRIPTS = {
    "argv and exit code": ("import sys; print(sys.argv[1:]); sys.exit(3)", ["a", "b c"]),
    "exit with a message": ("import sys; sys.exit('bye')", []),
    "exit(None) and exit(256)": ("import sys; sys.exit(256 if len(sys.argv) > 1 else None)", ["x"]),
    "an exception": ("print('before', flush=True)\nraise ValueError('oops')", []),
    "an unhandled KeyboardInterrupt": ("raise KeyboardInterrupt", []),
    "os._exit": ("import os, sys; print('lost?'); sys.stdout.flush(); os._exit(5)", []),
    "the environment, the folder, the path": (
        "import os, sys; print(os.environ.get('COCOS_X'), os.path.basename(os.getcwd()), "
        "sys.path[0], 'module_here' in sys.modules)\nimport module_here; print(module_here.VALUE)", []),
    "stderr and stdout interleaved": ("import sys; print('out'); print('err', file=sys.stderr); print('out2')", []),
    "atexit and a thread": (
        "import atexit, threading, time\natexit.register(lambda: print('atexit'))\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\nprint('main')", []),
    "stdin": ("import sys; print(sys.stdin.read().upper())", []),
    "__main__": ("print(__name__, '__file__' in globals())", []),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_forked_child_is_what_a_real_interpreter_prints_and_exits_with(name, tmp_path):
    code, args = SCRIPTS[name]
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "module_here.py").write_text("VALUE = 42\n")  # written after the server started
    env = {**os.environ, "COCOS_X": "seen", "PYTHONPATH": str(tmp_path / "lib")}
    kw = dict(capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, input="hello\n")
    real = subprocess.run([sys.executable, "-c", code, *args], **kw)
    forked = preloaded.run([sys.executable, "-c", code, *args], **kw)
    assert isinstance(forked.returncode, int)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)


def test_a_child_is_its_own_process_killed_by_a_signal_and_waited_with_a_timeout(tmp_path):
    child = preloaded.Popen([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert isinstance(child, preloaded._Forked)
        assert int(child.stdout.readline()) == child.pid != os.getpid()
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)
        assert child.poll() is None
        child.kill()
        assert child.wait(timeout=60) == -9
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()


def test_two_children_run_at_once_and_talk_through_their_pipes(tmp_path):
    code = "import sys\nprint('ready', flush=True)\nprint(sys.stdin.readline().strip() + '!', flush=True)"
    one, two = (preloaded.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for _ in range(2))
    assert one.stdout.readline() == two.stdout.readline() == "ready\n"  # both alive together
    assert two.communicate("second\n", timeout=60)[0] == "second!\n"
    assert one.communicate("first\n", timeout=60)[0] == "first!\n"
    assert one.returncode == two.returncode == 0


def test_a_child_imports_cocos_afresh_from_a_server_that_preloaded_torch(tmp_path):
    code = "import sys; print('cocos' in sys.modules, 'torch' in sys.modules); import cocos.losses"
    forked = preloaded.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.split() == ["False", "True"]  # torch preloaded, cocos not


def test_other_commands_and_options_are_real_processes(monkeypatch):
    assert preloaded._preloadable([sys.executable, "-c", "pass"], {})
    assert not preloaded._preloadable(["bash", "-c", "true"], {})
    assert not preloaded._preloadable([sys.executable, "-m", "cocos"], {})
    assert not preloaded._preloadable([sys.executable, "-c", "pass"], {"start_new_session": True})
    monkeypatch.setenv("COCOS_TEST_REAL_PROCESSES", "1")
    assert not preloaded._preloadable([sys.executable, "-c", "pass"], {})
    real = preloaded.Popen([sys.executable, "-c", "pass"])
    assert type(real) is subprocess.Popen and real.wait(timeout=120) == 0


def test_a_stand_in_for_a_launcher_passes_its_descriptors_exit_code_and_signals(tmp_path):
    code = "import os, sys; print(sys.argv[1:], os.environ['RANK'], flush=True); sys.exit(4)"
    stand_in = preloaded.command(code)
    assert stand_in[:2] == [sys.executable, "-c"] and len(stand_in) == 5  # the stand-in, the server, the code
    res = subprocess.run([*stand_in, "x"], capture_output=True, text=True, timeout=120, env={**os.environ, "RANK": "1"})
    assert (res.returncode, res.stdout) == (4, "['x'] 1\n")
    sleeper = subprocess.Popen(preloaded.command("import time; print('up', flush=True); time.sleep(60)"),
                               stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline() == "up\n"
        sleeper.terminate()  # SIGTERM to the stand-in: the child dies of it, and so does the stand-in
        assert sleeper.wait(timeout=60) == -15
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.stdout.close()


def test_a_child_compiles_the_projects_sources_only_where_they_changed():
    """Without a current .pyc (PYTHONDONTWRITEBYTECODE) the server's compilation of a project file serves the
    children, for those very bytes only; other bytes are compiled as the interpreter would."""
    code = """
import importlib.machinery, importlib.util, sys
import cocos.io as module
path = module.__file__
loader = importlib.machinery.SourceFileLoader("x", path)
data = open(path, "rb").read()
first, again = loader.source_to_code(data, path), loader.source_to_code(data, path)
changed = loader.source_to_code(data + b"\\nCHANGED = 1\\n", path)
print(first is again, "CHANGED" in first.co_names, "CHANGED" in changed.co_names, changed is first)
"""
    res = preloaded.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    same, *rest = res.stdout.split()
    assert rest == ["False", "True", "False"]  # the changed bytes compiled afresh
    assert same == str(not _current_pyc(preloaded.ROOT / "cocos" / "io.py"))  # one compilation, unless a .pyc is


def _current_pyc(path) -> bool:
    """Whether the interpreter would read ``path``'s .pyc (its header names the source's mtime and size)."""
    import importlib.util

    try:
        head = open(importlib.util.cache_from_source(str(path)), "rb").read(16)
    except OSError:
        return False
    stat = os.stat(path)
    return (head[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(head[4:8], "little") == 0
            and int.from_bytes(head[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(head[12:16], "little") == stat.st_size & 0xFFFFFFFF)
