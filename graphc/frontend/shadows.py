"""numpy arrays written with traced values.

A numpy array (a buffer from ``np.zeros`` in the traced function) cannot hold traced values. When
one is written with them (``buf[i] = x``, ``np.add.at(buf, idx, x)``, ``np.tanh(x, out=buf)``,
``buf += x``, or any write inside a traced branch or loop body), a Tracer takes its place: its
*shadow*, made once per buffer (the array that owns the memory, numpy's ``.base`` chain) and
written in place from then on, so that every holder of the buffer sees every write:

- the name written through is rebound to the shadow (autograph_runtime.assign, written);
- another name, a list item or a numpy view of the buffer is redirected to it wherever graphc sees
  the numpy array: lifted into the trace (``TraceContext.constant``), indexed, passed to a call,
  written into (autograph_runtime); and the source transform rebinds the function's local names
  that hold the buffer after each statement that may write (``autograph_runtime.aliases``);
- a numpy view of the buffer is a view of the shadow (views.Positions: its elements' positions).

A pure-numpy read of the buffer through a global variable cannot be redirected (numpy never asks
graphc), so writing traced values into a numpy array held by a global variable is a TraceError.
The shadow is made in the trace where the buffer was carried into a traced branch or loop (a
region that writes it carries it out, control.py), else where the first write happens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core.errors import TraceError
from graphc.frontend.locations import user_globals
from graphc.frontend.tracer import (
    HANDLERS,
    TraceContext,
    Tracer,
    current_context,
    emitting_in,
    fresh,
    user_location,
)
from graphc.frontend.views import Positions, view_of


def buffer_of(array: np.ndarray) -> np.ndarray:
    """The numpy array that owns ``array``'s memory (``array`` itself unless it is a view)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def find(array: Any) -> Tracer | None:
    """The Tracer that stands for the numpy array ``array`` (a view of its buffer's shadow when
    ``array`` is a numpy view), or None when no traced value was written into its buffer."""
    ctx = current_context()
    if ctx is None or not isinstance(array, np.ndarray):
        return None
    shadows = ctx.root().shadows
    if not shadows:
        return None
    hit = shadows.get(id(array))
    if hit is not None and hit[0] is array:
        return hit[1]
    buffer = buffer_of(array)
    hit = shadows.get(id(buffer))
    if buffer is array or hit is None or hit[0] is not buffer:
        return None
    return _viewed(hit[1], array, buffer, shadows)


def redirect(x: Any) -> Any:
    """``x``, or the Tracer that stands for it when it is a numpy array written with traced values."""
    found = find(x)
    return x if found is None else found


def any_shadows() -> bool:
    """Whether some numpy array was written with traced values in the current trace."""
    ctx = current_context()
    return ctx is not None and bool(ctx.root().shadows)


def carried_into_region(array: np.ndarray, ctx: TraceContext) -> None:
    """``array`` is a variable of a traced branch or loop being traced in ``ctx``'s child: a shadow
    made for it later is made in ``ctx`` (the outermost such), where the region's result lands."""
    buffer = buffer_of(array)
    homes = ctx.root().shadow_homes
    hit = homes.get(id(buffer))
    if hit is None or hit[0] is not buffer:
        homes[id(buffer)] = (buffer, ctx)


def shadow_of(array: np.ndarray) -> Tracer:
    """The Tracer that a write of traced values into the numpy array ``array`` goes into (made at
    the first such write into its buffer)."""
    found = find(array)
    if found is not None:
        return found
    ctx = current_context()
    assert ctx is not None  # (only called while tracing)
    buffer = buffer_of(array)
    for name, value in user_globals().items():
        if isinstance(value, np.ndarray) and buffer_of(value) is buffer:
            raise TraceError(
                f"this numpy array is (a view of) the global variable {name!r}; writing traced values into it "
                f"would have to change {name} for every later reader, which graphc cannot do while tracing; "
                f"write into a copy (buf = {name}.copy())",
                user_location(),
            )
    root = ctx.root()
    home_hit = root.shadow_homes.get(id(buffer))
    home = home_hit[1] if home_hit is not None and home_hit[0] is buffer else ctx
    with emitting_in(home):
        shadow = fresh(home.constant(buffer))  # (a new array object: the constant itself is shared)
    root.shadows[id(buffer)] = (buffer, shadow)
    return shadow if array is buffer else _viewed(shadow, array, buffer, root.shadows)


def _viewed(shadow: Tracer, array: np.ndarray, buffer: np.ndarray, shadows: dict) -> Tracer:
    """``array``, a numpy view of ``buffer``, as a view of its shadow: one view object per numpy
    view object (it is the same array each time graphc meets it, also through a traced region)."""
    step = Positions(_positions(array, buffer), tuple(s // array.itemsize for s in array.strides))
    with emitting_in(shadow._ctx):
        view = view_of(shadow, [step], step.read(shadow))
    shadows[id(array)] = (array, view)
    return view


def _positions(array: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """The flat positions in ``buffer`` of ``array``'s elements (``array`` a view of it)."""
    size = buffer.itemsize
    offset = array.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]
    if (
        array.dtype != buffer.dtype
        or not buffer.flags.c_contiguous
        or offset % size
        or any(s % size for s in array.strides)
    ):
        raise TraceError(
            "traced values were written into a numpy array that this array is a view of with another dtype or "
            "layout (ndarray.view, a non-contiguous buffer); graphc cannot follow the write into it. Copy the "
            "view before the write (v = v.copy())",
            user_location(),
        )
    flat = np.arange(buffer.size, dtype=np.int64)
    if array.size == 0:
        return np.zeros(array.shape, np.int64)
    strides = tuple(s // size * flat.itemsize for s in array.strides)
    return np.lib.stride_tricks.as_strided(flat[offset // size :], array.shape, strides).copy()


HANDLERS.shadow = find
