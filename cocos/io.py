"""Side effects at the edge: atomic writes and safe loading of arrays.

Every file cocos writes goes through a temporary file in the same folder and an
``os.replace``, so an interrupted run never leaves a half-written file and never
damages a file that was there before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cocos.errors import CocosError

MARKER = ".cocos-output"  # written into every folder cocos builds, with its kind (output_kind, check_output_dir)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def remove_stale(path: Path) -> None:
    """Remove temporaries of ``path`` that a killed cocos process left (before writing ``path`` again)."""
    remove_stale_temporaries(path.parent, names=(path.name,))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``.

    The file gets the usual permissions (``0o666`` less the umask), not ``mkstemp``'s 0600.
    OS errors become one :class:`CocosError` line naming ``path`` (not the temporary name).
    """
    path = Path(path)
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, expected a file path")
    remove_stale(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=suffix + ".tmp", dir=path.parent)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
    except OSError as exc:
        raise CocosError(f"{path}: cannot write ({exc.strerror or exc})") from None
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except OSError as exc:
        raise CocosError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Deterministic JSON (sorted keys, fixed indentation), written atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    with atomic_path(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)


def write_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    with atomic_path(path, suffix=".npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, array, allow_pickle=False)


def write_csv(path: str | os.PathLike, frame, float_format: str = "%.6g") -> None:
    """A pandas DataFrame as CSV (no index), written atomically."""
    with atomic_path(path, suffix=".csv") as tmp:
        frame.to_csv(tmp, index=False, float_format=float_format)


def check_output_file(path: str | os.PathLike, inputs=(), *, overwrite: bool = False, runs=()) -> Path:
    """The one rule for a single-file output (``--json``, ``--save-embeddings``, ``--out`` of ``import``,
    figures of ``diagram``), checked before any work starts:

    - never one of ``inputs`` (files or folders the command reads) or a file inside an input folder,
      after resolving links, even with ``overwrite``;
    - never an existing file in the run folder of an input checkpoint (``runs``: its ``train_log.csv``,
      ``cocos_track.csv``, other checkpoints), even with ``overwrite``;
    - an existing file only with ``overwrite`` (no command replaces a file it did not create in this run);
    - never a file inside a cocos dataset, feature cache or pre-trained CNN folder, at any depth
      (:func:`check_ancestors`), even with ``overwrite``: their files are what other commands read and hash.
    """
    path = Path(path)
    if path.is_dir() or path.name in ("", ".", ".."):
        raise CocosError(f"{path}: is a folder, expected a file path")
    resolved = path.resolve()
    for item in inputs:
        if item is None:
            continue
        item_path = Path(item).resolve()
        if item_path == resolved or item_path in resolved.parents:
            raise CocosError(f"{path}: would overwrite the input {item}; choose another output path")
    check_ancestors(path, None, "output path")
    if path.exists() or path.is_symlink():
        for run in runs:
            if run is not None and Path(run).resolve().parent == resolved.parent:
                raise CocosError(f"{path}: is a file of the run folder of the input {run}; choose another "
                                 "output path")
        if not overwrite:
            raise CocosError(f"{path}: exists; choose another output path or pass --overwrite to replace it")
    return path


# -- output folders by kind: what wrote a folder decides what may replace it ---------------------------------

KINDS = {  # kind -> what such a folder is, for messages ("FOLDER: is <description>")
    "dataset": "a cocos dataset (written by cocos data synth)",
    "features": "a cocos feature cache (written by cocos data features)",
    "run": "a cocos training run folder (written by cocos train)",
    "report": "a cocos report (written by cocos analyze, count, report or demo)",
    "track": "a cocos tracking folder (written by cocos.track.Tracker)",
    "sweep": "a cocos sweep folder (written by cocos sweep)",
    "pretrain": "a cocos pre-trained CNN folder (written by cocos demo's pre-training)",
    "unknown": "a folder written by an earlier cocos whose kind cannot be told from its files",
}
WRITES = {  # kind -> the plural a command writes ("cocos analyze writes reports")
    "dataset": "datasets", "features": "feature caches", "run": "training runs", "report": "reports",
    "track": "tracking folders", "sweep": "sweep folders", "pretrain": "pre-trained CNN folders",
}
RUN_MARKER = ".cocos-train"  # cocos train's own marker (cocos.training.trainer.RUN_MARKER): kind "run"
_MARKER_HEAD = "written by cocos; only a cocos command that writes this kind replaces it (with --overwrite)"
_OLD_SWEEP = "written by cocos sweep"
REWRITES_OWN = ("demo", "sweep")  # writers that rewrite a folder they wrote without --overwrite (a rerun)


def marker_text(kind: str, by: str | None = None) -> str:
    """The text of :data:`MARKER` for a folder of ``kind`` written by ``by`` (a command name, e.g. ``demo``)."""
    if kind not in WRITES:
        raise ValueError(f"unknown output kind {kind!r}")
    return f"{_MARKER_HEAD}\nkind: {kind}\n" + (f"by: {by}\n" if by else "")


def mark_output(folder: str | os.PathLike, kind: str, by: str | None = None) -> Path:
    """Write :data:`MARKER` (``kind: KIND`` and, if given, ``by: WRITER``) into ``folder``, atomically."""
    path = Path(folder) / MARKER
    write_text(path, marker_text(kind, by))
    return path


def _read_marker(folder: Path) -> str | None:
    """The marker's text (at most 4 KB, never through a link), "" when unreadable, None when there is none."""
    path = folder / MARKER
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, 4096).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def marker_fields(folder: str | os.PathLike) -> dict[str, str]:
    """The ``key: value`` lines of ``folder``'s :data:`MARKER` (``kind``, ``by``); empty for an old-format marker or
    none."""
    text = _read_marker(Path(folder)) or ""
    if text.startswith(_OLD_SWEEP):  # an earlier cocos sweep's marker
        return {"kind": "sweep", "by": "sweep"}
    fields = {}
    for line in text.splitlines()[1:]:
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("kind", "by"):
            fields[key.strip()] = value.strip()
    return fields


