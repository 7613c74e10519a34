"""Batching of independent matmuls that share a weight: the input projection of an unrolled RNN.

    for t in range(T):
        h = np.tanh(xs[t] @ wx + h @ wh + b)      # T matmuls [B, I] @ [I, H]

computes ``xs[t] @ wx`` for every step independently of the loop's state, so one
``xs.reshape(T * B, I) @ wx`` placed where the first of them was gives all of them (cuDNN does
the same for its RNNs): one BLAS call instead of T small ones, each original product a row
block of the big one. The rows are the same dot products, but BLAS does not promise the same
bits for a row computed in a different blocking: not bit for bit.

The backward pass's sums are the mirror image: ``batch_products`` rewrites

    sum_t xs[t].T @ dz_t            -> [xs[0]; ...; xs[T-1]].T @ [dz_0; ...; dz_T-1]   (add_of_products)
    sum_t dz_t.sum(0)               -> [dz_0; ...].sum(0)                               (add_of_row_sums)
    sum_b x_b.T @ g_b (batched)     -> x.reshape(-1, d).T @ g.reshape(-1, n)            (flat_weight_gradient)

the last one being the weight gradient of ``x @ w`` for a batched x, which numpy-style autodiff
computes as a batched matmul and a sum over the batch. These run on graphs that one device runs
(``graphc.jit``, each device's program after partitioning), not before planning: a reshape that
merges a dp-split batch with a tp-split sequence is no longer a block split.

Assumes: a verified graph. Guarantees: the output verifies and computes the same values (to
rounding). The sums are left alone on bfloat16 and float16, whose every product and sum is
rounded where the graph makes it (graphc/ops/precision.py): one product would round once.
"""

from __future__ import annotations

import numpy as np

from graphc.core.dtypes import is_low_float
from graphc.core.ir import Graph, Node, Value
from graphc.ops import OPS
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions
from graphc.passes.simplify import RULES as SIMPLIFY_RULES
from graphc.passes.simplify import Rule, rewrite_with, rule

RULES: dict[str, list[Rule]] = {}


def _step_of(v: Value) -> tuple[Value, int] | None:
    """(X, t) when ``v`` is ``X[t]`` of a 3-d X: ``reshape(slice(X, t:t+1 on dim 0), X.shape[1:])``."""
    r = v.producer
    if r is None or r.op is not OPS.reshape:
        return None
    s = r.inputs[0].producer
    if s is None or s.op is not OPS.slice:
        return None
    x = s.inputs[0]
    if x.ndim != 3 or v.shape != x.shape[1:]:
        return None
    a = s.attrs
    t = a["starts"][0]
    if a["steps"] != (1, 1, 1) or a["stops"] != (t + 1, *x.shape[1:]) or a["starts"][1:] != (0, 0):
        return None
    return x, t


def _batch_block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    groups: dict[tuple[Value, Value], list[tuple[int, Node, int]]] = {}
    for i, n in enumerate(nodes):
        if n.op is OPS.matmul and n.inputs[1].ndim == 2:
            step = _step_of(n.inputs[0])
            if step is not None:
                groups.setdefault((step[0], n.inputs[1]), []).append((i, n, step[1]))
    # worth it when the members cover at least half of X's steps (the big product computes all)
    chosen = {
        key: members
        for key, members in groups.items()
        if len(members) >= 2 and 2 * len({t for _, _, t in members}) >= key[0].shape[0]
    }
    if not chosen and not any(n.regions for n in nodes):
        return nodes, outputs
    first = {members[0][0]: key for key, members in chosen.items()}
    member = {id(n): (key, t) for key, members in chosen.items() for _, n, t in members}
    rw = Rewriter()
    batched: dict[tuple[Value, Value], Value] = {}
    for i, n in enumerate(nodes):
        if i in first:
            x, w = first[i]
            steps, rows, width = x.shape
            flat = rw.emit("reshape", [rw.get(x)], {"shape": (steps * rows, width)}, n).outputs[0]
            y = rw.emit("matmul", [flat, rw.get(w)], {}, n).outputs[0]
            batched[(x, w)] = rw.emit("reshape", [y], {"shape": (steps, rows, w.shape[1])}, n).outputs[0]
        if id(n) in member:
            key, t = member[id(n)]
            y = batched[key]
            _, rows, out = y.shape
            block = rw.emit("slice", [y], {"starts": (t, 0, 0), "stops": (t + 1, rows, out), "steps": (1, 1, 1)}, n)
            rw.replace(n, list(rw.emit("reshape", [block.outputs[0]], {"shape": (rows, out)}, n).outputs))
        else:
            rw.keep(n, map_regions(n, _batch_block))
    return finish(rw, nodes, outputs)


def batch_projections(graph: Graph) -> Graph:
    """One matmul for the matmuls ``X[t] @ W`` of most steps t of a 3-d X and a shared W."""
    return apply_to_graph(graph, _batch_block)


# --- sums of products over steps and batches --------------------------------------------------


