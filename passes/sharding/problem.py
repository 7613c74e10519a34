"""The auto-sharding problem of one graph on one mesh: what can be chosen, as plain values.

*Items* are what gets a strategy: every graph input (its spec), every node, every graph output
(the spec it is returned in), and fan-outs (the one spec a value read by several consumers is
redistributed to). *Edges* connect a producer item's result to a consumer item's operand
(passes/sharding/items.py). A ``Problem`` holds them with what the planner fixed about them (ties,
pins, ZeRO axes, recomputation candidates); its two models are functions of it:

    problem.costs    CostModel (costs.py): seconds of compute and redistribution of a choice
    problem.memory   MemoryModel (memory.py): bytes live on each device, peaks

With ZeRO allowed (``zero``, passes/sharding/zero.py) a gradient (a value the backward makes for
the update alone) goes through a fan-out item right after its producer, and a state input split
along a data axis gets no fan-out: each of its forward and backward readers gathers it afresh
(``gathers``). Under a memory limit a forward value's backward and update readers redistribute
it again instead of sharing the forward pass's copy (``read_phase`` in
passes/sharding/redistribute.py): every edge carries its read phase, and fan-outs are per value
and phase.

``items_and_edges`` builds a problem (passes/partition.py ``build_problem`` then applies the ties,
node pins, a forced ZeRO stage and the recomputation candidates); ``evaluate`` is the reference
the ILP is tested against (exhaustive search on small graphs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

from graphc.core.collector import collector_paused
from graphc.core.errors import PlanError
from graphc.core.ir import Graph, Node, TensorType, Value
from graphc.core.mesh import Mesh
from graphc.core.spec import P, Spec, SpecError, format_spec, parse_spec
from graphc.core.traits import Constant, IndexedLookup, ShardingConstraint, stream_position
from graphc.ops.dims import DimRule
from graphc.passes.options import PlanOptions, Zero
from graphc.passes.sharding.costs import CostModel
from graphc.passes.sharding.fusion import fused_bytes, fused_values, saved_bytes
from graphc.passes.sharding.items import Edge, Item
from graphc.passes.sharding.memory import MemoryModel, RematRanges
from graphc.passes.sharding.redistribute import read_phase
from graphc.passes.sharding.roles import AxisRoles, axis_roles
from graphc.passes.sharding.strategies import (
    Strategies,
    Strategy,
    block_sets,
    full_time,
    get_rule,
    node_strategies,
    tensor_specs,
)


@dataclass
class Problem:
    """The items and edges of a graph on a mesh, and what the planner fixed about them; ``costs``
    and ``memory`` are its models (made with it, reading its lists)."""

    graph: Graph
    mesh: Mesh
    items: list[Item]
    edges: list[Edge]
    order: list[int]  # item indices in program order
    roles: AxisRoles
    zero: Zero = 0  # ZeRO: 0 off, "auto" the solver's choice, 1-3 a forced stage (passes/sharding/zero.py)
    zero_axes: tuple[int, ...] = ()  # the data axes ZeRO may shard state along
    gathers: list[tuple[int, int]] = field(default_factory=list)  # (state input item, reader item) not in the update
    # deferred edges (gradients into the update) share buckets: the
    # bytes a bucket's fixed cost is shared by, as estimated before solving (0: no bucketing),
    # and the bucket size; the cost model keeps them (``costs.rebucket`` changes the share)
    bucket_share_bytes: InitVar[int] = 0
    bucket_limit: InitVar[int] = 0
    warnings: list[str] = field(default_factory=list)
    ties: list[tuple[int, int]] = field(default_factory=list)  # (input item, output item): same strategy index
    # items that may be recomputed (passes/recompute/choices.py): item -> its ranges when recomputed
    remat: dict[int, RematRanges] = field(default_factory=dict)
    costs: CostModel = field(init=False, repr=False)
    memory: MemoryModel = field(init=False, repr=False)
    # what the steps after building derive from the graph and the items, made once by the first to
    # ask (zero.py ``problem_groups``): the problem's graph, items and roles do not change after
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self, bucket_share_bytes: int, bucket_limit: int) -> None:
        self.costs = CostModel(self.mesh, self.items, self.edges, bucket_share_bytes, bucket_limit)
        self.memory = MemoryModel(
            self.graph, self.mesh, self.items, self.edges, self.order, self.remat, self.gathers, self.zero_axes
        )
        self.memory.bucket_bytes = bucket_limit

    def evaluate(self, choice: list[int]) -> dict:
        """The objective of ``choice`` (``CostModel.evaluate``: compute_s, comm_s, total_s) and its
        per-device ``peak_bytes`` (``MemoryModel.peak``)."""
        return {**self.costs.evaluate(choice), "peak_bytes": self.memory.peak(choice)[0]}

    def recomputed(self, choice: list[int]) -> list[int]:
        """The items ``choice`` recomputes."""
        return [i for i in self.remat if self.items[i].strategies[choice[i]].recompute]

    def recompute_allowed(self, choice: list[int]) -> bool:
        """Whether every item ``choice`` recomputes can be: what it needs recomputed is, what it
        needs kept is (the ILP's rows, passes/sharding/ilp.py ``_add_recompute_needs``)."""
        again = set(self.recomputed(choice))
        kept = {i for i in self.remat if self.items[i].strategies[choice[i]].checkpoint}  # checkpoints (issue 30)
        return all(
            set(self.remat[i].needs) <= again
            and not again & set(self.remat[i].conflicts)
            and set(self.remat[i].keeps) <= kept
            for i in again
        )


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


@dataclass(frozen=True, slots=True)
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


@collector_paused()
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
    zero_axes = tuple(a for a, (r, n) in enumerate(zip(roles.roles, mesh.shape)) if r == "data" and n > 1)
    return Problem(
        graph,
        mesh,
        b.items,
        b.edges,
        _program_order(b.items),
        roles,
        zero=zero,
        zero_axes=zero_axes if roles.zero else (),
        gathers=b.gathers if roles.zero else [],
        bucket_share_bytes=_bucket_share(b, bucket_bytes),
        bucket_limit=bucket_bytes if bucket_bytes > 0 else 0,
        warnings=b.warnings,
    )


def _bucket_share(b: _ProblemBuilder, bucket_bytes: int) -> int:
    """The bytes the deferred all-reduces move at most (whole tensors that may arrive as partial
    sums), at most ``bucket_bytes``: a bucket's fixed cost is shared by this many bytes (0: no
    buckets). A value made by the update is not a gradient."""
    if bucket_bytes <= 0:
        return 0

    partial: dict[tuple[Strategies, int], bool] = {}  # (strategies, result) -> some strategy leaves it P

    def gradient(e: Edge) -> bool:
        src = b.items[e.src]
        if src.node is not None and src.node.part == "update":  # made in the update
            return False
        key = (src.strategies, e.src_out)  # repeated layers' items share their strategies
        got = partial.get(key)
        if got is None:
            got = partial[key] = any(P in st.out_specs[e.src_out] for st in src.strategies)
        return got

    counted = {e.value: e.value.type.nbytes for e in b.edges if e.deferred and gradient(e)}
    # as their fan-outs counted them before ZeRO (an update op linear in a parameter may read it
    # as a partial sum): the estimate, and so the plans without ZeRO, stay as they were
    counted.update(b.fanless_state)
    return max(1, min(bucket_bytes, sum(counted.values())))


def _node_rules(graph: Graph) -> tuple[dict[Node, DimRule | None], dict[Node, str]]:
    """Every node's dimension rule, and why for the nodes whose rule failed: a broken rule
    replicates its op (rule None) instead of stopping the compile."""
    rules: dict[Node, DimRule | None] = {}
    rule_errors: dict[Node, str] = {}
    shared: dict = {}  # equal ops on equal types (repeated layers) share one rule and its caches
    for node in graph.nodes:
        key = _rule_key(node)
        if key is not None:
            try:
                rule = shared.get(key, _UNKNOWN)
            except TypeError:  # an attribute that does not hash
                key, rule = None, _UNKNOWN
            if rule is not _UNKNOWN:
                rules[node] = rule
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


_UNKNOWN: Any = object()  # not in a cache
SHAPE_DTYPE = attrgetter("type.shape", "type.dtype")  # a value's type as a key: (shape, dtype)


def _rule_key(node: Node):
    """What a node's dimension rule depends on (op, operand and result types, attributes), or
    None when that is more (regions, constant operands); the caller finds out whether it
    hashes."""
    if node.regions or node.op.has(IndexedLookup):
        return None
    attrs = node.attrs
    return (  # a type as its shape and dtype: equal when the type is, hashed and compared without Python
        node.op.name,
        tuple(map(SHAPE_DTYPE, node.inputs)),
        tuple(map(SHAPE_DTYPE, node.outputs)),
        tuple(sorted([(k, type(v).__name__, v) for k, v in attrs.items()])) if attrs else (),
    )


def _program_order(items: list[Item]) -> list[int]:
    """Item indices in program order: the graph inputs, the nodes, then the graph outputs; a
    fan-out right after the item whose value it spreads (``Item.index`` of a fan-out)."""
    after: dict[int, list[int]] = {}
    of_kind: dict[str, list[int]] = {"input": [], "node": [], "output": []}
    for i, it in enumerate(items):
        if it.kind == "fanout":
            after.setdefault(it.index, []).append(i)
        elif it.kind in of_kind:
            of_kind[it.kind].append(i)
    order: list[int] = []
    for kind in ("input", "node", "output"):
        for i in of_kind[kind]:
            order.append(i)
            spread = after.get(i)
            if spread:
                order += spread
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
    # the specs of a graph input or output by what they depend on (``tensor_specs``): repeated layers'
    # parameters and their state have a few kinds
    specs_of: dict[tuple, tuple[tuple, ...]] = field(default_factory=dict)

    def op_overhead(self, node: Node) -> float:
        """``overhead_s`` for a node the device program runs as an op of its own: not a constant,
        and not an elementwise node whose results all stay inside one fused kernel (it is a part
        of its consumer's op)."""
        if not self.overhead_s or node.op.has(Constant):
            return 0.0
        outputs = node.outputs
        if outputs and self.in_kernels.issuperset(outputs):
            return 0.0
        return self.overhead_s

    def tensor_specs(self, v: Value, other: Value | None) -> tuple[tuple, tuple[tuple, ...]]:
        """The specs of a graph input / output, and what they depend on (a key: equal keys, equal
        specs); a tied pair's block counts are merged, so both get the same candidates."""
        blocks = [set(s) for s in self.sets.get(v, [{1} for _ in v.type.shape])]
        if other is not None:
            for d, s in enumerate(self.sets.get(other, [])):
                blocks[d] |= s
        roles = self.roles
        mesh_shape = tuple(self.mesh.shape)
        allowed = tuple([roles.allows(a, v, d) for a in range(len(mesh_shape)) for d in range(v.type.ndim)])
        key = (v.type, tuple([frozenset(b) for b in blocks]), allowed, v in roles.zero)
        known = self.specs_of.get(key)
        if known is not None:
            return key, known
        ndim = v.type.ndim
        specs = tensor_specs(v.type, mesh_shape, blocks, lambda a, d: allowed[a * ndim + d])
        if v in roles.zero:
            specs = [sp for (sp,) in lowest_zero_dims([(sp,) for sp in specs], self.zero_axes())]
        known = self.specs_of[key] = tuple(specs)
        return key, known

    def zero_axes(self) -> frozenset[int]:
        """The data axes along which ZeRO may split state (none unless it is on)."""
        if not self.roles.zero:
            return frozenset()
        return frozenset(a for a, (r, n) in enumerate(zip(self.roles.roles, self.mesh.shape)) if r == "data" and n > 1)

    def add_inputs(self, in_pins: dict[int, tuple], tied_in: dict[int, int]) -> None:
        """One item per graph input: a strategy per spec it may arrive in."""
        names: dict | None = None  # made for a pinned input's message only (a walk over the graph)
        made: dict[tuple, Strategies] = {}  # specs -> their strategies, each input a twin (shared specs)
        by_key: dict[tuple, Strategies] = {}  # ``tensor_specs``' key -> made[its specs] (a key hashes faster)
        for k, v in enumerate(self.graph.inputs):
            other = self.graph.outputs[tied_in[k]] if k in tied_in else None
            key, specs = self.tensor_specs(v, other)
            proto = by_key.get(key)
            if proto is None:
                proto = made.get(specs)
                if proto is None:
                    proto = made[specs] = Strategies(
                        Strategy(name=format_spec(s), in_specs=(), out_specs=(s,)) for s in specs
                    )
                by_key[key] = proto
            strategies = proto.twin()
            item = Item(kind="input", index=k, strategies=strategies, value=v)
            if k in in_pins:
                names = self.graph.value_names() if names is None else names
                _pin(item, in_pins[k], f"input %{names[v]}", PlanError)
            self.producer[v] = (len(self.items), 0)
            self.items.append(item)

    def add_nodes(self, rules: dict[Node, DimRule | None], rule_errors: dict[Node, str], linear_partials: bool) -> None:
        """One item per node, with an edge from the producer of each of its operands. Nodes with
        equal keys (repeated layers) share the strategies computed for the first of them."""
        mesh_shape = tuple(self.mesh.shape)
        # key -> (the strategies, per result the sets of axes some strategy leaves it P)
        strategy_cache: dict[Any, tuple[Strategies, list[frozenset]]] = {}
        fused_cache: dict = {}  # (key's strategies, bytes fusion saves) -> the strategies at the fused time
        partial: dict[Value, frozenset] = {}  # value -> the sets of axes its producer may leave P
        zero_axes = self.zero_axes()
        numbering = _ValueKeys(self.sets, self.roles)
        value_keys = (numbering.for_update(False), numbering.for_update(True))
        arrays = ArrayTokens()
        update = self.roles.update
        producer, items, edges = self.producer, self.items, self.edges
        fused = fused_bytes(self.fused)  # each value's bytes once, not per use
        phases: dict[str | None, dict[str | None, str]] = {}  # reader's part -> value's part -> read_phase
        redo_later, none = self.redo_later, frozenset[frozenset[int]]()
        reduced: dict[frozenset, frozenset] = {}  # ``_reduced_along``'s cache
        for n_i, node in enumerate(self.graph.nodes):
            rule = rules[node]
            in_update = node in update
            inputs = node.inputs
            arriving = tuple(map(partial.get, inputs, repeat(none)))
            if zero_axes and in_update:  # ZeRO reduces a gradient before the update
                arriving = _reduced_along(arriving, zero_axes, reduced)
            overhead = self.op_overhead(node)
            key = _node_key(node, value_keys[in_update], arrays)
            key = None if key is None else (key, arriving, overhead)
            known = strategy_cache.get(key) if key is not None else None
            if known is None:
                found = node_strategies(
                    node,
                    rule,
                    self.mesh,
                    self.sets,
                    linear_partials,
                    self.roles,
                    arriving if linear_partials else None,
                    overhead,
                )
                if zero_axes and in_update:
                    keep = set(lowest_zero_dims([s.in_specs + s.out_specs for s in found], zero_axes))
                    found = [s for s in found if s.in_specs + s.out_specs in keep]
                strategies = Strategies(found)
                known = (strategies, _left_partial(strategies, len(node.outputs)))
                if key is not None:
                    strategy_cache[key] = known
            strategies = known[0]
            outputs = node.outputs
            partial.update(zip(outputs, known[1]))
            saved = saved_bytes(node, fused) if fused else 0
            if saved:  # the device's compiler keeps some operands or results out of memory (sharding/fusion.py)
                strategies = self._fused(node, strategies, saved, overhead, key, fused_cache)
            item = Item(kind="node", index=n_i, strategies=strategies, node=node)  # strategies shared with equal nodes
            if rule is None and any(d > 1 for d in mesh_shape):
                why = (
                    f"its sharding rule failed ({rule_errors[node]})" if node in rule_errors else "has no sharding rule"
                )
                item.warning = f"{node.op.name} {why}: replicated"
                self.warnings.append(f"{node.loc or '?'}: {item.warning}")
            if node.op.has(ShardingConstraint):
                _pin(item, node.attrs["spec"], f"graphc.shard at {node.loc or '?'}", PlanError, node=True)
            idx = len(items)
            items.append(item)
            part = node.part
            deferred = part == "update"
            phase_of = phases.get(part)
            if phase_of is None:
                phase_of = phases[part] = {}
            for j, v in enumerate(inputs):
                src, out = producer[v]
                made_by = v.producer.part if v.producer is not None else None
                phase = phase_of.get(made_by)
                if phase is None:
                    phase = phase_of[made_by] = read_phase(made_by, part, redo_later)
                edges.append(Edge(src=src, src_out=out, dst=idx, dst_in=j, value=v, deferred=deferred, phase=phase))
            for o in outputs:
                producer[o] = (idx, o.index)

    def _fused(self, node: Node, strategies: Strategies, saved: int, overhead: float, key, cache: dict) -> Strategies:
        """``strategies`` at the time of the fused kernel, which keeps ``saved`` bytes out of memory.
        The times are made once per (node key, saved): equal keys are equal ops, attributes and
        types, so equal times. Each node still gets a Strategies object of its own (a twin), as
        before the times were shared: the ILP's tables, and so its tie-breaking, stay as they were.
        (``cache`` is keyed by the key's strategies object, one per key: a key hashes slower.)"""
        fused = cache.get((strategies, saved)) if key is not None else None
        if fused is None:
            fused_s = full_time(node, self.mesh.profile, saved, devices=self.mesh.size)
            fused = Strategies(dataclasses.replace(s, compute_s=fused_s / s.divided + overhead) for s in strategies)
            if key is not None:
                cache[(strategies, saved)] = fused
        return fused.twin()

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
            at = (e.src, e.src_out, e.phase)
            group = reads.get(at)
            if group is None:
                reads[at] = [e]
            else:
                group.append(e)
        zero = self.roles.zero  # ZeRO: gradients get a fan-out, state inputs none (module doc)
        items = self.items
        edges: list[Edge] = []
        made: dict[tuple, Strategies] = {}  # one strategy list per distinct spec set (shared)
        spread: dict[tuple, Strategies] = {}  # the DistinctSpecs of a value's producer and readers -> made[spec set]

        for (src, out, phase), group in reads.items():
            if not zero and len(group) < 2:  # one reader, no ZeRO: no fan-out
                edges += group
                continue
            v = group[0].value
            state_input = bool(zero) and items[src].kind == "input" and v in zero
            if state_input:
                readers = [e.dst for e in group if items[e.dst].kind == "node" and not self._in_update(e)]
                self.gathers += [(src, r) for r in dict.fromkeys(readers)]  # one copy per reader
                if len(group) > 1 and any(e.deferred for e in group):  # a parameter the update reads
                    self.fanless_state[v] = v.type.nbytes
            grad = bool(zero) and self._gradient(src, group)
            if (len(group) < 2 and not grad) or state_input:
                edges += group
                continue
            ends = (
                items[src].strategies.specs("out", out),
                *[items[e.dst].strategies.specs("in", e.dst_in) for e in group],
            )
            strategies = spread.get(ends)  # (DistinctSpecs hash by identity: fast, where specs do not)
            if strategies is None:  # the specs of both ends in first-seen order, once per (shared) ends
                specs: dict[tuple, None] = dict.fromkeys(ends[0].specs)
                for ds in ends[1:]:
                    specs.update(dict.fromkeys(ds.specs))
                key = tuple(specs)
                strategies = made.get(key)
                if strategies is None:
                    strategies = made[key] = Strategies(
                        Strategy(name=format_spec(sp), in_specs=(sp,), out_specs=(sp,)) for sp in key
                    )
                spread[ends] = strategies
            f = len(self.items)
            self.items.append(Item(kind="fanout", index=src, strategies=strategies, value=v, gradient=grad))
            deferred = all(e.deferred for e in group)
            edges.append(Edge(src=src, src_out=out, dst=f, dst_in=0, value=v, deferred=deferred, phase=phase))
            for e in group:  # the readers read the fan-out (the builder's own edges: changed, not made again)
                e.src, e.src_out = f, 0
            edges += group
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
        from its producer. The edge is never deferred: a returned value's all-reduce (the loss)
        runs alone, never in a gradient bucket (passes/bucket.py), so it is priced alone."""
        made: dict[tuple, Strategies] = {}  # specs -> their strategies, each output a twin (shared specs)
        by_key: dict[tuple, Strategies] = {}  # ``tensor_specs``' key -> made[its specs] (a key hashes faster)
        for k, v in enumerate(self.graph.outputs):
            other = self.graph.inputs[tied_out[k]] if k in tied_out else None
            key, specs = self.tensor_specs(v, other)
            proto = by_key.get(key)
            if proto is None:
                proto = made.get(specs)
                if proto is None:
                    proto = made[specs] = Strategies(
                        Strategy(name=format_spec(s), in_specs=(s,), out_specs=()) for s in specs
                    )
                by_key[key] = proto
            strategies = proto.twin()
            item = Item(kind="output", index=k, strategies=strategies, value=v)
            if k in out_pins:
                _pin(item, out_pins[k], f"output {k}", PlanError)
            idx = len(self.items)
            self.items.append(item)
            src, out = self.producer[v]
            self.edges.append(Edge(src=src, src_out=out, dst=idx, dst_in=0, value=v))


def _reduced_along(arriving: tuple[frozenset, ...], axes: frozenset[int], cache: dict) -> tuple[frozenset, ...]:
    """Per operand, the sets of axes it may arrive partial along (``arriving``) less those that
    meet ``axes``: what is left once ZeRO reduces a gradient along them. Each distinct set of sets
    is filtered once (``cache``: repeated layers' update nodes read the same ones)."""
    for sets in arriving:
        if sets not in cache:
            cache[sets] = frozenset(s for s in sets if not s & axes)
    return tuple(map(cache.__getitem__, arriving))


def _left_partial(strategies: Strategies, n_out: int) -> list[frozenset]:
    """Per result: the sets of mesh axes some strategy leaves it partial (P) along (made once per
    node key: ``add_nodes`` keeps them with the strategies)."""
    sets_of = []
    for k in range(n_out):
        axes = {frozenset(a for a, q in enumerate(st.out_specs[k]) if q == P) for st in strategies}
        sets_of.append(frozenset(axes - {frozenset()}))
    return sets_of


def _node_key(node, value_keys, arrays: ArrayTokens):
    """Nodes with equal keys have equal strategies (repeated layers): op, attributes (but those
    that only place a random draw in its stream; an array by ``arrays``), and per operand and
    result what ``value_keys(node)`` numbers: its type, the block counts it may carry and the
    kinds of its dims (batch, sequence; ``AxisRoles.value_key``)."""
    if node.regions:
        return None
    attrs: tuple = ()
    if node.attrs:
        skip = stream_position(node)
        try:
            attrs = tuple(
                sorted(
                    [(k, v if not hasattr(v, "tobytes") else arrays(v)) for k, v in node.attrs.items() if k not in skip]
                )
            )
            hash(attrs)
        except TypeError:
            return None
    return (node.op.name, attrs, len(node.inputs), value_keys(node))


class ArrayTokens:
    """Arrays (and numpy scalars) as small hashable tokens, (shape, dtype, number): equal when
    their shapes, dtypes and bytes are. An array's bytes are compared only with those of the
    arrays of its shape and dtype seen before (a causal mask of 8 MB is neither copied nor
    hashed when no other array has its shape)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, list] = {}

    def __call__(self, a) -> tuple:
        kind = (a.shape, a.dtype.str)
        seen = self.seen.setdefault(kind, [])
        for k, b in enumerate(seen):
            if b is a or a.tobytes() == b.tobytes():
                return (*kind, k)
        seen.append(a)
        return (*kind, len(seen) - 1)


class _ValueKeys:
    """``_node_key``'s per-value part, numbered: values of one type, block counts and dim kinds
    get one number (made once per value; a node key is then a short tuple of integers, cheap to
    hash however often repeated layers look it up). ``for_update(u)``: the numbers of an update
    node's operands and results (``u``) or another node's, both from one count."""

    def __init__(self, sets: dict[Value, list[set[int]]], roles: AxisRoles) -> None:
        self.sets, self.roles = sets, roles
        self.numbers: dict[tuple, int] = {}
        self.of: tuple[dict[Value, int], dict[Value, int]] = ({}, {})

    def for_update(self, update: bool):
        of, sets, roles, numbers = self.of[update], self.sets, self.roles, self.numbers

        def number(v: Value) -> int:
            t = v.type  # as its shape and dtype: equal when the type is, hashed and compared without Python
            blocks = sets.get(v)
            key = (t.shape, t.dtype, tuple(map(frozenset, blocks)) if blocks else (), roles.value_key(v, update))
            got = of[v] = numbers.setdefault(key, len(numbers))
            return got

        def node_numbers(node: Node) -> tuple[int, ...]:
            """The numbers of the node's operands, then of its results (new values: numbered here)."""
            get = of.get
            ins: list[int | None] = list(map(get, node.inputs))
            out: list = [number(v) if k is None else k for v, k in zip(node.inputs, ins)] if None in ins else ins
            out.extend(map(number, node.outputs))
            return tuple(out)

        return node_numbers


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
    item.strategies = Strategies(keep)
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
    # (the two ends' strategy tuples' ids) -> (their new strategies, each pair twins of these; the tuples)
    made: dict[tuple[int, int], tuple[Strategies, Strategies, tuple, tuple]] = {}
    for i, o in ties:
        a, b = problem.items[inputs[i]], problem.items[outputs[o]]
        key = (id(a.strategies.as_tuple), id(b.strategies.as_tuple))
        got = made.get(key)
        if got is None:
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
            new_a, new_b = Strategies(keep_a), Strategies(specs_b[s.out_specs[0]] for s in keep_a)
            got = made[key] = (new_a, new_b, a.strategies.as_tuple, b.strategies.as_tuple)  # tuples kept: ids
        a.strategies, b.strategies = got[0].twin(), got[1].twin()
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
        it.strategies = Strategies(keep[:1])
        it.pinned = want
