"""ndarray's operators and methods on traced arrays, each one calling numpy's own function, so
every rule lives in one place: the handler numpy dispatches that function to (``__array_ufunc__``
/ ``__array_function__`` on ``Tracer``, frontend/tracer.py). ``Tracer`` inherits them; the few
that need more than numpy's function (``**``'s fast paths, copies, ``astype``, indexing) are
defined on it. ``FlatReader`` is what ``x.flat`` gives."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core.errors import TraceError
from graphc.frontend.locations import user_location


class NdarrayMethods:
    """The operators and methods of numpy's ndarray, routed through numpy (a mixin of Tracer,
    whose ``_inplace(ufunc, other)`` makes the in-place ones update the array itself)."""

    __slots__ = ()

    # Tracer defines these: the protocol numpy's functions take an array-like by (which Tracer
    # answers with a TraceError), and the in-place update of the array itself
    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        raise NotImplementedError

    def _inplace(self, ufunc: np.ufunc, other: Any) -> Any:
        raise NotImplementedError

    # --- operators ---------------------------------------------------------------------------
    def __add__(self, o):
        return np.add(self, o)

    def __radd__(self, o):
        return np.add(o, self)

    def __sub__(self, o):
        return np.subtract(self, o)

    def __rsub__(self, o):
        return np.subtract(o, self)

    def __mul__(self, o):
        return np.multiply(self, o)

    def __rmul__(self, o):
        return np.multiply(o, self)

    def __truediv__(self, o):
        return np.true_divide(self, o)

    def __rtruediv__(self, o):
        return np.true_divide(o, self)

    def __rpow__(self, o):
        return np.power(o, self)

    def __matmul__(self, o):
        return np.matmul(self, o)

    def __rmatmul__(self, o):
        return np.matmul(o, self)

    def __neg__(self):
        return np.negative(self)

    def __pos__(self):
        return np.positive(self)  # (a copy; numpy has no positive for bool)

    def __abs__(self):
        return np.absolute(self)

    def __invert__(self):
        return np.invert(self)

    def __and__(self, o):
        return np.bitwise_and(self, o)

    def __rand__(self, o):
        return np.bitwise_and(o, self)

    def __or__(self, o):
        return np.bitwise_or(self, o)

    def __ror__(self, o):
        return np.bitwise_or(o, self)

    def __xor__(self, o):
        return np.bitwise_xor(self, o)

    def __rxor__(self, o):
        return np.bitwise_xor(o, self)

    def __lshift__(self, o):
        return np.left_shift(self, o)

    def __rlshift__(self, o):
        return np.left_shift(o, self)

    def __rshift__(self, o):
        return np.right_shift(self, o)

    def __rrshift__(self, o):
        return np.right_shift(o, self)

    def __lt__(self, o):
        return np.less(self, o)

    def __le__(self, o):
        return np.less_equal(self, o)

    def __gt__(self, o):
        return np.greater(self, o)

    def __ge__(self, o):
        return np.greater_equal(self, o)

    def __eq__(self, o):
        return np.equal(self, o)

    def __ne__(self, o):
        return np.not_equal(self, o)

    def __floordiv__(self, o):
        return np.floor_divide(self, o)

    def __rfloordiv__(self, o):
        return np.floor_divide(o, self)

    def __mod__(self, o):
        return np.remainder(self, o)

    def __rmod__(self, o):
        return np.remainder(o, self)

    def __divmod__(self, o):
        return np.divmod(self, o)

    def __rdivmod__(self, o):
        return np.divmod(o, self)

    # in-place operators: numpy keeps the left operand's dtype (casting="same_kind") and every
    # reference to this array sees the update; views cannot be updated in place in a graph
    def __iadd__(self, o):
        return self._inplace(np.add, o)

    def __isub__(self, o):
        return self._inplace(np.subtract, o)

    def __imul__(self, o):
        return self._inplace(np.multiply, o)

    def __itruediv__(self, o):
        return self._inplace(np.true_divide, o)

    def __imatmul__(self, o):
        return self._inplace(np.matmul, o)

    def __iand__(self, o):
        return self._inplace(np.bitwise_and, o)

    def __ior__(self, o):
        return self._inplace(np.bitwise_or, o)

    def __ixor__(self, o):
        return self._inplace(np.bitwise_xor, o)

    def __ifloordiv__(self, o):
        return self._inplace(np.floor_divide, o)

    def __imod__(self, o):
        return self._inplace(np.remainder, o)

    # --- methods ------------------------------------------------------------------------------
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return np.reshape(self, shape, order=order)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return np.transpose(self, axes or None)

    def swapaxes(self, a, b):
        return np.swapaxes(self, a, b)

    def squeeze(self, axis=None):
        return np.squeeze(self, axis)

    def dot(self, b):
        return np.dot(self, b)

    def clip(self, min=None, max=None):
        return np.clip(self, min, max)

    def repeat(self, repeats, axis=None):
        return np.repeat(self, repeats, axis)

    def take(self, indices, axis=None):
        return np.take(self, indices, axis)

    def sum(self, axis=None, dtype=None, keepdims=False):
        return np.sum(self, axis, dtype, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False):
        return np.mean(self, axis, dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return np.max(self, axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False):
        return np.min(self, axis, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False):
        return np.argmax(self, axis, keepdims=keepdims)

    def argmin(self, axis=None, keepdims=False):
        return np.argmin(self, axis, keepdims=keepdims)

    def all(self, axis=None, keepdims=False):
        return np.all(self, axis, keepdims=keepdims)

    def any(self, axis=None, keepdims=False):
        return np.any(self, axis, keepdims=keepdims)

    def var(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return np.var(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def std(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return np.std(self, axis, dtype, ddof=ddof, keepdims=keepdims)


class FlatReader:
    """``x.flat``: numpy's 1-d iterator over the array in C order, for reading (``x.flat[i]``,
    ``x.flat[2:5]``, ``for v in x.flat``); writing through it is a TraceError."""

    __slots__ = ("base",)

    def __init__(self, base: Any):  # (a Tracer)
        self.base = base

    def _flat(self) -> Any:
        return np.reshape(self.base, (-1,))

    def __getitem__(self, key):
        return self._flat()[key]

    def __setitem__(self, key, value):
        raise TraceError(
            "writing through x.flat is not supported while tracing; compute the new array instead, as in "
            "x = np.where(np.arange(x.size) == i, v, x.reshape(-1)).reshape(x.shape)",
            user_location(),
        )

    def __len__(self) -> int:
        return self.base.size

    def __iter__(self):
        flat = self._flat()
        return (flat[i] for i in range(flat.shape[0]))

    def __array__(self, dtype=None, copy=None):
        return self.base.__array__(dtype, copy)
