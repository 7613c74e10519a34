"""Vectorizable exp / tanh / log (and expm1 / log1p) for Numba loops.

Numba's wheels have no SVML, so ``math.exp`` / ``math.tanh`` inside a loop stay scalar libm calls and
a fused GELU takes tens of times a memory copy's time (docs/measurements.md#libm-gelu). The
functions here are branch-free (selects, not jumps), call no library function, and build 2**k from
integer bits, so LLVM inlines them into the calling loop and vectorizes it.

Approximations (coefficients derived by :func:`derive_coefficients`: Remez exchange in long double
on a dense grid, weighted for *relative* error; the float32 sets are then rounded to float32):

* exp(x): k = rint(x / ln2), r = (x - k*ln2_hi) - k*ln2_lo (Cody-Waite; k*ln2_hi is exact),
  |r| <= ln2/2, e**r = 1 + r + r**2 Q(r) with Q of degree 4 (float32) / 9 (float64), then
  scaled by 2**k as two factors 2**(k>>1) * 2**(k - (k>>1)) so that results that overflow give
  inf and subnormal results are rounded once. Inputs are clamped first (nan is passed through by a
  final select), so no integer conversion ever sees nan or inf.
* expm1(x): the same reduction, expm1 = 2**k * (r + r**2 Q(r) + (1 - 2**-k)), exact for k = 0,
  so relative accuracy holds near 0.
* tanh(x) = sign(x) * t / (t + 2), t = expm1(2|x|) with 2|x| clamped to 20 (float32) / 40
  (float64), where tanh rounds to 1. Relative accuracy holds for tiny and subnormal x.
* log(x): x = m * 2**e with m in [sqrt(1/2), sqrt(2)) read off the bits (subnormals are first
  scaled by 2**23 / 2**52), f = m - 1, s = f / (2 + f), z = s*s,
  log1p(f) = f - (f**2/2 - s*(f**2/2 + z P(z))) with P of degree 2 (float32) / 6 (float64),
  log x = e*ln2_hi + (log1p(f) + e*ln2_lo). Specials by selects: log(+-0) = -inf, log(<0) = nan,
  log(inf) = inf.
* log1p(x) = log(u) + (x - (u - 1)) / u with u = 1 + x (the second term restores what rounding
  1 + x lost), and x itself where u == 1.

Everything is evaluated in the input's precision (float32 in float32: no conversions, 16 lanes per
AVX-512 vector), with the ``contract`` flag (FMA where the target has it). Measured over all 2**32
float32 inputs against numpy 2.4's float32 results (relative error where numpy's result is a normal
number): exp 2.5e-7, expm1 2.4e-7, tanh 2.4e-7, log 3.3e-7, log1p 2.2e-7; against the float64
result rounded: 0.9e-7 / 1.2e-7 / 1.8e-7 / 0.8e-7 / 1.3e-7 (numpy's own float32: 2.1e-7 / 2.1e-7 /
1.1e-7 / 2.7e-7 / 2.0e-7); subnormal exp results within 2 subnormal spacings of numpy's; inf / nan /
overflow / underflow / signed zeros identical. The float64 functions are within 4.5e-16 (tanh) and
2.8e-16 (the others) of numpy's float64 results over random bit patterns and dense ranges.

Why no ``inline="always"``: Numba's own inlining re-lowers the callee with the *caller's* fastmath
flags: called from a ``fastmath=True`` loop, exp32's ``x == x`` nan select is folded away (checked
in the LLVM IR). Plain ``njit`` functions are linked into the caller's LLVM module and inlined
there by LLVM with their own instruction flags, and vectorize just as well (the maps take the same
time either way: docs/measurements.md#fastmath-inline). The explicit signatures make a float64
argument to a float32 function a conversion, not a silently retyped float64 specialization.

Graphc's generated kernels (runtime/kernelsource.py) call these functions, ``maximum`` / ``minimum``
/ ``radd`` for reductions and ``row_sum32`` / ``row_sum64``; runtime/rowkernels.py holds
hand-written fused kernels built on them. All numba functions here use ``error_model="numpy"``:
with Python's error model every float division carries a ZeroDivisionError branch, which alone
keeps a loop from vectorizing.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = [
    "exp32",
    "expm1_32",
    "tanh32",
    "log32",
    "log1p_32",
    "exp64",
    "expm1_64",
    "tanh64",
    "log64",
    "log1p_64",
    "exp_shifted32",
    "apply",
    "maximum",
    "minimum",
    "radd",
    "row_sum32",
    "row_sum64",
    "FUNCTIONS",
    "derive_coefficients",
]

# ------------------------------------------------------------------------------------------------
# Bit-level helpers as LLVM intrinsics: each is a handful of instructions that vectorize
# (vrndscale, vcvttps2dq, vpslld, ...). Generic over float32 / float64.
# ------------------------------------------------------------------------------------------------

_LAYOUT = {  # float type -> (llvm float, llvm int, exponent bias, mantissa bits)
    types.float32: (ir.FloatType(), ir.IntType(32), 127, 23),
    types.float64: (ir.DoubleType(), ir.IntType(64), 1023, 52),
}


def _pow2_bits(builder, ki, lt):
    """2**ki (ki an integer of the float's width, within the normal exponent range) as a float."""
    fty, ity, bias, mant = lt
    return builder.bitcast(builder.shl(builder.add(ki, ir.Constant(ity, bias)), ir.Constant(ity, mant)), fty)


@intrinsic
def _rint(typingctx, x):
    """Round to the nearest integer (ties to even), as a float."""
    if x not in _LAYOUT:
        return None

    def codegen(context, builder, sig, args):
        fn = builder.module.declare_intrinsic("llvm.rint", [_LAYOUT[x][0]])
        return builder.call(fn, [args[0]])

    return x(x), codegen


@intrinsic
def _pow2(typingctx, k):
    """2**k for an integer-valued float k in the normal exponent range."""
    if k not in _LAYOUT:
        return None

    def codegen(context, builder, sig, args):
        lt = _LAYOUT[k]
        return _pow2_bits(builder, builder.fptosi(args[0], lt[1]), lt)

    return k(k), codegen


@intrinsic
def _ldexp2(typingctx, p, k):
    """p * 2**k for an integer-valued float k within [-2*emax-20, 2*emax] and p ~ 1, as
    (p * 2**(k>>1)) * 2**(k - (k>>1)): both factors are normal numbers, the first product is exact,
    so overflow gives inf and a subnormal result is rounded once."""
    if p not in _LAYOUT or k != p:
        return None

    def codegen(context, builder, sig, args):
        lt = _LAYOUT[p]
        ki = builder.fptosi(args[1], lt[1])
        k1 = builder.ashr(ki, ir.Constant(lt[1], 1))
        k2 = builder.sub(ki, k1)
        y = builder.fmul(args[0], _pow2_bits(builder, k1, lt))
        return builder.fmul(y, _pow2_bits(builder, k2, lt))

    return p(p, k), codegen


@intrinsic
def _split(typingctx, x):
    """(m, e) with x = m * 2**e, m in [sqrt(1/2), sqrt(2)), e an integer-valued float, for positive
    normal x (garbage otherwise: callers select the special cases)."""
    if x not in _LAYOUT:
        return None
    sig = types.UniTuple(x, 2)(x)

    def codegen(context, builder, sig, args):
        fty, ity, bias, mant = _LAYOUT[x]
        base = np.array(np.sqrt(0.5), dtype=np.float32 if x == types.float32 else np.float64)
        base_bits = int(base.view(np.int32 if x == types.float32 else np.int64))
        t = builder.sub(builder.bitcast(args[0], ity), ir.Constant(ity, base_bits))
        e = builder.sitofp(builder.ashr(t, ir.Constant(ity, mant)), fty)
        mbits = builder.add(builder.and_(t, ir.Constant(ity, (1 << mant) - 1)), ir.Constant(ity, base_bits))
        m = builder.bitcast(mbits, fty)
        return context.make_tuple(builder, sig.return_type, [m, e])

    return sig, codegen


def _nan_propagating(name: str) -> Callable[..., Any]:
    """An intrinsic ``name(a, b)`` for LLVM's ``llvm.<name>`` (maximum or minimum): numpy's
    semantics (nan propagates, -0 < +0); a reduction over it vectorizes without fast-math flags."""

    def extreme(typingctx, a, b):
        if a not in _LAYOUT or b != a:
            return None

        def codegen(context, builder, sig, args):
            fty = _LAYOUT[a][0]
            fn = builder.module.declare_intrinsic(f"llvm.{name}", [fty], ir.FunctionType(fty, [fty, fty]))
            return builder.call(fn, args)

        return a(a, a), codegen

    extreme.__name__ = extreme.__qualname__ = name  # each its own name in Numba's registries and caches
    return intrinsic(extreme)


maximum = _nan_propagating("maximum")  # max(a, b) propagating nan
minimum = _nan_propagating("minimum")  # min(a, b) propagating nan


def _radd(typingctx, a, b):
    """a + b with only the ``reassoc`` flag: a sum accumulated through it vectorizes (LLVM splits it
    into vector partial sums), while every other operation of the loop keeps strict IEEE order."""
    if a not in _LAYOUT or b != a:
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1], flags=("reassoc",))

    return a(a, a), codegen


