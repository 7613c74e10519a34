"""The auto-sharding problem of one graph on one mesh: items, strategies, edges, costs, memory.

*Items* are what gets a strategy: every graph input (its spec), every node, every graph output
(the spec it is returned in). *Edges* connect a producer item's result to a consumer item's
operand; an edge costs the redistribution from the producer's result spec to the consumer's
operand spec. The objective of an assignment (one strategy per item) is

    sum of items' compute time + sum of edges' redistribution time

(a sequential model: no overlap of compute and communication). Memory per device is the peak,
over the program order, of the bytes of live tensors under their chosen specs: graph inputs
(parameters, optimizer state) live throughout, every other value from its producer to its last
use, and every graph output from its output item to the end in the spec it is returned in (a
state gathered for its return is held whole). All meshes here split evenly, so every device
has the same peak.

With ZeRO allowed (``zero``, passes/sharding/zero.py) two things are counted as the lowering
runs them: a gradient (a value the backward makes for the update alone) goes through a fan-out
item placed right after its producer, and lives in its producer's spec until there, then in the
fan-out's (a reduce-scatter into a shard frees the full partial sum at once); a state input
split along a data axis (ZeRO-3) is gathered afresh for every forward or backward node that
reads it, and the gathered copy lives at that node only (``transient_terms``).

Under a memory limit (``redo_later``) a forward value's backward and update readers
redistribute it again instead of sharing the forward pass's copy (``read_phase`` in
passes/sharding/redistribute.py): every edge carries its read phase, fan-outs are per value and
phase, and the redistribution buffers are counted per phase.

``evaluate`` is the reference the ILP is tested against (exhaustive search on small graphs).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from graphc.core.errors import PlanError
from graphc.core.ir import Graph, Node, TensorType, Value
from graphc.core.mesh import Mesh
from graphc.core.spec import P, R, Spec, SpecError, format_spec, local_shape, parse_spec
from graphc.core.traits import Constant, IndexedLookup, ShardingConstraint, ViewOf
from graphc.ops.dims import DimRule
from graphc.passes.options import PlanOptions, Zero
from graphc.passes.sharding.fusion import fused_values, saved_bytes
from graphc.passes.sharding.redistribute import bucketed_time, plan_steps, read_phase, redistribution_time
from graphc.passes.sharding.roles import AxisRoles, axis_roles
from graphc.passes.sharding.strategies import (
    Strategy,
    block_sets,
    full_time,
    get_rule,
    node_strategies,
    tensor_specs,
)


@dataclass
class Item:
    kind: str  # "input", "node", "output", "fanout" (a value read by several consumers, or a gradient)
    index: int  # graph input / node / output position
    strategies: list[Strategy]
    node: Node | None = None  # nodes
    value: Value | None = None  # inputs and outputs
    pinned: str | None = None  # why the strategies were restricted (a user pin)
    warning: str | None = None
    gradient: bool = False  # a fan-out of a gradient: its value lives in the fan-out's spec after it


@dataclass
class Edge:
    src: int  # item index
    src_out: int
    dst: int
    dst_in: int
    value: Value
    deferred: bool = False  # an all-reduce here can wait for the update: it joins a gradient bucket
    phase: str = ""  # which redistributed copy the reader shares (redistribute.read_phase)


@dataclass
class Problem:
    graph: Graph
    mesh: Mesh
    items: list[Item]
    edges: list[Edge]
    order: list[int] = field(default_factory=list)  # item indices in program order
    warnings: list[str] = field(default_factory=list)
    ties: list[tuple[int, int]] = field(default_factory=list)  # (input item, output item): same strategy index
    roles: AxisRoles | None = None
    # deferred edges (gradients into the update, the loss into the outputs) share buckets of
    # this many bytes (passes/bucket.py); each all-reduce pays the fixed cost of a collective
    # in proportion to its bytes. 0: no bucketing.
    bucket_share_bytes: int = 0
    bucket_limit: int = 0  # the bucket size
    zero: Zero = 0  # ZeRO: 0 off, "auto" the solver's choice, 1-3 a forced stage (passes/sharding/zero.py)
    zero_axes: tuple[int, ...] = ()  # the data axes ZeRO may shard state along
    gathers: list[tuple[int, int]] = field(default_factory=list)  # (state input item, reader item) not in the update
    _spec_cache: dict = field(default_factory=dict, repr=False)
    _matrix_cache: dict = field(default_factory=dict, repr=False)
    _edge_cache: dict = field(default_factory=dict, repr=False)
    _live: list | None = field(default=None, repr=False)
    _transients: list | None = field(default=None, repr=False)
    # items that may be recomputed (passes/sharding/remat.py): item -> its ranges when recomputed
    remat: dict = field(default_factory=dict)

    # --- costs -----------------------------------------------------------------------------
    def edge_time(self, e: Edge, s_src: int, s_dst: int) -> float:
        src = self.items[e.src].strategies[s_src].out_specs[e.src_out]
        dst = self.items[e.dst].strategies[s_dst].in_specs[e.dst_in]
        return self._time(e, src, dst)

    def _time(self, e: Edge, src, dst) -> float:
        t = e.value.type
        if e.deferred and self.bucket_share_bytes:
            return bucketed_time(t.shape, t.dtype.itemsize, src, dst, self.mesh, self.bucket_share_bytes)
        return redistribution_time(t.shape, t.dtype.itemsize, src, dst, self.mesh)

    def rebucket(self, choice: list[int]) -> None:
        """Share the fixed cost over the bytes the deferred all-reduces of ``choice`` really move
        (the estimate ``build_problem`` starts from counts every tensor that might)."""
        filled = self.filled_bucket_bytes(choice)
        if filled:
            self.bucket_share_bytes = filled
            self._matrix_cache.clear()  # the times change; which specs an edge joins does not

    def filled_bucket_bytes(self, choice: list[int]) -> int:
        """The bucket share of the deferred all-reduces ``choice`` makes: the bytes they move, at
        most the bucket size (0 without buckets, or when ``choice`` all-reduces nothing)."""
        if not self.bucket_share_bytes:
            return 0
        moved: dict[tuple, int] = {}
        for e in self.edges:
            if not e.deferred:
                continue
            src = self.items[e.src].strategies[choice[e.src]].out_specs[e.src_out]
            dst = self.items[e.dst].strategies[choice[e.dst]].in_specs[e.dst_in]
            t = e.value.type
            for st in plan_steps(t.shape, t.dtype.itemsize, src, dst, self.mesh) if src != dst else ():
                if st.kind == "all_reduce":
                    moved[(e.value, dst, st.axis)] = st.local_bytes
        total = sum(moved.values())
        return max(1, min(self.bucket_limit, total)) if total else 0

    def compute_times(self, item: int) -> np.ndarray:
        """The compute time of every strategy of ``item`` (cached per strategy list: repeated
        layers share one)."""
        strategies = self.items[item].strategies
        hit = self._spec_cache.get((id(strategies), "compute"))
        if hit is None or hit[0] is not strategies:
            hit = self._spec_cache[(id(strategies), "compute")] = (
                strategies,
                np.array([s.compute_s for s in strategies]),
            )
        return hit[1]

    def specs_of(self, item: int, side: str, k: int):
        """(distinct specs, index per strategy) of an item's result / operand ``k`` (cached)."""
        return distinct_specs(self._spec_cache, self.items[item].strategies, side, k)

    def edge_times_at(self, e: Edge, item: int, choice: list[int]) -> np.ndarray:
        """The edge's time for every strategy of ``item`` (one of its ends), the other end as
        ``choice`` has it: a row or column of the edge's cost table (``edge_table``)."""
        small, ui, vi = self.edge_table(e)
        return small[ui, vi[choice[e.dst]]] if item == e.src else small[ui[choice[e.src]], vi]

    def edge_table(self, e: Edge) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times between the distinct specs, producer index per strategy, consumer index per
        strategy), once per edge and once per distinct (type, specs) combination."""
        hit = self._edge_cache.get(id(e))
        if hit is None or hit[0] is not e:
            us, ui = self.specs_of(e.src, "out", e.src_out)
            vs, vi = self.specs_of(e.dst, "in", e.dst_in)
            # the spec lists are the cached ones (``_spec_cache`` holds them for the problem's
            # life), so their identities stand for their contents: repeated layers hash ints
            hit = self._edge_cache[id(e)] = (e, (e.value.type, id(us), id(vs), e.deferred), us, ui, vs, vi)
        _e, fast, us, ui, vs, vi = hit
        small = self._matrix_cache.get(fast)
        if small is None:
            key = (e.value.type, tuple(us), tuple(vs), e.deferred)
            small = self._matrix_cache.get(key)
            if small is None:
                small = np.array([[self._time(e, a, b) for b in vs] for a in us])
                self._matrix_cache[key] = small
            self._matrix_cache[fast] = small
        return small, ui, vi

    def evaluate(self, choice: list[int]) -> dict:
        compute = sum(self.items[i].strategies[s].compute_s for i, s in enumerate(choice))
        comm = sum(self.edge_time(e, choice[e.src], choice[e.dst]) for e in self.edges)
        return {
            "compute_s": compute,
            "comm_s": comm,
            "total_s": compute + comm,
            "peak_bytes": self.peak_memory(choice)[0],
        }

    # --- memory ----------------------------------------------------------------------------
    def live_ranges(self) -> list[tuple[Value, int, int, int]]:
        """(value, producer item, first position, last position) over ``order`` positions. A
        value the runtime makes as a view of another (``view_roots``) has no bytes of its own:
        it is left out, and the value it looks into lives until the view's last use. Computed
        once: the items and edges of a problem do not change."""
        if self._live is None:
            self._live = self._live_ranges()
        return self._live

    def _live_ranges(self) -> list[tuple[Value, int, int, int]]:
        pos = {item: p for p, item in enumerate(self.order)}
        end = len(self.order) - 1
        last: dict[Value, int] = {}
        returned: dict[Value, int] = {}  # graph output -> the position of its first output item
        for e in self.edges:
            if self.items[e.dst].kind == "output":
                returned[e.value] = min(returned.get(e.value, end), pos[e.dst])
            else:
                last[e.value] = max(last.get(e.value, -1), pos[e.dst])
        for v, at in returned.items():  # until the outputs, where each is held in its output spec
            last[v] = max(last.get(v, -1), at - 1)
        hubs: dict[Value, int] = {}  # gradient -> its fan-out item
        for i, it in enumerate(self.items):
            if it.gradient:
                assert it.value is not None
                hubs[it.value] = i
        roots = view_roots(self.graph)
        for view, root in roots.items():
            last[root] = max(last.get(root, -1), last.get(view, -1))
        out = []
        for i, item in enumerate(self.items):
            if item.kind == "input":
                assert item.value is not None  # an input item holds its graph input
                out.append((item.value, i, 0, end))
            elif item.kind == "node":
                assert item.node is not None  # a node item holds its node
                for o in item.node.outputs:
                    if o in roots:
                        continue
                    hub = hubs.get(o)
                    if hub is not None and o not in roots.values():  # in the fan-out's spec after it
                        out.append((o, i, pos[i], pos[hub]))
                        out.append((o, hub, pos[hub], max(pos[hub], last.get(o, pos[hub]))))
                    else:
                        out.append((o, i, pos[i], max(pos[i], last.get(o, pos[i]))))
            elif item.kind == "output" and item.value is not None and item.value.producer is not None:
                out.append((item.value, i, pos[i], end))  # held as returned (a gathered state, say)
        return out

    def value_bytes(self, v: Value, item: int, s: int) -> int:
        return local_nbytes(v.type, self.value_spec(v, item, s), tuple(self.mesh.shape))

    def value_spec(self, v: Value, item: int, s: int) -> tuple:
        """The spec ``v`` is held in when ``item`` (its producer, fan-out or output item) has
        strategy ``s``."""
        it = self.items[item]
        st = it.strategies[s]
        return st.in_specs[0] if it.kind == "output" else st.out_specs[v.index if it.kind == "node" else 0]

    def transient_terms(self) -> list[tuple[int, int, np.ndarray]]:
        """(state input item, program position, bytes per strategy of the input) of every gathered
        copy of a ZeRO-3 parameter: a state input split along a ZeRO data axis is gathered along it
        for each forward or backward node that reads it, and the copy lives at that node only (the
        lowering's ``regather``). Its size is the input's spec with the data axes unsplit."""
        if self._transients is None:
            pos = {item: p for p, item in enumerate(self.order)}
            mesh_shape = tuple(self.mesh.shape)
            sizes: dict[int, np.ndarray] = {}
            out = []
            for i, reader in self.gathers:
                if i not in sizes:
                    v = self.items[i].value
                    assert v is not None  # an input item holds its value
                    specs = [st.out_specs[0] for st in self.items[i].strategies]
                    whole = [gathered(sp, self.zero_axes) for sp in specs]
                    sizes[i] = np.array(
                        [local_nbytes(v.type, w, mesh_shape) if w != sp else 0 for sp, w in zip(specs, whole)],
                        dtype=np.float64,
                    )
                if sizes[i].any():
                    out.append((i, pos[reader], sizes[i]))
            self._transients = out
        return self._transients

    def memory_profile(self, choice: list[int], recompute: bool = True) -> np.ndarray:
        """Bytes live on each device at every program point; ``recompute=False``: as if every
        recomputed value were kept instead."""
        delta = np.zeros(len(self.order) + 1, dtype=np.float64)
        for v, i, a, b in self.live_ranges():
            nb = self.value_bytes(v, i, choice[i])
            for first, last in self.ranges_under(v, i, choice[i], a, b) if recompute else ((a, b),):
                delta[first] += nb
                delta[last + 1] -= nb
        for i, at, sizes in self.transient_terms():
            delta[at] += sizes[choice[i]]
            delta[at + 1] -= sizes[choice[i]]
        return np.cumsum(delta[:-1])

    def ranges_under(self, v: Value, item: int, s: int, a: int, b: int) -> tuple[tuple[int, int], ...]:
        """The live ranges of ``v`` (kept: ``(a, b)``) when ``item`` has strategy ``s``: two when
        the strategy recomputes it (passes/sharding/remat.py)."""
        if item in self.remat and self.items[item].strategies[s].recompute:
            return self.remat[item].ranges[v]
        return ((a, b),)

    def recomputed(self, choice: list[int]) -> list[int]:
        """The items ``choice`` recomputes."""
        return [i for i in self.remat if self.items[i].strategies[choice[i]].recompute]

    def recompute_allowed(self, choice: list[int]) -> bool:
        """Whether every item ``choice`` recomputes can be: what it needs recomputed is, what it
        needs kept is (the ILP's rows, passes/sharding/ilp.py ``_add_recompute_needs``)."""
        again = set(self.recomputed(choice))
        return all(set(self.remat[i].needs) <= again and not again & set(self.remat[i].conflicts) for i in again)

    def redistribution_buffers(self, choice: list[int]) -> list[tuple[int, int, int]]:
        """(bytes, first position, last position) of the buffers ``choice``'s redistributions
        make on each device: one per value, spec it is read in other than its own, and read
        phase (a forward value's later readers redistribute it again, ``read_phase``), from the
        first reader that needs it to the last (the lowering redistributes at the first reader,
        passes/lower.py; a fan-out's at its first consumer, a gradient's at its fan-out, right
        after its producer: ZeRO's ``scatter_early``): a collective's result, a local slice's
        copy, a deferred all-reduce's result, which the gradient bucket holds as well
        (passes/bucket.py). A graph output's redistribution is not one: the profile holds each
        output in its output spec."""
        pos = {item: p for p, item in enumerate(self.order)}
        spans: dict[tuple, list[int]] = {}
        mesh_shape = tuple(self.mesh.shape)
        hub_reads: list[tuple[tuple, int]] = []  # a fan-out's spec is read by each of its consumers
        for e in self.edges:
            src = self.items[e.src].strategies[choice[e.src]].out_specs[e.src_out]
            dst = self.items[e.dst].strategies[choice[e.dst]].in_specs[e.dst_in]
            if self.items[e.src].kind == "fanout":
                hub_reads.append(((e.value, src, e.phase), pos[e.dst]))
            if src == dst or self.items[e.dst].kind == "output":  # an output's spec is in the profile
                continue
            key = (e.value, dst, e.phase)
            span = spans.get(key)
            if span is None:
                span = spans[key] = [local_nbytes(e.value.type, dst, mesh_shape), len(self.order), -1]
            to = self.items[e.dst]
            if to.kind != "fanout" or to.gradient:  # a fan-out's spec is made at its first consumer (below)
                span[1], span[2] = min(span[1], pos[e.dst]), max(span[2], pos[e.dst])
        for key, at in hub_reads:  # the redistributed hub lives from its first reader to its last
            span = spans.get(key)
            if span is not None:
                span[1], span[2] = min(span[1], at), max(span[2], at)
        return [(nb, a, b) for nb, a, b in spans.values()]

    def held_peak(self, choice: list[int]) -> int:
        """The peak of ``memory_profile`` with the redistribution buffers added: what the runtime
        holds (``peak_memory`` is what a memory limit bounds)."""
        prof = self.memory_profile(choice)
        if not len(prof):
            return 0
        delta = np.zeros(len(prof) + 1, dtype=np.float64)
        for nb, a, b in self.redistribution_buffers(choice):
            delta[a] += nb
            delta[b + 1] -= nb
        return int((prof + np.cumsum(delta[:-1])).max())

    def peak_memory(self, choice: list[int]) -> tuple[int, int]:
        prof = self.memory_profile(choice)
        at = int(np.argmax(prof)) if len(prof) else 0
        return (int(prof[at]) if len(prof) else 0), at


def lowest_zero_dims(placements: list[tuple], axes: frozenset[int]) -> list[tuple]:
    """Of placements (tuples of specs) equal but for which dims the ZeRO ``axes`` split, the one
    splitting the lowest dims: the shard of a state tensor along a data axis changes its memory
    and collectives, not which dim it is (any even one will do), and the update's strategies and
    the state's specs then agree on it. Order kept."""
    if not axes:
        return placements
    best: dict[tuple, tuple] = {}
    for pl in placements:
        key = tuple(tuple("Z" if a in axes and p.is_split else p for a, p in enumerate(sp)) for sp in pl)
        dims = tuple(p.dim if a in axes and p.is_split else -1 for sp in pl for a, p in enumerate(sp))
        if key not in best or dims < best[key][0]:
            best[key] = (dims, pl)
    chosen = {id(pl) for _d, pl in best.values()}
    return [pl for pl in placements if id(pl) in chosen]


def gathered(spec: tuple, axes: tuple[int, ...]) -> tuple:
    """``spec`` with its splits along ``axes`` undone (R there)."""
    return tuple(R if a in axes and p.is_split else p for a, p in enumerate(spec))


@functools.lru_cache(maxsize=1 << 16)
def local_nbytes(t: TensorType, spec, mesh_shape: tuple[int, ...]) -> int:
    """Bytes one device holds of a tensor of type ``t`` placed by ``spec`` (remembered: a memory
    profile asks for the same few thousand (type, spec) pairs for every value of every layer)."""
    return t.dtype.itemsize * math.prod(local_shape(t.shape, spec, mesh_shape))


def view_roots(graph: Graph) -> dict[Value, Value]:
    """{value: the value whose buffer it looks into} for the results of ``graph``'s top-level
    nodes whose op returns a view of an operand (the ViewOf trait, which the executor reads too):
    no new memory. A reshape of a strided view copies, as numpy's does."""
    roots: dict[Value, Value] = {}
    strided: set[Value] = set()  # views that are not C-contiguous
    for node in graph.nodes:
        view = node.op.trait(ViewOf)
        if view is None or node.regions or not node.inputs:
            continue
        x = node.inputs[view.operand]
        if view.copies_strided and x in strided:
            continue  # numpy copies
        for out in node.outputs:
            roots[out] = roots.get(x, x)
            if x in strided or (view.strided is not None and view.strided(node)):
                strided.add(out)
    return roots


def distinct_specs(cache: dict, strategies: list[Strategy], side: str, k: int) -> tuple[list[tuple], np.ndarray]:
    """(distinct specs, index per strategy) of result (side "out") or operand ``k`` over a
    strategy list, cached in ``cache`` by the list's identity: repeated layers share one list."""
    key = (id(strategies), side, k)
    hit = cache.get(key)
    if hit is None or hit[0] is not strategies:
        specs = [s.out_specs[k] if side == "out" else s.in_specs[k] for s in strategies]
        hit = cache[key] = (strategies, *_unique(specs))
    return hit[1], hit[2]


def _unique(specs: list[tuple]) -> tuple[list[tuple], np.ndarray]:
    """The distinct specs in first-seen order, and the position of every spec among them."""
    index: dict[tuple, int] = {}
    uniq: list[tuple] = []
    idx: list[int] = []
    for s in specs:
        if s not in index:
            index[s] = len(uniq)
            uniq.append(s)
        idx.append(index[s])
    return uniq, np.array(idx, dtype=np.int64)


@dataclass(frozen=True)
class Pins:
    """Choices fixed by the user: specs of graph inputs / outputs (by position) and strategies of
    nodes (by index: a strategy name or a result spec, from a hand-edited plan)."""

    inputs: Mapping[int, Spec] = field(default_factory=dict)
    outputs: Mapping[int, Spec] = field(default_factory=dict)
    nodes: Mapping[int, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "inputs": {str(k): format_spec(v) for k, v in sorted(self.inputs.items())},
            "outputs": {str(k): format_spec(v) for k, v in sorted(self.outputs.items())},
            "nodes": {str(k): v for k, v in sorted(self.nodes.items())},
        }


def items_and_edges(
    graph: Graph,
    mesh: Mesh,
    options: PlanOptions,
    pins: Pins = Pins(),
    ties: list[tuple[int, int]] | None = None,
) -> Problem:
    """Items and edges of ``graph`` on ``mesh``, the input and output ``pins`` applied (the node
    pins, the ties and a forced ZeRO stage are applied by passes/partition.py ``build_problem``).
    ``ties`` are (input position, output position) pairs whose specs must be equal (a training
    step's state): both get the same candidate list. What the options change here: the mesh's
    axis roles (passes/sharding/roles.py) restrict what data and seq axes split, unless
    ``free_axes``; ``zero`` other than 0 lets data axes split the training state; deferred
    all-reduces share buckets of ``bucket_bytes`` (0: none); partial sums are carried through
    linear ops (``linear_partials``); under a ``memory_limit`` a forward value's backward readers
    redistribute it again (``read_phase``)."""
    in_pins = dict(pins.inputs)
    out_pins = dict(pins.outputs)
    ties = list(ties or [])
    zero = options.zero
    bucket_bytes = options.bucket_bytes
    rules, rule_errors = _node_rules(graph)
    roles = axis_roles(graph, mesh, rules, ties, options.free_axes, zero=zero != 0)
    overhead = mesh.profile.op_overhead(mesh.size)
    fused = fused_values(graph) if mesh.profile.fuses_elementwise or overhead else frozenset()
    b = _ProblemBuilder(
        graph,
        mesh,
        block_sets(graph, rules),
        roles,
        fused if mesh.profile.fuses_elementwise else frozenset(),
        warnings=list(roles.warnings),
        overhead_s=overhead,
        in_kernels=fused,
        redo_later=options.memory_limit is not None,
    )
    b.add_inputs(in_pins, {i: o for i, o in ties})
    b.add_nodes(rules, rule_errors, options.linear_partials)
    b.add_outputs(out_pins, {o: i for i, o in ties})
    b.add_fanouts()
    problem = Problem(graph, mesh, b.items, b.edges, _program_order(b.items), b.warnings, roles=roles, zero=zero)
    if roles.zero:
        problem.zero_axes = tuple(a for a, (r, n) in enumerate(zip(roles.roles, mesh.shape)) if r == "data" and n > 1)
        problem.gathers = b.gathers
    if bucket_bytes > 0:
        # the bytes the deferred all-reduces move at most (whole tensors that may arrive as
        # partial sums); a bucket holds at most bucket_bytes of them, so the fixed cost of a
        # collective is shared by this many bytes
        def gradient(e: Edge) -> bool:  # not the update's own values
            src = b.items[e.src]
            made_in_update = src.node is not None and src.node.part == "update"
            return not made_in_update and any(P in st.out_specs[e.src_out] for st in src.strategies)

        counted = {e.value: e.value.type.nbytes for e in b.edges if e.deferred and gradient(e)}
        # as their fan-outs counted them before ZeRO (an update op linear in a parameter may read it
        # as a partial sum): the estimate, and so the plans without ZeRO, stay as they were
        counted.update(b.fanless_state)
        deferred = sum(counted.values())
        problem.bucket_share_bytes = max(1, min(bucket_bytes, deferred))
        problem.bucket_limit = bucket_bytes
    return problem


def _node_rules(graph: Graph) -> tuple[dict[Node, DimRule | None], dict[Node, str]]:
    """Every node's dimension rule, and why for the nodes whose rule failed: a broken rule
    replicates its op (rule None) instead of stopping the compile."""
    rules: dict[Node, DimRule | None] = {}
    rule_errors: dict[Node, str] = {}
    shared: dict = {}  # equal ops on equal types (repeated layers) share one rule and its caches
    for node in graph.nodes:
        key = _rule_key(node)
        if key is not None and key in shared:
            rules[node] = shared[key]
            continue
        try:
            rules[node] = get_rule(node)
        except Exception as exc:
            rules[node] = None
            rule_errors[node] = f"{type(exc).__name__}: {exc}"
            continue
        if key is not None:
            shared[key] = rules[node]
    return rules, rule_errors


def _rule_key(node: Node):
    """What a node's dimension rule depends on (op, operand and result types, attributes), or
    None when that is more (regions, constant operands) or is not hashable."""
    if node.regions or node.op.has(IndexedLookup):
        return None
    try:
        key = (
            node.op.name,
            tuple(v.type for v in node.inputs),
            tuple(o.type for o in node.outputs),
            tuple(sorted((k, type(v).__name__, v) for k, v in node.attrs.items())),
        )
        hash(key)
    except TypeError:
        return None
    return key


def _program_order(items: list[Item]) -> list[int]:
    """Item indices in program order: the graph inputs, the nodes, then the graph outputs; a
    fan-out right after the item whose value it spreads (``Item.index`` of a fan-out)."""
    after: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        if it.kind == "fanout":
            after.setdefault(it.index, []).append(i)
    order: list[int] = []
    for kind in ("input", "node", "output"):
        for i, it in enumerate(items):
            if it.kind == kind:
                order.append(i)
                order += after.get(i, [])
    return order


@dataclass
class _ProblemBuilder:
    """The items, edges and warnings of a problem as ``build_problem`` adds them, and the item
    (and result index) that produces every value added so far."""

    graph: Graph
    mesh: Mesh
    sets: dict[Value, list[set[int]]]  # block counts per value dim (strategies.block_sets)
    roles: AxisRoles
    fused: frozenset[Value]  # values fusion keeps out of memory (sharding/fusion.py), when the profile prices it
    items: list[Item] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    producer: dict[Value, tuple[int, int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    overhead_s: float = 0.0  # the runtime's cost of one op of a device program (MachineProfile.op_overhead)
    in_kernels: frozenset[Value] = frozenset()  # values the device programs' fusion keeps inside kernels
    gathers: list[tuple[int, int]] = field(default_factory=list)  # (state input item, forward/backward reader)
    fanless_state: dict[Value, int] = field(default_factory=dict)  # state inputs ZeRO gave no fan-out: bytes
    redo_later: bool = False  # a forward value's later readers redistribute it again (read_phase)

    def op_overhead(self, node: Node) -> float:
        """``overhead_s`` for a node the device program runs as an op of its own: not a constant,
        and not an elementwise node whose results all stay inside one fused kernel (it is a part
        of its consumer's op)."""
        if not self.overhead_s or node.op.has(Constant):
            return 0.0
        if node.outputs and all(o in self.in_kernels for o in node.outputs):
            return 0.0
        return self.overhead_s

    def tensor_specs(self, v: Value, other: Value | None) -> list[tuple]:
        """The specs of a graph input / output; a tied pair's block counts are merged, so both
        get the same candidates."""
        blocks = [set(s) for s in self.sets.get(v, [{1} for _ in v.type.shape])]
        if other is not None:
            for d, s in enumerate(self.sets.get(other, [])):
                blocks[d] |= s
        roles = self.roles
        specs = tensor_specs(v.type, tuple(self.mesh.shape), blocks, lambda a, d: roles.allows(a, v, d))
        if v not in roles.zero:
            return specs
        return [sp for (sp,) in lowest_zero_dims([(sp,) for sp in specs], self.zero_axes())]

    def zero_axes(self) -> frozenset[int]:
        """The data axes along which ZeRO may split state (none unless it is on)."""
        if not self.roles.zero:
            return frozenset()
        return frozenset(a for a, (r, n) in enumerate(zip(self.roles.roles, self.mesh.shape)) if r == "data" and n > 1)

    def add_inputs(self, in_pins: dict[int, tuple], tied_in: dict[int, int]) -> None:
        """One item per graph input: a strategy per spec it may arrive in."""
        names = self.graph.value_names()
        for k, v in enumerate(self.graph.inputs):
            other = self.graph.outputs[tied_in[k]] if k in tied_in else None
            specs = self.tensor_specs(v, other)
            item = Item("input", k, [Strategy(format_spec(s), (), (s,)) for s in specs], value=v)
            if k in in_pins:
                _pin(item, in_pins[k], f"input %{names[v]}", PlanError)
            self.producer[v] = (len(self.items), 0)
            self.items.append(item)

    def add_nodes(self, rules: dict[Node, DimRule | None], rule_errors: dict[Node, str], linear_partials: bool) -> None:
        """One item per node, with an edge from the producer of each of its operands. Nodes with
        equal keys (repeated layers) share the strategies computed for the first of them."""
        mesh_shape = tuple(self.mesh.shape)
        strategy_cache: dict = {}
        partial: dict[Value, frozenset] = {}  # value -> the sets of axes its producer may leave P
        zero_axes = self.zero_axes()
        for n_i, node in enumerate(self.graph.nodes):
            rule = rules[node]
            arriving = tuple(partial.get(v, frozenset()) for v in node.inputs)
            if zero_axes and node in self.roles.update:  # ZeRO reduces a gradient before the update
                arriving = tuple(frozenset(s for s in sets if not s & zero_axes) for sets in arriving)
            overhead = self.op_overhead(node)
            key = _node_key(node, self.sets, self.roles)
            key = None if key is None else (key, arriving, overhead)
            strategies = strategy_cache.get(key) if key is not None else None
            if strategies is None:
                strategies = node_strategies(
                    node,
                    rule,
                    self.mesh,
                    self.sets,
                    linear_partials,
                    self.roles,
                    arriving if linear_partials else None,
                    overhead,
                )
                if zero_axes and node in self.roles.update:
                    keep = set(lowest_zero_dims([s.in_specs + s.out_specs for s in strategies], zero_axes))
                    strategies = [s for s in strategies if s.in_specs + s.out_specs in keep]
                if key is not None:
                    strategy_cache[key] = strategies
            for k, o in enumerate(node.outputs):
                axes = {frozenset(a for a, q in enumerate(st.out_specs[k]) if q == P) for st in strategies}
                partial[o] = frozenset(axes - {frozenset()})
            saved = saved_bytes(node, self.fused)
            if saved:  # the device's compiler keeps some operands or results out of memory (sharding/fusion.py)
                fused_s = full_time(node, self.mesh.profile, saved, devices=self.mesh.size)
                strategies = [dataclasses.replace(s, compute_s=fused_s / s.divided + overhead) for s in strategies]
            item = Item("node", n_i, strategies, node=node)  # shared, never mutated (pins replace it)
            if rule is None and any(d > 1 for d in mesh_shape):
                why = (
                    f"its sharding rule failed ({rule_errors[node]})" if node in rule_errors else "has no sharding rule"
                )
                item.warning = f"{node.op.name} {why}: replicated"
                self.warnings.append(f"{node.loc or '?'}: {item.warning}")
            if node.op.has(ShardingConstraint):
                _pin(item, node.attrs["spec"], f"graphc.shard at {node.loc or '?'}", PlanError, node=True)
            idx = len(self.items)
            self.items.append(item)
            for j, v in enumerate(node.inputs):
                src, out = self.producer[v]
                phase = read_phase(v.producer.part if v.producer is not None else None, node.part, self.redo_later)
                self.edges.append(Edge(src, out, idx, j, v, deferred=node.part == "update", phase=phase))
            for o in node.outputs:
                self.producer[o] = (idx, o.index)

    def add_fanouts(self) -> None:
        """A value read by several consumers gets a fan-out item between them, whose strategy is
        the one spec the value is redistributed to once (any spec a consumer reads it in, or the
        producer's): the consumers then redistribute from there. Without it every consumer
        edge pays the whole redistribution, and a gradient read by three update ops is priced
        as three all-reduces, though the lowering reduces it once (and the ILP then prefers to
        carry partial sums into each of them, which really costs three). The forward pass's
        readers and the later parts' readers of a forward value share no fan-out: the later
        parts redistribute it again (``read_phase``). With ZeRO a gradient gets a fan-out even
        with one reader (the ILP chooses all-reduce or reduce-scatter there), and a state input
        along a ZeRO axis gets none: each of its forward and backward readers gathers it afresh
        (``gathers``)."""
        reads: dict[tuple[int, int, str], list[Edge]] = {}
        for e in self.edges:
            reads.setdefault((e.src, e.src_out, e.phase), []).append(e)
        zero = self.roles.zero  # ZeRO: gradients get a fan-out, state inputs none (module doc)
        edges: list[Edge] = []
        seen: dict = {}
        made: dict[tuple, list[Strategy]] = {}  # one strategy list per distinct spec set (shared)

        def distinct(strategies: list[Strategy], side: str, k: int) -> list[tuple]:
            return distinct_specs(seen, strategies, side, k)[0]

        for (src, out, phase), group in reads.items():
            v = group[0].value
            state_input = bool(zero) and self.items[src].kind == "input" and v in zero
            if state_input:
                readers = [e.dst for e in group if self.items[e.dst].kind == "node" and not self._in_update(e)]
                self.gathers += [(src, r) for r in dict.fromkeys(readers)]  # one copy per reader
                if len(group) > 1 and any(e.deferred for e in group):  # a parameter the update reads
                    self.fanless_state[v] = v.type.nbytes
            grad = bool(zero) and self._gradient(src, group)
            if (len(group) < 2 and not grad) or state_input:
                edges += group
                continue
            specs: dict[tuple, None] = dict.fromkeys(distinct(self.items[src].strategies, "out", out))
            for e in group:
                specs.update(dict.fromkeys(distinct(self.items[e.dst].strategies, "in", e.dst_in)))
            key = tuple(specs)
            strategies = made.get(key)
            if strategies is None:
                strategies = made[key] = [Strategy(format_spec(sp), (sp,), (sp,)) for sp in key]
            f = len(self.items)
            self.items.append(Item("fanout", src, strategies, value=v, gradient=grad))
            edges.append(Edge(src, out, f, 0, v, deferred=all(e.deferred for e in group), phase=phase))
            edges += [Edge(f, 0, e.dst, e.dst_in, v, deferred=e.deferred, phase=phase) for e in group]
        self.edges = edges

    def _in_update(self, e: Edge) -> bool:
        """Whether the edge's reader is a node of the update (roles.update_nodes)."""
        node = self.items[e.dst].node
        return node is not None and node in self.roles.update

    def _gradient(self, src: int, group: list[Edge]) -> bool:
        """Whether a value made by item ``src`` and read by ``group`` is a gradient: a node of
        the backward makes it, and only update nodes read it."""
        node = self.items[src].node
        if node is None or node.part != "backward" or node in self.roles.update:
            return False
        return all(self._in_update(e) for e in group)

    def add_outputs(self, out_pins: dict[int, tuple], tied_out: dict[int, int]) -> None:
        """One item per graph output (a strategy per spec it may be returned in), with an edge
        from its producer: deferred when no node consumes the value (the loss)."""
        consumed = {v for node in self.graph.nodes for v in node.inputs}
        for k, v in enumerate(self.graph.outputs):
            other = self.graph.inputs[tied_out[k]] if k in tied_out else None
            specs = self.tensor_specs(v, other)
            item = Item("output", k, [Strategy(format_spec(s), (s,), ()) for s in specs], value=v)
            if k in out_pins:
                _pin(item, out_pins[k], f"output {k}", PlanError)
            idx = len(self.items)
            self.items.append(item)
            src, out = self.producer[v]
            self.edges.append(Edge(src, out, idx, 0, v, deferred=v not in consumed))


def _node_key(node, sets, roles: AxisRoles):
    """Nodes with equal keys have equal strategies (repeated layers): op, attributes, types, the
    block counts their values may carry, and the kinds of their dims (batch, sequence)."""
    if node.regions:
        return None
    try:
        attrs = tuple(
            sorted(
                (k, v if not hasattr(v, "tobytes") else (v.shape, v.dtype.str, v.tobytes()))
                for k, v in node.attrs.items()
            )
        )
        hash(attrs)
    except TypeError:
        return None
    values = (*node.inputs, *node.outputs)
    blocks = tuple(tuple(frozenset(x) for x in sets.get(v, ())) for v in values)
    types = (tuple(v.type for v in node.inputs), tuple(o.type for o in node.outputs))
    return (node.op.name, attrs, types, blocks, roles.key(values, node in roles.update))


def _pin(item: Item, spec, what: str, error, node: bool = False) -> None:
    want = parse_spec(spec)
    if node:
        keep = [s for s in item.strategies if s.out_specs[0] == want and s.in_specs[0] == want]
    elif item.kind == "input":
        keep = [s for s in item.strategies if s.out_specs[0] == want]
    else:
        keep = [s for s in item.strategies if s.in_specs[0] == want]
    if not keep:
        raise error(
            f"{what}: pinned spec {format_spec(want)} is not a valid even placement of {_item_type(item)} on this mesh "
            f"(choices: {', '.join(s.name if not node else format_spec(s.out_specs[0]) for s in item.strategies[:12])})"
        )
    item.strategies = keep
    item.pinned = format_spec(want)


def _item_type(item: Item) -> TensorType:
    """The type of an input or output item's value, or of a node item's first result."""
    if item.value is not None:
        return item.value.type
    assert item.node is not None  # an item without a value is a node
    return item.node.outputs[0].type


def apply_ties(problem: Problem, ties) -> None:
    """Tied input/output pairs: restrict both to the specs they share, and make the output item
    use exactly the input's candidates (a common strategy index = a common spec)."""
    if not ties:
        return
    inputs = {it.index: k for k, it in enumerate(problem.items) if it.kind == "input"}
    outputs = {it.index: k for k, it in enumerate(problem.items) if it.kind == "output"}
    for i, o in ties:
        a, b = problem.items[inputs[i]], problem.items[outputs[o]]
        specs_b = {s.in_specs[0]: s for s in b.strategies}
        keep_a = [s for s in a.strategies if s.out_specs[0] in specs_b]
        if not keep_a:
            names = problem.graph.value_names()
            raise PlanError(
                f"input %{names[problem.graph.inputs[i]]} and output {o} are the same state (a training step "
                f"returns it updated), so they need one spec, but the pins allow "
                f"{', '.join(s.name for s in a.strategies)} for the input and "
                f"{', '.join(s.name for s in b.strategies)} for the output"
            )
        a.strategies = keep_a
        b.strategies = [specs_b[s.out_specs[0]] for s in keep_a]
        problem.ties.append((inputs[i], outputs[o]))


def pin_nodes(problem: Problem, pins: dict) -> None:
    """Restrict pinned nodes to one strategy (given by name, or by its result spec)."""
    by_index = {it.index: it for it in problem.items if it.kind == "node"}
    for idx, want in pins.items():
        it = by_index.get(idx)
        if it is None:
            raise PlanError(f"plan pins node {idx}, which the graph does not have")
        keep = [s for s in it.strategies if s.name == want]
        if not keep:
            try:
                spec = parse_spec(want)
                keep = [s for s in it.strategies if s.out_specs and s.out_specs[0] == spec]
            except SpecError:
                keep = []
        if not keep:
            node = it.node
            assert node is not None  # a node item holds its node
            raise PlanError(
                f"plan pins node {idx} ({node.op.name} at {node.loc or '?'}) to {want!r}, which is not "
                f"one of its strategies: {', '.join(s.name for s in it.strategies)}"
            )
        it.strategies = keep[:1]
        it.pinned = want
