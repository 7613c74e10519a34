"""Generated Numba kernels: the vectorizable float32 exp/tanh, and fused GELU / softmax / layer norm
against numpy, including special values."""

import numba
import numpy as np
import pytest

import graphc
from runtime import bench
from runtime.kmath import exp_f32, tanh_f32

TINY = np.finfo(np.float32).tiny


@numba.njit(error_model="numpy")
def _apply_exp(x, out):
    for i in range(x.size):
        out[i] = exp_f32(x[i])


@numba.njit(error_model="numpy")
def _apply_tanh(x, out):
    for i in range(x.size):
        out[i] = tanh_f32(x[i])


SPECIAL = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 88.7, 88.8, 89.0, -87.3,
                    -103.0, -104.0, -200.0, 9.0, -9.0, 8.99, 20.0], np.float32)


@pytest.mark.parametrize("apply, reference", [(_apply_exp, np.exp), (_apply_tanh, np.tanh)], ids=["exp", "tanh"])
def test_float32_math_is_within_1e6_relative_of_numpy(apply, reference):
    x = np.concatenate([np.linspace(-120, 100, 1_000_003), np.linspace(-3, 3, 1_000_003),
                        np.geomspace(1e-20, 1e2, 100_000), -np.geomspace(1e-20, 1e2, 100_000), SPECIAL]).astype(np.float32)
    got = np.empty_like(x)
    apply(x, got)
    with np.errstate(all="ignore"):
        want = reference(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    g, w = got[~nan].astype(np.float64), want[~nan].astype(np.float64)
    normal = (np.abs(w) >= TINY) & np.isfinite(w)
    with np.errstate(invalid="ignore"):
        assert np.all(np.abs(g - w)[normal] <= 1e-6 * np.abs(w)[normal])
    subnormal = np.abs(w) < TINY
    assert np.all(np.abs(g - w)[subnormal] <= 2 * 1.4e-45)  # subnormal results: within a subnormal ulp or two
    assert np.array_equal(got[np.isinf(want)], want[np.isinf(want)])


@pytest.mark.parametrize("name", ["gelu", "softmax", "layer_norm"])
def test_fused_kernels_match_numpy(name):
    fn = getattr(bench, name)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 257)) * 3).astype(np.float32)
    x[0, :5] = [0.0, -0.0, 12.0, -12.0, 50.0]
    args = (x,) if name != "layer_norm" else (x, rng.standard_normal(257).astype(np.float32),
                                              rng.standard_normal(257).astype(np.float32))
    compiled = graphc.jit(fn).compile(*args)
    assert compiled.stats()["fused_kernels"] == 1  # the whole function is one kernel
    got = compiled(*args)
    want = fn(*args)
    assert got.dtype == want.dtype == np.float32
    assert bench.max_rel_error(got, want) <= 1e-6


def test_fused_kernels_propagate_nan_and_inf():
    x = np.array([[1.0, np.nan, 2.0], [np.inf, 0.0, 1.0], [-np.inf, 0.0, 1.0]], np.float32)
    with np.errstate(all="ignore"):
        for fn in (bench.softmax, bench.gelu):
            got = graphc.jit(fn)(x)
            want = fn(x)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-7)
