"""Generated Numba kernels: fused GELU / softmax / layer norm against numpy, including special
values (the vectorizable math they call is tested in tests/test_fastmath.py)."""

import numpy as np
import pytest

import graphc
from runtime import bench

TINY = np.finfo(np.float32).tiny


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
