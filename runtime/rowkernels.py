"""Hand-written fused float32 kernels over rows: GELU, softmax and layer norm, built on the
vectorizable functions of runtime/fastmath.py.

These are the kernels ``graphc bench fastmath`` measures against numpy and a memory copy, and the
yardstick for what the kernels graphc generates for a fused region (runtime/kernelsource.py) can
reach; graphc's runtime does not call them. They are single-thread ``nogil`` loops (a caller
drives the threads) with ``error_model="numpy"`` (Python's error model puts a ZeroDivisionError
branch on every float division, which alone keeps a loop from vectorizing).

Reductions vectorize under strict IEEE flags: the row max through llvm.maximum, sums through radd
(an fadd that alone may re-associate, so LLVM splits it into vector partial sums). Rows are
software-pipelined: the pass that finishes row i also reads row i+1 (its max, or its
mean/variance sums), so those DRAM loads overlap arithmetic instead of stalling a pass of their
own. A row stays in L1/L2 between the passes over it: memory traffic is one read of x and one
write of out.
"""

from __future__ import annotations

import numba
import numpy as np

from graphc.runtime.fastmath import HALF_F, ONE_F, ZERO_F, F, exp_shifted32, maximum, radd, tanh32

__all__ = ["gelu_f32", "softmax_lastaxis_f32", "layernorm_lastaxis_f32"]

NEG_INF_F = F(-np.inf)
GELU_C = F(np.sqrt(2.0 / np.pi))
GELU_A = F(0.044715)
SUM_BLOCK = 1024  # softmax sums in float32 within blocks of this many elements, in float64 across
_kernel = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


@_kernel
def _row_max(row):
    """max of a float32 row, nan if any element is nan (as numpy)."""
    m = NEG_INF_F
    for j in range(row.size):
        m = maximum(m, row[j])
    return m


@_kernel
def _exp_sum_max_block(r, shift, o, nx):
    """o = exp(r - shift) and, in the same pass, the max of nx (a block of the next row).
    Returns (float32 sum of o, max of nx)."""
    s = ZERO_F
    m = NEG_INF_F
    for j in range(r.size):
        e = exp_shifted32(r[j] - shift)
        o[j] = e
        s = radd(s, e)
        m = maximum(m, nx[j])
    return s, m


@_kernel
def _row_exp_sum_max(row, shift, orow, nxt):
    """_exp_sum_max_block over a row in blocks of SUM_BLOCK. Returns (float64 sum, max of nxt)."""
    n = row.size
    if n <= SUM_BLOCK:
        s, m = _exp_sum_max_block(row, shift, orow, nxt)
        return np.float64(s), m
    total = 0.0
    m = NEG_INF_F
    for j0 in range(0, n, SUM_BLOCK):
        j1 = min(j0 + SUM_BLOCK, n)
        s, bm = _exp_sum_max_block(row[j0:j1], shift, orow[j0:j1], nxt[j0:j1])
        total += np.float64(s)
        m = maximum(m, bm)
    return total, m


@_kernel
def _moments(n, c, s1, s2):
    """(mean, biased variance) from n, the shift c and the float64 sums of d = x - c and d*d. The shift
    (the row's first element) keeps the one-pass formula free of cancellation unless the row is
    far off-centre around its first element by many standard deviations."""
    m1 = s1 / n
    var = s2 / n - m1 * m1
    return c + m1, var if var > 0.0 else 0.0


@_kernel
def _row_stats(row):
    c = np.float64(row[0])
    s1 = 0.0
    s2 = 0.0
    for j in range(row.size):
        d = np.float64(row[j]) - c
        s1 = radd(s1, d)
        s2 = radd(s2, d * d)
    return _moments(row.size, c, s1, s2)


@_kernel
def _norm_row_stats_next(row, mean, rstd, g, b, orow, nxt):
    """orow = (row - mean) * rstd * g + b (in float64: the exact result rounded once) and, in the same
    pass, the moments of nxt (the next row)."""
    c = np.float64(nxt[0])
    s1 = 0.0
    s2 = 0.0
    for j in range(row.size):
        orow[j] = np.float32((np.float64(row[j]) - mean) * (rstd * np.float64(g[j])) + np.float64(b[j]))
        d = np.float64(nxt[j]) - c
        s1 = radd(s1, d)
        s2 = radd(s2, d * d)
    return _moments(nxt.size, c, s1, s2)


@_kernel
def gelu_f32(x, out):
    """out = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3))) for C-contiguous float32 arrays,
    evaluated as written (in float32, with tanh32)."""
    if out.size != x.size:
        raise ValueError("gelu_f32: out and x differ in size")
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    for i in range(xf.size):
        v = xf[i]
        u = GELU_C * (v + GELU_A * (v * v * v))
        of[i] = HALF_F * v * (ONE_F + tanh32(u))


@_kernel
def softmax_lastaxis_f32(x, out):
    """out = exp(x - max) / sum(exp(x - max)) along the last axis (C-contiguous float32, ndim >= 1)."""
    if out.size != x.size:
        raise ValueError("softmax_lastaxis_f32: out and x differ in size")
    n = x.shape[-1]
    if n == 0 or x.size == 0:
        return
    rows = x.size // n
    x2 = x.reshape(rows, n)
    o2 = out.reshape(rows, n)
    # exp(x - max) goes to an L1/L2-resident scratch row, not to out: reading freshly stored out lines
    # back for the division would wait for their write-allocate fills from DRAM (measured: +70%)
    tmp = np.empty(n, np.float32)
    m = _row_max(x2[0])
    for i in range(rows):
        total, m_next = _row_exp_sum_max(x2[i], m, tmp, x2[min(i + 1, rows - 1)])
        inv = np.float32(1.0 / total)
        orow = o2[i]
        for j in range(n):
            orow[j] = tmp[j] * inv
        m = m_next


@_kernel
def layernorm_lastaxis_f32(x, g, b, out, eps):
    """out = (x - mean) / sqrt(var + eps) * g + b over the last axis (biased variance, as numpy's
    ``x.var(-1)``); g and b have shape (n,); C-contiguous float32. Statistics in float64."""
    n = x.shape[-1]
    if out.size != x.size or g.size != n or b.size != n:
        raise ValueError("layernorm_lastaxis_f32: out must match x, g and b have x.shape[-1] elements")
    if n == 0 or x.size == 0:
        return
    rows = x.size // n
    x2 = x.reshape(rows, n)
    o2 = out.reshape(rows, n)
    mean, var = _row_stats(x2[0])
    for i in range(rows):
        rstd = 1.0 / np.sqrt(var + eps)
        mean, var = _norm_row_stats_next(x2[i], mean, rstd, g, b, o2[i], x2[min(i + 1, rows - 1)])
