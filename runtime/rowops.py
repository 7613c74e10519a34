"""Row reductions for the generated kernels.

A kernel loop that accumulates ``acc += v`` under strict IEEE rules is one long dependency chain
and does not vectorize, and allowing reassociation for a whole kernel would also regroup its other
arithmetic (x * 1e-30 * 1e-30 could underflow). So a phase loop stores the values it reduces in a
row buffer and these functions reduce the row: sums through an add that alone may re-associate
(float64 partial sums for floats), max/min through llvm.maximum/minimum, which propagate NaN as
numpy does and vectorize without fast-math flags.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from graphc.runtime.fastmath import _maximum, _radd

_JIT = dict(nogil=True, cache=True, error_model="numpy")


@intrinsic
def _minimum(typingctx, a, b):
    """min(a, b) propagating nan (llvm.minimum)."""
    if not isinstance(a, types.Float) or b != a:
        return None

    def codegen(context, builder, sig, args):
        fty = context.get_value_type(a)
        fn = builder.module.declare_intrinsic("llvm.minimum", [fty], ir.FunctionType(fty, [fty, fty]))
        return builder.call(fn, args)

    return a(a, a), codegen


@numba.njit(**_JIT)
def row_sum_f(row):
    acc = np.float64(0.0)
    for j in range(row.size):
        acc = _radd(acc, np.float64(row[j]))
    return acc


@numba.njit(**_JIT)
def row_sum_i(row):
    acc = 0
    for j in range(row.size):
        acc += row[j]
    return acc


@numba.njit(**_JIT)
def row_max_f(row):
    acc = row[0]
    for j in range(row.size):
        acc = _maximum(acc, row[j])
    return acc


@numba.njit(**_JIT)
def row_min_f(row):
    acc = row[0]
    for j in range(row.size):
        acc = _minimum(acc, row[j])
    return acc


@numba.njit(**_JIT)
def row_max_i(row):
    acc = row[0]
    for j in range(row.size):
        acc = max(acc, row[j])
    return acc


@numba.njit(**_JIT)
def row_min_i(row):
    acc = row[0]
    for j in range(row.size):
        acc = min(acc, row[j])
    return acc
