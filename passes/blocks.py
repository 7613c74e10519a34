"""The repeated block of a training step: find the identical layers of a traced step and cut it
into segments that can be planned one at a time.

A model written as a loop over layers (``for p in params["blocks"]: x = block(x, p)``) traces to
a graph whose parameters are named ``params.blocks.0.qkv.w``, ``params.blocks.1.qkv.w``, ... and
whose forward pass runs the layers in program order. ``find_layers`` reads that structure: the
list-indexed input families of equal length whose members have the same types layer by layer
(parameters and their optimizer state). ``cut_segments`` cuts the step at each layer's first
forward use of its own parameters:

    pre      the forward nodes before layer 0 (embedding), with the backward they own
    block i  layer i's forward from its first parameter use to layer i+1's, with its backward;
             the last layer takes as many forward nodes as a block
    head     everything after it (final norm, output projection, loss), with its backward

A backward node belongs to the segment of the latest forward value it reads (where the values it
differentiates live; a node reading only backward values goes with its earliest producer), as
the pipeline planner homes them (passes/pipeline.py). Update nodes belong to no segment: their
cost is per parameter (``update_seconds``). The middle blocks are checked to be the same
computation (ops, attributes and types in order); a step whose blocks differ has no repeated
block (``None``).

``segment_graph`` turns a segment into a Graph of its own (the values it reads from outside
become inputs, the values it hands out become outputs), which the sharding ILP plans like any
step: the scale search (passes/scale.py) solves one block per tensor-parallel sub-mesh and
stamps it over the layers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from graphc.core.ir import Graph, Node, Value
from graphc.core.pytree import flatten
from graphc.core.traits import Constant, stream_position

_INDEXED = re.compile(r"^(.*?)\.(\d+)\.(.*)$")  # a list position: params.blocks.3.w
# a dict key of a name and a number: params.h.layer3.w (also how passes/sharding/groups.py ties such layers)
KEYED_LAYER = re.compile(r"^(.*?\.[A-Za-z_]+)(\d+)\.(.*)$")


@dataclass(frozen=True, slots=True)
class Layers:
    """The identical layers of a step: per layer, the positions of the graph inputs it owns."""

    count: int
    prefixes: tuple[str, ...]  # the list-valued families: "params.blocks", "opt_state.m.blocks", ...
    inputs: tuple[tuple[int, ...], ...]  # per layer


def find_layers(graph: Graph, min_layers: int = 3) -> Layers | None:
    """The longest list of layers whose inputs have the same names and types layer by layer
    (module doc); None when the step has fewer than ``min_layers``. Layers are list positions
    (``params.blocks.3.w``), or, in a name with none, dict keys of one name numbered from 0 or 1
    (``params.h.layer3.w``: the family ``params.h.layer``), taken in their numbers' order."""
    families: dict[str, dict[int, list[tuple[str, int]]]] = {}
    for k, v in enumerate(graph.inputs):
        m = _INDEXED.match(v.name or "") or KEYED_LAYER.match(v.name or "")
        if m:
            families.setdefault(m.group(1), {}).setdefault(int(m.group(2)), []).append((m.group(3), k))
    best: dict[int, list[str]] = {}
    for prefix, members in families.items():
        n = len(members)
        if n < min_layers or sorted(members) != list(range(min(members), min(members) + n)) or min(members) > 1:
            continue
        sig = [sorted((rest, graph.inputs[k].type) for rest, k in members[i]) for i in sorted(members)]
        if all(s == sig[0] for s in sig):
            best.setdefault(n, []).append(prefix)
    if not best:
        return None
    n = max(best)
    prefixes = tuple(sorted(best[n]))
    per_layer = tuple(
        tuple(sorted(k for p in prefixes for _rest, k in families[p][min(families[p]) + i])) for i in range(n)
    )
    return Layers(n, prefixes, per_layer)


