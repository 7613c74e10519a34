"""Algebraic simplification: a table of local rewrite rules run to a fixpoint by one driver.

Each rule looks at one node (with its operands already simplified) and returns the values that
replace its results, or None. Every rule keeps the result's shape and dtype. All keep values bit
for bit except x**3 -> x*x*x, which can differ in the last bit (x**2 -> x*x is exact: numpy
computes squares that way too). Regrouping products of constants is not done: (x*c1)*c2 and
x*(c1*c2) can differ by overflow or underflow, not only in the last bit.

``add_of_pads`` turns a sum of zero-padded slices into one concatenate, which keeps values but
not the sign of a zero. (Rules that reassociate sums, for speed on one device, are in
passes/batching.py: the planner does not see them.)

Assumes: a verified graph. Guarantees: the output verifies and computes the same results.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from graphc.core.ir import Graph, Node, Value
from graphc.ops import OPS
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions, scalar_constant

Rule = Callable[[Rewriter, Node, list[Value]], list[Value] | None]
RULES: dict[str, list[Rule]] = {}


def rule(*opnames: str, table: dict[str, list[Rule]] = RULES):
    def register(fn: Rule) -> Rule:
        for name in opnames:
            table.setdefault(name, []).append(fn)
        return fn

    return register


def _same_type(node: Node, v: Value) -> bool:
    return v.type == node.outputs[0].type


def _is(v: Value, value: float) -> bool:
    c = scalar_constant(v)
    return c is not None and not isinstance(c, bool) and c == value and not (value == 0 and np.signbit(c))


@rule("mul")
def mul_by_one(rw, node, ops):  # x * 1 -> x, 1 * x -> x
    x, y = ops
    for a, b in ((x, y), (y, x)):
        if _is(b, 1) and _same_type(node, a):
            return [a]
    return None


@rule("add")
def add_zero(rw, node, ops):  # x + 0 -> x, 0 + x -> x  (a +0.0 is not an identity for -0.0: only exact 0 ints or -0.0)
    x, y = ops
    for a, b in ((x, y), (y, x)):
        c = scalar_constant(b)
        if c is not None and c == 0 and (a.dtype.kind in "iu" or np.signbit(c)) and _same_type(node, a):
            return [a]
    return None


@rule("sub")
def sub_zero(rw, node, ops):  # x - 0 -> x
    x, y = ops
    c = scalar_constant(y)
    if c is not None and c == 0 and not np.signbit(c) and _same_type(node, x):
        return [x]
    return None


@rule("div")
def div_one(rw, node, ops):  # x / 1 -> x
    x, y = ops
    return [x] if _is(y, 1) and _same_type(node, x) else None


@rule("pow")
def small_integer_power(rw, node, ops):  # x**1 -> x, x**2 -> x*x, x**3 -> x*x*x (numpy's x**3 is ~10x slower)
    x, y = ops
    if not _same_type(node, x) or x.dtype.kind != "f":
        return None
    if _is(y, 1):
        return [x]
    if _is(y, 2):
        return list(rw.emit("mul", [x, x], {}, node).outputs)
    if _is(y, 3) and x.dtype.itemsize > 2:  # float16: x*x would be rounded before the last product
        sq = rw.emit("mul", [x, x], {}, node).outputs[0]
        return list(rw.emit("mul", [sq, x], {}, node).outputs)
    return None


@rule("neg")
def double_negation(rw, node, ops):  # -(-x) -> x
    (x,) = ops
    return [x.producer.inputs[0]] if x.producer is not None and x.producer.op is OPS.neg else None


@rule("transpose")
def transpose_chain(rw, node, ops):  # transpose(transpose(x, p), q) -> transpose(x, p[q]); identity -> x
    (x,) = ops
    perm = node.attrs["perm"]
    if list(perm) == list(range(len(perm))):
        return [x]
    if x.producer is not None and x.producer.op is OPS.transpose:
        inner = x.producer.attrs["perm"]
        combined = tuple(inner[p] for p in perm)
        src = x.producer.inputs[0]
        if list(combined) == list(range(len(combined))):
            return [src]
        return list(rw.emit("transpose", [src], {"perm": combined}, node).outputs)
    return None


@rule("reshape")
def reshape_chain(rw, node, ops):  # reshape(reshape(x)) -> reshape(x); reshape to x's shape -> x
    (x,) = ops
    if x.shape == node.attrs["shape"]:
        return [x]
    if x.producer is not None and x.producer.op is OPS.reshape:
        src = x.producer.inputs[0]
        if src.shape == node.attrs["shape"]:
            return [src]
        return list(rw.emit("reshape", [src], {"shape": node.attrs["shape"]}, node).outputs)
    return None


@rule("broadcast_to")
def broadcast_noop(rw, node, ops):  # broadcast_to(x, x.shape) -> x
    (x,) = ops
    return [x] if x.shape == node.attrs["shape"] else None


@rule("convert")
def convert_noop(rw, node, ops):  # x.astype(x.dtype) -> x
    (x,) = ops
    return [x] if x.dtype == node.attrs["dtype"] else None


@rule("slice")
def slice_noop(rw, node, ops):  # x[:] -> x
    (x,) = ops
    a = node.attrs
    full = a["starts"] == (0,) * x.ndim and a["stops"] == x.shape and a["steps"] == (1,) * x.ndim
    return [x] if full else None


@rule("where")
def where_same(rw, node, ops):  # where(c, x, x) -> x
    _, x, y = ops
    return [x] if x is y and _same_type(node, x) else None


ELEMENTWISE_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "compare", "logical_and", "logical_or")


@rule(*ELEMENTWISE_BINARY)
def implicit_broadcast(rw, node, ops):  # f(x, broadcast_to(y)) -> f(x, y): elementwise ops broadcast by themselves
    broadcast = OPS.broadcast_to
    for v in ops:  # (nearly every node has none: asked once per operand, no copies)
        if v.producer is not None and v.producer.op is broadcast:
            break
    else:
        return None
    changed = list(ops)
    for i, v in enumerate(ops):
        if v.producer is not None and v.producer.op is OPS.broadcast_to:
            src = v.producer.inputs[0]
            others = [o.shape for j, o in enumerate(changed) if j != i]
            if tuple(np.broadcast_shapes(src.shape, *others)) == node.outputs[0].shape:
                changed[i] = src
    if all(a is b for a, b in zip(changed, ops)):
        return None
    return list(rw.emit(node.op.name, changed, dict(node.attrs), node).outputs)


# --- sums of zero-padded pieces: the backward of slices ------------------------------------
# The gradient of x[..., a:b] is its cotangent zero-padded back to x's shape, and the gradients of
# several slices of one value (the gates of an LSTM, q/k/v of a fused projection) add up to a sum
# of pads. Where the pieces lie along one dim without overlapping, the sum is one concatenate of
# the pieces (with zeros in any gap) padded once: no full-size temporaries, no additions. Only
# the sign of a zero can differ (x + 0.0 makes -0.0 into +0.0; the concatenate keeps it).


def _segments(v: Value) -> tuple[int, list[tuple[int, int, Value | None]], tuple] | None:
    """(dim, [(start, stop, piece or None for zeros)], widths of the other dims) of a zero pad that
    is non-trivial along exactly one dim, or None. A pad of a concatenate counts its parts."""
    node = v.producer
    if node is None or node.op is not OPS.pad or node.attrs["value"] != 0:
        return None
    widths = node.attrs["widths"]
    dims = [d for d, w in enumerate(widths) if w != (0, 0)]
    if len(dims) != 1:
        return None
    d = dims[0]
    x = node.inputs[0]
    start = widths[d][0]
    parts = [x]
    if x.producer is not None and x.producer.op is OPS.concatenate and x.producer.attrs["axis"] == d:
        parts = list(x.producer.inputs)
    segs: list[tuple[int, int, Value | None]] = []
    for p in parts:
        n = p.shape[d]
        segs.append((start, start + n, None if _is_zeros(p) else p))
        start += n
    return d, segs, tuple(w for k, w in enumerate(widths) if k != d)


def _is_zeros(v: Value) -> bool:
    node = v.producer
    return node is not None and node.op is OPS.broadcast_to and _is(node.inputs[0], 0)


@rule("add")
def add_of_pads(rw, node, ops):  # pad(a) + pad(b), pieces side by side -> pad(concatenate([a, b]))
    x, y = ops
    px, py = x.producer, y.producer
    if px is None or py is None or px.op is not OPS.pad or py.op is not OPS.pad:
        return None  # (what _segments asks first, before the types: nearly every sum adds no pads)
    out = node.outputs[0].type
    if x.type != out or y.type != out:
        return None
    sx, sy = _segments(x), _segments(y)
    if sx is None or sy is None or sx[0] != sy[0] or sx[2] != sy[2]:
        return None
    d = sx[0]
    pieces = sorted((s for s in sx[1] + sy[1] if s[2] is not None), key=lambda s: s[0])
    if any(a[1] > b[0] for a, b in zip(pieces, pieces[1:])):
        return None  # overlapping pieces really add
    lo, hi = pieces[0][0], pieces[-1][1]
    parts: list[Value] = []
    at = lo
    for start, stop, piece in pieces:
        if start > at:  # a gap between pieces: zeros
            shape = list(out.shape)
            shape[d] = start - at
            zero = rw.constant(np.zeros((), out.dtype), node)
            parts.append(rw.emit("broadcast_to", [zero], {"shape": tuple(shape)}, node).outputs[0])
        assert piece is not None
        parts.append(piece)
        at = stop
    joined = parts[0] if len(parts) == 1 else rw.emit("concatenate", parts, {"axis": d}, node).outputs[0]
    widths = list(x.producer.attrs["widths"])
    widths[d] = (lo, out.shape[d] - hi)
    return list(rw.emit("pad", [joined], {"widths": tuple(widths), "value": 0}, node).outputs)


@rule("pad")
def pad_noop(rw, node, ops):  # pad by nothing -> x
    return [ops[0]] if all(w == (0, 0) for w in node.attrs["widths"]) and _same_type(node, ops[0]) else None


def rewrite_with(table: dict[str, list[Rule]]) -> Callable[[Graph], Graph]:
    """The pass that applies the rules of ``table`` until none applies (this module's ``simplify``
    is ``rewrite_with(RULES)``; passes/batching.py has another table)."""

    def block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
        rw = Rewriter()
        for node in nodes:
            one(rw, node)
        return finish(rw, nodes, outputs)

    def one(rw: Rewriter, node: Node) -> None:
        inputs = node.inputs
        ops = list(map(rw.subst.get, inputs, inputs))  # (rw.operands, inline: asked of every node)
        for rule_fn in table.get(node.op.name, ()):
            start = len(rw.nodes)
            replacement = rule_fn(rw, node, ops)
            if replacement is None:
                if len(rw.nodes) != start:
                    del rw.nodes[start:]  # a rule that declined leaves no nodes behind
                continue
            # the nodes the rule emitted may simplify further: run the driver on them (fixpoint)
            emitted = rw.nodes[start:]
            del rw.nodes[start:]
            for new in emitted:
                one(rw, new)
            rw.replace(node, [rw.get(v) for v in replacement])
            return
        # (a rule that declined substituted nothing)
        rw.keep(node, map_regions(node, block) if node.regions else None, ops)

    return lambda graph: apply_to_graph(graph, block)


_simplify = rewrite_with(RULES)


def simplify(graph: Graph) -> Graph:
    """Apply the algebraic rewrite rules until none applies."""
    return _simplify(graph)
