"""Accuracy of runtime/fastmath.py against numpy, and its fused kernels against numpy expressions.

How errors are measured (a = ours, b = numpy's result for the same dtype):

* float32 functions, over ~4.2M float32 bit patterns (every 1021st of all 2**32, so every binade of
  both signs, subnormals included) plus a list of edge values:
  - where b is a finite normal number: |a - b| <= 1e-6 * |b| (pure relative, no absolute floor);
  - where b is subnormal or zero (exp underflow, tanh/expm1/log1p of tiny x): |a - b| <= 2 * 2**-149,
    i.e. within 2 units of the subnormal spacing (the relative error of a subnormal is meaningless);
  - where b is inf or nan: a is the same inf / also nan; zero results carry b's sign.
* float64 functions: the same rules with 1e-15 relative over random bit patterns and dense ranges.
* kernels: see each test (gelu and softmax vs numpy's float32 expression; layer norm vs a float64
  reference, since ours rounds the exact result once and numpy's float32 mean/var do not).

Tests time nothing; runtime/bench_fastmath.py measures speed.
"""

import math

import numba
import numpy as np
import pytest

from graphc.runtime import fastmath as fm
from graphc.runtime import rowkernels as rk

F32_TINY = np.finfo(np.float32).tiny
F32_SUB = np.float32(2.0**-149)
F64_TINY = np.finfo(np.float64).tiny
F64_SUB = np.float64(5e-324)

EDGES32 = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
        1.0,
        -1.0,
        2.0**-149,
        -(2.0**-149),
        2.0**-140,
        1e-40,
        -1e-40,
        F32_TINY,
        -F32_TINY,
        1.5e-38,
        1e-30,
        -1e-30,
        1e-10,
        2.0**-25,
        2.0**-24,
        1e-7,
        -1e-7,
        0.34657359,
        -0.34657359,
        0.5,
        0.55,
        0.6931472,
        0.70710677,
        0.7071068,
        1.4142135,
        1.4142137,
        9.0,
        9.01,
        10.0,
        20.0,
        50.0,
        87.0,
        88.0,
        88.72,
        88.7228,
        88.72284,
        88.723,
        89.0,
        100.0,
        1000.0,
        -17.0,
        -20.0,
        -80.0,
        -87.33,
        -87.34,
        -90.0,
        -100.0,
        -103.0,
        -103.97,
        -103.98,
        -104.0,
        -200.0,
        -1000.0,
        1e20,
        -1e20,
        3.4028235e38,
        -3.4028235e38,
        0.999,
        1.001,
        -0.999999,
        -0.5,
        1e6,
        2.0**24,
    ],
    dtype=np.float32,
)
EDGES64 = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        -1.0,
        5e-324,
        -5e-324,
        1e-310,
        F64_TINY,
        1e-300,
        1e-20,
        2.0**-54,
        1e-8,
        0.34657359027997264,
        0.5,
        0.55,
        0.7071067811865476,
        1.4142135623730951,
        19.0,
        20.0,
        100.0,
        700.0,
        709.78,
        709.79,
        709.8,
        710.0,
        -708.0,
        -709.0,
        -740.0,
        -745.0,
        -745.1,
        -745.2,
        -746.0,
        -1000.0,
        1e300,
        -1e300,
        1.7976931348623157e308,
        -0.999999999,
        1e15,
        2.0**53,
    ],
    dtype=np.float64,
)

NAMES = ["exp", "expm1", "tanh", "log", "log1p"]


def sample32():
    bits = np.arange(0, 2**32, 1021, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits.view(np.float32), EDGES32])


def sample64():
    rng = np.random.default_rng(64)
    parts = [
        rng.integers(0, 2**64, 400_000, dtype=np.uint64).view(np.float64),
        rng.uniform(-750, 750, 200_000),
        rng.uniform(-25, 25, 200_000),
        rng.uniform(0, 4, 200_000),
        rng.uniform(-1, 1, 200_000) * 10.0 ** rng.uniform(-320, 0, 200_000),
        1 + rng.uniform(-1e-6, 1e-6, 100_000),
        EDGES64,
    ]
    return np.concatenate(parts)


def check_close(x, a, b, rtol, sub_atol):
    """The rules in the module docstring; returns nothing, fails with the worst offender."""
    assert a.dtype == b.dtype
    normal = np.isfinite(b) & (np.abs(b) >= np.finfo(b.dtype).tiny)
    small = np.isfinite(b) & ~normal
    with np.errstate(invalid="ignore"):
        ok = np.ones(x.shape, bool)
        ok[normal] = np.abs(a[normal].astype(np.float64) - b[normal]) <= rtol * np.abs(b[normal].astype(np.float64))
        ok[small] = np.abs(a[small].astype(np.float64) - b[small]) <= sub_atol
        special = ~np.isfinite(b)
        ok[special] = (a[special] == b[special]) | (np.isnan(a[special]) & np.isnan(b[special]))
        zero = b == 0
        ok[zero] &= (a[zero] != 0) | (np.signbit(a[zero]) == np.signbit(b[zero]))
    if not ok.all():
        i = np.flatnonzero(~ok)[:5]
        raise AssertionError(f"{(~ok).sum()} mismatches, e.g. x={x[i]!r} ours={a[i]!r} numpy={b[i]!r}")


