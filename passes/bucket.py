"""Gradient bucketing: the all-reduces a training step defers to its update become one collective
per bucket, as PyTorch DDP does.

Stage: lowered (a device program). An ``all_reduce`` is *deferred* when the update consumes it
(part "update"), or, in a graph without parts, when only the graph's outputs do (the loss). In
program order, deferred all-reduces over the same axis, group and dtype join the open bucket
while it holds at most ``bucket_bytes`` and every member's operand is ready before any member's
result is needed; the bucket then runs as

    flat = concatenate(reshape(g1, [-1]), reshape(g2, [-1]), ...)
    flat = all_reduce(flat)                        one exchange: one latency, one overhead
    g1' = reshape(slice(flat, [0:n1]), shape1) ...  views of the reduced buffer

placed right after its last operand is produced (so it overlaps the rest of the backward pass
on a runtime that runs ahead); the update steps that wait for it move after it, as in DDP. The
bucket's buffer lives until its last view is read: the memory model counts it so
(passes/sharding/memory.py ``_bucket_terms``). A returned value's all-reduce (the loss) runs alone.
Every device's program has the same structure, so every device forms the same buckets. The planner prices deferred all-reduces the same way
(``CostModel.bucket_share_bytes``): each pays the fixed cost of a collective in proportion to its
share of a bucket.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from graphc.core.ir import Graph, Node, Value
from graphc.ops import OPS
from graphc.passes.rewrite import Rewriter

T = TypeVar("T")

DEFAULT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb


@dataclass
class _Bucket:
    key: tuple
    members: list[Node] = field(default_factory=list)
    nbytes: int = 0


def deferred(node: Node, consumers: list[int], outputs_at: int) -> bool:
    """Whether ``node`` (an all_reduce) is one the update (or only the outputs) wait for."""
    if node.part == "update":
        return True
    return node.part is None and bool(consumers) and all(c == outputs_at for c in consumers)


def bucket_all_reduces(graph: Graph, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Graph:
    """``graph`` with its deferred all-reduces fused into buckets (module doc); ``graph`` itself
    when no bucket has two members or ``bucket_bytes`` is 0."""
    if bucket_bytes <= 0:
        return graph
    buckets = [b for b in _buckets(graph, bucket_bytes) if len(b.members) > 1]
    if not buckets:
        return graph
    rw = Rewriter()
    for unit in _schedule(graph.nodes, buckets):
        if isinstance(unit, _Bucket):
            _emit(rw, unit)
        else:
            rw.keep(unit, unit.regions)
    return Graph(graph.name, graph.inputs, rw.nodes, [rw.get(v) for v in graph.outputs], graph.in_tree, graph.out_tree)


def _buckets(graph: Graph, bucket_bytes: int) -> list[_Bucket]:
    """Deferred all-reduces in program order, bucketed per (axis, group, dtype) up to
    ``bucket_bytes``. One whose operand depends on another's result stays alone: its bucket
    could not wait for it. One whose result the program returns (the loss) stays alone too, as
    the planner prices it (passes/sharding/problem.py ``add_outputs``): in a bucket with the
    gradients its unpacked view would keep the whole bucket alive to the end of the run (a
    4-layer GPT step held its 108 KiB gradient bucket for the loss, 14% over the memory model's
    peak), and returned values bucketed among themselves would be priced alone."""
    nodes = graph.nodes
    used: dict[Value, list[int]] = {}
    for i, node in enumerate(nodes):
        for v in node.inputs:
            used.setdefault(v, []).append(i)
    end = len(nodes)
    for v in graph.outputs:
        used.setdefault(v, []).append(end)
    tainted: set[Value] = set()  # values computed from a deferred all-reduce's result
    cands: list[Node] = []
    for node in nodes:
        hit = any(v in tainted for v in node.inputs)
        if node.op is OPS.all_reduce and deferred(node, used.get(node.outputs[0], []), end):
            if not hit and end not in used.get(node.outputs[0], []):  # a returned one runs alone
                cands.append(node)
            hit = True
        if hit:
            tainted.update(node.outputs)

    def key(node: Node) -> tuple:
        return (node.attrs["axis"], node.attrs["group"], node.inputs[0].type.dtype)

    groups = fill_buckets(cands, key, lambda node: node.inputs[0].type.nbytes, bucket_bytes)
    return [_Bucket(key(g[0]), g, sum(n.inputs[0].type.nbytes for n in g)) for g in groups]


def fill_buckets(
    members: Iterable[T], key: Callable[[T], Hashable], nbytes: Callable[[T], int], bucket_bytes: int
) -> list[list[T]]:
    """``members`` in order, each into the open bucket of its ``key`` while that holds at most
    ``bucket_bytes`` with it, else into a new one (a bucket's first member always enters): the
    rule the lowering buckets by (``_buckets``) and the memory model counts by
    (passes/sharding/memory.py ``MemoryModel._bucket_terms``). The buckets in the order they
    closed, then the open ones."""
    done: list[list[T]] = []
    open_: dict[Hashable, list[T]] = {}
    held: dict[Hashable, int] = {}
    for m in members:
        k, n = key(m), nbytes(m)
        b = open_.get(k)
        if b is None or held[k] + n > bucket_bytes:
            if b is not None:
                done.append(b)
            b = open_[k] = []
            held[k] = 0
        b.append(m)
        held[k] += n
    return done + list(open_.values())


def _schedule(nodes: list[Node], buckets: list[_Bucket]) -> list:
    """Program order with each bucket in place of its members: a topological order that keeps
    the original order where it can, runs a bucket as soon as its last operand is made, and
    moves the nodes waiting for a bucket's results after it (Kahn's algorithm, by position)."""
    member_of = {id(n): b for b in buckets for n in b.members}
    units: list = []
    unit_of_node: dict[int, int] = {}
    pos: list[float] = []
    for i, node in enumerate(nodes):
        b = member_of.get(id(node))
        if b is None:
            unit_of_node[id(node)] = len(units)
            units.append(node)
            pos.append(float(i))
    made_by: dict[Value, int] = {}
    for u, unit in enumerate(units):
        for o in unit.outputs:
            made_by[o] = u
    index = {id(n): i for i, n in enumerate(nodes)}
    for b in buckets:
        u = len(units)
        units.append(b)
        ready = max((index[id(v.producer)] for n in b.members for v in n.inputs if v.producer is not None), default=-1)
        pos.append(ready + 0.5)
        for n in b.members:
            made_by[n.outputs[0]] = u
    deps: list[set[int]] = []
    for unit in units:
        ins = [v for n in unit.members for v in n.inputs] if isinstance(unit, _Bucket) else unit.inputs
        deps.append({made_by[v] for v in ins if v in made_by})
    waiting = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in units]
    for u, d in enumerate(deps):
        for p in d:
            users[p].append(u)
    heap = [(pos[u], u) for u in range(len(units)) if waiting[u] == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _p, u = heapq.heappop(heap)
        order.append(units[u])
        for w in users[u]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(heap, (pos[w], w))
    assert len(order) == len(units), "bucketing made a cycle"
    return order


def _emit(rw: Rewriter, b: _Bucket) -> None:
    """The bucket's pack, one all_reduce, and its unpacked views, standing in for the members."""
    first = b.members[0]
    flats = [rw.emit("reshape", [rw.get(n.inputs[0])], {"shape": (n.inputs[0].type.size,)}, n) for n in b.members]
    packed = rw.emit("concatenate", [f.outputs[0] for f in flats], {"axis": 0}, first)
    reduced = rw.emit("all_reduce", list(packed.outputs), dict(first.attrs), first).outputs[0]
    offset = 0
    for n in b.members:
        t = n.outputs[0].type
        piece = rw.emit("slice", [reduced], {"starts": (offset,), "stops": (offset + t.size,), "steps": (1,)}, n)
        out = rw.emit("reshape", list(piece.outputs), {"shape": t.shape}, n)
        rw.replace(n, list(out.outputs))
        offset += t.size


__all__ = ["DEFAULT_BUCKET_BYTES", "bucket_all_reduces", "deferred", "fill_buckets"]
