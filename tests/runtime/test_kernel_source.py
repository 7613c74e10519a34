"""The kernel generator (runtime/kernelsource.py) on many region shapes: every kernel equals numpy,
gives the same bits whatever rows a call is given (threads split rows; a pipelined kernel runs a
row's first phase in the loop of the row before), writes only its own rows, and takes the loop
structure it should (reductions in the loop, values waiting in output rows, next-row pipelining)."""

import math

import numpy as np
import pytest

import graphc
from graphc.bench.kernels import layer_norm, softmax
from graphc.core.ir import walk
from graphc.runtime.codegen import CompiledKernel


def masked_softmax(x, mask):
    # [B, T, T] scores, [T, T] mask broadcast over the batch (a periodic operand)
    s = x * 0.125 + mask
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def residual_layer_norm(x, y, g, b):
    # two results: the residual sum (written in the first phase) and its layer norm
    h = x + y
    mean = h.mean(axis=-1, keepdims=True)
    var = ((h - mean) ** 2).mean(axis=-1, keepdims=True)
    return h, (h - mean) / np.sqrt(var + 1e-5) * g + b


def layer_norm_backward(dy, xhat, rstd, g):
    # sums in the last phase as well: the kernel's row results are reductions of its last loop
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, (dx * xhat).sum(-1), np.abs(dx).max(-1)


def log_softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def min_max_range(x):
    return x.max(-1) - x.min(-1), (x - x.min(-1, keepdims=True)) / (x.max(-1, keepdims=True) + 1.0)


def int_sums(i):
    return (i * 3).sum(-1), i.max(-1, keepdims=True) - i


def gelu_sum(x):
    y = 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return y, y.sum(-1)


