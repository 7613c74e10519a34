"""Hypothesis strategies for random graphs built from the op registry.

Every op in the registry has a sampler here (tests/ops/test_registry.py fails otherwise): given the
values built so far it draws operands and attributes that the op's rule accepts, creating constant
operands when the pool has nothing suitable.
"""

from __future__ import annotations

import contextvars

import numpy as np
from hypothesis import strategies as st

from graphc.builder import GraphBuilder
from graphc.core.ir import Graph, TensorType, Value
from graphc.ops.elementwise import COMPARISONS
from graphc.ops.shape import normalize_slice

DTYPES = [np.dtype(d) for d in ("float32", "float64", "int64", "int32", "bool")]
# non-finite and extreme constants (on by default; off for finite-difference tests)
SPECIALS = contextvars.ContextVar("SPECIALS", default=True)
# the smallest dim of drawn shapes: 0 brings in empty arrays (random_graphs(min_dim=0))
MIN_DIM = contextvars.ContextVar("MIN_DIM", default=1)
FLOATS = [d for d in DTYPES if d.kind == "f"]


def shapes(min_rank=0, max_rank=3, min_dim=None, max_dim=4):
    low = MIN_DIM.get() if min_dim is None else min_dim
    return st.lists(st.integers(low, max_dim), min_size=min_rank, max_size=max_rank).map(tuple)


def random_array(draw, shape, dtype) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        return np.asarray(rng.integers(-5, 6, size=shape), dtype=dtype)
    arr = np.asarray(rng.standard_normal(shape), dtype=dtype)
    if arr.size and SPECIALS.get() and draw(st.booleans()):  # specials must survive printing bit-exactly
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-30, 3.4e38], dtype=dtype)
        flat = arr.reshape(-1)
        flat[draw(st.integers(0, arr.size - 1))] = specials[draw(st.integers(0, len(specials) - 1))]
    return arr


def constant(draw, b: GraphBuilder, shape, dtype) -> Value:
    return b.op("constant", value=random_array(draw, tuple(shape), np.dtype(dtype)))


def pick(draw, b: GraphBuilder, pool: list[Value], ok, make_dtype=None, min_rank=0) -> Value:
    """A pool value satisfying ``ok``, or a new constant (of ``make_dtype``) when none does."""
    candidates = [v for v in pool if ok(v) and v.type.ndim >= min_rank]
    if candidates and draw(st.booleans()):
        return draw(st.sampled_from(candidates))
    dt = make_dtype or draw(st.sampled_from(DTYPES))
    min_dim = 1 if getattr(ok, "needs_elements", False) else None
    return constant(draw, b, draw(shapes(min_rank=min_rank, min_dim=min_dim)), dt)


