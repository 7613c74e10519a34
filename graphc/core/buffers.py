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
