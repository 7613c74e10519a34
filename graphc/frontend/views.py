"""numpy's views of traced arrays, functionalized.

numpy returns views from basic indexing (``x[1:]``, ``x[0]`` of a matrix, ``x[..., None]``), ``x.T``
and the functions in ``tracer.VIEW_FUNCTIONS`` (reshape, transpose, flip, split, ...): arrays that
share memory with their base, so that a write into either shows in the other. A graph has no
shared memory, so a view Tracer remembers its root (the array whose memory it shows, which is not
itself a view) and the steps that compute it from the root. Each step knows how to read the view
from its base and how to write a new value of the view back into the base:

  Index(key)         x[key] for a basic key (ints, slices, None, ...)   write: x with x[key] = v
  Reshape(shape)     x.reshape(shape)                                  write: v reshaped back
  Transpose(perm)    x.transpose(perm)                                 write: v transposed back
  Broadcast(shape)   np.broadcast_to(x, shape)                         read-only, as numpy's
  Positions(...)     a numpy view of a numpy buffer that traced values were written into
                     (frontend/shadows.py): a gather of its elements    write: a scatter
  Diagonal(...)      np.einsum('ii->i', x) and other diagonals           write: a scatter

The root keeps a version, bumped by every in-place write (``tracer.rebind``); a view computed at an
older version is computed again when it is next read (``Tracer._value``). A write into a view goes
back through the steps into the root (``tracer._write_through``), so the root and every other view
of it see it. For reshape and ravel, which numpy makes views only when the memory layout allows,
numpy decides on a stand-in for the view's strides (``layout``: a numpy array of the view's shape
and strides over a one-element buffer, only ever sliced, transposed and reshaped with
``copy=False``, which read no memory). Arrays made inside the traced function (and traced
arguments) count as C-contiguous, as numpy makes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.errors import TraceError
from graphc.core.ir import Value
from graphc.core.traits import ViewOf
from graphc.frontend.tracer import HANDLERS, VIEW_FUNCTIONS, Tracer, bind, fresh, lift, user_location
from graphc.ops import OPS

# --- the steps ----------------------------------------------------------------------------------


def _reshape(x: Tracer, shape: tuple[int, ...]) -> Tracer:
    return x if x.shape == shape else bind("reshape", x, shape=shape)


def _transpose(x: Tracer, perm: tuple[int, ...]) -> Tracer:
    return x if perm == tuple(range(x.ndim)) else bind("transpose", x, perm=perm)


class Step:
    """One step from a base to its view."""

    def read(self, base: Tracer) -> Tracer:
        raise NotImplementedError

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        """The new value of ``base`` after its view takes the value ``view``."""
        raise NotImplementedError

    def check_writable(self) -> None:
        """Raise numpy's error for a write into a read-only view."""

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        """The layout stand-in of the view from its base's (see ``layout``)."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Index(Step):
    """``x[key]`` for a basic key (``shape``: the view's); traced integers and slice bounds in it
    are fixed when the view is taken (later writes into them do not move the view, as in numpy)."""

    key: Any
    shape: tuple[int, ...]

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        out = stand_in[_layout_key(self.key)]
        if out.shape != self.shape:  # (a slice with traced bounds: its length; a step-1 slice keeps the strides)
            out = np.lib.stride_tricks.as_strided(out, self.shape, out.strides)
        return out

    def read(self, base: Tracer) -> Tracer:
        getitem = HANDLERS.getitem
        assert getitem is not None  # (frontend/indexing.py registers it)
        return getitem(base, self.key)

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        key = self.key
        flipped = _unit_reversed(base.shape, key)
        if flipped is not None:  # x[::-1] = v is x[:] = v[::-1]: a block update instead of a scatter
            key, dims = flipped
            view = bind(
                "slice",
                view,
                starts=tuple(n - 1 if d in dims and n else 0 for d, n in enumerate(view.shape)),
                stops=tuple(-1 if d in dims and n else n for d, n in enumerate(view.shape)),
                steps=tuple(-1 if d in dims and n else 1 for d, n in enumerate(view.shape)),
            )
        setitem = HANDLERS.setitem
        assert setitem is not None  # (frontend/indexing.py registers it)
        return setitem(base, key, view)


def _unit_reversed(shape: tuple[int, ...], key: Any) -> tuple[tuple, set[int]] | None:
    """For a key of static slices only, some with step -1: the same elements as a key of step-1
    slices, and the dims (of the view) to reverse. None for other keys."""
    parts = key if type(key) is tuple else (key,)
    if len(parts) != len(shape) or not all(type(k) is slice for k in parts):
        return None
    if any(isinstance(b, Tracer) for k in parts for b in (k.start, k.stop, k.step)):
        return None
    out, dims = [], set()
    for d, (k, n) in enumerate(zip(parts, shape)):
        start, stop, step = k.indices(n)
        if step == 1:
            out.append(slice(start, stop))
        elif step == -1:
            length = len(range(start, stop, step))
            out.append(slice(start - length + 1, start + 1) if length else slice(0, 0))
            dims.add(d)
        else:
            return None
    return (tuple(out), dims) if dims else None


@dataclass(frozen=True, eq=False)
class Reshape(Step):
    shape: tuple[int, ...]
    base_shape: tuple[int, ...]

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        return stand_in.reshape(self.shape, copy=False)  # (a view: the layout allowed it)

    def read(self, base: Tracer) -> Tracer:
        return _reshape(base, self.shape)

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        return _reshape(view, self.base_shape)


@dataclass(frozen=True, eq=False)
class Transpose(Step):
    perm: tuple[int, ...]

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        return stand_in.transpose(self.perm)

    def read(self, base: Tracer) -> Tracer:
        return _transpose(base, self.perm)

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        return _transpose(view, tuple(int(i) for i in np.argsort(self.perm)))


@dataclass(frozen=True, eq=False)
class Broadcast(Step):
    """np.broadcast_to, np.broadcast_arrays: elements repeated without copies. numpy's broadcast_to
    is read-only; writing into broadcast_arrays' results is deprecated (and would write one element
    into every place that repeats it), so both are read-only here."""

    shape: tuple[int, ...]

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        return np.broadcast_to(stand_in, self.shape)

    def read(self, base: Tracer) -> Tracer:
        return base if base.shape == self.shape else bind("broadcast_to", base, shape=self.shape)

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        self.check_writable()
        return base  # (not reached)

    def check_writable(self) -> None:
        raise TraceError(
            "assignment destination is read-only: this array is a broadcast view (np.broadcast_to; numpy deprecates "
            "writing into np.broadcast_arrays' results); copy it first (np.array(np.broadcast_to(x, shape)))",
            user_location(),
        )


@dataclass(frozen=True, eq=False)
class Positions(Step):
    """A view given by the flat positions of its elements in the base (``positions`` has the
    view's shape): a numpy view of a numpy buffer whose Tracer stands for the buffer now, whose
    layout stand-in is ``strides``'."""

    positions: np.ndarray
    strides: tuple[int, ...]

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(stand_in, self.positions.shape, self.strides)

    def read(self, base: Tracer) -> Tracer:
        flat = _reshape(base, (base.size,))
        return bind("gather", flat, lift(self.positions), axis=0)

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        if self.positions.size == 0:
            return base
        flat = _reshape(base, (base.size,))
        new = bind("scatter", flat, lift(self.positions), view, axis=0)
        return _reshape(new, base.shape)


@dataclass(frozen=True, eq=False)
class Diagonal(Step):
    """``np.einsum(equation, x)`` of one operand that repeats a letter and sums nothing
    ('ii->i', 'iij->ji'): numpy's (writeable) view of a diagonal. ``positions`` (the view's shape)
    are its elements' flat positions in the base."""

    equation: str
    positions: np.ndarray

    def lay(self, stand_in: np.ndarray) -> np.ndarray:
        return np.einsum(self.equation, stand_in)  # (numpy's view: it reads no memory)

    def read(self, base: Tracer) -> Tracer:
        return Positions(self.positions, ()).read(base)

    def write(self, base: Tracer, view: Tracer) -> Tracer:
        return Positions(self.positions, ()).write(base, view)


# --- making views ---------------------------------------------------------------------------------


def diagonal_view(base: Tracer, equation: str, result: Tracer) -> Tracer:
    """``result``, the value of ``np.einsum(equation, base)`` (one operand, a repeated letter,
    nothing summed), as numpy returns it: a view of ``base``'s diagonal."""
    positions = np.einsum(equation, np.arange(base.size).reshape(base.shape)).copy()
    return view_of(base, [Diagonal(equation, positions)], result)


def _standin(shape: tuple[int, ...]) -> np.ndarray:
    """A C-contiguous layout of ``shape``: strides over a one-element buffer (never read)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape, tuple(reversed(strides)))


def layout(x: Tracer) -> np.ndarray:
    """A stand-in with the shape and strides numpy would give ``x`` (the module doc): C-contiguous
    for an array, its steps applied to its root's for a view (computed when first asked for)."""
    if x._layout is None:
        root = x._root
        stand_in = _standin((root if root is not None else x).shape)
        for step in x._steps:
            stand_in = step.lay(stand_in)
        x._layout = stand_in
    return x._layout


def view_of(base: Tracer, steps: list[Step], value: Tracer) -> Tracer:
    """A new view object: ``base`` (an array or a view) followed by ``steps``, whose current value
    is ``value``; a new array when ``base`` is a numpy scalar (which shares its memory with no
    array: numpy's reshape, ravel, atleast_1d or ``s[...]`` of one is a new array)."""
    if base._scalar:
        return fresh(value)
    root = base._root if base._root is not None else base
    current = value._value  # (first: brought up to date if ``value`` is itself a view)
    view = Tracer(value._c, current, value._weak)
    view._root = root
    view._steps = base._steps + tuple(steps)
    view._version = root._version
    return view


def _fixed(key: Any) -> Any:
    """The key with its traced parts copied (a later in-place write into an index variable does
    not move a view taken with it)."""
    if isinstance(key, Tracer):
        return fresh(key)
    if type(key) is tuple:
        return tuple(_fixed(k) for k in key)
    if type(key) is slice:
        return slice(_fixed(key.start), _fixed(key.stop), _fixed(key.step))
    return key


def is_basic_key(key: Any) -> bool:
    """numpy's ``x[key]`` is a view (basic indexing): ints, slices, None and Ellipsis; a traced
    0-d integer stands for a numpy integer."""
    parts = key if type(key) is tuple else (key,)
    return all(
        k is None
        or k is Ellipsis
        or (isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)))
        or isinstance(k, slice)
        or (isinstance(k, Tracer) and not k.shape and k.dtype.kind in "iu")
        for k in parts
    )


