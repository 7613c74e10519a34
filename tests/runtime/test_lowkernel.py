"""Fused bfloat16 kernels (runtime/lowkernel.py) against the op-by-op path (graphc/ops/precision.py,
run by the reference interpreter): bit for bit, on every kind of value."""

import ml_dtypes
import numba
import numpy as np
import pytest

import graphc
from graphc.core.ir import walk
from graphc.core.traits import Fused
from graphc.interpreter import run_flat
from graphc.runtime import lowkernel as lk
from graphc.runtime.codegen import PARALLEL_MIN_ELEMENTS

BF16 = np.dtype(graphc.bfloat16)


@numba.njit
def _round_all(x, out):
    for i in range(x.size):
        out[i] = lk.round_bf16(x[i])


@numba.njit
def _load_store_all(bits, out):
    for i in range(bits.size):
        out[i] = lk.bf16_bits(lk.load_bf16(bits[i]))


def float32_patterns() -> np.ndarray:
    """Every bfloat16 bit pattern as the upper half, with lower halves at and around the rounding
    ties (0x8000), 0, 1 and 0xffff; and a million random float32 patterns."""
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234], np.uint32)
    grid = (upper[:, None] | lows[None, :]).reshape(-1)
    rand = np.random.default_rng(0).integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([grid, rand]).view(np.float32)


