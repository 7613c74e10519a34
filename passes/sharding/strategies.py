"""Sharding strategies of one node, derived from its op's dimension rule (graphc/ops/dims.py).

A strategy picks, for every mesh axis, either nothing (replicate the work along that axis) or one
label of the rule with a block count; operands and results then get the specs the rule implies.
Only even splits are generated (a dim of size s splits over n devices in b blocks iff
s % (b n) == 0), no label is used on two axes, and no dim is split over two axes. An op with no
rule (control flow, or a rule returning None) gets the single all-replicated strategy and a
warning that says so.

``block_sets`` is a small dataflow analysis that finds which block counts each tensor dim can
carry (1 everywhere, 3 along the fused QKV dims of a GPT, ...), so strategies with blocked
splits are generated only where some op can use them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import overload

import numpy as np

from graphc.core.ir import Graph, TensorType, Value, walk
from graphc.core.spec import P, Placement, R, S, Spec, format_spec, local_shape
from graphc.core.traits import Constant, Contraction, Fused, IndexedLookup, LinearIn
from graphc.ops.dims import MAX_BLOCKS, DimRule, default_cost, linear_operands
from graphc.ops.linalg import einsum, parse_equation
from graphc.passes.sharding.roles import RESTRICTED, AxisRoles


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    name: str
    in_specs: tuple[tuple[Placement, ...], ...]
    out_specs: tuple[tuple[Placement, ...], ...]
    compute_s: float = 0.0
    divided: int = 1  # number of pieces the work is divided into
    recompute: bool = False  # run again before the backward pass reads it (passes/recompute/choices.py)
    checkpoint: bool = False  # kept until a later segment's recomputation reads it (passes/recompute/segments.py)

    def describe(self) -> str:
        ins = ", ".join(format_spec(s) for s in self.in_specs)
        outs = ", ".join(format_spec(s) for s in self.out_specs)
        return f"{self.name}: ({ins}) -> ({outs})"


class DistinctSpecs:
    """The distinct specs of one operand or result over a list of strategies, in first-seen order,
    and the position of each strategy's spec among them (``index``): an edge's cost table is
    made between distinct specs. Compared by identity: the strategies it was made from keep it."""

    __slots__ = ("index", "specs")

    def __init__(self, specs: list[Spec]) -> None:
        position: dict[Spec, int] = {}
        for spec in specs:
            position.setdefault(spec, len(position))
        self.specs: tuple[Spec, ...] = tuple(position)
        self.index: np.ndarray = np.array([position[spec] for spec in specs], dtype=np.int64)


class Strategies:
    """The strategies of one item of the sharding problem, in order, and what the cost model reads
    of them, each made once: the compute time of every strategy and the distinct specs of every
    operand and result (``specs``). Items with equal strategies (the nodes of repeated layers) share
    one object, so its tables are made once for all of them. Immutable: a pin, a tie or a ZeRO
    stage gives an item a new object with the strategies it keeps."""

    __slots__ = ("_all", "_compute", "_specs", "_times")

    def __init__(self, strategies: Iterable[Strategy]) -> None:
        self._all: tuple[Strategy, ...] = tuple(strategies)
        self._compute: np.ndarray | None = None
        self._specs: dict[tuple[str, int], DistinctSpecs] = {}
        self._times: list[np.ndarray] | None = None  # the compute times once made, shared with the twins

    def twin(self) -> Strategies:
        """A new object with the same strategies, sharing their distinct specs (``specs``, made
        once for both) but not the compute-time array: an item whose strategies equal another's
        but must stay an object of its own (the ILP tells its terms apart by object,
        passes/sharding/ilp.py ``_edge_sums``)."""
        other = Strategies.__new__(Strategies)  # made per node of repeated layers: no __init__ to undo
        other._all = self._all
        other._compute = None
        other._specs = self._specs
        if self._times is None:
            self._times = [] if self._compute is None else [self._compute]
        other._times = self._times
        return other

    def __len__(self) -> int:
        return len(self._all)

    @overload
    def __getitem__(self, i: int) -> Strategy: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Strategy, ...]: ...

    def __getitem__(self, i: int | slice) -> Strategy | tuple[Strategy, ...]:
        return self._all[i]

    def __iter__(self) -> Iterator[Strategy]:
        return iter(self._all)

    @property
    def as_tuple(self) -> tuple[Strategy, ...]:
        """The strategies as one tuple: objects made from one tuple (equal nodes' fused kernels,
        problem.py ``_fused``) hold that very tuple, so equal ``id`` means equal strategies."""
        return self._all

    def __repr__(self) -> str:
        return f"Strategies({', '.join(s.name for s in self._all)})"

    @property
    def compute_times(self) -> np.ndarray:
        """The compute time of every strategy (seconds): an array of this object's own (a twin's
        holds the same values, made once for all twins and copied)."""
        if self._compute is None:
            if self._times is None:  # no twin
                self._compute = np.array([s.compute_s for s in self._all])
                return self._compute
            if not self._times:
                self._times.append(np.array([s.compute_s for s in self._all]))
            self._compute = self._times[0].copy()
        return self._compute

    def specs(self, side: str, k: int) -> DistinctSpecs:
        """The distinct specs of result ``k`` (side "out") or operand ``k`` (side "in")."""
        got = self._specs.get((side, k))
        if got is None:
            got = self._specs[(side, k)] = DistinctSpecs(
                [s.out_specs[k] if side == "out" else s.in_specs[k] for s in self._all]
            )
        return got


def _rule_args(node) -> tuple[tuple, tuple, dict]:
    attrs = dict(node.attrs)
    if node.regions:
        attrs["regions"] = node.regions
    if node.op.has(IndexedLookup):
        attrs["iota"] = _iota_operands(node)
    return tuple(v.type for v in node.inputs), tuple(o.type for o in node.outputs), attrs


def _iota_operands(node) -> dict[int, int]:
    """{index array j: broadcast dim} for index operands of a gather/scatter_add that are constant
    ``arange`` along one dim (``x[np.arange(n), labels]``)."""
    lookup = node.op.trait(IndexedLookup)
    idx = node.inputs[1 : 1 + lookup.index_count(len(node.inputs))]
    nb = max(v.type.ndim for v in idx)
    found = {}
    for j, v in enumerate(idx):
        p = v.producer
        if p is None or not p.op.has(Constant) or v.type.size < 2:
            continue
        value = p.attrs["value"]
        long = [d for d, n in enumerate(value.shape) if n != 1]
        if len(long) == 1 and np.array_equal(value.reshape(-1), np.arange(value.size)):
            found[j] = nb - value.ndim + long[0]
    return found


def get_rule(node) -> DimRule | None:
    """The node's dimension rule; None when its op has none (control flow) or declines."""
    rule_fn = node.op.dim_rule
    if rule_fn is None:
        return None
    in_types, out_types, attrs = _rule_args(node)
    return rule_fn(in_types, out_types, **attrs)