_OLD_KINDS = (  # (kind, whether a folder of an earlier cocos holds its files): read by _old_kind
    ("features", lambda names, folder: "cocos_features.json" in names),
    ("report", lambda names, folder: "results.json" in names or {"tables.md", "tables.tex"} <= names),
    ("report", lambda names, folder: "README.md" in names and (folder / "summary" / "tables.md").is_file()),  # demo
    ("dataset", lambda names, folder: "synth.json" in names and bool({"train_ims.npy", "images"} & names)),
    ("pretrain", lambda names, folder: "pretrain.json" in names),
)


def _old_kind(folder: Path, text: str) -> str:
    """The kind of a folder an earlier cocos marked without one, from its files when only one kind fits, else
    ``"unknown"``."""
    if text.startswith(_OLD_SWEEP):
        return "sweep"
    try:
        names = {p.name for p in folder.iterdir()}
    except OSError:
        return "unknown"
    fits = {kind for kind, holds in _OLD_KINDS if holds(names, folder)}
    return fits.pop() if len(fits) == 1 else "unknown"


def output_kind(path: str | os.PathLike) -> str | None:
    """The kind (a key of :data:`KINDS`) of the cocos folder ``path``; None when it is not a folder cocos wrote.

    A folder holding cocos train's marker ``.cocos-train`` is a ``"run"``; one holding :data:`MARKER` has the kind
    its ``kind:`` line names. A marker of an earlier cocos (no ``kind:`` line, or an unreadable one) is read from
    the folder's files when they fit exactly one kind (a feature cache's manifest, a report's ``results.json``
    or tables, a dataset's ``synth.json`` and features or images, a sweep's marker text), else ``"unknown"``: a
    cocos folder that no command replaces.
    """
    folder = Path(path)
    if not folder.is_dir():
        return None
    if (folder / RUN_MARKER).exists() or (folder / RUN_MARKER).is_symlink():
        return "run"
    text = _read_marker(folder)
    if text is None:
        return None
    kind = marker_fields(folder).get("kind")
    if kind in WRITES:
        return kind
    return "unknown" if kind else _old_kind(folder, text)


def _describe(kind: str) -> str:
    return KINDS.get(kind, KINDS["unknown"])


NESTS = {  # kind -> the kinds of output folder a cocos folder of that kind may hold (check_ancestors)
    "sweep": ("run", "report"),  # a sweep's runs, their analyses and its summary
    "run": ("report",),  # an analysis of a run beside its checkpoints (cocos train --overwrite keeps subfolders)
    "report": ("report",),  # cocos report's summary of the reports it reads (reports/x/summary)
    "dataset": ("features",),  # the default feature cache of an image dataset, DATA/features/<key>
}