_radd.__name__ = _radd.__qualname__ = "radd"
radd: Callable[..., Any] = intrinsic(_radd)  # (typed for callers: mypy sees the typing function's signature)


# ------------------------------------------------------------------------------------------------
# Constants. Numba freezes np.float32 globals as float32 constants (a Python float would promote
# the whole expression to float64).
# ------------------------------------------------------------------------------------------------


def _ln2_split(dtype, clear_bits):
    """ln2 = hi + lo with hi's low `clear_bits` mantissa bits zero (so k*hi is exact for small k)."""
    ln2 = decimal.Context(prec=60).ln(decimal.Decimal(2))
    ity = np.int32 if dtype == np.float32 else np.int64
    bits = np.array(float(ln2), dtype=dtype).view(ity)
    hi = (bits & ~ity((1 << clear_bits) - 1)).view(dtype)[()]
    lo = dtype(float(ln2 - decimal.Decimal(float(hi))))
    return dtype(hi), lo


# coefficients from derive_coefficients() (low order first)
_EXPQ32 = (0.4999999701976776, 0.1666654348373413, 0.04166720062494278, 0.008366547524929047, 0.0013882516650483012)
_EXPQ64 = (
    0.500000000000001,
    0.16666666666666674,
    0.04166666666652154,
    0.008333333333322191,
    0.001388888894796083,
    0.00019841269886659897,
    2.4801487167439468e-05,
    2.7557242248749464e-06,
    2.763271553233333e-07,
    2.5110084875912448e-08,
)
_LOGP32 = (0.6666677594184875, 0.399774968624115, 0.298730731010437)
_LOGP64 = (
    0.666666666666671,
    0.39999999999518354,
    0.28571428729740106,
    0.22222199033925152,
    0.18183574925494767,
    0.1531306899645044,
    0.14811546839768322,
)