@rule("reduce_sum", table=RULES)
def flat_weight_gradient(rw, node, ops):  # sum_b L_b^T @ R_b -> L^T @ R on the batch flattened into rows
    # The VJP of x @ w with x [B, T, d] gives w's gradient as B batched [d, T] @ [T, n] products
    # summed over B: one [d, B*T] @ [B*T, n] product computes it in one BLAS call without the
    # [B, d, n] temporary. The sum's order changes (as BLAS's own blocking may): not bit for bit.
    (p,) = ops
    m = p.producer
    nb = p.ndim - 2
    if (
        m is None
        or is_low_float(p.dtype)  # bfloat16/float16 round each product: one sum would move that point
        or m.op is not OPS.matmul
        or node.attrs["keepdims"]
        or nb < 1
        or node.attrs["axes"] != tuple(range(nb))
    ):
        return None
    a, b = m.inputs
    t = a.producer
    if a.ndim != p.ndim or b.ndim != p.ndim or t is None or t.op is not OPS.transpose:
        return None
    if t.attrs["perm"] != tuple(range(nb)) + (nb + 1, nb):
        return None
    x = t.inputs[0]  # [*batch, T, d]
    if x.shape[: nb + 1] != b.shape[: nb + 1]:
        return None  # broadcast batch dims: not one product
    rows = int(np.prod(x.shape[: nb + 1], dtype=np.int64))
    xf = rw.emit("reshape", [x], {"shape": (rows, x.shape[-1])}, node).outputs[0]
    bf = rw.emit("reshape", [b], {"shape": (rows, b.shape[-1])}, node).outputs[0]
    xt = rw.emit("transpose", [xf], {"perm": (1, 0)}, node).outputs[0]
    return list(rw.emit("matmul", [xt, bf], {}, node).outputs)


# Bytes up to which add_of_products and add_of_row_sums stack their operands: the stacked rows
# stay alive until the sum is taken, which is memory a chain of small products did not hold.
STACK_BYTES = 1 << 20


def _rows_of(v: Value) -> list[Value]:
    """The parts of a row-wise (axis 0) concatenate, or [v]."""
    node = v.producer
    if node is not None and node.op is OPS.concatenate and node.attrs["axis"] == 0:
        return list(node.inputs)
    return [v]


def _stack(rw, parts: list[Value], like: Node) -> Value | None:
    if sum(p.type.nbytes for p in parts) > STACK_BYTES:
        return None
    return rw.emit("concatenate", parts, {"axis": 0}, like).outputs[0]


def _product_of_transposed(v: Value) -> tuple[Value, Value] | None:
    """(A, B) when ``v`` is ``A.T @ B`` of 2-d A and B."""
    m = v.producer
    if m is None or m.op is not OPS.matmul or v.ndim != 2:
        return None
    t = m.inputs[0].producer
    if t is None or t.op is not OPS.transpose or t.attrs["perm"] != (1, 0):
        return None
    return t.inputs[0], m.inputs[1]


@rule("add", table=RULES)
def add_of_products(rw, node, ops):  # A.T @ B + C.T @ D -> [A; C].T @ [B; D]
    # The gradient of a weight used at every step of an unrolled loop, sum_t x_t.T @ g_t: one
    # product of the stacked rows instead of a product and an addition per step. Small operands
    # only (STACK_BYTES). The sum's order changes: not bit for bit.
    x, y = ops
    if is_low_float(x.dtype):  # bfloat16/float16 round each product before the sum (ops/precision.py)
        return None
    px, py = _product_of_transposed(x), _product_of_transposed(y)
    if px is None or py is None or x.type != node.outputs[0].type or y.type != node.outputs[0].type:
        return None
    (a, b), (c, d) = px, py
    if a.dtype != c.dtype or b.dtype != d.dtype:
        return None
    left = _stack(rw, _rows_of(a) + _rows_of(c), node)
    right = _stack(rw, _rows_of(b) + _rows_of(d), node) if left is not None else None
    if left is None or right is None:
        return None
    lt = rw.emit("transpose", [left], {"perm": (1, 0)}, node).outputs[0]
    return list(rw.emit("matmul", [lt, right], {}, node).outputs)


@rule("add", table=RULES)
def add_of_row_sums(rw, node, ops):  # A.sum(0) + B.sum(0) -> [A; B].sum(0)
    x, y = ops
    nx, ny = x.producer, y.producer
    if nx is None or ny is None or nx.op is not OPS.reduce_sum or ny.op is not OPS.reduce_sum:
        return None
    if is_low_float(x.dtype):  # bfloat16/float16 round each sum before the addition (ops/precision.py)
        return None
    if nx.attrs != {"axes": (0,), "keepdims": False} or ny.attrs != nx.attrs:
        return None
    a, b = nx.inputs[0], ny.inputs[0]
    if a.ndim != 2 or a.dtype != b.dtype or x.type != node.outputs[0].type or y.type != node.outputs[0].type:
        return None
    stacked = _stack(rw, _rows_of(a) + _rows_of(b), node)
    if stacked is None:
        return None
    return list(rw.emit("reduce_sum", [stacked], {"axes": (0,), "keepdims": False}, node).outputs)


# with simplify's rules, so what these emit (a reshape of a reshape) is simplified in the same pass
batch_products = rewrite_with({op: SIMPLIFY_RULES.get(op, []) + RULES.get(op, []) for op in {*SIMPLIFY_RULES, *RULES}})
batch_products.__doc__ = "Sums of products over the steps of a loop or a batch as one product (see the module doc)."
