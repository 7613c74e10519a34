"""Which numpy buffer an array looks into, and results that never share one with the arguments.

A result graphc hands to a caller is its own array: writing into it never changes an argument or
another result (numpy's ``np.copy(x)``, ``x * 1`` and ``(x * 2, x * 2)`` give new arrays, and
graphc's simplification may leave an output that is an input, or one value returned twice). Unlike
numpy, graphc hands out a new array even where numpy's result would be a view of an argument
(``lambda x: x.T``), as ``jax.jit`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def root_buffer(x: Any) -> np.ndarray | None:
    """The array whose buffer ``x`` looks into (``x`` itself when it owns its data); None for
    anything that is not an ndarray."""
    if type(x) is not np.ndarray:
        return None
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def unaliased(outs: list, args: Sequence[Any]) -> list:
    """``outs`` with every array that looks into the buffer of one of ``args`` or of an earlier
    result replaced by a copy (in place; returned). Other objects are left as they are."""
    taken = {id(r) for r in map(root_buffer, args) if r is not None}
    for k, o in enumerate(outs):
        r = root_buffer(o)
        if r is None:
            continue
        if id(r) in taken:
            outs[k] = r = o.copy()
        taken.add(id(r))
    return outs


def _memory_key(x: np.ndarray) -> int:
    """Arrays that may share memory have equal keys: their root array, or the foreign buffer
    (bytes, mmap) that root looks into."""
    r = root_buffer(x)
    assert r is not None
    return id(r.base) if r.base is not None else id(r)


def written_overlap(arrays: Sequence[Any], written: Sequence[int]) -> tuple[int, int] | None:
    """The first pair ``(i, j)``: ``arrays[i]``, one the function writes into in place (``written``:
    its indices), shares memory with ``arrays[j]`` (the same array passed twice, a tied weight held
    under two names, a view of it); None if there is none. One walk of the arguments and exact
    checks (``np.shares_memory``) only between arrays over one buffer: x[::2] and x[1::2] do not
    overlap."""
    keys = [_memory_key(a) if type(a) is np.ndarray else None for a in arrays]
    groups: dict[int, list[int]] = {}
    for k, key in enumerate(keys):
        if key is not None:
            groups.setdefault(key, []).append(k)
    if len(groups) == len(arrays) - keys.count(None):  # (every array over its own buffer)
        return None
    for i in written:
        key = keys[i]
        for j in groups[key] if key is not None else ():
            if j != i and np.shares_memory(arrays[i], arrays[j]):
                return i, j
    return None


def foreign_semantics(x: Any) -> str | None:
    """Why graphc cannot compute with ``x`` as numpy would, for the ndarray subclasses whose
    operators mean something else (wrong29: ``np.matrix``'s ``*`` is a matrix product, a masked
    array's ``sum`` skips its masked items; graphc computed elementwise on all items); None for
    every other value (cheap: one type check for a plain ndarray), a masked array with nothing
    masked included (its values are its data's)."""
    if type(x) is np.ndarray or not isinstance(x, np.ndarray):
        return None
    if isinstance(x, np.matrix):
        return "a numpy.matrix, whose * and ** are matrix products; pass np.asarray(...) and use @"
    if isinstance(x, np.ma.MaskedArray) and np.ma.getmask(x) is not np.ma.nomask and bool(np.ma.getmask(x).any()):
        return (
            "a numpy masked array with masked items, which its operations skip; pass np.ma.filled(x, value) "
            "(or its .data and its mask as two arrays)"
        )
    return None