def check_ancestors(path: str | os.PathLike, kind: str | None, option: str = "--out") -> None:
    """``path`` (links resolved) lies inside no cocos folder but one whose kind holds outputs of ``kind``
    (:data:`NESTS`; the nearest cocos folder above ``path`` decides; ``kind`` None: a single file, which may lie
    inside none but a run, report, sweep or tracking folder). Otherwise one :class:`CocosError` line: a report
    written inside a dataset would be deleted with it by ``cocos data synth --overwrite``."""
    for parent in Path(path).resolve().parents:
        found = output_kind(parent)
        if found is None:
            continue
        allowed = NESTS.get(found, ()) if kind is not None else ("run", "report", "sweep", "track")
        if (kind if kind is not None else found) in allowed:
            return
        raise CocosError(f"{path}: lies inside {_describe(found)} ({parent}); cocos writes nothing inside it: "
                         f"choose another {option}")


def check_inputs(path: Path, inputs, option: str, may_lie_in=()) -> None:
    """``path`` is not an input, does not contain one and does not lie inside one (links resolved), but for the
    inputs ``may_lie_in``."""
    resolved = path.resolve()
    within = {Path(p).resolve() for p in may_lie_in if p is not None}
    for item in inputs:
        if item is None:
            continue
        item_path = Path(item).resolve()
        if item_path == resolved or resolved in item_path.parents:
            raise CocosError(f"{path}: the output folder would replace the input {item}; choose another {option}")
        if item_path in resolved.parents and item_path not in within:
            raise CocosError(f"{path}: lies inside the input {item}; choose another {option}")


def _holds_anything(path: Path, option: str) -> bool:
    """Whether ``path`` is a folder with at least one entry (one line if it cannot be read)."""
    if not path.is_dir():
        return False
    try:
        return any(path.iterdir())
    except OSError as exc:
        raise CocosError(f"{path}: cannot read the folder ({exc.strerror or exc}); choose another {option}") from None


def check_output_dir(path: str | os.PathLike, inputs=(), overwrite: bool = False, *, kind: str,
                     by: str | None = None, option: str = "--out", may_lie_in=()) -> Path:
    """The one rule for an output folder of ``kind`` (a key of :data:`WRITES`), checked before any work starts:

    - never one of ``inputs``, a folder that contains one, or a folder inside one (links resolved; but inside the
      inputs ``may_lie_in``: a feature cache in its image dataset), even with ``overwrite``;
    - never inside a cocos folder but one whose kind holds outputs of ``kind`` (:func:`check_ancestors`,
      :data:`NESTS`: a sweep's runs and reports, a report beside a run's checkpoints), even with ``overwrite``;
    - absent or empty: allowed;
    - a cocos folder of the same ``kind`` (:func:`output_kind`): replaced only with ``overwrite``, or without it
      when ``by`` is one of :data:`REWRITES_OWN` (``demo``, ``sweep``) and the folder's marker records that same
      writer, or is an earlier cocos's, which records none (a rerun of the demo or a sweep rewrites its own
      folders);
    - a cocos folder of any other kind (including an earlier cocos's folder of unknown kind): refused even with
      ``overwrite``;
    - a non-empty folder cocos did not write: refused even with ``overwrite`` (never removed).

    ``by`` names the command in messages (``cocos analyze writes reports``); ``option`` the flag that chose
    ``path``. Every refusal is one :class:`CocosError` line. Returns ``path``.
    """
    if kind not in WRITES:
        raise ValueError(f"unknown output kind {kind!r}")
    path = Path(path)
    if path.name in ("", ".", ".."):  # the folder is replaced by a rename: it needs a name of its own
        raise CocosError(f"{path}: name the output folder itself (not '.' or '..'); choose another {option}")
    if path.is_symlink() and not path.exists():
        raise CocosError(f"{path}: is a dangling link; choose another {option}")
    if path.exists() and not path.is_dir():
        raise CocosError(f"{path}: exists and is not a folder; choose another {option}")
    check_inputs(path, inputs, option, may_lie_in)
    check_ancestors(path, kind, option)
    if not _holds_anything(path, option):
        return path
    found = output_kind(path)
    writer = f"cocos {by}" if by else "this command"
    if found is None:
        raise CocosError(f"{path}: exists, is not empty and was not written by cocos; cocos never replaces it, even "
                         f"with --overwrite: choose another {option}")
    if found != kind:
        raise CocosError(f"{path}: is {_describe(found)}; {writer} writes {WRITES[kind]}: choose another {option}")
    fields = marker_fields(path)  # {} for an earlier cocos's marker: its writer unknown, a rerun's own folder
    if overwrite or (by in REWRITES_OWN and (fields.get("by") == by or not fields)):
        return path
    raise CocosError(f"{path}: holds {_describe(found)} already; pass --overwrite to replace it or choose "
                     f"another {option}")


