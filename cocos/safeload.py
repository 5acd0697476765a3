"""Reading torch files without running code from them, and without trusting what they declare.

Every checkpoint cocos reads (its own, the original VSE++/VSRN code's, CNN weights) goes
through :func:`load_torch_file`, which

1. checks the CRC of every member of the zip container (torch does not: flipped bytes in a
   tensor's storage would otherwise load as other weights);
2. loads with ``torch.load(weights_only=True)`` (only the classes in ``safe_globals`` besides
   torch's own plain types), unless the user trusts the file;
3. refuses any tensor that claims more elements than its storage holds (a stride-0 view of
   ``(10**9, 16)`` over 64 bytes loads in a millisecond and allocates 64 GB on the first copy);
4. turns every failure into one :class:`~cocos.errors.CocosError` line, and never repeats
   torch's advice to load with ``weights_only=False``.

The plain pickles cocos reads (the reproducibility repository's image pickles, VSE++/VSRN
vocabularies) go through :class:`BudgetedUnpickler`, the one base of their restricted
unpicklers: its output is bounded by what it reads, not by what the file claims (see its
docstring).
"""

from __future__ import annotations

import os
import pickle
import re
import struct
import sys
import zipfile
from pathlib import Path

import torch

from cocos.errors import CocosError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class UnsafeCheckpointError(CocosError):
    """The file names a class or function that a safe load does not run (the message names it)."""


def first_line(exc: BaseException) -> str:
    """The informative line of an exception's text (torch's weights-only errors: the unpickler's own line)."""
    text = _ANSI.sub("", str(exc))
    found = re.search(r"WeightsUnpickler error: ([^\n]*)", text)
    if found:
        text = found.group(1)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "weights_only" not in ln]
    return (lines[0] if lines else type(exc).__name__)[:160]


def check_zip(path: str | os.PathLike) -> None:
    """The CRC of every member of a zip container (torch's format, ``.npz``): flipped bytes are found here.

    Files that are not zip archives (torch's legacy format) pass; the loader decides about them.
    """
    path = Path(path)
    try:
        if not zipfile.is_zipfile(path):
            return
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
            struct.error, RuntimeError, OverflowError) as exc:
        raise CocosError(f"{path}: is corrupted (its zip container is damaged: {first_line(exc)})") from None
    if bad is not None:
        raise CocosError(f"{path}: is corrupted (member {bad} fails its CRC check)")


def _tensors(obj, depth: int = 0):
    if depth > 64:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1)


def check_tensor_sizes(obj, path: str | os.PathLike) -> None:
    """Refuse tensors that claim more elements than their storage holds (zero or overlapping strides)."""
    for tensor in _tensors(obj):
        if tensor.layout != torch.strided or tensor.device.type == "meta":
            continue
        claimed = tensor.numel() * tensor.element_size()
        held = tensor.untyped_storage().nbytes()
        if claimed > held:
            shape = "x".join(map(str, tensor.shape))
            raise CocosError(f"{path}: a tensor declares {shape} elements ({claimed:,} bytes) but the file holds "
                             f"{held:,} bytes for it: the file is damaged or crafted")


TRUST_ADVICE = "pass --trust-checkpoint only if you trust the file"


def load_torch_file(path: str | os.PathLike, *, trust: bool = False, safe_globals=(), mmap: bool = False,
                    what: str = "checkpoint", advice: str = TRUST_ADVICE):
    """Whatever a torch file holds, loaded safely (see the module docstring); one error line otherwise.

    ``advice`` ends the refusal of a file that names a class or function a safe load does not run; the
    default points to ``--trust-checkpoint`` (commands that have it); callers whose commands lack it say
    what to do instead.
    """
    path = Path(path)
    if not path.exists():
        raise CocosError(f"{path}: no such {what}")
    if path.is_dir():
        raise CocosError(f"{path}: is a folder, not a {what}")
    if not path.is_file():
        raise CocosError(f"{path}: not a regular file, not a {what}")
    check_zip(path)
    if trust:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - a trusted pickle may raise anything
            raise CocosError(f"{path}: not a readable {what} ({first_line(exc)})") from None
    else:
        try:
            with torch.serialization.safe_globals(list(safe_globals)):
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as exc:
            found = re.search(r"GLOBAL ([\w.]+)", _ANSI.sub("", str(exc)))
            if found:
                raise UnsafeCheckpointError(f"{path}: the {what} refers to {found.group(1)}, which a safe load "
                                            f"does not run ({advice})") from None
            raise CocosError(f"{path}: not a readable {what} ({first_line(exc)})") from None
        except Exception as exc:  # noqa: BLE001 - nothing of the file ran: whatever a damaged file makes torch raise
            raise CocosError(f"{path}: not a readable {what} ({first_line(exc)})") from None
    check_tensor_sizes(obj, path)
    return obj