def _layout_key(key: Any) -> Any:
    """The key as numpy can apply it to a layout stand-in: a traced integer as 0, a slice with
    traced bounds whole (its length is set from the result; a step-1 slice keeps the strides)."""
    parts = key if type(key) is tuple else (key,)
    out: list[Any] = []
    for k in parts:
        if isinstance(k, Tracer):
            out.append(0)
        elif isinstance(k, slice) and any(isinstance(b, Tracer) for b in (k.start, k.stop, k.step)):
            out.append(slice(None))
        else:
            out.append(k)
    return tuple(out)


def index_view(base: Tracer, key: Any, result: Tracer) -> Tracer:
    """``base[key]`` as numpy returns it: a view for a basic key, else the (new) result."""
    if not is_basic_key(key):
        return fresh(result) if result is base else result
    return view_of(base, [Index(_fixed(key), result.shape)], result)


# functions that return their argument itself when there is nothing to do (numpy does too). (Sets of
# the numpy functions taken when graphc is imported: while a trace runs, ``np.reshape`` and others
# are wrappers, entry.py numpy_patches.)
_SAME_OBJECT = {np.asarray, np.atleast_1d, np.atleast_2d, np.atleast_3d, np.squeeze}
_RAVEL = np.ravel
_FLIP = np.flip  # (np.flip of a 0-d array is m[()]: a numpy scalar, a copy)
_LAYOUT_DEPENDENT = {np.reshape, np.ravel}  # views only where the memory layout allows


