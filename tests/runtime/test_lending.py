"""Results lent to the caller (runtime/lending.py): a jitted call writes into the buffer of a result
the caller dropped, and never into memory the caller can still reach."""

import threading
import weakref

import numpy as np
import pytest

import graphc
from graphc.runtime.executor import STRAIGHT_BYTES
from graphc.runtime.lending import KEEP_CALLS, Lender

N = STRAIGHT_BYTES // 4 * 2  # float32 elements of a result large enough to be pooled


def scale(x, s):
    return x * s + 1.0


def pool_of(jitted, *args):
    return jitted.compile(*args).executable.pool


def data(n=N, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def test_a_dropped_result_is_written_again_and_the_result_is_right():
    f = graphc.jit(scale)
    x = data()
    pool = pool_of(f, x, 2.0)
    f(x, 2.0)
    allocated = pool.allocated
    for s in (3.0, 4.0, 5.0):
        np.testing.assert_allclose(f(x, s), scale(x, s), rtol=1e-6, atol=1e-6)
    assert pool.allocated == allocated  # every later result took back a dropped one
    assert pool.lender.taken_back >= 3


@pytest.mark.parametrize("keep", ["result", "slice", "reshaped", "transposed", "memoryview", "base", "list"])
def test_nothing_the_caller_still_holds_is_overwritten(keep):
    f = graphc.jit(scale)
    x = data()
    y = f(x, 2.0)
    held = {
        "result": lambda y: y,
        "slice": lambda y: y[5:-7:3],
        "reshaped": lambda y: y.reshape(2, -1)[1],
        "transposed": lambda y: y.reshape(4, -1).T,
        "memoryview": lambda y: memoryview(y),
        "base": lambda y: y.base,
        "list": lambda y: [y[:10]],
    }[keep](y)
    snapshot = np.array(held[0] if keep == "list" else held, copy=True)
    del y
    others = [f(x, s) for s in (3.0, 4.0, 5.0, 6.0)]  # several calls: the lender cycles its buffers
    got = np.asarray(held[0] if keep == "list" else held)
    np.testing.assert_array_equal(got, snapshot)
    for o, s in zip(others, (3.0, 4.0, 5.0, 6.0)):
        assert not np.shares_memory(o, got)
        np.testing.assert_allclose(o, scale(x, s), rtol=1e-6, atol=1e-6)


def test_a_result_fed_back_is_never_its_own_output():
    f = graphc.jit(lambda y: y * 0.5 + 1.0)
    y = data()
    want = y.copy()
    for _ in range(6):  # the previous result is the argument: alive during the call
        prev = y
        y = f(y)
        want = want * np.float32(0.5) + np.float32(1.0)
        assert not np.shares_memory(y, prev)
        np.testing.assert_array_equal(y, want)
        del prev


def test_two_results_and_one_value_returned_twice_are_separate_arrays():
    f = graphc.jit(lambda x: (np.exp(x * 0.1), np.exp(x * 0.1), x * 2.0))
    x = data()
    for _ in range(4):
        a, b, c = f(x)
        assert not np.shares_memory(a, b) and not np.shares_memory(a, c) and not np.shares_memory(b, c)
        a[:] = 7.0  # writing one never changes another
        np.testing.assert_allclose(b, np.exp(x * np.float32(0.1)), rtol=1e-6)
        np.testing.assert_array_equal(c, x * np.float32(2.0))


@pytest.mark.parametrize(
    "dtype, fn",
    [
        (np.float64, lambda x: x * 0.25 - x),
        (np.int32, lambda x: x * 3 + 1),
        (np.int64, lambda x: x - 5),
        (np.bool_, lambda x: ~x),
        (np.float16, lambda x: x * 2.0),
    ],
)
def test_results_of_every_dtype_stay_the_callers(dtype, fn):
    f = graphc.jit(fn)
    x = (np.arange(N) % 7).astype(dtype) if dtype != np.bool_ else np.arange(N) % 3 == 0
    first = f(x)
    kept = first.copy()
    for _ in range(3):
        np.testing.assert_array_equal(f(x), fn(x))
    np.testing.assert_array_equal(first, kept)
    assert first.dtype == np.dtype(dtype)


@pytest.mark.parametrize("shape", [(0,), (1,), (0, 3), (1, 1)])
def test_size_zero_and_one(shape):
    f = graphc.jit(scale)
    x = np.ones(shape, np.float32)
    for _ in range(3):
        y = f(x, 2.0)
        assert y.shape == shape
        np.testing.assert_allclose(y, scale(x, 2.0), rtol=1e-6)


def test_a_non_contiguous_argument():
    f = graphc.jit(scale)
    x = data(2 * N).reshape(2, N)[:, ::2]
    for s in (2.0, 3.0):
        np.testing.assert_allclose(f(x, s), scale(x, s), rtol=1e-6, atol=1e-6)


def test_the_lender_keeps_at_most_the_last_calls_and_lets_go_of_the_rest():
    f = graphc.jit(scale)
    x = data()
    pool = pool_of(f, x, 2.0)
    kept = [f(x, float(s)) for s in range(6)]  # the caller holds all six
    nbytes = kept[0].nbytes
    assert pool.lent_bytes == KEEP_CALLS * nbytes
    dead = weakref.ref(kept[0].base)  # lent by the first call: the lender let go of it
    del kept
    assert dead() is None
    assert pool.lent_bytes == KEEP_CALLS * nbytes
    for k in range(6):
        np.testing.assert_allclose(f(x, float(k)), scale(x, float(k)), rtol=1e-6, atol=1e-6)


def test_a_weak_reference_to_a_dropped_result_dies():
    f = graphc.jit(scale)
    x = data()
    ref = weakref.ref(f(x, 2.0))
    assert ref() is None  # the caller got a view of its own, not the pool's buffer
    f(x, 3.0)
    assert ref() is None


def test_concurrent_calls_never_share_a_result():
    f = graphc.jit(scale)
    xs = [data(seed=k) for k in range(2)]
    f(xs[0], 1.0)
    errors = []

    def run(k):
        try:
            for i in range(8):
                y = f(xs[k], float(i))
                np.testing.assert_allclose(y, scale(xs[k], float(i)), rtol=1e-6, atol=1e-6)
        except AssertionError as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_lender_reclaims_only_buffers_nothing_else_refers_to():
    lender = Lender()
    a, b = np.empty((4, 5), np.float32), np.empty(20, np.float32)
    va, vb = lender.lend([a, b])
    del a, b
    assert lender.reclaim() == []  # va and vb hold them
    del va
    (got,) = lender.reclaim()
    assert got.shape == (4, 5) and lender.reclaim() == []
    assert lender.bytes == vb.nbytes
    lender.release()
    assert lender.bytes == 0 and lender.reclaim() == []


def test_a_run_stays_within_its_liveness_peak_with_results_lent():
    def f(x, w):  # a kernel result from the pool (lent), and a product of its shape (a temporary)
        return np.tanh(x) * w + 1.0, (x @ w).sum()

    x, w = data(512 * 512).reshape(512, 512), data(512 * 512, seed=1).reshape(512, 512)
    jitted = graphc.jit(f)
    ex = jitted.compile(x, w).executable
    for _ in range(4):
        jitted(x, w)  # dropped: its buffer is a free buffer of the next run
        assert ex.pool.free_bytes <= ex.program.high_water
    assert ex.pool.lender.taken_back >= 3
    prof: dict = {}
    ex.run_flat([x, w], prof)
    # the arguments + the live values + what the pool holds, never above the arguments + the liveness peak
    assert prof["peak_bytes"] <= x.nbytes + w.nbytes + ex.program.high_water
