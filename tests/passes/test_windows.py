"""batch_windows (passes/windows.py): a loop's writes of per-window expressions become one gather,
one op per kind and one scatter, with numpy's values; chains it must not batch are left alone."""

import numpy as np
import pytest

import graphc
from graphc.ops import OPS
from graphc.passes import run_passes
from graphc.passes.windows import MIN_WRITES, batch_windows

RNG = np.random.default_rng(33)


def optimized(fn, *args):
    return run_passes(graphc.trace(fn, *args), verify=True).graph


def count(graph, op) -> int:
    return sum(n.op is op for n in graph.nodes)


def check(fn, *args, batched: bool, rtol=1e-12):
    want = fn(*args)
    got = graphc.jit(fn)(*args)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.max(np.abs(want)))
    assert np.asarray(got).dtype == np.asarray(want).dtype
    g = optimized(fn, *args)
    assert (count(g, OPS.dynamic_update_slice) == 0) == batched
    return g


def conv_loop(image, filt, bias):
    n_f, f = filt.shape[0], filt.shape[-1]
    size = image.shape[-1] - f + 1
    out = np.zeros((n_f, size, size))
    for k in range(n_f):
        for y in range(size):
            for x in range(size):
                out[k, y, x] = np.sum(filt[k] * image[:, y : y + f, x : x + f]) + bias[k]
    return out


def test_a_convolution_written_per_window_is_one_gather_and_one_scatter():
    image, filt, bias = RNG.standard_normal((2, 7, 7)), RNG.standard_normal((3, 2, 3, 3)), RNG.standard_normal(3)
    # each output is a sum of 18 products: the batched sum adds them in another order
    g = check(conv_loop, image, filt, bias, batched=True, rtol=18 * np.finfo(np.float64).eps * 4)
    assert count(g, OPS.scatter) == 1 and len(g.nodes) <= 24  # from 3 * 25 windows of 5 ops each


def test_block_writes_strides_and_shared_values():
    def blocks(x, w):
        out = np.zeros((4, 16), np.float32)
        for i in range(8):
            out[:, 2 * i : 2 * i + 2] = np.where(x[:, i : i + 2] > 0, x[:, i : i + 2] * w, 0.5).astype(np.float32)
        return out

    check(blocks, RNG.standard_normal((4, 9)).astype(np.float32), np.float32(1.5), batched=True, rtol=0)

    def strided(x):
        out = np.zeros(MIN_WRITES + 2)
        for i in range(MIN_WRITES + 2):
            out[i] = np.sum(x[i : i + 4 : 2])  # a strided window: not batched
        return out

    check(strided, RNG.standard_normal(MIN_WRITES + 6), batched=False)


def test_writes_that_read_the_buffer_or_overlap_keep_numpys_order():
    def running(x):
        out = np.zeros(12)
        for i in range(1, 12):
            out[i] = out[i - 1] + x[i]  # reads what the chain wrote: not batched
        return out

    check(running, RNG.standard_normal(12), batched=False)

    def overlapping(x):
        out = np.zeros(6)
        for i in range(12):
            out[i % 6 : i % 6 + 1] = x[i : i + 1] * 2  # each position written twice: the last wins
        return out

    check(overlapping, RNG.standard_normal(12), batched=True, rtol=0)


def test_too_few_writes_and_reductions_over_windows():
    def few(x):
        out = np.zeros(MIN_WRITES - 1)
        for i in range(MIN_WRITES - 1):
            out[i] = np.max(x[i : i + 3])
        return out

    check(few, RNG.standard_normal(MIN_WRITES + 2), batched=False)

    def pooled(x):
        out = np.zeros((2, 4, 4))
        for c in range(2):
            for y in range(4):
                for z in range(4):
                    out[c, y, z] = np.max(x[c, 2 * y : 2 * y + 2, 2 * z : 2 * z + 2], axis=(0, 1))
        return out

    check(pooled, RNG.standard_normal((2, 8, 8)), batched=True, rtol=0)


def test_the_pass_is_a_no_op_without_chains_and_under_grad():
    g = graphc.trace(lambda x: np.tanh(x) * 2, np.ones(3))
    assert batch_windows(g) is g
    image, filt, bias = RNG.standard_normal((1, 6, 6)), RNG.standard_normal((2, 1, 3, 3)), RNG.standard_normal(2)
    grad = graphc.jit(graphc.grad(lambda f: np.sum(conv_loop(image, f, bias) ** 2)))(filt)
    eps, direction = 1e-6, RNG.standard_normal(filt.shape)
    loss = lambda f: np.sum(conv_loop(image, f, bias) ** 2)  # noqa: E731
    numeric = (loss(filt + eps * direction) - loss(filt - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(np.sum(grad * direction), numeric, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_dtypes_are_kept(dtype):
    def f(x):
        out = np.zeros(10, dtype)
        for i in range(10):
            out[i] = np.sum(x[i : i + 2])
        return out

    check(f, (RNG.standard_normal(11) * 10).astype(dtype), batched=True, rtol=1e-6 if dtype == np.float32 else 0)