# -- plain pickles: output bounded by input ----------------------------------------------------------

PICKLE_BUDGET_FACTOR = 8
PICKLE_BUDGET_CONSTANT = 64 << 20


def pickle_budget(size: int) -> int:
    """The bytes a pickle of ``size`` bytes may produce: ``8 x size + 64 MiB``, at most the memory available."""
    from cocos.io import available_memory

    return min(PICKLE_BUDGET_FACTOR * int(size) + PICKLE_BUDGET_CONSTANT, available_memory())


def _megabytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


class PickleBombError(pickle.UnpicklingError):
    """A pickle refers again and again to data it holds once, beyond :func:`pickle_budget` (the message says so)."""


class _BoundedFile:
    """The file as an unpickler reads it: never more than the ``size`` bytes it holds, whatever a length claims.

    ``read(n)`` of more than is left returns what is left (the unpickler then reports the pickle as
    truncated); nothing of the claimed size is ever allocated. Counts the bytes read.
    """

    def __init__(self, fh, size: int):
        self._fh = fh
        self.left = int(size)
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(int(n), self.left)
        data = self._fh.read(n)
        self.left -= len(data)
        self.read_bytes += len(data)
        return data

    def readline(self, limit: int = -1) -> bytes:
        data = self._fh.readline(self.left if limit is None or limit < 0 else min(limit, self.left))
        self.left -= len(data)
        self.read_bytes += len(data)
        return data


_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None))
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _children(obj) -> tuple:
    """The objects a container (or an instance, through its ``__dict__``) refers to."""
    if isinstance(obj, dict):
        return (*obj.keys(), *obj.values())
    if isinstance(obj, _CONTAINERS):
        return tuple(obj)
    state = getattr(obj, "__dict__", None)
    return (state,) if isinstance(state, dict) else ()


def _mutation(target_of):
    """Wrap an opcode that adds to a container so that it refuses a container already referred to again."""

    def decorate(original):
        def load(self):
            try:
                target = target_of(self)
            except IndexError:  # a malformed stack: the opcode's own error
                target = None
            if target is not None and id(target) in self._weights:
                raise pickle.UnpicklingError("the pickle changes a container after referring to it again "
                                             "(a self-referencing or crafted pickle)")
            original(self)
        return load
    return decorate


