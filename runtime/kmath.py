"""Vectorizable float32 exp and tanh for the generated kernels.

numba wheels have no SVML, so ``math.exp``/``math.tanh`` inside a kernel loop are scalar libm
calls and the loop does not vectorize (GELU over 16M float32: ~0.3 s). These versions are
branch-free arithmetic that LLVM vectorizes (with numpy's error model: Python's would add a
zero-division check that stops vectorization), within 1e-6 relative of numpy for normal
float32 results (tests/test_kernels.py).

* ``tanh_f32``: tanh(x) = x P(x^2) / Q(x^2) on [-9, 9] (a (4, 4) rational fitted for relative
  error, max 2.1e-8 in exact arithmetic), evaluated in float32 (max 3.6e-7 relative to numpy);
  for |x| >= 9 the result is exactly +-1 (float32 tanh rounds to 1 there).
* ``exp_f32``: exp(x) = 2^k 2^f with k = round(x log2 e), |f| <= 1/2, in float64; 2^f by its
  Taylor series (degree 7, error < 1e-8), 2^k exactly as a product of selected powers 2^(2^i)
  (no branches, no bit casts); x is clamped to [-110, 90], where float32 exp is 0 or inf anyway.

Both propagate NaN.
"""

from __future__ import annotations

import hashlib
import math

import numba
import numpy as np

_P = tuple(np.float32(c) for c in (0.9999999799939351, 0.13380126044825608, 0.003494510526387109,
                                   2.059103684631065e-05, 1.332924659536161e-08))
_Q = tuple(np.float32(c) for c in (1.0, 0.4671344179315718, 0.025872905998363272, 0.00032838580863411886,
                                   7.766232171732557e-07))
_NINE = np.float32(9.0)
_ONE = np.float32(1.0)

# part of every kernel's source text, so that editing this file gives kernels new cache entries
# (Numba's disk cache does not track the functions a kernel inlines)
VERSION = "kmath-" + hashlib.sha256(open(__file__, "rb").read()).hexdigest()[:12]


@numba.njit(inline="always", cache=True, error_model="numpy")
def tanh_f32(x):
    xc = _NINE if x > _NINE else (-_NINE if x < -_NINE else x)
    u = xc * xc
    p = (((_P[4] * u + _P[3]) * u + _P[2]) * u + _P[1]) * u + _P[0]
    q = (((_Q[4] * u + _Q[3]) * u + _Q[2]) * u + _Q[1]) * u + _Q[0]
    r = np.float32(xc * p / q)
    return _ONE if x >= _NINE else (-_ONE if x <= -_NINE else r)  # exactly +-1 where float32 tanh is


_LN2 = math.log(2.0)
_EXP2_TAYLOR = tuple(_LN2**i / math.factorial(i) for i in range(8))
_POW2 = tuple(2.0 ** (2**i) for i in range(9))  # 2^1, 2^2, 2^4, ..., 2^256
_BIAS = 160  # 2^k = 2^(k + 160) * 2^-160, with k + 160 in [0, 511]


@numba.njit(inline="always", cache=True, error_model="numpy")
def exp_f32(x):
    xd = np.float64(x)
    xc = 90.0 if xd > 90.0 else (-110.0 if xd < -110.0 else xd)
    t = xc * 1.4426950408889634
    k = math.floor(t + 0.5)
    f = t - k
    c = _EXP2_TAYLOR
    p = ((((((c[7] * f + c[6]) * f + c[5]) * f + c[4]) * f + c[3]) * f + c[2]) * f + c[1]) * f + c[0]
    n = np.int64(k) + _BIAS
    s1 = (_POW2[0] if n & 1 else 1.0) * (_POW2[1] if n & 2 else 1.0) * (_POW2[2] if n & 4 else 1.0)
    s2 = (_POW2[3] if n & 8 else 1.0) * (_POW2[4] if n & 16 else 1.0) * (_POW2[5] if n & 32 else 1.0)
    s3 = (_POW2[6] if n & 64 else 1.0) * (_POW2[7] if n & 128 else 1.0) * (_POW2[8] if n & 256 else 1.0)
    return np.float32(p * (s1 * s2) * (s3 * 6.842277657836021e-49))  # 2^-160