def compute_time(node, divided: int, profile, devices: int = 1, overhead_s: float = 0.0) -> float:
    """Roofline time of the node's share of work on one device of a mesh of ``devices``, plus the
    runtime's ``overhead_s`` for running it (``MachineProfile.op_overhead``)."""
    return full_time(node, profile, devices=devices) / divided + overhead_s


def full_time(node, profile, saved_bytes: int = 0, devices: int = 1, local: tuple | None = None) -> float:
    """Roofline seconds of the whole node on one device: flops at the compute rate or bytes at
    memory bandwidth, less the ``saved_bytes`` fusion keeps out of memory (sharding/fusion.py).

    A contraction runs at the profile's matmul rate for its operands' dtype and the size class of
    one of its matrix products (``matrix_products``; ``local``: the (operand, result) types one
    device holds, whose products set the class), a fused kernel at the dtype's peak, other ops at
    1/8 of the peak. On a mesh of ``devices`` threads sharing a machine's cores, each device gets
    its share of the rates (``MachineProfile.device_share``, ``concurrent_bandwidth``)."""
    in_types, out_types, attrs = _rule_args(node)
    flops, nbytes = (node.op.cost or default_cost)(in_types, out_types, **attrs)
    dtype = (in_types or out_types)[0].dtype if in_types or out_types else np.float32
    if node.op.has(Contraction):
        matrices, work = matrix_products(node, *(local or (in_types, out_types)))
        rate = profile.matmul_rate(dtype, work, matrices > 1)
    else:
        peak = profile.matmul_rate(dtype)
        rate = peak if node.op.has(Fused) else peak / 8
    rate *= profile.device_share(devices)
    return max(flops / rate, max(nbytes - saved_bytes, 0) / profile.concurrent_bandwidth(devices))


