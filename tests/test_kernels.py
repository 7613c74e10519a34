"""Generated Numba kernels: fused GELU / softmax / layer norm against numpy, including special
values (the vectorizable math they call is tested in tests/test_fastmath.py)."""

import numpy as np
import pytest

import graphc
from graphc.bench import kernels as bench

TINY = np.finfo(np.float32).tiny


@pytest.mark.parametrize("name", ["gelu", "softmax", "layer_norm"])
def test_fused_kernels_match_numpy(name):
    fn = getattr(bench, name)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 257)) * 3).astype(np.float32)
    x[0, :5] = [0.0, -0.0, 12.0, -12.0, 50.0]
    args = (
        (x,)
        if name != "layer_norm"
        else (x, rng.standard_normal(257).astype(np.float32), rng.standard_normal(257).astype(np.float32))
    )
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


@pytest.mark.parametrize("name", ["gelu", "softmax", "layer_norm"])
@pytest.mark.parametrize("rows", [512, 513])
def test_threaded_kernels_equal_single_threaded(name, rows):
    """A kernel over >= PARALLEL_MIN_ELEMENTS elements splits its rows over threads (also an odd
    number of rows); the result is bitwise the one-thread result."""
    from graphc.core.ir import walk
    from graphc.runtime import codegen, threads

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, 1024)) * 3).astype(np.float32)
    assert x.size >= codegen.PARALLEL_MIN_ELEMENTS
    g, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    args = (x, g, b) if name == "layer_norm" else (x,)
    compiled = graphc.jit(getattr(bench, name)).compile(*args)
    (node,) = [n for n in walk(compiled.graph.nodes) if n.op.name == "fused"]
    calls = []
    kernel = codegen.CompiledKernel(node, [a.shape for a in args])
    real = kernel.func
    kernel.func = lambda *a: (calls.append(a[-3:-1]), real(*a))
    threads._threads_local.threads = 2
    try:
        threaded = kernel(*args)[0]
    finally:
        del threads._threads_local.threads
    assert sorted(calls) == [(0, rows // 2), (rows // 2, rows)]
    calls.clear()
    with threads.single_threaded():
        single = kernel(*args)[0]
    assert calls == [(0, rows)]
    np.testing.assert_array_equal(threaded, single)
    np.testing.assert_allclose(threaded, getattr(bench, name)(*args), rtol=2e-6, atol=2e-6)
