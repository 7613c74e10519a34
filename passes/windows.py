"""Batching of loops over windows: one op per kind for what a Python loop did per window.

A CNN written with loops over image patches (tests/models/real_models/numpy_cnn.py)

    for y ...: for x ...:
        out[f, y, x] = np.sum(filt[f] * image[:, y:y + 3, x:x + 3]) + bias[f]

traces to a chain of ``dynamic_update_slice`` writes at constant starts, each writing an update
computed by the same small expression from a window (a ``slice`` at other starts of the same
array) and values shared by every write. ``batch_windows`` finds such a chain (at least
``MIN_WRITES`` writes, each intermediate read only by the next write), checks that every update
is the same expression up to its windows' starts, and computes it once for all of them:

    windows   one gather of all windows from the flattened array: [k, *window]
    ops       the expression with a leading dim of k (elementwise ops broadcast the shared
              values from the right; reductions and reshapes shift their axes and shapes)
    writes    one scatter of the k updates at their flat positions (the last write of a
              repeated position wins, as the chain's order did)

Supported in the expression: elementwise ops (``where`` and ``convert`` included), reduce_sum /
max / min and reshape. An update that reads the buffer being written (or anything computed from
it) is not batched. The sums are the same terms in another order: not bit for bit.

Assumes: a verified graph. Guarantees: the output verifies and computes the same values (to
rounding).
"""

from __future__ import annotations

import numpy as np

from graphc.core.ir import Graph, Node, Value
from graphc.core.traits import Constant, Elementwise, Reduction
from graphc.ops import OPS
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish, map_regions

MIN_WRITES = 8  # fewer writes: the gather and scatter cost more than the ops they replace
MAX_WINDOW_ELEMENTS = 1 << 22  # the stacked windows of one leaf, at most (memory a loop did not hold)


def _batchable(node: Node) -> bool:
    if node.regions or len(node.outputs) != 1:
        return False
    if node.op.has(Elementwise) or node.op in (OPS.where, OPS.convert, OPS.reshape):
        return True
    r = node.op.trait(Reduction)
    return r is not None and r.combine in ("add", "max", "min")


def _is_window(v: Value) -> bool:
    node = v.producer
    return node is not None and node.op is OPS.slice and all(st == 1 for st in node.attrs["steps"])


def _template(v: Value, windows: list[Value], shared: list[Value]):
    """A hashable description of the expression computing ``v`` up to its windows' starts,
    appending its windows (unit-step slices) and shared values (anything else it reads) in
    order; None if it is not batchable (a strided slice)."""
    node = v.producer
    if node is not None and node.op is OPS.slice:
        if not _is_window(v):
            return None
        windows.append(v)
        return ("window", id(node.inputs[0]), v.type.shape)
    if node is None or node.op.has(Constant) or not _batchable(node):
        shared.append(v)
        return ("shared", id(v))
    parts = []
    for x in node.inputs:
        t = _template(x, windows, shared)
        if t is None:
            return None
        parts.append(t)
    attrs = tuple(sorted((k, repr(val)) for k, val in node.attrs.items()))
    return (node.op.name, attrs, v.type.shape, v.type.dtype.str, tuple(parts))


def _chains(nodes: list[Node], outputs: list[Value]) -> list[list[Node]]:
    """Chains of dynamic_update_slice at constant starts, each intermediate used only by the next."""
    uses: dict[Value, int] = {}
    for n in nodes:
        for x in n.inputs:
            uses[x] = uses.get(x, 0) + 1
    for o in outputs:
        uses[o] = uses.get(o, 0) + 1
    next_of: dict[Value, Node] = {}
    for n in nodes:
        if n.op is OPS.dynamic_update_slice and all(_const(s) is not None for s in n.inputs[2:]):
            next_of[n.inputs[0]] = n
    chains: list[list[Node]] = []
    seen: set[int] = set()
    members = {id(m) for m in next_of.values()}
    for n in nodes:
        if id(n) not in members or id(n) in seen:
            continue
        prev = n.inputs[0].producer
        if prev is not None and id(prev) in members and uses.get(n.inputs[0], 0) == 1:
            continue  # not the head
        chain = [n]
        while uses.get(chain[-1].outputs[0], 0) == 1 and chain[-1].outputs[0] in next_of:
            chain.append(next_of[chain[-1].outputs[0]])
        seen.update(id(m) for m in chain)
        if len(chain) >= MIN_WRITES:
            chains.append(chain)
    return chains


def _const(v: Value) -> int | None:
    p = v.producer
    if p is None or not p.op.has(Constant) or v.type.shape:
        return None
    return int(p.attrs["value"])


def _downstream(nodes: list[Node], start: set[Value]) -> set[Value]:
    tainted = set(start)
    for n in nodes:
        if any(x in tainted for x in n.inputs):
            tainted.update(n.outputs)
    return tainted