def test_rounding_to_bfloat16_is_ml_dtypes_astype_bit_for_bit():
    x = float32_patterns()
    got = np.empty_like(x)
    _round_all(x, got)
    with np.errstate(invalid="ignore"):
        want = x.astype(BF16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_loading_and_storing_keep_every_bfloat16_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty_like(bits)
    _load_store_all(bits, got)
    np.testing.assert_array_equal(got, bits)
    loaded = np.array([lk.load_bf16(np.uint16(b)) for b in (0x3F80, 0xC000, 0x0001, 0x7F80, 0x8000)], np.float32)
    np.testing.assert_array_equal(loaded, np.array([0x3F80, 0xC000, 0x0001, 0x7F80, 0x8000], np.uint16).view(BF16))


def special_values(n: int, seed: int) -> np.ndarray:
    """bfloat16 values with NaNs of both signs, infinities, zeros, subnormals, the largest finite
    values and ordinary ones, shuffled."""
    specials = np.array(
        [0x7FC0, 0xFFC0, 0x7F81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x7F7F, 0xFF7F, 0x3F80],
        np.uint16,
    ).view(BF16)
    rng = np.random.default_rng(seed)
    ordinary = (rng.standard_normal(n) * rng.choice([1e-38, 1.0, 1e30], n)).astype(BF16)
    tiled = np.tile(specials, 3)[:n]
    ordinary[: len(tiled)] = tiled
    return rng.permutation(ordinary)


CASES = {
    "arithmetic": lambda x, y: (x * y + x) / (y - 1.5),
    "neg, abs, sign, sqrt": lambda x, y: np.sqrt(np.abs(-x)) * np.sign(y) - x,
    "where and compare": lambda x, y: np.where(x > y, x - y, y * 0.5),
    "through float32": lambda x, y: (x.astype(np.float32) * y + 1.0).astype(graphc.bfloat16) * x,
    "mixed with float32": lambda x, y: (x * 3.0 + y.astype(np.float32)) * 0.25,
}


def bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype == BF16 else a.view(np.uint32) if a.dtype == np.float32 else a


@pytest.mark.parametrize("n", [1, 300, PARALLEL_MIN_ELEMENTS + 4096])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_kernels_give_the_op_by_op_bits(case, n):
    fn = CASES[case]
    x, y = special_values(n, 1), special_values(n, 2)
    jitted = graphc.jit(fn)
    compiled = jitted.compile(x, y)
    assert any(node.op.has(Fused) for node in walk(compiled.graph.nodes)), "the ops are fused"
    with np.errstate(all="ignore"):
        got = jitted(x, y)
        want = run_flat(compiled.traced, [x, y])[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(bits(got), bits(want))


def test_broadcast_and_non_contiguous_operands():
    x = special_values(64 * 48, 3).reshape(64, 48)[:, ::2]
    y = special_values(24, 4)
    fn = CASES["arithmetic"]
    with np.errstate(all="ignore"):
        got = graphc.jit(fn)(x, y)
        want = run_flat(graphc.jit(fn).compile(x, y).traced, [x, y])[0]
    np.testing.assert_array_equal(bits(got), bits(want))


def test_ops_whose_bits_could_differ_stay_out_of_bfloat16_kernels():
    x = special_values(256, 5).reshape(16, 16)
    compiled = graphc.jit(lambda x: np.exp(x * 2.0) + x.sum(-1, keepdims=True) * np.maximum(x, 1.0)).compile(x)
    for node in walk(compiled.graph.nodes):
        if node.op.has(Fused):
            names = {n.op.name for n in node.regions[0].nodes}
            assert not names & {"exp", "reduce_sum", "maximum"}, names
    with np.errstate(all="ignore"):
        got = compiled(x)
        want = run_flat(compiled.traced, [x])[0]
    np.testing.assert_array_equal(bits(got), bits(want))


def test_ml_dtypes_is_the_bfloat16_of_graphc():
    assert BF16 == np.dtype(ml_dtypes.bfloat16)


def test_float32_ops_in_the_loop_keep_the_bits_of_a_float32_kernel():
    # exp on float32 values joins the bfloat16 loop: it computes as in a float32 kernel (graphc's
    # exp32), so the result is the float32 kernel's, rounded where the graph says bfloat16
    def fn(x, y):
        return (np.exp(x.astype(np.float32) * 0.5) * y.astype(np.float32)).astype(graphc.bfloat16) + x

    x, y = special_values(PARALLEL_MIN_ELEMENTS + 77, 6), special_values(PARALLEL_MIN_ELEMENTS + 77, 7)
    compiled = graphc.jit(fn).compile(x, y)
    (kernel,) = [n for n in walk(compiled.graph.nodes) if n.op.has(Fused)]
    assert {"exp", "add"} <= {n.op.name for n in kernel.regions[0].nodes}
    f32 = graphc.jit(lambda a, b: np.exp(a * 0.5) * b)
    with np.errstate(all="ignore"):
        got = compiled(x, y)
        a = f32(x.astype(np.float32), y.astype(np.float32))
        want = (a.astype(BF16).astype(np.float32) + x.astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(bits(got), bits(want))


def test_float32_power_and_maximum_in_the_loop_keep_the_float32_kernels_bits():
    def fn(x, y):
        z = np.maximum(x.astype(np.float32), 0.0) ** 2 + y.astype(np.float32) ** 0.5
        return z.astype(graphc.bfloat16) * y

    x, y = special_values(4096, 8), special_values(4096, 9)
    compiled = graphc.jit(fn).compile(x, y)
    assert any(n.op.has(Fused) for n in walk(compiled.graph.nodes))
    f32 = graphc.jit(lambda a, b: np.maximum(a, 0.0) ** 2 + b**0.5)
    with np.errstate(all="ignore"):
        got = compiled(x, y)
        z = f32(x.astype(np.float32), y.astype(np.float32)).astype(BF16)
        want = (z.astype(np.float32) * y.astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(bits(got), bits(want))


def test_a_kernel_holds_bfloat16_values_or_reductions_never_both():
    def fn(x, y):
        s = (x * 2.0).astype(np.float32).sum(-1, keepdims=True)  # bf16 ops feeding a float32 row sum
        return (s * y.astype(np.float32) + 1.0).astype(graphc.bfloat16) - y

    x, y = special_values(64 * 32, 10).reshape(64, 32), special_values(64 * 32, 11).reshape(64, 32)
    x[np.isnan(x.astype(np.float32)) | np.isinf(x.astype(np.float32))] = 1.0
    compiled = graphc.jit(fn).compile(x, y)
    kernels = [n for n in walk(compiled.graph.nodes) if n.op.has(Fused)]
    assert len(kernels) >= 2
    for k in kernels:
        body = k.regions[0].nodes
        has_bf16 = any(v.dtype == BF16 for n in body for v in (*n.inputs, *n.outputs))
        has_sum = any(n.op.name == "reduce_sum" for n in body)
        assert not (has_bf16 and has_sum), [n.op.name for n in body]
    with np.errstate(all="ignore"):
        got = compiled(x, y).astype(np.float32)
        want = run_flat(compiled.traced, [x, y])[0].astype(np.float32)
    # the float32 row sum adds in the kernel's order: within a bfloat16 ulp of the interpreter's
    np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=0)