F = np.float32
D = np.float64
QF0, QF1, QF2, QF3, QF4 = (F(c) for c in _EXPQ32)
QD0, QD1, QD2, QD3, QD4, QD5, QD6, QD7, QD8, QD9 = (D(c) for c in _EXPQ64)
PF0, PF1, PF2 = (F(c) for c in _LOGP32)
PD0, PD1, PD2, PD3, PD4, PD5, PD6 = (D(c) for c in _LOGP64)
LN2HI_F, LN2LO_F = _ln2_split(np.float32, 8)  # 16-bit hi: k*hi exact for |k| < 256
LN2HI_D, LN2LO_D = _ln2_split(np.float64, 12)  # 41-bit hi: k*hi exact for |k| < 4096
LOG2E_F, LOG2E_D = F(1.4426950408889634), D(1.4426950408889634)
ZERO_F, HALF_F, ONE_F, TWO_F = F(0), F(0.5), F(1), F(2)
ZERO_D, HALF_D, ONE_D, TWO_D = D(0), D(0.5), D(1), D(2)
INF_F, NAN_F, INF_D, NAN_D = F(np.inf), F(np.nan), D(np.inf), D(np.nan)
# clamps: exp(EXP_LO) rounds to 0, exp(EXP_HI) overflows; expm1(EXPM1_LO) rounds to -1;
# tanh(TANH_CLAMP/2) rounds to 1.
EXP_LO_F, EXP_HI_F, EXPM1_LO_F, TANH_CLAMP_F = F(-104.0), F(89.0), F(-20.0), F(20.0)
EXP_LO_D, EXP_HI_D, EXPM1_LO_D, TANH_CLAMP_D = D(-746.0), D(710.0), D(-40.0), D(40.0)
KMAX_F, KMAX_D = F(64.0), D(512.0)  # 2**-k is only needed where it is not negligible vs 1
TINY_F, TINY_D = F(2.0**-25), D(2.0**-54)  # |x| below this: expm1(x) == x, log1p(x) == x
MIN_NORMAL_F, MIN_NORMAL_D = F(np.finfo(np.float32).tiny), D(np.finfo(np.float64).tiny)
SUB_SCALE_F, SUB_SCALE_D = F(2.0**23), D(2.0**52)
SUB_SHIFT_F, SUB_SHIFT_D = F(23.0), D(52.0)