def _plan(chain: list[Node], nodes: list[Node]) -> list[list[Value]] | None:
    """Per write of ``chain``, its windows, if every update is one expression (up to the windows'
    starts) that reads neither the buffer being written nor anything computed from it."""
    written = _downstream(nodes, {n.outputs[0] for n in chain} | {chain[0].inputs[0]})
    dims, block = chain[0].attrs["dims"], chain[0].inputs[1].type.shape
    first = None
    windows_of = []
    for n in chain:
        if n.attrs["dims"] != dims or n.inputs[1].type.shape != block:
            return None
        windows: list[Value] = []
        shared: list[Value] = []
        t = _template(n.inputs[1], windows, shared)
        if t is None or (first is not None and t != first):
            return None
        first = t
        arrays = [w.producer.inputs[0] for w in windows]  # type: ignore[union-attr]
        if any(x in written for x in shared + arrays):
            return None
        windows_of.append(windows)
    for j in range(len(windows_of[0])):
        if windows_of[0][j].type.size * len(chain) > MAX_WINDOW_ELEMENTS:
            return None
    return windows_of


def _flat_positions(shape: tuple[int, ...], starts: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
    """The flat (C-order) positions of the block of ``sizes`` at ``starts`` in an array of ``shape``."""
    grids = np.meshgrid(*[np.arange(s, s + n) for s, n in zip(starts, sizes)], indexing="ij")
    return np.ravel_multi_index(tuple(grids), shape).astype(np.int64) if shape else np.zeros((), np.int64)


def _emit_batched(rw: Rewriter, v: Value, k: int, windows: dict, like: Node) -> tuple[Value, int]:
    """(the value of ``v`` for all k writes, its rank without the batch dim): batched values have
    a leading dim k; shared ones are as they are (rank -1 marks them)."""
    node = v.producer
    if v in windows:
        return windows[v], v.ndim
    if node is None or node.op.has(Constant) or not _batchable(node):
        return rw.get(v), -1
    ins = [_emit_batched(rw, x, k, windows, like) for x in node.inputs]
    if all(r < 0 for _, r in ins):
        return rw.get(v), -1
    out_rank = v.ndim
    operands = []
    for (x, r), orig in zip(ins, node.inputs):
        if r >= 0 and node.op is not OPS.reshape and r < out_rank and not node.op.has(Reduction):
            x = rw.emit("reshape", [x], {"shape": (k,) + (1,) * (out_rank - r) + orig.type.shape}, like).outputs[0]
        operands.append(x)
    attrs = dict(node.attrs)
    if node.op is OPS.reshape:
        attrs["shape"] = (k, *v.type.shape)
    elif node.op.has(Reduction):
        attrs["axes"] = tuple(a + 1 for a in attrs["axes"])
    return rw.emit(node.op.name, operands, attrs, like).outputs[0], out_rank


def _batch_block(inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> tuple[list[Node], list[Value]]:
    chosen = {}
    for chain in _chains(nodes, outputs):
        windows_of = _plan(chain, nodes)
        if windows_of is not None:
            chosen[id(chain[-1])] = (chain, windows_of)
    if not chosen and not any(n.regions for n in nodes):
        return nodes, outputs
    dropped = {id(n) for chain, _ in chosen.values() for n in chain[:-1]}
    rw = Rewriter()
    for n in nodes:
        if id(n) in dropped:
            continue
        if id(n) not in chosen:
            rw.keep(n, map_regions(n, _batch_block))
            continue
        chain, windows_of = chosen[id(n)]
        rw.replace(n, [_write_all(rw, chain, windows_of, n)])
    return finish(rw, nodes, outputs)


def _write_all(rw: Rewriter, chain: list[Node], windows_of: list[list[Value]], like: Node) -> Value:
    """The buffer after all of ``chain``'s writes: gathered windows, the batched expression, one scatter."""
    k = len(chain)
    stacked: dict[Value, Value] = {}
    for j, w in enumerate(windows_of[0]):
        arr = w.producer.inputs[0]  # type: ignore[union-attr]
        idx = np.stack(
            [_flat_positions(arr.type.shape, ws[j].producer.attrs["starts"], w.type.shape) for ws in windows_of]  # type: ignore[union-attr]
        )
        flat = rw.emit("reshape", [rw.get(arr)], {"shape": (arr.type.size,)}, like).outputs[0]
        stacked[w] = rw.emit("gather", [flat, rw.constant(idx, like)], {"axis": 0}, like).outputs[0]
    updates, _rank = _emit_batched(rw, chain[0].inputs[1], k, stacked, like)
    base, dims, block = chain[0].inputs[0], chain[0].attrs["dims"], chain[0].inputs[1].type.shape
    positions = []
    for n in chain:
        starts = [0] * base.ndim
        for d, s in zip(dims, n.inputs[2:]):
            starts[d] = min(max(_const(s) or 0, 0), base.type.shape[d] - block[d])  # clamped, as the op does
        positions.append(_flat_positions(base.type.shape, tuple(starts), block))
    flat = rw.emit("reshape", [rw.get(base)], {"shape": (base.type.size,)}, like).outputs[0]
    written = rw.emit("scatter", [flat, rw.constant(np.stack(positions), like), updates], {"axis": 0}, like)
    return rw.emit("reshape", [written.outputs[0]], {"shape": base.type.shape}, like).outputs[0]


def batch_windows(graph: Graph) -> Graph:
    """One gather, one op per kind and one scatter for a loop's writes of per-window expressions."""
    return apply_to_graph(graph, _batch_block)
