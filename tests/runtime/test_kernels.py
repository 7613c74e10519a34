"""Generated Numba kernels: fused GELU / softmax / layer norm against numpy, including special
values (the vectorizable math they call is tested in tests/runtime/test_fastmath.py)."""

import numpy as np
import pytest

import graphc
from graphc.bench import kernels as bench

TINY = np.finfo(np.float32).tiny
EPS = float(np.finfo(np.float32).eps)


def layer_norm_error_bound(x, g, b):
    """How far two float32 computations of ``bench.layer_norm`` may be apart, elementwise. Each
    side's mean and variance are sums of n terms in its own order (the kernel adds blocks of
    ROW_SUM_BLOCK elements in float32 across vector lanes, numpy pairwise): each within (k - 1) *
    eps of the sum of the terms' magnitudes, k = min(n, ROW_SUM_BLOCK). The mean's error moves
    every x - mean; the variance's (of nonnegative terms) scales the result by half its relative
    error; then a few roundings of g * (x - mean) * r + b."""
    from graphc.runtime.fastmath import ROW_SUM_BLOCK

    k = min(x.shape[-1], ROW_SUM_BLOCK)
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    dev = np.abs(x64 - mean)
    r = 1.0 / np.sqrt((dev**2).mean(-1, keepdims=True) + 1e-5)
    scaled = np.abs(g) * dev * r
    d_mean = k * EPS * np.abs(x64).mean(-1, keepdims=True)
    return 2 * (np.abs(g) * r * d_mean + scaled * (k + 4) * EPS + 4 * EPS * (scaled + np.abs(b)))


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
    if name == "layer_norm":  # its row sums: rounding of 257 terms in two orders
        assert np.all(np.abs(got.astype(np.float64) - want) <= layer_norm_error_bound(*args))
    else:  # exp and tanh within 2.5e-7 of numpy's (runtime/fastmath.py), a few roundings more
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