# ------------------------------------------------------------------------------------------------
# float32
# ------------------------------------------------------------------------------------------------

_JIT = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


@numba.njit("float32(float32)", **_JIT)
def _expq32(r):
    return (((QF4 * r + QF3) * r + QF2) * r + QF1) * r + QF0


@numba.njit("float32(float32)", **_JIT)
def exp32(x):
    """exp for float32: <= ~2.5e-7 relative error; exp(<-103.98) = 0, exp(>88.73) = inf. Below
    EXP_LO_F the 0 is selected, not computed: computing it goes through subnormal products, which
    x86 runs slowly (a map over a causal mask's -1e10 scores: docs/measurements.md#exp-underflow)."""
    ok = x > EXP_LO_F  # false for nan too (replaced at the end): no integer conversion sees it
    xc = x if ok else ZERO_F
    xc = xc if xc < EXP_HI_F else EXP_HI_F
    k = _rint(xc * LOG2E_F)
    r = (xc - k * LN2HI_F) - k * LN2LO_F
    y = _ldexp2(ONE_F + (r + r * r * _expq32(r)), k)
    y = y if ok else ZERO_F
    return y if x == x else x


@numba.njit("float32(float32)", **_JIT)
def expm1_32(x):
    """expm1 for float32, relative error <= ~2.5e-7 (also near 0)."""
    xc = x if x > EXPM1_LO_F else EXPM1_LO_F
    xc = xc if xc < EXP_HI_F else EXP_HI_F
    k = _rint(xc * LOG2E_F)
    r = (xc - k * LN2HI_F) - k * LN2LO_F
    kk = k if k < KMAX_F else KMAX_F
    y = _ldexp2((r + r * r * _expq32(r)) + (ONE_F - _pow2(-kk)), k)
    y = y if abs(x) >= TINY_F else x  # tiny x (and +-0, keeping its sign)
    return y if x == x else x


