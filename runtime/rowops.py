"""Row reductions for the generated kernels, compiled with reassociation allowed.

A kernel loop that accumulates ``acc += v`` under strict IEEE rules is one long dependency chain
and does not vectorize; allowing reassociation for the whole kernel would also regroup its other
arithmetic (x * 1e-30 * 1e-30 could underflow). So a phase loop stores the values it reduces in a
row buffer, and these functions reduce the row with ``reassoc`` on their own instructions (Numba
links them into the kernel's LLVM module, where they are inlined with their own flags). Sums
accumulate in float64 (int64 for integers); max/min propagate NaN as numpy does.
"""

from __future__ import annotations

import numba
import numpy as np

_JIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc"})


@numba.njit(**_JIT)
def row_sum_f(row):
    acc = 0.0
    for j in range(row.size):
        acc += row[j]
    return acc


@numba.njit(**_JIT)
def row_sum_i(row):
    acc = 0
    for j in range(row.size):
        acc += row[j]
    return acc


@numba.njit(**_JIT)
def row_max_f(row):
    acc = -np.inf
    for j in range(row.size):
        v = row[j]
        acc = v if (v > acc or v != v) else acc
    return acc


@numba.njit(**_JIT)
def row_min_f(row):
    acc = np.inf
    for j in range(row.size):
        v = row[j]
        acc = v if (v < acc or v != v) else acc
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