class BudgetedUnpickler(pickle._Unpickler):
    """The pure-Python unpickler with its output bounded by what it reads; the base of cocos's restricted unpicklers.

    Subclasses say which classes and functions exist (:meth:`find_class`); persistent ids are
    refused. What this base adds, so that memory is bounded by the file and not by what it claims:

    * **lengths**: a string, bytes or bytearray (or a frame) that claims more bytes than the file has
      left is never allocated: the read returns what is there and the pickle is truncated
      (``BYTEARRAY8`` is read before its buffer is made). The pure-Python unpickler keeps the memo in
      a dict (CPython's C unpickler grows its memo table to whatever index ``LONG_BINPUT`` names).
    * **references**: every memo ``GET`` (and ``DUP``) is charged the *weight* of what it refers to,
      the memory the object would take if every reference in it were a copy (``sys.getsizeof`` of
      each string, bytes, number and container, summed over the whole tree, a shared child counted
      at each reference), so that 2,000 references to one 16 MB ``bytearray`` count 32 GB. The bytes
      read plus these charges may not exceed ``budget`` (default :func:`pickle_budget`: ``8 x`` the
      file's size ``+ 64 MiB``, at most the memory available; a pickle without memo reuse is charged
      its size only, and real files refer again only to small things, dict keys and names):
      beyond it :class:`PickleBombError`, before anything is copied.
    * **no later growth**: a container's weight is computed once, when it is first referred to
      again; a container is weighed whole then, and one that is weighed cannot be added to afterwards
      (``APPEND(S)``, ``SETITEM(S)``, ``ADDITEMS``, ``BUILD``): such a pickle is refused, so a weight
      never goes stale. Python's pickler never does this except for self-referencing objects, which
      no file cocos reads holds.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, size: int, *, budget: int | None = None, **kwargs):
        self._source = _BoundedFile(file, size)
        super().__init__(self._source, **kwargs)
        self.budget = pickle_budget(size) if budget is None else int(budget)
        self.charged = 0
        self._weights: dict[int, tuple[object, int]] = {}  # id -> (the object, kept alive so ids stay unique; weight)

    @property
    def produced(self) -> int:
        """Bytes read plus the weight charged for references (what :attr:`budget` bounds)."""
        return self._source.read_bytes + self.charged

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("the pickle holds persistent ids")

    def weight(self, root) -> int:
        """The memory ``root`` would take with every reference in it a copy (the class docstring)."""
        if isinstance(root, _LEAVES):
            return sys.getsizeof(root)
        if id(root) in self._weights:
            return self._weights[id(root)][1]
        path: set[int] = set()  # the containers being weighed (the depth-first path)
        todo = [(root, False)]
        while todo:
            obj, children_done = todo.pop()
            if id(obj) in self._weights:
                continue
            children = _children(obj)
            if children_done:
                total = sys.getsizeof(obj) + sum(
                    sys.getsizeof(c) if isinstance(c, _LEAVES) else self._weights[id(c)][1] for c in children)
                self._weights[id(obj)] = (obj, total)
                path.discard(id(obj))
                continue
            path.add(id(obj))
            todo.append((obj, True))
            for child in children:
                if isinstance(child, _LEAVES) or id(child) in self._weights:
                    continue
                if id(child) in path:
                    raise pickle.UnpicklingError("the pickle holds a container that contains itself")
                todo.append((child, False))
        return self._weights[id(root)][1]

    def _charge_top(self) -> None:
        self.charged += self.weight(self.stack[-1])
        if self.produced > self.budget:
            raise PickleBombError(
                f"it refers again and again to data it holds once: it would expand beyond "
                f"{_megabytes(self.budget)}, {PICKLE_BUDGET_FACTOR} x its size + {PICKLE_BUDGET_CONSTANT >> 20} MiB "
                "or the memory available (a pickle bomb?); refused")

    def _load_bytearray8(self):
        (n,) = struct.unpack("<Q", self.read(8))
        data = self.read(n)  # never more than the file holds
        if len(data) < n:
            raise pickle.UnpicklingError(f"pickle data was truncated (a bytearray claims {n:,} bytes)")
        self.append(bytearray(data))

    dispatch[pickle.BYTEARRAY8[0]] = _load_bytearray8


def _referencing(original):
    def load(self):
        original(self)
        self._charge_top()
    return load


for _code in (pickle.GET, pickle.BINGET, pickle.LONG_BINGET, pickle.DUP):
    BudgetedUnpickler.dispatch[_code[0]] = _referencing(pickle._Unpickler.dispatch[_code[0]])
for _code, _target in ((pickle.APPEND, lambda u: u.stack[-2]), (pickle.SETITEM, lambda u: u.stack[-3]),
                       (pickle.BUILD, lambda u: u.stack[-2]), (pickle.APPENDS, lambda u: u.metastack[-1][-1]),
                       (pickle.SETITEMS, lambda u: u.metastack[-1][-1]),
                       (pickle.ADDITEMS, lambda u: u.metastack[-1][-1])):
    BudgetedUnpickler.dispatch[_code[0]] = _mutation(_target)(pickle._Unpickler.dispatch[_code[0]])
del _code, _target