@numba.njit("float32(float32)", **_JIT)
def tanh32(x):
    """tanh for float32 via t = expm1(2|x|): tanh = t / (t + 2); relative error <= ~4e-7."""
    y = abs(x)
    y = y + y
    y = y if y < TANH_CLAMP_F else TANH_CLAMP_F  # nan -> clamp (replaced at the end)
    k = _rint(y * LOG2E_F)  # 0 <= k <= 29: 2**k and 2**k - 1 need no care
    r = (y - k * LN2HI_F) - k * LN2LO_F
    f = _pow2(k)
    t = f * (r + r * r * _expq32(r)) + (f - ONE_F)
    res = math.copysign(t / (t + TWO_F), x)
    return res if x == x else x


@numba.njit("float32(float32)", **_JIT)
def _log_pos32(x):
    """log for positive finite x (normal or subnormal)."""
    sub = x < MIN_NORMAL_F
    xs = x * SUB_SCALE_F if sub else x
    m, e = _split(xs)
    e = e - SUB_SHIFT_F if sub else e
    f = m - ONE_F
    s = f / (TWO_F + f)
    z = s * s
    big_r = z * ((PF2 * z + PF1) * z + PF0)
    hfsq = HALF_F * f * f
    l1p = f - (hfsq - s * (hfsq + big_r))
    return e * LN2HI_F + (l1p + e * LN2LO_F)


@numba.njit("float32(float32)", **_JIT)
def log32(x):
    """log for float32: <= ~2e-7 relative error; log(+-0) = -inf, log(x<0) = nan, log(inf) = inf."""
    res = _log_pos32(x)
    special = -INF_F if x == ZERO_F else (x if x > ZERO_F else NAN_F)
    return res if (x > ZERO_F) & (x < INF_F) else special


@numba.njit("float32(float32)", **_JIT)
def log1p_32(x):
    """log1p for float32, relative error <= ~2.5e-7 (also near 0)."""
    u = ONE_F + x
    ok = (u > ZERO_F) & (u < INF_F)
    corr = (x - (u - ONE_F)) / u if ok else ZERO_F
    res = log32(u) + corr
    return x if u == ONE_F else res


# ------------------------------------------------------------------------------------------------
# float64 (same forms, higher degrees)
# ------------------------------------------------------------------------------------------------


@numba.njit("float64(float64)", **_JIT)
def _expq64(r):
    return ((((((((QD9 * r + QD8) * r + QD7) * r + QD6) * r + QD5) * r + QD4) * r + QD3) * r + QD2) * r + QD1) * r + QD0


@numba.njit("float64(float64)", **_JIT)
def exp64(x):
    """exp for float64; exp(<-745.14) = 0 (selected, as in exp32), exp(>709.79) = inf."""
    ok = x > EXP_LO_D
    xc = x if ok else ZERO_D
    xc = xc if xc < EXP_HI_D else EXP_HI_D
    k = _rint(xc * LOG2E_D)
    r = (xc - k * LN2HI_D) - k * LN2LO_D
    y = _ldexp2(ONE_D + (r + r * r * _expq64(r)), k)
    y = y if ok else ZERO_D
    return y if x == x else x


@numba.njit("float64(float64)", **_JIT)
def expm1_64(x):
    """expm1 for float64."""
    xc = x if x > EXPM1_LO_D else EXPM1_LO_D
    xc = xc if xc < EXP_HI_D else EXP_HI_D
    k = _rint(xc * LOG2E_D)
    r = (xc - k * LN2HI_D) - k * LN2LO_D
    kk = k if k < KMAX_D else KMAX_D
    y = _ldexp2((r + r * r * _expq64(r)) + (ONE_D - _pow2(-kk)), k)
    y = y if abs(x) >= TINY_D else x
    return y if x == x else x