def _chain(base: Tracer, result: Tracer) -> list[tuple[str, dict[str, Any]]] | None:
    """The view ops (slice, split, reshape, transpose, broadcast_to) that computed ``result`` from
    ``base``'s value, first op first; None if it was computed some other way (a copy)."""
    target: Value = base._value
    value: Value = result._value
    ops = []
    while value is not target:
        node = value.producer
        if node is None or not node.op.has(ViewOf):
            return None
        if node.op is OPS.split:  # piece k of split(x, indices, axis): a slice along the axis
            x = node.inputs[0].type
            axis, bounds = node.attrs["axis"], (0, *node.attrs["indices"], x.shape[node.attrs["axis"]])
            lo, hi = bounds[value.index], bounds[value.index + 1]
            starts = tuple(lo if d == axis else 0 for d in range(x.ndim))
            stops = tuple(hi if d == axis else n for d, n in enumerate(x.shape))
            ops.append(("slice", {"starts": starts, "stops": stops, "steps": (1,) * x.ndim}))
        else:
            ops.append((node.op.name, dict(node.attrs)))
        value = node.inputs[0]
    return ops[::-1]


def _steps_of(ops: list[tuple[str, dict[str, Any]]], base: Tracer) -> list[Step]:
    """The steps of a view computed by ``ops`` from ``base``."""
    shape = base.shape
    steps: list[Step] = []
    for name, attrs in ops:
        # the names the tracer recorded for this view (Tracer view records are (op name, attrs)
        # pairs kept by the frontend alone; the graph's nodes are asked by trait elsewhere)
        if name == "slice":
            key = tuple(
                slice(a, None if b < 0 else b, s) for a, b, s in zip(attrs["starts"], attrs["stops"], attrs["steps"])
            )
            shape = tuple(len(range(a, b, s)) for a, b, s in zip(attrs["starts"], attrs["stops"], attrs["steps"]))
            steps.append(Index(key, shape))
        elif name == "reshape":
            steps.append(Reshape(tuple(attrs["shape"]), shape))
            shape = tuple(attrs["shape"])
        elif name == "transpose":
            steps.append(Transpose(tuple(attrs["perm"])))
            shape = tuple(shape[p] for p in attrs["perm"])
        else:
            steps.append(Broadcast(tuple(attrs["shape"])))
            shape = tuple(attrs["shape"])
    return steps