@dataclass(slots=True)
class Segments:
    """The step cut at its layers (module doc): per node its segment (0: pre, 1 .. L: blocks
    0 .. L-1, L + 1: head; -1 update and constants), and the middle block chosen to stand for all."""

    layers: Layers
    segment: list[int]  # per graph node
    n_segments: int  # L + 2
    block: int  # the segment that stands for the middle blocks
    update_nodes: list[int] = field(default_factory=list)

    def nodes(self, s: int) -> list[int]:
        return [k for k, x in enumerate(self.segment) if x == s]


def update_only(graph: Graph) -> set[int]:
    """Nodes that only the update reads: update nodes, and forward-tagged nodes (an optimizer's
    ``b1 * m``, which does not wait for the gradients) whose every reader is one of them."""
    users: dict[Value, list[int]] = {}
    for k, n in enumerate(graph.nodes):
        for v in n.inputs:
            users.setdefault(v, []).append(k)
    outputs = set(graph.outputs)
    out: set[int] = set()
    for k in range(len(graph.nodes) - 1, -1, -1):
        n = graph.nodes[k]
        if n.part == "update":
            out.add(k)
        elif n.part == "forward" and n.outputs and not n.op.has(Constant):
            readers = [j for o in n.outputs for j in users.get(o, [])]
            if readers and all(j in out for j in readers) and not any(o in outputs for o in n.outputs):
                out.add(k)
    return out


def _first_uses(graph: Graph, layers: Layers, fwd: list[int]) -> list[int] | None:
    """Per layer, the forward position of its first parameter read; None unless increasing."""
    owner = {graph.inputs[k]: i for i, ks in enumerate(layers.inputs) for k in ks}
    first = [-1] * layers.count
    for pos, k in enumerate(fwd):
        for v in graph.nodes[k].inputs:
            i = owner.get(v)
            if i is not None and first[i] < 0:
                first[i] = pos
    if min(first) < 0 or any(a >= b for a, b in zip(first, first[1:])):
        return None
    return first