@numba.njit("float64(float64)", **_JIT)
def tanh64(x):
    """tanh for float64 via t = expm1(2|x|)."""
    y = abs(x)
    y = y + y
    y = y if y < TANH_CLAMP_D else TANH_CLAMP_D
    k = _rint(y * LOG2E_D)
    r = (y - k * LN2HI_D) - k * LN2LO_D
    f = _pow2(k)
    t = f * (r + r * r * _expq64(r)) + (f - ONE_D)
    res = math.copysign(t / (t + TWO_D), x)
    return res if x == x else x


@numba.njit("float64(float64)", **_JIT)
def _log_pos64(x):
    sub = x < MIN_NORMAL_D
    xs = x * SUB_SCALE_D if sub else x
    m, e = _split(xs)
    e = e - SUB_SHIFT_D if sub else e
    f = m - ONE_D
    s = f / (TWO_D + f)
    z = s * s
    big_r = z * ((((((PD6 * z + PD5) * z + PD4) * z + PD3) * z + PD2) * z + PD1) * z + PD0)
    hfsq = HALF_D * f * f
    l1p = f - (hfsq - s * (hfsq + big_r))
    return e * LN2HI_D + (l1p + e * LN2LO_D)


@numba.njit("float64(float64)", **_JIT)
def log64(x):
    """log for float64; log(+-0) = -inf, log(x<0) = nan, log(inf) = inf."""
    res = _log_pos64(x)
    special = -INF_D if x == ZERO_D else (x if x > ZERO_D else NAN_D)
    return res if (x > ZERO_D) & (x < INF_D) else special


@numba.njit("float64(float64)", **_JIT)
def log1p_64(x):
    """log1p for float64."""
    u = ONE_D + x
    ok = (u > ZERO_D) & (u < INF_D)
    corr = (x - (u - ONE_D)) / u if ok else ZERO_D
    res = log64(u) + corr
    return x if u == ONE_D else res


@numba.njit("float32(float32)", **_JIT)
def exp_shifted32(d):
    """exp(d) for the softmax argument d = x - max(row) <= 0: exp32 without the upper clamp and the
    nan select. nan (a row whose max is nan, +inf or -inf) gives 0 here, so that row sums to 0 and
    its 0 * (1/0) outputs are nan, as numpy's."""
    dc = d if d > EXP_LO_F else EXP_LO_F
    k = _rint(dc * LOG2E_F)
    r = (dc - k * LN2HI_F) - k * LN2LO_F
    return _ldexp2(ONE_F + (r + r * r * _expq32(r)), k)


# ------------------------------------------------------------------------------------------------
# Elementwise maps over 1-d arrays (for tests, benchmarks and graphc's generic elementwise path)
# ------------------------------------------------------------------------------------------------


@numba.njit(**_JIT)
def _map_exp32(x, out):
    for i in range(x.size):
        out[i] = exp32(x[i])


@numba.njit(**_JIT)
def _map_expm1_32(x, out):
    for i in range(x.size):
        out[i] = expm1_32(x[i])


@numba.njit(**_JIT)
def _map_tanh32(x, out):
    for i in range(x.size):
        out[i] = tanh32(x[i])


@numba.njit(**_JIT)
def _map_log32(x, out):
    for i in range(x.size):
        out[i] = log32(x[i])


@numba.njit(**_JIT)
def _map_log1p_32(x, out):
    for i in range(x.size):
        out[i] = log1p_32(x[i])


@numba.njit(**_JIT)
def _map_exp64(x, out):
    for i in range(x.size):
        out[i] = exp64(x[i])


@numba.njit(**_JIT)
def _map_expm1_64(x, out):
    for i in range(x.size):
        out[i] = expm1_64(x[i])


@numba.njit(**_JIT)
def _map_tanh64(x, out):
    for i in range(x.size):
        out[i] = tanh64(x[i])


@numba.njit(**_JIT)
def _map_log64(x, out):
    for i in range(x.size):
        out[i] = log64(x[i])