def _args(name, rows, n, dtype, rng):
    def f(*shape, scale=2.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    if name == "masked_softmax":
        mask = np.where(np.tri(n, dtype=bool), 0.0, -1e9).astype(dtype)
        return (f(rows, n, n), mask)
    if name == "layer_norm":
        return (f(rows, n), f(n), f(n))
    if name == "residual_layer_norm":
        return (f(rows, n), f(rows, n), f(n), f(n))
    if name == "layer_norm_backward":
        return (f(rows, n), f(rows, n), np.abs(f(rows, 1)) + 0.5, f(n))
    if name == "int_sums":
        return (rng.integers(-1000, 1000, (rows, n)),)
    return (f(rows, n),)


CASES = [
    "softmax",
    "masked_softmax",
    "layer_norm",
    "residual_layer_norm",
    "layer_norm_backward",
    "log_softmax",
    "min_max_range",
    "int_sums",
    "gelu_sum",
]


def _kernels(fn, args):
    """The compiled graph's fused kernels, with the arrays each one reads (run in order)."""
    compiled = graphc.jit(fn).compile(*args)
    env = dict(zip(compiled.graph.inputs, args))
    kernels = []
    for node in walk(compiled.graph.nodes):
        if node.op.name == "fused":
            kernels.append((node, CompiledKernel(node, [v.shape for v in node.inputs])))
    return compiled, env, kernels


def _run_rows(kernel: CompiledKernel, operands: list[np.ndarray], splits: list[int]) -> list[np.ndarray]:
    """Run ``kernel`` over its rows in the given pieces (0 = s0 < s1 < ... = rows), as threads would."""
    ops = []
    for a, (shape, full) in zip(operands, kernel._operand_shapes):
        if full is not None and a.shape != full:
            a = np.broadcast_to(a, full)
        ops.append(np.ascontiguousarray(a).reshape(shape))
    outs = [np.full(shape, 7, dtype) for shape, dtype, _ in kernel._out_shapes]
    views = [o.reshape(view) for o, (_, _, view) in zip(outs, kernel._out_shapes)]
    for lo, hi in zip(splits, splits[1:]):
        kernel.func(*ops, *views, lo, hi, kernel.n)
    return outs


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(("rows", "n"), [(1, 1), (3, 1), (1, 7), (5, 255), (4, 256), (7, 257), (6, 600)])
def test_kernels_equal_numpy_and_give_the_same_bits_for_any_row_split(name, rows, n):
    fn = globals()[name]
    dtype = np.float64 if (rows + n) % 3 == 0 else np.float32
    args = _args(name, rows, n, dtype, np.random.default_rng(rows * 1000 + n))
    with np.errstate(all="ignore"):
        want = fn(*args)
        got = graphc.jit(fn)(*args)
    for g, w in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want))):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
        else:
            tol = 2e-6 if w.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.abs(w).max())
    _, env, kernels = _kernels(fn, args)
    for node, kernel in kernels:
        if not all(v in env for v in node.inputs):
            continue  # a kernel reading another kernel's result: covered by the end-to-end check
        operands = [env[v] for v in node.inputs]
        whole = _run_rows(kernel, operands, [0, kernel.rows])
        for splits in ([0, 1, kernel.rows], [0, kernel.rows // 2, kernel.rows], list(range(kernel.rows + 1))):
            if sorted(set(splits)) != splits:
                continue
            for a, b in zip(whole, _run_rows(kernel, operands, splits)):
                np.testing.assert_array_equal(a, b, err_msg=f"rows split at {splits}")


@pytest.mark.parametrize("name", ["softmax", "residual_layer_norm", "layer_norm_backward"])
def test_a_call_writes_only_its_rows(name):
    """A range of rows [r0, r1) leaves every other row of every result as it was: the row before
    r0 and the one after r1 - 1, which a pipelined kernel touches, go to dummy rows."""
    fn = globals()[name]
    args = _args(name, 6, 40, np.float32, np.random.default_rng(0))
    _, env, kernels = _kernels(fn, args)
    node, kernel = kernels[0]
    operands = [env[v] for v in node.inputs]
    ops = [
        np.ascontiguousarray(np.broadcast_to(a, full) if full else a).reshape(shape)
        for a, (shape, full) in zip(operands, kernel._operand_shapes)
    ]
    outs = [np.full(shape, 7, dtype) for shape, dtype, _ in kernel._out_shapes]
    views = [o.reshape(view) for o, (_, _, view) in zip(outs, kernel._out_shapes)]
    kernel.func(*ops, *views, 2, 4, kernel.n)
    full = _run_rows(kernel, operands, [0, kernel.rows])
    for o, f, (_, _, view) in zip(outs, full, kernel._out_shapes):
        o, f = o.reshape(view), f.reshape(view)
        np.testing.assert_array_equal(o[2:4], f[2:4])
        assert (o[:2] == 7).all() and (o[4:] == 7).all()
    kernel.func(*ops, *views, 3, 3, kernel.n)  # an empty range does nothing


def _source(fn, *args):
    _, _, kernels = _kernels(fn, args)
    return [k.source for _, k in kernels]


def test_loop_structure():
    x = np.ones((8, 300), np.float32)
    g = np.ones(300, np.float32)
    (sm,) = _source(softmax, x)
    # softmax: the max of the next row in the division's loop, the exponentials in the output row
    # and summed from it (no scratch row), three loops a row
    assert "for r in range(r0 - 1, r1):" in sm
    assert "np.empty(n" not in sm
    assert "fm.maximum(a_n_v" in sm and "fm.row_sum32(out0[r])" in sm
    assert sm.count("for j in range(n):") == 2  # the exponentials; the division with the next max
    (ln,) = _source(layer_norm, x, g, g)
    assert "for r in range(r0 - 1, r1):" in ln
    # a float sum is accumulated only in a loop that stores nothing (its order would otherwise
    # depend on where the arrays are: the vectorized loop's overlap check)
    for src in (sm, ln):
        for body in _loop_bodies(src):
            if any("fm.radd" in line for line in body):
                assert not any("] = " in line for line in body), body

    # one phase (GELU): no pipelining, one loop
    (ge,) = _source(lambda v: np.tanh(v) * 0.5, x)
    assert "for r in range(r0, r1):" in ge and ge.count("for j in range") == 1
    # a first phase that reads a per-row operand cannot run in the row before: not pipelined
    (rowop,) = _source(lambda v, s: (v * s).max(-1, keepdims=True) - v * s, x, np.ones((8, 1), np.float32))
    assert "for r in range(r0, r1):" in rowop


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(("rows", "n"), [(1, 1), (3, 7), (5, 257), (6, 600)])
def test_results_written_over_their_operands_are_the_same_bits(name, rows, n):
    """The pairs a kernel allows in place (KernelSpec._in_place_pairs) give the bits of a run into
    fresh buffers, in one call and with the rows split, through the variant that reads the operand
    through the result's array."""
    fn = globals()[name]
    args = _args(name, rows, n, np.float32, np.random.default_rng(7))
    _, env, kernels = _kernels(fn, args)
    checked = 0
    for node, kernel in kernels:
        if not all(v in env for v in node.inputs):
            continue
        operands = [np.ascontiguousarray(env[v]) for v in node.inputs]
        want = kernel.call_into([a.copy() for a in operands], {})
        for i, k in kernel.in_place:
            if node.inputs[i].type != node.outputs[k].type:
                continue  # the executor only offers a buffer of the result's type
            ops = [a.copy() for a in operands]
            got = kernel.call_into(ops, {k: ops[i]})
            assert got[k] is ops[i]
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
            func = kernel._aliased_func(frozenset([(i, k)]))
            ops = [a.copy() for a in operands]
            outs = [
                ops[i] if j == k else np.empty(shape, dtype) for j, (shape, dtype, _) in enumerate(kernel._out_shapes)
            ]
            views = [o.reshape(view) for o, (_, _, view) in zip(outs, kernel._out_shapes)]
            flat = [a.reshape(shape) for a, (shape, _full) in zip(ops, kernel._operand_shapes)]
            for lo, hi in [(0, 1), (1, kernel.rows)] if kernel.rows > 1 else [(0, 1)]:
                func(*flat, *views, lo, hi, kernel.n)
            for a, b in zip(outs, want):
                np.testing.assert_array_equal(a, b)
            checked += 1
    if name in ("softmax", "layer_norm", "gelu_sum", "log_softmax") and n > 1:
        assert checked, "an elementwise-in, elementwise-out kernel runs in place"


def test_a_sum_does_not_depend_on_where_the_arrays_are():
    """LLVM guards a vectorized loop that stores with a run-time check that its arrays do not
    overlap; small arrays side by side fail it and the scalar loop runs instead. A sum accumulated
    in such a loop rounded differently with the arrays' addresses (one jitted function gave two
    results, tests/api/test_ps.py); sums come from a store-free reducer now."""

    def f(x, y):
        p = x * y + 0.5
        return p, p.sum(-1)

    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((1, 50)).astype(np.float32) for _ in range(2))
    _, _, [(node, kernel)] = _kernels(f, (x, y))
    results = set()
    for gap in range(0, 96, 4):  # place the result right after the operands, then further away
        buf = np.zeros(3 * 50 + 2 * gap + 64, np.float32)
        a, b = buf[:50], buf[50 + gap : 100 + gap]
        out = buf[100 + 2 * gap : 150 + 2 * gap]
        a[:], b[:] = x[0], y[0]
        total = np.empty(1, np.float32)
        kernel.func(a.reshape(1, 50), b.reshape(1, 50), out.reshape(1, 50), total, 0, 1, 50)
        results.add((out.tobytes(), total.tobytes()))
    assert len(results) == 1


def _loop_bodies(source: str) -> list[list[str]]:
    """The lines of each innermost ``for j``/``for k`` loop of a kernel's source."""
    lines = source.splitlines()
    bodies = []
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith(("for j in", "for k in")):
            depth = len(line) - len(stripped)
            body = []
            for nxt in lines[i + 1 :]:
                if len(nxt) - len(nxt.lstrip()) <= depth:
                    break
                body.append(nxt)
            bodies.append(body)
    return bodies