def broadcast_partner(draw, shape) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape`` to ``shape``: a suffix with some dims set to 1."""
    k = draw(st.integers(0, len(shape)))
    suffix = list(shape[len(shape) - k :])
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


def kind_is(*kinds):
    return lambda v: v.dtype.kind in kinds


def nonempty(ok):
    """Ops that need elements (max/min/argmax reductions, gathers): no zero-size dims."""

    def accepts(v):
        return ok(v) and all(d > 0 for d in v.shape)

    accepts.needs_elements = True  # type: ignore[attr-defined]  # pick() makes new constants nonempty too
    return accepts


def _unary(kinds, make):
    def sample(draw, b, pool, name):
        x = pick(draw, b, pool, kind_is(*kinds), make)
        return [b.op(name, x)]

    return sample


def _binary(kinds, make, **extra):
    def sample(draw, b, pool, name):
        x = pick(draw, b, pool, kind_is(*kinds), make)
        y = constant(draw, b, broadcast_partner(draw, x.shape), x.dtype)
        if name == "pow" and x.dtype.kind in "iu":
            y = b.op("abs", y)  # integers to negative integer powers raise in numpy
        attrs = {k: draw(v) for k, v in extra.items()}
        operands = (x, y) if draw(st.booleans()) else (y, x)
        if name == "pow" and x.dtype.kind in "iu":
            operands = (x, y)
        return [b.op(name, *operands, **attrs)]

    return sample


f32 = np.dtype("float32")
SAMPLERS = {
    **{n: _unary("f", f32) for n in ("exp", "log", "log1p", "expm1", "tanh", "sqrt", "sin", "cos")},
    "neg": _unary("if", f32),
    "abs": _unary("iuf", f32),
    "sign": _unary("iuf", f32),
    "logical_not": _unary("b", np.dtype(bool)),
    **{n: _binary("biuf", None) for n in ("add", "mul", "maximum", "minimum")},
    "sub": _binary("iuf", f32),
    "div": _binary("f", f32),
    "pow": _binary("iuf", f32),
    "logical_and": _binary("b", np.dtype(bool)),
    "logical_or": _binary("b", np.dtype(bool)),
    "compare": _binary("biuf", None, direction=st.sampled_from(sorted(COMPARISONS))),
}


def _sampler(name):
    def register(fn):
        SAMPLERS[name] = lambda draw, b, pool, _name: fn(draw, b, pool)
        return fn

    return register


@_sampler("where")
def _where(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    c = constant(draw, b, broadcast_partner(draw, x.shape), bool)
    y = constant(draw, b, broadcast_partner(draw, x.shape), x.dtype)
    return [b.op("where", c, x, y)]


@_sampler("convert")
def _convert(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    return [b.op("convert", x, dtype=draw(st.sampled_from(DTYPES)))]


def _axes(draw, ndim):
    return tuple(sorted(draw(st.sets(st.integers(0, ndim - 1), max_size=ndim)))) if ndim else ()


def _reduce(name, kinds, need_elements=False):
    @_sampler(name)
    def sample(draw, b, pool):
        x = pick(draw, b, pool, nonempty(kind_is(*kinds)) if need_elements else kind_is(*kinds), f32)
        return [b.op(name, x, axes=_axes(draw, x.ndim), keepdims=draw(st.booleans()))]


_reduce("reduce_sum", "iuf")
_reduce("reduce_max", "biuf", need_elements=True)
_reduce("reduce_min", "biuf", need_elements=True)


@_sampler("argmax")
def _argmax(draw, b, pool):
    x = pick(draw, b, pool, nonempty(lambda v: True), min_rank=1)
    return [b.op("argmax", x, axis=draw(st.integers(0, x.ndim - 1)), keepdims=draw(st.booleans()))]


@_sampler("reshape")
def _reshape(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    size = x.type.size
    options = [(size,), (1,) + x.shape, tuple(reversed(x.shape)), x.shape + (1,)]
    if x.ndim >= 2:
        options.append(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
    return [b.op("reshape", x, shape=draw(st.sampled_from(options)))]


@_sampler("transpose")
def _transpose(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    return [b.op("transpose", x, perm=tuple(draw(st.permutations(range(x.ndim)))))]


@_sampler("broadcast_to")
def _broadcast(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    shape = tuple(draw(st.integers(1, 3)) if d == 1 else d for d in x.shape)
    return [b.op("broadcast_to", x, shape=(draw(st.integers(1, 3)),) * draw(st.integers(0, 1)) + shape)]


@_sampler("slice")
def _slice(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    bounds = []
    for n in x.shape:
        s = slice(
            draw(st.integers(-n - 1, n + 1) | st.none()),
            draw(st.integers(-n - 1, n + 1) | st.none()),
            draw(st.sampled_from([1, 1, 2, -1, -2, 3])),
        )
        bounds.append(normalize_slice(s, n))
    starts, stops, steps = (tuple(t) for t in zip(*bounds)) if bounds else ((), (), ())
    return [b.op("slice", x, starts=starts, stops=stops, steps=steps)]


@_sampler("pad")
def _pad(draw, b, pool):
    x = pick(draw, b, pool, kind_is("iuf"), f32)
    widths = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in x.shape)
    value = draw(st.sampled_from([0, 1, -3])) if x.dtype.kind in "iu" else draw(st.sampled_from([0.0, 1.5, -2.0]))
    return [b.op("pad", x, widths=widths, value=value)]


@_sampler("concatenate")
def _concat(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True, min_rank=1)
    axis = draw(st.integers(0, x.ndim - 1))
    others = []
    for _ in range(draw(st.integers(1, 2))):
        shape = list(x.shape)
        shape[axis] = draw(st.integers(0, 3))
        others.append(constant(draw, b, shape, x.dtype))
    return [b.op("concatenate", x, *others, axis=axis)]


@_sampler("split")
def _split(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True, min_rank=1)
    axis = draw(st.integers(0, x.ndim - 1))
    indices = tuple(sorted(draw(st.lists(st.integers(0, x.shape[axis]), max_size=3))))
    return list(b.op("split", x, indices=indices, axis=axis) if indices else [b.op("split", x, indices=(), axis=axis)])


@_sampler("sharding")
def _sharding(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True)
    choices = ["[R]"] + [f"[S({d})]" for d in range(x.ndim)]
    return [b.op("sharding", x, spec=draw(st.sampled_from(choices)))]


@_sampler("gather")
def _gather(draw, b, pool):
    x = pick(draw, b, pool, nonempty(lambda v: True), min_rank=1)
    k = draw(st.integers(1, x.ndim))
    axis = draw(st.integers(0, x.ndim - k))
    idx_shape = draw(shapes(max_rank=2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices = []
    for d in range(k):
        n = x.shape[axis + d]
        arr = np.asarray(rng.integers(-n, n, size=idx_shape), dtype=draw(st.sampled_from([np.int64, np.int32])))
        indices.append(b.op("constant", value=arr))
    return [b.op("gather", x, *indices, axis=axis)]


@_sampler("matmul")
def _matmul(draw, b, pool):
    x = pick(draw, b, pool, kind_is("iuf"), f32, min_rank=2)
    m = draw(st.integers(1, 4))
    batch = broadcast_partner(draw, x.shape[:-2])
    y = constant(draw, b, batch + (x.shape[-1], m), x.dtype)
    return [b.op("matmul", x, y)]


@_sampler("einsum")
def _einsum(draw, b, pool):
    x = pick(draw, b, pool, kind_is("iuf"), f32, min_rank=1)
    letters = "abcdefgh"
    xs = letters[: x.ndim]
    shared = "".join(c for c in xs if draw(st.booleans()))
    new = letters[x.ndim : x.ndim + draw(st.integers(0, 2))]
    ys = "".join(draw(st.permutations(shared + new)))
    sizes = dict(zip(xs, x.shape)) | {c: draw(st.integers(1, 3)) for c in new}
    y = constant(draw, b, tuple(sizes[c] for c in ys), x.dtype)
    out = "".join(c for c in sorted(set(xs + ys)) if draw(st.booleans()))
    return [b.op("einsum", x, y, equation=f"{xs},{ys}->{out}")]


@_sampler("constant")
def _constant(draw, b, pool):
    return [constant(draw, b, draw(shapes()), draw(st.sampled_from(DTYPES)))]


@st.composite
def random_graphs(
    draw, max_nodes: int = 10, ops: list[str] | None = None, input_dtypes=None, specials: bool = True, min_dim: int = 1
) -> Graph:
    token = SPECIALS.set(specials)
    dims_token = MIN_DIM.set(min_dim)
    try:
        b = GraphBuilder("random")
        pool: list[Value] = []
        for i in range(draw(st.integers(1, 3))):
            dtype = draw(st.sampled_from(input_dtypes or DTYPES))
            pool.append(b.input(TensorType(draw(shapes()), dtype), f"x{i}"))
        names = sorted(ops or SAMPLERS)
        for _ in range(draw(st.integers(1, max_nodes))):
            name = draw(st.sampled_from(names))
            pool.extend(SAMPLERS[name](draw, b, pool, name))
        outputs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
        return b.build(outputs)
    finally:
        MIN_DIM.reset(dims_token)
        SPECIALS.reset(token)


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        t = v.type
        if t.dtype.kind == "b":
            out.append(np.asarray(rng.random(t.shape) < 0.5))
        elif t.dtype.kind in "iu":
            out.append(np.asarray(rng.integers(-5, 6, size=t.shape), dtype=t.dtype))
        else:
            out.append(np.asarray(rng.standard_normal(t.shape), dtype=t.dtype))
    return out


@_sampler("scatter_add")
def _scatter_add(draw, b, pool):
    x = pick(draw, b, pool, nonempty(kind_is("iuf")), f32, min_rank=1)
    axis = draw(st.integers(0, x.ndim - 1))
    idx_shape = draw(shapes(max_rank=2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = x.shape[axis]
    idx = b.op("constant", value=np.asarray(rng.integers(-n, n, size=idx_shape), dtype=np.int64))
    updates = constant(draw, b, x.shape[:axis] + idx_shape + x.shape[axis + 1 :], x.dtype)
    return [b.op("scatter_add", x, idx, updates, axis=axis)]


def _region(in_types, body):
    """A region whose nodes ``body(builder, args)`` emits; returns its outputs."""
    from graphc.core.ir import Region

    rb = GraphBuilder("region")
    args = [rb.input(t) for t in in_types]
    outs = body(rb, args)
    return Region(rb.inputs, rb.nodes, list(outs))


def _scalar(b, value, dtype):
    return b.op("constant", value=np.asarray(value, dtype=dtype))


@_sampler("cond")
def _cond(draw, b, pool):
    x = pick(draw, b, pool, kind_is("f"), f32)
    pred = constant(draw, b, (), bool)
    t = x.type
    true_r = _region([t], lambda rb, a: [rb.op("neg", a[0])])
    false_r = _region([t], lambda rb, a: [rb.op("mul", a[0], _scalar(rb, 2.0, t.dtype))])
    return _emit_with_regions(b, "cond", [pred, x], {}, (true_r, false_r))


@_sampler("while_loop")
def _while(draw, b, pool):
    x = pick(draw, b, pool, kind_is("f"), f32)
    limit = draw(st.integers(0, 3))
    i0 = _scalar(b, 0, np.int64)
    ts = [i0.type, x.type]
    cond_r = _region(ts, lambda rb, a: [rb.op("compare", a[0], _scalar(rb, limit, np.int64), direction="lt")])
    body_r = _region(
        ts, lambda rb, a: [rb.op("add", a[0], _scalar(rb, 1, np.int64)), rb.op("mul", a[1], _scalar(rb, 0.5, x.dtype))]
    )
    return _emit_with_regions(b, "while_loop", [i0, x], {}, (cond_r, body_r))


@_sampler("fori_loop")
def _fori(draw, b, pool):
    x = pick(draw, b, pool, kind_is("f"), f32)
    lo, hi = _scalar(b, 0, np.int64), _scalar(b, draw(st.integers(0, 3)), np.int64)
    body_r = _region([lo.type, x.type], lambda rb, a: [rb.op("add", a[1], rb.op("convert", a[0], dtype=x.dtype))])
    return _emit_with_regions(b, "fori_loop", [lo, hi, x], {"step": 1}, (body_r,))


def _emit_with_regions(b, opname, inputs, attrs, regions):
    from graphc.core.ir import Node
    from graphc.ops import get_op

    op = get_op(opname)
    node = Node(op, inputs, attrs, op.infer_types(tuple(v.type for v in inputs), attrs, regions), None, None, regions)
    b.nodes.append(node)
    return list(node.outputs)


@_sampler("fused")
def _fused(draw, b, pool):
    x = pick(draw, b, pool, kind_is("f"), f32)
    y = constant(draw, b, broadcast_partner(draw, x.shape), x.dtype)
    t = x.type

    def body(rb, a):
        s = rb.op("add", rb.op("mul", a[0], a[1]), a[0])
        return [s, rb.op("tanh", s)]

    region = _region([t, y.type], body)
    return _emit_with_regions(b, "fused", [x, y], {}, (region,))


@_sampler("philox")
def _philox(draw, b, pool):
    """Random words (or numpy's doubles) of a key and a word position near a block boundary or
    a 64-bit carry, optionally one device's piece (``runs``) of the array."""
    key = np.array([draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1))], dtype=np.uint64)
    low = draw(st.sampled_from([0, 3, 2**64 - 2]))
    counter = np.array([low, draw(st.sampled_from([0, 1])), 0, 0], dtype=np.uint64)
    shape = tuple(draw(shapes(max_rank=3)))
    runs = None
    if shape and draw(st.booleans()):  # a piece: a prefix and a suffix run per dim
        runs = tuple(((0, n // 2), (n - n // 3, n)) if n > 1 else ((0, n),) for n in shape)
    attrs = dict(
        shape=shape, offset=draw(st.integers(0, 5)), dist=draw(st.sampled_from(["bits", "uniform"])), runs=runs
    )
    return [b.op("philox", b.op("constant", value=key), b.op("constant", value=counter), **attrs)]


def _operand(draw, b, pool, shape, dtype) -> Value:
    """A pool value of exactly this shape and dtype, or a new constant."""
    candidates = [v for v in pool if v.type.shape == tuple(shape) and v.type.dtype == dtype]
    if candidates and draw(st.booleans()):
        return draw(st.sampled_from(candidates))
    return constant(draw, b, tuple(shape), dtype)


def _block(draw, b, x):
    """Dims, sizes and start operands of a block of ``x`` (starts may be out of range: clamped)."""
    dims = sorted(draw(st.sets(st.integers(0, x.ndim - 1), min_size=1)))
    sizes = tuple(draw(st.integers(0, x.shape[d])) for d in dims)
    dtype = draw(st.sampled_from([np.int64, np.int32]))
    starts = [b.op("constant", value=np.asarray(draw(st.integers(-2, x.shape[d] + 1)), dtype=dtype)) for d in dims]
    return tuple(dims), sizes, starts


@_sampler("dynamic_slice")
def _dynamic_slice(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True, min_rank=1)
    dims, sizes, starts = _block(draw, b, x)
    return [b.op("dynamic_slice", x, *starts, dims=dims, sizes=sizes)]


@_sampler("dynamic_update_slice")
def _dynamic_update_slice(draw, b, pool):
    x = pick(draw, b, pool, lambda v: True, min_rank=1)
    dims, sizes, starts = _block(draw, b, x)
    shape = list(x.shape)
    for d, size in zip(dims, sizes):
        shape[d] = size
    update = _operand(draw, b, pool, shape, x.dtype)
    return [b.op("dynamic_update_slice", x, update, *starts, dims=dims)]


@_sampler("scatter")
def _scatter(draw, b, pool):
    x = pick(draw, b, pool, nonempty(lambda v: True), min_rank=1)
    k = draw(st.integers(1, x.ndim))
    axis = draw(st.integers(0, x.ndim - k))
    idx_shape = draw(shapes(max_rank=2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    indices = []
    for d in range(k):
        n = x.shape[axis + d]
        indices.append(b.op("constant", value=np.asarray(rng.integers(-n, n, size=idx_shape), dtype=np.int64)))
    updates = _operand(draw, b, pool, x.shape[:axis] + idx_shape + x.shape[axis + k :], x.dtype)
    return [b.op("scatter", x, *indices, updates, axis=axis)]
