"""Fresh processes for the tests, started from a preloaded interpreter: ``python -c CODE ARGS`` without its imports.

A test that runs cocos in a fresh process (a plugin on the path, a limit on the address space, a second writer, a
rank of a process group) used to pay a whole interpreter start for it: torch, numpy, pandas and matplotlib imported
again, about 2 s of CPU each on the 2-core machine. :func:`run` and :func:`Popen` are drop-ins for
:func:`subprocess.run` and :class:`subprocess.Popen` of ``[sys.executable, "-c", code, *args]``: the process is
forked from a server that imported those libraries once (one server per test process, started at first use), and
runs ``code`` as ``python -c`` would, in a new process with its own pid, file descriptors, working directory,
environment, ``sys.argv`` and ``sys.path`` (``PYTHONPATH`` of its environment first), with cocos and the tests'
modules imported afresh (the server never imports them), exit codes as the interpreter's (``SystemExit``, an
exception's traceback and 1, an unhandled ``KeyboardInterrupt`` as death by SIGINT, -N for a signal), non-daemon
threads joined and ``atexit`` functions run at exit. Where the project's own sources have no current ``.pyc``
(``PYTHONDONTWRITEBYTECODE``, a fresh clone), the server compiles them once and a child's loader takes that code for
the very same bytes, compiling anything else itself (nothing is written).

What a fork cannot give a fresh interpreter is left to real processes: a test about what an interpreter imports (or
not) at start, about startup itself, or about signals before the interpreter runs uses :mod:`subprocess`. Children
share the server's hash seed and numpy's global random state (the tests seed what they draw). Anything else (other
executables, ``preexec_fn``, new sessions, passed descriptors) and ``COCOS_TEST_REAL_PROCESSES=1`` fall back to
:mod:`subprocess`, as does a platform without ``fork`` or descriptor passing.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ("numpy", "torch", "pandas", "matplotlib", "matplotlib.figure", "seaborn", "typer")
_STATUS = struct.Struct("q")

SERVER = textwrap.dedent("""
    import gc, importlib, importlib.util, json, os, selectors, signal, socket, struct, sys

    for name in sys.argv[2:]:
        importlib.import_module(name)
    CODE = {}  # the project's sources without a current .pyc (PYTHONDONTWRITEBYTECODE): compiled once, here
    for root in filter(None, os.environ.pop("COCOS_PRELOADED_SOURCES", "").split(os.pathsep)):
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    try:
                        with open(path, "rb") as f:
                            source = f.read()
                        with open(importlib.util.cache_from_source(path), "rb") as f:
                            head = f.read(16)
                        st = os.stat(path)
                        if head == (importlib.util.MAGIC_NUMBER + bytes(4) + (int(st.st_mtime) & 0xFFFFFFFF)
                                    .to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")):
                            continue  # the interpreter reads its .pyc
                    except OSError:
                        pass
                    try:
                        CODE[path] = (source, compile(source, path, "exec", dont_inherit=True))
                    except (SyntaxError, ValueError):
                        pass
    gc.collect()
    gc.freeze()  # the children do not copy these pages by collecting them
    STATUS = struct.Struct("q")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[1])
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the run reaches the children, not their server
    signal.set_wakeup_fd(wake_w)
    BASE_PATH = list(sys.path)
    children = {}  # pid -> connection that waits for its status
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "client")  # the test process gone: stop
    print("ready", flush=True)


    def child(request, fds, conn):
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for closing in (listener, conn, *children.values()):
            closing.close()
        os.close(wake_r)
        os.close(wake_w)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        from tests_preloaded_child import main  # noqa: the child's runner, imported in the child only
        main(request, BASE_PATH, CODE)


    while True:
        for key, _ in selector.select():
            if key.data == "client":
                sys.exit(0)
            if key.data == "request":
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                request = json.loads(message)
                pid = os.fork()
                if pid == 0:
                    try:
                        child(request, fds, conn)
                    finally:
                        os._exit(70)  # never back into this loop
                for fd in fds:
                    os.close(fd)
                conn.sendall(STATUS.pack(pid))
                children[pid] = conn
            else:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                while children:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(STATUS.pack(os.waitstatus_to_exitcode(status)))
                        except OSError:  # the test stopped waiting
                            pass
                        conn.close()
""")

CHILD = textwrap.dedent('''
    """The child of the tests' preloaded interpreter: ``python -c`` of a request (tests/preloaded.py)."""
    import atexit, builtins, importlib, io, os, signal, sys, threading, traceback, types


    def _streams(env):
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        encoding = env.get("PYTHONIOENCODING", "").split(":")[0] or sys.stdout.encoding

        def out(fd, errors, line):
            raw = io.FileIO(fd, "w", closefd=False)
            if unbuffered:
                return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)
            return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors=errors, line_buffering=line)

        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                     encoding=encoding)
        sys.stdout = sys.__stdout__ = out(1, "strict", False)
        sys.stderr = sys.__stderr__ = out(2, "backslashreplace", True)


    def _code(exc):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1


    def _compiled(code):
        """The loader's compile of a source, from the server's compilations of the same bytes where it has one."""
        from importlib.machinery import SourceFileLoader

        original = SourceFileLoader.source_to_code

        def source_to_code(self, data, path, *, _optimize=-1):
            hit = code.get(path)
            if hit is not None and _optimize == -1 and hit[0] == data:
                return hit[1]
            return original(self, data, path, _optimize=_optimize)

        SourceFileLoader.source_to_code = source_to_code


    def main(request, base_path, code):
        _compiled(code)
        env = request["env"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["-c", *request["args"]]
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        here = os.path.dirname(os.path.abspath(__file__))  # this runner's folder: not the child's
        sys.path[:] = [base_path[0], *extra, *(p for p in base_path[1:] if os.path.abspath(p) != here)]
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        sys.modules.pop("tests_preloaded_child", None)
        _streams(env)
        module = types.ModuleType("__main__")
        module.__builtins__ = builtins
        sys.modules["__main__"] = module
        interrupted = False
        try:
            exec(compile(request["code"], "<string>", "exec"), module.__dict__)
            code = 0
        except SystemExit as exc:
            code = _code(exc)
        except KeyboardInterrupt as exc:
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the code's frame on
            code, interrupted = 1, True
        except BaseException as exc:
            traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
            code = 1
        try:
            threading._shutdown()
            atexit._run_exitfuncs()
        except SystemExit as exc:
            code = _code(exc)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)