def matrix_products(node, in_types, out_types) -> tuple[int, float]:
    """(number of matrix products, m n k of each) of a contraction on these operand types: a
    batched matmul is one product per leading index of its result (numpy calls BLAS once per
    matrix, broadcasting a 2-D weight); an einsum's products are indexed by the labels its
    operands and result share."""
    out = out_types[0]
    if node.op is einsum:
        ins, out_labels = parse_equation(node.attrs["equation"], len(in_types))
        sizes = {c: n for spec, t in zip(ins, in_types) for c, n in zip(spec, t.shape)}
        batch = [c for c in out_labels if all(c in spec for spec in ins)]
        matrices = math.prod(sizes[c] for c in batch)
        return matrices, math.prod(sizes.values()) / max(matrices, 1)
    k = in_types[0].shape[-1] if in_types and in_types[0].ndim else 1
    matrices = math.prod(out.shape[:-2]) if out.ndim > 2 else 1
    return matrices, out.size / max(matrices, 1) * k


def block_sets(graph: Graph, rules: dict) -> dict[Value, list[set[int]]]:
    """For every value, per dim, the block counts a split of it may carry: 1, and what labels
    with block factors (a fused QKV reshape) carry to the dims they share, to a fixpoint. A
    worklist visits only the labels whose dims changed (the 48-layer LLaMA has 16k nodes, and
    all but a few hundred of their labels only ever carry 1): a label of a node is a *group*
    (the node's position, the label's), whose places are found when it is visited, and the
    groups a changed dim is in are found through the nodes that read or make its value. Only
    the values of visited groups get an entry."""
    sets: dict[Value, list[set[int]]] = {}

    def get(v: Value) -> list[set[int]]:
        if v not in sets:
            sets[v] = [{1} for _ in v.type.shape]
        return sets[v]

    nodes, touching, work = _label_index(graph, rules)

    def places_of(g: tuple[int, int]) -> list[tuple[Value, int, int]]:
        node, labels = nodes[g[0]]
        return [(node.inputs[i] if side == "in" else node.outputs[i], d, f) for side, i, d, f in labels[g[1]]]

    queued = set(work)
    while work:
        g = work.pop()
        queued.discard(g)
        places = places_of(g)
        base = set()
        for v, d, f in places:
            base |= {b // f for b in get(v)[d] if b % f == 0}
        for v, d, f in places:
            size = v.type.shape[d]
            new = {b * f for b in base if b * f <= MAX_BLOCKS and size % (b * f) == 0}
            if not new <= get(v)[d]:
                get(v)[d] |= new
                for h in _groups_at(nodes, touching[v], v, d):
                    if h != g and h not in queued:
                        queued.add(h)
                        work.append(h)
    return sets


def _label_index(graph: Graph, rules: dict) -> tuple[list[tuple], dict[Value, list[int]], list[tuple[int, int]]]:
    """``block_sets``' index: the nodes with a rule (each with, per label of its rule, its (side,
    index, dim, factor)s), the positions of the nodes reading or making each value, and the
    groups (node position, label position) of the labels with a factor over 1."""
    nodes: list[tuple] = []
    touching: dict[Value, list[int]] = {}
    work: list[tuple[int, int]] = []
    by_label: dict[int, tuple] = {}  # id(rule) -> (rule, its labels' places, the labels with a factor > 1)
    for node in walk(graph.nodes):
        rule = rules.get(node)
        if rule is None:
            continue
        known = by_label.get(id(rule))  # equal nodes share a rule: mostly known
        labels, factored = known[1:] if known is not None and known[0] is rule else _label_groups(rule, by_label)
        k = len(nodes)
        nodes.append((node, labels))
        for v in (*node.inputs, *node.outputs):
            at = touching.get(v)
            if at is None:
                touching[v] = [k]
            elif at[-1] != k:  # a node reading a value twice is listed once
                at.append(k)
        if factored:
            work += [(k, j) for j in factored]
    return nodes, touching, work


def _groups_at(nodes: list[tuple], at: list[int], v: Value, d: int) -> list[tuple[int, int]]:
    """The groups (node position, label position) with dim ``d`` of ``v`` among their places, of
    the nodes at positions ``at``, in order."""
    found = []
    for k in at:
        node, labels = nodes[k]
        ins, outs = node.inputs, node.outputs
        for j, places in enumerate(labels):
            for side, i, e, _f in places:
                if e == d and (ins[i] if side == "in" else outs[i]) is v:
                    found.append((k, j))
                    break
    return found


def _label_groups(rule, cache: dict[int, tuple]) -> tuple[list[list[tuple[str, int, int, int]]], list[int]]:
    """Per label of ``rule``: its (side, index, dim, factor)s; and the positions of the labels
    with a factor over 1; made once per rule object (equal nodes share theirs) and kept in ``cache``."""
    known = cache.get(id(rule))
    if known is None or known[0] is not rule:
        occ: dict[str, list[tuple[str, int, int, int]]] = {}
        for side, i, d, label, f in rule.occurrences():
            occ.setdefault(label, []).append((side, i, d, f))
        labels = list(occ.values())
        factored = [j for j, o in enumerate(labels) if any(f > 1 for *_x, f in o)]
        known = cache[id(rule)] = (rule, labels, factored)
    return known[1], known[2]


def tensor_specs(
    t: TensorType, mesh_shape: tuple[int, ...], blocks: list[set[int]] | None = None, allows=None
) -> list[tuple]:
    """All valid specs of a graph input/output: per axis R or an even S(d, b); no P.
    ``allows(axis, dim)``: whether the axis's role lets it split that dim (default: always)."""
    per_axis = []
    for a, n in enumerate(mesh_shape):
        opts: list[Placement] = [R]
        if n > 1:
            for d, size in enumerate(t.shape):
                if allows is not None and not allows(a, d):
                    continue
                for b in sorted(blocks[d] if blocks else {1}):
                    if size % (b * n) == 0:
                        opts.append(S(d, b))
        per_axis.append(opts)
    out = []
    for combo in itertools.product(*per_axis):
        dims = [p.dim for p in combo if p.is_split]
        if len(dims) == len(set(dims)):
            out.append(tuple(combo))
    return out


def replicated(node, mesh_shape, profile, overhead_s: float = 0.0) -> Strategy:
    rep = tuple(R for _ in mesh_shape)
    return Strategy(
        name="replicate",
        in_specs=tuple(rep for _ in node.inputs),
        out_specs=tuple(rep for _ in node.outputs),
        compute_s=compute_time(node, 1, profile, math.prod(mesh_shape), overhead_s),
        divided=1,
    )


def node_strategies(
    node,
    rule: DimRule | None,
    mesh,
    sets: dict[Value, list[set[int]]],
    linear_partials: bool = False,
    roles: AxisRoles | None = None,
    arriving: tuple[frozenset, ...] | None = None,
    overhead_s: float = 0.0,
) -> list[Strategy]:
    """The node's strategies on ``mesh``. ``linear_partials`` carries partial sums through the
    ops linear in them (``_linear_partials``). ``roles`` (passes/sharding/roles.py) keeps data
    and seq axes to batch and sequence dims. ``overhead_s``: the runtime's cost of running the
    node as one op of a device program, added to every strategy."""
    mesh_shape = tuple(mesh.shape)
    profile = mesh.profile
    if rule is None:
        base = [replicated(node, mesh_shape, profile, overhead_s)]
    else:
        base = _rule_strategies(node, rule, mesh, sets, roles, overhead_s)
    return base + _linear_partials(node, base, mesh, arriving) if linear_partials else base


def _linear_partials(node, base: list[Strategy], mesh, arriving: tuple[frozenset, ...] | None = None) -> list[Strategy]:
    """Partial sums carried: for each strategy leaving mesh axes unused (R everywhere on them)
    and each operand set the op is linear in (dims.linear_operands), the same strategy with
    those operands and the results P on one unused axis, or on all of them. ``P + P`` stays
    ``P``, and so do ``-P``, ``P * R``, ``sum(P)``, ``P.T`` and ``reshape(P)``: the devices
    apply the op to their pieces, and the sum of the results is the op of the sum. The work is
    the base strategy's. Named ``<base> linear{k}@<axis>`` (``linear{k}@<axis>`` on a replicated
    base: micro-batching looks for the prefix). ``arriving``: per operand, the sets of axes its
    producer may leave it partial on; a variant is made only when one of its P operands can
    arrive so (turning every operand partial by zeroing gains nothing over reducing after)."""
    linear = linear_operands(node)
    # on a mesh of several axes each P variant multiplies the node's strategies: only the ops
    # where a partial value meets another or is rescaled carry them (LinearIn.on_meshes)
    if not linear or node.regions or (mesh.ndim > 1 and not node.op.trait(LinearIn).on_meshes):
        return []
    names = mesh.axis_names
    seen = {(st.in_specs, st.out_specs) for st in base}
    out = []
    for st in base:
        unused = [
            a for a, n in enumerate(mesh.shape) if n > 1 and all(spec[a] == R for spec in st.in_specs + st.out_specs)
        ]
        subsets = [(a,) for a in unused] + ([tuple(unused)] if len(unused) > 1 else [])
        for axes in subsets:
            for k, ops in enumerate(linear):
                if arriving is not None and not any(
                    any(set(axes) <= got for got in arriving[i]) for i in ops if i < len(arriving)
                ):
                    continue
                ins = tuple(
                    tuple(P if a in axes and i in ops else p for a, p in enumerate(spec))
                    for i, spec in enumerate(st.in_specs)
                )
                outs = tuple(tuple(P if a in axes else p for a, p in enumerate(spec)) for spec in st.out_specs)
                if (ins, outs) in seen:
                    continue
                seen.add((ins, outs))
                tag = " ".join(f"linear{k}@{names[a]}" for a in axes)
                name = tag if st.name == "replicate" else f"{st.name} {tag}"
                out.append(
                    Strategy(name=name, in_specs=ins, out_specs=outs, compute_s=st.compute_s, divided=st.divided)
                )
    return out


_Occurrences = dict[str, list[tuple[str, int, int, int]]]  # label -> (side, operand / result, dim, factor)
_Choice = tuple[str, int] | None  # per mesh axis: nothing, or (label, base block count)


def _rule_strategies(
    node,
    rule: DimRule,
    mesh,
    sets: dict[Value, list[set[int]]],
    roles: AxisRoles | None = None,
    overhead_s: float = 0.0,
) -> list[Strategy]:
    """One strategy per distinct placement the rule allows: every combination of a choice per
    mesh axis (nothing, or a label with a block count the axis's role allows) that splits evenly
    and uses no label twice."""
    mesh_shape = tuple(mesh.shape)
    profile = mesh.profile
    occ = _label_occurrences(rule)
    choices = _label_choices(node, rule, occ, sets)
    per_axis = [_allowed_choices(node, occ, choices, roles, a) for a in range(len(mesh_shape))]
    full = full_time(node, profile, devices=mesh.size)
    # a contraction's rate depends on the size of the products one device runs (its local shapes)
    sized = node.op.has(Contraction) and bool(profile.matmul_table)
    strategies: list[Strategy] = []
    seen: set[tuple[tuple, tuple]] = set()
    for combo in itertools.product(*per_axis):
        used = [c[0] for c in combo if c is not None]
        if len(used) != len(set(used)):
            continue
        placed = _combo_specs(node, rule, occ, combo, mesh_shape)
        if placed is None:
            continue
        key, divided = placed
        if key in seen:
            continue
        seen.add(key)
        name = _strategy_name(combo, mesh.axis_names)
        t = full_time(node, profile, devices=mesh.size, local=_local_types(node, key, mesh_shape)) if sized else full
        strategies.append(
            Strategy(name=name, in_specs=key[0], out_specs=key[1], compute_s=t / divided + overhead_s, divided=divided)
        )
    return strategies or [replicated(node, mesh_shape, profile, overhead_s)]


def _local_types(node, key: tuple[tuple, tuple], mesh_shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """(operand types, result types) one device holds under the specs ``key`` = (ins, outs)."""

    def local(vs, specs) -> tuple:
        return tuple(
            TensorType(local_shape(v.type.shape, spec, mesh_shape), v.type.dtype) for v, spec in zip(vs, specs)
        )

    return local(node.inputs, key[0]), local(node.outputs, key[1])


def _allowed_choices(node, occ: _Occurrences, choices: list[_Choice], roles: AxisRoles | None, a: int) -> list[_Choice]:
    """The choices mesh axis ``a`` may make: labels whose every dim its role allows."""
    if roles is None or roles.roles[a] not in RESTRICTED:
        return choices
    zero = node in roles.update  # ZeRO: the update may split the state along a data axis
    return [
        c
        for c in choices
        if c is None or all(roles.allows(a, _operand(node, side, i), d, zero) for side, i, d, _f in occ[c[0]])
    ]


def _label_occurrences(rule: DimRule) -> _Occurrences:
    """Where each label of the rule occurs: (side, operand or result index, dim, block factor)."""
    occ: _Occurrences = {lab: [] for lab in rule.labels()}
    for side, i, d, label, f in rule.occurrences():
        if label in occ:
            occ[label].append((side, i, d, f))
    return occ


def _operand(node, side: str, i: int) -> Value:
    """Operand ``i`` (side "in") or result ``i`` (side "out") of ``node``."""
    return node.inputs[i] if side == "in" else node.outputs[i]


def _label_choices(node, rule: DimRule, occ: _Occurrences, sets: dict[Value, list[set[int]]]) -> list[_Choice]:
    """What one mesh axis may do: nothing (None), or split a label in one of the base block counts
    some occurrence of it can carry. A label some result lacks cannot be split (that result would
    be incomplete) unless the rule sums over it."""
    n_out = len(node.outputs)
    choices: list[_Choice] = [None]
    for lab, places in occ.items():
        outs_with = {i for side, i, _d, _f in places if side == "out"}
        if lab not in rule.sums and len(outs_with) != n_out:
            continue
        base = set()
        for side, i, d, f in places:
            base |= {b // f for b in sets.get(_operand(node, side, i), [{1}] * 64)[d] if b % f == 0}
        for b in sorted(base or {1}):
            choices.append((lab, b))
    return choices


def _combo_specs(
    node, rule: DimRule, occ: _Occurrences, combo: tuple[_Choice, ...], mesh_shape: tuple[int, ...]
) -> tuple[tuple[tuple, tuple], int] | None:
    """((operand specs, result specs), pieces the work is divided into) of one choice per mesh
    axis, or None when an axis of size 1 is used, some split is uneven, or two axes would split
    one dim (through two of its alternative labels). A summed label leaves the results (and the
    rule's partial inputs) partial along its axis."""
    in_specs = [[R] * len(mesh_shape) for _ in node.inputs]
    out_specs = [[R] * len(mesh_shape) for _ in node.outputs]
    split_dims: set[tuple[str, int, int]] = set()
    divided = 1
    for a, c in enumerate(combo):
        if c is None:
            continue
        n = mesh_shape[a]
        if n == 1:
            return None
        lab, b = c
        for side, i, d, f in occ[lab]:
            if _operand(node, side, i).type.shape[d] % (b * f * n) or (side, i, d) in split_dims:
                return None
            split_dims.add((side, i, d))
            (in_specs if side == "in" else out_specs)[i][a] = S(d, b * f)
        if lab in rule.sums:
            for i in range(len(node.outputs)):
                out_specs[i][a] = P
            for i in rule.partial_inputs:
                in_specs[i][a] = P
        divided *= n
    return (tuple(map(tuple, in_specs)), tuple(map(tuple, out_specs))), divided


def _strategy_name(combo: tuple[_Choice, ...], axis_names) -> str:
    """``label[/blocks]@axis`` per used axis, or "replicate"."""
    return (
        " ".join(
            f"{c[0]}{'/' + str(c[1]) if c[1] > 1 else ''}@{axis_names[a]}" for a, c in enumerate(combo) if c is not None
        )
        or "replicate"
    )


def rules_of(graph: Graph) -> dict:
    return {node: get_rule(node) for node in graph.nodes}