def check_output_parent(path: str | os.PathLike, option: str = "--out") -> Path:
    """A folder cocos writes several outputs into (``cocos analyze A.pt B.pt --out DIR``: DIR/A, DIR/B): absent,
    or a folder that is no cocos output itself (:func:`output_kind` None), so nothing is written inside a dataset,
    a feature cache, a run or a report. One :class:`CocosError` line otherwise."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CocosError(f"{path}: exists and is not a folder; choose another {option}")
    found = output_kind(path)
    if found is not None:
        raise CocosError(f"{path}: is {_describe(found)}; cocos writes nothing inside it: choose another {option}")
    check_ancestors(path / "report", "report", option)  # the reports it will hold: inside no dataset, ...
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, inputs=(), overwrite: bool = False, *, kind: str,
               by: str | None = None, option: str = "--out", may_lie_in=()) -> Iterator[Path]:
    """Build a folder of ``kind`` under a temporary name and move it into place at the end.

    :func:`check_output_dir` decides (again, under the lock) whether ``path`` may be written; if it exists it is
    replaced only after the new folder is complete, which then holds :data:`MARKER` with its ``kind`` (and ``by``);
    on error nothing is left behind and the old folder is untouched. The output is locked (:func:`output_lock`)
    from the check to the rename: a second process writing the same folder is refused in one line, never
    interleaved.
    """
    with output_lock(path):
        checked = check_output_dir(path, inputs, overwrite, kind=kind, by=by, option=option, may_lie_in=may_lie_in)
        with _atomic_dir(checked, marker_text(kind, by)) as tmp:
            yield tmp


@contextlib.contextmanager
def _atomic_dir(path: Path, marker: str) -> Iterator[Path]:
    remove_stale(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as exc:
        raise CocosError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        yield tmp
        try:
            (tmp / MARKER).write_text(marker, encoding="utf-8")
        except OSError as exc:
            raise CocosError(f"{path}: cannot write ({exc.strerror or exc})") from None
        swap_into_place(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def swap_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished folder ``tmp`` onto ``path``; an existing ``path`` (a folder, or a link, which is
    removed, never followed) is moved aside first and deleted only once the new folder is in place, and put back
    if the new one cannot move in: ``path`` is never missing and never left as a temporary. OS errors are one
    :class:`CocosError` line naming ``path``."""
    try:
        if path.exists() or path.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".old", dir=path.parent))
            old.rmdir()
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except OSError:
                os.replace(old, path)  # the old one back where it was
                raise
            if old.is_symlink():
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except OSError as exc:
        raise CocosError(f"{path}: cannot write ({exc.strerror or exc})") from None