@pytest.fixture(scope="module")
def x32():
    return sample32()


@pytest.fixture(scope="module")
def x64():
    return sample64()


@pytest.mark.parametrize("name", NAMES)
def test_float32_matches_numpy(name, x32):
    ours = fm.apply(name, x32)
    with np.errstate(all="ignore"):
        ref = getattr(np, name)(x32)
    assert ours.dtype == np.float32
    check_close(x32, ours, ref, 1e-6, 2 * F32_SUB)


@pytest.mark.parametrize("name", NAMES)
def test_float64_matches_numpy(name, x64):
    ours = fm.apply(name, x64)
    with np.errstate(all="ignore"):
        ref = getattr(np, name)(x64)
    assert ours.dtype == np.float64
    check_close(x64, ours, ref, 1e-15, 2 * F64_SUB)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype):
    inf, nan = np.inf, np.nan
    cases = {
        "exp": [
            (100.0 if dtype == np.float32 else 1000.0, inf),
            (-200.0 if dtype == np.float32 else -800.0, 0.0),
            (inf, inf),
            (-inf, 0.0),
            (nan, nan),
            (0.0, 1.0),
            (-0.0, 1.0),
        ],
        "expm1": [(inf, inf), (-inf, -1.0), (-200.0, -1.0), (nan, nan), (0.0, 0.0), (-0.0, -0.0)],
        "tanh": [
            (inf, 1.0),
            (-inf, -1.0),
            (1e30, 1.0),
            (-1e30, -1.0),
            (30.0, 1.0),
            (nan, nan),
            (0.0, 0.0),
            (-0.0, -0.0),
        ],
        "log": [(0.0, -inf), (-0.0, -inf), (-1.0, nan), (-inf, nan), (inf, inf), (nan, nan), (1.0, 0.0)],
        "log1p": [(-1.0, -inf), (-2.0, nan), (-inf, nan), (inf, inf), (nan, nan), (0.0, 0.0), (-0.0, -0.0)],
    }
    for name, pairs in cases.items():
        x = np.array([p[0] for p in pairs], dtype)
        want = np.array([p[1] for p in pairs], dtype)
        got = fm.apply(name, x)
        scalar = fm.FUNCTIONS[name][dtype][0]
        for xi, gi, wi in zip(x, got, want):
            si = scalar(xi)  # the scalar function called from Python agrees with the array map
            for v in (gi, si):
                assert (np.isnan(v) and np.isnan(wi)) or (v == wi and np.signbit(v) == np.signbit(wi)), (
                    name,
                    xi,
                    v,
                    wi,
                )


def test_subnormal_exp_and_log():
    # exp with subnormal results: within 2 subnormal spacings of numpy, monotone, reaching 0
    x = np.linspace(-103.98, -87.3, 200_001, dtype=np.float32)
    ours = fm.apply("exp", x)
    assert np.all(np.abs(ours.astype(np.float64) - np.exp(x)) <= 2 * F32_SUB)
    assert np.all(np.diff(ours) >= 0) and ours[0] == 0.0
    # log of subnormal inputs: the log of positive normal floats is the target; subnormals hold too
    bits = np.arange(1, 2**23, 7, dtype=np.uint32)
    xs = bits.view(np.float32)
    np.testing.assert_allclose(fm.apply("log", xs), np.log(xs), rtol=1e-6, atol=0)