''')


PROXY = textwrap.dedent("""
    import json, os, signal, socket, struct, sys
    address, code, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(address)
    request = {"code": code, "args": args, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    pid = struct.unpack("q", conn.recv(8))[0]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _: os.kill(pid, number))  # to the child, as to the process it stands for
    status = conn.recv(8)
    code = struct.unpack("q", status)[0] if len(status) == 8 else 1
    if code < 0:  # killed by a signal: so is its stand-in
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)
""")


class _Server:
    """The preloaded interpreter of this process: a listening socket in a temporary folder."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="cocos-preloaded-")
        self.address = os.path.join(self.folder, "socket")
        with open(os.path.join(self.folder, "tests_preloaded_child.py"), "w") as f:
            f.write(CHILD)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = self.folder  # the child's runner; each child's sys.path is its own request's
        env["COCOS_PRELOADED_SOURCES"] = os.pathsep.join(str(ROOT / d) for d in ("cocos", "cli", "tests"))
        self.process = subprocess.Popen([sys.executable, "-c", SERVER, self.address, *PRELOAD], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the tests' preloaded interpreter did not start ({self.process.poll()})")
        atexit.register(self.close)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for name in ("socket", "tests_preloaded_child.py"):
            try:
                os.unlink(os.path.join(self.folder, name))
            except OSError:
                pass
        try:
            os.rmdir(self.folder)
        except OSError:
            pass


_server: list[_Server] = []


def _the_server() -> _Server:
    if not _server or _server[0].process.poll() is not None:
        _server[:] = [_Server()]
    return _server[0]


def _preloadable(args, kwargs) -> bool:
    if os.environ.get("COCOS_TEST_REAL_PROCESSES") or not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return False
    if isinstance(args, (str, bytes)) or len(args) < 3 or args[0] != sys.executable or args[1] != "-c":
        return False
    special = ("executable", "preexec_fn", "shell", "start_new_session", "pass_fds", "user", "group",
               "extra_groups", "process_group", "startupinfo", "creationflags")
    return not any(kwargs.get(k) for k in special) and kwargs.get("close_fds", True)


class _Forked(subprocess.Popen):
    """A :class:`subprocess.Popen` whose child is forked by the preloaded interpreter; its status arrives over the
    request's connection (the test process is not its parent)."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):
        if cwd is not None and not os.path.isdir(cwd):
            raise FileNotFoundError(2, "No such file or directory", os.fsdecode(cwd))
        server = _the_server()
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        request = {"code": args[2], "args": [os.fsdecode(a) for a in args[3:]],
                   "cwd": os.fsdecode(cwd) if cwd is not None else os.getcwd(),
                   "env": {os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()}}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(server.address)
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            reply = conn.recv(_STATUS.size)
            if len(reply) != _STATUS.size:
                raise RuntimeError("the tests' preloaded interpreter did not start the process")
        except BaseException:
            conn.close()
            raise
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self.pid = _STATUS.unpack(reply)[0]
        self._child_created = True
        self._connection = conn

    def _status(self, data: bytes) -> None:
        if len(data) != _STATUS.size:
            raise RuntimeError("the tests' preloaded interpreter stopped before its child did")
        self.returncode = _STATUS.unpack(data)[0]
        self._connection.close()

    def _internal_poll(self, *args, **kwargs):
        if self.returncode is None:
            self._connection.setblocking(False)
            try:
                self._status(self._connection.recv(_STATUS.size))
            except BlockingIOError:
                pass
            finally:
                if self.returncode is None:
                    self._connection.setblocking(True)
        return self.returncode

    def _wait(self, timeout):
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                self._status(self._connection.recv(_STATUS.size))
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            finally:
                if self.returncode is None:
                    self._connection.settimeout(None)
        return self.returncode


def command(code: str) -> list[str]:
    """``[sys.executable, "-c", code]`` for a launcher that starts the processes itself (``torchrun --no-python``):
    each is a small stand-in (no imports beyond the standard library's) whose child, forked from this process's
    preloaded interpreter with the stand-in's descriptors, environment and folder, runs ``code``; signals to the
    stand-in reach the child, and the stand-in exits as the child did."""
    if not _preloadable([sys.executable, "-c", code], {}):
        return [sys.executable, "-c", code]
    return [sys.executable, "-c", PROXY, _the_server().address, code]


def Popen(args, **kwargs) -> subprocess.Popen:  # noqa: N802 (subprocess's name)
    """:class:`subprocess.Popen`, forked from the preloaded interpreter where ``args`` is ``python -c``."""
    return (_Forked if _preloadable(args, kwargs) else subprocess.Popen)(args, **kwargs)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):  # noqa: A002
    """:func:`subprocess.run`, forked from the preloaded interpreter where ``args`` is ``python -c``."""
    if not _preloadable(args, kwargs):
        return subprocess.run(args, input=input, capture_output=capture_output, timeout=timeout, check=check,
                              **kwargs)
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with _Forked(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, args, stdout, stderr)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