def cut_segments(graph: Graph, layers: Layers) -> Segments | None:
    """The segments of ``graph`` (module doc), or None when its forward does not run the layers
    in order or its middle blocks are not the same computation."""
    nodes = graph.nodes
    const = [n.op.has(Constant) for n in nodes]
    upd = update_only(graph)
    fwd = [k for k, n in enumerate(nodes) if n.part == "forward" and not const[k] and k not in upd]
    first = _first_uses(graph, layers, fwd)
    if first is None:
        return None
    L = layers.count
    seg = [-1] * len(nodes)
    width = first[1] - first[0] if L > 1 else len(fwd) - first[0]  # a block's forward nodes
    head = min(first[-1] + width, len(fwd))  # the last layer is a block as wide; then the head
    bounds = [*first[1:], head]  # block i: [first[i], first[i+1]); the last layer; the head after it
    for pos, k in enumerate(fwd):
        seg[k] = 0 if pos < first[0] else 1 + int(np.searchsorted(bounds, pos, side="right"))
    seg_of_value: dict[Value, int] = {}
    for k in fwd:
        for o in nodes[k].outputs:
            seg_of_value[o] = seg[k]
    for k in fwd:  # an input belongs where the forward reads it last
        for v in nodes[k].inputs:
            if v.producer is None:
                seg_of_value[v] = max(seg_of_value.get(v, 0), seg[k])
    updates = []
    for k, n in enumerate(nodes):
        if const[k] or (n.part == "forward" and k not in upd):
            continue
        if n.part == "update" or k in upd:
            updates.append(k)
            continue
        homes = [
            seg_of_value[v]
            for v in n.inputs
            if v in seg_of_value and (v.producer is None or v.producer.part == "forward")
        ]
        if not homes:
            made = [seg[_index(graph, v.producer)] for v in n.inputs if v.producer is not None]
            homes = [min((x for x in made if x >= 0), default=L + 1)]
        seg[k] = max(homes)
    block = max(1, L // 2)
    s = Segments(layers, seg, L + 2, block, updates)
    if L >= 3 and _signature(graph, s.nodes(block)) != _signature(
        graph, s.nodes(block - 1 if block > 1 else block + 1)
    ):
        return None
    return s


def _index(graph: Graph, node: Node) -> int:
    cache = getattr(graph, "_node_index_cache", None)
    if cache is None or len(cache) != len(graph.nodes):
        cache = {id(n): i for i, n in enumerate(graph.nodes)}
        graph._node_index_cache = cache  # type: ignore[attr-defined]
    return cache[id(node)]


def _signature(graph: Graph, ks: list[int]) -> list[tuple]:
    out = []
    for k in ks:
        n = graph.nodes[k]
        attrs = tuple(sorted((a, repr(v)) for a, v in n.attrs.items() if a not in stream_position(n)))
        out.append((n.op.name, n.part, attrs, tuple(o.type for o in n.outputs)))
    return out


def segment_graph(graph: Graph, ks: list[int], name: str) -> Graph:
    """The nodes ``ks`` of ``graph`` (in order) as a graph of their own: the values they read
    from elsewhere are its inputs (constants are copied in), the values they produce that other
    nodes or the step's outputs read are its outputs."""
    inside = set(ks)
    nodes = graph.nodes
    producer = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    needed_consts: list[int] = []
    seen_consts: set[int] = set()

    def want_const(v: Value) -> None:
        k = producer.get(v)
        if k is None or k in inside or k in seen_consts or not nodes[k].op.has(Constant):
            return
        for u in nodes[k].inputs:
            want_const(u)
        seen_consts.add(k)
        needed_consts.append(k)

    for k in ks:
        for v in nodes[k].inputs:
            want_const(v)
    order = sorted(set(ks) | seen_consts)
    own = set(order)
    mapping: dict[Value, Value] = {}
    inputs: list[Value] = []
    for k in order:
        for v in nodes[k].inputs:
            if v not in mapping and producer.get(v) not in own:
                nv = Value(v.type, name=v.name or f"in{len(inputs)}")
                mapping[v] = nv
                inputs.append(nv)
    _, outside_out = segment_boundary(graph, ks)
    new_nodes = []
    for k in order:
        n = nodes[k]
        c = Node(
            n.op, [mapping[v] for v in n.inputs], dict(n.attrs), [o.type for o in n.outputs], n.loc, n.part, n.regions
        )
        for o, no in zip(n.outputs, c.outputs):
            mapping[o] = no
        new_nodes.append(c)
    outputs = [mapping[o] for o in outside_out]
    leaf = np.empty(0)
    in_tree = flatten((tuple(leaf for _ in inputs), {}))[1]  # (args, kwargs), as a traced call
    out_tree = flatten(tuple(leaf for _ in outputs))[1]
    return Graph(name, inputs, new_nodes, outputs, in_tree, out_tree)


def segment_boundary(graph: Graph, ks: list[int]) -> tuple[list[Value], list[Value]]:
    """The values of ``graph`` that ``segment_graph(graph, ks, ...)`` makes its inputs and its
    outputs, in the same order: input j of the segment's graph stands for the first list's j-th."""
    nodes = graph.nodes
    producer = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    own = set(ks)
    const: set[int] = set()

    def closure(v: Value) -> None:  # the constants segment_graph copies in
        k = producer.get(v)
        if k is None or k in own or k in const or not nodes[k].op.has(Constant):
            return
        const.add(k)
        for u in nodes[k].inputs:
            closure(u)

    for k in ks:
        for v in nodes[k].inputs:
            closure(v)
    order = sorted(own | const)
    inside = own | const
    inputs: list[Value] = []
    seen: set[Value] = set()
    for k in order:
        for v in nodes[k].inputs:
            if v not in seen and producer.get(v) not in inside:
                seen.add(v)
                inputs.append(v)
    used_outside = {v for k, n in enumerate(nodes) if k not in inside for v in n.inputs} | set(graph.outputs)
    outputs = [o for k in order if k in own for o in nodes[k].outputs if o in used_outside]
    return inputs, outputs


__all__ = [
    "Layers",
    "Segments",
    "cut_segments",
    "find_layers",
    "segment_boundary",
    "segment_graph",
    "update_only",
]