def available_memory() -> int:
    """Bytes the machine can still give this process: ``MemAvailable`` of ``/proc/meminfo``, else physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**62


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"


def npy_header(fh) -> tuple[tuple, np.dtype, int]:
    """``(shape, dtype, declared data bytes)`` of the ``.npy`` stream ``fh`` from its header alone (nothing
    allocated); ``ValueError`` for a header numpy cannot read."""
    shape, _, dtype, declared = _npy_header(fh)
    return shape, dtype, declared


def _npy_header(fh) -> tuple[tuple, bool, np.dtype, int]:
    major, _ = np.lib.format.read_magic(fh)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(fh)
    count = 1
    for dim in shape:
        count *= int(dim)
    return shape, fortran, dtype, count * dtype.itemsize


def check_declared_size(path, declared: int, held: int, member: str | None = None) -> None:
    """Refuse an array whose header declares more bytes than the file holds (truncated or crafted), or more than
    the memory available: before anything is allocated."""
    where = f"{path}" + (f" (member {member})" if member else "")
    if declared > held:
        raise CocosError(f"{where}: its header declares {_gb(declared)} of data but the file holds {_gb(held)}: "
                         "the file is truncated or damaged")
    if declared > available_memory():
        raise CocosError(f"{where}: holds {_gb(declared)} of data, more than the {_gb(available_memory())} of "
                         "memory available")


def load_npy(path: str | os.PathLike, what: str = "array") -> np.ndarray:
    """One ``.npy`` array without pickle, its declared size checked against the file and memory first."""
    path = Path(path)
    if not path.is_file():
        raise CocosError(f"{path}: no such {what} file")
    try:
        with open(path, "rb") as fh:
            _, dtype, declared = npy_header(fh)
            offset = fh.tell()
        if dtype.hasobject:
            raise CocosError(f"{path}: holds Python objects; expected a numeric array")
        check_declared_size(path, declared, path.stat().st_size - offset)
        return np.load(path, allow_pickle=False)
    except CocosError:
        raise
    except (ValueError, OSError, EOFError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CocosError(f"{path}: not a readable .npy array ({first})") from None


COMPRESSED_LIMIT = 256 * 2**20  # compressed .npz members larger than this (expanded) are refused: they cannot be mapped


def _member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, mmap: bool) -> np.ndarray:
    """One ``.npz`` member: its declared size checked first; a stored (uncompressed) one memory-mapped read-only
    with ``mmap`` (its pages are read from disk as they are used, never copied whole)."""
    name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
    with archive.open(info) as fh:
        shape, fortran, dtype, declared = _npy_header(fh)
        header = fh.tell()
    if dtype.hasobject:
        raise CocosError(f"{path}: member {name} holds Python objects; expected a numeric array")
    check_declared_size(path, declared, info.file_size - header, member=name)
    if info.compress_type != zipfile.ZIP_STORED:
        if mmap and declared > COMPRESSED_LIMIT:
            raise CocosError(f"{path}: member {name} is compressed ({_gb(declared)} expanded), which cannot be read "
                             "in bounded memory; save the file uncompressed with numpy.savez (not savez_compressed)")
        with archive.open(info) as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)
    if not mmap:
        with archive.open(info) as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)
    with open(path, "rb") as raw:  # the member's data starts after its local header (30 bytes, name, extra)
        raw.seek(info.header_offset + 26)
        n_name, n_extra = int.from_bytes(raw.read(2), "little"), int.from_bytes(raw.read(2), "little")
    start = info.header_offset + 30 + n_name + n_extra + header
    if not shape or declared == 0:
        with archive.open(info) as fh:
            return np.lib.format.read_array(fh, allow_pickle=False)
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape, order="F" if fortran else "C")


def load_npz(path: str | os.PathLike, mmap: bool = False) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` without pickle (object arrays are refused), each member's declared size checked
    against the file and, together, against the memory available before anything is read.

    With ``mmap``, uncompressed members (``numpy.savez``) come back as read-only memory maps: loading costs no
    memory beyond what is used; compressed members above :data:`COMPRESSED_LIMIT` are then refused.
    """
    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise CocosError(f"{path}: the file is empty")
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if magic == b"\x93NUMPY":
        raise CocosError(f"{path}: a single array (.npy); expected an .npz with named arrays")
    if not magic.startswith(b"PK"):
        raise CocosError(f"{path}: not an .npz file (expected named arrays saved with numpy.savez)")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if not mmap:  # everything is read into memory: all of it must fit, before any of it is read
                total = 0
                for info in infos:
                    with archive.open(info) as fh:
                        total += _npy_header(fh)[3]
                check_declared_size(path, total, total)
            return {info.filename[:-4] if info.filename.endswith(".npy") else info.filename:
                    _member(path, archive, info, mmap) for info in infos}
    except CocosError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, KeyError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CocosError(f"{path}: not a readable .npz file ({first})") from None


# -- output folders of long runs: made up front, removed again if the run leaves nothing ------------