def test_scalar_functions_inline_into_user_loops():
    @numba.njit(cache=False)
    def user_loop(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = fm.exp32(x[i]) + fm.tanh32(x[i]) + fm.log32(fm.exp32(x[i]))
        return out

    x = np.linspace(-5, 5, 1001, dtype=np.float32)
    got = user_loop(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.exp(x) + np.tanh(x) + x, rtol=2e-6, atol=2e-6)


def test_scalar_functions_keep_ieee_semantics_in_fastmath_callers():
    # LLVM inlines them with their own instruction flags, so a fastmath=True caller (nnan, ninf)
    # cannot fold away their nan / inf handling
    @numba.njit(cache=False, fastmath=True)
    def fast_caller(x):
        out = np.empty((3, x.size), np.float32)
        for i in range(x.size):
            out[0, i] = fm.exp32(x[i])
            out[1, i] = fm.tanh32(x[i])
            out[2, i] = fm.log32(x[i])
        return out

    x = np.array([np.nan, np.inf, -np.inf, 100.0, -200.0, 0.0, -1.0], np.float32)
    got = fast_caller(x)
    with np.errstate(all="ignore"):
        want = np.stack([np.exp(x), np.tanh(x), np.log(x)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)  # nan and inf positions must match exactly


# --- kernels -------------------------------------------------------------------------------------


def numpy_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def test_gelu_matches_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [rng.standard_normal(300_000) * 3, np.linspace(-30, 30, 100_001), EDGES32.astype(np.float64)]
    ).astype(np.float32)
    out = np.empty_like(x)
    rk.gelu_f32(x, out)
    with np.errstate(all="ignore"):
        ref = numpy_gelu(x)
    assert ref.dtype == np.float32
    # both evaluate the same float32 expression; 1 + tanh(u) cancels for x < 0, so the comparison is
    # relative for |gelu| >= 1 and absolute (1e-6) below
    fin = np.isfinite(ref)
    assert np.all(np.abs(out[fin].astype(np.float64) - ref[fin]) <= 1e-6 * np.maximum(np.abs(ref[fin]), 1.0))
    assert np.array_equal(out[~fin], ref[~fin], equal_nan=True)
    x3 = x[:300_000].reshape(100, 30, 100)
    out3 = np.empty_like(x3)
    rk.gelu_f32(x3, out3)
    np.testing.assert_array_equal(out3.reshape(-1), out[:300_000])


def numpy_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    "shape, scale",
    [((512, 1024), 1.0), ((300, 33), 10.0), ((7, 5, 64), 30.0), ((10, 1), 1.0), ((1000, 15), 60.0), ((20, 2500), 5.0)],
)
def test_softmax_matches_numpy(shape, scale):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    out = np.full_like(x, np.nan)
    rk.softmax_lastaxis_f32(x, out)
    ref = numpy_softmax(x)
    check_close(x, out, ref, 1e-6, 4 * F32_SUB)
    np.testing.assert_allclose(out.sum(-1, dtype=np.float64), 1.0, rtol=1e-5)


def test_softmax_special_rows():
    x = np.array(
        [
            [0.0, 1.0, np.nan, 2.0],
            [-np.inf, 0.0, 1.0, -np.inf],
            [np.inf, 0.0, 1.0, 2.0],
            [-np.inf] * 4,
            [-1e30, 1e30, 3e38, -3e38],
        ],
        np.float32,
    )
    out = np.empty_like(x)
    rk.softmax_lastaxis_f32(x, out)
    with np.errstate(invalid="ignore"):
        ref = numpy_softmax(x)
    check_close(x, out, ref, 1e-6, 4 * F32_SUB)  # nan rows where numpy has them, zeros where it has zeros


def float64_layernorm(x, g, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g.astype(np.float64) + b.astype(np.float64)


@pytest.mark.parametrize("shape, offset", [((512, 1024), 0.0), ((300, 33), 30.0), ((7, 5, 64), -5.0), ((4, 3), 1000.0)])
def test_layernorm_matches_numpy(shape, offset):
    rng = np.random.default_rng(2)
    n = shape[-1]
    x = (rng.standard_normal(shape) * 3 + offset).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.empty_like(x)
    rk.layernorm_lastaxis_f32(x, g, b, out, 1e-5)
    # ours is the float64 result rounded once: half an ulp (relative 6e-8) plus float64 noise
    exact = float64_layernorm(x, g, b, 1e-5)
    assert np.all(np.abs(out - exact) <= 1e-7 * np.abs(exact) + 1e-12)
    # numpy's float32 mean/var/arithmetic are off by a few ulps of the row's mean relative to its spread
    mu = x.mean(-1, keepdims=True)
    sd = x.std(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(x.var(-1, keepdims=True) + np.float32(1e-5)) * g + b
    assert np.all(np.abs(out - ref) <= 4e-6 * (1 + np.abs(mu) / sd) * np.maximum(np.abs(ref), 1.0))


def test_layernorm_constant_rows():
    x = np.full((3, 8), 2.5, np.float32)
    g = np.ones(8, np.float32)
    b = np.arange(8, dtype=np.float32)
    out = np.empty_like(x)
    rk.layernorm_lastaxis_f32(x, g, b, out, 1e-5)
    np.testing.assert_array_equal(out, np.broadcast_to(b, x.shape))


def test_kernels_reject_mismatched_buffers():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError):
        rk.gelu_f32(x, np.zeros(5, np.float32))
    with pytest.raises(ValueError):
        rk.softmax_lastaxis_f32(x, np.zeros((4, 7), np.float32))
    with pytest.raises(ValueError):
        rk.layernorm_lastaxis_f32(x, np.ones(7, np.float32), np.zeros(8, np.float32), np.empty_like(x), 1e-5)
    with pytest.raises(ValueError):
        fm.apply("exp", x, out=np.empty((8, 4), np.float32).T)


@pytest.mark.skipif(np.finfo(np.longdouble).eps > 1e-18, reason="the fits need x87 long double to reproduce exactly")
def test_coefficients_rederive():
    derived = fm.derive_coefficients()
    assert derived == {"EXPQ32": fm._EXPQ32, "EXPQ64": fm._EXPQ64, "LOGP32": fm._LOGP32, "LOGP64": fm._LOGP64}