@numba.njit(**_JIT)
def _map_log1p_64(x, out):
    for i in range(x.size):
        out[i] = log1p_64(x[i])


# ------------------------------------------------------------------------------------------------
# Row sums for generated kernels (runtime/kernelsource.py): loops with no stores, so LLVM needs no
# run-time overlap check and always runs the same vectorized code: a row's sum rounds the same way
# wherever its arrays are.
# ------------------------------------------------------------------------------------------------

ROW_SUM_BLOCK = 256  # float32 sums: this many elements in float32 (a few per vector lane), float64 across


@numba.njit(**_JIT)
def row_sum32(row):
    """The float64 sum of a float32 row: float32 partial sums within blocks of ROW_SUM_BLOCK (as
    accurate as numpy's pairwise float32 sum), float64 across blocks."""
    total = 0.0
    n = row.size
    for jb in range(n // ROW_SUM_BLOCK):  # full blocks: a constant trip count vectorizes fully
        b = ZERO_F
        for k in range(ROW_SUM_BLOCK):
            b = radd(b, row[jb * ROW_SUM_BLOCK + k])
        total += np.float64(b)
    b = ZERO_F
    for j in range(n - n % ROW_SUM_BLOCK, n):
        b = radd(b, row[j])
    return total + np.float64(b)


@numba.njit(**_JIT)
def row_sum64(row):
    """The sum of a float64 row."""
    total = ZERO_D
    for j in range(row.size):
        total = radd(total, row[j])
    return total


FUNCTIONS = {  # name -> {dtype: (scalar function, 1-d map)}
    "exp": {np.float32: (exp32, _map_exp32), np.float64: (exp64, _map_exp64)},
    "expm1": {np.float32: (expm1_32, _map_expm1_32), np.float64: (expm1_64, _map_expm1_64)},
    "tanh": {np.float32: (tanh32, _map_tanh32), np.float64: (tanh64, _map_tanh64)},
    "log": {np.float32: (log32, _map_log32), np.float64: (log64, _map_log64)},
    "log1p": {np.float32: (log1p_32, _map_log1p_32), np.float64: (log1p_64, _map_log1p_64)},
}


def apply(name: str, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """numpy-like ``np.<name>(x, out=out)`` for float32 / float64 arrays through the fast functions."""
    x = np.asarray(x)
    kernel = FUNCTIONS[name][x.dtype.type][1]
    if out is None:
        out = np.empty(x.shape, x.dtype)
    elif out.dtype != x.dtype or out.shape != x.shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous {x.dtype} array of shape {x.shape}")
    kernel(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    return out


# ------------------------------------------------------------------------------------------------
# Where the coefficients come from
# ------------------------------------------------------------------------------------------------

_LD = np.longdouble


def _solve_ld(a, y):
    """Gaussian elimination with partial pivoting in long double (numpy's solver is float64 only)."""
    a = a.copy()
    y = y.copy()
    n = len(y)
    for k in range(n):
        p = k + int(np.argmax(np.abs(a[k:, k])))
        if p != k:
            a[[k, p]] = a[[p, k]]
            y[[k, p]] = y[[p, k]]
        f = a[k + 1 :, k] / a[k, k]
        a[k + 1 :, k:] -= f[:, None] * a[k, k:]
        y[k + 1 :] -= f * y[k]
    x = np.zeros(n, dtype=a.dtype)
    for k in range(n - 1, -1, -1):
        x[k] = (y[k] - a[k, k + 1 :] @ x[k + 1 :]) / a[k, k]
    return x


def _remez(g, w, degree, lo, hi, grid=40001, iters=40):
    """Coefficients c (low order first) of the polynomial P of the given degree minimizing
    max |w(t) * (g(t) - P(t))| over [lo, hi], by the Remez exchange on a dense Chebyshev-clustered
    grid, in long double. Returns (c, max weighted error)."""
    n = degree + 1
    m = n + 1
    t = (_LD(lo) + _LD(hi)) / 2 + (_LD(hi) - _LD(lo)) / 2 * np.cos(np.linspace(_LD(np.pi), _LD(0), grid, dtype=_LD))
    gt, wt = g(t), w(t)
    vander = np.stack([t**j for j in range(n)], 1)
    ref = np.round(np.linspace(0, grid - 1, m)).astype(int)
    best = None
    for _ in range(iters):
        a = np.zeros((m, n + 1), dtype=_LD)
        a[:, :n] = vander[ref]
        a[:, n] = (-_LD(1)) ** np.arange(m) / wt[ref]
        c = _solve_ld(a, gt[ref])[:n]
        err = wt * (gt - vander @ c)
        worst = np.max(np.abs(err))
        if best is None or worst < best[1]:
            best = (c, worst)
        runs = np.split(np.arange(grid), np.flatnonzero(np.diff(np.sign(err)) != 0) + 1)
        ext = np.array([r[np.argmax(np.abs(err[r]))] for r in runs])
        if len(ext) < m:
            break
        while len(ext) > m:  # keep m alternating extrema, dropping the smaller end
            ext = ext[1:] if abs(err[ext[0]]) < abs(err[ext[-1]]) else ext[:-1]
        ref = ext
        level = np.abs(err[ref])
        if level.max() - level.min() < _LD(1e-4) * level.max():
            break
    return best


def _expm1_tail(r):
    """(expm1(r) - r) / r**2 = sum_{n>=2} r**(n-2)/n!, by its series (exact enough for |r| < 0.4)."""
    out = np.zeros_like(r)
    term = np.full_like(r, _LD(0.5))
    for n in range(2, 40):
        out += term
        term = term * r / (n + 1)
    return out


def _atanh_tail(z):
    """(2*atanh(s) - 2*s) / (s*z) with z = s**2: sum_{n>=1} 2 z**(n-1) / (2n+1)."""
    out = np.zeros_like(z)
    zn = np.ones_like(z)
    for n in range(1, 60):
        out += 2 * zn / (2 * n + 1)
        zn = zn * z
    return out


def derive_coefficients(verbose: bool = False) -> dict[str, tuple[float, ...]]:
    """Re-derive the polynomial coefficients stored above (numpy + long double; about a second:
    docs/measurements.md#derive-coefficients). Returns
    {"EXPQ32": (...), ...}; ``verbose`` prints them with the minimax weighted error."""
    ln2 = float(decimal.Context(prec=60).ln(decimal.Decimal(2)))
    r_max = ln2 / 2 * 1.0005  # |r| after rounding k = rint(x/ln2), with slack for the rounding of x/ln2
    s_max = (2**0.5 - 1) / (2**0.5 + 1)  # |s| for m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1)

    def w_exp(r):  # relative error of expm1(r) = r + r^2 Q(r) (bounds the relative error of exp too)
        return np.abs(r * r / (r + r * r * _expm1_tail(r)))

    def w_log(z):  # relative error of log1p(f) ~ 2s: an error d in P changes it by s*z*d
        return z / 2

    out = {}
    for name, g, w, deg, lo, hi in [
        ("EXPQ32", _expm1_tail, w_exp, 4, -r_max, r_max),
        ("EXPQ64", _expm1_tail, w_exp, 9, -r_max, r_max),
        ("LOGP32", _atanh_tail, w_log, 2, s_max**2 * 1e-4, s_max**2 * 1.001),
        ("LOGP64", _atanh_tail, w_log, 6, s_max**2 * 1e-4, s_max**2 * 1.001),
    ]:
        c, e = _remez(g, w, deg, lo, hi)
        dt = np.float32 if name.endswith("32") else np.float64
        out[name] = tuple(float(dt(v)) for v in c)
        if verbose:
            print(f"{name} = {out[name]!r}  # minimax weighted error {float(e):.3g}")
    return out
