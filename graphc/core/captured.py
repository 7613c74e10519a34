"""numpy arrays a traced function reads from its module's globals or its closure.

A graph holds such an array as a constant: its values at the trace (as ``jax.jit`` does). numpy
code reads them again at every call, and programs change them between calls: min-char-rnn's
``lossFun`` reads the global ``Wxh``, which its training loop updates in place (``param +=
-lr * dparam / np.sqrt(mem + 1e-8)``), and a script rebinds a global it loaded. A compiled
function kept its first values silently. ``global_reads`` lists, at the end of a trace, the arrays
held by the global or closure names of the functions traced (the ndarrays themselves, and those
in dicts, lists, tuples and objects of the function's own module held there), with a copy of
their values (of an array over 64 KiB, its CRC-32: a copy would double a large global's memory,
and a change goes unseen with probability 2**-32); ``changed_read`` finds one whose values differ at a later call (a TraceError there,
graphc/interpreter.py): pass such arrays as arguments, or on an object passed as one.

Not looked into (a change there is still unseen): objects of other modules and of classes graphc
cannot flatten (only ``__slots__``), arrays reached through a module attribute (``weights.W``),
and functions the trace does not see being called (passed to ``map``, called by a library).
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.errors import SourceLoc
from graphc.core.pytree import LEAF, STATIC_TYPES, flatten

_MISSING = object()
_NOT_HOLDERS = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)


@dataclass(eq=False)
class GlobalRead:
    """The arrays one global (``holder`` a module's dict) or closure (``holder`` a cell) name
    held at the trace, and copies of their values."""

    name: str
    function: str
    loc: SourceLoc | None
    holder: Any
    value: Any
    arrays: list[np.ndarray]
    copies: list[np.ndarray | _Checksum]
    tree: Any = None  # the value's TreeDef (its static values: a float, a config's fields); None: by identity

    def current(self) -> Any:
        if isinstance(self.holder, dict):
            return self.holder.get(self.name, _MISSING)
        return _cell_value(self.holder)

    def changed(self) -> bool:
        now = self.current()
        if self.tree is None:  # (a module, a function, an object of a library: rebound or not)
            return now is not self.value
        if now is self.value and type(now) is np.ndarray:
            arrays = self.arrays
        else:
            held = _contents(now, None, None)
            if held is None or held[1] != self.tree:
                return True
            arrays = held[0]
        if len(arrays) != len(self.copies):
            return True
        return not all(map(_same_values, arrays, self.copies))


@dataclass(frozen=True)
class _Checksum:
    """What is kept of an array over ``COPY_BYTES``: its shape, dtype and the CRC-32 of its bytes
    (zlib's, about 3.5 GB/s here; a copy would double the memory of a large global)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    crc: int


COPY_BYTES = 1 << 16  # arrays up to this size are kept as copies and compared exactly


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)


def _kept(a: np.ndarray) -> np.ndarray | _Checksum:
    if a.nbytes <= COPY_BYTES or a.dtype.hasobject:
        return a.copy()
    return _Checksum(a.shape, a.dtype, _crc(a))


def _same_values(a: np.ndarray, kept: np.ndarray | _Checksum) -> bool:
    """``a`` holds what ``kept`` recorded: equal bits (NaN equals NaN, -0.0 differs from 0.0),
    compared as unsigned integers of the item's size (several times faster than
    ``np.array_equal(..., equal_nan=True)``), or an equal CRC-32 for a large array."""
    if a.shape != kept.shape or a.dtype != kept.dtype:
        return False
    if isinstance(kept, _Checksum):
        return _crc(a) == kept.crc
    if a.dtype.itemsize in (1, 2, 4, 8) and not a.dtype.hasobject:
        bits = np.dtype(f"u{a.dtype.itemsize}")
        return bool(np.array_equal(a.view(bits), kept.view(bits)))
    return bool(np.array_equal(a, kept, equal_nan=a.dtype.kind in "fc"))


def _contents(value: Any, module: str | None, traced: Callable[[Any], bool] | None) -> tuple[list, Any] | None:
    """The array leaves ``value`` holds (ndarrays and numpy scalars, as arrays; the values
    ``traced`` says are traced) and its TreeDef, for an array, a number, a dict, list or tuple and,
    when ``module`` is None or is the object's class's module, an object; None for anything else
    (compared by identity)."""
    if type(value) is np.ndarray or (traced is not None and traced(value)):
        return [value], LEAF
    if not isinstance(value, (dict, list, tuple)) and not isinstance(value, STATIC_TYPES + (np.generic,)):
        if value is _MISSING or isinstance(value, _NOT_HOLDERS):
            return None
        if _attributes(value) is None or (module is not None and type(value).__module__ != module):
            return None
    try:
        leaves, tree = flatten(value, is_leaf=traced)
    except Exception:  # (not looked into: a class with only __slots__, an object that raises)
        return None
    return [x if type(x) is np.ndarray or (traced is not None and traced(x)) else np.asarray(x) for x in leaves], tree


_GLOBAL_OPS = {"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"}


def _names_read(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the functions nested in it read (not its attribute names)."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const)
    return names


def global_reads(
    functions: Iterable[tuple[types.FunctionType, SourceLoc | None]],
    traced: Callable[[Any], bool],
    written: frozenset[tuple[int, str]] = frozenset(),
) -> tuple[tuple[GlobalRead, ...], list[tuple[str, SourceLoc | None, str]]]:
    """What the global and closure names of ``functions`` (each with where it is defined) hold
    that is an array or holds arrays, once per name and holder; and (function, where, name) for
    each that now holds a value ``traced`` says is traced (stored there while tracing:
    ``state["m"] = 0.9 * state["m"] + g`` on a global dict), which no call can write back.
    ``written``: the (id of holder, name) places the trace changed, not compared."""
    out: list[GlobalRead] = []
    stored: list[tuple[str, SourceLoc | None, str]] = []
    seen: set[tuple[int, str]] = set()
    for fn, loc in functions:
        module = fn.__module__
        for name, holder, value in _places(fn):
            if (id(holder), name) in seen:
                continue
            seen.add((id(holder), name))
            held = _contents(value, module, traced)
            if (id(holder), name) in written and not (held is not None and any(map(traced, held[0]))):
                continue  # (side-effect state the function wrote: HeldState.modified)
            if held is None and isinstance(value, types.ModuleType):
                continue  # (``np`` rebound: not a thing programs do)
            if held is None:
                out.append(GlobalRead(name, fn.__qualname__, loc, holder, value, [], []))
            elif any(map(traced, held[0])):
                stored.append((fn.__qualname__, loc, name))
            else:
                copies = [_kept(a) for a in held[0]]
                out.append(GlobalRead(name, fn.__qualname__, loc, holder, value, held[0], copies, held[1]))
    return tuple(out), stored


def changed_read(reads: tuple[GlobalRead, ...]) -> GlobalRead | None:
    """The first of ``reads`` whose arrays no longer hold the values they had at the trace."""
    for read in reads:
        if read.changed():
            return read
    return None


@dataclass(eq=False)
class HeldState:
    """What one global or closure name held before a traced function ran, one level deep: the
    value, and a shallow copy of a dict's items, a list's items or an object's attributes."""

    holder: Any
    name: str
    value: Any
    contents: Any
    rng_state: Any = None  # a numpy Generator's or RandomState's state

    def modified(self) -> bool:
        """The traced function changed what the name holds (``calls.append(1)``, ``stats["n"] +=
        1``, ``global n; n += 1``): state it writes as a side effect, which numpy would change at
        every call and graphc changes once, at the trace; not compared after (a trace counter would
        refuse every call)."""
        now = self.holder.get(self.name, _MISSING) if isinstance(self.holder, dict) else _cell_value(self.holder)
        if now is not self.value:
            return True
        value, contents = self.value, self.contents
        if isinstance(value, dict):
            return value.keys() != contents.keys() or any(value[k] is not contents[k] for k in value)
        if isinstance(value, list):
            return len(value) != len(contents) or any(a is not b for a, b in zip(value, contents))
        if contents is not None:
            now_attrs = _attributes(value) or {}
            return now_attrs.keys() != contents.keys() or any(now_attrs[k] is not contents[k] for k in now_attrs)
        return False

    def drew(self) -> bool:
        """The value is a numpy random generator that was drawn from since (by numpy, at the trace:
        numbers a graph would keep as constants); its state is put back."""
        if self.rng_state is None:
            return False
        now = _rng_state(self.value)
        if _same_state(now, self.rng_state):
            return False
        if isinstance(self.value, np.random.Generator):
            self.value.bit_generator.state = self.rng_state
        else:
            self.value.set_state(self.rng_state)
        return True

    def restore(self, traced: Callable[[Any], bool]) -> None:
        """Put back what was there if a traced value was stored in it (the name, or one of the
        value's items or attributes)."""
        if isinstance(self.holder, dict):
            if traced(self.holder.get(self.name)):
                self.holder[self.name] = self.value
        elif traced(_cell_value(self.holder)):
            self.holder.cell_contents = self.value
        value, contents = self.value, self.contents
        if isinstance(value, dict) and any(map(traced, value.values())):
            value.clear()
            value.update(contents)
        elif isinstance(value, list) and any(map(traced, value)):
            value[:] = contents
        elif contents is not None and not isinstance(value, (dict, list)) and any(map(traced, vars(value).values())):
            vars(value).clear()
            vars(value).update(contents)


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # (a cell emptied by del)
        return _MISSING


def _places(fn: types.FunctionType) -> list[tuple[str, Any, Any]]:
    """(name, holder, value) of each global name ``fn``'s code reads that its module holds (the
    holder: the module's dict) and of each of its closure variables that holds a value (the
    holder: the cell)."""
    namespace = fn.__globals__
    out: list[tuple[str, Any, Any]] = [
        (name, namespace, namespace[name]) for name in sorted(_names_read(fn.__code__)) if name in namespace
    ]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        value = _cell_value(cell)
        if value is not _MISSING:
            out.append((name, cell, value))
    return out


def function_of(fn: Any) -> types.FunctionType | None:
    """The Python function a call of ``fn`` runs: itself, a method's or a partial's function, or a
    callable object's class's ``__call__``; None for anything else."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, (types.FunctionType, type)):
        fn = inspect.getattr_static(type(fn), "__call__", None)
    return fn if isinstance(fn, types.FunctionType) else None


def held_state(fn: types.FunctionType) -> list[HeldState]:
    """HeldState of the global and closure names ``fn`` reads that hold a dict, a list or an
    object of ``fn``'s module (taken before it runs while traced)."""
    out = []
    module = fn.__module__
    for name, holder, value in _places(fn):
        if isinstance(value, dict):
            out.append(HeldState(holder, name, value, dict(value)))
        elif isinstance(value, list):
            out.append(HeldState(holder, name, value, list(value)))
        elif type(value).__module__ == module and isinstance(_attributes(value), dict):
            out.append(HeldState(holder, name, value, dict(vars(value))))
        elif isinstance(value, (np.random.Generator, np.random.RandomState)):
            out.append(HeldState(holder, name, value, None, _rng_state(value)))
        else:
            out.append(HeldState(holder, name, value, None))
    return out


def _rng_state(value: Any) -> Any:
    if isinstance(value, np.random.Generator):
        return value.bit_generator.state
    return value.get_state(legacy=False)


def _same_state(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _attributes(value: Any) -> Any:
    """``value.__dict__``, or None (an object whose attribute access raises: a lazy proxy)."""
    try:
        return getattr(value, "__dict__", None)
    except Exception:
        return None