def make_dirs(path: str | os.PathLike) -> list[Path]:
    """Create ``path`` and its missing parents; returns the folders this call created (outermost first).

    Fails with one :class:`CocosError` line if a folder cannot be made or is not writable, and
    then removes what it created: a refused run leaves no empty folders behind.
    """
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    created: list[Path] = []
    try:
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
        if not path.is_dir():
            raise CocosError(f"{path}: exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise CocosError(f"{path}: cannot write (permission denied or a read-only file system)")
    except OSError as exc:
        remove_created(created)
        raise CocosError(f"{path}: cannot create the folder ({exc.strerror or exc})") from None
    except CocosError:
        remove_created(created)
        raise
    return created


def remove_created(created: list[Path]) -> None:
    """Remove folders that :func:`make_dirs` created (with what was written into them)."""
    if created:
        shutil.rmtree(created[0], ignore_errors=True)


def _check_writable_ancestor(path: Path, start: Path) -> None:
    """The nearest existing folder at or above ``start`` must be a folder this process may write into."""
    folder = start
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise CocosError(f"{path}: cannot write ({folder} is not a folder)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CocosError(f"{path}: cannot write ({folder} is not writable: read-only or no permission)")


def check_writable_dir(path: str | os.PathLike, what: str = "folder") -> Path:
    """Refuse an output folder that cannot be made or written, before any work: it must be a folder (or absent)
    and its nearest existing ancestor a writable folder (a read-only mount, a file in the way)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CocosError(f"{path}: exists and is not a folder; choose another {what}")
    _check_writable_ancestor(path, path.absolute())
    return path


def check_writable_file(path: str | os.PathLike) -> Path:
    """Refuse a single-file output that cannot be written, before any work: its nearest existing
    ancestor must be a writable folder (the missing ones are made only when the file is written)."""
    path = Path(path)
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, expected a file path")
    _check_writable_ancestor(path, path.absolute().parent)
    return path


_TEMP_TAIL = re.compile(r"\.(?:(\d+)\.)?[A-Za-z0-9_]+(?:\.[A-Za-z0-9]+)?\.(?:tmp|old)")


def _own_temporary(name: str, names=(), patterns=()):
    """The match of the temporary's tail (group 1: the writer's pid, if recorded), or None."""
    if not name.startswith("."):
        return None
    for target in names:
        if name.startswith(f".{target}."):
            found = _TEMP_TAIL.fullmatch(name[len(target) + 1:])
            if found:
                return found
    for pattern in patterns:
        head = re.match(r"\.(?:" + pattern + r")(?=\.)", name)
        if head:
            found = _TEMP_TAIL.fullmatch(name[head.end():])
            if found:
                return found
    return None


def is_own_temporary(name: str, names=(), patterns=()) -> bool:
    """Whether ``name`` is a temporary of :func:`atomic_path`/:func:`atomic_dir` for one of ``names``
    (file names) or ``patterns`` (regular expressions of file names): ``.NAME.[PID.]XXXX[.suffix].tmp``."""
    return _own_temporary(name, names, patterns) is not None


def remove_stale_temporaries(folder: str | os.PathLike, names=(), patterns=(), own: bool = False) -> list[Path]:
    """Remove the temporaries in ``folder`` of cocos's outputs ``names``/``patterns`` (see :func:`is_own_temporary`)
    that a killed run left: files of :func:`atomic_path`, folders of :func:`atomic_dir`. Every temporary name
    carries its writer's process id; those of a live process (a concurrent run) stay, and this process's own
    only with ``own`` (a run starting up: a same-numbered temporary is a dead process's). Returns what went."""
    folder = Path(folder)
    removed: list[Path] = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return removed
    for item in entries:
        found = _own_temporary(item.name, names, patterns)
        if found is None or item.is_symlink():
            continue
        pid = found.group(1)
        if pid is not None and _alive(int(pid)) and not (own and int(pid) == os.getpid()):
            continue
        try:
            shutil.rmtree(item) if item.is_dir() else item.unlink()
            removed.append(item)
        except OSError:
            pass
    return removed


# -- one writer per output: an exclusive lock beside it ----------------------------------------------

LOCK_SUFFIX = ".lock"


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of the output ``path``: ``.NAME.lock`` beside it."""
    path = Path(path)
    return path.parent / f".{path.name}{LOCK_SUFFIX}"


@contextlib.contextmanager
def output_lock(path: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive lock on the output ``path`` (a file or folder, present or not) while the block runs.

    A second cocos process that locks the same output is refused at once with one :class:`CocosError` line (it
    does not wait: a user sees why). The lock is an ``fcntl.flock`` on ``.NAME.lock`` beside ``path``, opened
    without following a link; it is released by the kernel when the process dies, so a killed run never leaves
    the output locked. The lock file is removed on release (under the lock; a waiter that then holds a removed
    file tries again), and missing parent folders made for it are removed again if they stay empty.
    """
    path = Path(path)
    lock = lock_path(path)
    created = make_dirs(lock.parent)
    try:
        import fcntl
    except ImportError:  # no flock (not POSIX): no lock
        fcntl = None
    fd = -1
    try:
        while fcntl is not None:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                             0o666 & ~_umask())
            except OSError as exc:
                raise CocosError(f"{path}: cannot lock the output ({lock.name}: {exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                fd = -1
                raise CocosError(f"{path}: another cocos process is writing this output now; wait for it to finish "
                                 "or choose another output") from None
            try:
                same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if same:
                break
            os.close(fd)  # the holder before us removed the file we locked: lock the new one
            fd = -1
        yield lock
    finally:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(lock)
            os.close(fd)
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()


# -- Ctrl-C: a request that stays pending, so an interrupt swallowed on its way up is raised again ----

_INTERRUPT = {"pending": False}


def note_interrupt() -> bool:
    """Record a Ctrl-C (from the CLI's SIGINT handler); returns whether one was already pending."""
    was = _INTERRUPT["pending"]
    _INTERRUPT["pending"] = True
    return was


def clear_interrupt() -> None:
    _INTERRUPT["pending"] = False


def interrupt_pending() -> bool:
    return _INTERRUPT["pending"]


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C is pending (one that something on its way up swallowed,
    e.g. a finaliser running when the signal arrived); long loops call this between steps."""
    if _INTERRUPT["pending"]:
        raise KeyboardInterrupt


# -- files that are never written or read through a link -------------------------------------------------

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_exclusive(name: str | os.PathLike, dir_fd: int | None = None, mode: int | None = None) -> int:
    """A new file opened read-write: ``O_CREAT | O_EXCL | O_NOFOLLOW``, so an existing file or a planted link of
    that name is never opened, let alone written through (``OSError`` then). ``name`` is relative to ``dir_fd``
    when given; the mode is ``0o666`` less the umask unless ``mode``."""
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW,
                   0o666 & ~_umask() if mode is None else mode, dir_fd=dir_fd)


def sha256_fd(fd: int, size: int | None = None) -> str:
    """The SHA-256 hex digest of the first ``size`` bytes (all, when None) of the open file ``fd``, read with
    ``pread`` in 1 MB blocks (the file position is not moved)."""
    h = hashlib.sha256()
    end = os.fstat(fd).st_size if size is None else size
    at = 0
    while at < end:
        block = os.pread(fd, min(1 << 20, end - at), at)
        if not block:
            break
        h.update(block)
        at += len(block)
    return h.hexdigest()


def read_npy_checked(path: str | os.PathLike, sha256: str) -> np.ndarray:
    """The array of the ``.npy`` file ``path`` read whole (no pickle, no link followed: a link is refused), the
    SHA-256 of its bytes computed while reading and compared with ``sha256``.

    One :class:`CocosError` line when the file is missing, not a regular file, not a readable ``.npy`` array
    (header, size: trailing or missing bytes), larger than the memory available, or when its hash differs
    (the message then says the file does not match its recorded sha256). The file is read once; the array
    is a view of the bytes read (no second copy)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW)  # a FIFO never blocks
    except FileNotFoundError:
        raise CocosError(f"{path}: no such file") from None
    except OSError as exc:
        raise CocosError(f"{path}: cannot be read ({exc.strerror or exc}; a link is never followed)") from None
    with os.fdopen(fd, "rb") as fh:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CocosError(f"{path}: not a regular file")
            size = st.st_size
            shape, fortran, dtype, declared = _npy_header(fh)
            offset = fh.tell()
            if dtype.hasobject:
                raise CocosError(f"{path}: holds Python objects; expected a numeric array")
            check_declared_size(path, declared, size - offset)
            if declared != size - offset:
                raise CocosError(f"{path}: {size - offset - declared} bytes after the array its header declares: "
                                 "the file is damaged")
            fh.seek(0)
            h = hashlib.sha256(fh.read(offset))
            raw = np.empty(declared, dtype=np.uint8)
            view, got = memoryview(raw), 0
            while got < declared:
                n = fh.readinto(view[got:])
                if not n:
                    raise CocosError(f"{path}: shorter than its header declares: the file is truncated")
                got += n
        except CocosError:
            raise
        except (ValueError, OSError, EOFError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CocosError(f"{path}: not a readable .npy array ({first})") from None
    h.update(raw)
    if h.hexdigest() != sha256:
        raise CocosError(f"{path}: does not match its recorded sha256 (the file was changed after it was written)")
    return raw.view(dtype).reshape(shape, order="F" if fortran else "C")


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file, read in 1 MB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