def _pieces_run(kernel, args, threads: int):
    """The kernel's results on ``args`` with ``threads`` threads, and the element range of its first
    result that each Numba call wrote: [(start, stop)] in the result's flat elements."""
    from graphc.runtime import threads as runtime_threads

    calls = []
    real = kernel.func
    n_out = len(kernel.out_types)

    def spy(*a):
        out, r0, r1, n = a[-3 - n_out], a[-3], a[-2], a[-1]
        calls.append((out.ctypes.data, r0 * n, r1 * n))
        return real(*a)

    kernel.func = spy
    runtime_threads._threads_local.threads = threads
    try:
        results = kernel(*args)
    finally:
        del runtime_threads._threads_local.threads
        kernel.func = real
    base, size = results[0].ctypes.data, results[0].dtype.itemsize
    return results, sorted(((ptr - base) // size + lo, (ptr - base) // size + hi) for ptr, lo, hi in calls)


def _kernel_of(fn, args):
    from graphc.core.ir import walk
    from graphc.runtime import codegen

    compiled = graphc.jit(fn).compile(*args)
    (node,) = [n for n in walk(compiled.graph.nodes) if n.op.name == "fused"]
    ins = dict(zip(compiled.graph.inputs, args))
    operands = [ins[v] for v in node.inputs]
    return codegen.CompiledKernel(node, [a.shape for a in operands]), operands


def _tiles(ranges, size: int) -> bool:
    """Whether the ranges cover [0, size) once each, in more than one piece."""
    return (
        len(ranges) > 1
        and ranges[0][0] == 0
        and ranges[-1][1] == size
        and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    )


@pytest.mark.parametrize("name", ["gelu", "softmax", "layer_norm"])
@pytest.mark.parametrize("rows", [512, 513])
def test_threaded_kernels_equal_single_threaded(name, rows):
    """A kernel over >= PARALLEL_MIN_ELEMENTS elements runs in pieces over threads (also an odd
    number of rows): a row reduction in pieces of whole rows, elementwise work in pieces of its
    elements; every element is written by one piece and the result is bitwise the one-thread one."""
    from graphc.runtime import codegen, threads

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((rows, 1024)) * 3).astype(np.float32)
    assert x.size >= codegen.PARALLEL_MIN_ELEMENTS
    g, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    args = (x, g, b) if name == "layer_norm" else (x,)
    kernel, operands = _kernel_of(getattr(bench, name), args)
    (threaded,), ranges = _pieces_run(kernel, operands, threads=2)
    assert _tiles(ranges, x.size)
    if name != "gelu":  # a row's reduction is one piece's work
        assert all(lo % 1024 == 0 and hi % 1024 == 0 for lo, hi in ranges)
    with threads.single_threaded():
        (single,), one = _pieces_run(kernel, operands, threads=1)
    assert one == [(0, x.size)]
    np.testing.assert_array_equal(threaded, single)
    want = getattr(bench, name)(*args)
    if name == "layer_norm":  # its row sums: rounding of 1,024 terms in two orders
        assert np.all(np.abs(threaded.astype(np.float64) - want) <= layer_norm_error_bound(*args))
    else:
        np.testing.assert_allclose(threaded, want, rtol=2e-6, atol=2e-6)


def _mixed(x, v, k):
    """Two results of two dtypes from operands of three: a float32 run, a vector, an int64 count."""
    y = np.tanh(x * 0.5 + v)
    return y, (y > 0).astype(np.int64) + k


@pytest.mark.parametrize(
    "shape", [((1 << 18) + 37,), (3, (1 << 17) + 5), (1, (1 << 18) + 1), ((1 << 18) + 1, 1), (0, 1 << 18)]
)
@pytest.mark.parametrize("threads", [2, 3])
def test_elementwise_work_splits_over_threads_whatever_its_rows(shape, threads):
    """Elementwise work is one run of elements: a 1-d array (one row), three long rows (fewer rows
    than pieces) or a column of one-element rows splits into pieces of about equal size over the
    threads, at any length (not a multiple of the pieces' alignment); a vector operand of a
    one-row space is cut with it. Each element is written once, bitwise as on one thread."""
    from graphc.runtime import codegen
    from graphc.runtime import threads as runtime_threads

    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    v = rng.standard_normal(shape[-1:]).astype(np.float32)
    k = np.int64(3)
    if not x.size:  # nothing to compute: no kernel at all
        for got, want in zip(graphc.jit(_mixed)(x, v, k), _mixed(x, v, k)):
            assert got.shape == want.shape and got.dtype == want.dtype
        return
    kernel, operands = _kernel_of(_mixed, (x, v, k))
    (y, c), ranges = _pieces_run(kernel, operands, threads)
    assert kernel._elementwise
    assert _tiles(ranges, x.size)
    assert max(hi - lo for lo, hi in ranges) <= 2 * x.size // len(ranges)  # about equal
    with runtime_threads.single_threaded():
        y1, c1 = kernel(*operands)
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(c, c1)
    y_want, c_want = _mixed(x, v, k)
    np.testing.assert_allclose(y, y_want, rtol=2e-6, atol=2e-6)
    assert c.dtype == c_want.dtype
    np.testing.assert_array_equal(c, c_want)
    assert x.size >= codegen.PARALLEL_MIN_ELEMENTS


def test_a_kernel_writing_over_its_operand_splits_alike():
    """A kernel whose result takes over its dying operand's buffer (the in-place variant) cuts the
    operand and the result at the same elements: the jitted result equals the one-thread one."""
    from graphc.runtime import threads as runtime_threads

    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 8)).astype(np.float32)
    w = rng.standard_normal((8, (1 << 18) + 3)).astype(np.float32)

    def fn(a, w):
        return np.tanh(a @ w) * 2.0 + 1.0  # a @ w: one fresh row, dead after the kernel

    compiled = graphc.jit(fn).compile(a, w)
    (step,) = [st for st in compiled.executable.program.steps if st.in_place is not None]
    assert step.in_place[1] == [(0, 0)]
    runtime_threads._threads_local.threads = 2
    try:
        got = compiled(a, w)
    finally:
        del runtime_threads._threads_local.threads
    with runtime_threads.single_threaded():
        one = compiled(a, w)
    np.testing.assert_array_equal(got, one)
    np.testing.assert_allclose(got, fn(a, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 1), (1, 4), (2, 1, 1), (1, 1, 5)])