def _allows_view(steps: list[Step], base: Tracer) -> bool:
    """Whether numpy's layout of ``base`` lets the reshapes among ``steps`` be views."""
    stand_in = layout(base)
    try:
        for step in steps:
            stand_in = step.lay(stand_in)
    except ValueError:  # (ndarray.reshape with copy=False: numpy would copy)
        return False
    return True


def function_views(func: Callable, result: Any, args: tuple) -> Any:
    """The results of a function in VIEW_FUNCTIONS as numpy returns them: views of the argument
    they were computed from, or (np.reshape, np.ravel when the layout does not allow a view) copies."""
    assert func in VIEW_FUNCTIONS
    bases = [a for a in args if isinstance(a, Tracer)]
    if isinstance(result, (list, tuple)):
        return type(result)(_as_view(func, r, bases) for r in result)
    return _as_view(func, result, bases)


def _as_view(func: Callable, r: Any, bases: list[Tracer]) -> Any:
    if not isinstance(r, Tracer):
        return r
    if func is _FLIP and r.ndim == 0:
        scalar = fresh(r)
        scalar._scalar = True
        return scalar
    for base in bases:
        if r is base:
            if func in _SAME_OBJECT:
                return r
            return view_of(base, [], fresh(r))  # a new array object, the same memory
        ops = _chain(base, r)
        if ops is None:
            continue
        steps = _steps_of(ops, base)
        if func in _LAYOUT_DEPENDENT:
            if func is _RAVEL and not layout(base).flags.c_contiguous:
                return fresh(r)  # numpy's ravel copies what is not C-contiguous
            if not _allows_view(steps, base):
                return fresh(r)
        return view_of(base, steps, r)
    return r


HANDLERS.index_view = index_view
HANDLERS.function_views = function_views