def test_row_reductions_of_size_one_rows_and_batches(shape):
    """A kernel whose iteration space has size-1 dims (a batch of one): the operand a reduction
    reads is a row even when all its dims are 1 (it was passed as a scalar: KeyError 'scalar')."""
    fns = [
        lambda x: np.sum(x, axis=-1) + 1.0,
        lambda x: np.max(x, axis=-1, keepdims=True) - x,
        lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
        lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5),
        lambda x: np.sum(x * x, axis=-1) * 2.0,
    ]
    x = (np.arange(np.prod(shape)).reshape(shape) % 5 - 2.5).astype(np.float32)
    for fn in fns:
        got, want = graphc.jit(fn)(x), fn(x)
        assert np.asarray(got).dtype == np.asarray(want).dtype and np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    i = np.arange(np.prod(shape), dtype=np.int64).reshape(shape)
    np.testing.assert_array_equal(graphc.jit(lambda i: np.max(i, axis=-1) * 2)(i), np.max(i, axis=-1) * 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_power_by_a_scalar_exponent_takes_numpys_fast_paths(dtype):
    """numpy's float power loop with a scalar (stride-0) exponent computes -1, 0, 0.5, 1 and 2 as
    1/x, 1, sqrt(x), x and x*x: sqrt(-0.0) is -0.0 and sqrt(-inf) nan where pow gives 0.0 and inf.
    A fused kernel does the same; with an exponent array of the result's shape it is pow."""
    x = np.array([-0.0, 0.0, -np.inf, np.inf, np.nan, -1.0, 4.0, 1e-30], dtype)
    with np.errstate(all="ignore"):
        for e in (0.5, -1.0, 2.0, 1.0, 0.0, 3.0, -0.5):
            c = np.asarray(e, dtype)
            fns = [
                lambda v, e=e: np.exp(v * 0.0) * v**e,  # a Python float: 0-d, stride 0
                lambda v, c=c: (v + 0.0) ** c + 0.0,  # a 0-d array
                lambda v, c=c: np.power(v * 1.0, c.reshape(1, 1)) * 1.0,  # size 1, broadcast: stride 0
                lambda v, c=c: np.power(v * 1.0, np.full(v.shape, c)) * 1.0,  # the result's shape: pow
                lambda v, c=c: np.power(v[:1] * 1.0, c.reshape(1)) * 1.0,  # (1,) with (1,): walked, pow
            ]
            for fn in fns:
                got, want = graphc.jit(fn)(x), fn(x)
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"** {e}")
                real = ~np.isnan(want)  # (the sign of a nan is not numpy's to promise)
                np.testing.assert_array_equal(np.signbit(got[real]), np.signbit(want[real]), err_msg=f"** {e}")
                np.testing.assert_allclose(got, want, rtol=4e-7 if dtype == np.float32 else 1e-15, err_msg=f"** {e}")


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32])
def test_a_float_out_of_an_integers_range_wraps_as_numpys_cast(dtype):
    """numpy's cast of a float to a narrower integer goes through a wider one and wraps on x86-64
    (-1.0 to uint8 is 255, 300.0 is 44), without a warning; a fused kernel gave 0 in its vectorized
    loop and the wrapped value in the tail (Numba's direct conversion is undefined out of range;
    found by the long fuzz run, np.subtract.at on a uint8 array). Values within int32's range,
    where numpy does not warn; 37 elements to have both a vectorized part and a tail."""
    u = (np.arange(37) % 5).astype(dtype)
    v = np.linspace(-300.0, 300.0, 37).astype(np.float32)

    def fn(u, v):
        return (u.astype(np.float32) - v).astype(dtype)

    compiled = graphc.jit(fn).compile(u, v)
    assert compiled.stats()["fused_kernels"] == 1
    want = fn(u, v)
    np.testing.assert_array_equal(compiled(u, v), want)
    np.testing.assert_array_equal(graphc.evaluate(graphc.trace(fn, u, v), u, v), want)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.int8])
def test_integer_arithmetic_wraps_as_numpys(dtype):
    """numpy's integer +, - and * wrap. Numba compiles int64 arithmetic with LLVM's ``nsw`` flag,
    which makes a signed overflow undefined, and LLVM then folds ``x + x == 0`` to ``x == 0`` and
    ``x - 1 > x`` to False: the fused kernel of ``(x + x) // (x + x)`` at the most negative int64
    gave -1 where numpy's 0 // 0 is 0 (found by the long fuzz run, dp2). uint32 * uint32 overflows
    int64, the type Numba computes it in. Values at the dtype's extremes, in a vectorized part and
    a tail (37 elements)."""
    info = np.iinfo(dtype)
    x = np.resize(np.array([info.min, info.max, info.min + 1, info.max - 1, 0, 1], dtype), 37)

    def fn(x):
        one = dtype(1)
        return (x + x == 0, x - one > x, (x * dtype(2)) == 0, x * x, -x < 0)

    compiled = graphc.jit(fn).compile(x)
    assert compiled.stats()["fused_kernels"] >= 1
    for got, want in zip(compiled(x), fn(x)):
        np.testing.assert_array_equal(got, want)
